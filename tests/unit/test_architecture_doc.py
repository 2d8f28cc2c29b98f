"""docs/architecture.md stays true: its topics, stages and file paths are the code's.

The page's format, which these tests read:
- `## Topics`: every table row in that section names one topic, in backticks, in its first column.
  A table with a `key` column gives the record key (first backticked text of the cell), one with a
  `partitions` column the partition count (a number).
- `## Processor stages`: every table row in that section names one stage, in backticks, in its first
  column, in the order the runtime runs them.
- Anywhere: a backticked text that starts with one of the repository's top-level folders is a path
  that must exist. Placeholders (`<...>`, `*`, `{...}`, `NNN`) are not paths.
"""

from __future__ import annotations

import re
from pathlib import Path

from processors.runtime import IDLE_STATE_TOPIC, STAGES
from schemas.topics import CATALOGUE, all_topics

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
CODE = re.compile(r"`([^`]+)`")
PLACEHOLDER = re.compile(r"[<>*{}]|NNN")


def _section(title: str) -> list[str]:
    """The lines under `## title`, up to the next `## ` heading (### subsections included)."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index(f"## {title}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def _cells(line: str) -> list[str]:
    """The cells of a markdown table row (`\\|` is a literal bar inside a cell)."""
    inner = line.strip().removeprefix("|").removesuffix("|")
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def _rows(lines: list[str]) -> list[dict[str, str]]:
    """Every data row of every table in `lines`, as header -> cell."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in [*lines, ""]:
        if not line.startswith("|"):  # a table row starts the line (the diagram's bars do not)
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = cells
        elif not all(set(c) <= set("-: ") for c in cells):  # not the separator row
            assert len(cells) == len(header), f"table row with {len(cells)} cells, header has {len(header)}: {line}"
            rows.append(dict(zip(header, cells, strict=True)))
    return rows


def _name(row: dict[str, str]) -> str:
    first = next(iter(row.values()))
    match = re.fullmatch(r"`([^`]+)`", first)
    assert match, f"first column must be one name in backticks, got {first!r}"
    return match.group(1)


def _first_code(cell: str) -> str | None:
    match = CODE.search(cell)
    return match.group(1) if match else None


def test_topics_table_lists_exactly_the_topics_of_the_code() -> None:
    names = [_name(row) for row in _rows(_section("Topics"))]
    assert len(names) == len(set(names)), f"listed twice: {sorted({n for n in names if names.count(n) > 1})}"
    expected = {t.name for t in all_topics()} | {IDLE_STATE_TOPIC}
    assert set(names) - expected == set(), "documented but not in the code"
    assert expected - set(names) == set(), "in the code but not in docs/architecture.md"


def test_topics_table_gives_each_topic_its_key_and_partitions() -> None:
    by_name = {t.name: t for t in all_topics()}
    rows = {_name(row): row for row in _rows(_section("Topics"))}
    for topic in CATALOGUE:
        row = rows[topic.name]
        assert _first_code(row["key"]) == topic.key, f"{topic.name}: key {row['key']!r}, code says {topic.key!r}"
    for name, row in rows.items():
        if name in by_name:
            assert row.get("partitions", "").isdigit(), f"{name}: no partition count"
            assert int(row["partitions"]) == by_name[name].partitions, f"{name}: partitions"


def test_stages_table_lists_the_runtime_stages_in_order() -> None:
    assert [_name(row) for row in _rows(_section("Processor stages"))] == list(STAGES)


def test_every_path_named_exists() -> None:
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    text = re.sub(r"^```.*?^```", "", DOC.read_text(encoding="utf-8"), flags=re.DOTALL | re.MULTILINE)  # the diagram
    paths = {
        code.split(":")[0]
        for code in CODE.findall(text)
        if "/" in code and not PLACEHOLDER.search(code) and " " not in code and code.split("/")[0] in folders
    }
    assert len(paths) > 50  # the page names files throughout: this test must be reading them
    assert sorted(p for p in paths if not (ROOT / p).exists()) == []


def test_the_readme_links_the_page() -> None:
    assert "docs/architecture.md" in (ROOT / "README.md").read_text(encoding="utf-8")
