"""The web application: Starlette routes over the pages, Jinja2 templates, every asset served from here.

Reads go through the read-only analyst user (the engine refuses anything else from it); the one write,
a correction of a job's project, is the existing `AttributionCorrection` event published to Kafka, never
SQL. Identity and scope: web/access.py. Request values: web/params.py.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from base.errors import GpuledgerError
from base.outputs import csv_text, mask_text
from producers.identity import DirectoryEntry
from producers.projects import Registry
from web import access, pages, params
from web.access import Forbidden, Viewer
from web.appeals import AppealService
from web.model import Table
from web.params import BadRequest
from web.queries import Warehouse, robots_of
from web.reservations import ReservationService

log = logging.getLogger("gpuledger.web")
HERE = Path(__file__).parent
DEMO_COOKIE = "gpuledger_demo_user"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


@dataclass
class WebContext:
    """What the app needs, built once at its start (web/context.py) or by a test."""

    warehouse: Callable[[], Warehouse]  # the analyst's warehouse
    lookup: Callable[[str], DirectoryEntry | None]
    registry: Registry | None
    publish_correction: Callable[[dict[str, Any]], None] | None
    cluster: str
    demo: bool = False
    demo_users: list[str] = field(default_factory=list)
    quota: dict[str, dict[str, int]] | None = None
    credits: Callable[[Any], list[Any]] = lambda _client: []  # credits and reservation charges a close routes
    policy: Any = None  # policy.yaml (schemas.policy.Policy): quota, and who decides appeals
    appeals: AppealService | None = None  # filing and deciding appeals (issue 19); None without a policy
    reservations: ReservationService | None = None  # requesting and approving reservations; None without a policy
    # The engines the reservation service puts approved reservations onto (sinks.reservations.engines); none: the
    # page says a reservation is recorded, approved and charged, and held on no scheduler.
    reservation_engines: tuple[str, ...] = ()
    trusted_proxies: tuple[str, ...] = ("127.0.0.1", "::1")
    user_header: str = "X-Forwarded-User"
    groups_header: str = "X-Forwarded-Groups"
    operator_groups: tuple[str, ...] = ("gpuledger-operators",)
    finance_groups: tuple[str, ...] = ("gpuledger-finance",)
    clock: Callable[[], float] = time.time
    # The fleet page's what-if (issue 43): (proposal, period, by, now_ms) -> `sinks.whatif.Comparison`, and the
    # proposals offered to pick by name; None: the form is off (settings: web.whatif).
    whatif: Callable[[Any, str, str, int], Any] | None = None
    whatif_choices: Callable[[], dict[str, Path]] = dict
    # The job page's resume button (issue 41): publishes a RESUME_ASKED step on appeals.v1 for `reclaim run`, which
    # holds the engine credentials this app never has; None without a policy (who may resume).
    publish_resume: Callable[[dict[str, Any]], None] | None = None
    # Deciding escalations (issue 41, web/escalations.py); None without a policy that allows them.
    escalations: Any = None
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    def now_ms(self) -> int:
        return int(self.clock() * 1000)


def shared_warehouse(connect: Callable[[], Any]) -> Callable[[], Warehouse]:
    """One analyst client for the app, made on first use. It has no session id, so its connection pool serves
    concurrent queries: every request thread's and a page's reads sent at once (`pages._READS`). One per server
    thread cost a new connection's handshake queries whenever the server started a thread for a request."""
    lock = threading.Lock()
    made: list[Warehouse] = []

    def get() -> Warehouse:
        with lock:
            if not made:
                made.append(Warehouse(connect()))
            return made[0]

    return get


# -- identity -------------------------------------------------------------------------------------


def viewer_of(request: Request, ctx: WebContext) -> Viewer | None:
    peer = request.client.host if request.client else None
    trusted = access.proxy_trusted(peer, ctx.trusted_proxies)
    header = request.headers.get(ctx.user_header) if trusted else None
    groups: frozenset[str] = frozenset()
    demo = False
    if header:
        user = params.user(header.strip())
        groups = access.parse_groups(request.headers.get(ctx.groups_header))
    elif ctx.demo and request.cookies.get(DEMO_COOKIE) in ctx.demo_users:  # anything else: nobody picked yet
        user, demo = str(request.cookies.get(DEMO_COOKIE)), True
    else:
        return None
    return access.viewer_for(user, ctx.lookup(user), proxy_groups=groups, operator_groups=ctx.operator_groups,
                             finance_groups=ctx.finance_groups, demo=demo)  # fmt: skip


# -- rendering ------------------------------------------------------------------------------------


def _templates() -> Environment:
    from web.format import FILTERS

    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(("html",)))
    env.filters.update(FILTERS)
    return env


TEMPLATES = _templates()


def render(request: Request, name: str, status: int = 200, **values: Any) -> HTMLResponse:
    ctx: WebContext = request.app.state.ctx
    viewer = getattr(request.state, "viewer", None)
    deciders = ctx.policy.governance.deciders if ctx.policy is not None else ()
    appeals_link = viewer is not None and ctx.policy is not None and (viewer.user in deciders or viewer.sees_everything)
    reservations_link = viewer is not None and ctx.reservations is not None and bool(
        viewer.teams or viewer.leads or viewer.sees_everything or viewer.user in ctx.policy.governance.operators)
    escalations_link = viewer is not None and ctx.escalations is not None and (
        viewer.user in ctx.escalations.deciders() or viewer.sees_everything)
    html = TEMPLATES.get_template(name).render(
        viewer=viewer, demo=ctx.demo, demo_users=ctx.demo_users, request_path=request.url.path,
        appeals_link=appeals_link, reservations_link=reservations_link, escalations_link=escalations_link,
        query=str(request.url.query), **{"cluster": ctx.cluster, **values},
    )  # fmt: skip
    return HTMLResponse(html, status_code=status)


def csv_download(table: Table, *parts: str) -> Response:
    header, rows = table.csv_rows()
    name = "-".join(re.sub(r"[^A-Za-z0-9._-]+", "_", p) for p in (*parts, table.name) if p)[:150]
    return Response(csv_text(header, rows), media_type="text/csv; charset=utf-8",
                    headers={"Content-Disposition": f'attachment; filename="{name}.csv"'})  # fmt: skip


def page_response(request: Request, page: pages.Page, template: str, *name_parts: str) -> Response:
    wanted = request.query_params.get("csv")
    if wanted is not None:
        table = page.tables.get(params.table_name(wanted))
        if table is None:
            raise BadRequest("no such table on this page")
        return csv_download(table, *name_parts)
    return render(request, template, page=page, tables=page.tables, **page.context)


# -- routes ---------------------------------------------------------------------------------------


def _need_viewer(request: Request) -> Viewer:
    viewer = request.state.viewer
    if viewer is None:
        raise HTTPException(401, "sign in through the proxy" if not request.app.state.ctx.demo else "pick a user")
    return viewer


def _need_team(viewer: Viewer, team: str) -> None:
    if not viewer.sees_team(team):
        raise Forbidden(f"{viewer.user} may not see team {team}: {viewer.scope}")


def home(request: Request) -> Response:
    ctx: WebContext = request.app.state.ctx
    viewer = request.state.viewer
    period = params.period(request.query_params.get("period"), ctx.now_ms())
    teams: list[Any] = []
    if viewer is not None:
        wh = ctx.warehouse()
        statements = wh.statements(period, closed=wh.closed(period), views=wh.priced_views(period))
        names = set(statements) | viewer.teams | viewer.leads
        teams = [(t, statements.get(t), pages.team_url(t, period)) for t in viewer.visible_teams(names)]
    return render(request, "home.html", period=period, teams=teams,
                  prev_url=f"/?period={period.previous().text}", next_url=f"/?period={period.next().text}")  # fmt: skip


def team(request: Request) -> Response:
    ctx: WebContext = request.app.state.ctx
    name = params.team(request.path_params["team"])
    period = params.period(request.query_params.get("period"), ctx.now_ms())
    only = params.cluster_filter(request.query_params.get("cluster"))
    _need_team(_need_viewer(request), name)
    wh = ctx.warehouse()
    page = pages.team_page(wh, name, period, ctx.now_ms(), ctx.quota, ctx.credits, only, robots_of(ctx.policy))
    if ctx.policy is not None:
        from web import appeals

        mine = [a for a in appeals.stored(wh.client, ctx.policy)
                if a.subject.team == name and only in (None, a.subject.cluster)]  # fmt: skip
        note = "Filed on a job's page; decided by the policy's deciders. A credit is a line of the statement."
        page.add(appeals.table("appeals", "Appeals", mine, note=note))
    return page_response(request, page, "team.html", name, *((only,) if only else ()), period.text)


def fleet(request: Request) -> Response:
    """Every team and the fleet's capacity evidence: operators and finance only."""
    ctx: WebContext = request.app.state.ctx
    viewer = _need_viewer(request)
    period = params.period(request.query_params.get("period"), ctx.now_ms())
    if not viewer.sees_everything:
        raise Forbidden(f"{viewer.user} may not see the fleet page (operators and finance): {viewer.scope}")
    page = pages.fleet_page(ctx.warehouse(), period)
    if ctx.whatif is not None:  # the what-if form is on, and whoever sees the fleet may use it (`_whatif_viewer`)
        page.context["whatif_url"] = f"/fleet/whatif?period={period.text}"
    return page_response(request, page, "fleet.html", "fleet", period.text)


# -- what if (issue 43): the fleet page's comparison of a proposed policy with the month as stored ------------------


def _whatif_viewer(request: Request) -> tuple[WebContext, Viewer]:
    ctx: WebContext = request.app.state.ctx
    viewer = _need_viewer(request)
    if not viewer.sees_everything:
        raise Forbidden(f"{viewer.user} may not run a what-if (operators and finance): {viewer.scope}")
    if ctx.whatif is None:
        raise BadRequest("the what-if form is off (settings: web.whatif)")
    return ctx, viewer


def _whatif_answer(request: Request, ctx: WebContext, viewer: Viewer, period: params.Period, by: str,
                   label: str | None, proposal: Any, csv: str | None) -> Response:  # fmt: skip
    """The form, and the comparison of `proposal` (a Policy, or the lines saying why it does not parse: nothing
    runs then) when one was given; `csv` names a table to download instead."""
    from web import whatif

    assert ctx.whatif is not None
    page = pages.Page("What if")
    problems: list[str] = proposal if isinstance(proposal, list) else []
    assumptions: tuple[str, ...] = ()
    if proposal is not None and not problems:
        comparison = ctx.whatif(proposal, period.text, by, ctx.now_ms())
        assumptions = tuple(comparison.assumptions)
        for table in whatif.tables(comparison, label or "the proposal"):
            page.add(table)
        if csv is not None:
            wanted = page.tables.get(params.table_name(csv))
            if wanted is None:
                raise BadRequest("no such table on this page")
            return csv_download(whatif.csv_table(wanted, period.text, assumptions), "whatif", label or "", period.text)
    elif csv is not None:
        raise BadRequest("no comparison to download: pick or upload a proposal that parses")
    page.context.update(period=period, by=by, by_choices=whatif.BY, label=label, problems=problems,
                        assumptions=assumptions, choices=sorted(ctx.whatif_choices()),
                        token=access.csrf_token(ctx.secret, viewer.user), max_kib=whatif.MAX_UPLOAD_BYTES // 1024,
                        prev_url=f"/fleet/whatif?period={period.previous().text}",
                        next_url=f"/fleet/whatif?period={period.next().text}")  # fmt: skip
    status = 400 if problems else 200
    return render(request, "whatif.html", status, page=page, tables=page.tables, **page.context)


def fleet_whatif(request: Request) -> Response:
    """The what-if form; with `?proposal=<name>` (the policy in force or a file of the configured folder) the
    comparison, `&csv=lines|events` its download."""
    from web import whatif

    ctx, viewer = _whatif_viewer(request)
    q = request.query_params
    period = params.period(q.get("period"), ctx.now_ms())
    by = whatif.by(q.get("by"))
    name = q.get("proposal")
    label, proposal = whatif.picked(name, ctx.whatif_choices()) if name else (None, None)
    return _whatif_answer(request, ctx, viewer, period, by, label, proposal, q.get("csv"))


async def fleet_whatif_post(request: Request) -> Response:
    """An uploaded proposal (at most the command's 1 MiB) or a picked one, compared; `csv` downloads instead."""
    from starlette.concurrency import run_in_threadpool
    from starlette.datastructures import UploadFile

    from web import whatif

    ctx, viewer = _whatif_viewer(request)
    length = request.headers.get("content-length", "")
    if not length.isdigit() or int(length) > whatif.MAX_UPLOAD_BYTES + 64 * 1024:
        raise BadRequest(f"a proposal is at most {whatif.MAX_UPLOAD_BYTES} bytes (and the request says its length)")
    form = await request.form(max_files=1, max_fields=8, max_part_size=4096)
    values = {k: str(v) for k in ("token", "period", "by", "proposal", "csv") if isinstance(v := form.get(k), str)}
    if not access.csrf_ok(ctx.secret, viewer.user, values.get("token")):
        raise Forbidden("the form has expired or did not come from this page; reload it and try again")
    period = params.period(values.get("period"), ctx.now_ms())
    by = whatif.by(values.get("by"))
    upload = form.get("file")
    if isinstance(upload, UploadFile) and upload.filename:
        data = await upload.read(whatif.MAX_UPLOAD_BYTES + 1)
        label, proposal = whatif.uploaded(upload.filename, data)
    else:
        label, proposal = whatif.picked(values.get("proposal"), ctx.whatif_choices())
    csv = values.get("csv") or None
    return await run_in_threadpool(_whatif_answer, request, ctx, viewer, period, by, label, proposal, csv)


def project(request: Request) -> Response:
    ctx: WebContext = request.app.state.ctx
    name = params.team(request.path_params["team"])
    pid = params.project(request.path_params["project"])
    period = params.period(request.query_params.get("period"), ctx.now_ms())
    only = params.cluster_filter(request.query_params.get("cluster"))
    _need_team(_need_viewer(request), name)
    page = pages.project_page(ctx.warehouse(), name, pid, period, only, params.page(request.query_params.get("page")),
                              "csv" in request.query_params)  # fmt: skip
    return page_response(request, page, "project.html", name, pid, *((only,) if only else ()), period.text)


def job(request: Request) -> Response:
    ctx: WebContext = request.app.state.ctx
    viewer = _need_viewer(request)
    cluster, job_id = params.cluster(request.path_params["cluster"]), params.job_id(request.path_params["job_id"])
    period = params.period(request.query_params.get("period"), ctx.now_ms())
    view = pages.JobView(period, params.day(request.query_params.get("day"), period),
                         params.page(request.query_params.get("page")), "csv" in request.query_params,
                         params.cluster_filter(request.query_params.get("cluster")))  # fmt: skip
    page = pages.job_page(ctx.warehouse(), cluster, job_id, view, robots_of(ctx.policy))
    if page is None:
        raise HTTPException(404, "no such job in the ledger")
    _need_team(viewer, page.context["team"])
    choices = _project_choices(viewer, ctx.registry, page.context["team"])
    _job_appeals(ctx, page, cluster, job_id)
    _job_resume(ctx, page, viewer, cluster, job_id, request.query_params.get("resume"))
    _job_escalations(ctx, page, viewer, cluster, job_id, request.query_params.get("escalated"))
    return page_response(
        request, _with_form(page, viewer, ctx, choices, request.query_params.get("corrected"),
                            request.query_params.get("appealed")),
        "job.html", cluster, job_id.replace("/", "_"), period.text,
    )


def _job_appeals(ctx: WebContext, page: pages.Page, cluster: str, job_id: str) -> None:
    """The job's appeals, and what an appeal may name: its charge in the month or one of its idle alerts."""
    page.context.update(appeals_on=ctx.appeals is not None, appeal_alerts=[])
    if ctx.appeals is None:
        return
    from web import appeals

    wh = ctx.warehouse()
    here = (cluster, job_id)
    mine = [a for a in appeals.stored(wh.client, ctx.policy) if (a.subject.cluster, a.subject.job_id) == here]
    page.add(appeals.table("appeals", "Appeals on this job", mine))
    page.context["appeal_alerts"] = wh.job_alerts(cluster, job_id)


def _job_resume(ctx: WebContext, page: pages.Page, viewer: Viewer, cluster: str, job_id: str,
                asked: str | None) -> None:  # fmt: skip
    """The resume button: shown when gpuledger reclaimed the job and the viewer may resume it (its user, a lead of
    its team, an operator of the policy), with the reclaims and resumes recorded so far."""
    from web.queries import resume_outcomes, resume_standing

    page.context.update(resume_on=False, resume_refusal=None, reclaimed=None, resume_steps=[],
                        resume_asked=asked if asked and re.fullmatch(r"[0-9a-f]{32}", asked) else None)  # fmt: skip
    if ctx.publish_resume is None or ctx.policy is None:
        return
    client = ctx.warehouse().client
    _, reclaimed, refusal = resume_standing(client, ctx.policy, cluster, job_id, viewer.user)
    page.context.update(resume_on=True, resume_refusal=refusal, reclaimed=reclaimed,
                        resume_steps=resume_outcomes(client, cluster, job_id) if reclaimed else [])  # fmt: skip


def _job_escalations(ctx: WebContext, page: pages.Page, viewer: Viewer, cluster: str, job_id: str,
                     asked: str | None) -> None:  # fmt: skip
    """The job's escalations (as the sink stored them) and the "ask for escalation" form, or the rules' one line
    saying why this viewer may not ask (web/escalations.py)."""
    from schemas.governance_escalations import fold
    from web import escalations
    from web.queries import escalation_job, job_escalation_events

    page.context.update(escalate_on=False, escalate_refusal=None,
                        escalated=asked if asked and re.fullmatch(r"esc-[0-9a-f]{12}", asked) else None)  # fmt: skip
    if ctx.escalations is None or ctx.policy is None:
        return
    client = ctx.warehouse().client
    mine = fold(job_escalation_events(client, cluster, job_id), ctx.policy)[0].values()
    page.add(escalations.table("escalations", "Escalations of this job", mine))
    job, ended = escalation_job(client, cluster, job_id)
    page.context.update(escalate_on=True, escalation_rules=ctx.policy.governance.escalations,
                        escalate_refusal=escalations.ask_refusal(ctx.policy, job, ended, viewer.user, cluster,
                                                                 job_id))  # fmt: skip


async def escalation_ask(request: Request) -> Response:
    return await _form_action(request, ("cluster", "job_id", "hours", "reason", "token", "period"), _escalation_ask,
                              need="escalations")  # fmt: skip


def _escalation_ask(request: Request, ctx: WebContext, viewer: Viewer, values: dict[str, str]) -> Response:
    """Ask to raise the job from its page: the REQUESTED step on escalations.v1, as `escalate ask` publishes it."""
    from web.queries import escalation_job

    cluster, job_id = params.cluster(values["cluster"]), params.job_id(values["job_id"])
    job, ended = escalation_job(ctx.warehouse().client, cluster, job_id)
    event = ctx.escalations.ask(viewer, values, job, ended, ctx.now_ms())
    period = params.period(values["period"], ctx.now_ms())
    return RedirectResponse(pages.job_url(cluster, job_id, period, escalated=event["escalation_id"]), status_code=303)


async def resume(request: Request) -> Response:
    return await _form_action(request, ("cluster", "job_id", "token", "period"), _resume, need="publish_resume")


def _resume(request: Request, ctx: WebContext, viewer: Viewer, values: dict[str, str]) -> Response:
    """Ask `reclaim run` to resume a job gpuledger reclaimed: refused (403, one line) for anyone `may_resume` refuses;
    a job gpuledger did not reclaim is a 400 saying so. The worker judges the request again and applies it once."""
    from web.queries import resume_asked, resume_standing

    assert ctx.publish_resume is not None
    cluster, job_id = params.cluster(values["cluster"]), params.job_id(values["job_id"])
    owner, reclaimed, refusal = resume_standing(ctx.warehouse().client, ctx.policy, cluster, job_id, viewer.user)
    if refusal is not None:
        raise Forbidden(refusal)
    if reclaimed is None:
        raise BadRequest(f"job {job_id} on {cluster} was not reclaimed by gpuledger: nothing to resume")
    event = resume_asked(cluster, job_id, viewer.user, owner, ctx.now_ms())
    ctx.publish_resume(event)
    period = params.period(values["period"], ctx.now_ms())
    return RedirectResponse(pages.job_url(cluster, job_id, period, resume=event["event_id"]), status_code=303)


def _project_choices(viewer: Viewer, registry: Registry | None, job_team: str) -> list[str]:
    if registry is None:
        return []
    if viewer.operator or job_team in viewer.leads:
        return registry.active_ids()
    return [p for p in registry.active_ids() if registry.projects[p].admits(viewer.user, viewer.teams)]


def _with_form(page: pages.Page, viewer: Viewer, ctx: WebContext, choices: list[str], corrected: str | None,
               appealed: str | None) -> pages.Page:  # fmt: skip
    page.context.update(
        choices=[p for p in choices if p != page.context["project"]],
        token=access.csrf_token(ctx.secret, viewer.user), registry_known=ctx.registry is not None,
        can_publish=ctx.publish_correction is not None,
        corrected=corrected if corrected and re.fullmatch(r"[0-9a-f]{32}", corrected) else None,
        period_text=page.context["period"].text,
        appealed=appealed if appealed and re.fullmatch(r"ap-[0-9a-f]{12}", appealed) else None,
    )  # fmt: skip
    return page


async def correct(request: Request) -> Response:
    from starlette.concurrency import run_in_threadpool

    form = await request.form(max_files=0, max_fields=16, max_part_size=4096)
    values = {k: str(form.get(k) or "") for k in ("cluster", "job_id", "project", "reason", "token", "period")}
    return await run_in_threadpool(_correct, request, values)


def _correct(request: Request, values: dict[str, str]) -> Response:
    from web.corrections import submit

    ctx: WebContext = request.app.state.ctx
    viewer = _need_viewer(request)
    if not access.csrf_ok(ctx.secret, viewer.user, values["token"]):
        raise Forbidden("the form has expired or did not come from this page; reload it and try again")
    record = submit(ctx, viewer, values)
    period = params.period(values["period"], ctx.now_ms())
    url = pages.job_url(record["cluster"], record["job_id"], period, corrected=record["correction_id"])
    return RedirectResponse(url, status_code=303)


async def appeal_file(request: Request) -> Response:
    return await _form_action(request, ("cluster", "job_id", "alert_id", "reason", "token", "period"), _appeal_file)


async def appeal_decide(request: Request) -> Response:
    fields = ("appeal_id", "decision", "amount", "hours", "note", "token", "period")
    return await _form_action(request, fields, _appeal_decide)


FormAction = Callable[[Request, "WebContext", Viewer, dict[str, str]], Response]


async def _form_action(request: Request, fields: tuple[str, ...], action: FormAction,
                       need: str = "appeals") -> Response:  # fmt: skip
    """A bounded form, the viewer and their form token checked, then the action in a worker thread."""
    from starlette.concurrency import run_in_threadpool

    form = await request.form(max_files=0, max_fields=16, max_part_size=4096)
    values = {k: str(form.get(k) or "") for k in fields}
    ctx: WebContext = request.app.state.ctx
    viewer = _need_viewer(request)
    if not access.csrf_ok(ctx.secret, viewer.user, values["token"]):
        raise Forbidden("the form has expired or did not come from this page; reload it and try again")
    if getattr(ctx, need) is None:
        raise BadRequest(f"{need} need the policy (settings: policy_path): who decides, deadlines, limits")
    return await run_in_threadpool(action, request, ctx, viewer, values)


def _appeal_file(request: Request, ctx: WebContext, viewer: Viewer, values: dict[str, str]) -> Response:
    assert ctx.appeals is not None
    event = ctx.appeals.file(ctx.warehouse().client, viewer, values, ctx.now_ms())
    period = params.period(values["period"], ctx.now_ms())
    url = pages.job_url(event["cluster"], event["job_id"], period, appealed=event["appeal_id"])
    return RedirectResponse(url, status_code=303)


def _appeal_decide(request: Request, ctx: WebContext, viewer: Viewer, values: dict[str, str]) -> Response:
    assert ctx.appeals is not None
    event = ctx.appeals.decide(viewer, values, ctx.now_ms())
    return RedirectResponse(f"/appeals?decided={event['appeal_id']}", status_code=303)


def appeals_page(request: Request) -> Response:
    """The deciders' page: every appeal still to decide (escalated first), and the decided ones."""
    from web import appeals

    ctx: WebContext = request.app.state.ctx
    viewer = _need_viewer(request)
    if ctx.policy is None:
        raise BadRequest("appeals need the policy (settings: policy_path)")
    decider = viewer.user in ctx.policy.governance.deciders
    if not (decider or viewer.sees_everything):
        raise Forbidden(f"{viewer.user} does not decide appeals (policy governance.appeals.deciders)")
    every = appeals.stored(ctx.warehouse().client, ctx.policy)
    page = pages.Page("Appeals")
    page.add(appeals.table("open", "To decide", [a for a in every if not a.decision],
                           note="Escalated ones are past the policy's deadline."))  # fmt: skip
    page.add(appeals.table("decided", "Decided", [a for a in every if a.decision]))
    decided = request.query_params.get("decided")
    page.context.update(decider=decider, token=access.csrf_token(ctx.secret, viewer.user),
                        rules=ctx.policy.governance.appeals,
                        decided=decided if decided and re.fullmatch(r"ap-[0-9a-f]{12}", decided) else None)  # fmt: skip
    return page_response(request, page, "appeals.html", "appeals")


def escalations_page(request: Request) -> Response:
    """The deciders' page for escalations: those to decide, those in force, those over (web/escalations.py)."""
    from web import escalations

    ctx: WebContext = request.app.state.ctx
    viewer = _need_viewer(request)
    if ctx.escalations is None:
        raise BadRequest("escalations need a policy with governance.escalations (settings: policy_path)")
    named = escalations.deciders(ctx.policy)
    decider = viewer.user in named
    if not (decider or viewer.sees_everything):
        raise Forbidden(f"{viewer.user} does not decide escalations (policy governance.escalations.deciders: "
                        f"{', '.join(named) or 'none named'})")  # fmt: skip
    now = ctx.now_ms()
    every = list(ctx.escalations.current().values())
    page = pages.Page("Escalations")
    page.add(escalations.table("open", "To decide", [e for e in every if e.decision is None and e.in_force(now)]))
    page.add(escalations.table("live", "Granted, in force", [e for e in every if e.decision and e.in_force(now)]))
    page.add(escalations.table("over", "Over (denied, lapsed, fallen back)", [e for e in every if not e.in_force(now)]))
    decided = request.query_params.get("decided") or ""
    page.context.update(decider=decider, deciders=named, token=access.csrf_token(ctx.secret, viewer.user),
                        rules=ctx.policy.governance.escalations,
                        decided=decided if re.fullmatch(r"esc-[0-9a-f]{12}", decided) else None)  # fmt: skip
    return page_response(request, page, "escalations.html", "escalations")


async def escalation_decide(request: Request) -> Response:
    return await _form_action(request, ("escalation_id", "decision", "note", "token"), _escalation_decide,
                              need="escalations")  # fmt: skip


def _escalation_decide(request: Request, ctx: WebContext, viewer: Viewer, values: dict[str, str]) -> Response:
    event = ctx.escalations.decide(viewer, values, ctx.now_ms())
    return RedirectResponse(f"/escalations?decided={event['escalation_id']}", status_code=303)


def reservations_page(request: Request) -> Response:
    """Reservations: operators see every one and approve, deny or release; a member sees their teams' and asks."""
    from web import reservations

    ctx: WebContext = request.app.state.ctx
    viewer = _need_viewer(request)
    if ctx.reservations is None:
        raise BadRequest("reservations need the policy (settings: policy_path)")
    operator = reservations.may_operate(viewer, ctx.policy)
    if not (operator or viewer.teams or viewer.leads or viewer.sees_everything):
        raise Forbidden(f"{viewer.user} may not see reservations: {viewer.scope}")
    mine = ctx.reservations.visible(viewer) if not operator else list(ctx.reservations.current().values())
    page = pages.Page("Reservations")
    waiting = [r for r in mine if r.live and not r.approved_by]
    page.add(reservations.table("pending", "Waiting for an operator", waiting))
    page.add(reservations.table("active", "Approved, not ended", [r for r in mine if r.live and r.approved_by]))
    page.add(reservations.table("ended", "Ended (released, denied or expired)", [r for r in mine if not r.live]))
    done = request.query_params.get("done")
    teams = sorted(t.name for t in ctx.policy.teams if operator or t.name in viewer.teams | viewer.leads)
    page.context.update(operator=operator, token=access.csrf_token(ctx.secret, viewer.user), teams=teams,
                        generations=sorted(ctx.policy.generations), rules=ctx.policy.governance.reservations,
                        default_cluster=ctx.cluster, engines=ctx.reservation_engines,
                        done=done if done and re.fullmatch(r"rsv-[0-9a-f]{10}", done) else None)  # fmt: skip
    return page_response(request, page, "reservations.html", "reservations")


async def reservation_request(request: Request) -> Response:
    fields = ("team", "cluster", "generation", "gpus", "hours", "start", "nodes", "reason", "token")
    return await _form_action(request, fields, _reservation_request, need="reservations")


async def reservation_act(request: Request) -> Response:
    return await _form_action(request, ("reservation_id", "action", "note", "token"), _reservation_act,
                              need="reservations")  # fmt: skip


def _reservation_request(request: Request, ctx: WebContext, viewer: Viewer, values: dict[str, str]) -> Response:
    assert ctx.reservations is not None
    steps = ctx.reservations.request(viewer, values, ctx.cluster, ctx.now_ms())
    return RedirectResponse(f"/reservations?done={steps[0]['reservation_id']}", status_code=303)


def _reservation_act(request: Request, ctx: WebContext, viewer: Viewer, values: dict[str, str]) -> Response:
    assert ctx.reservations is not None
    event = ctx.reservations.act(viewer, values, ctx.now_ms())
    return RedirectResponse(f"/reservations?done={event['reservation_id']}", status_code=303)


def demo_pick(request: Request) -> Response:
    ctx: WebContext = request.app.state.ctx
    if not ctx.demo:
        raise HTTPException(404, "demo mode is off")
    user = params.user(request.query_params.get("user"))
    if user not in ctx.demo_users:
        raise BadRequest("not a user of the demo directory")
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(DEMO_COOKIE, user, httponly=True, samesite="strict", path="/")
    return response


def healthz(_: Request) -> Response:
    return PlainTextResponse("ok")


# -- errors and headers ---------------------------------------------------------------------------


class Guard(BaseHTTPMiddleware):
    """Who is asking (once per request), the security headers on every answer, and errors as pages."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        try:
            request.state.viewer = None
            request.state.viewer = viewer_of(request, request.app.state.ctx)
            response = await call_next(request)
        except BadRequest as exc:
            response = render(request, "error.html", 400, title="Bad request", message=str(exc))
        except Forbidden as exc:
            response = render(request, "error.html", 403, title="Not yours to see", message=str(exc))
        except GpuledgerError as exc:
            log.warning("web: %s", mask_text(str(exc)))
            response = render(request, "error.html", 503, title="The ledger cannot be read right now",
                              message=mask_text(str(exc))[:300])  # fmt: skip
        except Exception as exc:
            if not _warehouse_error(exc):
                raise
            # The warehouse's own message can quote the statement: the log has it (masked), the page does not.
            log.warning("web: ClickHouse: %s", mask_text(" ".join(str(exc).split()))[:500])
            why = "ClickHouse did not answer this page's query; the server's log says why."
            response = render(request, "error.html", 503, title="The ledger cannot be read right now", message=why)
        for key, value in SECURITY_HEADERS.items():
            response.headers.setdefault(key, value)
        return response


def _warehouse_error(exc: Exception) -> bool:
    from clickhouse_connect.driver.exceptions import ClickHouseError

    return isinstance(exc, ClickHouseError)


async def http_error(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 500)
    detail = getattr(exc, "detail", "error")
    titles = {401: "Who are you?", 404: "Not found", 405: "Not allowed"}
    return render(request, "error.html", status, title=titles.get(status, "Error"), message=str(detail))


def create_app(ctx: WebContext) -> Starlette:
    routes = [
        Route("/", home),
        Route("/healthz", healthz),
        Route("/demo", demo_pick),
        Route("/fleet", fleet),
        Route("/fleet/whatif", fleet_whatif),
        Route("/fleet/whatif", fleet_whatif_post, methods=["POST"]),
        Route("/teams/{team}", team),
        Route("/teams/{team}/projects/{project}", project),
        Route("/jobs/{cluster}/{job_id:path}", job),
        Route("/corrections", correct, methods=["POST"]),
        Route("/resume", resume, methods=["POST"]),
        Route("/appeals", appeals_page),
        Route("/appeals/file", appeal_file, methods=["POST"]),
        Route("/appeals/decide", appeal_decide, methods=["POST"]),
        Route("/escalations", escalations_page),
        Route("/escalations/decide", escalation_decide, methods=["POST"]),
        Route("/escalations/ask", escalation_ask, methods=["POST"]),
        Route("/reservations", reservations_page),
        Route("/reservations/request", reservation_request, methods=["POST"]),
        Route("/reservations/act", reservation_act, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(Guard)], exception_handlers={HTTPException: http_error})
    app.state.ctx = ctx
    return app
