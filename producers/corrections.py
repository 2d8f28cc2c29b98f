"""The `AttributionCorrection` record: a job's project changed by a new audited event, never an edit.

Built here once for every way a correction is made (`gpuledger attribution correct`, the team page).
"""

from __future__ import annotations

import hashlib
from typing import Any


def correction_record(
    cluster: str, job_id: str, project: str, reason: str, corrected_by: str, old_project: str | None, ts_ms: int
) -> dict[str, Any]:
    """An `AttributionCorrection`; its id is deterministic so a retried publish de-duplicates."""
    text = "\x1f".join((cluster, job_id, old_project or "", project, reason, corrected_by, str(ts_ms)))
    return {
        "correction_id": hashlib.sha256(text.encode()).hexdigest()[:32],
        "ts_ms": ts_ms,
        "cluster": cluster,
        "job_id": job_id,
        "old_project": old_project,
        "new_project": project,
        "reason": reason,
        "corrected_by": corrected_by,
    }
