"""Reservations (schemas/governance_reservations.py, sinks/reservations.py): checked against the policy, approved
at once or by an operator, extended, released, expired and taken off the engines when due, idle ones warned then
released; Slurm's argv and Kueue's quota from stand-ins. Live Slurm: tests/integration/test_reservations_live.py."""

from __future__ import annotations

from typing import Any

import pytest

from base.errors import ConfigError, ServiceError
from schemas.governance_reservations import (
    HOUR_MS,
    MINUTE_MS,
    SERVICE_ACTOR,
    approve_event,
    due,
    extend_event,
    fold,
    month_windows,
    release_event,
    request_events,
    reserved_seconds,
)
from schemas.models import validate
from schemas.policy import parse_policy
from sinks.reservations import KueueQuota, SlurmReservations, choose_nodes, parse_nodes, reconcile

POLICY = parse_policy("""
version: 1
generations: {hopper: {slurm_gres: h100, kueue_flavor: h100, fleet_gpus: 4}}
tiers: [{name: research, priority: 100}]
governance:
  operators: [ops1]
  reservations: {max_hours: 72, max_lead_days: 7, auto_approve_gpus: 2, auto_approve_hours: 24,
                 idle_warn_minutes: 30, idle_release_minutes: 60}
teams:
  - {name: vision, members: [alice], quota: {hopper: 2}, borrowing_limit: {hopper: 1}}
  - {name: nlp, members: [carol], quota: {hopper: 1}}
""")
T0 = 1_796_000_000_000


def ask(existing: dict[str, Any] | None = None, **kw: Any) -> list[dict[str, Any]]:
    args: dict[str, Any] = dict(cluster="c1", team="vision", generation="hopper", gpus=2, nodes=[], start_ms=T0,
                                end_ms=T0 + 4 * HOUR_MS, reason="paper deadline", requester="alice", now_ms=T0)
    args.update(kw)
    return request_events(existing or {}, POLICY, **args)


def state(*events: dict[str, Any]) -> dict[str, Any]:
    return fold(events, POLICY)[0]


def test_within_policy_is_approved_at_once_above_it_waits_for_an_operator() -> None:
    requested, approved = ask()
    for e in (requested, approved):
        validate("reservations", e)
    assert (requested["event_type"], approved["event_type"], approved["actor"]) == ("REQUESTED", "APPROVED",
                                                                                     SERVICE_ACTOR)  # fmt: skip
    (big,) = ask(gpus=3)  # above auto_approve_gpus
    rid = big["reservation_id"]
    assert state(big)[rid].state == "REQUESTED"
    with pytest.raises(ConfigError, match="may not approve"):
        approve_event(state(big), POLICY, rid, "alice", T0)
    ok = approve_event(state(big), POLICY, rid, "ops1", T0 + 1)
    assert state(big, ok)[rid].approved_by == "ops1"
    with pytest.raises(ConfigError, match="already approved"):
        approve_event(state(big, ok), POLICY, rid, "ops1", T0 + 2)


@pytest.mark.parametrize(("kw", "needle"), [
    ({"team": "ghost"}, "unknown team 'ghost'"),
    ({"generation": "ampere"}, "unknown generation 'ampere'"),
    ({"requester": "carol"}, "may not reserve for vision"),
    ({"gpus": 4}, "may reserve 1..3 hopper GPUs"),
    ({"gpus": 0}, "may reserve 1..3"),
    ({"start_ms": T0 - HOUR_MS}, "in the past"),
    ({"start_ms": T0 + 8 * 24 * HOUR_MS, "end_ms": T0 + 8 * 24 * HOUR_MS + HOUR_MS}, "more than 7 days ahead"),
    ({"end_ms": T0 + 73 * HOUR_MS}, "at most 72 hours"),
    ({"reason": " "}, "--reason must not be empty"),
])  # fmt: skip
def test_requests_over_policy_are_one_line_refusals(kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as info:
        ask(**kw)
    assert "\n" not in str(info.value)


def test_no_overlap_within_a_team_and_never_more_than_the_fleet() -> None:
    first = state(*ask())
    with pytest.raises(ConfigError, match="overlapping reservation rsv-"):
        ask(first, gpus=1, start_ms=T0 + HOUR_MS, now_ms=T0 + 1)
    ask(first, gpus=1, start_ms=T0 + 4 * HOUR_MS, end_ms=T0 + 5 * HOUR_MS, now_ms=T0 + 1)  # after it: fine
    # vision 2 and nlp 1 of the fleet's 4 hopper GPUs over [T0, T0 + 4 h): a third team gets 1 more, not 2.
    three = parse_policy(THREE_TEAMS)
    held = fold([*ask(), *ask(first, team="nlp", gpus=1, requester="carol", now_ms=T0 + 2)], three)[0]
    assert len(held) == 2
    ml = dict(cluster="c1", team="ml", generation="hopper", nodes=[], start_ms=T0 + HOUR_MS, end_ms=T0 + 2 * HOUR_MS,
              reason="r", requester="mo", now_ms=T0 + 4)  # fmt: skip
    request_events(held, three, gpus=1, **ml)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="5 hopper GPUs would be reserved at once; the fleet has 4"):
        request_events(held, three, gpus=2, **ml)  # type: ignore[arg-type]


THREE_TEAMS = """
version: 1
generations: {hopper: {slurm_gres: h100, kueue_flavor: h100, fleet_gpus: 4}}
tiers: [{name: research, priority: 100}]
governance: {operators: [ops1]}
teams:
  - {name: vision, members: [alice], quota: {hopper: 2}, borrowing_limit: {hopper: 1}}
  - {name: nlp, members: [carol], quota: {hopper: 1}}
  - {name: ml, members: [mo], quota: {hopper: 1}, borrowing_limit: {hopper: 2}}
"""


def test_extend_release_and_forged_steps() -> None:
    events = ask()
    rid = events[0]["reservation_id"]
    now = state(*events)
    ext = extend_event(now, POLICY, rid, "alice", 2, T0 + HOUR_MS)
    assert state(*events, ext)[rid].end_ms == T0 + 6 * HOUR_MS
    with pytest.raises(ConfigError, match="at most 72 hours, extensions included"):
        extend_event(now, POLICY, rid, "alice", 69, T0 + HOUR_MS)
    with pytest.raises(ConfigError, match="may not extend"):
        extend_event(now, POLICY, rid, "carol", 1, T0 + HOUR_MS)
    rel = release_event(state(*events, ext), POLICY, rid, "alice", T0 + 2 * HOUR_MS)
    done = state(*events, ext, rel)[rid]
    assert done.state == "RELEASED" and done.until_ms() == T0 + 2 * HOUR_MS
    with pytest.raises(ConfigError, match="has already ended"):
        release_event(state(*events, ext, rel), POLICY, rid, "alice", T0 + 3 * HOUR_MS)
    # A request written past the commands that breaks the policy, and an approval by a non-operator: ignored.
    forged = {**ask(gpus=3)[0], "gpus": 4, "event_id": "f1"}
    forged_ok = {**ask(gpus=3, now_ms=T0 + 9)[0], "event_id": "f2"}
    bad_approval = {**forged_ok, "event_id": "f3", "event_type": "APPROVED", "actor": "alice"}
    got, ignored = fold([forged, forged_ok, bad_approval], POLICY)
    assert set(got) == {forged_ok["reservation_id"]} and got[forged_ok["reservation_id"]].approved_by is None
    assert [i.event_id for i in ignored] == ["f1", "f3"]


def test_the_service_renders_expires_removes_and_releases_idle() -> None:
    events = ask(start_ms=T0 + HOUR_MS, end_ms=T0 + 3 * HOUR_MS)
    rid = events[0]["reservation_id"]
    now = state(*events)
    early = due(now, T0, ["SLURM", "KUEUE"])
    assert [(e, r.reservation_id) for e, r in early.render] == [("SLURM", rid)] and not early.events  # Kueue at start
    rendered = [{**events[1], "event_id": f"r-{e}", "event_type": "RENDERED", "engine": e, "engine_ref": "x",
                 "ts_ms": T0 + 1, "actor": SERVICE_ACTOR} for e in ("SLURM", "KUEUE")]  # fmt: skip
    on = state(*events, *rendered)
    assert due(on, T0 + 2 * HOUR_MS, ["SLURM", "KUEUE"]).render == ()
    idle = due(on, T0 + 2 * HOUR_MS, ["SLURM"], {rid: 31}, POLICY)
    assert [e["event_type"] for e in idle.events] == ["IDLE_WARNED"]
    released = due(on, T0 + 2 * HOUR_MS, ["SLURM", "KUEUE"], {rid: 60}, POLICY)
    assert [e["event_type"] for e in released.events] == ["RELEASED"]
    assert sorted(e for e, _ in released.remove) == ["KUEUE", "SLURM"]
    late = due(on, T0 + 3 * HOUR_MS, ["SLURM", "KUEUE"])
    assert [(e["event_type"], e["ts_ms"]) for e in late.events] == [("EXPIRED", T0 + 3 * HOUR_MS)]
    assert sorted(e for e, _ in late.remove) == ["KUEUE", "SLURM"]
    validate("reservations", late.events[0])
    gone = state(*events, *rendered, *late.events)
    assert gone[rid].state == "EXPIRED" and due(gone, T0 + 4 * HOUR_MS, ["SLURM"]).events == ()


def test_reserved_seconds_are_cut_at_month_ends() -> None:
    start = 1_798_761_600_000 - HOUR_MS  # 2026-12-31T23:00Z
    assert month_windows(start, start + 2 * HOUR_MS) == [
        ("2026-12", start, start + HOUR_MS), ("2027-01", start + HOUR_MS, start + 2 * HOUR_MS)]
    events = ask(start_ms=start, end_ms=start + 2 * HOUR_MS, now_ms=start)
    r = state(*events)[events[0]["reservation_id"]]
    assert reserved_seconds(r, start + 90 * MINUTE_MS) == [("2026-12", 7200), ("2027-01", 3600)]


SHOW_NODE = ("NodeName=gpu-node-1 Arch=x86_64 CoresPerSocket=16 Gres=gpu:h100:2,gpu:a100:2 NodeAddr=127.0.0.1\n"
             "NodeName=gpu-node-2 Gres=gpu:h100:8(S:0-1) State=IDLE\nNodeName=cpu-1 Gres=(null)\n")  # fmt: skip


def test_slurm_nodes_are_chosen_whole_and_the_argv_is_exact() -> None:
    nodes = parse_nodes(SHOW_NODE)
    assert nodes == {"gpu-node-1": {"h100": 2, "a100": 2}, "gpu-node-2": {"h100": 8}, "cpu-1": {}}
    assert choose_nodes(nodes, "h100", 3) == ["gpu-node-2"]
    assert choose_nodes(nodes, "h100", 9) == ["gpu-node-2", "gpu-node-1"]
    assert choose_nodes(nodes, "a100", 1, ["gpu-node-1"]) == ["gpu-node-1"]
    with pytest.raises(ServiceError, match="fewer than the 11"):
        choose_nodes(nodes, "h100", 11)
    calls: list[list[str]] = []

    def run(argv: Any) -> str:
        calls.append(list(argv))
        return SHOW_NODE if argv[-2:] == ["show", "node"] else ""

    events = ask()
    r = state(*events)[events[0]["reservation_id"]]
    ref, chosen, _ = SlurmReservations(POLICY, run).render(r)
    assert ref == f"gpuledger-{r.reservation_id}" and chosen == ["gpu-node-2"]
    create = calls[-1]
    assert create[:3] == ["scontrol", "create", "reservation"] and f"ReservationName={ref}" in create
    assert {"Accounts=vision", "Nodes=gpu-node-2", "Flags=IGNORE_JOBS"} <= set(create)


class FakeKueue:
    def __init__(self) -> None:
        self.cq = {"spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 2}]}]}]}}  # fmt: skip
        self.patches = 0

    def get_cluster_custom_object(self, *args: Any) -> dict[str, Any]:
        import copy

        return copy.deepcopy(self.cq)

    def patch_cluster_custom_object(self, group: str, version: str, plural: str, name: str, body: Any) -> None:
        assert (plural, name) == ("clusterqueues", "vision")
        self.cq["spec"] = body["spec"]
        self.patches += 1


def test_kueue_quota_is_the_policy_plus_active_reservations() -> None:
    api = FakeKueue()
    engine = KueueQuota(POLICY, api)
    events = ask(gpus=2, start_ms=T0, end_ms=T0 + HOUR_MS)
    now = state(*events)
    out = reconcile(now, POLICY, T0 + 1, [engine])
    assert [(e["event_type"], e["engine"]) for e in out] == [("RENDERED", "KUEUE")]
    quota = api.cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"]
    assert quota == 4  # 2 guaranteed + 2 reserved
    on = state(*events, *out)
    assert reconcile(on, POLICY, T0 + 2, [engine]) == [] and api.patches == 1
    after = reconcile(on, POLICY, T0 + HOUR_MS, [engine])
    assert [e["event_type"] for e in after] == ["EXPIRED", "REMOVED"]
    assert api.cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] == 2


def test_a_kueue_bump_that_went_missing_is_put_back_at_the_next_pass() -> None:
    """A `policy apply` meanwhile sets the policy's quota alone: the service holds the reserved quota, not its first
    patch, and puts it back without a new step (it was rendered once)."""
    api = FakeKueue()
    engine = KueueQuota(POLICY, api)
    events = ask(gpus=2, start_ms=T0, end_ms=T0 + HOUR_MS)
    on = state(*events, *reconcile(state(*events), POLICY, T0 + 1, [engine]))
    flavor = api.cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    flavor["nominalQuota"] = 2  # the policy's own quota, as `policy apply` writes it
    assert reconcile(on, POLICY, T0 + 2, [engine]) == []
    assert api.cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] == 4
    assert api.patches == 2


def test_the_service_takes_its_engines_from_the_command_line_else_the_settings(tmp_path: Any) -> None:
    from base.settings import ReservationServiceSettings, Settings, SinksSettings
    from sinks.reserve_cli import _engines
    from stack.components import by_name

    bare = Settings(state_dir=tmp_path)
    with pytest.raises(ConfigError, match="no engine"):
        _engines(bare, POLICY, None, None)
    assert [e.engine for e in _engines(bare, POLICY, ["slurm", "kueue", "slurm"], None)] == ["SLURM", "KUEUE"]
    service = ReservationServiceSettings(engines=["kueue"], kubeconfig=tmp_path / "kubeconfig")
    configured = Settings(state_dir=tmp_path, sinks=SinksSettings(reservations=service))
    (engine,) = _engines(configured, POLICY, None, None)
    assert engine.engine == "KUEUE" and engine._kubeconfig == str(tmp_path / "kubeconfig")
    # `up` runs the service with an engine and the policy its rules come from, not without either.
    component = by_name()["reservations"]
    assert not component.enabled(bare) and not component.enabled(configured)
    assert component.enabled(configured.model_copy(update={"policy_path": tmp_path / "policy.yaml"}))
    assert not component.enabled(bare.model_copy(update={"policy_path": tmp_path / "policy.yaml"}))


def test_the_demo_policy_approves_a_reservation_within_quota_and_refuses_one_over() -> None:
    """deploy/policy.sim.yaml (what `make up` runs with): each team reserves up to its quota of every generation
    the simulated fleet has, approved at once up to 48 h, longer by ops00; one GPU more is a one-line refusal."""
    from pathlib import Path

    from producers.simulator.org import OPERATOR, sim_fleet_gpus
    from schemas.policy import load_policy

    demo = load_policy(Path(__file__).resolve().parents[2] / "deploy" / "policy.sim.yaml")
    fleet = sim_fleet_gpus()
    assert {g: s.fleet_gpus for g, s in demo.generations.items()} == fleet
    for team in demo.teams:
        assert set(team.quota) == set(fleet) and all(team.quota[g] >= 1 for g in fleet)
        member = team.members[0]
        for gen, quota in team.quota.items():
            kw: dict[str, Any] = dict(cluster="sim-k8s", team=team.name, generation=gen, nodes=[], start_ms=T0,
                                      reason="demo", requester=member, now_ms=T0)
            requested, approved = request_events({}, demo, gpus=quota, end_ms=T0 + 4 * HOUR_MS, **kw)
            assert approved["actor"] == SERVICE_ACTOR
            held = fold([requested, approved], demo)[0][requested["reservation_id"]]
            assert (held.state, held.gpus) == ("APPROVED", quota)
            with pytest.raises(ConfigError) as info:
                request_events({}, demo, gpus=quota + 1, end_ms=T0 + 4 * HOUR_MS, **kw)
            assert str(info.value) == (f"{team.name} may reserve 1..{quota} {gen} GPUs (quota + borrowing, policy), "
                                       f"not {quota + 1}")
    # Within quota but longer than two days: it waits for the operator, who may approve it.
    (long,) = request_events({}, demo, cluster="sim", team="nlp", generation="hopper", gpus=2, nodes=[], start_ms=T0,
                             end_ms=T0 + 72 * HOUR_MS, reason="demo", requester="nlp01", now_ms=T0)
    ok = approve_event(fold([long], demo)[0], demo, long["reservation_id"], OPERATOR, T0 + 1)
    assert fold([long, ok], demo)[0][long["reservation_id"]].approved_by == OPERATOR
