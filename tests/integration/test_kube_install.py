"""The Kubernetes install applied for real (issue 42 item 3): `deploy/kubernetes/` (the workloads and settings,
the ClusterRoles and their bindings, the podresources DaemonSet) goes to the real kube-apiserver with server-side
apply, a server dry run first, then for real; every object is accepted by the server's validation and is there
afterwards, owned by the install's field manager.

Each service account may do exactly what the table in docs/deployment.md says and nothing more, as the API
server's RBAC answers (no string matching of the manifests):
- a SelfSubjectRulesReview as each account (impersonated) lists its rules; beyond what an account with no
  binding gets, they are the table's rows, no more and no fewer;
- a SubjectAccessReview for every row is allowed, and one for each denied sample is refused: other components'
  secrets, deleting namespaces, RBAC writes, pods, and every write verb on a resource of its rows that its rows
  do not grant (and a named row's verb on another name).
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml
from manifests import INSTALL, Right, kube_docs, pod_spec, rbac_table, workloads

from stack.kube.cluster import LocalKube

NS = "gpuledger"
MANAGER = "gpuledger-install"
OTHER_NS = "team-a"  # a user's namespace: the namespaced rights are cluster-wide bindings
# Cluster-scoped resources (a review of them names no namespace).
CLUSTER_SCOPED = {"namespaces", "nodes", "clusterroles", "clusterrolebindings", "clusterqueues", "resourceflavors",
                  "cohorts", "workloadpriorityclasses", "topologies", "admissionchecks", "validatingadmissionpolicies",
                  "validatingadmissionpolicybindings", "mutatingadmissionpolicies", "mutatingadmissionpolicybindings",
                  "customresourcedefinitions", "queues"}  # fmt: skip
WRITES = ("create", "update", "patch", "delete", "deletecollection")
NOBODY = "gpuledger-nobody"  # an account no binding names: what every authenticated account may do

# What no gpuledger account may do: (verb, resource, namespace, name).
NEVER = [
    ("get", "secrets", NS, "gpuledger-clickhouse"), ("list", "secrets", NS, ""), ("list", "secrets", "", ""),
    ("watch", "secrets", OTHER_NS, ""), ("get", "configmaps", NS, "gpuledger-settings"),
    ("delete", "namespaces", "", NS), ("create", "namespaces", "", ""),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", "", ""),
    ("patch", "clusterroles.rbac.authorization.k8s.io", "", "gpuledger-watcher"),
    ("escalate", "clusterroles.rbac.authorization.k8s.io", "", ""),
    ("bind", "clusterroles.rbac.authorization.k8s.io", "", "cluster-admin"),
    ("create", "rolebindings.rbac.authorization.k8s.io", NS, ""), ("impersonate", "users", "", ""),
    ("create", "pods", OTHER_NS, ""), ("delete", "pods", OTHER_NS, ""), ("create", "pods", NS, ""),
    ("create", "jobs.batch", OTHER_NS, ""), ("patch", "nodes", "", ""),
    ("create", "serviceaccounts", NS, ""), ("patch", "deployments.apps", NS, "gpuledger-processors"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io", "", ""),
    ("delete", "workloads.kueue.x-k8s.io", OTHER_NS, ""), ("delete", "clusterqueues.kueue.x-k8s.io", "", ""),
]  # fmt: skip


def _user(account: str) -> str:
    return f"system:serviceaccount:{NS}:{account}"


def _apply(kube: LocalKube, docs: list[dict[str, Any]], *extra: str) -> Any:
    return kube.kubectl("apply", "--server-side", f"--field-manager={MANAGER}", "--validate=strict", *extra,
                        "-f", "-", input=yaml.safe_dump_all(docs), check=False, timeout=120)  # fmt: skip


def _applied(stdout: str, dry: bool) -> list[str]:
    suffix = r" \(server dry run\)" if dry else ""
    return re.findall(rf"^(\S+) serverside-applied{suffix}$", stdout, re.M)


def _expand(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(verb, plural.group, name) for every combination a rule grants."""
    out = set()
    for rule in rules:
        for verb in rule["verbs"]:
            for group in rule.get("apiGroups", [""]):
                for resource in rule.get("resources", []):
                    for name in rule.get("resourceNames") or [""]:
                        out.add((verb, f"{resource}.{group}".rstrip("."), name))
    return out


def _rules_of(kube: LocalKube, account: str) -> set[tuple[str, str, str]]:
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": NS}}
    out = kube.kubectl("create", "--validate=false", "--as", _user(account), "-o", "json", "-f", "-",
                       input=json.dumps(review)).stdout  # fmt: skip
    status = json.loads(out)["status"]
    assert not status.get("incomplete"), status
    return _expand(status["resourceRules"])


def _review(account: str, verb: str, resource: str, namespace: str, name: str) -> dict[str, Any]:
    plural, _, group = resource.partition(".")
    attrs = {"verb": verb, "group": group, "resource": plural, "name": name,
             "namespace": "" if plural in CLUSTER_SCOPED else namespace}  # fmt: skip
    attrs = {k: v for k, v in attrs.items() if v}  # the server echoes no empty field
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{NS}", "system:authenticated"]
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": _user(account), "groups": groups, "resourceAttributes": attrs}}  # fmt: skip


def _decide(kube: LocalKube, reviews: list[dict[str, Any]]) -> list[bool]:
    """The API server's decision on each review, in order (one kubectl call)."""
    listed = {"apiVersion": "v1", "kind": "List", "items": reviews}
    out = kube.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(listed), timeout=120).stdout
    items, at, decoder = [], 0, json.JSONDecoder()
    while out[at:].strip():  # one JSON object per review, one after the other
        item, end = decoder.raw_decode(out, at + len(out[at:]) - len(out[at:].lstrip()))
        items.append(item)
        at = end
    assert [i["spec"]["user"] for i in items] == [r["spec"]["user"] for r in reviews]
    assert [i["spec"]["resourceAttributes"] for i in items] == [r["spec"]["resourceAttributes"] for r in reviews]
    return [bool(item["status"].get("allowed")) for item in items]


def test_the_install_applies_for_real_and_each_account_may_do_exactly_its_rows(local_kube: LocalKube) -> None:
    docs = kube_docs(INSTALL)
    namespaces = [d for d in docs if d["kind"] == "Namespace"]
    assert [n["metadata"]["name"] for n in namespaces] == [NS]
    # A dry run first: the namespace alone (a namespaced dry run needs its namespace to exist), then everything.
    dry = _apply(local_kube, namespaces, "--dry-run=server")
    assert dry.returncode == 0 and _applied(dry.stdout, dry=True) == [f"namespace/{NS}"], dry.stderr
    real = _apply(local_kube, namespaces)
    assert real.returncode == 0, real.stderr
    dry = _apply(local_kube, docs, "--dry-run=server")
    assert dry.returncode == 0, dry.stderr
    assert len(_applied(dry.stdout, dry=True)) == len(docs), dry.stdout
    real = _apply(local_kube, docs)
    assert real.returncode == 0, real.stderr
    assert len(_applied(real.stdout, dry=False)) == len(docs), real.stdout
    # Everything is there, as the install's own fields.
    listed = yaml.safe_dump_all(docs)
    got = local_kube.kubectl("get", "--show-managed-fields", "-o", "json", "-f", "-", input=listed)
    stored = json.loads(got.stdout)
    items = stored["items"] if stored.get("kind") == "List" else [stored]
    assert [(i["kind"], i["metadata"]["name"]) for i in items] == [(d["kind"], d["metadata"]["name"]) for d in docs]
    for item in items:
        managers = {(f["manager"], f["operation"]) for f in item["metadata"].get("managedFields", [])}
        assert (MANAGER, "Apply") in managers, (item["kind"], item["metadata"]["name"], managers)

    # Which account each workload runs as: the table's, for every workload of the install.
    accounts, rights = rbac_table()
    for workload in workloads(docs):
        name = workload["metadata"]["name"]
        assert name in accounts, f"{name}: no row in docs/deployment.md's rights table"
        assert pod_spec(workload)["serviceAccountName"] == accounts[name], name
    bound = {s["name"] for d in docs if d["kind"] == "ClusterRoleBinding" for s in d["subjects"]}
    declared = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    table_accounts = {r.account for r in rights} | set(accounts.values())
    assert bound <= table_accounts and declared <= table_accounts, (bound, declared, table_accounts)

    # Exactly the rows: the server's rules for each account, less what an unbound account gets.
    baseline = _rules_of(local_kube, NOBODY)
    for account in sorted(table_accounts):
        granted = _rules_of(local_kube, account) - baseline
        table = {(r.verb, r.resource, r.name) for r in rights if r.account == account}
        assert granted == table, (f"{account}: the server grants beyond the table {sorted(granted - table)}, "
                                  f"the table lists what the server refuses {sorted(table - granted)}")  # fmt: skip

    # Every row allowed; the denied samples refused.
    allowed: list[Right] = rights
    denied: list[tuple[str, str, str, str, str]] = []
    for account in sorted(table_accounts):
        mine = {(r.verb, r.resource, r.name) for r in rights if r.account == account}
        denied += [(account, v, res, ns, n) for v, res, ns, n in NEVER if (v, res, "") not in mine]
        for resource in {r.resource for r in rights if r.account == account}:
            denied += [(account, v, resource, OTHER_NS, "") for v in WRITES if (v, resource, "") not in mine]
        for r in (r for r in rights if r.account == account and r.name):
            denied.append((account, r.verb, r.resource, OTHER_NS, "someone-else"))
    reviews = [_review(r.account, r.verb, r.resource, OTHER_NS, r.name) for r in allowed]
    reviews += [_review(*d) for d in denied]
    decisions = _decide(local_kube, reviews)
    refused = [r for r, ok in zip(allowed, decisions, strict=False) if not ok]
    assert not refused, f"rows of the table the server refuses: {refused}"
    let_through = [d for d, ok in zip(denied, decisions[len(allowed) :], strict=True) if ok]
    assert not let_through, f"allowed, and must not be: {let_through}"
    assert len(allowed) > 50 and len(denied) > 150  # the check is not empty
