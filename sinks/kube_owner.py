"""Which Kueue Workload owns a pod: the object Kueue reclaim must deactivate (issue 18).

The processors' Kubernetes jobs are pods (`namespace/pod`): the pods hold the devices. Kueue admits and
evicts Workloads, and a Workload belongs to the pod's owner, not the pod: a batch Job's Workload is owned by
the Job (label `kueue.x-k8s.io/job-uid` = the Job's uid), a JobSet's by the JobSet (two levels up: pod ->
Job -> JobSet), a plain pod's by the pod itself (Kueue's pod integration, `tests/fixtures/kubernetes`).
Deactivating the Workload (`spec.active=false`) evicts every pod of it: the gang is reclaimed as one.

A JobSet that no Kueue Workload owns is suspended itself (`spec.suspend=true`: the JobSet controller deletes
its Jobs' pods), found by climbing the same chain (`find_jobset`). A Volcano Job (`batch.volcano.sh`, the owner
of the pods of a Volcano gang, `find_volcano_job`) has no such field: Volcano stops it on a `bus.volcano.sh`
Command, action `AbortJob`, targeting the Job (what `vcctl job suspend` creates; `ResumeJob` undoes it; Volcano's
job controller deletes the Command once it has acted on it). `abort_command` builds that Command with a name
fixed by the Job's name and uid, so a repeated reclaim of the same Job creates none twice (AlreadyExists).
Kueue comes first: a Workload owning the JobSet or Volcano Job is deactivated instead.

Pure core: `find_owning_workload(pod, workloads, read_owner)` climbs the pod's ownerReferences (at most
`OWNER_DEPTH` levels) and returns the Workload whose ownerReferences or job-uid label name one of the uids
seen. The adapter `KubeOwnerReader` reads through the kubernetes client.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from base.kube import load_credentials

OWNER_DEPTH = 3  # pod -> Job -> JobSet / MPIJob / PyTorchJob, and one more for safety
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
JOBSET_GROUP = "jobset.x-k8s.io"
VOLCANO_JOB_API = "batch.volcano.sh/v1alpha1"  # the only version of Volcano's Job CRD (v1.15.1)
COMMAND_GROUP, COMMAND_VERSION, COMMAND_PLURAL = "bus.volcano.sh", "v1alpha1", "commands"
ABORT_JOB = "AbortJob"  # bus.volcano.sh/v1alpha1 AbortJobAction; ResumeJob undoes it
# Volcano Job phases in which its pods are gone or going: nothing left to abort
VOLCANO_STOPPED = frozenset({"Aborting", "Aborted", "Completing", "Completed", "Terminating", "Terminated", "Failed"})
KIND_LABEL = {"Workload": "Workload", "JobSet": "JobSet", "VolcanoJob": "Volcano Job"}

Obj = Mapping[str, Any]
ReadOwner = Callable[[str, Obj], Obj | None]  # (namespace, ownerReference) -> the owner object, None: unreadable


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def _refs(obj: Obj) -> list[Obj]:
    return [r for r in _meta(obj).get("ownerReferences") or () if isinstance(r, Mapping)]


def owned_by(workload: Obj, uids: set[str]) -> bool:
    """Whether the Workload belongs to one of `uids` (an ownerReference, or Kueue's job-uid label)."""
    if (_meta(workload).get("labels") or {}).get(JOB_UID_LABEL) in uids:
        return True
    return any(r.get("uid") in uids for r in _refs(workload))


@dataclass(frozen=True, slots=True)
class Owner:
    """The object to stop and how it was found: the chain of kinds from the pod up. `kind` is Workload (set
    `spec.active=false`), JobSet (set `spec.suspend=true`) or VolcanoJob (create `abort_command(obj)`)."""

    obj: Obj
    path: tuple[str, ...]
    kind: str = "Workload"

    @property
    def name(self) -> str:
        return str(_meta(self.obj).get("name"))

    @property
    def active(self) -> bool:
        spec = self.obj.get("spec") or {}
        if self.kind == "JobSet":
            return spec.get("suspend") is not True
        if self.kind == "VolcanoJob":
            phase = ((self.obj.get("status") or {}).get("state") or {}).get("phase")
            return phase not in VOLCANO_STOPPED
        return spec.get("active", True) is not False

    @property
    def stop_body(self) -> dict[str, Any]:
        if self.kind == "VolcanoJob":
            raise ValueError("a Volcano Job is stopped by an AbortJob Command (abort_command), not a patch")
        return {"spec": {"suspend": True}} if self.kind == "JobSet" else {"spec": {"active": False}}

    def describe(self) -> str:
        kind = KIND_LABEL.get(self.kind, self.kind)
        return f"{kind} {_meta(self.obj).get('namespace')}/{self.name} (owner of {' -> '.join(self.path)})"


def find_owning_workload(pod: Obj, workloads: Iterable[Obj], read_owner: ReadOwner) -> Owner | None:
    """The Workload owning `pod`, climbing its owners level by level; None when no Workload owns it."""
    candidates = list(workloads)
    namespace = str(_meta(pod).get("namespace") or "")
    frontier: list[tuple[Obj, tuple[str, ...]]] = [(pod, (f"Pod {_meta(pod).get('name')}",))]
    for _ in range(OWNER_DEPTH):
        by_uid: dict[str, tuple[str, ...]] = {}
        for obj, path in frontier:
            if _meta(obj).get("uid"):
                by_uid.setdefault(str(_meta(obj)["uid"]), path)
            for ref in _refs(obj):
                if ref.get("uid"):
                    by_uid.setdefault(str(ref["uid"]), (*path, f"{ref.get('kind')} {ref.get('name')}"))
        for wl in candidates:
            hits = [uid for uid in by_uid if owned_by(wl, {uid})]
            if hits:
                return Owner(wl, by_uid[hits[0]])
        nxt: list[tuple[Obj, tuple[str, ...]]] = []
        for obj, path in frontier:
            for ref in _refs(obj):
                owner = read_owner(namespace, ref)
                if owner is not None:
                    nxt.append((owner, (*path, f"{ref.get('kind')} {ref.get('name')}")))
        if not nxt:
            return None
        frontier = nxt
    return None


def _is_jobset(ref: Obj) -> bool:
    return str(ref.get("apiVersion") or "").startswith(f"{JOBSET_GROUP}/") and ref.get("kind") == "JobSet"


def _is_volcano_job(ref: Obj) -> bool:
    return ref.get("apiVersion") == VOLCANO_JOB_API and ref.get("kind") == "Job"


STOPPABLE: tuple[tuple[str, Callable[[Obj], bool]], ...] = (("JobSet", _is_jobset), ("VolcanoJob", _is_volcano_job))


def find_gang_object(pod: Obj, read_owner: ReadOwner, kinds: Iterable[str] = ("JobSet", "VolcanoJob")) -> Owner | None:
    """The nearest JobSet or Volcano Job above the pod (pod -> Job -> JobSet, pod -> Volcano Job), if any, of
    `kinds`; owners are read only while climbing (at most `OWNER_DEPTH` levels)."""
    wanted = [(kind, match) for kind, match in STOPPABLE if kind in set(kinds)]
    namespace = str(_meta(pod).get("namespace") or "")
    frontier: list[tuple[Obj, tuple[str, ...]]] = [(pod, (f"Pod {_meta(pod).get('name')}",))]
    for _ in range(OWNER_DEPTH):
        nxt: list[tuple[Obj, tuple[str, ...]]] = []
        for obj, path in frontier:
            for ref in _refs(obj):
                owner = read_owner(namespace, ref)
                if owner is None:
                    continue
                step = (*path, f"{ref.get('kind')} {ref.get('name')}")
                kind = next((k for k, match in wanted if match(ref)), None)
                if kind is not None:
                    return Owner(owner, step, kind)
                nxt.append((owner, step))
        if not nxt:
            return None
        frontier = nxt
    return None


def find_jobset(pod: Obj, read_owner: ReadOwner) -> Owner | None:
    """The JobSet above the pod (pod -> Job -> JobSet), if any."""
    return find_gang_object(pod, read_owner, ("JobSet",))


def find_volcano_job(pod: Obj, read_owner: ReadOwner) -> Owner | None:
    """The Volcano Job above the pod (its controller owns the pods it makes: pod -> Volcano Job), if any."""
    return find_gang_object(pod, read_owner, ("VolcanoJob",))


def command_name(job_name: str, job_uid: str) -> str:
    """The AbortJob Command's name for one Volcano Job: fixed by the Job's name and uid (a Job re-created under
    the same name gets another), at most 253 characters (a Volcano Job's name is at most 63)."""
    suffix = f"-abortjob-{job_uid[:8]}"
    return job_name[: 253 - len(suffix)].rstrip("-.") + suffix


def abort_command(owner: Owner, message: str = "gpuledger reclaim: the gang held its GPUs idle") -> dict[str, Any]:
    """The `bus.volcano.sh/v1alpha1` Command that stops the Volcano Job `owner` (pure): action AbortJob, `target`
    the Job (apiVersion and kind exactly as Volcano's job controller filters them, with its uid), owned by the
    Job so it goes with it. No `blockOwnerDeletion`: setting it needs delete on the Job, which reclaim lacks."""
    if owner.kind != "VolcanoJob":
        raise ValueError(f"an AbortJob Command targets a Volcano Job, not {owner.describe()}")
    meta = _meta(owner.obj)
    name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
    if not name or not uid:
        raise ValueError(f"{owner.describe()} has no name or uid to target")
    target = {"apiVersion": VOLCANO_JOB_API, "kind": "Job", "name": name, "uid": uid, "controller": True}
    return {
        "apiVersion": f"{COMMAND_GROUP}/{COMMAND_VERSION}", "kind": "Command",
        "metadata": {"name": command_name(name, uid), "namespace": str(meta.get("namespace") or ""),
                     "labels": {"app.kubernetes.io/managed-by": "gpuledger"}, "ownerReferences": [dict(target)]},
        "target": target, "action": ABORT_JOB, "reason": "IdleReclaim", "message": message,
    }  # fmt: skip


def _plural(kind: str) -> str:
    return kind.lower() + ("es" if kind.lower().endswith("s") else "s")


def _reason(body: Any) -> str:
    """The `reason` of a Kubernetes Status in an error body ('' when it is not one)."""
    try:
        status = json.loads(body or "")
    except (TypeError, ValueError):
        return ""
    return str(status.get("reason") or "") if isinstance(status, dict) else ""


class KubeOwnerReader:
    """Reads pods, the namespace's Workloads and owner objects through the kubernetes client. Needs
    `get` on pods and on the owners' kinds, `list` on Workloads, `patch` on JobSets and `create` on Volcano
    Commands (deploy/kubernetes/rbac/reclaim.yaml)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    @staticmethod
    def _json(resp: Any) -> dict[str, Any]:
        data = json.loads(resp.data)
        return data if isinstance(data, dict) else {}

    def pod(self, namespace: str, name: str) -> Obj | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self._json(self.core.read_namespaced_pod(name, namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def workloads(self, namespace: str) -> list[Obj]:
        resp = self.custom.list_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads",
                                                         _preload_content=False)  # fmt: skip
        return [w for w in self._json(resp).get("items") or () if isinstance(w, Mapping)]

    def patch(self, owner: Owner, body: dict[str, Any]) -> None:
        """Patch the owner object (a JobSet's `spec.suspend`) at the version it was read at."""
        group, _, version = str(owner.obj.get("apiVersion") or "").rpartition("/")
        ns = str(_meta(owner.obj).get("namespace") or "")
        self.custom.patch_namespaced_custom_object(group, version, ns, _plural(owner.kind), owner.name, body)

    def create(self, body: Obj) -> bool:
        """Create a namespaced custom object (a Volcano Command); False when one of that name exists already."""
        from kubernetes.client.exceptions import ApiException

        group, _, version = str(body.get("apiVersion") or "").rpartition("/")
        ns, kind = str(_meta(body).get("namespace") or ""), str(body.get("kind") or "")
        try:
            self.custom.create_namespaced_custom_object(group, version, ns, _plural(kind), dict(body))
        except ApiException as exc:
            if exc.status == 409 and _reason(exc.body) == "AlreadyExists":
                return False
            raise
        return True

    def owner(self, namespace: str, ref: Obj) -> Obj | None:
        from kubernetes.client.exceptions import ApiException

        group, _, version = str(ref.get("apiVersion") or "").rpartition("/")
        if not group or not ref.get("kind") or not ref.get("name"):
            return None  # a core-group owner (a pod owning a pod) has no Workload above it
        try:
            resp = self.custom.get_namespaced_custom_object(group, version, namespace, _plural(str(ref["kind"])),
                                                            str(ref["name"]), _preload_content=False)  # fmt: skip
        except ApiException as exc:
            if exc.status in (403, 404):
                return None
            raise
        return self._json(resp)


def owning_workload(reader: KubeOwnerReader, namespace: str, name: str) -> Owner | None:
    """The Workload to deactivate for job `namespace/name`: the pod's owning Workload; when no such pod
    exists, a Workload of that name (a gang's own job id, `kueue:namespace/workload`)."""
    workloads = reader.workloads(namespace)
    pod = reader.pod(namespace, name)
    if pod is None:
        named = next((w for w in workloads if _meta(w).get("name") == name), None)
        return Owner(named, (f"Workload {name}",)) if named is not None else None
    return find_owning_workload(pod, workloads, reader.owner) or find_gang_object(pod, reader.owner)


_READER: list[KubeOwnerReader] = []  # built at the first Kueue action, then kept


def kubernetes_owner(namespace: str, name: str) -> Owner | None:
    """`owning_workload` through the kubernetes client (in-cluster credentials, else the kubeconfig), the
    executor's resolver in `gpuledger reclaim run|exec`."""
    if not _READER:
        from kubernetes import client

        load_credentials()
        _READER.append(KubeOwnerReader(client.ApiClient()))
    return owning_workload(_READER[0], namespace, name)


def kubernetes_owner_create(body: Obj) -> bool:
    """Create an object for a non-Kueue owner (a Volcano Job's AbortJob Command) through the reader
    `kubernetes_owner` built; False when it exists already."""
    if not _READER:
        raise RuntimeError("kubernetes_owner_create before kubernetes_owner found the owner")
    return _READER[0].create(body)


def kubernetes_owner_patch(owner: Owner, body: dict[str, Any]) -> None:
    """Patch a non-Kueue owner (a JobSet) through the reader `kubernetes_owner` built."""
    if not _READER:
        raise RuntimeError("kubernetes_owner_patch before kubernetes_owner found the owner")
    _READER[0].patch(owner, body)
