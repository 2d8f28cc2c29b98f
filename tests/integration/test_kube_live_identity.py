"""Who is charged on a real API server (fixture `local_kube`): the submitter stamp `gpuledger policy apply --engine
kueue` puts there (a MutatingAdmissionPolicy writing the request's userInfo into annotations, a
ValidatingAdmissionPolicy locking them), judged by the API server's own admission, and the producer's own watch
(KubeWatcher as the gpuledger-watcher user, reading owners with the rights deploy/kubernetes/rbac/watcher.yaml
gives) turning the objects into job events.

- alice (a token user, uid "alice") creates a Job labelled as bob's: charged to alice, STAMPED, bob is the claim;
- a Job with the stamp pre-filled as bob's: the API server overwrites it with alice's;
- an update that rewrites, adds or removes the stamp is refused with the lock's message (a label change is not);
- the real Job controller (kube-controller-manager built from the pinned module, `--controllers=job`, with
  per-controller service-account credentials) creates the Job's pod: the pod is stamped with the controller's
  identity and charged to the Job's creator through its ownerReference;
- a service account deleted and recreated under the same name: two identities, two user_uid values, each the
  account's own metadata.uid;
- without the policy: the self-declared label (SELF_DECLARED), else the namespace (NAMESPACE);
- end to end (issue 38's first "Done when" in one place): the Job controller's pods of alice's labelled and
  pre-filled Jobs and the recreated robot's two pods, run on gpu-node-1, watched by `gpuledger kube watch`, taken
  through the processors' pipeline, the sinks' writer and the embedded ClickHouse: `report chargeback` charges
  alice (bob nothing) to the cent and counts the disagreeing label on its data-quality line, `report explain`
  lists the robot as two identities with the two ServiceAccounts' own uids.

The stamp applies cluster-wide: every test that applies it removes it again (the session's other tests run
without it) and waits until the API server no longer stamps."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_cli import run_gpuledger
from fixtures_kube import NODE, eventually, get, gpu_pod, gpu_quota, make_namespace, run_pod, workload_of
from kubernetes import config as kube_config
from test_chargeback_ledger import cli_env, run_cli
from test_slurm_live_pricing import CARD, H100, cents, rate_micro, through_the_ledger

from base.settings import ClickHouseSettings
from producers import policy_stamp
from producers.jobevents import EventContext
from producers.kube import WATCH_TARGETS, KubeTracker, KubeWatcher
from producers.kube_identity import ApiOwners, ApiStampTrust
from schemas.codec import AvroCodec
from stack.kube.build import KubeBinaries, ensure_controller_manager
from stack.kube.cluster import ADMIN, LocalKube

SUBMITTER, SUBMITTER_UID, SUBMITTER_GROUPS = policy_stamp.STAMP_KEYS
REPO = Path(__file__).resolve().parents[2]
USER_LABEL = "gpuledger.io/user"
PROJECT_LABEL = "gpuledger.io/project"
UUIDS = [f"GPU-{i:08d}-1d00-4000-8000-000000000000" for i in range(4)]
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"
TARGETS = [t for t in WATCH_TARGETS if t.name in ("workloads", "pods")]
POLICY = """\
version: 1
generations:
  hopper: {{slurm_gres: h100, kueue_flavor: h100-{s}}}
tiers:
  - {{name: prod-{s}, priority: 1000}}
kueue: {{cohort: org-{s}}}
teams:
  - {{name: id-{s}, namespaces: [{ns}], quota: {{hopper: 8}}}}
"""


def create(kube: LocalKube, obj: dict[str, Any], user: str = ADMIN, *, token: str | None = None,
           dry_run: bool = False) -> subprocess.CompletedProcess[str]:  # fmt: skip
    args = ["create", "-o", "json", "-f", "-"] + (["--dry-run=server"] if dry_run else [])
    if token is not None:  # a service account's own token (TokenRequest), in place of the user's
        args = ["--token", token, *args]
    return kube.kubectl(*args, user=user, input=yaml.safe_dump(obj), check=False)


def stamp_of(obj: dict[str, Any]) -> tuple[str | None, ...]:
    ann = obj.get("metadata", {}).get("annotations") or {}
    return tuple(ann.get(k) for k in policy_stamp.STAMP_KEYS)


def gpu_job(name: str, ns: str, *, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
            suspend: bool = True, queue: str | None = None) -> dict[str, Any]:  # fmt: skip
    labels = {**(labels or {}), **({QUEUE_LABEL: queue} if queue else {})}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations or {}},
            "spec": {"suspend": suspend, "template": {"metadata": {"labels": dict(labels)}, "spec": {
                "restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox", "resources": {
                    "limits": {"nvidia.com/gpu": "1"}}}]}}}}  # fmt: skip


def stamping(kube: LocalKube, ns: str) -> bool:
    probe = create(kube, gpu_pod("probe", ns), dry_run=True)
    return probe.returncode == 0 and stamp_of(json.loads(probe.stdout))[0] == ADMIN


def remove_stamp(kube: LocalKube, ns: str) -> None:
    for kind in policy_stamp.KINDS:
        name = policy_stamp.STAMP_POLICY if kind.startswith("Mutating") else policy_stamp.LOCK_POLICY
        kube.kubectl("delete", kind.lower(), name, "--ignore-not-found")
    eventually(lambda: not stamping(kube, ns), "the API server no longer stamps", timeout=30)


def bind_edit(kube: LocalKube, ns: str, kind: str, name: str) -> None:
    """`kind` (User or ServiceAccount) `name` may create and change pods and Jobs in `ns`. (Not the built-in
    `edit`: it is an aggregated role, empty without the controller-manager's aggregation controller.)"""
    subject: dict[str, Any] = {"kind": kind, "name": name}
    subject.update({"namespace": ns} if kind == "ServiceAccount" else {"apiGroup": "rbac.authorization.k8s.io"})
    kube.apply([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "test-workloads"},
         "rules": [{"apiGroups": ["", "batch"], "resources": ["pods", "jobs"],
                    "verbs": ["get", "list", "create", "patch", "update"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": f"workloads-{name}", "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "test-workloads"},
         "subjects": [subject]},
    ])  # fmt: skip


class ListSink:
    """Every event encoded with the contract (as the publisher would), then kept."""

    def __init__(self) -> None:
        self.codec = AvroCodec()
        self.records: list[dict[str, Any]] = []

    def publish(self, topic: Any, key: bytes, record: dict[str, Any]) -> None:
        self.codec.encode(topic.subject, record)
        self.records.append(record)


def watch_once(kube: LocalKube, ns: str, untrusted: int | None = None) -> dict[str, dict[str, Any]]:
    """The producer's own list+watch as gpuledger-watcher (owners and the stamp's policy read as that user, as
    `kube watch` does): the first event of each of the namespace's jobs (pods and Workloads), by job id."""
    api = kube_config.new_client_from_config(config_file=str(kube.cfg.kubeconfig("gpuledger-watcher")))
    owners, trust = ApiOwners(api), ApiStampTrust(api)
    sink = ListSink()
    tracker = KubeTracker(EventContext("local"), owners=owners, trust=trust)
    watcher = KubeWatcher(api, tracker, sink, clock=lambda: int(time.time() * 1000), targets=TARGETS,
                          timeout_seconds=1)  # fmt: skip
    watcher.run(rounds=1)
    assert owners.errors == 0 and trust.errors == 0 and watcher.rejected == 0, watcher.errors
    if untrusted is not None:
        assert tracker.identity.untrusted >= untrusted
    first: dict[str, dict[str, Any]] = {}
    for r in sink.records:
        if r["job_id"].startswith(f"{ns}/"):
            first.setdefault(r["job_id"], r)
    return first


def identity(ev: dict[str, Any]) -> tuple[Any, ...]:
    return ev["user"], ev["user_uid"], ev["user_source"], ev["user_claimed"]


@pytest.fixture
def stamped_ns(local_kube: LocalKube, tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """The policy applied through the CLI as gpuledger-policy (its shipped ClusterRole only), a namespace where
    alice may create workloads, with a LocalQueue of 8 GPUs; the stamp removed after. (namespace, CLI args)"""
    ns = make_namespace(local_kube, "id")
    s = ns.rsplit("-", 1)[1]
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(s=s, ns=ns))
    args = ["--engine", "kueue", "--policy", str(policy), "--kubeconfig",
            str(local_kube.cfg.kubeconfig("gpuledger-policy"))]  # fmt: skip
    done = run_gpuledger(["policy", "apply", *args], env=dict(os.environ), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "applied: 4 admission objects (the submitter stamp and its lock)" in done.stdout
    bind_edit(local_kube, ns, "User", "alice")
    try:
        eventually(lambda: stamping(local_kube, ns), "the API server stamps a new pod", timeout=30)
        yield ns, args
    finally:
        remove_stamp(local_kube, ns)


def test_the_creator_is_charged_not_the_label_and_a_prefilled_stamp_is_overwritten(
    local_kube: LocalKube, stamped_ns: tuple[str, list[str]]
) -> None:
    ns, _ = stamped_ns
    gpu_quota(local_kube, ns, f"cq-{ns}")
    claimed = create(local_kube, gpu_job("claims-bob", ns, labels={USER_LABEL: "bob"}, queue="team-a"), "alice")
    assert claimed.returncode == 0, claimed.stderr
    assert stamp_of(json.loads(claimed.stdout)) == ("alice", "alice", "system:authenticated")
    forged = gpu_job("forged", ns, queue="team-a",
                     annotations={SUBMITTER: "bob", SUBMITTER_UID: "bob", SUBMITTER_GROUPS: "admins"})  # fmt: skip
    made = create(local_kube, forged, "alice")
    assert made.returncode == 0, made.stderr
    assert stamp_of(json.loads(made.stdout)) == ("alice", "alice", "system:authenticated")
    # Kueue makes each Job's Workload; the producer charges the Workload to its owner Job's stamp.
    for job in ("claims-bob", "forged"):
        eventually(lambda job=job: workload_of(local_kube, ns, job), f"Kueue's Workload for {job}")
    events = watch_once(local_kube, ns)
    wl = {job: workload_of(local_kube, ns, job)["metadata"]["name"] for job in ("claims-bob", "forged")}
    assert identity(events[f"{ns}/{wl['claims-bob']}"]) == ("alice", "alice", "STAMPED", "bob")
    assert identity(events[f"{ns}/{wl['forged']}"]) == ("alice", "alice", "STAMPED", None)
    assert events[f"{ns}/{wl['forged']}"]["user_groups"] == ["system:authenticated"]


def test_a_change_to_the_stamp_is_refused_and_other_changes_are_not(
    local_kube: LocalKube, stamped_ns: tuple[str, list[str]]
) -> None:
    ns, _ = stamped_ns
    assert create(local_kube, gpu_job("mine", ns), "alice").returncode == 0
    for user in ("alice", ADMIN):
        for patch in ({SUBMITTER: "bob"}, {SUBMITTER_UID: "x"}, {SUBMITTER_GROUPS: None}):
            body = json.dumps({"metadata": {"annotations": patch}})
            result = local_kube.kubectl("-n", ns, "patch", "job", "mine", "--type=merge", "-p", body, user=user,
                                        check=False)  # fmt: skip
            assert result.returncode != 0, (user, patch)
            assert policy_stamp.LOCK_MESSAGE in result.stderr, result.stderr
    relabel = local_kube.kubectl("-n", ns, "label", "job", "mine", "team=x", user="alice", check=False)
    assert relabel.returncode == 0, relabel.stderr
    # The same manifest applied again (server-side, the creator's own field manager) keeps the stamp.
    again = local_kube.kubectl("apply", "--server-side", "-f", "-", user="alice", check=False,
                               input=yaml.safe_dump(gpu_job("mine", ns)))  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert stamp_of(get(local_kube, ns, "job", "mine"))[0] == "alice"


def test_policy_diff_sees_the_stamp_objects(local_kube: LocalKube, stamped_ns: tuple[str, list[str]]) -> None:
    _, args = stamped_ns
    clean = run_gpuledger(["policy", "diff", "--no-reservations", *args], env=dict(os.environ), timeout=120)
    assert (clean.returncode, clean.stdout.strip()) == (0, "no drift"), clean.stdout + clean.stderr
    local_kube.kubectl("delete", "validatingadmissionpolicybinding", policy_stamp.LOCK_POLICY)
    local_kube.kubectl("patch", "mutatingadmissionpolicy", policy_stamp.STAMP_POLICY, "--type=merge", "-p",
                       json.dumps({"spec": {"failurePolicy": "Ignore"}}))  # fmt: skip
    drifted = run_gpuledger(["policy", "diff", "--no-reservations", *args], env=dict(os.environ), timeout=120)
    assert drifted.returncode == 1, drifted.stderr
    assert drifted.stdout.strip().splitlines() == [
        f"MutatingAdmissionPolicy {policy_stamp.STAMP_POLICY}: failurePolicy is Ignore, policy says Fail",
        f"ValidatingAdmissionPolicyBinding {policy_stamp.LOCK_POLICY}: missing",
    ]


# -- the real Job controller ----------------------------------------------------------------------


@pytest.fixture
def job_controller(local_kube: LocalKube, kube_binaries: KubeBinaries, stamped_ns: tuple[str, list[str]],
                   tmp_path: Path) -> Iterator[str]:  # fmt: skip
    """kube-controller-manager running only the Job controller, as its own service account
    (kube-system/job-controller, `--use-service-account-credentials`), for this test. Its rights are narrowed
    to the test's namespace meanwhile (it reads Jobs and pods everywhere, writes only there): the session's other
    Jobs get no pods from it. The built-in binding is restored after."""
    ns, _ = stamped_ns
    kcm = ensure_controller_manager(kube_binaries)
    builtin = json.loads(local_kube.kubectl("get", "clusterrolebinding", "system:controller:job-controller",
                                            "-o", "json").stdout)  # fmt: skip
    sa = {"kind": "ServiceAccount", "name": "job-controller", "namespace": "kube-system"}
    local_kube.kubectl("delete", "clusterrolebinding", "system:controller:job-controller")
    local_kube.apply([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "test-job-reader"},
         "rules": [{"apiGroups": ["", "batch"], "resources": ["pods", "jobs"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "test-job-reader"}, "subjects": [sa],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "test-job-reader"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "job-controller", "namespace": ns}, "subjects": [sa],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "system:controller:job-controller"}},
    ])  # fmt: skip
    log = tmp_path / "kube-controller-manager.log"
    argv = [str(kcm), "--kubeconfig", str(local_kube.cfg.kubeconfig(ADMIN)), "--controllers=job",
            "--use-service-account-credentials", "--leader-elect=false", "--secure-port=0", "-v=1"]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield ns
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        local_kube.kubectl("delete", "clusterrolebinding", "test-job-reader", "--ignore-not-found")
        for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
            builtin["metadata"].pop(key, None)
        local_kube.kubectl("create", "-f", "-", input=json.dumps(builtin))
        if proc.returncode not in (0, -15):
            print(log.read_text(errors="replace")[-3000:])


def bind(kube: LocalKube, ns: str, pod: str) -> None:
    """Put a pod on gpu-node-1 as a scheduler would: a Binding (the pods/binding subresource)."""
    kube.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod, "namespace": ns},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}}))  # fmt: skip


def epoch_s(stamp: str) -> int:
    return int(dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())


@pytest.mark.timeout(900)  # a first run builds kube-controller-manager (about 3 minutes on 2 cores)
def test_the_ledger_charges_the_creator_the_job_controllers_pods_included_and_two_robots_by_uid(
    local_kube: LocalKube, job_controller: str, clickhouse_server: Any, clickhouse_database: str, tmp_path: Path
) -> None:
    """Issue 38's first "Done when", end to end: what the API server stamped, `gpuledger kube watch` (a separate
    process, as gpuledger-watcher) turned into job events, the processors' pipeline and the sinks' writer put into
    the embedded ClickHouse (tests/integration/test_kube_live_pricing.py's path), and the CLI's own reports say.

    alice creates a Job labelled as bob's and a Job with the stamp pre-filled as bob's; the real Job controller
    makes their pods (stamped with its own identity, pointing at the Jobs); a service account ci-robot, deleted and
    recreated under its name, creates a pod with each of its two lives' tokens. The pods are bound to gpu-node-1
    and run (status patched as a kubelet would) for some seconds. `report chargeback --by user` charges alice for
    both Jobs' pods and bob nothing, to the cent (the card: 1 $ per GPU-second); its data-quality line counts
    the one disagreeing label; `report explain` lists ci-robot as two identities whose uids are the two
    ServiceAccount objects' own metadata.uid."""
    ns = job_controller
    s = ns.rsplit("-", 1)[1]
    cluster, project = f"kube-id-{s}", f"p-id-{s}"
    robot = f"system:serviceaccount:{ns}:ci-robot"
    ch = ClickHouseSettings(url=clickhouse_server.url, database=clickhouse_database,
                            password=clickhouse_server.password,
                            analyst_password=clickhouse_server.analyst_password)  # fmt: skip
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}, **cli_env(ch),
           "GPULEDGER_CLUSTER": cluster, "GPULEDGER_STATE_DIR": str(tmp_path / "state")}  # fmt: skip
    out_path = tmp_path / "events.jsonl"
    argv = [sys.executable, "-c", "from gpuledger.cli import main; main()", "kube", "watch", "--dry-run",
            "--kubeconfig", str(local_kube.cfg.kubeconfig("gpuledger-watcher")), "--timeout", "5"]  # fmt: skip
    with open(out_path, "wb") as out, open(tmp_path / "watch.err", "wb") as err:
        watcher = subprocess.Popen(argv, env=env, cwd=REPO, stdout=out, stderr=err)

    def events() -> list[dict[str, Any]]:
        return [json.loads(line) for line in out_path.read_text().splitlines() if line.startswith("{")]

    def seen(pod: str, kind: str) -> bool:
        return any(e["job_id"] == f"{ns}/{pod}" and e["event_type"] == kind for e in events())

    def pods() -> list[dict[str, Any]]:
        return json.loads(local_kube.kubectl("-n", ns, "get", "pods", "-o", "json").stdout)["items"]

    try:
        # alice's two Jobs: one labelled as bob's, one with bob's stamp pre-filled (overwritten at create).
        mine = {PROJECT_LABEL: project}
        labelled = create(local_kube, gpu_job("claims-bob", ns, labels={USER_LABEL: "bob", **mine}, suspend=False),
                          "alice")  # fmt: skip
        forged = gpu_job("forged", ns, labels=mine, suspend=False,
                         annotations={SUBMITTER: "bob", SUBMITTER_UID: "bob", SUBMITTER_GROUPS: "admins"})  # fmt: skip
        forged_made = create(local_kube, forged, "alice")
        job_uids = {}
        for job, made in (("claims-bob", labelled), ("forged", forged_made)):
            assert made.returncode == 0, made.stderr
            obj = json.loads(made.stdout)
            assert stamp_of(obj) == ("alice", "alice", "system:authenticated"), job
            job_uids[job] = obj["metadata"]["uid"]
        # ... and rewriting the stamp afterwards is refused by the API server.
        rewrite = local_kube.kubectl("-n", ns, "patch", "job", "forged", "--type=merge", "-p",
                                     json.dumps({"metadata": {"annotations": {SUBMITTER: "bob"}}}), user="alice",
                                     check=False)  # fmt: skip
        assert rewrite.returncode != 0 and policy_stamp.LOCK_MESSAGE in rewrite.stderr, rewrite.stderr

        # ci-robot, twice under one name: each life's own token creates a pod on gpu-node-1.
        bind_edit(local_kube, ns, "ServiceAccount", "ci-robot")
        sa_uids: dict[str, str] = {}
        for life in ("first", "second"):
            local_kube.kubectl("-n", ns, "create", "serviceaccount", "ci-robot")
            sa_uids[f"{life}-pod"] = get(local_kube, ns, "serviceaccount", "ci-robot")["metadata"]["uid"]
            token = local_kube.kubectl("-n", ns, "create", "token", "ci-robot").stdout.strip()
            made = create(local_kube, gpu_pod(f"{life}-pod", ns, labels=mine, node=NODE), token=token)
            assert made.returncode == 0, made.stderr
            local_kube.kubectl("-n", ns, "delete", "serviceaccount", "ci-robot")
        assert len(set(sa_uids.values())) == 2

        # The Job controller's pods: stamped with its own identity, owned by alice's Jobs; bound as a scheduler would.
        made_by: dict[str, str] = {}
        for job in job_uids:
            (pod,) = eventually(lambda job=job: [p for p in pods() if p["metadata"]["name"].startswith(f"{job}-")],
                                f"the Job controller's pod of {job}", timeout=60)  # fmt: skip
            assert stamp_of(pod)[0] == JOB_CONTROLLER
            (owner,) = pod["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["uid"], owner["controller"]) == ("Job", job_uids[job], True)
            made_by[job] = pod["metadata"]["name"]
            bind(local_kube, ns, made_by[job])
        names = [made_by["claims-bob"], made_by["forged"], "first-pod", "second-pod"]
        started = {}
        for name in names:
            run_pod(local_kube, ns, name)
            started[name] = get(local_kube, ns, "pod", name)["status"]["startTime"]  # the Succeeded patch resets it
        for name in names:
            eventually(lambda name=name: seen(name, "STARTED"), f"{name} STARTED", timeout=60)
        time.sleep(3)  # some seconds held
        for name in names:
            run_pod(local_kube, ns, name, phase="Succeeded")
        for name in names:
            eventually(lambda name=name: seen(name, "ENDED"), f"{name} ENDED", timeout=60)
    finally:
        watcher.send_signal(signal.SIGTERM)
        try:
            watcher.wait(timeout=30)
        except subprocess.TimeoutExpired:
            watcher.kill()
            watcher.wait()

    held_s = {}
    for name in names:
        status = get(local_kube, ns, "pod", name)["status"]
        finished = status["containerStatuses"][0]["state"]["terminated"]["finishedAt"]
        held_s[name] = epoch_s(finished) - epoch_s(started[name])
        assert held_s[name] >= 3, (name, status)
    ours = [e for e in events() if e["job_id"] in {f"{ns}/{n}" for n in names}]
    who = {(e["job_id"].split("/", 1)[1], identity(e)) for e in ours}
    assert who == {(made_by["claims-bob"], ("alice", "alice", "STAMPED", "bob")),
                   (made_by["forged"], ("alice", "alice", "STAMPED", None)),
                   ("first-pod", (robot, sa_uids["first-pod"], "STAMPED", None)),
                   ("second-pod", (robot, sa_uids["second-pod"], "STAMPED", None))}, who  # fmt: skip

    devices = [{"uuid": u, "index": i, "model": H100, "generation": "hopper", "mig_profile": None,
                "mig_instance_id": None} for i, u in enumerate(UUIDS)]  # fmt: skip
    through_the_ledger(ch, cluster, ours, devices, node=NODE)
    card = tmp_path / "card.toml"
    card.write_text(CARD.replace("hours_per_year", 'preemptible_discount = "0"\nhours_per_year'))  # no policy here
    assert "rates loaded" in run_cli(ch, "ratecard", "load", "--card", str(card))
    period = dt.datetime.fromtimestamp(min(e["ts_ms"] for e in ours) / 1000, dt.UTC).strftime("%Y-%m")
    full = rate_micro("31536000", 1, 8760)  # 1 $ per GPU-second

    charged = json.loads(run_cli(ch, "report", "chargeback", "--period", period, "--by", "user", "--format", "json"))
    lines = {r["line"]: r for r in charged}
    expected = {"alice": cents(held_s[made_by["claims-bob"]] + held_s[made_by["forged"]], full),
                robot: cents(held_s["first-pod"] + held_s["second-pod"], full)}  # fmt: skip
    total = lines.pop("TOTAL")["charge"]
    assert {k: v["charge"] for k, v in lines.items()} == expected, lines  # bob is charged nothing
    assert Decimal(total) == sum(Decimal(c) for c in expected.values())
    assert {r["dq_claimed_user_jobs"] for r in charged} == {1}
    table = run_cli(ch, "report", "chargeback", "--period", period, "--by", "user")
    assert (
        f"data quality: on {cluster}, 1 job(s) named a user other than their verified submitter (charged to "
        "the submitter)" in table
    ), table
    assert "self-declared user disagreed with the verified submitter on 1 jobs" in table, table

    explained = json.loads(run_cli(ch, "report", "explain", "--project", project, "--period", period, "--format",
                                   "json"))  # fmt: skip
    rows = {r["job_id"]: r for r in explained}
    assert {j: (r["identity"], r["user_source"]) for j, r in rows.items()} == {
        f"{ns}/{made_by['claims-bob']}": ("alice (uid alice)", "STAMPED"),
        f"{ns}/{made_by['forged']}": ("alice (uid alice)", "STAMPED"),
        f"{ns}/first-pod": (f"{robot} (uid {sa_uids['first-pod']})", "STAMPED"),
        f"{ns}/second-pod": (f"{robot} (uid {sa_uids['second-pod']})", "STAMPED"),
    }, rows
    print(
        f"\nalice {expected['alice']} $ (bob's label counted, not charged); {robot}: uids "
        f"{sa_uids['first-pod']} and {sa_uids['second-pod']}, {expected[robot]} $"
    )


# -- service accounts ---------------------------------------------------------------------------------


def test_a_service_account_recreated_under_its_name_is_a_second_identity(
    local_kube: LocalKube, stamped_ns: tuple[str, list[str]]
) -> None:
    ns, _ = stamped_ns
    robot = f"system:serviceaccount:{ns}:ci-robot"
    bind_edit(local_kube, ns, "ServiceAccount", "ci-robot")
    uids = []
    for run in ("first", "second"):
        local_kube.kubectl("-n", ns, "create", "serviceaccount", "ci-robot")
        uids.append(json.loads(local_kube.kubectl("-n", ns, "get", "sa", "ci-robot", "-o", "json").stdout)
                    ["metadata"]["uid"])  # fmt: skip
        token = local_kube.kubectl("-n", ns, "create", "token", "ci-robot").stdout.strip()  # TokenRequest, as admin
        made = create(local_kube, gpu_pod(f"{run}-pod", ns), token=token)
        assert made.returncode == 0, made.stderr
        assert stamp_of(json.loads(made.stdout))[:2] == (robot, uids[-1])
        local_kube.kubectl("-n", ns, "delete", "serviceaccount", "ci-robot")
    assert uids[0] != uids[1]
    events = watch_once(local_kube, ns)
    first, second = events[f"{ns}/first-pod"], events[f"{ns}/second-pod"]
    assert identity(first) == (robot, uids[0], "STAMPED", None)
    assert identity(second) == (robot, uids[1], "STAMPED", None)
    assert f"system:serviceaccounts:{ns}" in first["user_groups"]


# -- without the policy --------------------------------------------------------------------------------


def test_without_the_policy_the_label_then_the_namespace(local_kube: LocalKube) -> None:
    ns = make_namespace(local_kube, "noid")
    remove_stamp(local_kube, ns)  # left by no one, unless a test before this one did
    bind_edit(local_kube, ns, "User", "alice")
    assert create(local_kube, gpu_pod("labelled", ns, labels={USER_LABEL: "bob"}), "alice").returncode == 0
    assert create(local_kube, gpu_pod("bare", ns), "alice").returncode == 0
    forged = gpu_pod("forged", ns)
    forged["metadata"]["annotations"] = {SUBMITTER: "carol", SUBMITTER_UID: "carol"}
    assert create(local_kube, forged, "alice").returncode == 0
    events = watch_once(local_kube, ns, untrusted=1)
    assert identity(events[f"{ns}/labelled"]) == ("bob", None, "SELF_DECLARED", None)
    assert identity(events[f"{ns}/bare"]) == (ns, None, "NAMESPACE", None)
    # Without the policy the stamp's annotations are only what their writer says: not taken.
    assert identity(events[f"{ns}/forged"]) == (ns, None, "NAMESPACE", None)


@pytest.fixture(autouse=True)
def _quiet_insecure_warnings() -> None:
    import urllib3

    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
