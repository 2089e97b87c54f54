"""Benchmark: what checking every tensor's guards costs a compiled model's call (trainer.Training.step_model turns
dynamo's dict-tag shortcut off, so that WUS's requires_grad flips reach the guards), against the shortcut.

    python benchmarks/guards.py [--model resnet18] [--calls 5000] [--repeats 3]

Each way runs in a process of its own, the ways taking turns --repeats times: the process compiles the model
(default mode), trains it one step, then evaluates its guards, the check that runs before every compiled call,
--calls times in a row, five times, and reports the best. Printed: each way's best microseconds a call over its
processes, and their ratio. Only the guards are timed: a training step adds its own forward and backward.
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch
import torch.nn.functional as F
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from cheaptrain import positive_int
from cheaptrain.models import MODELS, create_model

SHORTCUT = "skip_tensor_guards_with_matching_dict_tags"  # dynamo's option: True is torch's default
WAYS = {"every tensor checked": False, "dict-tag shortcut": True}


def guard_us(model_name: str, shortcut: bool, calls: int) -> float:
    """Best microseconds of one guard check of `model_name`, compiled with the shortcut on or off, in this process."""
    setattr(torch._dynamo.config, SHORTCUT, shortcut)
    torch.set_num_threads(1)
    model = create_model(model_name, 10)
    x = torch.randn(2, 3, 32, 32)
    F.cross_entropy(torch.compile(model)(x), torch.tensor([0, 1])).backward()
    entries = _debug_get_cache_entry_list(type(model).forward.__code__)
    f_locals = {"self": model, "x": x}
    if len(entries) != 1 or not entries[0].guard_manager.check(f_locals):
        raise SystemExit(f"torch {torch.__version__}: expected one graph whose guards pass on its inputs")
    check, best = entries[0].guard_manager.check, float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            check(f_locals)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18", choices=sorted(MODELS), help="the model (default: %(default)s)")
    parser.add_argument("--calls", type=positive_int, default=5000, help="guard checks timed in a row")
    parser.add_argument("--repeats", type=positive_int, default=3, help="processes of each way, taking turns")
    parser.add_argument("--only", choices=sorted(WAYS), help=argparse.SUPPRESS)  # one process's way
    args = parser.parse_args()
    if args.only:
        print(guard_us(args.model, WAYS[args.only], args.calls))
        return
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(args.repeats):
        for way in WAYS:
            command = [sys.executable, __file__, "--model", args.model, "--calls", str(args.calls), "--only", way]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:  # an OOM kill leaves no stderr: the status says what happened
                last = (done.stderr.strip().splitlines() or [f"the process exited with status {done.returncode}"])[-1]
                raise SystemExit(f"{way}: {last}")
            times[way].append(float(done.stdout.split()[-1]))
    print(f"{args.model}, torch {torch.__version__}: guard check before each compiled call, best of {args.repeats}")
    for way, values in times.items():
        print(f"  {way:22} {min(values):8.2f} us a call")
    print(f"  every tensor / shortcut {min(times['every tensor checked']) / min(times['dict-tag shortcut']):8.2f}")


if __name__ == "__main__":
    main()
