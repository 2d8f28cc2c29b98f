"""Who is charged for a Kubernetes object: the verified submitter the API server stamped on it (or on the
owner it was made for), else the self-declared user label, else the namespace.

The stamp is written by the MutatingAdmissionPolicy of producers/policy_stamp.py from the creating request's
`userInfo` and locked by its ValidatingAdmissionPolicy. Pure core: `IdentityResolver.resolve(obj)` over plain
dicts; an `OwnerSource` (the adapter `ApiOwners` reads owners from the API server, cached by uid) gives it the
owners a controller-made object points at.

- An object stamped by a person (or a service account of a workload namespace) is charged to that stamp:
  `user_source` STAMPED, `user_uid` the stamp's uid, `user_groups` its groups; a self-declared user label
  that names someone else is kept as `user_claimed`.
- An object stamped by a controller (a `system:` identity that is not a service account, or a service account
  of a controller namespace such as kube-system) and pointing at an owner with `controller: true`, or one
  with no stamp at all, is charged to the nearest stamped owner up that chain (Pod -> Job -> CronJob,
  Workload -> Job, PodGroup -> Volcano Job; at most `MAX_OWNER_DEPTH` steps). A person's own stamp is never
  passed over for an owner's: an ownerReference is written by whoever creates the object, so following it
  from a person's object would let anyone charge another's Job.
- Unstamped all the way (a cluster without the policy): the self-declared label (SELF_DECLARED), else the
  namespace (NAMESPACE), as before the stamp existed.
- A stamp is only as good as the policy that wrote it: with a `StampTrust` (the adapter `ApiStampTrust` reads
  the four admission objects), stamps count only while all four are in force and only on objects created
  since they were (an annotation written where no policy stamped is the writer's say, and is ignored like an
  absent stamp: counted in `untrusted`). The API server takes a new policy into effect within about a second of
  its creation; an object created in that second may carry what its creator wrote.
- Stamps are user-reachable text on objects: a name, uid or group over `MAX_NAME` characters or more than
  `MAX_GROUPS` groups makes the stamp absent (logged, counted in `oversized`), never a crash.
- `oversized` and `untrusted` count each resolve that ignored a stamp (an object's every event, an owner read
  through the cache); `kube watch` serves them as gpuledger_stamps_ignored_total{reason} (`counters`).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from producers.policy_stamp import STAMP_KEYS, SUBMITTER, SUBMITTER_GROUPS, SUBMITTER_UID

log = logging.getLogger(__name__)

USER_KEYS = ("gpuledger.io/user", "kueue.x-k8s.io/user")
MAX_NAME = 256  # username, uid, each group, a self-declared label
MAX_GROUPS = 64
MAX_GROUPS_TEXT = MAX_GROUPS * (MAX_NAME + 1)
MAX_OWNER_DEPTH = 4
# Namespaces whose service accounts are controllers acting for someone else (their objects point at the owner
# they were made for): Kubernetes' own, and the usual homes of Kueue, JobSet, Volcano and the Kubeflow operators.
CONTROLLER_NAMESPACES = frozenset(
    {"kube-system", "kueue-system", "jobset-system", "volcano-system", "kubeflow", "kubeflow-system"}
)
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"

# The owners followed (apiVersion group, kind) -> plural: what users create, as policy_stamp.STAMPED stamps.
OWNER_KINDS: dict[tuple[str, str], str] = {
    ("batch", "Job"): "jobs",
    ("batch", "CronJob"): "cronjobs",
    ("apps", "Deployment"): "deployments",
    ("apps", "StatefulSet"): "statefulsets",
    ("apps", "ReplicaSet"): "replicasets",
    ("jobset.x-k8s.io", "JobSet"): "jobsets",
    ("batch.volcano.sh", "Job"): "jobs",
    ("kubeflow.org", "PyTorchJob"): "pytorchjobs",
    ("kubeflow.org", "MPIJob"): "mpijobs",
    ("kubeflow.org", "TFJob"): "tfjobs",
    ("kubeflow.org", "XGBoostJob"): "xgboostjobs",
    ("kubeflow.org", "PaddleJob"): "paddlejobs",
    ("kubeflow.org", "JAXJob"): "jaxjobs",
    ("trainer.kubeflow.org", "TrainJob"): "trainjobs",
}


@dataclass(frozen=True, slots=True)
class Stamp:
    user: str
    uid: str | None
    groups: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is charged, and how that is known (the JobEvent v4 fields beside `user`)."""

    user: str
    source: str  # STAMPED, SELF_DECLARED, NAMESPACE
    uid: str | None = None
    claimed: str | None = None
    groups: tuple[str, ...] = ()

    def fields(self) -> dict[str, Any]:
        return {"user_uid": self.uid, "user_source": self.source, "user_claimed": self.claimed,
                "user_groups": self.groups}  # fmt: skip


class OversizedStamp(ValueError):
    pass


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _map(meta: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = meta.get(key)
    return value if isinstance(value, Mapping) else {}


def _bounded(value: Any, what: str) -> str:
    text = str(value)
    if len(text) > MAX_NAME:
        raise OversizedStamp(f"{what} is {len(text)} characters (max {MAX_NAME})")
    return text


def parse_stamp(obj: Mapping[str, Any]) -> Stamp | None:
    """The object's stamp, None when it has none; `OversizedStamp` when a part is over its bound."""
    ann = _map(_meta(obj), "annotations")
    user = ann.get(SUBMITTER)
    if not user:
        return None
    raw_groups = str(ann.get(SUBMITTER_GROUPS) or "")
    if len(raw_groups) > MAX_GROUPS_TEXT:
        raise OversizedStamp(f"{SUBMITTER_GROUPS} is {len(raw_groups)} characters (max {MAX_GROUPS_TEXT})")
    groups = tuple(g for g in raw_groups.split(",") if g) if raw_groups else ()
    if len(groups) > MAX_GROUPS:
        raise OversizedStamp(f"{SUBMITTER_GROUPS} names {len(groups)} groups (max {MAX_GROUPS})")
    for g in groups:
        _bounded(g, "a group")
    uid = ann.get(SUBMITTER_UID)
    return Stamp(_bounded(user, SUBMITTER), _bounded(uid, SUBMITTER_UID) if uid else None, groups)


def is_controller(user: str) -> bool:
    """A controller's identity: a `system:` user that is not a service account (system:kube-controller-manager),
    or a service account of a controller namespace (system:serviceaccount:kube-system:job-controller)."""
    if user.startswith(SERVICE_ACCOUNT_PREFIX):
        return user[len(SERVICE_ACCOUNT_PREFIX) :].split(":", 1)[0] in CONTROLLER_NAMESPACES
    return user.startswith("system:")


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference marked `controller: true` (Kubernetes allows at most one)."""
    refs = _meta(obj).get("ownerReferences")
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, Mapping) and ref.get("controller") is True and ref.get("uid") and ref.get("name"):
            return ref
    return None


def declared_user(obj: Mapping[str, Any]) -> str | None:
    """The self-declared user: a `USER_KEYS` label, else annotation (a value over `MAX_NAME` is ignored)."""
    meta = _meta(obj)
    for src in (_map(meta, "labels"), _map(meta, "annotations")):
        for k in USER_KEYS:
            value = src.get(k)
            if value and len(str(value)) <= MAX_NAME:
                return str(value)
    return None


def created_ms(obj: Mapping[str, Any]) -> int | None:
    """metadata.creationTimestamp (RFC 3339) -> epoch ms; None when absent or unreadable."""
    value = _meta(obj).get("creationTimestamp")
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


class StampTrust(Protocol):
    def since_ms(self) -> int | None:
        """Since when stamps are written and locked (the newest creation of the four admission objects); None
        while any of them is missing: then no stamp is trusted."""
        ...


class OwnerSource(Protocol):
    def owner(self, namespace: str, ref: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The object `ref` (an ownerReference) names in `namespace`, when it exists and has the ref's uid."""
        ...


@dataclass
class IdentityResolver:
    owners: OwnerSource | None = None
    trust: StampTrust | None = None  # None: every stamp is taken as written (replays of recorded objects, tests)
    oversized: int = 0  # stamps ignored for being over a bound
    untrusted: int = 0  # stamps ignored because no policy in force wrote them
    _warned: set[str] = field(default_factory=set)

    def _trusted(self, obj: Mapping[str, Any]) -> bool:
        if self.trust is None:
            return True
        since, created = self.trust.since_ms(), created_ms(obj)
        if since is None or created is None or created < since:
            self.untrusted += 1
            return False
        return True

    def _stamp(self, obj: Mapping[str, Any]) -> Stamp | None:
        try:
            stamp = parse_stamp(obj)
            return stamp if stamp is None or self._trusted(obj) else None
        except OversizedStamp as exc:
            self.oversized += 1
            meta = _meta(obj)
            where = f"{str(meta.get('namespace'))[:64]}/{str(meta.get('name'))[:128]}"
            if where not in self._warned and len(self._warned) < 10_000:
                self._warned.add(where)
                log.warning("submitter stamp on %s ignored: %s", where, exc)
            return None

    def counters(self) -> dict[str, dict[tuple[str, ...], float]]:
        """The stamps ignored so far by reason, as a base/metrics pull source (read at scrape time):
        `gpuledger_stamps_ignored_total{reason="oversized"|"untrusted"}`."""
        return {"stamps_ignored": {("oversized",): float(self.oversized), ("untrusted",): float(self.untrusted)}}

    def resolve(self, obj: Mapping[str, Any]) -> Identity:
        namespace = str(_meta(obj).get("namespace") or "unknown")
        declared = declared_user(obj)
        current: Mapping[str, Any] | None = obj
        stamp: Stamp | None = None
        for _ in range(MAX_OWNER_DEPTH + 1):
            if current is None:
                break
            found = self._stamp(current)
            ref = controller_ref(current)
            if found is not None and not (ref is not None and is_controller(found.user)):
                stamp = found
                break
            if ref is None or self.owners is None:
                break
            current = self.owners.owner(namespace, ref)
            if current is not None and declared is None:
                declared = declared_user(current)
        if stamp is not None:
            claimed = declared if declared is not None and declared != stamp.user else None
            return Identity(stamp.user, "STAMPED", stamp.uid, claimed, stamp.groups)
        if declared is not None:
            return Identity(declared, "SELF_DECLARED")
        return Identity(namespace, "NAMESPACE")


# ------------------------------------------------------------------------------------------------
# Adapter: owners read from the API server


def owner_path(namespace: str, ref: Mapping[str, Any]) -> tuple[str, str, str, str] | None:
    """(group, version, plural, name) of a followed owner kind; None for any other (or a malformed ref)."""
    api_version, kind, name = str(ref.get("apiVersion") or ""), str(ref.get("kind") or ""), str(ref.get("name"))
    if "/" not in api_version or len(api_version) > MAX_NAME or len(name) > 253 or not namespace:
        return None
    group, version = api_version.split("/", 1)
    plural = OWNER_KINDS.get((group, kind))
    return (group, version, plural, name) if plural else None


class ApiOwners:
    """Owners read with GET as the watcher's identity, kept by uid (an owner's stamp never changes: the lock
    refuses it), at most `max_entries`; a missing owner is remembered as missing, an error is not."""

    def __init__(self, api_client: Any, max_entries: int = 8192) -> None:
        self.api_client = api_client
        self.max_entries = max_entries
        self._cache: OrderedDict[str, Mapping[str, Any] | None] = OrderedDict()
        self.errors = 0

    def owner(self, namespace: str, ref: Mapping[str, Any]) -> Mapping[str, Any] | None:
        uid = str(ref.get("uid"))
        if uid in self._cache:
            self._cache.move_to_end(uid)
            return self._cache[uid]
        path = owner_path(namespace, ref)
        if path is None:
            return None
        read, got = self._get(namespace, *path)
        if read:
            owner = got if got and _meta(got).get("uid") == uid else None  # a namesake made after the owner went
            self._cache[uid] = owner
            if len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
            return owner
        return None

    def _get(
        self, namespace: str, group: str, version: str, plural: str, name: str
    ) -> tuple[bool, Mapping[str, Any] | None]:
        """(answered, the object trimmed to what identity needs or None when it does not exist); (False, None) on
        another error (not remembered: asked again next time)."""
        import urllib3
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            obj = client.CustomObjectsApi(self.api_client).get_namespaced_custom_object(
                group, version, namespace, plural, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return True, None
            self.errors += 1
            log.warning("owner %s/%s %s/%s not read: %s %s", group, plural, namespace, name, exc.status, exc.reason)
            return False, None
        except (urllib3.exceptions.HTTPError, ConnectionError) as exc:  # unreachable: charged without the owner now
            self.errors += 1
            log.warning("owner %s/%s %s/%s not read: %s", group, plural, namespace, name, exc)
            return False, None
        meta = _meta(obj if isinstance(obj, Mapping) else {})
        labels, ann = _map(meta, "labels"), _map(meta, "annotations")
        keep = {k: meta.get(k) for k in ("name", "namespace", "uid", "creationTimestamp", "ownerReferences")}
        keep["labels"] = {k: labels[k] for k in USER_KEYS if k in labels}
        keep["annotations"] = {k: ann[k] for k in (*STAMP_KEYS, *USER_KEYS) if k in ann}
        return True, {"metadata": keep}


class ApiStampTrust:
    """Whether the stamp's admission objects are in force, read with GET (by name) at most every `refresh_s`:
    since when (the newest creationTimestamp of the four), or None while one is missing. An error reading them
    keeps the last answer (none yet: untrusted)."""

    def __init__(self, api_client: Any, refresh_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.api_client = api_client
        self.refresh_s = refresh_s
        self.clock = clock
        self._read_at: float | None = None
        self._since: int | None = None
        self.errors = 0

    def since_ms(self) -> int | None:
        now = self.clock()
        if self._read_at is None or now - self._read_at >= self.refresh_s:
            self._read_at = now
            self._since = self._read(self._since)
        return self._since

    def _read(self, last: int | None) -> int | None:
        import urllib3
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        from producers.policy_stamp import GROUP, KINDS, VERSION, render_objects

        api = client.CustomObjectsApi(self.api_client)
        created = []
        for obj in render_objects():
            plural, name = KINDS[obj["kind"]][0], obj["metadata"]["name"]
            try:
                got = api.get_cluster_custom_object(GROUP, VERSION, plural, name)
            except ApiException as exc:
                if exc.status == 404:
                    return None
                self.errors += 1
                log.warning("%s %s not read: %s %s; stamps trusted as before", plural, name, exc.status, exc.reason)
                return last
            except (urllib3.exceptions.HTTPError, ConnectionError) as exc:
                self.errors += 1
                log.warning("%s %s not read: %s; stamps trusted as before", plural, name, exc)
                return last
            created.append(created_ms(got if isinstance(got, Mapping) else {}))
        known = [c for c in created if c is not None]
        return max(known) if len(known) == len(created) else None
