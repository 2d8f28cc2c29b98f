"""`gpuledger processors run`: the processing stages (re-keying, node windows, job-minutes and idle)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import typer

from gpuledger.errors import ConfigError
from gpuledger.settings import Settings


def _settings(state_dir: Path | None) -> Any:
    from gpuledger.cli import load_settings

    return load_settings(state_dir)


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add this component's commands to the `gpuledger` command."""
    processors_app = typer.Typer(help="Attribution, windows, classification, idle detection, coverage.")
    app.add_typer(processors_app, name="processors")

    def _with_idle_rates(settings: Settings) -> Settings:
        """Idle warnings quote the cost so far: take today's on-prem rates from the rate card unless set."""
        idle = settings.processor.idle
        if idle.rate_per_device_hour:
            return settings
        import datetime as dt

        from gpuledger.errors import GpuledgerError
        from sinks.ratecard import load_card

        try:
            card = load_card(settings.sinks.ratecard_path)
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

    @processors_app.command("run")
    def run(
        stage: list[str] = typer.Option(
            ["rekey", "node", "job"], "--stage", help="Stage(s) to run in this process: rekey, node, job."
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
    ) -> None:
        """Run the processors until stopped (SIGTERM/SIGINT)."""
        from processors.runtime import STAGES, ProcessorRuntime

        bad = [s for s in stage if s not in STAGES]
        if bad:
            raise ConfigError(f"unknown stage(s) {bad}; choose from {list(STAGES)}")
        settings = _settings(state_dir)
        if realtime is not None:
            settings = settings.model_copy(
                update={"processor": settings.processor.model_copy(update={"realtime": realtime})}
            )
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        settings = _with_idle_rates(settings)
        runtime = ProcessorRuntime(
            settings, stages=tuple(stage), instance=instance, exit_when_idle_s=exit_when_idle, stats_path=stats_file
        )
        stats = runtime.run()
        typer.echo(json.dumps(stats.as_dict(), sort_keys=True))
