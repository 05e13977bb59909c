"""docs/results.md holds today's headline figures; each row links the journal section (docs/benchmarks.md) it comes
from, and every number of its value cell and its date must appear in that section. Fails with the row and what is
missing (a wrong anchor lists the journal anchors that share its words)."""

from __future__ import annotations

import re
from pathlib import Path

from test_scripts import sections_of  # the one markdown section parser of the doc tests

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results.md"
JOURNAL = REPO / "docs" / "benchmarks.md"
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?k?")
LINK = re.compile(r"\]\(benchmarks\.md#([\w-]+)\)")


def anchor(heading: str) -> str:
    """GitHub's heading anchor: lowercased, punctuation other than '-' and '_' dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def journal_sections(text: str) -> dict[str, str]:
    """anchor -> the section's text (tests/test_scripts.py's sections: heading to the next heading of the same or a
    higher level, code fences not headings); a repeated anchor gets GitHub's -1, -2 suffix."""
    out: dict[str, str] = {}
    for _, title, body in sections_of(text):
        base, n = anchor(title), 0
        while (a := base if n == 0 else f"{base}-{n}") in out:
            n += 1
        out[a] = body
    return out


def rows(text: str) -> list[list[str]]:
    """The data rows of every 6-column table (figure, value, date, hardware, command, journal)."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) == 6 and cells[0] != "figure" and not set(cells[0]) <= {"-"}:
            out.append(cells)
    return out


def problems(results: str, journal: str) -> list[str]:
    sections = journal_sections(journal)
    found = []
    for figure, value, date, *_, link in rows(results):
        m = LINK.search(link)
        if not m:
            found.append(f"{figure}: journal cell has no benchmarks.md#anchor link")
            continue
        body = sections.get(m.group(1))
        if body is None:
            words = set(m.group(1).split("-")[:4])
            near = [a for a in sections if words & set(a.split("-")) and len(words & set(a.split("-"))) >= 2]
            found.append(f"{figure}: no journal section #{m.group(1)}; anchors sharing its words: {near[:8]}")
            continue
        for token in [date, *NUMBER.findall(value)]:
            if token not in body:
                found.append(f"{figure}: {token!r} is not in benchmarks.md#{m.group(1)}")
    return found


def test_every_results_figure_has_its_journal_entry() -> None:
    text = RESULTS.read_text()
    assert len(rows(text)) >= 6
    for title in ("## 6A", "## 6B", "## 6C", "## 6D", "## plan", "## fleet"):
        assert title in text, title
    assert problems(text, JOURNAL.read_text()) == []


def test_the_check_catches_a_figure_the_journal_does_not_have() -> None:
    journal = "# J\n\n## Run (2026-12-01)\n\n| x | 1,234.5 tokens/s |\n\n```\n# not a heading\n```\n"
    row = "| fig | {v} | {d} | H200 | `cmd` | [j](benchmarks.md#{a}) |\n"
    assert problems(row.format(v="1,234.5 tokens/s", d="2026-12-01", a="run-2026-12-01"), journal) == []
    assert problems(row.format(v="1,243.5 tokens/s", d="2026-12-01", a="run-2026-12-01"), journal)  # wrong figure
    assert problems(row.format(v="1,234.5 tokens/s", d="2026-12-02", a="run-2026-12-01"), journal)  # wrong date
    assert problems(row.format(v="1,234.5 tokens/s", d="2026-12-01", a="run"), journal)  # wrong anchor
    assert problems(row.format(v="1,234.5", d="2026-12-01", a="not-a-heading"), journal)  # fenced: no section


def test_the_readme_links_results_on_its_first_screen() -> None:
    first_screen = "\n".join((REPO / "README.md").read_text().splitlines()[:25])
    assert "docs/results.md" in first_screen
