"""scripts/ holds product entry points (listed in scripts/README.md); scripts/repro/ holds the scripts that reproduce
one documented measurement each. Both directions are checked: every repro script names its journal section
(``Reproduces: docs/<file>.md § <heading start>``) and that section names the script; every ``scripts/...`` path the
docs, tests, configs, projects and sources mention exists (a moved script leaves no stale reference)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
REPRO = SCRIPTS / "repro"
REPRO_LINE = re.compile(r"^(?:#\s*)?Reproduces: (docs/[\w./-]+\.md) § (.+?)\s*$", re.M)
SCRIPT_PATH = re.compile(r"(?<![\w/.-])scripts/(?:repro/)?[\w.-]+\.(?:py|sh)\b")
OTHER_REPOS = {"src/phase6/plan/published_runs.yaml"}  # cites karpathy/llm.c's scripts/, not ours


def sections(md: Path) -> list[tuple[int, str, str]]:
    """(level, heading text, body up to the next heading of the same or a higher level), code fences skipped."""
    return sections_of(md.read_text())


def sections_of(text: str) -> list[tuple[int, str, str]]:
    """``sections`` of a markdown text (tests/test_results_doc.py reads the journal's anchors through it)."""
    lines = text.splitlines()
    heads, fence = [], False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"^(#+) (.*)", line)):
            heads.append((i, len(m.group(1)), m.group(2)))
    out = []
    for k, (i, level, text) in enumerate(heads):
        end = next((j for j, lv, _ in heads[k + 1 :] if lv <= level), len(lines))
        out.append((level, text, "\n".join(lines[i:end])))
    return out


def test_scripts_top_level_holds_only_the_listed_entry_points() -> None:
    readme = (SCRIPTS / "README.md").read_text()
    listed = set(re.findall(r"^\| `([\w.-]+)` \|", readme, re.M))
    present = {p.name for p in SCRIPTS.iterdir() if p.is_file() and p.name != "README.md"}
    assert present == listed, f"scripts/ vs scripts/README.md: unlisted {present - listed}, missing {listed - present}"
    assert {p.name for p in SCRIPTS.iterdir() if p.is_dir() and p.name != "__pycache__"} == {"repro"}


@pytest.mark.parametrize("script", sorted(p.name for p in REPRO.iterdir() if p.suffix in {".py", ".sh"}))
def test_each_repro_script_and_its_journal_section_name_each_other(script: str) -> None:
    """The script's header names the journal file (best: a ``Reproduces: docs/<file>.md § <heading start>`` line,
    checked exactly), and a section of that file names ``scripts/repro/<script>`` back."""
    header = "\n".join((REPRO / script).read_text().splitlines()[:60])
    refs = REPRO_LINE.findall(header)
    docs = {d for d, _ in refs} or set(re.findall(r"docs/[\w-]+\.md", header))
    assert docs, f"scripts/repro/{script}: its header names no docs/<file>.md section it reproduces"
    for doc, start in refs:
        found = [body for _, text, body in sections(REPO / doc) if text.startswith(start)]
        assert len(found) == 1, f"scripts/repro/{script}: {doc} has {len(found)} sections starting {start!r}"
        assert f"scripts/repro/{script}" in found[0], f"{doc} § {start} does not name scripts/repro/{script}"
    named_in = [d for d in docs if any(f"scripts/repro/{script}" in body for _, _, body in sections(REPO / d))]
    assert named_in, f"no section of {sorted(docs)} names scripts/repro/{script}"


def test_every_mentioned_script_path_exists() -> None:
    roots = ["README.md", "Makefile", ".ci", "docs", "tests", "configs", "projects", "src", "scripts"]
    files = [REPO / r for r in roots if (REPO / r).is_file()]
    files += [p for r in roots if (REPO / r).is_dir() for p in (REPO / r).rglob("*") if p.is_file()]
    stale = set()
    for f in files:
        if f.suffix not in {".md", ".py", ".sh", ".yaml", ".txt", ""} or "__pycache__" in f.parts:
            continue
        if str(f.relative_to(REPO)) in OTHER_REPOS:
            continue
        for m in SCRIPT_PATH.finditer(f.read_text(errors="replace")):
            if not (REPO / m.group(0)).exists():
                stale.add(f"{f.relative_to(REPO)}: {m.group(0)}")
    assert not stale, "references to scripts that do not exist:\n" + "\n".join(sorted(stale))
