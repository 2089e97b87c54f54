"""The package as a whole: its modules import without a cycle, each DVC stage depends on exactly the code it
imports, the entry points end as a command line should, the root's small helpers behave, and the environment is
installed as the lock (constraints.txt) pins it."""

import argparse
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.utils import canonicalize_name

from cheaptrain import UserError, atomic_write, positive_int
from cheaptrain.cli import CUT_SHORT
from cheaptrain.lock import LOCK, differences, installed, read_lock
from cheaptrain.lock import main as lock_main
from cheaptrain.runner import code_version, imported_files

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "cheaptrain"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The cheaptrain modules a file imports anywhere in it (deferred imports too), by module name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n for n in names if n.split(".")[0] == "cheaptrain"}
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    return {n for n in found if n in modules}


def test_the_modules_import_each_other_without_a_cycle():
    graph = {module_name(p): imports_of(p) - {module_name(p)} for p in PACKAGE.rglob("*.py")}
    # a package's __init__ may import its own submodules (methods registers each); any other cycle is a bug
    graph = {m: {d for d in deps if not d.startswith(f"{m}.")} for m, deps in graph.items()}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            pytest.fail(f"import cycle: {' -> '.join([*path[path.index(module) :], module])}")
        if module in done:
            return
        for dep in sorted(graph.get(module, ())):
            visit(dep, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


# One interpreter imports the heavy third-party packages once, then forks a child per module: each child starts with
# no cheaptrain module loaded, as a fresh interpreter does, at a fraction of the CPU (torch's import is seconds).
IMPORT_EACH_ALONE = """
import importlib, os, sys, traceback
import numpy, torch, yaml
for module in sys.argv[1:]:
    if os.fork() == 0:
        try:
            importlib.import_module(module)
        except BaseException:
            print(f"{module}:", traceback.format_exc(), file=sys.stderr)
            os._exit(1)
        os._exit(0)
    _, status = os.wait()
    print(module, os.waitstatus_to_exitcode(status), flush=True)
"""


def test_every_module_imports_on_its_own_in_a_fresh_interpreter():
    modules = sorted(module_name(p) for p in PACKAGE.rglob("*.py"))
    done = subprocess.run([sys.executable, "-c", IMPORT_EACH_ALONE, *modules], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    exits = dict(line.split() for line in done.stdout.splitlines())
    assert exits == dict.fromkeys(modules, "0"), done.stderr[-4000:]  # one that only imports after another fails


def stage_code(script: Path) -> set[str]:
    """The package files a stage script reads: its imports, closed over the package."""
    files: set[Path] = set()
    for module in imports_of(script):
        files |= set(imported_files(module))
    return {p.relative_to(REPO).as_posix() for p in files}


@pytest.mark.parametrize("stage", ["download", "train_dfp", "train_wus", "aggregate", "check"])
def test_each_stage_depends_on_exactly_the_code_it_imports(stage):
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][stage]
    script = REPO / spec["cmd"].split()[1]
    deps = set()
    for dep in spec["deps"]:
        path = REPO / dep
        if dep.startswith("src/cheaptrain"):
            deps |= {p.relative_to(REPO).as_posix() for p in path.rglob("*.py")} if path.is_dir() else {dep}
    assert deps == stage_code(script)
    assert script.relative_to(REPO).as_posix() in spec["deps"]


def test_the_code_version_of_a_method_is_the_trainers_code_and_its_own_module():
    assert code_version("dfp") == code_version("random_prune")  # one module, one class the other's base
    assert code_version("wus") != code_version("dfp") != code_version("baseline")
    trainer_code = {p.name for p in imported_files("cheaptrain.trainer")}
    assert {"trainer.py", "models.py", "data.py", "config.py", "cost.py"} <= trainer_code
    assert not {"tracking.py", "runner.py", "ledger.py"} & trainer_code
    assert not any(p.parent.name == "report" for p in imported_files("cheaptrain.trainer"))


def test_positive_int_accepts_counts_and_rejects_the_rest_as_a_usage_error():
    assert positive_int("1") == 1 and positive_int("12") == 12
    for text in ("0", "-3", "x", "1.5", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="an integer >= 1"):
            positive_int(text)


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_atomic_write_gives_a_new_file_the_umasks_permissions_and_keeps_a_replaced_files(tmp_path, umask):
    previous = os.umask(umask)
    try:
        atomic_write(tmp_path / "new" / "report.md", "# results\n")
    finally:
        os.umask(previous)
    new = tmp_path / "new" / "report.md"
    assert new.read_text() == "# results\n" and new.stat().st_mode & 0o777 == 0o666 & ~umask
    new.chmod(0o640)
    atomic_write(new, b"# results, again\n")
    assert new.read_bytes() == b"# results, again\n" and new.stat().st_mode & 0o777 == 0o640


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.json"
    atomic_write(path, "{}\n")
    seen = []

    def disk_full(fd: int) -> None:  # the new bytes are written, not yet on disk
        seen.extend(sorted(p.name for p in tmp_path.iterdir()))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(path, '{"new": 1}\n')
    assert len(seen) == 2 and seen[0].startswith(".metrics.json.") and seen[0].endswith(".tmp")  # it was there
    assert path.read_text() == "{}\n" and [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def run_into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """`python *args` in the repo, its standard output a pipe whose reader has already gone (`... | head` once head
    has its lines): its first write breaks, however little it prints. Buffered, as in a shell without
    PYTHONUNBUFFERED: a short output breaks at the flush after main() returns, a long one at a print."""
    reader, writer = os.pipe()
    os.close(reader)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    try:
        return subprocess.run(
            [sys.executable, *args], stdout=writer, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env
        )
    finally:
        os.close(writer)


# the start of a `python -c` snippet, run from the repo: an entry point with a main() of the snippet's own
ENTRY_POINT = """
import sys
sys.path.insert(0, "src")
from cheaptrain.cli import run_command
"""
PRINTS_A_LINE = f"""{ENTRY_POINT}
run_command(lambda: print("best-3 78.17%"))
"""


@pytest.mark.parametrize(
    "args, status",
    [
        (["-m", "cheaptrain.ledger", "list"], CUT_SHORT),  # the committed entries, a line each: more than a buffer
        (["-c", PRINTS_A_LINE], CUT_SHORT),  # a line that stays in the buffer until main() returns
        (["stages/aggregate.py", "--help"], 0),  # argparse's exit: its status stays
    ],
)
def test_output_cut_short_by_its_reader_ends_quietly_as_a_unix_tools_does(args, status):
    done = run_into_a_closed_pipe(*args)
    assert (done.returncode, done.stderr) == (status, "")


RAISES_A_BROKEN_PIPE = f"""{ENTRY_POINT}
def main():
    print("training")
    raise BrokenPipeError(32, "a child process's pipe")
run_command(main)
"""


def test_a_broken_pipe_that_is_not_standard_outputs_stays_an_error_with_its_traceback():
    done = subprocess.run([sys.executable, "-c", RAISES_A_BROKEN_PIPE], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 1 and done.stdout == "training\n"
    assert "Traceback" in done.stderr and "a child process's pipe" in done.stderr
    done = run_into_a_closed_pipe("-c", RAISES_A_BROKEN_PIPE)  # stdout's reader gone too: the cut is what shows
    assert (done.returncode, done.stderr) == (CUT_SHORT, "")


def test_every_entry_point_runs_its_main_through_run_command():
    scripts = [*REPO.glob("stages/*.py"), *REPO.glob("benchmarks/*.py"), *PACKAGE.glob("*.py")]
    direct = [p.relative_to(REPO).as_posix() for p in scripts if "run_main(main)" in p.read_text()]
    assert direct == ["src/cheaptrain/cli.py"]


def test_this_environment_is_installed_as_the_lock_pins_it():
    here = installed()
    names = {canonicalize_name(name) for name in here}
    assert {"torch", "mlflow", "dvc", "pytest", "ruff", "packaging"} <= names  # the dev extra and deeper requirements
    assert not {"cheaptrain", "pip"} & names
    assert differences(read_lock(LOCK), here) == []


def test_the_lock_is_read_by_canonical_names_and_names_what_it_does_not_pin_or_pins_otherwise(tmp_path):
    lock = tmp_path / "constraints.txt"
    lock.write_text("# pins\nPyYAML==6.0.4\nzc-lockfile==4.0  # a comment\n\ntorch==2.14.0\n")
    pins = read_lock(lock)
    assert pins == {"pyyaml": "6.0.4", "zc-lockfile": "4.0", "torch": "2.14.0"}
    here = {"torch": "2.14.1", "zc.lockfile": "4.0", "PyYAML": "6.0.4", "tqdm": "4.70.1"}
    assert differences(pins, here) == ["torch 2.14.1: the lock pins 2.14.0", "tqdm 4.70.1: not in the lock"]
    lock.write_text("torch>=2.6\n")
    with pytest.raises(UserError, match=r"constraints.txt:1: 'torch>=2.6' is not name==version"):
        read_lock(lock)


def test_lock_writes_the_environment_its_check_then_passes_and_the_check_fails_on_another_pin(tmp_path, capsys):
    lock = tmp_path / "constraints.txt"
    lock_main(["--lock", str(lock)])
    assert read_lock(lock) == {canonicalize_name(name): version for name, version in installed().items()}
    lock_main(["--lock", str(lock), "--check"])
    assert "packages installed as" in capsys.readouterr().out
    torch_version = installed()["torch"]
    lock.write_text(lock.read_text().replace(f"\ntorch=={torch_version}\n", "\ntorch==0.1\n"))
    with pytest.raises(SystemExit) as exit_:
        lock_main(["--lock", str(lock), "--check"])
    assert exit_.value.code == 1
    assert f"torch {torch_version}: the lock pins 0.1\n1 of " in capsys.readouterr().out
