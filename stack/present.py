"""How `gpuledger up|down|status` print: the components, Kafka, registry, ClickHouse and pipeline tables, the
policy in force, what to try next (typed the way the folder `up` ran in reaches `gpuledger`), and the wait for the
ledger's first rows. Output only: the states and figures come from the supervisor (`stack/supervisor.py`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from base.settings import Settings
from stack.supervisor import ComponentStatus, StackStatus

console = Console()

_STYLE = {
    "ready": "green",
    "running": "green",
    "done": "green",
    "disabled": "dim",
    "stopped": "yellow",
    "unavailable": "yellow",
    "not-ready": "red",
    "failed": "red",
}

def components_table(rows: list[ComponentStatus]) -> Table:
    table = Table(title="components", title_justify="left")
    for col in ("component", "state", "pid", "detail"):
        table.add_column(col)
    for c in rows:
        style = _STYLE.get(c.state, "")
        # Details quote errors and logs: text, not markup.
        table.add_row(escape(c.name), f"[{style}]{c.state}[/]", str(c.pid or ""), escape(c.detail))
    return table


def _seconds(v: float) -> str:
    return f"{v:.2f} s" if v < 10 else f"{v:,.0f} s" if v < 600 else f"{v / 60:,.0f} min"


def pipeline_table(rows: list[dict[str, Any]]) -> Table:
    """Each running component's own metrics (its /metrics endpoint), in a few numbers."""
    table = Table(title="pipeline (each component's /metrics)", title_justify="left")
    for col in ("component", "in", "out", "dead letters", "lag", "alert p99", "coverage / note"):
        table.add_column(col, justify="left" if col in ("component", "coverage / note") else "right")
    for row in rows:
        if not row["reachable"]:
            where = f" ({row['url']})" if row["url"] else ""
            table.add_row(row["component"], "", "", "", "", "", f"[yellow]{escape(row['detail'] + where)}[/]")
            continue
        m = row["metrics"]
        p99 = m.get("alert_latency_p99_s")
        table.add_row(
            row["component"],
            f"{m['records_in']:,}",
            f"{m['records_out']:,}",
            f"[red]{m['dead_letters']:,}[/]" if m["dead_letters"] else "0",
            f"{m['consumer_lag']:,}",
            "" if p99 is None else _seconds(p99),
            ", ".join(f"{c} {v:.1%}" for c, v in m.get("coverage", {}).items()),
        )
    return table


def print_status(st: StackStatus) -> None:
    console.print(components_table(st.components))
    kafka = Table(title="kafka", title_justify="left", show_header=False)
    reach = "[green]reachable[/] " if st.broker_reachable else "[red]unreachable[/] "
    kafka.add_row("broker", reach + escape(st.broker_detail))
    kafka.add_row("topics", escape(", ".join(st.topics)) or "(none)")
    if st.missing_topics:
        kafka.add_row("[red]missing topics[/]", escape(", ".join(st.missing_topics)) + "  (gpuledger topics apply)")
    if st.consumer_lag:
        for g in st.consumer_lag:
            kafka.add_row(escape(f"lag {g.group}"), f"{g.lag} over {g.partitions} partition(s)")
    else:
        kafka.add_row("consumer groups", "(none)")
    console.print(kafka)
    if st.registry_url is not None:
        reg = Table(title="schema registry", title_justify="left", show_header=False)
        reach = "[green]reachable[/] " if st.registry_reachable else "[red]unreachable[/] "
        reg.add_row("registry", reach + escape(st.registry_detail))
        if st.missing_subjects:
            shown = ", ".join(st.missing_subjects)
            reg.add_row("[yellow]missing subjects[/]", escape(shown) + "  (gpuledger schemas register)")
        console.print(reg)
    ch = Table(title="clickhouse", title_justify="left", show_header=False)
    reach = "[green]reachable[/] " if st.clickhouse_reachable else "[red]unreachable[/] "
    ch.add_row("server", reach + escape(st.clickhouse_detail))
    for name, n in (st.clickhouse_rows or {}).items():
        ch.add_row(escape(name), f"{n:,} rows")
    console.print(ch)
    if st.pipeline:
        console.print(pipeline_table(st.pipeline))
    console.print("[green]healthy[/]" if st.healthy else "[yellow]not all components are healthy[/]")


def wait_for_first_rollups(settings: Settings, wait_s: float) -> None:
    """The first five minutes: show the ledger filling instead of leaving the user at a blank report."""
    import time

    from stack.local import job_minute_rows

    deadline = time.monotonic() + wait_s
    with console.status("replaying three hours of simulated history into the ledger…") as spinner:
        while time.monotonic() < deadline:
            rows = job_minute_rows(settings)
            spinner.update(f"replaying three hours of simulated history into the ledger… {rows:,} job-minutes")
            if rows >= 1000:
                break
            time.sleep(2)


def command_prefix(cwd: Path | None = None, executable: str | None = None, path: str | None = None) -> str:
    """How a person types `gpuledger` in the folder `up` ran in, so that what `up` prints runs when pasted there:
    the bare name where it is on PATH (an installed or activated `gpuledger`), else this environment's entry point
    relative to that folder (`make up`: `.venv/bin/gpuledger`), else its absolute path; without an entry point
    (`python -m gpuledger`, a test's `python -c`), this interpreter with `-m gpuledger`."""
    import shutil
    import sys

    cwd = Path.cwd() if cwd is None else cwd
    exe = Path(sys.executable if executable is None else executable)
    # The venv's bin folder as given, not through its python symlink (that would be the base interpreter's).
    script = exe.parent / "gpuledger"
    if not script.is_file():
        return f"{shlex_quote(str(exe))} -m gpuledger"
    found = shutil.which("gpuledger", path=os.environ.get("PATH", "") if path is None else path)
    if found is not None and Path(found).resolve() == script.resolve():
        return "gpuledger"
    try:
        return shlex_quote(str(script.absolute().relative_to(cwd.absolute())))
    except ValueError:
        return shlex_quote(str(script.absolute()))


def shlex_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def next_steps(settings: Settings, state_dir: Path | None, gl: str, period: str) -> list[tuple[str, str]]:
    """What to try next, each (command as typed in the folder `up` ran in, what it shows); `gl`: how `gpuledger`
    is typed there (`command_prefix`)."""
    sd = f" --state-dir {shlex_quote(str(state_dir))}" if state_dir else ""
    steps = [
        (f"{gl} report chargeback --period {period}{sd}", "per team: allocated vs consumed, charge, coverage"),
        (f"{gl} report chargeback --period {period} --by project{sd}", "the same per project"),
        (
            f"{gl} report chargeback --period {period} --by cluster{sd}",
            "each team on sim (Slurm-like) and sim-k8s (Kubernetes), and its total across them",
        ),
    ]
    if settings.policy_path is not None:
        policy = shlex_quote(str(settings.policy_path))
        steps.append((f"{gl} report chargeback --period {period} --quota --policy {policy}{sd}",
                      "each team's use beside its quota per generation (the policy's)"))  # fmt: skip
    steps += [
        (f"{gl} alerts{sd}", "idle warnings, reclaim notices (dry-run), coverage gaps"),
        (f"tail -f {shlex_quote(str(settings.state_dir / 'webhook.jsonl'))}", "what chat received (local webhook)"),
        (f'{gl} sql "SELECT * FROM v_utilisation_daily LIMIT 10"{sd}', "SQL, as an analyst would"),
        (f"{gl} status{sd}", "health, consumer lag, row counts"),
        (f"{gl} down{sd}", "stop everything"),
    ]
    return steps


def print_next_steps(settings: Settings, state_dir: Path | None) -> None:
    from datetime import UTC, datetime

    period = datetime.now(UTC).strftime("%Y-%m")
    steps = next_steps(settings, state_dir, command_prefix(), period)
    console.print("\n[bold]Two simulated clusters are running (sim, Slurm-like; sim-k8s, Kubernetes).[/] Look at:")
    for command, what in steps:
        console.print(f"  [cyan]{escape(command)}[/]\n      [dim]{what}[/]", highlight=False, soft_wrap=True)


def print_policy(settings: Settings) -> None:
    from stack.components import demo_policy

    if settings.policy_path is None:
        console.print("policy: none (policy_path unset): no quota, appeals or reservations", highlight=False)
        return
    # with_demo_policy filled it in: say whose it is and how to use another.
    shown = settings.policy_path
    with contextlib.suppress(ValueError):
        shown = settings.policy_path.relative_to(Path.cwd())
    unset = settings.model_copy(update={"policy_path": None})
    whose = " (the simulated organisation's: ops00 decides appeals; set policy_path for your own)" if (
        demo_policy(unset) == settings.policy_path) else ""
    console.print(f"policy: {shown}{whose}", highlight=False, soft_wrap=True)
    if not settings.sinks.reservations.engines:
        console.print("reservations: recorded, approved and charged; no engine configured "
                      "(sinks.reservations.engines), so none is put onto a scheduler", highlight=False)  # fmt: skip


def web_url(settings: Any) -> str:
    """Where `gpuledger web` answers (a wildcard listen address is reached on loopback)."""
    host = settings.web.host if settings.web.host not in ("0.0.0.0", "::", "") else "127.0.0.1"  # noqa: S104
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.web.port}/"
