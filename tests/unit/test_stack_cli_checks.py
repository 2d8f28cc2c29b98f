"""Checks `gpuledger up` makes before starting anything."""

from __future__ import annotations

import re

import pytest

from base.errors import ConfigError
from base.settings import BrokerSettings, KafkaSettings, Settings
from stack.cli import _check_broker_address


def test_local_broker_must_be_what_clients_use(tmp_path):
    s = Settings(
        state_dir=tmp_path,
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:19092"),
        broker=BrokerSettings(port=29092),
    )
    with pytest.raises(ConfigError, match=re.escape("127.0.0.1:29092 but clients use 127.0.0.1:19092")):
        _check_broker_address(s)


def test_matching_or_external_broker_is_fine(tmp_path):
    _check_broker_address(
        Settings(state_dir=tmp_path, kafka=KafkaSettings(bootstrap_servers="127.0.0.1:19092"), broker=BrokerSettings())
    )
    _check_broker_address(
        Settings(
            state_dir=tmp_path,
            kafka=KafkaSettings(bootstrap_servers="kafka-1:9092,kafka-2:9092"),
            broker=BrokerSettings(enabled=False),
        )
    )


def test_status_tables_print_details_as_text():
    from rich.console import Console

    from stack.cli import _components_table
    from stack.supervisor import ComponentStatus

    detail = "exited with code 1; [/] [bold]see[/bold] /tmp/[x].log"
    row = ComponentStatus(name="sinks", description="", enabled=True, state="failed", detail=detail)
    console = Console(width=200, record=True, color_system=None)
    console.print(_components_table([row]))
    assert detail in console.export_text()
