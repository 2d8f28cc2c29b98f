"""Checks `gpuledger up` makes before starting anything."""

from __future__ import annotations

import re

import pytest

from base.errors import ConfigError
from base.settings import BrokerSettings, KafkaSettings, Settings
from stack.local import check_broker_address


def test_local_broker_must_be_what_clients_use(tmp_path):
    s = Settings(
        state_dir=tmp_path,
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:19092"),
        broker=BrokerSettings(port=29092),
    )
    with pytest.raises(ConfigError, match=re.escape("127.0.0.1:29092 but clients use 127.0.0.1:19092")):
        check_broker_address(s)


def test_matching_or_external_broker_is_fine(tmp_path):
    check_broker_address(
        Settings(state_dir=tmp_path, kafka=KafkaSettings(bootstrap_servers="127.0.0.1:19092"), broker=BrokerSettings())
    )
    check_broker_address(
        Settings(
            state_dir=tmp_path,
            kafka=KafkaSettings(bootstrap_servers="kafka-1:9092,kafka-2:9092"),
            broker=BrokerSettings(enabled=False),
        )
    )


def test_status_tables_print_details_as_text():
    from rich.console import Console

    from stack.present import components_table
    from stack.supervisor import ComponentStatus

    detail = "exited with code 1; [/] [bold]see[/bold] /tmp/[x].log"
    row = ComponentStatus(name="sinks", description="", enabled=True, state="failed", detail=detail)
    console = Console(width=200, record=True, color_system=None)
    console.print(components_table([row]))
    assert detail in console.export_text()


def test_every_components_command_is_part_of_the_build():
    """`up`/`status` start and judge each component by its command without asking the command tree (a call of
    `gpuledger` registers only its own command's modules): every component's command is a registered command.
    Looked up in a fresh interpreter: registering the modules again here would change the groups they share."""
    import json
    import subprocess
    import sys

    from stack.components import COMPONENTS

    code = (
        "import json, sys, typer.main\n"
        "from gpuledger import cli\n"
        "cli._register_all()\n"
        "root = typer.main.get_command(cli.app)\n"
        "def found(path):\n"
        "    cmd = root\n"
        "    for part in path:\n"
        "        cmd = getattr(cmd, 'commands', {}).get(part)\n"
        "        if cmd is None:\n"
        "            return False\n"
        "    return True\n"
        "print(json.dumps([found(p) for p in json.loads(sys.argv[1])]))\n"
    )
    commands = [list(c.command) for c in COMPONENTS if c.command is not None]
    assert ["clickhouse", "serve"] in commands and ["sink", "run"] in commands
    out = subprocess.run([sys.executable, "-c", code, json.dumps(commands)], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    assert dict(zip(map(tuple, commands), json.loads(out), strict=True)) == {tuple(c): True for c in commands}
