"""Replaying a ledger entry: the code that trained it reproduces its epochs exactly; changed training code, other
data or another code version are found and named; a branch from a replayed state (benchmarks/branch.py)."""

from __future__ import annotations

import dataclasses
import json
import re
import runpy
from pathlib import Path

import pytest
import torch

from cheaptrain import UserError, ledger, replay
from cheaptrain.papers import PAPERS
from cheaptrain.prepare import write_prepared
from cheaptrain.runner import train_run

from conftest import run_script, small_config, synthetic_split

SMALL_PAPER = {"epochs": 2, "batch_size": 32, "lr": 0.05, "milestones": [2], "gamma": 0.1}  # small_config's
# random pruning of 30% in epoch 1 (1 mod 2 >= 1), none in epoch 2
PRUNE_FIRST = {"window": 2, "starting_point": 1, "block": 1, "count": 1, "prune_num": 0.3, "attenuation": 1.0}


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A folder with tiny prepared data, the DFP paper's setting made small, and two entries trained into its ledger
    (baseline and random pruning, one thread, without MLflow)."""
    monkeypatch.setitem(PAPERS["dfp"], "recipe", PAPERS["dfp"]["recipe"] | SMALL_PAPER)
    for var in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "CHEAPTRAIN_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    write_prepared_data(tmp_path, seed=1)
    threads = torch.get_num_threads()
    for method, args in (("baseline", {}), ("random_prune", PRUNE_FIRST)):
        cfg = small_config(epochs=2, study="dfp", method=method)
        train_run(dataclasses.replace(cfg, method_args=args, ledger="record", threads=1), track=False)
    torch.set_num_threads(threads)
    return tmp_path


def write_prepared_data(root: Path, seed: int) -> None:
    train, test = synthetic_split(128, seed=seed), synthetic_split(64, seed=seed + 1)
    splits = {"train": (train.images, train.labels), "test": (test.images, test.labels)}
    write_prepared(root / "data/prepared/cifar10", splits, train.classes, {"source": "synthetic"})


def entry(repo: Path, method: str) -> Path:
    return repo / f"ledger/dfp/cifar10-lenet-{method}-s7"


def test_an_entry_replays_identically_with_the_code_that_trained_it(repo, capsys):
    pruning = ledger.read_entry(entry(repo, "random_prune"))
    assert [row["pruned_samples"] for row in pruning.history] == [38, 0]  # the method acted: compared too
    replay.main([str(entry(repo, "baseline")), str(entry(repo, "random_prune"))])
    out = capsys.readouterr().out
    assert "dfp/cifar10-lenet-random_prune-s7 (same code version), epochs 1-2: identical" in out
    assert "2 of 2 entries replayed identically with this checkout's code" in out
    assert not (repo / "checkpoints").exists() or not any((repo / "checkpoints").rglob("*.pt"))  # nothing written
    assert sorted(p.name for p in (repo / "ledger/dfp").iterdir()) == [
        "cifar10-lenet-baseline-s7",
        "cifar10-lenet-random_prune-s7",
    ]


def test_changed_training_code_is_found_and_named(repo, monkeypatch, capsys):
    """Label smoothing slipped into the loss: the replay names the first epoch and column that differ, exits 1."""
    cross_entropy = torch.nn.functional.cross_entropy
    monkeypatch.setattr(
        "cheaptrain.trainer.F.cross_entropy", lambda *a, **k: cross_entropy(*a, **k, label_smoothing=0.1)
    )
    with pytest.raises(SystemExit) as stop:
        replay.main([str(entry(repo, "baseline")), "--epochs", "1"])
    assert stop.value.code == 1
    out = capsys.readouterr().out
    assert (
        "dfp/cifar10-lenet-baseline-s7 (same code version), epochs 1-1: DIFFERS: epoch 1, train_loss: recorded" in out
    )
    assert "0 of 1 entries replayed identically" in out


def test_stale_replays_only_the_entries_of_another_code_version(repo, capsys):
    run_json = entry(repo, "baseline") / "run.json"
    info = json.loads(run_json.read_text())
    run_json.write_text(json.dumps(info | {"code_version": "0123456789abcdef"}))  # as an older checkout wrote it
    replay.main(["--stale"])
    captured = capsys.readouterr()
    assert "1 entries trained by another code version than this checkout's" in captured.err
    assert f"dfp/cifar10-lenet-baseline-s7 (code 0123456789abcdef -> {info['code_version']}), epochs 1-2: " \
           "identical" in captured.out  # fmt: skip
    assert "random_prune" not in captured.out


def test_an_entry_from_another_kind_of_cpu_is_replayed_with_a_caveat(repo, monkeypatch, capsys):
    """Another CPU model may round differently from the first epoch: the line says so; another core count does not
    change how one thread rounds, so it is no caveat."""
    recorded = ledger.read_entry(entry(repo, "baseline")).info["device"]
    model = recorded.rsplit(" x", 1)[0]
    monkeypatch.setattr(replay, "device_name", lambda device: f"{model} x64")
    replay.main([str(entry(repo, "baseline")), "--epochs", "1"])
    assert capsys.readouterr().out.splitlines()[0].endswith("epochs 1-1: identical")
    monkeypatch.setattr(replay, "device_name", lambda device: "cpu: Another CPU x2")
    replay.main([str(entry(repo, "baseline")), "--epochs", "1"])
    line = capsys.readouterr().out.splitlines()[0]
    assert line.endswith(f"identical; recorded on {recorded}, replayed on cpu: Another CPU x2: another kind of CPU "
                         "may round differently")  # fmt: skip


def test_an_entry_whose_cpu_used_other_vector_instructions_is_replayed_with_a_caveat(repo, monkeypatch, capsys):
    """CPUs of one name may differ in their vector instructions (AVX2, AVX512), and torch's kernels with them: the
    entry records the ones it used, and a replay with others, or of an entry without the record, says so."""
    run_json = entry(repo, "baseline") / "run.json"
    info = json.loads(run_json.read_text())
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    (machine,) = info["machines"]
    assert machine == {"from_epoch": 1, "device": info["device"], "cpu_capability": info["cpu_capability"]}
    fake = {"cpu_capability": "AVX512_FAKE"}
    run_json.write_text(json.dumps(info | fake | {"machines": [machine | fake]}))
    replay.main([str(entry(repo, "baseline")), "--epochs", "1"])
    line = capsys.readouterr().out.splitlines()[0]
    here = torch.backends.cpu.get_cpu_capability()
    assert line.endswith(f"identical; recorded with AVX512_FAKE kernels, replayed with {here}: they may round "
                         "differently")  # fmt: skip
    # resumed after epoch 1 on a CPU with other kernels: its first epoch replays as before, its second with a caveat
    run_json.write_text(json.dumps(info | fake | {"machines": [machine, machine | fake | {"from_epoch": 2}]}))
    replay.main([str(entry(repo, "baseline")), "--epochs", "1"])
    assert capsys.readouterr().out.splitlines()[0].endswith("epochs 1-1: identical")
    replay.main([str(entry(repo, "baseline")), "--epochs", "2"])
    line = capsys.readouterr().out.splitlines()[0]
    assert line.endswith(f"identical; epochs from 2 trained on {info['device']} with AVX512_FAKE kernels: they may "
                         "round differently")  # fmt: skip
    older = {k: v for k, v in info.items() if k not in ("cpu_capability", "machines")}  # an older entry
    run_json.write_text(json.dumps(older))
    replay.main([str(entry(repo, "baseline")), "--epochs", "1"])
    line = capsys.readouterr().out.splitlines()[0]
    assert line.endswith(f"identical; the entry does not say which vector instructions its kernels used (here "
                         f"{here}): a CPU of the same name with others may round differently")  # fmt: skip


def edit_run_json(path: Path, **changes) -> dict:
    """Rewrite an entry's run.json with `changes` (as another machine or checkout wrote it); returns the original."""
    info = json.loads((path / "run.json").read_text())
    (path / "run.json").write_text(json.dumps(info | changes))
    return info


PREPARE = (
    "`CIFAR10_SOURCE=../shared/datasets/cifar10-jpg.tar.gz python stages/download.py --dataset cifar10 --no-mlflow`"
)


def test_other_data_is_refused_before_any_training_with_the_command_for_the_entries_data(repo):
    """The message says both digests and the command that prepares the data the ledger's entries trained on (not
    `dvc repro download`: params.yaml's torchvision source gives other pixels, and it prepares CIFAR-100 too)."""
    digest = ledger.read_entry(entry(repo, "baseline")).info["data_digest"]
    write_prepared_data(repo, seed=5)
    with pytest.raises(UserError) as error:
        replay.replay(ledger.read_entry(entry(repo, "baseline")))
    assert str(error.value).startswith(f"{entry(repo, 'baseline')}: trained on prepared data {digest}, ")
    assert str(error.value).endswith(f" holds {replay.prepared_digest(repo / 'data/prepared/cifar10')}: run "
                                     f"{PREPARE} for the data the ledger's entries trained on")  # fmt: skip


def test_missing_or_incomplete_prepared_data_is_a_clear_error(repo):
    (repo / "data/prepared/cifar10/train.npz").unlink()
    with pytest.raises(UserError, match=r"data/prepared/cifar10 is incomplete \(No such file or directory: .*train\.npz"
                       rf"\): run {re.escape(PREPARE)}$"):  # fmt: skip
        replay.replay(ledger.read_entry(entry(repo, "baseline")))
    (repo / "data/prepared/cifar10/manifest.json").unlink()
    with pytest.raises(UserError, match=rf"no prepared cifar10 in .*: run {re.escape(PREPARE)} first$"):
        replay.replay(ledger.read_entry(entry(repo, "baseline")))


def test_an_entry_trained_on_a_gpu_is_not_replayed_on_the_cpu(repo, capsys):
    """A GPU's (compiled) epochs cannot be reproduced on a CPU, and a compiled ResNet-18 would train there for hours:
    `--stale` lists such an entry as not replayable here and replays the others; named, it is an error."""
    gpu = "NVIDIA H100 80GB HBM3"
    edit_run_json(entry(repo, "baseline"), device=gpu, code_version="0123456789abcdef")
    edit_run_json(entry(repo, "random_prune"), code_version="0123456789abcdef")
    replay.main(["--stale"])
    captured = capsys.readouterr()
    assert "2 entries trained by another code version than this checkout's" in captured.err
    lines = captured.out.splitlines()
    assert lines[0] == f"dfp/cifar10-lenet-baseline-s7: not replayable here, trained on {gpu} (the replay trains on " \
                       "the CPU)"  # fmt: skip
    assert "dfp/cifar10-lenet-random_prune-s7 (code 0123456789abcdef -> " in lines[1]
    assert lines[2] == "1 of 1 entries replayed identically with this checkout's code"
    with pytest.raises(UserError, match=rf"baseline-s7: trained on {gpu}; the replay trains on the CPU only, which "
                       "cannot reproduce it$"):  # fmt: skip
        replay.main([str(entry(repo, "baseline"))])


def test_an_entry_of_a_method_this_checkout_lacks_is_a_clear_error(repo):
    """Named or found by `--stale`, one message: the entry and its method (not a KeyError, exit 1 as for "differs")."""
    info = json.loads((entry(repo, "baseline") / "run.json").read_text())
    edit_run_json(entry(repo, "baseline"), config=info["config"] | {"method": "gone"}, code_version="0123456789abcdef")
    message = r"ledger/dfp/cifar10-lenet-baseline-s7: method 'gone' is unknown to this checkout \(it has .*baseline"
    with pytest.raises(UserError, match=message):
        replay.main(["--stale"])
    with pytest.raises(UserError, match=message):
        replay.main([str(entry(repo, "baseline"))])


def test_an_entry_of_another_torch_version_is_replayed_with_a_caveat(repo, capsys):
    edit_run_json(entry(repo, "baseline"), torch_version="2.0.0+cpu")
    replay.main([str(entry(repo, "baseline")), "--epochs", "1"])
    line = capsys.readouterr().out.splitlines()[0]
    assert line.endswith(f"identical; recorded with torch 2.0.0+cpu, replayed with {torch.__version__}: it may "
                         "compute differently")  # fmt: skip


def test_the_replay_runs_through_the_second_epoch_in_which_the_method_acted():
    def rows(column: str, acting: set[int]) -> list[dict[str, float]]:
        return [{"epoch": e, column: float(e in acting)} for e in range(1, 60)]

    assert replay.default_epochs(rows("phase", {38, 39, 40})) == 39  # WUS: its first skip epochs
    assert replay.default_epochs(rows("pruned_samples", {16, 18, 28})) == 18  # DFP: its first pruning epochs
    assert replay.default_epochs(rows("loss", set())) == 2  # a baseline: 2 epochs
    recorded = [{"epoch": 1, "train_loss": 1.5, "threads": 1, "epoch_train_s": 3.0, "selection_s": 0.1}]
    now = [{"epoch": 1, "train_loss": 1.5, "threads": 2, "epoch_train_s": 9.0, "selection_s": 0.5}]
    assert replay.first_difference(recorded, now) is None  # seconds and threads are the machine's
    now[0]["train_loss"] = 1.5000001
    assert replay.first_difference(recorded, now) == "epoch 1, train_loss: recorded 1.5, now 1.5000001"


def test_an_entry_with_settings_this_code_lacks_is_a_clear_error(repo):
    run_json = entry(repo, "baseline") / "run.json"
    info = json.loads(run_json.read_text())
    info["config"]["recipe"]["warmup"] = 5  # a recipe setting of a later checkout
    run_json.write_text(json.dumps(info))
    with pytest.raises(UserError, match=r"run\.json has settings this code does not know: recipe\.warmup$"):
        replay.replay(ledger.read_entry(entry(repo, "baseline")))


BRANCH = Path(__file__).resolve().parents[1] / "benchmarks" / "branch.py"


@pytest.fixture
def infobatch_entry(repo) -> Path:
    """InfoBatch's 2 epochs in the ledger: epoch 1 trains every sample, epoch 2 leaves out and upweights some."""
    cfg = small_config(epochs=2, study="dfp", method="infobatch")
    args = {"prune_ratio": 0.5, "delta": 1.0}
    train_run(dataclasses.replace(cfg, method_args=args, ledger="record", threads=1), track=False)
    recorded = ledger.read_entry(entry(repo, "infobatch")).history[1]
    assert recorded["pruned_samples"] > 0 and recorded["upweighted_samples"] > 0
    return entry(repo, "infobatch")


def test_a_branch_reproduces_the_entry_as_trained_and_each_arm_turns_off_its_hooks_alone(infobatch_entry):
    """Branched after epoch 1, draw 0 as-trained is the entry's epoch 2 digit for digit, whichever branch trained
    before it (a branch starts from the kept state, not the last branch's); unweighted trains the same samples to
    another loss; method-off trains every sample; draw 1 trains others."""
    branch = runpy.run_path(str(BRANCH))
    entry_ = ledger.read_entry(infobatch_entry)
    recorded = entry_.history[1]
    # method-off first: as-trained after it must still start from the replayed state
    b = branch["branch_entry"](entry_, 1, 1, 2, ["method-off", "as-trained", "unweighted"])
    assert b.replayed is None and b.as_trained_again() is None
    assert list(b.rows) == [(arm, d) for arm in ("method-off", "as-trained", "unweighted") for d in (0, 1)]
    trained, unweighted, off = b.rows["as-trained", 0][0], b.rows["unweighted", 0][0], b.rows["method-off", 0][0]
    assert trained["trained_samples"] == unweighted["trained_samples"] == recorded["trained_samples"] < 128
    assert unweighted["train_loss"] != trained["train_loss"]
    assert off["trained_samples"] == 128
    other = b.rows["as-trained", 1][0]
    assert other["trained_samples"] != trained["trained_samples"] or other["train_loss"] != trained["train_loss"]
    assert branch["fell_in"]([{"epoch": 5, "test_acc": 40.0}, {"epoch": 6, "test_acc": 10.9}], 11.0) == 6
    assert branch["fell_in"]([{"epoch": 5, "test_acc": None}], 11.0) == 5  # the loss stopped being finite
    assert branch["fell_in"]([{"epoch": 5, "test_acc": 11.1}], 11.0) is None


def test_the_branch_script_says_what_it_measured_and_refuses_epochs_it_cannot_check_and_method_off_for_wus(
    infobatch_entry,
):
    done = run_script(BRANCH, str(infobatch_entry), "--after", "1", "--epochs", "1", "--draws", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("dfp/cifar10-lenet-infobatch-s7, branched after epoch 1: epochs 2-2, 1 draw(s) per arm")
    assert "the replay to the branch: identical to the entry" in lines[0]
    assert [line.split()[0] for line in lines[3:7]] == ["(entry)", "as-trained", "unweighted", "method-off"]
    assert lines[-2] == "fell: as-trained: 0 of 1; unweighted: 0 of 1; method-off: 0 of 1"
    assert lines[-1] == "as-trained, draw 0 against the entry: identical"
    done = run_script(BRANCH, str(infobatch_entry), "--after", "2")
    assert done.returncode == 2
    assert "it records 2 epochs; branching after 2 for 2 needs 4" in done.stderr
    history = infobatch_entry / "history.csv"
    lines = history.read_text().splitlines()  # a WUS entry's history: a phase column
    history.write_text("\n".join([lines[0] + ",phase", *(line + ",0" for line in lines[1:])]) + "\n")
    done = run_script(BRANCH, str(infobatch_entry), "--after", "1", "--epochs", "1", "--arms", "method-off")
    assert done.returncode == 2
    assert "its method freezes parameters by phase (WUS)" in done.stderr


def test_a_branch_whose_replay_does_not_reproduce_the_entry_says_so_and_exits_1(infobatch_entry, monkeypatch):
    """Label smoothing slipped into the loss: the state branched from is not the entry's, and the script says where."""
    cross_entropy = torch.nn.functional.cross_entropy
    monkeypatch.setattr(
        "cheaptrain.trainer.F.cross_entropy", lambda *a, **k: cross_entropy(*a, **k, label_smoothing=0.1)
    )
    done = run_script(
        BRANCH, str(infobatch_entry), "--after", "1", "--epochs", "1", "--draws", "1", "--arms", "as-trained"
    )
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert "the replay to the branch: DIFFERS: epoch 1, train_loss: recorded" in lines[0]
    assert lines[-1].startswith("as-trained, draw 0 against the entry: DIFFERS: epoch 2, train_loss: recorded")
