"""benchmarks/gpu_check.py, checked on the CPU in its --quick mode: every section runs and writes its table."""

import dataclasses
import importlib.util
import re
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
import torch

from cheaptrain.methods import METHODS, create_method
from cheaptrain.trainer import fit

from conftest import REPO, read_csv, run_script

SCRIPT = REPO / "benchmarks" / "gpu_check.py"


def load_gpu_check():
    """The script as a module, to call its sections with parts of it replaced."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    return gpu_check


@pytest.fixture(scope="module")
def quick_check(tmp_path_factory):
    """The script's --quick mode, once for the module: its output folder and what it printed."""
    out = tmp_path_factory.mktemp("gpu_check")
    command = [sys.executable, str(SCRIPT), str(out), "--device", "cpu", "--quick", "--threads", "1"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return out, done.stdout


def test_quick_mode_measures_eager_and_compiled_fp32_and_bf16(quick_check):
    out, _ = quick_check
    rows = read_csv(out / "throughput.csv")
    assert [(r["model"], r["compile"], r["amp"]) for r in rows] == [
        ("lenet", "False", "fp32"), ("lenet", "False", "bf16"), ("lenet", "True", "fp32"), ("lenet", "True", "bf16"),
    ]  # fmt: skip
    assert all(float(r["images_per_s"]) > 0 and r["batch"] == "32" for r in rows)
    assert [r["graphs_skipped"] for r in rows] == ["0"] * 4  # none of these asks for CUDA graphs


def test_quick_mode_trains_every_method_eager_and_compiled(quick_check):
    out, _ = quick_check
    rows = read_csv(out / "methods.csv")
    assert {(r["method"], r["compile"], r["epoch"]) for r in rows} == {
        (m, c, e) for m in METHODS for c in ("False", "True") for e in ("1", "2")
    }
    dfp = {(r["compile"], r["epoch"]): r for r in rows if r["method"] == "dfp"}
    for compile in ("False", "True"):  # 80 samples; epoch 1 prunes 30%
        assert (dfp[compile, "1"]["samples"], dfp[compile, "1"]["pruned"]) == ("56", "24")
        assert (dfp[compile, "2"]["samples"], dfp[compile, "2"]["pruned"]) == ("80", "0")
    infobatch = {(r["compile"], r["epoch"]): r for r in rows if r["method"] == "infobatch"}
    for compile in ("False", "True"):  # epoch 1 has no candidate; epoch 2 leaves out half of those below the mean
        assert (infobatch[compile, "1"]["samples"], infobatch[compile, "1"]["pruned"]) == ("80", "0")
        assert int(infobatch[compile, "2"]["pruned"]) > 0
        assert int(infobatch[compile, "2"]["samples"]) + int(infobatch[compile, "2"]["pruned"]) == 80
    assert {(r["batch"], r["device"]) for r in rows} == {("32", "cpu")}  # as the throughput table says them
    compiled = [r for r in rows if r["compile"] == "True"]
    assert int(compiled[0]["graphs"]) >= 1  # the first compiled run compiles; all compiled runs share the model
    assert all(int(r["graphs"]) <= 8 for r in compiled)


def test_quick_mode_measures_concurrent_processes_and_names_the_n_that_pays(quick_check):
    out, printed = quick_check
    rows = read_csv(out / "concurrency.csv")
    assert [(r["model"], r["processes"]) for r in rows] == [("lenet", "1"), ("lenet", "2")]
    assert all(float(r["images_per_s"]) > 0 for r in rows) and rows[0]["vs_one_process"] == "1.0"
    assert [(r["batch"], r["threads"], r["device"]) for r in rows] == [("32", "1", "cpu")] * 2  # --threads 1
    pays = [r["processes"] for r in rows if r["pays"] == "True"]
    assert len(pays) == 1 and f"lenet: N = {pays[0]} pays" in printed
    assert "cuda tests: skipped" in printed
    assert (out / "gpu_check.txt").read_text().strip() == printed.strip()


def test_sections_run_alone_so_that_a_time_limited_machine_can_split_the_check(tmp_path):
    # in this process (the module's fixture runs the script as a user does): no interpreter to start, no torch to import
    command = [str(tmp_path), "--device", "cpu", "--quick", "--threads", "1"]
    done = run_script(SCRIPT, *command, "--sections", "tests")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["gpu_check.txt"] and "cuda tests: skipped" in done.stdout
    other_sections = ("training images/s", "every method", "N training processes", "one eager", "variants")  # starts
    assert not [line for line in done.stdout.splitlines() if line.startswith(other_sections)], done.stdout
    wrong = run_script(SCRIPT, *command, "--sections", "speed")
    assert wrong.returncode == 2 and "invalid choice: 'speed'" in wrong.stderr


def test_profile_tuning_and_skip_run_on_request_and_say_where_a_steps_time_goes(quick_check, tmp_path):
    assert not {"profile.csv", "tuning.csv", "skip.csv"} & {p.name for p in quick_check[0].iterdir()}  # not by default
    # in this process, after the module's fixture ran the script as a user does: no interpreter to start and torch
    # to import again, and inductor compiles its first graph sooner where this process compiled one before
    command = [str(tmp_path), "--device", "cpu", "--quick", "--threads", "1"]
    done = run_script(SCRIPT, *command, "--sections", "profile", "tuning", "skip")
    assert done.returncode == 0, done.stdout + done.stderr
    [row] = read_csv(tmp_path / "profile.csv")
    assert (row["model"], row["compile"], row["batch"]) == ("lenet", "False", "32") and float(row["images_per_s"]) > 0
    assert row["device_busy_share"] == row["kernels_per_batch"] == ""  # a CPU launches no kernels
    profiled = (tmp_path / "profile.txt").read_text()
    assert profiled.startswith("== lenet, by self_cpu_time_total") and "by self_device_time_total" not in profiled
    assert "Optimizer.step#SGD.step" in profiled and "aten::convolution_backward" in profiled  # a training step
    rows = read_csv(tmp_path / "tuning.csv")
    assert [(r["variant"], r["batch"]) for r in rows] == [
        ("as the runs", "32"), ("fused SGD", "32"), ("CUDA graphs", "32"), ("CUDA graphs, fused SGD", "32"),
        ("graphs, fused, benchmark", "32"), ("batch x4", "128"),
    ]  # fmt: skip
    assert rows[0]["vs_runs"] == "1.0" and all(float(r["images_per_s"]) > 0 for r in rows)
    graphs = {r["variant"]: int(r["graphs_skipped"]) for r in rows}  # a CPU runs no graph as a CUDA graph
    assert all((count > 0) == name.startswith(("CUDA graphs", "graphs")) for name, count in graphs.items()), graphs
    assert "graph without CUDA graphs: a CPU has no CUDA graphs)" in done.stdout
    assert "max-autotune             skipped: CUDA only" in done.stdout
    assert "cudnn.benchmark          skipped: CUDA only" in done.stdout
    normal, skip = read_csv(tmp_path / "skip.csv")
    assert [(r["phase"], r["setting"]) for r in (normal, skip)] == [("normal", "eager"), ("skip", "eager")]
    assert normal["vs_normal"] == "1.0" and float(skip["images_per_s"]) > 0 and float(skip["vs_normal"]) > 0
    normal_ops, skip_ops = (tmp_path / "skip.txt").read_text().split("== lenet skip, by self_cpu_time_total")
    assert normal_ops.startswith("== lenet normal, by self_cpu_time_total")
    assert "aten::convolution_backward" in normal_ops and "aten::convolution_backward" not in skip_ops  # frozen
    assert "Optimizer.step#SGD.step" in skip_ops  # the last layer's bias still trains


def test_graph_skips_counts_inductors_skipped_cuda_graphs_and_keeps_the_reasons_it_logs():
    """What inductor does on CUDA for a graph it cannot record (e.g. one that mutates an input), called directly."""
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    gpu_check = load_gpu_check()
    with gpu_check.GraphSkips() as skips:
        log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to mutated inputs (2 instances)")
        log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to cpu device")
    log_cudagraph_skip_and_bump_counter("skipping cudagraphs after the measurement")
    assert skips.count == 2
    assert skips.reasons == ["skipping cudagraphs due to mutated inputs (2 instances)",
                             "skipping cudagraphs due to cpu device"]  # fmt: skip
    rate = gpu_check.Rate(100.0, 1.0, skips.count, tuple(skips.reasons))
    assert gpu_check.skipped(rate, torch.device("cuda")) == (
        "  (2 graphs without CUDA graphs: skipping cudagraphs due to mutated inputs (2 instances); skipping "
        "cudagraphs due to cpu device)"
    )
    assert gpu_check.skipped(gpu_check.Rate(100.0, 1.0, 0, ()), torch.device("cuda")) == ""


def test_a_tuning_variant_is_the_runs_setting_with_its_train_settings_changed():
    """A compile mode, cudnn.benchmark and fused SGD go into the run's setting, which the trainer takes."""
    gpu_check = load_gpu_check()
    cfg = gpu_check.config("lenet", "cpu", False, "off", 8)
    variant = gpu_check.Variant("all", compile="reduce-overhead", cudnn_benchmark=True, fused_sgd=True)
    changed = variant.config(cfg)
    assert (changed.compile, changed.cudnn_benchmark, changed.fused_sgd) == ("reduce-overhead", True, True)
    assert dataclasses.replace(changed, compile=False, cudnn_benchmark=False, fused_sgd=False) == cfg
    assert gpu_check.Variant("as the runs").config(cfg) == cfg


def cuda_test_file(folder: Path, body: str) -> Path:
    """A test module of `cuda` tests with its own pytest.ini, the marker registered."""
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    cuda: needs a CUDA device\n")
    tests = folder / "test_fake_gpu.py"
    tests.write_text("import pytest\n\n" + textwrap.dedent(body))
    return tests


@pytest.fixture
def plain_pytest(monkeypatch):
    """cuda_tests' child pytest without the venv's plugins, which it would import for nothing (hydra's alone: seconds
    of CPU): it reaches its first test within about a second of CPU."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.mark.usefixtures("plain_pytest")
def test_each_cuda_tests_result_is_in_the_log_as_it_ends_so_a_check_stopped_midway_keeps_it(tmp_path):
    """The second test passes only if the first one's result was already in the log while the tests ran."""
    out, folder = tmp_path / "out", tmp_path / "tests"
    out.mkdir(), folder.mkdir()
    gpu_check = load_gpu_check()
    tests = cuda_test_file(
        folder,
        f"""
        @pytest.mark.cuda
        def test_first():
            pass

        @pytest.mark.cuda
        def test_second_sees_the_first_in_the_log():
            assert "test_first PASSED" in open({str(out / "cuda_tests.log")!r}).read()

        def test_not_a_cuda_test():
            raise AssertionError("deselected by -m cuda")
        """,
    )
    report = gpu_check.Report(out)
    assert gpu_check.cuda_tests(report, torch.device("cuda"), tests=str(tests)) is True
    assert "2 passed, 1 deselected" in (out / "gpu_check.txt").read_text()
    assert gpu_check.cuda_tests(report, torch.device("cuda"), "second", tests=str(tests)) is False  # first not run
    assert "1 failed, 2 deselected" in (out / "gpu_check.txt").read_text().splitlines()[-1]


@pytest.mark.usefixtures("plain_pytest")
def test_cuda_tests_that_hang_fail_the_check_and_keep_what_they_printed(tmp_path, monkeypatch):
    out, folder = tmp_path / "out", tmp_path / "tests"
    out.mkdir(), folder.mkdir()
    gpu_check = load_gpu_check()
    tests = cuda_test_file(
        folder,
        """
        import threading

        @pytest.mark.cuda
        def test_quick():
            pass

        @pytest.mark.cuda
        def test_stuck():
            threading.Event().wait()  # forever
        """,
    )
    timeouts = []

    def run_until_stuck(command, stdout, timeout, **kwargs):
        """The real child pytest, timed out once the quick test has passed and the stuck one is running: the
        order of events a timeout meets, without a wall-clock race."""
        timeouts.append(timeout)
        child = subprocess.Popen(command, stdout=stdout, **kwargs)
        guard = time.monotonic() + 300  # against a hang, not a timing
        while "test_stuck" not in Path(stdout.name).read_text().partition("test_quick PASSED")[2]:
            assert child.poll() is None and time.monotonic() < guard, Path(stdout.name).read_text()
            time.sleep(0.1)
        child.kill()
        child.wait()
        raise subprocess.TimeoutExpired(command, timeout)

    fake = types.SimpleNamespace(**(vars(subprocess) | {"run": run_until_stuck}))  # subprocess.run patched here alone
    monkeypatch.setattr(gpu_check, "subprocess", fake)
    report = gpu_check.Report(out)
    assert gpu_check.cuda_tests(report, torch.device("cuda"), tests=str(tests)) is False
    assert timeouts == [gpu_check.TESTS_TIMEOUT_S]
    assert "test_quick PASSED" in (out / "cuda_tests.log").read_text()
    expected = f"cuda tests: FAILED: still running after {gpu_check.TESTS_TIMEOUT_S} s"
    assert expected in (out / "gpu_check.txt").read_text()


def test_a_failing_setting_or_method_is_reported_and_the_check_goes_on(tmp_path, monkeypatch):
    gpu_check = load_gpu_check()
    measure = gpu_check.steady_rate

    def compile_breaks(cfg, sizes):  # as a compiler error on a new device would
        if cfg.compile:
            raise RuntimeError("inductor: no kernel for this device\nmore detail")
        return measure(cfg, sizes)

    def dfp_breaks(name, knobs):
        if name == "dfp":
            raise ValueError("dfp: a broken method")
        return create_method(name, knobs)

    def compiled_fit_breaks(cfg, *args):
        if cfg.compile:
            raise RuntimeError("inductor: no kernel for this device")
        return fit(cfg, *args)

    monkeypatch.setattr(gpu_check, "steady_rate", compile_breaks)
    monkeypatch.setattr(gpu_check, "METHODS", {"dfp": None, "baseline": None})
    monkeypatch.setattr(gpu_check, "create_method", dfp_breaks)
    monkeypatch.setattr(gpu_check, "fit", compiled_fit_breaks)
    report = gpu_check.Report(tmp_path)
    gpu_check.throughput(report, torch.device("cpu"), ["lenet"], gpu_check.QUICK)
    rows = read_csv(tmp_path / "throughput.csv")
    assert [(r["compile"], r["amp"], bool(r["images_per_s"]), bool(r["error"])) for r in rows] == [
        ("False", "fp32", True, False), ("False", "bf16", True, False),
        ("True", "fp32", False, True), ("True", "bf16", False, True),
    ]  # fmt: skip
    assert rows[2]["error"].startswith("FAILED: RuntimeError: inductor: no kernel for this device (-> ")
    gpu_check.methods(report, torch.device("cpu"), gpu_check.QUICK)
    rows = read_csv(tmp_path / "methods.csv")
    assert [(r["method"], r["compile"], r["epoch"], bool(r["error"])) for r in rows] == [
        ("dfp", "False", "", True), ("baseline", "False", "1", False), ("baseline", "False", "2", False),
        ("dfp", "True", "", True), ("baseline", "True", "", True),
    ]  # fmt: skip
    assert report.failures == 5
    assert {r["device"] for r in rows} == {"cpu"}  # failed rows too
    errors = (tmp_path / "errors.log").read_text()
    assert errors.count("Traceback") == 5 and "== methods: dfp compiled" in errors and "more detail" in errors
    printed = (tmp_path / "gpu_check.txt").read_text()
    assert "lenet      compiled bf16    FAILED: RuntimeError: inductor" in printed


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_asking_for_cuda_without_it_is_a_one_line_error(tmp_path):
    done = run_script(SCRIPT, str(tmp_path))  # in this process: argparse's error, no torch to import again
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("CUDA is not available here (--device cpu --quick checks the script)")
    )
    assert "Traceback" not in done.stderr


def test_commands_into_one_folder_append_to_the_log_and_the_errors_each_under_its_header(tmp_path, monkeypatch):
    """docs/gpu.md runs the sections as separate commands into one OUT: the second keeps what the first wrote."""
    gpu_check = load_gpu_check()
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", str(tmp_path), "--sections", "throughput"])
    first = gpu_check.Report(tmp_path)
    first.say("throughput line")
    first.failed("throughput: lenet compiled fp32", RuntimeError("inductor: no kernel"))
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", str(tmp_path), "--sections", "methods"])
    second = gpu_check.Report(tmp_path)
    second.say("methods line")
    second.failed("methods: dfp eager", ValueError("a broken method"))
    header = r"== \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\S* gpu_check.py \S+ --sections "
    log = (tmp_path / "gpu_check.txt").read_text().splitlines()
    assert len(log) == 4 and log[1::2] == ["throughput line", "methods line"]
    assert re.fullmatch(header + "throughput", log[0]) and re.fullmatch(header + "methods", log[2])
    errors = (tmp_path / "errors.log").read_text()
    assert [line for line in errors.splitlines() if line.startswith("== ")] == [
        log[0],
        "== throughput: lenet compiled fp32",
        log[2],
        "== methods: dfp eager",
    ]
