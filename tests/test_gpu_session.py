"""benchmarks/gpu_session.py on the CPU (--device cpu --quick): the race, the runs that fit trained into the ledger
through the train stage, the rest left unstarted, and what comes back packed."""

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from cheaptrain.prepare import write_prepared

from conftest import REPO, read_csv, run_script, synthetic_split

SCRIPT = REPO / "benchmarks" / "gpu_session.py"
# the train stage records a ledger entry only at a paper's setting: each process of these tests gets it made small
SMALL_RECIPE = {"epochs": 2, "batch_size": 32, "milestones": [1]}
SMALL_PAPER = f"""from cheaptrain.papers import PAPERS
PAPERS["dfp"]["recipe"] |= {SMALL_RECIPE!r}
"""
BASELINE = "ledger/dfp/cifar10-lenet-baseline-s0"  # the entry of LeNet's baseline run
QUICK_ON_CPU = ("out", "--device", "cpu", "--quick")  # what `session` and `session_here` pass before their own


def make_repo(path: Path) -> Path:
    """A folder to run in: tiny prepared CIFAR-10, params at the (small) paper setting on the CPU."""
    train, test = synthetic_split(128, seed=1), synthetic_split(64, seed=2)
    splits = {"train": (train.images, train.labels), "test": (test.images, test.labels)}
    write_prepared(path / "data/prepared/cifar10", splits, train.classes, {"source": "synthetic"})
    (path / "params.yaml").write_text(yaml.safe_dump(small_params()))
    (path / "site").mkdir()
    (path / "site/sitecustomize.py").write_text(SMALL_PAPER)
    return path


@pytest.fixture
def repo(tmp_path) -> Path:
    return make_repo(tmp_path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A session that trained LeNet's baseline and dfp runs (random_prune's in the ledger before it), then measured
    AlexNet and trained its baseline: its folder and what it printed. The tests that need a baseline entry copy
    LeNet's (`with_baseline`), not train one each."""
    repo = make_repo(tmp_path_factory.mktemp("trained"))
    done_before = repo / "ledger/dfp/cifar10-lenet-random_prune-s0"
    done_before.mkdir(parents=True)
    (done_before / "metrics.json").write_text("{}")  # in the ledger already: not trained again
    runs = ["dfp:lenet:baseline", "dfp:lenet:random_prune", "dfp:lenet:dfp:0", "dfp:alexnet:baseline"]
    return repo, session(repo, "--runs", *runs, "--minutes", "8")


def with_baseline(repo: Path, trained: tuple[Path, subprocess.CompletedProcess]) -> Path:
    """`repo` given the baseline entry that `trained`'s session trained (the one a session of its own would train
    there: the same params, data and code): the entry's folder."""
    assert trained[1].returncode == 0, trained[1].stdout + trained[1].stderr
    shutil.copytree(trained[0] / BASELINE, repo / BASELINE)
    return repo / BASELINE


def small_params() -> dict:
    """params.yaml at the (small) paper setting on the CPU."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"] |= {"device": "cpu", "threads": 1, "ledger": "record"}
    params["recipes"]["dfp"] |= SMALL_RECIPE
    params["methods"]["dfp"] |= {"window": 2, "starting_point": 1}  # random_prune's too (one YAML node): epoch 1 prunes
    params["download"]["datasets"] = ["cifar10"]
    params["grid"] = {
        "dfp": {"datasets": ["cifar10"], "models": ["lenet"], "methods": ["baseline", "dfp"], "seeds": [0]}
    }
    return params


def session(repo: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), *QUICK_ON_CPU, *args]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(repo / "site"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=600, env=env)


def members(path: Path) -> set[str]:
    with tarfile.open(path) as tar:
        return {member.name for member in tar.getmembers() if member.isfile()}


def test_the_runs_that_fit_train_into_the_ledger_and_come_back_packed(trained):
    repo, done = trained
    assert done.returncode == 0, done.stdout + done.stderr
    out = repo / "out"
    assert (out / "session.txt").read_text() == done.stdout
    race = read_csv(out / "race.csv")  # on a CPU: eager only
    assert [(row["model"], row["setting"], row["device"]) for row in race] == [
        ("lenet", "eager", "cpu"),
        ("alexnet", "eager", "cpu"),
    ]
    assert all(float(row["images_per_s"]) > 0 for row in race)
    # not an entry the ledger can read: not trained over (the train stage would stop at it too)
    assert "dfp/cifar10-lenet-random_prune-s0: not trained: ledger entry" in done.stdout
    trained_runs = ("lenet-baseline", "lenet-dfp", "alexnet-baseline")
    for run_name in trained_runs:
        name = f"dfp/cifar10-{run_name}-s0"
        assert f"{name}: started" in done.stdout and f"{name}: ended at epoch 2/2" in done.stdout
        run = json.loads((repo / "ledger" / name / "run.json").read_text())
        assert run["config"]["compile"] is False and run["config"]["device"] == "cpu"  # the race's choice, recorded
    expected = {f"ledger/dfp/cifar10-{r}-s0/{f}" for r in trained_runs for f in ("run.json", "metrics.json",
                "history.csv")}  # fmt: skip
    assert members(out / "ledger.tar.gz") == expected
    assert members(out / "logs.tar.gz") == {f"gpu-session/dfp-cifar10-{r}-s0.log" for r in trained_runs}
    state = json.loads((repo / "gpu-session/state.json").read_text())
    assert [item["run"] for item in state] == ["dfp:lenet:baseline:0", "dfp:lenet:dfp:0", "dfp:alexnet:baseline:0"]

    collected = session(repo, "--collect", "--minutes", "1")  # nothing left training: packs the same at once
    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert members(out / "ledger.tar.gz") == expected


def test_a_session_longer_than_a_command_trains_detached_in_a_copy_and_collect_brings_back_its_runs(repo, tmp_path):
    """--return-after: the command returns while the session goes on in a copy of the checkout under --workdir (the
    lease's next command copies the working tree afresh: the runs must not train in it); --collect in the next
    command waits for the session and its runs and packs their entries."""
    for folder in ("benchmarks", "stages", "src"):  # the copy's scripts: this repository's
        (repo / folder).symlink_to(REPO / folder)
    (repo / "gpu-session").mkdir()
    (repo / "gpu-session/state.json").write_text("[]")  # an earlier session's here: not the copy's
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "checkout"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    work = tmp_path / "work"
    runs = ["--runs", "dfp:lenet:baseline", "dfp:lenet:dfp"]
    started = session(repo, *runs, "--minutes", "8", "--return-after", "0.02", "--workdir", str(work))
    assert started.returncode == 0, started.stdout + started.stderr
    assert "--collect waits for it" in started.stdout or "dfp/cifar10-lenet-dfp-s0: ended" in started.stdout
    assert (work / "repo/params.yaml").is_file() and (work / "repo/data/prepared/cifar10/manifest.json").is_file()

    collected = session(repo, "--collect", "--minutes", "8")
    assert collected.returncode == 0, collected.stdout + collected.stderr
    for method in ("baseline", "dfp"):
        assert f"dfp/cifar10-lenet-{method}-s0: ended at epoch 2/2" in collected.stdout
    assert {m.split("/")[2] for m in members(repo / "out/ledger.tar.gz")} == {
        "cifar10-lenet-baseline-s0", "cifar10-lenet-dfp-s0"
    }  # fmt: skip
    assert not (repo / "ledger").exists()  # trained in the copy, never in the checkout
    run = json.loads((work / "repo/ledger/dfp/cifar10-lenet-dfp-s0/run.json").read_text())
    assert run["git_commit"] == commit  # the checkout's, though the copy has no .git
    state = json.loads((work / "repo/gpu-session/state.json").read_text())
    assert [item["run"] for item in state] == ["dfp:lenet:baseline:0", "dfp:lenet:dfp:0"]
    assert (repo / "out/session.txt").read_text() == collected.stdout  # the session's lines, from its start
    assert (work / "returned").is_file()  # a new session may empty the copy: its entries are in OUT


def test_retrain_stale_trains_again_a_run_whose_entry_older_code_trained_and_replaces_the_entry(
    repo, tmp_path, monkeypatch, trained
):
    """An entry that older training code trained stops the run's train stage: the session says so and leaves it,
    and with --retrain-stale trains the run again (train.ledger=retrain), detached as a lease runs it, and brings back
    the new entry; an entry from another kind of device is left to that kind."""
    for folder in ("benchmarks", "stages", "src"):  # the detached copy's scripts: this repository's
        (repo / folder).symlink_to(REPO / folder)
    run, entry = ["--runs", "dfp:lenet:baseline"], with_baseline(repo, trained)
    info = json.loads((entry / "run.json").read_text())
    current, old = info["code_version"], {"code_version": "0123456789abcdef", "finished_at": "2026-01-01T00:00:00Z"}
    (entry / "run.json").write_text(json.dumps(info | old))

    kept = session(repo, *run, "--minutes", "2")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert ("dfp/cifar10-lenet-baseline-s0: in the ledger, trained differently (training code: version "
            f"0123456789abcdef (commit {info['git_commit']}) in the entry, {current} now): --retrain-stale trains it "
            "again") in kept.stdout  # fmt: skip
    assert "nothing to train" in kept.stdout and "started" not in kept.stdout

    work = tmp_path / "work"
    started = session(repo, *run, "--retrain-stale", "--minutes", "8", "--return-after", "0.02", "--workdir", str(work))
    assert started.returncode == 0, started.stdout + started.stderr
    collected = session(repo, "--collect", "--minutes", "8")
    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert "dfp/cifar10-lenet-baseline-s0: in the ledger, trained differently" in collected.stdout
    assert "trains again, to replace it" in collected.stdout
    assert "dfp/cifar10-lenet-baseline-s0: ended at epoch 2/2" in collected.stdout
    with tarfile.open(repo / "out/ledger.tar.gz") as tar:
        new = json.load(tar.extractfile("ledger/dfp/cifar10-lenet-baseline-s0/run.json"))
    assert new["code_version"] == current and new["finished_at"] != old["finished_at"]
    assert new["config"]["ledger"] == "retrain"
    (state,) = json.loads((work / "repo/gpu-session/state.json").read_text())
    assert state["replaces"] == old["finished_at"]  # what --collect tells the new entry from the stale one by
    assert json.loads((entry / "run.json").read_text())["code_version"] == old["code_version"]  # the copy's, not this

    # a CPU's stale entry is retrained on a CPU alone, a GPU's on a GPU
    gpu_session = load_gpu_session()
    monkeypatch.chdir(repo)
    spec = gpu_session.parse_run("dfp:lenet:baseline")
    configs = {spec: gpu_session.resolve_run(small_params(), "dfp", "cifar10", "lenet", "baseline", 0)}
    (entry / "run.json").write_text(json.dumps(info | old | {"device": "NVIDIA H100 80GB HBM3"}))
    on_cpu = gpu_session.Session(tmp_path / "out", time.monotonic() + 60)
    assert gpu_session.to_train(on_cpu, configs, True, torch.device("cpu")) == {}
    assert on_cpu.lines[-1] == ("dfp/cifar10-lenet-baseline-s0: in the ledger, trained differently on NVIDIA H100 "
                                "80GB HBM3: retrained on that kind of device alone")  # fmt: skip
    on_gpu = gpu_session.Session(tmp_path / "out", time.monotonic() + 60)
    ((retrained, _),) = gpu_session.to_train(on_gpu, configs, True, torch.device("cuda")).items()
    assert retrained.replaces == old["finished_at"] and not retrained.done()


def test_a_methods_run_waits_for_the_device_its_baseline_trained_on(repo, tmp_path, monkeypatch, trained):
    """A method's time saved pairs with its baseline's on one device: a run whose seed's baseline entry trained on a
    device of another name is left for that device, said so, unless --any-device or this session trains the baseline
    again."""
    entry = with_baseline(repo, trained)
    info = json.loads((entry / "run.json").read_text())
    gpu_session = load_gpu_session()
    monkeypatch.chdir(repo)
    specs = [gpu_session.parse_run(f"dfp:lenet:{method}") for method in ("baseline", "dfp")]
    configs = {
        spec: gpu_session.resolve_run(small_params(), "dfp", "cifar10", "lenet", spec.method, 0) for spec in specs
    }
    cpu = torch.device("cpu")

    def to_train(retrain_stale: bool = False, any_device: bool = False) -> tuple[list[str], list[str]]:
        said = gpu_session.Session(tmp_path / "out", time.monotonic() + 60)
        pending = gpu_session.to_train(said, configs, retrain_stale, cpu, any_device)
        return [spec.method for spec in pending], said.lines

    assert to_train()[0] == ["dfp"]  # here is where its baseline trained
    monkeypatch.setattr(gpu_session, "tracked_device", lambda device: "NVIDIA H200")  # another device
    pending, lines = to_train()
    assert pending == [] and lines[-1] == (
        f"dfp/cifar10-lenet-dfp-s0: not trained here: its baseline trained on {info['device']}, and its time saved "
        "pairs with its baseline's on one device (--any-device trains it here)"
    )
    assert to_train(any_device=True)[0] == ["dfp"]
    (entry / "run.json").write_text(json.dumps(info | {"code_version": "0123456789abcdef"}))  # stale
    assert to_train()[0] == []
    assert to_train(retrain_stale=True)[0] == ["baseline", "dfp"]  # the baseline trains again here, first


def test_a_detached_session_that_fails_says_why_in_the_command_that_started_it(repo, tmp_path):
    """The detached session, not the command, finds CIFAR-10 missing (a failed preparation, relayed the same way:
    test_a_detached_session_gets_paths_that_lead_to_the_same_files_from_its_copy)."""
    for folder in ("benchmarks", "stages", "src"):
        (repo / folder).symlink_to(REPO / folder)
    shutil.rmtree(repo / "data")  # so the session prepares CIFAR-10, from an archive that is not there
    work = ["--workdir", str(tmp_path / "w")]
    started = session(repo, "--cifar10", "carry/cifar10.tar.gz", "--return-after", "5", *work)
    assert started.returncode == 1, started.stdout + started.stderr
    archive = tmp_path.resolve() / "w/repo/carry/cifar10.tar.gz"  # the copy's (in_copy)
    why = f"error: data/prepared/cifar10 lacks CIFAR-10's training images and --cifar10 {archive} is not a file"
    assert why in started.stdout, started.stdout
    assert why in (repo / "out/detached.log").read_text()  # all it printed, here too


def test_collect_packs_each_run_as_it_ends_and_returns_at_its_deadline_with_runs_training(repo):
    """The lease's last command may be cut short: what has ended is in OUT from the first seconds, and again as each
    run ends; at --minutes it returns, the runs still training named. The waits end as the runs do, not by a clock:
    the waiting collect has minutes to spare, the one that meets its deadline has none."""
    sleeping = [subprocess.Popen(["sleep", "600"], start_new_session=True) for _ in range(2)]
    try:
        (repo / "gpu-session").mkdir()
        state = [{"run": f"dfp:lenet:{method}:0", "pid": p.pid, "epochs": 2, "estimate_s": 60}
                 for method, p in zip(("baseline", "dfp"), sleeping, strict=True)]  # fmt: skip
        (repo / "gpu-session/state.json").write_text(json.dumps(state))
        command = [sys.executable, str(SCRIPT), "out", "--device", "cpu", "--collect", "--minutes", "10"]
        collect = subprocess.Popen(command, cwd=repo, stdout=subprocess.PIPE, text=True)
        ledger = repo / "out/ledger.tar.gz"
        wait_for(lambda: ledger.is_file() and members(ledger) == set())
        end_run(repo, "baseline", sleeping[0])
        wait_for(lambda: members(ledger) == {"ledger/dfp/cifar10-lenet-baseline-s0/metrics.json"})
        assert collect.poll() is None  # packed while it waits for the other run

        deadline = [sys.executable, str(SCRIPT), "out-deadline", "--device", "cpu", "--collect", "--minutes", "0.01"]
        met = subprocess.run(deadline, cwd=repo, capture_output=True, text=True, timeout=120)
        assert met.returncode == 0, met.stdout + met.stderr
        assert "dfp/cifar10-lenet-baseline-s0: ended" in met.stdout
        assert "dfp/cifar10-lenet-dfp-s0: training" in met.stdout
        assert members(repo / "out-deadline/ledger.tar.gz") == {"ledger/dfp/cifar10-lenet-baseline-s0/metrics.json"}
        assert collect.poll() is None  # the other still waits

        end_run(repo, "dfp", sleeping[1])
        out, _ = collect.communicate(timeout=120)
        assert collect.returncode == 0, out
        for method in ("baseline", "dfp"):
            assert f"dfp/cifar10-lenet-{method}-s0: ended at epoch" in out
        assert members(ledger) == {f"ledger/dfp/cifar10-lenet-{m}-s0/metrics.json" for m in ("baseline", "dfp")}
    finally:
        for p in sleeping:
            p.kill()


def end_run(repo: Path, method: str, process: subprocess.Popen) -> None:
    """A run of `collect`'s state ends: its ledger entry, then its process gone."""
    entry = repo / f"ledger/dfp/cifar10-lenet-{method}-s0"
    entry.mkdir(parents=True)
    (entry / "metrics.json").write_text("{}")
    process.kill()


def wait_for(condition, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s"
        time.sleep(0.2)


def exit_code(monkeypatch, *args: str) -> int:
    """The exit status of gpu_session's main(), in this process, on the CPU, with `args` after OUT ("out")."""
    monkeypatch.setattr(sys, "argv", ["gpu_session.py", "out", "--device", "cpu", *args])
    with pytest.raises(SystemExit) as exited:
        load_gpu_session().main()
    return exited.value.code


def test_return_after_needs_a_time_within_the_session_and_no_collect(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for args in (["--return-after", "9"], ["--return-after", "0"], ["--collect", "--return-after", "1"]):
        assert exit_code(monkeypatch, "--minutes", "9", *args) == 2, args
        assert "--return-after" in capsys.readouterr().err, args
    assert not (tmp_path / "out").exists()


def test_return_after_never_empties_a_workdir_of_other_files_or_the_checkout(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copy(REPO / "params.yaml", tmp_path)  # the default runs resolve: then the workdir is refused
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes/keep.txt").write_text("mine")
    for workdir, reason in (("notes", "no earlier session"), (".", "holds the checkout"), ("..", "holds the checkout")):
        assert exit_code(monkeypatch, "--minutes", "9", "--return-after", "1", "--workdir", workdir) == 1, workdir
        assert reason in capsys.readouterr().out, workdir
    assert (tmp_path / "notes/keep.txt").read_text() == "mine"


def test_return_after_keeps_an_earlier_copy_whose_entries_no_command_brought_back(tmp_path, monkeypatch, capsys):
    """A session detached, then a new one started without --collect between: emptying the copy would lose the
    entries its runs trained there (packed in its OUT, which no command copied back)."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(REPO / "params.yaml", tmp_path)
    ended = subprocess.Popen(["true"])
    ended.wait()
    (tmp_path / "w/repo/gpu-session").mkdir(parents=True)
    (tmp_path / "w/session.log").write_text("")
    state = [{"run": "dfp:vgg19:baseline:0", "pid": ended.pid, "epochs": 200, "estimate_s": 400}]
    (tmp_path / "w/repo/gpu-session/state.json").write_text(json.dumps(state))
    (tmp_path / "w/out").mkdir()
    (tmp_path / "w/out/ledger.tar.gz").write_bytes(b"the entries")
    assert exit_code(monkeypatch, "--minutes", "9", "--return-after", "1", "--workdir", "w") == 1
    assert "--collect first" in capsys.readouterr().out
    assert (tmp_path / "w/out/ledger.tar.gz").read_bytes() == b"the entries"


def test_a_run_that_cannot_end_before_the_deadline_is_not_started(repo):
    done = session(repo, "--runs", "dfp:lenet:baseline", "--minutes", "0.3")  # a run's start alone is estimated 35 s
    assert done.returncode == 0, done.stdout + done.stderr
    assert "dfp/cifar10-lenet-baseline-s0: not started: it would not end in time" in done.stdout
    assert members(repo / "out/ledger.tar.gz") == set() and not (repo / "ledger").exists()


def test_each_model_measured_is_a_row_of_race_csv(trained):
    repo, done = trained
    assert done.returncode == 0, done.stdout + done.stderr
    assert [(row["model"], row["setting"]) for row in read_csv(repo / "out/race.csv")] == [
        ("lenet", "eager"),
        ("alexnet", "eager"),  # measured once the lenet runs ended, then trained
    ]
    said = done.stdout.index
    lenet_packed = said("the entries of 2 runs (dfp/cifar10-lenet-baseline-s0, dfp/cifar10-lenet-dfp-s0)")
    assert lenet_packed < said("\nalexnet ") < said("dfp/cifar10-alexnet-baseline-s0: started")
    assert "dfp/cifar10-alexnet-baseline-s0: ended at epoch 2/2" in done.stdout


def session_here(repo: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> subprocess.CompletedProcess:
    """`session` run in this process (conftest.run_script), for what it says before it measures or trains anything:
    no interpreter to start and torch to import again. The paper's recipe made small here as SMALL_PAPER makes it in
    a session's process."""
    from cheaptrain.papers import PAPERS

    monkeypatch.setitem(PAPERS["dfp"], "recipe", PAPERS["dfp"]["recipe"] | SMALL_RECIPE)
    monkeypatch.chdir(repo)
    return run_script(SCRIPT, *QUICK_ON_CPU, *args)


def test_a_misnamed_run_or_invalid_params_fail_before_the_race(repo, monkeypatch):
    bad = session(repo, "--runs", "dfp:lenet:no_such_method")  # a process of its own: the exit status, end to end
    assert bad.returncode == 1 and "no_such_method" in bad.stdout and not (repo / "out/race.csv").exists()
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["grid"]["dfp"]["methods"].append("dfp_p50")  # window 20: no pruning epoch in 2, as the train stage says
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    invalid = session_here(repo, monkeypatch, "--runs", "dfp:lenet:baseline")
    assert invalid.returncode == 1 and "methods.dfp_p50" in invalid.stdout and not (repo / "out/race.csv").exists()
    params["grid"]["dfp"]["methods"].remove("dfp_p50")
    params["recipes"]["dfp"]["lr"] = 0.05  # not the (small) paper's recipe: the ledger would record nothing
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    elsewhere = session_here(repo, monkeypatch, "--runs", "dfp:lenet:baseline")
    assert elsewhere.returncode == 1 and not (repo / "out/race.csv").exists()
    assert "dfp/cifar10-lenet-baseline-s0 is not at its paper's setting (lr 0.05 (paper: 0.1))" in elsewhere.stdout
    params["recipes"]["dfp"]["lr"] = 0.1
    params["train"]["ledger"] = "ignore"  # the train stage would record no entry
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    unrecorded = session_here(repo, monkeypatch, "--runs", "dfp:lenet:baseline")
    assert unrecorded.returncode == 1 and not (repo / "out/race.csv").exists()
    assert "train.ledger is ignore in params.yaml" in unrecorded.stdout
    malformed = session_here(repo, monkeypatch, "--runs", "lenet:baseline")
    assert malformed.returncode == 2 and "expected STUDY:MODEL:METHOD" in malformed.stderr


def load_gpu_session():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("gpu_session", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def training(gpu_session, text: str, need_s: float, start: float):
    """A run of `text` (study:model:method) started at `start`, estimated at `need_s` seconds; its pid a stand-in."""
    return gpu_session.Training(gpu_session.parse_run(text), 200, need_s, None, pid=1, started=start)


def log_epoch(run, n: int, at: float) -> None:
    """The train stage's line for epoch `n` of `run` appended to its log, which the session reads at time `at`."""
    run.spec.log.parent.mkdir(exist_ok=True)
    with open(run.spec.log, "a") as log:
        log.write(f"{run.spec.name.split('/')[1]}: epoch {n}/{run.epochs} · train loss 1.0 · test acc 50.00% · 2.0 s\n")
    run.observe(at)


def log_epochs(run, at: float, pace: float) -> None:
    """Epochs 1-4 of `run` logged and seen `pace` seconds apart after time `at`: a run with a pace of its own."""
    for n in range(1, 5):
        log_epoch(run, n, at + pace * n)


def test_the_quick_settings_half_of_the_training_images_is_prepared_again_not_trained_on(tmp_path, monkeypatch):
    """data/prepared as `make quickstart` leaves it (half of the training images) is no data for the ledger's runs."""
    from cheaptrain.prepare import write_prepared

    gpu_session = load_gpu_session()
    monkeypatch.chdir(tmp_path)
    splits = {split: (np.zeros((10, 32, 32, 3), np.uint8), np.arange(10)) for split in ("train", "test")}
    half = {"train_subset": {"train_size": 10, "archive_train_count": 20}}
    write_prepared(tmp_path / "data/prepared/cifar10", splits, [str(c) for c in range(10)], half)
    with pytest.raises(gpu_session.UserError, match="lacks CIFAR-10's training images and --cifar10 None is not a"):
        gpu_session.prepare_data(None, None)
    write_prepared(tmp_path / "data/prepared/cifar10", splits, [str(c) for c in range(10)], {})
    gpu_session.prepare_data(None, None)  # every training image: nothing to do


def test_a_runs_time_left_comes_from_its_estimate_then_from_its_own_pace(tmp_path, monkeypatch):
    gpu_session = load_gpu_session()
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    run = training(gpu_session, "wus:resnet18:wus", 500.0, start)
    assert run.left_s(start) == 500.0 and run.pace() is None  # no epoch yet: the estimate
    assert run.left_s(start + 100) == pytest.approx(400.0)  # times are floats far from 0 (time.monotonic)
    for n in range(1, 4):
        log_epoch(run, n, start + 100 + 3 * n)
    assert run.left_s(start + 110) == pytest.approx(390.0)  # the first epoch (compiling) and two more: no pace yet
    assert not run.late(start + 110, time_left=100)  # nor is it late before it has a pace
    log_epoch(run, 4, start + 112)
    assert run.pace() == pytest.approx(3.0)  # epochs 2-4
    assert run.left_s(start + 112) == pytest.approx(196 * 3.0)
    assert run.late(start + 112, time_left=196 * 3.0 / 1.3) and not run.late(start + 112, time_left=196 * 3.0 / 1.2)
    run.settle()  # the runs beside it changed: its pace is measured again, from epoch 4
    assert run.pace() is None
    for n, at in ((5, 113), (6, 114), (7, 115)):
        log_epoch(run, n, start + at)
    assert run.pace() == pytest.approx(1.0) and run.left_s(start + 115) == pytest.approx(193.0)


def test_a_new_phases_compiling_epoch_does_not_make_a_run_late(tmp_path, monkeypatch):
    """As on an H100 (2026-11-26): a WUS ResNet-18 run at about 1.7 s an epoch (evaluation and checkpoint included),
    seen every 5 s; its first skip epoch, 20, compiles the phase's graphs (11.4 s). Its pace leaves that span out: the
    run, which ends in about 330 s, is not stopped with 432 s left (with the span, it would need 3.1 s an epoch)."""
    gpu_session = load_gpu_session()
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    run = training(gpu_session, "wus:resnet18:wus", 300.0, start)
    for at, n in ((30, 2), (35, 5), (40, 8), (45, 11), (50, 14), (55, 17), (60, 19), (75, 22)):
        log_epoch(run, n, start + at)  # nothing new seen at 65 and 70 s
    assert run.pace() == pytest.approx(20 / 11)  # the last 5 spans (epochs 8-22) but the slowest, 60-75 s
    assert not run.late(start + 75, time_left=432)


def test_when_a_run_falls_behind_the_newest_run_is_stopped(tmp_path, monkeypatch):
    gpu_session = load_gpu_session()
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    older, newer = (training(gpu_session, f"wus:vgg11:{m}", 300.0, start) for m in ("baseline", "wus"))
    for run, pace in ((older, 2.0), (newer, 1.0)):
        log_epochs(run, start + 10, pace)
    now = start + 20
    assert gpu_session.to_stop([older, newer], now, time_left=196 * 2.0 / 1.2) is None  # within 1.25x the time left
    assert gpu_session.to_stop([older, newer], now, time_left=196 * 2.0 / 1.3) == (newer, older)  # the older is late


def test_a_late_run_alone_goes_on(tmp_path, monkeypatch):
    """Stopping it frees the device for no other run; past the deadline it goes on for --collect."""
    gpu_session = load_gpu_session()
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    run = training(gpu_session, "wus:vgg11:baseline", 300.0, start)
    log_epochs(run, start + 10, 2.0)
    assert run.late(start + 20, time_left=196 * 2.0 / 1.3)
    assert gpu_session.to_stop([run], start + 20, time_left=196 * 2.0 / 1.3) is None


def test_a_log_without_an_epoch_line_in_its_tail_keeps_the_last_epoch_seen(tmp_path, monkeypatch):
    """A burst of warnings pushes the epoch lines out of the 4 KB the session reads: the run is where it was, not at
    epoch 0 with every epoch to go (which would make it late)."""
    gpu_session = load_gpu_session()
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    run = training(gpu_session, "wus:vgg11:baseline", 300.0, start)
    log_epochs(run, start + 10, 1.0)
    with open(run.spec.log, "a") as log:
        log.write("W1127 torch/_dynamo/convert_frame.py: recompiling\n" * 200)  # 10 KB
    assert run.epoch() == 4
    assert run.left_s(start + 15) == pytest.approx(196 * 1.0)
    assert not run.late(start + 15, time_left=196 * 1.0)


def test_the_race_measures_every_setting_on_a_gpu_and_a_named_setting_alone():
    gpu_session = load_gpu_session()
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    raced = gpu_session.candidates("race", cuda)
    assert [v.name for v in raced] == ["eager", "CUDA graphs", "graphs, fused, benchmark"]
    assert [v.name for v in gpu_session.candidates("race", cpu)] == ["eager"]
    (named,) = gpu_session.candidates("graphs-fused", cuda)
    assert (named.compile, named.fused_sgd, named.cudnn_benchmark) == ("reduce-overhead", True, True)
    assert gpu_session.settings(named, cuda) == ["train.compile=reduce-overhead", "train.fused_sgd=true",
                                                 "train.cudnn_benchmark=true"]  # fmt: skip


def test_a_second_run_starts_only_if_both_end_in_time_sharing_the_device(tmp_path, monkeypatch):
    """As on the H100: a ResNet-18 run at 1.4 s an epoch, 196 epochs left; a second beside it would halve its pace."""
    gpu_session = load_gpu_session()
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    first = training(gpu_session, "wus:resnet18:baseline", 400.0, start)
    log_epochs(first, start + 40, 1.4)
    now = start + 50
    assert first.left_s(now) == pytest.approx(196 * 1.4)  # 274 s
    assert gpu_session.can_start(100.0, [], now, time_left=424)
    assert not gpu_session.can_start(100.0, [first], now, time_left=424)  # 549 s for the first, sharing
    assert gpu_session.can_start(100.0, [first], now, time_left=560)
    assert not gpu_session.can_start(425.0, [], now, time_left=424)


def test_the_default_runs_cover_every_cifar10_network_of_the_papers_beyond_lenet_and_resolve():
    """A lease trains DEFAULT_RUNS unless told otherwise: a network forgotten there, or a run that does not resolve at
    the papers' setting, would show only on a GPU."""
    gpu_session = load_gpu_session()
    from cheaptrain.config import load_params, resolve_run, validate_grid

    params = load_params(REPO / "params.yaml")
    validate_grid(params)
    runs = [gpu_session.parse_run(text) for text in gpu_session.DEFAULT_RUNS]
    for run in runs:  # at the paper's setting, where the ledger records the run: else a lease brings back nothing
        recipe = resolve_run(params, run.study, "cifar10", run.model, run.method, run.seed).to_dict()["recipe"]
        assert gpu_session.paper_setting(run.study, recipe, run.model)[0], run
    published = {(row["paper"], row["model"]) for row in read_csv(REPO / "data/published_results.csv")
                 if row["dataset"] == "cifar10" and row["model"] != "lenet"}  # fmt: skip
    assert {(run.study, run.model) for run in runs} == published
    for study, model in published:  # each network's baseline and the paper's method
        methods = {run.method for run in runs if (run.study, run.model) == (study, model)}
        assert {"baseline", study} <= methods, (study, model)


def test_a_new_session_is_refused_while_a_detached_one_still_runs(tmp_path, monkeypatch, capsys):
    """Rerun on the warm machine, the first command would otherwise delete the running session's copy and share the
    device with its runs."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpu-session").mkdir()
    running = subprocess.Popen(["sleep", "600"])
    try:
        (tmp_path / "gpu-session/detached.json").write_text(
            json.dumps({"workdir": str(tmp_path / "w"), "pid": running.pid})
        )
        for args in (["--return-after", "1"], []):
            assert exit_code(monkeypatch, "--minutes", "9", *args) == 1, args
            assert f"(pid {running.pid}) still runs" in capsys.readouterr().out, args
        assert (tmp_path / "gpu-session/detached.json").is_file()  # --collect still finds it
    finally:
        running.kill()


def test_a_run_alone_counts_the_races_first_epoch_once_and_beside_others_twice():
    """On an H100 a run alone compiled its first epoch in 0.44-0.69 of the race's time (the inductor cache warm from
    the race), one beside a second run compiling in 1.9 of it: VGG-16 at the sixth lease's race, 36,756 images/s and
    18.1 s, estimated 352 s alone (347 s of wall time) and 370 s were it counted twice."""
    gpu_session = load_gpu_session()
    rate = gpu_session.Rate(36756.0, 18.1, 0, ())
    alone, beside_one = gpu_session.estimate_s(200, 50000, rate, 1), gpu_session.estimate_s(200, 50000, rate, 2)
    epochs = 200 * 50000 / 36756.0 * gpu_session.EVALUATION
    assert alone == pytest.approx(gpu_session.START_S + 18.1 + epochs) == pytest.approx(352.4, abs=0.1)
    assert beside_one == pytest.approx(gpu_session.START_S + 2 * 18.1 + 2 * epochs)


def test_a_run_alone_after_its_models_baseline_is_estimated_from_the_baselines_entry(repo, monkeypatch, trained):
    """On an H100 the race estimated VGG-16's WUS run at 402 s where it took 290 (its baseline 347): a run alone is
    estimated from its model's baseline entry, when one trained in its recipe on a device of this name in its setting,
    if that says less than the race."""
    baseline = with_baseline(repo, trained)
    metrics = json.loads((baseline / "metrics.json").read_text())
    (baseline / "metrics.json").write_text(json.dumps(metrics | {"wall_time_s": 1.0}))  # a run of a second, as said
    gpu_session = load_gpu_session()
    known = gpu_session.KNOWN_MARGIN * 1.0 + gpu_session.KNOWN_START_S
    done = session(repo, "--runs", "dfp:lenet:dfp", "--parallel", "1", "--minutes", "8")
    assert done.returncode == 0, done.stdout + done.stderr
    (race,) = read_csv(repo / "out/race.csv")
    rate = gpu_session.Rate(float(race["images_per_s"]), float(race["first_epoch_s"]), 0, ())
    assert gpu_session.estimate_s(2, 128, rate, 1) > gpu_session.START_S > known  # what the race would say: more
    assert f"dfp/cifar10-lenet-dfp-s0: started, about {known:.0f} s" in done.stdout

    monkeypatch.chdir(repo)
    spec, cpu = gpu_session.parse_run("dfp:lenet:dfp"), torch.device("cpu")
    cfg = gpu_session.resolve_run(small_params(), "dfp", "cifar10", "lenet", "dfp", 0)
    eager, graphs = gpu_session.CANDIDATES["eager"], gpu_session.CANDIDATES["graphs"]
    assert gpu_session.known_s(spec, cfg, eager, cpu) == pytest.approx(known)
    assert gpu_session.need_s(spec, cfg, 1000.0, 1, eager, cpu) == pytest.approx(known)
    assert gpu_session.need_s(spec, cfg, 1.0, 1, eager, cpu) == 1.0  # the race's, when it says less
    assert gpu_session.need_s(spec, cfg, 1000.0, 2, eager, cpu) == 1000.0  # beside another run: the race's
    assert gpu_session.known_s(spec, cfg, graphs, cpu) is None  # another setting
    for other in ({"epochs": 3}, {"batch_size": 16}):  # another recipe
        recipes = {"dfp": small_params()["recipes"]["dfp"] | other}
        changed = gpu_session.resolve_run(small_params() | {"recipes": recipes}, "dfp", "cifar10", "lenet", "dfp", 0)
        assert gpu_session.known_s(spec, changed, eager, cpu) is None, other
    assert gpu_session.known_s(spec, replace(cfg, processes=2), eager, cpu) is None  # data-parallel
    assert gpu_session.known_s(gpu_session.parse_run("dfp:alexnet:dfp"), cfg, eager, cpu) is None  # no baseline
    with monkeypatch.context() as patched:
        patched.setattr(gpu_session, "tracked_device", lambda device: "NVIDIA H100 80GB HBM3")
        assert gpu_session.known_s(spec, cfg, eager, cpu) is None  # another device
    with monkeypatch.context() as patched:
        patched.setattr(gpu_session, "train_size", lambda root, dataset: 256)
        assert gpu_session.known_s(spec, cfg, eager, cpu) is None  # trained on other images than this run's
    slower = repo / "ledger/dfp/cifar10-lenet-baseline-s1"  # another seed's baseline, slower: the longest counts
    shutil.copytree(baseline, slower)
    (slower / "metrics.json").write_text(json.dumps(metrics | {"wall_time_s": 2.0}))
    slowest = gpu_session.KNOWN_MARGIN * 2.0 + gpu_session.KNOWN_START_S
    assert gpu_session.known_s(spec, cfg, eager, cpu) == pytest.approx(slowest)
    (slower / "metrics.json").write_text("{not json")  # unreadable: left out, not a crash
    assert gpu_session.known_s(spec, cfg, eager, cpu) == pytest.approx(known)
    # a method's run training 75% of the samples: the baseline's training time cut to that share, the rest as it was
    (baseline / "metrics.json").write_text(json.dumps(metrics | {"wall_time_s": 10.0, "train_time_s": 8.0}))
    cut = gpu_session.KNOWN_MARGIN * (10.0 - 0.25 * 8.0) + gpu_session.KNOWN_START_S
    assert gpu_session.known_s(spec, cfg, eager, cpu, 0.75) == pytest.approx(cut)
    assert gpu_session.need_s(spec, cfg, 1000.0, 1, eager, cpu, 0.75) == pytest.approx(cut)


def test_a_new_session_is_refused_while_runs_of_an_earlier_one_still_train(tmp_path, monkeypatch, capsys):
    """Its runs, here or in a detached session's copy, still have the device: a new session would train the same runs
    again beside them, and --return-after would empty the copy they train in."""
    monkeypatch.chdir(tmp_path)
    running = subprocess.Popen(["sleep", "600"])
    ended = subprocess.Popen(["true"])
    ended.wait()
    state = json.dumps([{"run": "dfp:lenet:baseline:0", "pid": running.pid, "epochs": 2, "estimate_s": 60}])
    named = f"dfp/cifar10-lenet-baseline-s0 (pid {running.pid})"
    try:
        (tmp_path / "gpu-session").mkdir()
        (tmp_path / "gpu-session/state.json").write_text(state)  # a session of this command's kind
        assert exit_code(monkeypatch, "--minutes", "9") == 1
        assert named in (out := capsys.readouterr().out) and "--collect waits for them" in out
        (tmp_path / "gpu-session/state.json").unlink()
        for work in (tmp_path / "w", tmp_path / "w2"):
            (work / "repo/gpu-session").mkdir(parents=True)
            (work / "repo/gpu-session/state.json").write_text(state)
            (work / "session.log").write_text("")
        # a detached session that has ended, its runs going on in its copy
        (tmp_path / "gpu-session/detached.json").write_text(json.dumps({"workdir": str(tmp_path / "w"),
                                                                         "pid": ended.pid}))  # fmt: skip
        assert exit_code(monkeypatch, "--minutes", "9") == 1
        assert named in capsys.readouterr().out
        (tmp_path / "gpu-session/detached.json").unlink()
        # --return-after would empty the copy under its --workdir
        assert exit_code(monkeypatch, "--minutes", "9", "--return-after", "1", "--workdir", "w2") == 1
        assert named in capsys.readouterr().out
        assert (tmp_path / "w2/repo/gpu-session/state.json").is_file()
    finally:
        running.kill()


def test_a_detached_session_gets_paths_that_lead_to_the_same_files_from_its_copy(
    repo, tmp_path, tmp_path_factory, monkeypatch
):
    """The session runs in a copy of the checkout: a relative --params or --cifar10 outside it still names its file,
    and the defaults name the copy's own (`carry/` and params.yaml, copied with the checkout)."""
    for folder in ("benchmarks", "stages", "src"):
        (repo / folder).symlink_to(REPO / folder)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["grid"]["dfp"]["methods"].append("dfp_p50")  # a mistake the session finds in its first seconds
    (elsewhere / "params.yaml").write_text(yaml.safe_dump(params))
    (elsewhere / "cifar10.tar.gz").write_text("not an archive")
    work = ["--workdir", str(tmp_path / "w"), "--return-after", "5"]
    relative = Path("..") / elsewhere.name
    started = session_here(repo, monkeypatch, "--params", str(relative / "params.yaml"), *work)  # before detaching
    assert started.returncode == 1 and "methods.dfp_p50" in started.stdout, started.stdout + started.stderr
    shutil.rmtree(repo / "data")  # so the session prepares CIFAR-10, from the archive named
    started = session(repo, "--cifar10", str(relative / "cifar10.tar.gz"), *work)
    assert started.returncode == 1 and "error: preparing CIFAR-10 failed" in started.stdout, started.stdout
    assert f"preparing CIFAR-10 from {elsewhere / 'cifar10.tar.gz'}" in (repo / "out/detached.log").read_text()

    gpu_session = load_gpu_session()
    copy = tmp_path / "w/repo"
    assert gpu_session.in_copy(Path("carry/cifar10-jpg.tar.gz"), copy) == str(copy / "carry/cifar10-jpg.tar.gz")
    assert gpu_session.in_copy(Path("params.yaml"), copy) == str(copy / "params.yaml")


def train_stubbed(
    gpu_session,
    tmp_path,
    monkeypatch,
    runs: list[str],
    failing: set[str],
    entry: bool,
    rates: dict | None = None,
    run_s: float = 0.0,
) -> list[str]:
    """The session's lines from train() over `runs` (2 epochs of 1000 images, 600 s) with the measurements and the
    runs stubbed: a model in `failing` fails its measurement, the others measure at their `rates` (images/s; else
    1e6), and each run's process ends at once, `run_s` of the session spent, with its entry if `entry`, else with an
    error logged; the models measured are appended to the lines as 'measured MODEL'."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gpu_session, "POLL_S", 0)
    monkeypatch.setattr(gpu_session, "train_size", lambda root, dataset: 1000)
    measured = []

    def measure(session, model, variant, device, sizes):
        measured.append(f"measured {model}")
        return None if model in failing else gpu_session.Rate((rates or {}).get(model, 1e6), 0.1, 0, ())

    def start(session, args, spec, epochs, need, overrides):
        spec.log.parent.mkdir(exist_ok=True)
        spec.log.write_text(f"{spec.name}: epoch 1/2 · train loss 1.0\nRuntimeError: CUDA out of memory\n\n")
        if entry:
            spec.entry.mkdir(parents=True)
            (spec.entry / "metrics.json").write_text("{}")
        process = subprocess.Popen(["true"])
        process.wait()
        session.deadline -= run_s  # as if the run had taken that long
        return gpu_session.Training(spec, epochs, need, process, process.pid)

    monkeypatch.setattr(gpu_session, "measure", measure)
    monkeypatch.setattr(gpu_session, "start", start)
    (tmp_path / "out").mkdir()
    session = gpu_session.Session(tmp_path / "out", time.monotonic() + 600)
    params, specs = small_params(), [gpu_session.parse_run(run) for run in runs]
    configs = {
        spec: gpu_session.resolve_run(params, spec.study, "cifar10", spec.model, spec.method, spec.seed)
        for spec in specs
    }
    args = argparse.Namespace(setting="race", parallel=1)
    gpu_session.train(session, args, configs, torch.device("cpu"), gpu_session.QUICK)
    return session.lines + measured


def test_a_model_is_measured_if_its_run_would_end_in_time_a_little_faster_than_the_fastest_measured(
    tmp_path, monkeypatch
):
    """On an H100 WRN-10 raced 1.33x faster than VGG-16 in one session: a model not measured yet is measured when a
    run of it would end in time at MEASURE_FASTER x the fastest rate measured, not only at that rate."""
    gpu_session = load_gpu_session()
    runs = ["dfp:lenet:baseline", "dfp:alexnet:baseline"]
    # lenet: 2 epochs of 1000 images at 4 images/s, 585 s of 600; alexnet's at that rate with its measuring would not
    # fit (645 s), at 1.5x (6 images/s) they would (462 s)
    lines = train_stubbed(gpu_session, tmp_path, monkeypatch, runs, failing=set(), entry=True, rates={"lenet": 4.0})
    assert [line for line in lines if line.startswith("measured")] == ["measured lenet", "measured alexnet"]
    assert "dfp/cifar10-alexnet-baseline-s0: ended at epoch 1/2" in lines  # trained (the stub's run ends at once)


@pytest.mark.parametrize(
    ("runs", "run_s", "measured"),
    [
        (["dfp:lenet:baseline", "dfp:alexnet:baseline"], 450, ["lenet", "alexnet"]),
        (["dfp:lenet:baseline", "dfp:alexnet:baseline", "dfp:lenet:dfp"], 450, ["lenet"]),
        (["dfp:lenet:baseline", "dfp:alexnet:baseline"], 560, ["lenet"]),  # less than MEASURE_S left
    ],
)
def test_a_model_is_measured_where_no_other_run_would_use_the_time(tmp_path, monkeypatch, runs, run_s, measured):
    """The last model of a lease is measured even where a run of it would not end in time at MEASURE_FASTER x the
    fastest rate: measuring it then takes no run's time. Where a run of a measured model would end in time, it goes
    first."""
    gpu_session = load_gpu_session()
    # lenet at 20 images/s: a run 145 s; after the first, 150 s left (run_s 450): alexnet's measuring and a run at
    # 1.5x lenet's rate would need 168 s; it measures (stubbed) far faster
    lines = train_stubbed(
        gpu_session, tmp_path, monkeypatch, runs, failing=set(), entry=True, rates={"lenet": 20.0}, run_s=run_s
    )
    assert [line for line in lines if line.startswith("measured")] == [f"measured {model}" for model in measured]
    ended = [line.split(":")[0] for line in lines if ": ended at epoch" in line]
    assert ended == [gpu_session.parse_run(run).name for run in runs if run.split(":")[1] in measured]


def test_a_model_whose_measurement_failed_trains_none_of_its_runs(tmp_path, monkeypatch):
    gpu_session = load_gpu_session()
    runs = ["dfp:lenet:baseline", "dfp:alexnet:baseline", "dfp:alexnet:dfp", "dfp:lenet:dfp"]
    lines = train_stubbed(gpu_session, tmp_path, monkeypatch, runs, failing={"alexnet"}, entry=True)
    assert [line for line in lines if line.startswith("measured")] == ["measured lenet", "measured alexnet"]
    dropped = "dfp/cifar10-alexnet-baseline-s0, dfp/cifar10-alexnet-dfp-s0"
    assert f"alexnet: its measurement failed: not trained ({dropped})" in lines
    assert not any("alexnet" in line and "not started" in line for line in lines)
    assert "dfp/cifar10-lenet-dfp-s0: ended at epoch 1/2" in lines  # the next model's runs still train


def test_a_run_that_exits_without_its_entry_says_why(tmp_path, monkeypatch):
    """Its log's last line, said as its process ends, in train() and in --collect."""
    gpu_session = load_gpu_session()
    lines = train_stubbed(gpu_session, tmp_path, monkeypatch, ["dfp:lenet:baseline"], failing=set(), entry=False)
    why = "dfp/cifar10-lenet-baseline-s0: exited without its entry; its log ends: RuntimeError: CUDA out of memory"
    assert lines.count(why) == 1
    collect = gpu_session.Session(tmp_path / "out", time.monotonic() + 60)
    gpu_session.collect(collect)  # from the state.json train() wrote
    assert why in collect.lines and "dfp/cifar10-lenet-baseline-s0: failed at epoch 1/2" in collect.lines


def test_measuring_releases_the_compiled_graphs_for_the_runs(tmp_path, monkeypatch):
    """The last setting raced keeps no compiled graphs or CUDA graph pools in the session while the runs train."""
    gpu_session = load_gpu_session()
    calls = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: calls.append("reset"))
    for outcome in (gpu_session.Rate(100.0, 1.0, 0, ()), RuntimeError("compile failed")):

        def steady_rate(cfg, sizes, variant, outcome=outcome):
            calls.append("measured")
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        monkeypatch.setattr(gpu_session, "steady_rate", steady_rate)
        calls.clear()
        session = gpu_session.Session(tmp_path, time.monotonic() + 60)
        gpu_session.measure(session, "lenet", gpu_session.CANDIDATES["eager"], torch.device("cpu"), gpu_session.QUICK)
        assert calls[-1] == "reset", outcome


def test_bad_arguments_are_usage_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    minutes = [(["--minutes", value], "--minutes") for value in ("0", "-1", "nan", "inf")]
    for args, named in [*minutes, (["--return-after", "nan"], "--return-after"), (["--device", "foo"], "--device foo")]:
        assert exit_code(monkeypatch, *args) == 2, args
        assert named in capsys.readouterr().err, args
    assert not (tmp_path / "out").exists()
    (tmp_path / "out").write_text("a file")
    assert exit_code(monkeypatch, "--minutes", "9") == 2
    assert "not a folder" in capsys.readouterr().err


def test_collect_after_a_detached_session_that_started_no_runs_points_to_what_it_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    ended = subprocess.Popen(["true"])
    ended.wait()
    (tmp_path / "w/repo").mkdir(parents=True)
    (tmp_path / "w/session.log").write_text("Traceback (most recent call last):\nOSError: no space left\n")
    (tmp_path / "gpu-session").mkdir()
    (tmp_path / "gpu-session/detached.json").write_text(json.dumps({"workdir": str(tmp_path / "w"), "pid": ended.pid}))
    assert exit_code(monkeypatch, "--collect", "--minutes", "1") == 1
    out = capsys.readouterr().out
    assert "ended before it started runs" in out and str(tmp_path / "out/detached.log") in out
    assert "OSError: no space left" in (tmp_path / "out/detached.log").read_text()


def write_entry(path: Path, cfg, trained_per_epoch: list[int], **metrics: float) -> None:
    """A ledger entry of `cfg` at `path` whose epochs trained these numbers of samples (run.json, metrics.json and
    history.csv, as read_entry reads them)."""
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"name": path.name, "config": cfg.to_dict()}))
    (path / "metrics.json").write_text(json.dumps({"total_trained_samples": sum(trained_per_epoch), **metrics}))
    rows = [f"{epoch},{n}" for epoch, n in enumerate(trained_per_epoch, 1)]
    (path / "history.csv").write_text("\n".join(["epoch,trained_samples", *rows]) + "\n")


def test_a_methods_run_is_estimated_at_the_share_of_samples_its_methods_entries_trained(tmp_path, monkeypatch):
    """DFP's schedule leaves the same 12.75% of the samples out on every network (8,725,000 of 10,000,000 in VGG-13's
    and LeNet's entries): a run of a method is estimated at the most its method's entries trained, in its study,
    dataset, epochs and method settings, on any network; a method whose entries train every sample, at every sample."""
    gpu_session = load_gpu_session()
    monkeypatch.chdir(tmp_path)
    params = small_params()

    def config(model: str, method: str, params: dict = params):
        return gpu_session.resolve_run(params, "dfp", "cifar10", model, method, 0)

    dfp, cfg = gpu_session.parse_run("dfp:lenet:dfp"), config("lenet", "dfp")
    assert gpu_session.sample_share(dfp, cfg) == 1.0  # no entry of its method yet: every sample
    write_entry(tmp_path / "ledger/dfp/cifar10-alexnet-dfp-s0", config("alexnet", "dfp"), [128, 64])
    write_entry(tmp_path / "ledger/dfp/cifar10-alexnet-dfp-s1", config("alexnet", "dfp"), [128, 96])
    write_entry(tmp_path / "ledger/dfp/cifar10-alexnet-baseline-s0", config("alexnet", "baseline"), [128, 128])
    (tmp_path / "ledger/dfp/cifar10-vgg11-dfp-s0").mkdir()  # not an entry the ledger can read: left out
    assert gpu_session.sample_share(dfp, cfg) == pytest.approx(224 / 256)  # another network's, the most of two
    baseline = gpu_session.parse_run("dfp:lenet:baseline")
    assert gpu_session.sample_share(baseline, config("lenet", "baseline")) == 1.0
    other_method = params | {"methods": params["methods"] | {"dfp": params["methods"]["dfp"] | {"prune_num": 0.5}}}
    assert gpu_session.sample_share(dfp, config("lenet", "dfp", other_method)) == 1.0  # other method settings
    other_recipe = params | {"recipes": params["recipes"] | {"dfp": params["recipes"]["dfp"] | {"epochs": 3}}}
    assert gpu_session.sample_share(dfp, config("lenet", "dfp", other_recipe)) == 1.0  # other epochs

    rate, share = gpu_session.Rate(100.0, 7.0, 0, ()), 224 / 256
    outside = gpu_session.START_S + 7.0  # a run's start and its first epoch's compiling: the same at any share
    full, cut = gpu_session.estimate_s(2, 1000, rate, 1), gpu_session.estimate_s(2, 1000, rate, 1, share)
    assert cut - outside == pytest.approx(share * (full - outside)) == pytest.approx(share * 2 * 10 * 1.1)


def test_a_dfp_run_that_ends_in_time_at_its_methods_share_of_the_samples_starts(tmp_path, monkeypatch):
    """2 epochs of 1000 images at 3.3846 images/s: 650 s of epochs, past the 600 s of the session with every sample,
    488 s at the 75% of them that an entry of the method trained on another network."""
    gpu_session = load_gpu_session()
    rates = {"lenet": 2 * 1000 * gpu_session.EVALUATION / 650}
    lines = train_stubbed(gpu_session, tmp_path, monkeypatch, ["dfp:lenet:dfp"], set(), entry=True, rates=rates)
    assert "dfp/cifar10-lenet-dfp-s0: not started: it would not end in time" in lines

    shutil.rmtree(tmp_path / "out")
    cfg = gpu_session.resolve_run(small_params(), "dfp", "cifar10", "alexnet", "dfp", 0)
    write_entry(tmp_path / "ledger/dfp/cifar10-alexnet-dfp-s0", cfg, [1000, 500])
    lines = train_stubbed(gpu_session, tmp_path, monkeypatch, ["dfp:lenet:dfp"], set(), entry=True, rates=rates)
    said = "estimated at 75.00% of every epoch's samples, as its method's entries in the ledger trained"
    assert f"dfp/cifar10-lenet-dfp-s0: {said}" in lines
    assert "dfp/cifar10-lenet-dfp-s0: ended at epoch 1/2" in lines  # started (the stub's run ends at once)
    (run,) = json.loads((tmp_path / "gpu-session/state.json").read_text())
    assert run["estimate_s"] == pytest.approx(gpu_session.START_S + 0.1 + 0.75 * 650)
