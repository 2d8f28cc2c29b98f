"""`gpuledger web`: serve the team page (web/app.py) with uvicorn until SIGTERM; the app's context is built
from the one settings object by `web.context.build_context`."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from base.cli_common import STATE_DIR_OPTION, VERBOSE_OPTION, start_service
from web.context import build_context

log = logging.getLogger("gpuledger.web")


def web_cmd(
    host: str | None = typer.Option(None, "--host", help="Address to listen on (default: settings web.host)."),
    port: int | None = typer.Option(None, "--port", help="Port (default: settings web.port, 8080)."),
    state_dir: Path | None = STATE_DIR_OPTION,
    verbose: bool = VERBOSE_OPTION,
) -> None:
    """Serve the team page: statements, utilisation, evidence down to device-minutes, corrections."""
    import uvicorn

    from web.app import create_app

    settings = start_service(state_dir, verbose)
    app = create_app(build_context(settings))
    bind_host, bind_port = host or settings.web.host, port if port is not None else settings.web.port
    log.info("web: serving on http://%s:%d/ (demo mode %s)", bind_host, bind_port, "on" if settings.web_demo else "off")
    uvicorn.run(app, host=bind_host, port=bind_port, log_level="info" if verbose else "warning",
                access_log=verbose, proxy_headers=False, server_header=False)  # fmt: skip


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    app.command("web")(web_cmd)
