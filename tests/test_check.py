"""The regression gate: passes a good summary, exits 1 naming every violation of a bad one, compares with a reference,
says what it did not check (wall-clock thresholds under check.wall_clock report), rejects unknown keys; and in the
quick pipeline, `dvc repro` fails when it does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cheaptrain import UserError
from cheaptrain.aggregate import read_summary, summary_csv
from cheaptrain.check import Check, compare_reference, evaluate, load_gate, render

from conftest import REPO, run_in, run_stage

THRESHOLDS = {
    "max_acc_drop": {"dfp": 1.0, "wus": 2.0},
    "min_acc": {"baseline": 55.0},
    "min_time_saving": {"dfp": 5.0, "wus": 20.0},
    "min_params_reduction": {"wus": 50.0},
    "reference_margin": 1.0,
    "wall_clock": "gate",  # a quiet machine: the time savings are gated
}


def row(study: str, method: str, acc: float, **figures: float) -> dict:
    measure = {"dfp": "best3_acc", "wus": "final_acc"}[study]
    return {"study": study, "dataset": "cifar10", "model": "lenet", "method": method, "seeds": 3, "epochs": 10,
            "acc_measure": measure, "acc_mean": acc} | {f"{k}_mean": v for k, v in figures.items()}  # fmt: skip


def good() -> list[dict]:
    return [
        row("dfp", "baseline", 62.0),
        row("dfp", "dfp", 61.5, acc_delta=-0.5, time_saving_pct=9.0),
        row("wus", "baseline", 61.0),
        row("wus", "wus", 60.0, acc_delta=-1.0, time_saving_pct=35.0, updated_params_reduction_pct=60.0),
    ]


def bad() -> list[dict]:
    return [
        row("dfp", "baseline", 50.0),  # below min_acc
        row("dfp", "dfp", 47.0, acc_delta=-3.0, time_saving_pct=9.0),  # drops 3 points
        row("wus", "baseline", 61.0),
        row("wus", "wus", 60.0, acc_delta=-1.0, time_saving_pct=4.0, updated_params_reduction_pct=60.0),  # saves 4%
    ]


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text(summary_csv(rows))
    return path


def squash(text: str) -> str:
    """The gate's output with its column padding collapsed to single spaces."""
    return "\n".join(" ".join(line.split()) for line in text.splitlines())


def gate(
    tmp_path: Path, rows: list[dict], check: dict, *extra: str, track: bool = False, in_process: bool = False
) -> subprocess.CompletedProcess:
    """Run stages/check.py on a summary of `rows` with params `check`; with `track`, logging it to MLflow (which
    tests/test_tracking.py checks), else with --no-mlflow. `in_process`: in this process (conftest.run_stage), for
    bad input that fails before any work; otherwise in its own, whose exit status is the one DVC sees."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"check": check}))
    write(tmp_path / "summary.csv", rows)
    stage = REPO / "stages" / "check.py"
    args = ["--params", "params.yaml", "--summary", "summary.csv", "--out", "check.json",
            *([] if track else ["--no-mlflow"]), *extra]  # fmt: skip
    if in_process:  # in the environment the process would inherit
        inherited = {name: os.environ[name] for name in ("MLFLOW_TRACKING_URI", "DVC_ROOT") if name in os.environ}
        return run_stage(stage, *args, cwd=tmp_path, env=inherited)
    env = os.environ | {"PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, str(stage), *args], cwd=tmp_path, capture_output=True, text=True, env=env)


def test_gate_passes_a_good_summary_and_shows_what_passed(tmp_path):
    result = gate(tmp_path, good(), THRESHOLDS)
    assert result.returncode == 0, result.stdout + result.stderr
    out = squash(result.stdout)
    assert "PASSED: all 7 checks" in out
    assert "pass dfp cifar10/lenet/dfp accuracy drop vs baseline 0.50 pts <= 1.00 pts" in out
    assert "pass wus cifar10/lenet/wus updated-parameter reduction 60.00 % >= 50.00 %" in out
    assert json.loads((tmp_path / "check.json").read_text()) == {
        "passed": True, "checks": 7, "violations": 0, "not_checked": 0,
    }  # fmt: skip
    assert "MLflow" not in result.stdout and not (tmp_path / "mlflow.db").exists()  # --no-mlflow: nothing logged


def test_gate_exits_1_with_a_table_of_every_violation(tmp_path):
    result = gate(tmp_path, bad(), THRESHOLDS)
    assert result.returncode == 1, result.stdout + result.stderr
    out = squash(result.stdout)
    assert "FAILED: 3 violation(s) of 7 checks" in out
    violations = [line for line in out.splitlines() if line.startswith("FAIL ")]
    assert len(violations) == 3
    assert any("dfp cifar10/lenet/baseline" in v and "accuracy" in v and "50.00 %" in v and ">= 55.00" in v
               for v in violations)  # fmt: skip
    assert any("dfp cifar10/lenet/dfp" in v and "3.00 pts" in v and "<= 1.00 pts" in v for v in violations)
    assert any("wus cifar10/lenet/wus" in v and "time saved" in v and "4.00 %" in v for v in violations)
    assert "4 other check(s) passed" in out
    assert json.loads((tmp_path / "check.json").read_text())["passed"] is False


def test_time_saved_against_the_runs_own_full_epochs_is_gated(tmp_path):
    rows = [
        row("dfp", "baseline", 62.0, own_time_saving_pct=0.0),
        row("dfp", "dfp", 61.5, own_time_saving_pct=9.0),
        row("wus", "baseline", 61.0, own_time_saving_pct=0.0),
        row("wus", "wus", 60.0, own_time_saving_pct=4.0),  # below its 10
    ]
    result = gate(tmp_path, rows, {"min_own_time_saving": {"dfp": 5.0, "wus": 10.0}, "wall_clock": "gate"})
    assert result.returncode == 1, result.stdout + result.stderr
    out = squash(result.stdout)
    assert "FAILED: 1 violation(s) of 2 checks" in out
    assert "FAIL wus cifar10/lenet/wus time saved vs its own full epochs 4.00 % >= 10.00 %" in out
    assert "1 other check(s) passed" in out  # dfp: 9 >= 5


def test_wall_clock_thresholds_are_reported_not_gated_unless_the_params_say_gate(tmp_path):
    check = {"min_time_saving": {"dfp": 5.0, "wus": 20.0}, "min_own_time_saving": {"wus": 20.0},
             "max_acc_drop": {"dfp": 1.0, "wus": 2.0}}  # fmt: skip
    slow = [r | {"time_saving_pct_mean": 4.0, "own_time_saving_pct_mean": 25.0} if r["method"] == "wus" else r
            for r in good()]  # fmt: skip
    result = gate(tmp_path, slow, check)  # wus saved 4% against its 20: not evaluated by default
    assert result.returncode == 0, result.stdout + result.stderr
    out = squash(result.stdout)
    assert "PASSED: all 2 checks" in out and "time saved" not in out.split("Not checked:")[0]
    not_gated = "not checked (wall-clock reported, not gated: check.wall_clock is report)"
    assert f"  - min_time_saving: {not_gated}: dfp, wus" in result.stdout
    assert f"  - min_own_time_saving: {not_gated}: wus" in result.stdout
    assert json.loads((tmp_path / "check.json").read_text())["not_checked"] == 4  # and the baseline, ungated
    reported = evaluate(slow, load_gate({"check": check | {"wall_clock": "report"}}))
    assert [c.status for c in reported if "time" in c.check] == ["skip", "skip", "skip"]
    gated = evaluate(slow, load_gate({"check": check | {"wall_clock": "gate"}}))
    timed = [(c.status, c.config, c.value) for c in gated if c.check.startswith("time saved")]
    assert timed == [("pass", "dfp cifar10/lenet/dfp", "9.00 %"), ("FAIL", "wus cifar10/lenet/wus", "4.00 %"),
                     ("pass", "wus cifar10/lenet/wus", "25.00 %")]  # fmt: skip


def test_compute_saving_is_gated_at_its_boundary_and_a_run_without_flops_fails_clearly():
    gate_ = load_gate({"check": {"min_compute_saving": {"dfp": 12.0}}})

    def compute_check(**figures: float) -> Check:
        (check,) = evaluate([row("dfp", "dfp", 61.5, acc_delta=-0.5, **figures)], gate_)
        return check

    assert compute_check(compute_saving_pct=12.0) == Check(
        "pass", "dfp cifar10/lenet/dfp", "compute saved vs baseline", "12.00 %", ">= 12.00 %"
    )
    assert compute_check(compute_saving_pct=11.99).status == "FAIL"
    unknown = compute_check()  # its runs were trained before FLOPs were counted
    assert unknown.status == "FAIL" and "no train_flops in its runs or its baseline's" in unknown.check


def test_gate_fails_when_a_method_lost_accuracy_against_the_reference(tmp_path):
    reference = write(tmp_path / "reference.csv", good())
    worse = good()
    worse[1] = worse[1] | {"acc_delta_mean": -0.9, "acc_mean": 61.1}  # within max_acc_drop, but 0.4 worse: fine
    worse[3] = worse[3] | {"acc_delta_mean": -1.9, "acc_mean": 59.1}  # 0.9 worse: fine
    assert gate(tmp_path, worse, THRESHOLDS | {"reference": str(reference)}).returncode == 0
    worse[3] = worse[3] | {"acc_delta_mean": -2.5}  # 1.5 worse than the reference's -1.0, over the margin of 1.0
    result = gate(tmp_path, worse, THRESHOLDS | {"max_acc_drop": {"dfp": 1, "wus": 3}, "reference": str(reference)})
    assert result.returncode == 1, result.stdout
    (violation,) = [line for line in squash(result.stdout).splitlines() if line.startswith("FAIL ")]
    assert "wus cifar10/lenet/wus" in violation and "accuracy Δ vs the reference's" in violation
    assert "-2.50 (ref -1.00)" in violation and ">= ref - 1.00 pts" in violation
    worse = [r | {"acc_mean": 58.0} if r["method"] == "baseline" and r["study"] == "wus" else r for r in good()]
    result = gate(tmp_path, worse, THRESHOLDS | {"reference": str(reference)})  # a baseline 3 points below its own
    (violation,) = [line for line in squash(result.stdout).splitlines() if line.startswith("FAIL ")]
    assert "wus cifar10/lenet/baseline accuracy vs the reference's 58.00 (ref 61.00)" in violation


def test_a_loss_against_the_reference_of_exactly_the_margin_passes_and_a_hundredth_more_fails():
    reference = [row("wus", "wus", 60.0, acc_delta=-1.0)]

    def status(delta: float) -> str:
        (check,) = compare_reference([row("wus", "wus", 60.0, acc_delta=delta)], reference, margin=0.5)
        return check.status

    assert status(-1.5) == "pass"  # 0.5 points lost: the margin itself
    assert status(-1.51) == "FAIL"
    assert status(-0.2) == "pass"  # a gain


def test_reference_of_another_setting_or_without_the_method_is_not_compared(tmp_path):
    summary = good()
    other = [r | {"epochs": 200} if r["method"] == "dfp" else r for r in good() if r["method"] != "wus"]
    checks = evaluate(summary, load_gate({"check": THRESHOLDS}), other)
    notes = [c.check for c in checks if c.status == "skip"]
    assert "accuracy Δ vs the reference's: the reference has another setting (epochs 200 vs 10)" in notes
    assert "accuracy Δ vs the reference's: not in the reference (accept it with --accept)" in notes


def test_thresholds_of_methods_without_runs_and_methods_without_thresholds_are_listed_not_failed(tmp_path):
    thresholds = THRESHOLDS | {"max_acc_drop": {"dfp": 1.0, "wus": 2.0, "wus_lr": 2.0, "random_prune": 1.0}}
    summary = [*good(), row("wus", "wus_new", 60.0, acc_delta=-1.0)]
    checks = evaluate(summary, load_gate({"check": thresholds}))
    assert not [c for c in checks if c.status == "FAIL"]
    text = render(checks, "summary.csv")
    assert "PASSED" in text and "Not checked:" in text
    assert "  - max_acc_drop: no runs in the summary (not a violation): wus_lr, random_prune" in text
    assert "  - no threshold in params `check` (not gated): wus_new" in text


def test_the_ledgers_own_configurations_are_listed_not_gated():
    """Runs at a paper's setting kept in the ledger are compared with the papers in report.md, not gated; a
    configuration the grid shares with the ledger is gated."""
    ledger_only = [r | {"source": "ledger", "epochs": 200} for r in bad()]
    shared = [r | {"source": "runs+ledger"} for r in good()]
    checks = evaluate(shared + ledger_only, load_gate({"check": THRESHOLDS}))
    assert [c for c in checks if c.status == "FAIL"] == []
    assert sum(c.status == "pass" for c in checks) == len(evaluate(good(), load_gate({"check": THRESHOLDS})))
    skipped = [c.config for c in checks if c.check.startswith("from the results ledger alone")]
    assert skipped == ["dfp cifar10/lenet/baseline", "dfp cifar10/lenet/dfp", "wus cifar10/lenet/baseline",
                       "wus cifar10/lenet/wus"]  # fmt: skip
    against_reference = evaluate(ledger_only, load_gate({"check": THRESHOLDS}), reference=good())
    assert all(c.status != "FAIL" for c in against_reference)  # a 3-point drop, but the ledger's: not compared


def test_null_thresholds_are_off_and_a_method_without_its_baseline_fails(tmp_path):
    gate_ = load_gate({"check": {"min_time_saving": {"dfp": None}, "max_acc_drop": {"dfp": 1.0}}})
    checks = evaluate([row("dfp", "dfp", 60.0, time_saving_pct=1.0)], gate_)
    assert [(c.status, c.check) for c in checks] == [
        ("FAIL", "accuracy drop vs baseline: no baseline at this setting"),
        ("skip", "min_time_saving: null (switched off)"),
    ]


def test_a_figure_the_gate_cannot_read_fails_for_the_reason_the_report_gives():
    """A pair on two machines has no time saved against its baseline; a method whose own seeds all ended at chance has
    no figure, not a missing baseline; a collapsed baseline is named, and blamed only for the figures that need it."""
    elsewhere = "seed 0 on cuda: NVIDIA H100, its baseline on cpu: AMD EPYC x2"
    rows = [
        row("dfp", "dfp", 61.5, acc_delta=-0.5, compute_saving_pct=12.0) | {"time_unpaired": elsewhere},
        {k: v for k, v in row("wus", "wus", 0.0).items() if k != "acc_mean"} | {"seeds": 0, "collapsed_seeds": "0 1"},
        row("wus", "wus_lr", 60.0, own_time_saving_pct=30.0) | {"baseline_collapsed_seeds": "2"},
    ]
    thresholds = {"max_acc_drop": {"wus": 2.0, "wus_lr": 2.0}, "min_time_saving": {"dfp": 5.0},
                  "min_own_time_saving": {"wus": 20.0, "wus_lr": 20.0}, "min_params_reduction": {"wus_lr": 50.0},
                  "wall_clock": "gate"}  # fmt: skip
    checks = evaluate(rows, load_gate({"check": thresholds}))
    assert [(c.config, c.check) for c in checks if c.status == "FAIL"] == [
        ("wus cifar10/lenet/wus", "final accuracy at chance: the network stopped learning (left out of the summary's "
         "figures)"),
        ("wus cifar10/lenet/wus", "accuracy drop vs baseline: its seeds 0, 1 all ended at chance"),
        ("wus cifar10/lenet/wus_lr", "accuracy drop vs baseline: the baseline of seed 2 ended at chance"),
        ("dfp cifar10/lenet/dfp", f"time saved vs baseline: it and its baseline trained on different machines "
         f"({elsewhere})"),
        ("wus cifar10/lenet/wus", "time saved vs its own full epochs: its seeds 0, 1 all ended at chance"),
        ("wus cifar10/lenet/wus_lr", "updated-parameter reduction: not in its runs' metrics"),
    ]  # fmt: skip
    assert [c.value for c in checks if c.config == "wus cifar10/lenet/wus_lr" and c.status == "pass"] == ["30.00 %"]


@pytest.mark.parametrize(
    ("check", "message"),
    [
        ({"max_acc_dorp": {"dfp": 1}}, "check.max_acc_dorp: unknown key (accepted: max_acc_drop, min_acc"),
        ({"max_acc_drop": {"dfp": "a lot"}}, "check.max_acc_drop.dfp: 'a lot' is not a finite number"),
        ({"min_acc": {"baseline": float("nan")}}, "check.min_acc.baseline: nan is not a finite number"),
        ({"reference_margin": float("inf")}, "check.reference_margin: inf is not accepted"),
        ({"max_acc_drop": [1, 2]}, "check.max_acc_drop: must map method names to numbers"),
        ({"min_time_saving": {"baseline": 5}}, "check.min_time_saving.baseline: the baseline is the reference"),
        ({"reference_margin": -1}, "check.reference_margin: -1 is not accepted"),
        ({"wall_clock": "sometimes"}, "check.wall_clock: 'sometimes' is not accepted; accepted: report | gate"),
        ({"min_compute_saving": {"baseline": 1}}, "check.min_compute_saving.baseline: the baseline is the reference"),
        ({"min_compute_saving": {"dfp": True}}, "check.min_compute_saving.dfp: True is not a finite number"),
        # misspelt, it would gate nothing and leave dfp ungated: "PASSED" over a run that lost 18 points
        ({"max_acc_drop": {"dpf": 1.0}}, "check.max_acc_drop.dpf: no method of that name (accepted: baseline, dfp,"),
    ],
)
def test_bad_thresholds_are_clear_errors(tmp_path, check, message):
    with pytest.raises(UserError, match="invalid params `check`") as info:
        load_gate({"check": check})
    assert message in str(info.value)
    result = gate(tmp_path, good(), check, in_process=True)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_a_threshold_may_name_a_configuration_of_params_methods():
    check = {"max_acc_drop": {"dfp_p50": 1.0}}
    with pytest.raises(UserError, match=r"check\.max_acc_drop\.dfp_p50: no method of that name"):
        load_gate({"check": check})
    assert load_gate({"check": check, "methods": {"dfp_p50": {"method": "dfp", "prune_num": 0.5}}}).thresholds[
        "max_acc_drop"
    ] == {"dfp_p50": 1.0}


def test_accept_makes_the_summary_the_reference_and_a_missing_reference_is_an_error(tmp_path):
    check = THRESHOLDS | {"reference": "reference/quick-summary.csv"}
    result = gate(tmp_path, good(), check, in_process=True)
    assert result.returncode == 2 and "python stages/check.py --accept" in result.stderr
    accepted = gate(tmp_path, good(), check, "--accept")
    assert accepted.returncode == 0 and "accepted summary.csv (4 configurations)" in accepted.stdout
    assert read_summary(tmp_path / "reference" / "quick-summary.csv") == read_summary(tmp_path / "summary.csv")
    assert gate(tmp_path, good(), check).returncode == 0
    malformed = tmp_path / "summary.csv"
    malformed.write_text("study,method\ndfp,dfp\n")
    cmd = [sys.executable, str(REPO / "stages" / "check.py"), "--params", "params.yaml", "--summary", "summary.csv"]
    result = subprocess.run([*cmd, "--no-mlflow"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2 and "is not a summary written by the aggregate stage" in result.stderr


def test_unusable_summary_out_and_reference_paths_are_clear_errors(tmp_path):
    """A binary summary, an --out below a file, and a missing reference named by where its path came from."""
    (tmp_path / "binary.csv").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    binary = gate(tmp_path, good(), THRESHOLDS, "--summary", "binary.csv", in_process=True)
    assert binary.returncode == 2 and "binary.csv cannot be read as a text file" in binary.stderr
    (tmp_path / "file").write_text("")
    below = gate(tmp_path, good(), THRESHOLDS, "--out", "file/check.json", in_process=True)
    assert below.returncode == 2 and "cannot write file/check.json" in below.stderr
    missing = gate(
        tmp_path, good(), THRESHOLDS | {"reference": "accepted.csv"}, "--reference", "other.csv", in_process=True
    )
    assert missing.returncode == 2 and "other.csv (--reference) does not exist" in missing.stderr
    assert "check.reference" not in missing.stderr
    for result in (binary, below, missing):
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [(None, "not found"), ("- a\n", "must hold a mapping"), ("a: [\n", "is not valid YAML"), ("\xff", "not valid")],
)
def test_the_quick_command_names_a_bad_overlay_file(tmp_path, text, message):
    """`python -m cheaptrain.quick` (tests/test_config.py tests its overlay) exits 2 with one line, no traceback."""
    overlay = tmp_path / "overlay.yaml"
    if text is not None:
        overlay.write_bytes(text.encode("latin-1"))
    cmd = [sys.executable, "-m", "cheaptrain.quick", str(overlay), "--dry-run"]
    env = os.environ | {"PYTHONPATH": str(REPO / "src")}
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert result.returncode == 2 and f"overlay file {overlay}" in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr


def test_the_quick_command_passes_what_follows_its_double_dash_to_dvc_and_its_own_flags_anywhere(
    tmp_path, monkeypatch, capsys
):
    from cheaptrain import quick

    monkeypatch.chdir(tmp_path)
    for var in ("CIFAR10_SOURCE", "CIFAR100_SOURCE"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "overlay.yaml").write_text("train:\n  epochs: 2\n")
    for argv in (["overlay.yaml", "--dry-run", "--", "--temp"], ["--dry-run", "overlay.yaml", "--", "--temp"]):
        quick.main(argv)
        assert capsys.readouterr().out == "dvc exp run -S train.epochs=2 --temp\n", argv
    monkeypatch.setenv("PATH", str(tmp_path))  # no dvc there
    (tmp_path / "params.yaml").write_text("train: {}\n")
    with pytest.raises(UserError, match=r"dvc is not on PATH: run in the project's environment"):
        quick.main(["overlay.yaml"])
    assert (tmp_path / "params.yaml").read_text() == "train: {}\n"


def test_the_quick_command_stopped_by_sigterm_puts_params_yaml_back(tmp_path):
    """A closed terminal or a CI timeout (SIGHUP, SIGTERM) while `dvc exp run -S` holds the quick params in
    params.yaml: the checkout is left as it was, not on the quick setting for the next `dvc repro`."""
    (tmp_path / "bin").mkdir()
    dvc = tmp_path / "bin" / "dvc"  # writes the overlay into params.yaml, as `dvc exp run -S` does, then trains
    dvc.write_text("#!/bin/sh\necho 'train: {epochs: 2}' > params.yaml\ntouch started\nexec sleep 60\n")
    dvc.chmod(0o755)
    (tmp_path / "overlay.yaml").write_text("train:\n  epochs: 2\n")
    (tmp_path / "params.yaml").write_text("train: {epochs: 200}\n")
    env = os.environ | {"PYTHONPATH": str(REPO / "src"), "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    env.pop("CIFAR10_SOURCE", None)
    process = subprocess.Popen([sys.executable, "-m", "cheaptrain.quick", "overlay.yaml"], cwd=tmp_path, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60  # a guard against a hang, not a timing
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "params.yaml").read_text() == "train: {epochs: 2}\n"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert (tmp_path / "params.yaml").read_text() == "train: {epochs: 200}\n"


def test_the_quick_command_puts_a_source_named_in_the_environment_into_the_experiments_params(
    tmp_path, monkeypatch, capsys
):
    """CIFAR10_SOURCE alone is invisible to DVC, which would keep data prepared from another source: it becomes the
    experiment's download.cifar10.source, without the overlay's sha256 unless it names the overlay's own archive."""
    from cheaptrain import quick

    monkeypatch.chdir(tmp_path)
    for var in ("DVC_ROOT", "CIFAR100_SOURCE"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "overlay.yaml").write_text("download:\n  cifar10:\n    source: data/a.tar.gz\n    sha256: abc\n")
    (tmp_path / "params.yaml").write_text("download:\n  cifar100:\n    source: torchvision\n")

    def command(**env: str) -> str:
        for var, value in env.items():
            monkeypatch.setenv(var, value)
        quick.main(["overlay.yaml", "--dry-run"])
        return capsys.readouterr().out

    assert command(CIFAR10_SOURCE="data/b.tar.gz") == (
        f"dvc exp run -S 'download.cifar10.source=\"{tmp_path}/data/b.tar.gz\"' -S download.cifar10.sha256=null\n"
    )
    assert command(CIFAR10_SOURCE=str(tmp_path / "data/a.tar.gz")) == (  # the overlay's own: its sha256 checks it
        f"dvc exp run -S 'download.cifar10.source=\"{tmp_path}/data/a.tar.gz\"' -S 'download.cifar10.sha256=\"abc\"'\n"
    )
    monkeypatch.delenv("CIFAR10_SOURCE")
    assert command(CIFAR100_SOURCE="torchvision") == (  # params.yaml's own source, which has no sha256 to drop
        "dvc exp run -S 'download.cifar10.source=\"data/a.tar.gz\"' -S 'download.cifar10.sha256=\"abc\"' "
        "-S 'download.cifar100.source=\"torchvision\"'\n"
    )


@pytest.mark.e2e
def test_quick_pipeline_fails_when_the_gate_does(quick):
    params_file = quick / "params.yaml"
    original = params_file.read_text()
    try:
        params = yaml.safe_load(original)
        params["check"]["min_acc"]["baseline"] = 99.0  # no 10-epoch LeNet gets there
        params_file.write_text(yaml.safe_dump(params, sort_keys=False))
        result = run_in(quick, "dvc", "repro", check=False)
        assert result.returncode != 0
        assert "Running stage 'check'" in result.stdout and "FAILED: " in result.stdout
        assert "dfp cifar10/lenet/baseline" in result.stdout and ">= 99.00 %" in result.stdout
    finally:
        params_file.write_text(original)
        run_in(quick, "dvc", "repro")  # the gate passes again: leave the repository as the other tests expect it
    assert "up to date" in run_in(quick, "dvc", "status").stdout


def test_a_figure_on_its_threshold_passes():
    """Thresholds are inclusive: a drop of exactly max_acc_drop, a saving of exactly min_time_saving pass."""
    rows = [
        row("dfp", "baseline", 55.0),
        row("dfp", "dfp", 54.0, acc_delta=-1.0, time_saving_pct=5.0),
        row("wus", "baseline", 61.0),
        row("wus", "wus", 59.0, acc_delta=-2.0, time_saving_pct=20.0, updated_params_reduction_pct=50.0),
    ]
    checks = [c for c in evaluate(rows, load_gate({"check": THRESHOLDS})) if c.status != "skip"]
    assert len(checks) == 7 and {c.status for c in checks} == {"pass"}, checks
    nudged = [rows[0], rows[1] | {"acc_delta_mean": -1.01}, *rows[2:]]
    failed = [c for c in evaluate(nudged, load_gate({"check": THRESHOLDS})) if c.status == "FAIL"]
    assert [c.value for c in failed] == ["1.01 pts"]


def test_a_grid_run_that_ended_at_chance_fails_the_gate_whatever_the_thresholds(tmp_path):
    """The summary leaves such a run out of every figure, so no threshold sees it: the gate names it itself, also
    where every run of its configuration collapsed (a row with no accuracy); the ledger's are not gated."""
    collapsed = {**row("wus", "baseline", 61.0), "seeds": 2, "collapsed_seeds": "2"}
    every = {k: v for k, v in row("dfp", "baseline", 0.0).items() if k != "acc_mean"} | {
        "seeds": 0, "collapsed_seeds": "0 1 2"}  # fmt: skip
    rows = [every, good()[1], collapsed, good()[3]]
    result = gate(tmp_path, rows, THRESHOLDS)
    assert result.returncode == 1, result.stdout + result.stderr
    failed = [line for line in squash(result.stdout).splitlines() if line.startswith("FAIL ")]
    assert [f for f in failed if "final accuracy at chance" in f] == [
        "FAIL dfp cifar10/lenet/baseline final accuracy at chance: the network stopped learning (left out of the "
        "summary's figures) seeds 0 1 2 > chance + 1 pts",
        "FAIL wus cifar10/lenet/baseline final accuracy at chance: the network stopped learning (left out of the "
        "summary's figures) seeds 2 > chance + 1 pts",
    ]
    no_figure = "dfp cifar10/lenet/baseline accuracy: its seeds 0, 1, 2 all ended at chance"  # min_acc
    assert any(no_figure in f for f in failed)
    ledger = [r | {"source": "ledger"} for r in rows]
    assert all(c.status != "FAIL" for c in evaluate(ledger, load_gate({"check": THRESHOLDS})))
