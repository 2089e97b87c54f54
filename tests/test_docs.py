"""The docs point at what exists: every relative link and its anchor, every file of the repository they name, every
`make` target and `python -m` module; a renamed heading, script or target breaks a test, not a reader's command."""

import re
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
