"""The docs point at what exists: every relative link and its anchor, every file of the repository they name, every
`make` target and `python -m` module; a renamed heading, script or target breaks a test, not a reader's command. The
README's results table is the ledger's report: an entry that moves a figure breaks a test until the README says so."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "benchmarks").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
NAMED_FILE = re.compile(r"\b((?:src/cheaptrain|stages|benchmarks|tests)/[\w/.-]+\.(?:py|yaml|csv|md))\b")
MAKE_TARGET = re.compile(r"`make ([a-z][\w-]*)")
MODULE = re.compile(r"python3? -m (cheaptrain(?:\.\w+)+)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped but hyphens, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(doc: Path) -> list[str]:
    """The relative links of a markdown file whose file or heading anchor does not exist."""
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path) if path else doc
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md":
            headings = re.findall(r"^#+\s+(.*)$", linked.read_text(), re.MULTILINE)
            if anchor not in {slug(h) for h in headings}:
                broken.append(f"{target}: no such heading")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_reaches_a_file_and_its_heading(doc):
    assert broken_links(doc) == []


def test_a_link_to_a_missing_heading_or_file_is_caught_and_a_heading_with_punctuation_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Measured\n\n### DFP on AlexNet, this CPU: planned, seeds 0-7\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[a](other.md#dfp-on-alexnet-this-cpu-planned-seeds-0-7) [b](other.md#gone) [c](missing.md) "
        "[d](https://example.org/x#y) [e](#measured)\n# Measured\n"
    )
    assert broken_links(doc) == ["other.md#gone: no such heading", "missing.md: no such file"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_file_target_and_module_the_docs_name_exists(doc):
    text = doc.read_text()
    targets = set(re.findall(r"^([\w.-]+):", (REPO / "Makefile").read_text(), re.MULTILINE))
    missing = [p for p in sorted(set(NAMED_FILE.findall(text))) if not (REPO / p).exists()]
    missing += [f"make {t}" for t in sorted(set(MAKE_TARGET.findall(text))) if t not in targets]
    for module in sorted(set(MODULE.findall(text))):
        path = REPO / "src" / module.replace(".", "/")
        if not (path.with_suffix(".py").exists() or (path / "__main__.py").exists()):
            missing.append(f"python -m {module}")
    assert missing == []


# --- the README's results: the ledger's report, not a copy that drifts ------------------------------------------

README_METHODS = {"DFP": ("dfp", "dfp"), "WUS": ("wus", "wus"), "WUS+LR": ("wus", "wus_lr")}
README_ROW = re.compile(  # network | seeds, device | accuracy Δ: ours / paper ✓ | time saved: ours / paper ✓
    r"^\| (DFP|WUS\+LR|WUS), ([\w-]+) \| (\d+), ([^|]+?) \| ([^|]+?) / (\S+?)( ✓)? \| (\S+) / (\S+?)( ✓)? \|$"
)


@pytest.fixture(scope="module")
def ledger_report(tmp_path_factory, empty_store) -> str:
    """The report of the results ledger (`stages/aggregate.py --ledger-only`), written into a temporary folder."""
    folder = tmp_path_factory.mktemp("ledger-only")
    shutil.copy(empty_store, folder / "mlflow.db")
    env = os.environ | {"DVC_ROOT": str(REPO), "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}"}
    command = [sys.executable, str(REPO / "stages" / "aggregate.py"), "--ledger-only", "--out", str(folder / "out")]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return (folder / "out" / "report.md").read_text()


def test_the_readmes_results_are_the_ledgers_report(ledger_report):
    """Every figure of the README's results table, its seeds, device and ✓ (within tolerance), and the count of claims,
    as the report of the ledger has them; and every CIFAR-10 configuration whose accuracy claim has run has its row."""
    claims = {}
    for line in ledger_report.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 14 and cells[1] == "cifar10" and cells[4].startswith(("accuracy Δ", "time saved")):
            claims[cells[0], cells[2], cells[3], cells[4].split()[0]] = cells
    readme = (REPO / "README.md").read_text()
    rows = [m for line in readme.splitlines() if (m := README_ROW.match(line))]
    shown = set()
    for m in rows:
        study, method = README_METHODS[m[1]]
        model = m[2].lower().replace("-", "")
        shown.add((study, model, method))
        accuracy, time = claims[study, model, method, "accuracy"], claims[study, model, method, "time"]
        where = f"README's {m[1]}, {m[2]}"
        assert (m[3], m[5], m[6]) == (accuracy[6], accuracy[5], accuracy[8]), where
        assert m[4].split()[0].lower() in accuracy[7].lower(), where  # CPU, H100, H200 as the device column names it
        assert bool(m[7]) == (accuracy[13] == "within tolerance"), where
        assert m[8] == time[5].split()[0].lstrip("+") and m[9] == time[8], where
        assert bool(m[10]) == (time[13] == "within tolerance"), where
    run = {key[:3] for key, cells in claims.items() if key[3] == "accuracy" and cells[13] != "not yet run"}
    assert shown == run, f"rows missing: {sorted(run - shown)}; rows of no claim run: {sorted(shown - run)}"
    counted = re.search(r"\*\*(\d+) of (\d+) published claims run, (\d+) within tolerance\*\*", ledger_report)
    assert f"**{counted[1]} of the papers' {counted[2]} claims are run, {counted[3]} within tolerance.**" in readme
