"""`gang_alert` (sinks/gang.py): a gang's pods, each judged by the processors' idle state machine, make one
warning naming the gang once every pod is idle, one reclaim notice once every pod's grace is over, and one
resolution when a pod wakes after the gang was warned. The member alerts come from `processors.idle.step`
itself, fed job-minutes, so the test holds the records the alerts topic carries."""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr

from base.processor_settings import IdlePolicy
from base.settings import ChatRoute, ChatSettings
from processors.attribution import JobInfo
from processors.idle import IdleState, new_state, step
from sinks.chat import ChatNotifier, Destination, render
from sinks.gang import Gang, MemberAlert, gang_alert

T0 = 1_793_491_200_000
MIN = 60_000
POLICY = IdlePolicy(idle_after_min_batch=3, grace_min=2, rate_per_device_hour={"hopper": 3.0})
GANG = Gang("kueue:ml/wl", "k8s", ("ml/p0", "ml/p1"))


class Pod:
    """One pod's idle state machine and the alerts it has sent so far."""

    def __init__(self, name: str, devices: tuple[str, ...]) -> None:
        info = JobInfo(cluster="k8s", job_id=name, scheduler="KUEUE", user="ana", team="vision", project="det")
        self.state: IdleState = new_state(info, devices)
        self.alerts: list[dict[str, Any]] = []

    def minute(self, m: int, busy: bool) -> list[dict[str, Any]]:
        n = len(self.state.devices)
        jm = {"minute_start_ms": T0 + m * MIN, "allocated_s": 60 * n, "active_s": 60 * n if busy else 0,
              "starved_s": 0, "idle_s": 0 if busy else 60 * n, "generation": "hopper", "device_count": n}  # fmt: skip
        self.state, outs = step(self.state, jm, POLICY)
        new = [o.record for o in outs if o.kind == "alert"]
        self.alerts += new
        return new


def _latest(*pods: Pod, but: str = "") -> dict[str, MemberAlert]:
    out = {}
    for pod in pods:
        sent = [a for a in pod.alerts if a["alert_id"] != but]
        if sent:
            out[sent[-1]["job_id"]] = MemberAlert(sent[-1])
    return out


def _run(p0_busy: set[int], p1_busy: set[int], minutes: int) -> list[dict[str, Any]]:
    """Both pods minute by minute; each new member alert judged against the gang as it was then."""
    p0, p1 = Pod("ml/p0", ("G0", "G1")), Pod("ml/p1", ("G2", "G3"))
    posted = []
    for m in range(minutes):
        for pod, busy in ((p0, p0_busy), (p1, p1_busy)):
            for alert in pod.minute(m, m in busy):
                got = gang_alert(GANG, alert, _latest(p0, p1, but=alert["alert_id"]))
                if got is not None:
                    posted.append(got)
    return posted


def test_the_gang_is_warned_once_when_its_last_pod_is_idle_and_reclaimed_at_the_last_pods_time() -> None:
    posted = _run(p0_busy=set(), p1_busy={0, 1}, minutes=9)  # p1 idle from minute 2: warned 2 minutes after p0
    assert [(a["kind"], a["ts_ms"] - T0) for a in posted] == [("IDLE_WARNING", 5 * MIN), ("RECLAIM_NOTICE", 7 * MIN)]
    warning, notice = posted
    assert warning["job_id"] == warning["gang_id"] == "kueue:ml/wl" and warning["members"] == ["ml/p0", "ml/p1"]
    assert warning["device_uuids"] == ["G0", "G1", "G2", "G3"]
    assert warning["idle_minutes"] == 3  # the gang is idle since its last pod was
    assert warning["action_at_ms"] == T0 + 7 * MIN  # p1's: idle from minute 2, warned after 3, action 2 later
    assert warning["cost_so_far"] == 5 * 2 * 60 * 3.0 / 3600 + 3 * 2 * 60 * 3.0 / 3600  # both pods' idle so far
    assert len(warning["member_alert_ids"]) == 2 and notice["alert_id"] != warning["alert_id"]


def test_one_busy_pod_keeps_the_gang_quiet() -> None:
    assert _run(p0_busy=set(), p1_busy=set(range(12)), minutes=12) == []


def test_a_pod_waking_resolves_the_gang_and_a_new_spell_is_a_new_warning() -> None:
    posted = _run(p0_busy=set(), p1_busy={4}, minutes=11)  # both warned at 3; p1 busy in minute 4, before the action
    kinds = [(a["kind"], a["ts_ms"] - T0) for a in posted]
    assert kinds == [("IDLE_WARNING", 3 * MIN), ("IDLE_RESOLVED", 5 * MIN), ("IDLE_WARNING", 8 * MIN),
                     ("RECLAIM_NOTICE", 10 * MIN)]  # fmt: skip
    first, resolved, second, notice = posted
    assert len({first["alert_id"], resolved["alert_id"], second["alert_id"], notice["alert_id"]}) == 4
    assert "ml/p1 woke up" in resolved["message"]
    # p0 stayed idle, past its own action time (minute 5; its notice was held): the new spell is due at p1's
    assert second["action_at_ms"] == notice["ts_ms"] == T0 + 10 * MIN


def test_the_gangs_alert_id_does_not_depend_on_which_pod_came_last() -> None:
    a = _run(p0_busy=set(), p1_busy=set(), minutes=4)
    p0, p1 = Pod("ml/p0", ("G0",)), Pod("ml/p1", ("G2",))
    for m in range(4):
        p1.minute(m, False)
        p0.minute(m, False)
    w0, w1 = p0.alerts[0], p1.alerts[0]
    one = gang_alert(GANG, w0, {"ml/p1": MemberAlert(w1)})
    other = gang_alert(GANG, w1, {"ml/p0": MemberAlert(w0)})
    assert one is not None and other is not None and one["alert_id"] == other["alert_id"] == a[0]["alert_id"]


def test_a_pod_that_ended_does_not_hold_the_gang() -> None:
    p0 = Pod("ml/p0", ("G0",))
    for m in range(3):
        p0.minute(m, False)
    ended = Gang(GANG.gang_id, "k8s", GANG.members, frozenset({"ml/p1"}))
    got = gang_alert(ended, p0.alerts[0], {})
    assert got is not None and got["members"] == ["ml/p0"]
    assert gang_alert(GANG, p0.alerts[0], {}) is None  # p1 still holds its devices and has not been warned


def test_the_chat_posts_the_gangs_alert_and_journals_its_pods_in_it() -> None:
    p0, p1 = Pod("ml/p0", ("G0",)), Pod("ml/p1", ("G2",))
    posts: list[tuple[str, str]] = []

    def gangs(alert: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
        return True, gang_alert(GANG, alert, _latest(p0, p1, but=alert["alert_id"]))

    chat = ChatSettings(default=ChatRoute(url=SecretStr("json://127.0.0.1:9/"), channel="#gpu"))
    notifier = ChatNotifier(chat, clock_ms=lambda: T0, sender=lambda u, t, b: posts.append((t, b)) is None,
                            gangs=gangs)  # fmt: skip
    for m in range(3):
        p0.minute(m, False)
    held = notifier.handle(p0.alerts[0])
    assert held.status == "gang-held" and posts == []
    for m in range(3):
        p1.minute(m, False)
    sent = notifier.handle(p1.alerts[0])
    assert sent.status == "sent" and sent.members == (p0.alerts[0]["alert_id"], p1.alerts[0]["alert_id"])
    [(title, body)] = posts
    assert title == "[gpuledger] Idle GPUs: action pending: gang kueue:ml/wl on k8s"
    assert "gang members: 2 pod(s) ml/p0, ml/p1" in body
    assert notifier.handle(p0.alerts[0]).status == "duplicate"  # a redelivered pod alert: it went out in the gang's


def test_render_names_a_plain_job_as_before() -> None:
    dest = Destination("default", "default", "#gpu", ChatRoute(url=SecretStr("json://h/")))
    title, body = render({"kind": "IDLE_WARNING", "job_id": "42", "cluster": "c1"}, dest, "ask")
    assert title.endswith("job 42 on c1") and "gang members" not in body
