"""A shared MLflow tracking server for a team: `python -m cheaptrain.server --host 0.0.0.0 --port 5000`.

Starts `mlflow server` on a database store (default: an SQLite file in `mlflow-server/` under the current folder)
with artifact serving on: clients upload and download artifacts through the server, so a run logged from any
machine keeps its artifacts in one place (default: `mlflow-server/artifacts`). Every machine then logs to it with
MLFLOW_TRACKING_URI=http://<host>:<port>. The SQLite store is opened first as the stages open one (its lock held
while MLflow creates or migrates its tables, a half-migrated file refused with one clear error), then the process
becomes `mlflow server`.

Its store is a file of its own, not the embedded `mlflow.db`: the experiments of that store keep their artifacts
in the repository's `mlartifacts/` by path, where runs from other machines could not write them. MLflow's job
runner (GenAI scorers and trace roll-ups, which this project does not use; eight more processes that double the
start-up time) is off unless MLFLOW_SERVER_ENABLE_JOB_EXECUTION=true is set.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from cheaptrain import run_main

DEFAULT_FOLDER = Path("mlflow-server")


def server_command(store: str, artifacts: Path, host: str, port: int, extra: list[str]) -> list[str]:
    """The `mlflow server` command line: `store` for runs, `artifacts` served through the server."""
    return [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", store,
        "--serve-artifacts", "--artifacts-destination", str(artifacts.resolve()),
        "--host", host, "--port", str(port),
        *extra,
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cheaptrain.server", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="interface to listen on (default: %(default)s; 0.0.0.0: every machine)"
    )
    parser.add_argument("--port", type=int, default=5000, help="port (default: %(default)s)")
    default_store = f"sqlite:///{(DEFAULT_FOLDER / 'mlflow.db').resolve()}"
    parser.add_argument(
        "--store", default=default_store, help="the runs' database, an SQLAlchemy URI (default: %(default)s)"
    )
    parser.add_argument(
        "--artifacts", type=Path, default=DEFAULT_FOLDER / "artifacts", help="artifact folder (default: %(default)s)"
    )
    parser.add_argument("--workers", type=int, help="server worker processes (default: MLflow's, 4)")
    parser.add_argument(
        "--allowed-hosts",
        help="Host headers accepted, e.g. 'trainbox:5000,10.0.*' (default: MLflow's, localhost and private IPs); "
        "set it when clients reach the server by a name",
    )
    args = parser.parse_args()

    from cheaptrain.tracking import store_client

    if args.store == default_store:  # a folder named otherwise must exist: a typo fails instead of starting afresh
        DEFAULT_FOLDER.mkdir(exist_ok=True)
    store_client(args.store)  # creates or checks the tables under the store's lock; a UserError says what is wrong
    extra = [] if args.workers is None else ["--workers", str(args.workers)]
    extra += [] if args.allowed_hosts is None else ["--allowed-hosts", args.allowed_hosts]
    command = server_command(args.store, args.artifacts, args.host, args.port, extra)
    host = socket.gethostname() if args.host in ("0.0.0.0", "::") else args.host
    print(f"MLflow tracking server for MLFLOW_TRACKING_URI=http://{host}:{args.port}, store {args.store}")
    sys.stdout.flush()
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    os.execv(command[0], command)  # the server itself, so that signals reach it directly


if __name__ == "__main__":
    run_main(main)
