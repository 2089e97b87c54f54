"""DVC stage `train_<study>`: train one configuration of the grid and log it to MLflow.

Reads params sections `train`, `recipes.<study>` and `methods.<method>`; writes runs/<study>/<run name>/.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's code, also in DVC's temp copies

from cheaptrain import run_main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", required=True, help="the paper whose recipe trains the run: a key of `recipes`")
    parser.add_argument("--dataset", required=True, help="cifar10 or cifar100")
    parser.add_argument("--model", required=True, help="a model name, e.g. lenet, resnet18, vgg16")
    parser.add_argument("--method", required=True, help="baseline or a method of src/cheaptrain/methods")
    parser.add_argument("--seed", required=True, type=int, help="random seed of the run")
    parser.add_argument("--params", default="params.yaml", help="params file (default: %(default)s)")
    args = parser.parse_args()

    from cheaptrain.config import load_params, resolve_run
    from cheaptrain.runner import train_run

    cfg = resolve_run(load_params(args.params), args.study, args.dataset, args.model, args.method, args.seed)
    final = train_run(cfg)
    print(
        f"{cfg.study}/{cfg.name}: final {final['final_acc']:.2f}%, best-3 {final['best3_acc']:.2f}%, "
        f"training {final['train_time_s']:.1f} s"
    )


if __name__ == "__main__":
    run_main(main)
