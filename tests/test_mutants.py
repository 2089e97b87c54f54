"""The mutation check (tests/mutants.py): its list keeps up with the code, and it tells a killed mutant from one that
survives and from a stale one."""

import re
import subprocess
import sys

import yaml

from conftest import REPO

MUTANTS = yaml.safe_load((REPO / "tests" / "mutants.yaml").read_text())


def test_every_mutant_breaks_code_that_is_there_and_names_tests_that_are():
    """A mutant whose `old` text the code no longer holds exactly once is stale: it would check nothing."""
    assert len({m["name"] for m in MUTANTS}) == len(MUTANTS) > 50
    for mutant in MUTANTS:
        assert (REPO / mutant["file"]).read_text().count(mutant["old"]) == 1, mutant["name"]
        assert mutant["old"] != mutant["new"], mutant["name"]
        assert mutant["tests"] and all(names_a_test(t) for t in mutant["tests"]), mutant["name"]


def names_a_test(node: str) -> bool:
    """A test file, or one test of it (`file::name`, a function the file defines)."""
    path, _, name = node.partition("::")
    file = REPO / path
    return file.is_file() and (not name or f"\ndef {name}(" in file.read_text())


def test_a_killed_a_surviving_and_a_stale_mutant_are_told_apart(tmp_path):
    data = "src/cheaptrain/data.py"
    flip = next(m for m in MUTANTS if m["name"] == "data: flip ignored")
    listed = [
        flip,
        {"name": "a comment changed", "file": data, "old": "# [B, H, W, C] uint8", "new": "# B H W C",
         "tests": ["tests/test_data.py"]},
        {"name": "gone", "file": data, "old": "text the code never held", "new": "", "tests": ["tests/test_data.py"]},
    ]  # fmt: skip
    (tmp_path / "mutants.yaml").write_text(yaml.safe_dump(listed))
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "mutants.py"), "--list", str(tmp_path / "mutants.yaml")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "[1/3] killed   data: flip ignored" in done.stdout
    assert "[2/3] survived a comment changed" in done.stdout
    assert re.search(r"\[3/3\] stale    gone \(\d+ s: `old` occurs 0 times in src/cheaptrain/data\.py\)", done.stdout)
    assert "1 of 3 mutants killed" in done.stdout
    assert "  survived: a comment changed\n  stale: gone" in done.stdout
