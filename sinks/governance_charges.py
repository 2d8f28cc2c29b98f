"""Credits (appeals granted as credit) and reservation charges, as `sinks.statements.Charge` items, read from
ClickHouse: what `period close` routes onto statements. The stable entry point for readers such as the team
page; the work is in `sinks/governance.py`. Without a policy no decision can be judged, so there are none."""

from __future__ import annotations

from typing import Any

from base.errors import ConfigError
from base.settings import Settings
from schemas.policy import Policy
from sinks.statements import Charge


def charges(client: Any, policy: Policy | None = None, now_ms: int | None = None) -> list[Charge]:
    """Reservation lines count what has passed by `now_ms` (default: the wall clock)."""
    import time

    from sinks.governance import charges as judged

    return judged(client, policy, time.time_ns() // 1_000_000 if now_ms is None else now_ms)


def configured_charges(settings: Settings, client: Any, now_ms: int) -> list[Charge]:
    """`charges` under the settings' policy (policy_path). Without a policy no decision can be judged:
    refused when there is any, none otherwise. What `period close`, `statement show` and `report journal` use."""
    from schemas.policy import load_policy
    from sinks.governance import has_decisions

    if settings.policy_path is None:
        if has_decisions(client):
            raise ConfigError("appeals were decided but no policy is set to judge them: set policy_path "
                              "(GPULEDGER_POLICY_PATH)")  # fmt: skip
        return []
    return charges(client, load_policy(settings.policy_path), now_ms)
