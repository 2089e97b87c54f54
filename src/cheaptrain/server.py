"""A shared MLflow tracking server for a team: `python -m cheaptrain.server --host 0.0.0.0 --port 5000`.

Starts `mlflow server` on a database store (default: an SQLite file in `mlflow-server/` under the current folder)
with artifact serving on: clients upload and download artifacts through the server, so a run logged from any
machine keeps its artifacts in one place (default: `mlflow-server/artifacts`). Every machine then logs to it with
the URI it prints, MLFLOW_TRACKING_URI=http://<host>:<port> (on 0.0.0.0 or ::, the machine's name). The port is
checked free, and the store opened first as the stages open one (its lock held while MLflow creates or migrates its
tables, a half-migrated file refused with one clear error; a new store's Default experiment gets served artifacts, as
`mlflow server` gives it); then the process becomes `mlflow server`.

MLflow answers only requests whose Host header it allows: by default localhost and private IPs; a given
--allowed-hosts list (or MLFLOW_SERVER_ALLOWED_HOSTS) replaces those. Localhost and the host of the printed URI are
always added.

Its store is a file of its own, not the embedded `mlflow.db`: the experiments of that store keep their artifacts
in the repository's `mlartifacts/` by path, where runs from other machines could not write them. MLflow's job
runner (GenAI scorers and trace roll-ups, which this project does not use; eight more processes that double the
start-up time) is off unless MLFLOW_SERVER_ENABLE_JOB_EXECUTION=true is set.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from pathlib import Path

from cheaptrain import UserError
from cheaptrain.cli import run_command

DEFAULT_FOLDER = Path("mlflow-server")
ALL_INTERFACES = ("0.0.0.0", "::")


def port_number(text: str) -> int:
    """An argparse type: a port the server can listen on (0, any free port, would not match the printed URI)."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number from 1 to 65535")
    return int(text)


def uri_host(host: str) -> str:
    """The host of the URI clients use: the machine's name when listening on every interface; IPv6 bracketed. Lower
    case, as clients send it: MLflow compares Host headers case-sensitively."""
    name = (socket.gethostname() if host in ALL_INTERFACES else host).lower()
    return f"[{name}]" if ":" in name else name


def allowed_hosts(host: str, port: int, given: str | None) -> str:
    """The --allowed-hosts list: `given` (default: MLflow's), plus localhost and the printed URI's host, which MLflow
    refuses otherwise (a given list replaces its defaults; its defaults omit the machine's name)."""
    from mlflow.server.security_utils import get_default_allowed_hosts, get_private_ip_patterns

    defaults = get_default_allowed_hosts()
    base = [h.strip() for h in given.split(",") if h.strip()] if given else defaults
    local = [h for h in defaults if h not in get_private_ip_patterns()]
    names = [uri_host(host)] + ([socket.getfqdn().lower()] if host in ALL_INTERFACES else [])
    return ",".join(dict.fromkeys([*base, *local, *(f"{name}:{port}" for name in names)]))


def check_port_free(host: str, port: int) -> None:
    """Fail here where uvicorn would: it logs the error and `mlflow server` still exits with status 0."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a port in TIME_WAIT is free
        try:
            probe.bind((host, port))
        except OSError as e:  # in use, a privileged port, an unknown host name
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            in_use = e.errno == errno.EADDRINUSE
            fix = "stop what listens there, or choose another --port" if in_use else "fix --host or --port"
            raise UserError(f"cannot listen on {where}: {e.strerror or e}. Nothing started: {fix}") from e


def open_store(store: str) -> None:
    """Create or check the store's tables under its lock (a UserError says what is wrong); a new store's Default
    experiment gets served artifacts (mlflow-artifacts:/0), as `mlflow server --serve-artifacts` gives it."""
    from mlflow.store.tracking import DEFAULT_ARTIFACTS_URI

    from cheaptrain.tracking import store_client

    store_client(store, artifact_root=DEFAULT_ARTIFACTS_URI)


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
    parser.add_argument("--port", type=port_number, default=5000, help="port (default: %(default)s)")
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
        default=os.environ.get("MLFLOW_SERVER_ALLOWED_HOSTS"),
        help="Host headers accepted, e.g. 'trainbox.lab:5000,10.0.*' (default: MLflow's, localhost and private IPs); "
        "localhost and the host of the printed URI are always added",
    )
    args = parser.parse_args()

    check_port_free(args.host, args.port)
    if args.store == default_store:  # a folder named otherwise must exist: a typo fails instead of starting afresh
        DEFAULT_FOLDER.mkdir(exist_ok=True)
    open_store(args.store)
    extra = [] if args.workers is None else ["--workers", str(args.workers)]
    extra += ["--allowed-hosts", allowed_hosts(args.host, args.port, args.allowed_hosts)]
    command = server_command(args.store, args.artifacts, args.host, args.port, extra)
    uri = f"http://{uri_host(args.host)}:{args.port}"
    print(f"MLflow tracking server for MLFLOW_TRACKING_URI={uri}, store {args.store}")
    sys.stdout.flush()
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    os.execv(command[0], command)  # the server itself, so that signals reach it directly


if __name__ == "__main__":
    run_command(main)
