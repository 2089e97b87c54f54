"""A shared tracking server (issue 18): `python -m cheaptrain.server` starts a real MLflow server on 127.0.0.1; four
training processes log to it at once; when it goes away mid-run the run stops with one clear error, and once it is
back the same command resumes and the store ends with every epoch exactly once. One server for the module (and one
on 0.0.0.0 for the Host-header check)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_reliability import (
    assert_each_epoch_once,
    checkpointed_epochs,
    closed_port,
    make_repo,
    only_run,
    stage_env,
    train_cmd,
    wait_for_checkpoint,
)
from test_tracking import assert_every_epoch_of_every_run, break_store, train_at_once, two_epoch_repo

from conftest import REPO, read_csv

NAME = "cifar10-lenet-stateful-s0"


class Server:
    """`python -m cheaptrain.server` on a free port of `host` (reached on 127.0.0.1), its store and artifacts in
    `folder`."""

    def __init__(self, folder: Path, host: str = "127.0.0.1") -> None:
        self.folder, self.host, self.port = folder, host, closed_port()  # nothing listens there yet
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "cheaptrain.server", "--host", self.host, "--port", str(self.port),
               "--store", f"sqlite:///{self.folder / 'mlflow.db'}", "--artifacts", str(self.folder / "artifacts"),
               "--workers", "1"]  # fmt: skip
        env = os.environ | {"PYTHONPATH": str(REPO / "src")}
        with open(self.folder / "server.log", "a") as log:  # the server and its workers: one process group
            self.process = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 120  # a guard against a hang, not a timing
        while not self.answers():
            assert self.process.poll() is None, (self.folder / "server.log").read_text()
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        """Gone at once, as in a crash: every process of the server."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("server"))
    running.start()
    yield running
    running.kill()


def test_the_server_command_documents_its_options():
    result = subprocess.run([sys.executable, "-m", "cheaptrain.server", "--help"], capture_output=True, text=True,
                            env=os.environ | {"PYTHONPATH": str(REPO / "src")})  # fmt: skip
    assert result.returncode == 0
    for option in ("--host", "--port", "--store", "--artifacts", "MLFLOW_TRACKING_URI=http://"):
        assert option in result.stdout


def test_the_server_refuses_a_half_migrated_store_before_it_starts(tmp_path):
    from mlflow import MlflowClient

    path = tmp_path / "mlflow.db"
    MlflowClient(f"sqlite:///{path}")  # creates the tables
    break_store(path, "leftover-table")
    cmd = [sys.executable, "-m", "cheaptrain.server", "--port", str(closed_port()), "--store", f"sqlite:///{path}"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(REPO / "src")})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: cannot use the MLflow tracking store 'sqlite:///{path}': {path} is half")


def server_cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "cheaptrain.server", "--workers", "1", *args]
    env = os.environ | {"PYTHONPATH": str(REPO / "src")}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def test_the_server_refuses_a_port_it_cannot_listen_on_before_it_starts(tmp_path):
    result = server_cli("--port", "70000")
    assert result.returncode == 2 and "argument --port: '70000' is not a port number from 1 to 65535" in result.stderr
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with socket.create_server(("127.0.0.1", 0)) as taken:  # another server listens there
        port = taken.getsockname()[1]
        result = server_cli("--port", str(port), "--store", store)
    assert (result.returncode, result.stdout) == (2, "")  # no URI printed for a server that never runs
    assert result.stderr == (
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use. "
        "Nothing started: stop what listens there, or choose another --port\n"
    )


def test_the_server_accepts_localhost_and_the_name_it_prints(monkeypatch):
    from mlflow.server.security_utils import is_allowed_host_header

    from cheaptrain.server import allowed_hosts, uri_host

    monkeypatch.setattr(socket, "gethostname", lambda: "TrainBox")
    monkeypatch.setattr(socket, "getfqdn", lambda: "trainbox.lab.example")
    assert (uri_host("0.0.0.0"), uri_host("::"), uri_host("::1"), uri_host("10.0.0.5")) == (
        "trainbox", "trainbox", "[::1]", "10.0.0.5"
    )  # fmt: skip
    every = allowed_hosts("0.0.0.0", 5000, None).split(",")
    for host in ("trainbox:5000", "trainbox.lab.example:5000", "localhost:5000", "127.0.0.1:5000", "10.1.2.3:5000"):
        assert is_allowed_host_header(every, host), host
    assert not is_allowed_host_header(every, "evil.example:5000")
    given = allowed_hosts("0.0.0.0", 5000, "trainbox.lab:5000").split(",")  # replaces MLflow's private IPs only
    for host in ("trainbox.lab:5000", "trainbox:5000", "localhost:5000", "127.0.0.1:5000", "[::1]:5000"):
        assert is_allowed_host_header(given, host), host
    assert not is_allowed_host_header(given, "10.1.2.3:5000")
    assert is_allowed_host_header(allowed_hosts("fd00::5", 5000, "a:1").split(","), "[fd00::5]:5000")


def test_a_new_store_gets_the_served_artifact_root_of_mlflow_server(tmp_path):
    from mlflow import MlflowClient

    from cheaptrain.server import open_store

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    open_store(store)  # what the server does before it becomes `mlflow server`
    assert MlflowClient(store).get_experiment("0").artifact_location == "mlflow-artifacts:/0"  # not a local folder


def get_default_experiment(port: int, host: str) -> tuple[int, bytes]:
    """GET experiment 0 from a server on 127.0.0.1:`port` with the Host header a client of http://`host`:`port`
    sends."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", "/api/2.0/mlflow/experiments/get?experiment_id=0", headers={"Host": f"{host}:{port}"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_a_server_on_every_interface_answers_its_printed_uri_with_served_artifacts(tmp_path):
    running, name = Server(tmp_path, host="0.0.0.0"), socket.gethostname().lower()
    try:
        running.start()
        status, body = get_default_experiment(running.port, name)
        assert status == 200, body
        assert json.loads(body)["experiment"]["artifact_location"] == "mlflow-artifacts:/0"
        assert get_default_experiment(running.port, "evil.example")[0] == 403  # MLflow's DNS-rebinding check stays
    finally:
        running.kill()
    assert f"MLFLOW_TRACKING_URI=http://{name}:{running.port}," in (tmp_path / "server.log").read_text()


def test_make_server_passes_its_variables():
    make = ["make", "--no-print-directory", "-C", str(REPO), "-o", ".venv/bin/.installed", "-n", "server"]
    variables = ["HOST=0.0.0.0", "PORT=5001", "ALLOWED_HOSTS=trainbox.lab:5001,10.0.*"]
    shown = subprocess.run([*make, *variables], capture_output=True, text=True, check=True).stdout
    command = " ".join(shown.replace("\\\n", " ").split())
    assert command.endswith("--host 0.0.0.0 --port 5001 --allowed-hosts 'trainbox.lab:5001,10.0.*'"), command


def test_four_runs_at_once_log_every_epoch_to_the_server(tmp_path, server):
    from mlflow import MlflowClient

    repo = two_epoch_repo(tmp_path / "repo")
    train_at_once(repo, tmp_path / "logs", {"MLFLOW_TRACKING_URI": server.url})
    assert_every_epoch_of_every_run(server.url, repo)
    assert not (repo / "mlflow.db").exists() and not (repo / "mlartifacts").exists()  # all on the server
    run_id = only_run(server.url, "cifar10-lenet-baseline-s0").info.run_id
    assert {a.path for a in MlflowClient(server.url).list_artifacts(run_id)} >= {"history.csv", "run.json"}
    assert list((server.folder / "artifacts").rglob("history.csv"))  # uploaded through the server, kept there


def test_a_run_whose_server_goes_away_stops_clearly_and_resumes_once_it_is_back(tmp_path, server):
    repo = make_repo(tmp_path / "repo", None, epochs=4)
    env = stage_env(MLFLOW_TRACKING_URI=server.url, STATEFUL_EPOCH_SLEEP="0.5",
                    MLFLOW_HTTP_REQUEST_MAX_RETRIES="1", MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR="1",
                    MLFLOW_HTTP_REQUEST_TIMEOUT="5")  # fmt: skip
    proc = subprocess.Popen(train_cmd(), cwd=repo, env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_checkpoint(proc, repo, 1)
        server.kill()
        stderr = proc.communicate(timeout=300)[1]
    finally:
        if proc.poll() is None:  # the test failed before the run did
            proc.kill()
            proc.communicate()
        server.start()
    assert proc.returncode == 2, stderr
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    assert f"to the MLflow store '{server.url}'" in errors[0] and "The epoch is checkpointed" in errors[0]
    stopped_after = checkpointed_epochs(repo)
    assert 1 <= stopped_after < 4

    result = subprocess.run(train_cmd(), cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"resuming after epoch {stopped_after}" in result.stderr
    run = only_run(server.url, NAME)
    assert run.info.status == "FINISHED"
    history = read_csv(repo / "runs" / "dfp" / NAME / "history.csv")
    assert len(history) == 4
    assert_each_epoch_once(server.url, run, history)
