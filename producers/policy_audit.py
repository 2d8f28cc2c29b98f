"""The record of every `gpuledger policy apply` (issue 41 item 1): who applied the policy to which engine, when, and
each setting it changed with its value before and after (policy.applied.v1, the `policy_applies` table, the fleet
page).

The changes are the structured differences `policy diff` finds just before the apply (producers/policy_slurm.py
`Drift`/`ConfDrift`, producers/policy_kueue.py `KueueDrift`): the engine's value before, the policy's after. What
still differs once it is done (a PriorityType that needs a slurmctld restart) is kept beside them. Who: the engine's
own idea of the caller, not a name anyone types: on Slurm the operating-system user the commands ran as (slurmdbd
trusts munge's uid), on Kubernetes the user the API server authenticated (a SelfSubjectReview).
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
from collections.abc import Iterable, Sequence
from typing import Any

from producers.policy_engine import Pruned
from producers.policy_kueue import KueueDrift, _label
from producers.policy_slurm import ConfDrift, Drift

MAX_VALUE_CHARS = 4000  # a Kueue object missing whole is recorded by name, its value bounded


def _value(value: Any) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text[:MAX_VALUE_CHARS]


def change(item: object) -> dict[str, str | None]:
    """One difference before the apply as the change the apply made: object, setting, before, after."""
    if isinstance(item, Drift):
        return {"object": f"{item.kind} {item.name}", "setting": "" if item.have is None else item.setting,
                "before": item.have, "after": item.want}  # fmt: skip
    if isinstance(item, ConfDrift):
        return {"object": "slurm.conf", "setting": item.setting, "before": item.have, "after": item.want}
    if isinstance(item, KueueDrift):
        return {"object": _label(item.key), "setting": item.path, "before": _value(item.have),
                "after": _value(item.want)}  # fmt: skip
    if isinstance(item, Pruned):
        return {"object": _label(item.key), "setting": "", "before": "present", "after": None}
    return {"object": "pricing", "setting": "", "before": None, "after": str(item)[:MAX_VALUE_CHARS]}


def applied_event(*, cluster: str, engine: str, actor: str, actor_source: str, policy_hash: str,
                  before: Iterable[object], still_differs: Sequence[str], now_ms: int) -> dict[str, Any]:  # fmt: skip
    """The policy.applied.v1 record (pure); its id is the hash of the rest, so a retried publish is stored once."""
    record: dict[str, Any] = {
        "ts_ms": now_ms, "cluster": cluster, "engine": engine, "actor": actor, "actor_source": actor_source,
        "policy_sha256": policy_hash, "changes": [change(item) for item in before],
        "still_differs": list(still_differs),
    }  # fmt: skip
    record["apply_id"] = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
    return record


def os_user() -> str:
    """The user this process runs as (the uid sacctmgr and scontrol present to Slurm through munge)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def kubernetes_user(custom_objects_api: Any) -> str:
    """The user the API server authenticated for these credentials (authentication.k8s.io/v1 SelfSubjectReview)."""
    from kubernetes import client

    from base.errors import ServiceError

    try:
        review = client.AuthenticationV1Api(custom_objects_api.api_client).create_self_subject_review(
            client.V1SelfSubjectReview())
    except Exception as exc:  # ApiException and transport errors: who applied must be known before anything is
        raise ServiceError(f"asking the API server who these credentials are: {exc}"[:500]) from exc
    user = review.status.user_info if review.status is not None else None
    if user is None or not user.username:
        raise ServiceError("the API server's SelfSubjectReview names no user: the apply cannot say who applied it")
    return str(user.username)
