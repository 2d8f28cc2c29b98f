"""The command's lazy registration (gpuledger/cli.py): a call imports only the modules that add to its command,
so the map from command to modules must be exactly what the modules register, derived here (in a fresh interpreter) by
registering them one by one into a fresh app and seeing which top-level commands each one adds or changes."""

from __future__ import annotations

import json
import subprocess
import sys

from gpuledger import cli

# Run in a fresh interpreter: the modules' command groups are module-level objects that a registration elsewhere in
# the same process (another test calling `_register_all` on `cli.app`) has already filled.
DERIVE = """
import importlib, json, typer
from gpuledger import cli

def tree(t):
    out = {c.name or (c.callback.__name__ if c.callback else ""): None for c in t.registered_commands}
    out.update({g.name or "": tree(g.typer_instance) for g in t.registered_groups if g.typer_instance})
    return out

app, inspect_app = typer.Typer(), typer.Typer()
app.add_typer(inspect_app, name="inspect")
owners = {c.name: [] for c in cli.app.registered_commands}  # defined in gpuledger/cli.py itself
for name in cli._COMMAND_MODULES:
    before = tree(app)
    importlib.import_module(name).register(app, inspect_app)
    for command, sub in tree(app).items():
        if before.get(command, "absent") != sub:
            owners.setdefault(command, []).append(name)
print(json.dumps(owners))
"""


def test_the_map_names_every_module_that_adds_to_each_command() -> None:
    out = subprocess.run([sys.executable, "-c", DERIVE], capture_output=True, text=True, check=True).stdout
    owners = {command: tuple(modules) for command, modules in json.loads(out).items()}
    assert owners == cli.MODULES_BY_COMMAND


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
