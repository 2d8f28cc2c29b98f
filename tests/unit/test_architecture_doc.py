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

import pytest

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


# ---- "Where to change what": four look-ups pinned (issue 40, item 4) ----------------------------------------
#
# Each look-up is an entry of that section, a list item that opens with its bold title (`- **title**`) and runs
# to the next item or heading, found by its title, so other entries may come and go. For each, the files and
# symbols the change must touch, as the code has them today: the entry must name each file and each symbol,
# each file must exist and each symbol must occur in its file (a rename breaks the test until the page follows).

LOOKUPS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "A DCGM field carried into the device-minute rollup": [
        ("producers/mappings/dcgm-v4.csv", ("canonical",)),
        ("producers/mappings/nvsmi-v1.csv", ("canonical",)),
        ("producers/nvsmi.py", ("DEFAULT_QUERY",)),
        ("producers/dcgm.py", ("_value_bounds",)),
        ("producers/records.py", ("device_metric_fields",)),
        ("schemas/models.py", ("_NON_NEGATIVE_SUFFIXES",)),
        ("schemas/telemetry.device-samples.avsc", ("DeviceSample", "power_w")),
        ("schemas/records.py", ("DeviceSample", "power_w")),
        ("sinks/rows.py", ("RAW_SAMPLE_COLUMNS", "raw_sample_rows", "DEVICE_MINUTE_COLUMNS", "device_minute_rows",
                           "JOB_MINUTE_COLUMNS", "job_minute_rows")),
        ("sinks/migrations/030_raw_samples_bulk.sql", ("raw_scrapes_bulk", "raw_scrapes_bulk_mv", "raw_samples")),
        ("sinks/bulk_samples.py", ("TABLE_FINGERPRINT",)),
        ("processors/fastdecode.py", ("DEVICE_ROLES", "flat_decoder")),
        ("processors/_window.c", ("R_POWER", "R_COUNT", "Device", "read_device", "WindowObject", "pw",
                                  "window_clear_arrays", "window_put", "absorb", "put_cell", "Window_put",
                                  "Window_secs", "span_stats")),
        ("processors/_window.pyi", ("span_stats",)),
        ("processors/windows.py", ("Second", "add_scrape")),
        ("processors/rollup.py", ("_stats", "_row", "span_row", "likely_waiting", "job_minute", "power_w_mean")),
        ("schemas/usage.device-minutes.avsc", ("power_w_mean",)),
        ("schemas/usage.job-minutes.avsc", ("power_w_mean",)),
        ("sinks/migrations/001_ledger_tables.sql", ("device_minutes", "job_minutes")),
        ("sinks/migrations/014_fair_units.sql", ("usage_daily_mv",)),
        ("producers/simulator/telemetry.py", ("Truth", "exporter_samples", "mig_parent_samples")),
        ("producers/simulator/ledger.py", ("DeviceMinute",)),
        ("processors/testing.py", ("device",)),
        ("web/queries.py", ("DEVICE_MINUTE_COLUMNS",)),
        ("web/pages.py", ("MINUTE_COLUMNS", "_minute_row")),
        ("tests/unit/test_scrape_reader.py", ()),
        ("tests/unit/test_rollup.py", ()),
        ("tests/unit/test_bulk_samples.py", ()),
        ("tests/integration/test_sink_raw_bulk.py", ()),
    ],
    "The idle grace": [
        ("base/processor_settings.py", ("IdlePolicy", "grace_min")),
        ("processors/idle.py", ("step", "grace_min", "action_at_ms", "IdleState")),
        ("sinks/chat.py", ("action_at_ms",)),
        ("web/model.py", ("action_at_ms",)),
        ("sinks/gang.py", ()),
        ("producers/simulator/ledger.py", ()),
        ("base/settings.py", ("reclaim_checkpoint_grace_s", "GPULEDGER_CONFIG")),
        ("sinks/reclaim.py", ("plan",)),
        ("tests/unit/test_idle.py", ("grace_min",)),
        ("tests/unit/test_gang_alerts.py", ()),
        ("tests/integration/test_idle_faust.py", ()),
    ],
    "A new chargeback column": [
        ("sinks/views/v_usage_priced.sql", ("idle_charge_num", "v_usage_priced_single")),
        ("sinks/views/fragments/chargeback_line_columns.sql", ("idle_cost",)),
        ("sinks/views/v_chargeback_month.sql", ("chargeback_sums_open_month", "v_chargeback_month_single")),
        ("sinks/views/v_chargeback_month_clusters.sql", ("chargeback_sums_open_month",)),
        ("sinks/views/v_statement_month.sql", ("chargeback_sums_closed_month",)),
        ("sinks/views/v_statement_month_clusters.sql", ("chargeback_sums_closed_month",)),
        ("sinks/views/v_chargeback.sql", ("chargeback_line_columns", "idle_charge_num")),
        ("sinks/views/fragments/chargeback_line_sums.sql", ("alloc_s",)),
        ("sinks/views/fragments/chargeback_sums_open_month.sql", ("idle_charge_num",)),
        ("sinks/views/fragments/chargeback_sums_closed_month.sql", ("rate_micro_per_gpu_hour",)),
        ("sinks/view_files.py", ()),
        ("sinks/chargeback.py", ("ChargebackLine", "LINE_COLUMNS", "chargeback")),
        ("sinks/reconcile.py", ("add_up", "_SUMMED", "LINE_COLUMNS")),
        ("web/queries.py", ("STATEMENT_COLUMNS", "LINE_COLUMNS")),
        ("sinks/statements.py", ("Segment", "StatementLine", "QUANTITIES", "_usage_line")),
        ("sinks/statement_store.py", ("segments", "LINE_COLUMNS")),
        ("sinks/migrations/012_statements.sql", ("statement_lines",)),
        ("sinks/README.md", ()),
        ("docs/governance.md", ()),
        ("tests/unit/test_chargeback_format.py", ()),
        ("tests/integration/test_chargeback_ledger.py", ()),
        ("tests/integration/test_priced_views_single.py", ()),
        ("tests/integration/test_chargeback_clusters.py", ()),
        ("tests/integration/test_statements_close.py", ()),
    ],
    "A new scheduler source": [
        ("schemas/sched.job-events.avsc", ("SchedulerKind",)),
        ("schemas/records.py", ("SchedulerKind",)),
        ("schemas/README.md", ()),
        ("producers/slurm.py", ("parse_json_doc", "SlurmJob")),
        ("producers/slurm_events.py", ("slurm_event", "lifecycle_events")),
        ("producers/jobevents.py", ("job_event", "HeldDevices", "event_id", "EventContext", "preemptible_qos")),
        ("producers/projects.py", ("resolve", "resolve_slurm", "resolve_labels")),
        ("producers/slurm_poller.py", ("step", "SlurmPoller")),
        ("base/producer_settings.py", ("SchedulerSettings",)),
        ("producers/scheduler_cli.py", ("register",)),
        ("producers/scheduler_service.py", ("context", "publisher")),
        ("producers/inventory.py", ("SOURCES",)),
        ("producers/telemetry_cli.py", ("--inventory-from",)),
        ("producers/preemptible.py", ("PreemptibleNames", "resolve", "pricing_drift")),
        ("producers/policy_slurm.py", ()),
        ("producers/policy_kueue.py", ()),
        ("producers/policy_cli.py", ("ENGINES",)),
        ("producers/policy.py", ()),
        ("sinks/reclaim.py", ("plan",)),
        ("sinks/cli.py", ("--scheduler",)),
        ("processors/idle.py", ("reclaim_kind",)),
        ("schemas/records.py", ("user_uid", "user_source", "user_groups")),
        ("tests/fixtures/slurm/PROVENANCE.md", ()),
        ("tests/unit/test_slurm_parsers.py", ()),
        ("tests/unit/test_inventory.py", ()),
        ("tests/unit/test_reclaim.py", ()),
        ("tests/unit/test_preemptible_policy.py", ()),
    ],
}  # fmt: skip
# A commit id: 7 to 40 hex digits, not all of them decimal (a plain number is not one), in backticks or after
# the word "commit".
COMMIT_ID = re.compile(r"`([0-9a-f]{7,40})`|\bcommits?\b\W{0,3}([0-9a-f]{7,40})\b", re.IGNORECASE)


def _entry(title: str) -> str:
    """The text of the "Where to change what" item whose bold title is `title`."""
    lines = _section("Where to change what")
    opening = f"- **{title}**"
    starts = [i for i, line in enumerate(lines) if line.startswith(opening)]
    assert len(starts) == 1, f"no single entry **{title}** in Where to change what (found {len(starts)})"
    out = [lines[starts[0]]]
    for line in lines[starts[0] + 1 :]:
        if line.startswith(("- ", "#")) or not line.strip():
            break
        out.append(line)
    return " ".join(s.strip() for s in out)


def _has_word(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


@pytest.mark.parametrize("title", sorted(LOOKUPS))
def test_lookup_entry_names_every_file_and_symbol_it_must(title: str) -> None:
    entry = _entry(title)
    missing = []
    for path, symbols in LOOKUPS[title]:
        where = ROOT / path
        assert where.is_file(), f"{title}: {path} does not exist (the test's list or the code moved)"
        text = where.read_text(encoding="utf-8")
        stale = [s for s in symbols if not _has_word(text, s)]
        assert stale == [], f"{title}: {path} no longer has {stale}"
        if f"`{path}`" not in entry and path.rsplit("/", 1)[-1] not in entry:
            missing.append(path)
        missing += [f"{s} ({path})" for s in symbols if not _has_word(entry, s)]
    assert missing == [], f"the entry **{title}** does not name: {missing}"


def test_the_idle_grace_entry_sends_the_reader_to_grace_min_not_the_window_grace(monkeypatch, tmp_path) -> None:
    entry = _entry("The idle grace")
    assert "`processor.idle.grace_min`" in entry
    assert "grace_ms" not in entry.lower(), "the idle grace is processor.idle.grace_min, not the window grace"
    names = set(re.findall(r"GPULEDGER_[A-Z0-9_]+", entry)) - {"GPULEDGER_CONFIG"}
    assert names == {"GPULEDGER_PROCESSOR__IDLE__GRACE_MIN"}
    # the spelling the entry gives an operator really sets the idle grace, and only it
    from base.settings import Settings

    monkeypatch.setenv("GPULEDGER_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.setenv(names.pop(), "7")
    settings = Settings(state_dir=tmp_path)
    assert settings.processor.idle.grace_min == 7
    assert settings.processor.grace_ms == type(settings.processor)().grace_ms
    # and so does the settings file form it gives
    assert "`[processor.idle]`" in entry and "`grace_min = 30`" in entry
    monkeypatch.delenv("GPULEDGER_PROCESSOR__IDLE__GRACE_MIN")
    (tmp_path / "gpuledger.toml").write_text("[processor.idle]\ngrace_min = 30\n", encoding="utf-8")
    monkeypatch.setenv("GPULEDGER_CONFIG", str(tmp_path / "gpuledger.toml"))
    assert Settings(state_dir=tmp_path).processor.idle.grace_min == 30


def test_the_window_grace_is_its_own_entry() -> None:
    entry = _entry("The window grace")
    assert "`processor.grace_ms`" in entry and "GPULEDGER_PROCESSOR__GRACE_MS" in entry
    assert "grace_min" not in entry


def test_the_page_names_no_commit() -> None:
    text = DOC.read_text(encoding="utf-8")
    ids = [a or b for a, b in COMMIT_ID.findall(text)]
    assert [i for i in ids if not i.isdigit()] == []


@pytest.mark.parametrize(
    "text", ["written at commit `96dd185`", "as of commit 96dd185.", "see `0f3c2a9e1b`", "commits abcdef1 on"]
)
def test_a_commit_id_is_recognised(text: str) -> None:
    assert any(not (a or b).isdigit() for a, b in COMMIT_ID.findall(text))


@pytest.mark.parametrize("text", ["`36000000`", "`power_w_mean`", "commit protocol", "`sinks/bulk_samples.py`"])
def test_numbers_and_names_are_not_commit_ids(text: str) -> None:
    assert all((a or b).isdigit() for a, b in COMMIT_ID.findall(text))
