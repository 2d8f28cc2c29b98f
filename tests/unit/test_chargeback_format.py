"""Report arguments and output formats (no services)."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal

import pytest

from base.errors import ConfigError
from sinks import chargeback as cb


@pytest.mark.parametrize("period", ["2026-13", "2026-1", "26-11", "2026-11-01", "'; DROP", ""])
def test_bad_periods(period: str) -> None:
    with pytest.raises(ConfigError, match="YYYY-MM"):
        cb.check_period(period)


def test_good_period_and_by() -> None:
    assert cb.check_period("2026-11") == "2026-11"
    assert [cb.check_by(b) for b in cb.BY_CHOICES] == list(cb.BY_CHOICES)
    with pytest.raises(ConfigError, match="--by"):
        cb.check_by("galaxy")
    assert cb.check_by("cluster", cb.REPORT_BY) == "cluster"  # the report's own view per cluster
    with pytest.raises(ConfigError, match=r"--by must be one of team, .*, tier, cluster, got 'galaxy'"):
        cb.check_by("galaxy", cb.REPORT_BY)


def test_csv_and_json_keep_decimals_exact() -> None:
    rows = [{"line": "vision", "charge": Decimal("24.02"), "utilisation_pct": 81.4, "jobs": 4}]
    assert cb.to_csv(rows) == "line,charge,utilisation_pct,jobs\nvision,24.02,81.4,4\n"
    assert json.loads(cb.to_json(rows)) == [{"line": "vision", "charge": "24.02", "utilisation_pct": 81.4, "jobs": 4}]


def test_pure_core_imports_no_clients() -> None:
    code = (
        "import sys, sinks.ratecard, sinks.rows, sinks.chat, sinks.reclaim;"
        "bad = [m for m in ('clickhouse_connect', 'confluent_kafka', 'faust') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_csv_neutralises_formulas_in_names_not_in_numbers() -> None:
    rows = [
        {"line": '=HYPERLINK("http://evil","x")', "description": "@SUM(A1)", "debit": Decimal("-12.50"), "jobs": -1},
        {"line": "+team", "description": "\tx", "debit": Decimal("3"), "jobs": 2},
    ]
    assert cb.to_csv(rows).splitlines() == [
        "line,description,debit,jobs",
        '"\'=HYPERLINK(""http://evil"",""x"")",\'@SUM(A1),-12.50,-1',
        "'+team,'\tx,3,2",
    ]


def test_table_prints_user_text_as_text() -> None:
    from rich.console import Console

    rows = [{"project": "[/]", "user": "[bold red]eve[/]", "message": "[link=http://evil]click[/link]"}]
    console = Console(width=200, record=True, color_system=None)
    console.print(cb.render_table("jobs behind [/x] in 2026-11", rows, ("project", "user", "message")))
    text = console.export_text()
    for raw in ("[/]", "[bold red]eve[/]", "[link=http://evil]click[/link]", "jobs behind [/x] in 2026-11"):
        assert raw in text


def test_an_empty_report_still_names_its_columns(tmp_path) -> None:
    """A month with no lines (a journal before anything ran) is a header, not an empty file: a finance loader
    or a spreadsheet still finds the columns it maps."""
    import pyarrow.parquet as pq

    assert cb.to_csv([], ("period", "line_id", "amount")) == "period,line_id,amount\n"
    cb.write_parquet([], tmp_path / "empty.parquet", ("period", "line_id", "amount"))
    table = pq.read_table(tmp_path / "empty.parquet")
    assert table.column_names == ["period", "line_id", "amount"] and table.num_rows == 0
