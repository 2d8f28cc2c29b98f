"""A correction of a job's project from the browser: checked, then published as the existing
`AttributionCorrection` event (`attribution.corrections.v1`), the same record `gpuledger attribution correct`
publishes. Nothing is written to ClickHouse from here: the sink stores the event, and the views charge the
job to its latest correction from then on.
"""

from __future__ import annotations

from typing import Any

from producers.corrections import correction_record
from web import access, params
from web.access import Forbidden, Viewer


class CorrectionRefused(params.BadRequest):
    pass


def submit(ctx: Any, viewer: Viewer, values: dict[str, str]) -> dict[str, Any]:
    """Check and publish; returns the published record. `ctx` is the app's WebContext."""
    cluster, job_id = params.cluster(values["cluster"]), params.job_id(values["job_id"])
    new_project = params.project(values["project"])
    reason = params.reason(values["reason"])
    if ctx.registry is None:
        raise CorrectionRefused("no project registry is configured, so a correction cannot be checked")
    if ctx.publish_correction is None:
        raise CorrectionRefused("this server does not publish corrections")
    job = _job(ctx, cluster, job_id)
    if job is None:
        raise CorrectionRefused("no such job in the ledger")
    team, old_project = job
    if not viewer.sees_team(team):
        raise Forbidden(f"{viewer.user} may not see team {team}")
    refusal = access.correction_refusal(viewer, team, old_project, new_project, ctx.registry)
    if refusal is not None:
        raise Forbidden(refusal)
    by = f"{viewer.user} (web demo)" if viewer.demo else viewer.user
    record = correction_record(cluster, job_id, new_project, reason, by, old_project, ctx.now_ms())
    ctx.publish_correction(record)
    return record


def _job(ctx: Any, cluster: str, job_id: str) -> tuple[str, str | None] | None:
    """The job's team and the project it is charged to now (its latest correction, else its events')."""
    wh = ctx.warehouse()
    info = wh.job(cluster, job_id)
    if info is None:
        return None
    corrections = wh.corrections(cluster, job_id)
    latest = corrections[-1]["new_project"] if corrections else None
    return str(info.get("team") or ""), latest or (str(info["project"]) if info.get("project") else None)
