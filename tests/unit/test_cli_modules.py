"""The command's lazy registration (gpuledger/cli.py): a call imports only the modules that add to its command,
so the map from command to modules must be exactly what the modules register, derived here by registering them
one by one into a fresh app and seeing which top-level commands each one adds or changes."""

from __future__ import annotations

import importlib
import subprocess
import sys
from typing import Any

import typer

from gpuledger import cli


def _tree(t: typer.Typer) -> dict[str, Any]:
    """Command names, groups as their own trees (what `--help` would list, level by level)."""
    out: dict[str, Any] = {c.name or (c.callback.__name__ if c.callback else ""): None for c in t.registered_commands}
    out.update({g.name or "": _tree(g.typer_instance) for g in t.registered_groups if g.typer_instance})
    return out


def test_the_map_names_every_module_that_adds_to_each_command() -> None:
    app, inspect_app = typer.Typer(), typer.Typer()
    app.add_typer(inspect_app, name="inspect")
    owners: dict[str, tuple[str, ...]] = {}
    for name in cli._COMMAND_MODULES:
        before = _tree(app)
        importlib.import_module(name).register(app, inspect_app)
        for command, sub in _tree(app).items():
            if before.get(command, "absent") != sub:
                owners[command] = (*owners.get(command, ()), name)
    own = {c.name for c in cli.app.registered_commands}  # defined in gpuledger/cli.py itself
    assert {**owners, **dict.fromkeys(own, ())} == cli.MODULES_BY_COMMAND


def test_a_command_needs_its_modules_and_anything_else_needs_all() -> None:
    assert cli.modules_for(["report", "chargeback"]) == ("sinks.cli",)
    assert cli.modules_for(["policy", "whatif"]) == ("producers.cli", "processors.whatif_cli")  # in order
    assert cli.modules_for(["settings"]) == ()
    for argv in ([], ["--help"], ["no-such-command"]):
        assert cli.modules_for(argv) == cli._COMMAND_MODULES


def test_a_command_runs_without_importing_the_others() -> None:
    """`gpuledger report --help` in a fresh interpreter: the stack, the producers and the web app stay unimported."""
    code = (
        "import sys; sys.argv = ['gpuledger', 'report', '--help']\n"
        "from gpuledger.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "print(sorted(m for m in ('stack.supervisor', 'producers.cli', 'web.app') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "chargeback" in out and out.strip().endswith("[]")
