"""Train some runs of the grid in params.yaml without MLflow, each process of a torchrun launch taking its part (or
alone, without torchrun): tests/test_distributed.py compares the two.

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/distributed_runs.py OUT STUDY:METHOD ...
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import dataclasses

from cheaptrain.config import load_params, resolve_run
from cheaptrain.distributed import from_environment, stop
from cheaptrain.runner import train_run

if __name__ == "__main__":
    out, runs = sys.argv[1], sys.argv[2:]
    params = load_params("params.yaml")
    for run in runs:
        study, method = run.split(":")
        cfg = dataclasses.replace(resolve_run(params, study, "cifar10", "lenet", method, 0), runs_root=out)
        train_run(cfg, track=False, processes=from_environment())
    stop(from_environment())
