"""The mutation check: do the tests pin the rules of the code? Each mutant of tests/mutants.yaml breaks one rule (a
comparison, an order, a formula) in a copy of this checkout, and the tests it names run against that copy (`-m "not
e2e"`): a mutant is killed when they fail, and one that survives names a rule no test pins. First those tests run
unmutated, and must pass. All of it takes about 35-45 minutes on 2 CPU cores, so it is not part of `make test`; run it
after changing a method or the report, and add a mutant for each rule a change brings.

    python tests/mutants.py                 # every mutant
    python tests/mutants.py dfp wus         # those whose name contains any of these words

It exits 1 if a mutant survived, or if one is stale (its `old` text no longer occurs exactly once in its file).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
LIST = Path(__file__).with_name("mutants.yaml")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout


def copy_checkout(to: Path) -> Path:
    """A clone of the checkout (some tests need a git repository) with its files as they are now: edits and new
    files not yet committed included, deleted ones gone; beside it a link to ../shared."""
    root = to / "main"
    git("clone", "--quiet", str(REPO), str(root))
    for name in filter(None, git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")):
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
        else:
            (root / name).unlink(missing_ok=True)
    if (REPO.parent / "shared").is_dir():
        (to / "shared").symlink_to(REPO.parent / "shared")
    return root


def pytest(root: Path, tests: list[str]) -> subprocess.CompletedProcess:
    """The tests, not the end-to-end ones, on the copy's code, stopping at the first failure; in a session of their
    own, outside any queue of `make test` (tests/conftest.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHEAPTRAIN_TEST_")}
    env |= {"PYTHONPATH": str(root / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not e2e", *tests]
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)


def last_line(done: subprocess.CompletedProcess) -> str:
    return (done.stdout.strip().splitlines() or ["(no output)"])[-1]


def run(mutant: dict, root: Path) -> tuple[str, str]:
    """('killed' | 'survived' | 'stale' | 'error', pytest's last line) for one mutant, its file restored after."""
    path = root / mutant["file"]
    text = path.read_text() if path.is_file() else ""
    if text.count(mutant["old"]) != 1:
        return "stale", f"`old` occurs {text.count(mutant['old'])} times in {mutant['file']}"
    path.write_text(text.replace(mutant["old"], mutant["new"]))
    try:
        done = pytest(root, mutant["tests"])
    finally:
        path.write_text(text)
    return {0: "survived", 1: "killed"}.get(done.returncode, "error"), last_line(done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("words", nargs="*", help="run the mutants whose name contains any of these (default: all)")
    parser.add_argument("--list", type=Path, default=LIST, help="the mutants (default: %(default)s)")
    args = parser.parse_args()
    try:
        listed = yaml.safe_load(args.list.read_text()) or []
    except (OSError, yaml.YAMLError) as e:
        sys.exit(f"error: {args.list}: {' '.join(str(e).split())}")
    keys = {"name", "file", "old", "new", "tests"}
    if not isinstance(listed, list) or any(not isinstance(m, dict) or m.keys() != keys for m in listed):
        sys.exit(f"error: {args.list}: a list of mutants, each with exactly the keys {', '.join(sorted(keys))}")
    mutants = [m for m in listed if not args.words or any(w in m["name"] for w in args.words)]
    if not mutants:
        sys.exit(f"error: no mutant in {args.list}" + (f" whose name contains any of {args.words}" * bool(args.words)))
    outcomes: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        root = copy_checkout(Path(tmp))
        tests = sorted({t for m in mutants for t in m["tests"]})
        print(f"the tests of these mutants, unmutated: {' '.join(tests)}", flush=True)
        if (done := pytest(root, tests)).returncode != 0:  # else every mutant would look killed
            sys.exit(f"error: they fail without a mutant ({last_line(done)}):\n{done.stdout[-3000:]}")
        print(f"  {last_line(done)}", flush=True)
        for i, mutant in enumerate(mutants, 1):
            start = time.perf_counter()
            outcome, last = run(mutant, root)
            outcomes.setdefault(outcome, []).append(mutant["name"])
            print(f"[{i}/{len(mutants)}] {outcome:8} {mutant['name']} ({time.perf_counter() - start:.0f} s: {last})",
                  flush=True)  # fmt: skip
    print(f"\n{len(outcomes.get('killed', []))} of {len(mutants)} mutants killed")
    for outcome in ("survived", "stale", "error"):
        for name in outcomes.get(outcome, []):
            print(f"  {outcome}: {name}")
    if set(outcomes) - {"killed"}:
        sys.exit(1)


if __name__ == "__main__":
    main()
