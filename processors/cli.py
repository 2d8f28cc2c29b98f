"""`gpuledger processors run`: the processing stages (re-keying, node windows, job-minutes and idle)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import typer

from base.cli_common import VERBOSE_OPTION, start_service, stop_signal
from base.errors import ConfigError
from base.settings import Settings

# The stages `processors run` runs unless told: the job stage (job-minutes, idle detection, alerts, reclaim
# actions) runs as faust agents, `processors agents` (processors/idle_agents.py).
DEFAULT_STAGES = ("rekey", "node")

processors_app = typer.Typer(help="Attribution, windows, classification, idle detection, coverage.")


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add this component's commands to the `gpuledger` command."""
    app.add_typer(processors_app, name="processors")


def _with_idle_rates(settings: Settings) -> Settings:
    """Idle warnings quote the cost so far: take today's on-prem rates from the rate card unless set."""
    idle = settings.processor.idle
    if idle.rate_per_device_hour:
        return settings
    import datetime as dt

    from base.errors import GpuledgerError
    from sinks.ratecard import load_card

    try:
        card = load_card(settings.sinks.ratecard_path, settings.policy_path)
    except GpuledgerError as exc:
        logging.getLogger("gpuledger.processors").warning("no rates for idle cost evidence: %s", exc)
        return settings
    today = dt.datetime.now(dt.UTC).date()
    rates = {}
    for generation in sorted({r.generation for r in card.rates()}):
        rate = card.rate_for(generation, "on-prem", False, today)
        if rate is not None:
            rates[generation] = float(rate.per_gpu_hour)
    new_idle = idle.model_copy(update={"rate_per_device_hour": rates})
    return settings.model_copy(update={"processor": settings.processor.model_copy(update={"idle": new_idle})})


def _with_realtime(settings: Settings, realtime: bool | None) -> Settings:
    if realtime is None:
        return settings
    return settings.model_copy(update={"processor": settings.processor.model_copy(update={"realtime": realtime})})


@processors_app.command("run")
def run(
    stage: list[str] = typer.Option(
        list(DEFAULT_STAGES),
        "--stage",
        help="Stage(s) to run in this process: rekey, node; job runs as `processors agents` (here only to compare).",
    ),
    instance: str | None = typer.Option(
        None, "--instance", help="Stable instance id (static group membership: a restart resumes at once)."
    ),
    exit_when_idle: float | None = typer.Option(
        None, "--exit-when-idle", help="Finite input: close the last minutes and exit after N quiet seconds."
    ),
    realtime: bool | None = typer.Option(
        None, "--realtime/--event-time", help="Let the wall clock close windows when inputs are caught up."
    ),
    stats_file: Path | None = typer.Option(
        None, "--stats-file", help="Keep counters here (JSON, rewritten every second)."
    ),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="State directory."),
    verbose: bool = VERBOSE_OPTION,
) -> None:
    """Run the processors until stopped (SIGTERM/SIGINT)."""
    from base.shutdown import StopSignal
    from processors.runtime import STAGES, ProcessorRuntime, run_recovering

    bad = [s for s in stage if s not in STAGES]
    if bad:
        raise ConfigError(f"unknown stage(s) {bad}; choose from {list(STAGES)}")
    settings = _with_idle_rates(_with_realtime(start_service(state_dir, verbose), realtime))
    # Installed for the whole process, never taken down: its deadline covers the exit after run().
    shutdown = stop_signal("processors")

    def build(stop: StopSignal) -> ProcessorRuntime:
        return ProcessorRuntime(
            settings,
            stages=tuple(stage),
            instance=instance,
            exit_when_idle_s=exit_when_idle,
            stats_path=stats_file,
            shutdown=stop,
        )

    # A consumer that fails (fenced after a broker restart) is replaced in-process, as a restart would.
    stats = run_recovering(build, shutdown)
    typer.echo(json.dumps(stats.as_dict(), sort_keys=True))
    shutdown.leave()


@processors_app.command("agents")
def agents(
    exit_when_idle: float | None = typer.Option(
        None, "--exit-when-idle", help="Finite input: exit once the input is read to its end and quiet N seconds."
    ),
    realtime: bool | None = typer.Option(
        None, "--realtime/--event-time", help="Let the wall clock forget ended jobs when inputs are quiet."
    ),
    stats_file: Path | None = typer.Option(
        None, "--stats-file", help="Keep counters here (JSON, rewritten every second)."
    ),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="State directory."),
    verbose: bool = VERBOSE_OPTION,
) -> None:
    """Run the job stage (job-minutes, idle detection, alerts, reclaim actions) as a faust worker until
    stopped (SIGTERM/SIGINT); its idle states are a faust Table on `processors.idle-state.v1`."""
    from processors.idle_agents import run_agents

    settings = _with_idle_rates(_with_realtime(start_service(state_dir, verbose), realtime))
    # Installed for the whole process, never taken down: its deadline covers the exit after the run.
    shutdown = stop_signal("job-agents")
    stats = run_agents(settings, shutdown=shutdown, exit_when_idle_s=exit_when_idle, stats_path=stats_file)
    typer.echo(json.dumps(stats.as_dict(), sort_keys=True))
    shutdown.leave()
