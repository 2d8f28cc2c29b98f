"""The verified submitter on Kubernetes: a MutatingAdmissionPolicy that stamps the creating request's
`userInfo` into annotations of the objects users create, and a ValidatingAdmissionPolicy that refuses any
later change to them (admissionregistration.k8s.io/v1). Rendered with the Kueue policy objects
(producers/policy_kueue.py) and applied, diffed and owned the same way.

- The stamp: on CREATE of a batch Job or CronJob, a JobSet, a Volcano Job, a Kubeflow job, a Deployment,
  StatefulSet or ReplicaSet, or a Pod, the API server writes `gpuledger.io/submitter` (username),
  `gpuledger.io/submitter-uid` (uid) and `gpuledger.io/submitter-groups` (groups joined by ","). The
  mutation is an ApplyConfiguration merged into the object, so a value the submitter wrote into those keys
  is replaced by the request's own; `failurePolicy: Fail`, because an object the policy failed to stamp
  would keep whatever the submitter pre-filled.
- Objects created by controllers (a Job controller's pods) are stamped with the controller's identity;
  the producer (producers/kube_identity.py) charges them to the stamp of the owner they point at.
- The lock: an UPDATE whose stamp annotations differ from the stored object's (changed, added or removed)
  is refused with a message naming them.
"""

from __future__ import annotations

from typing import Any

SUBMITTER = "gpuledger.io/submitter"
SUBMITTER_UID = "gpuledger.io/submitter-uid"
SUBMITTER_GROUPS = "gpuledger.io/submitter-groups"
STAMP_KEYS = (SUBMITTER, SUBMITTER_UID, SUBMITTER_GROUPS)

GROUP = "admissionregistration.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
STAMP_POLICY = "gpuledger-submitter-stamp"
LOCK_POLICY = "gpuledger-submitter-stamp-locked"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuledger-policy"}

# kind -> (plural, namespaced), as policy_kueue.KINDS
KINDS: dict[str, tuple[str, bool]] = {
    "MutatingAdmissionPolicy": ("mutatingadmissionpolicies", False),
    "MutatingAdmissionPolicyBinding": ("mutatingadmissionpolicybindings", False),
    "ValidatingAdmissionPolicy": ("validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": ("validatingadmissionpolicybindings", False),
}

# What users create, by API group: (versions, resources). Every served version is named so that a request
# through any of them is matched (matchPolicy Equivalent covers conversions between them as well).
STAMPED: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("", ("v1",), ("pods",)),
    ("batch", ("v1",), ("jobs", "cronjobs")),
    ("apps", ("v1",), ("deployments", "statefulsets", "replicasets")),
    ("jobset.x-k8s.io", ("v1alpha2",), ("jobsets",)),
    ("batch.volcano.sh", ("v1alpha1",), ("jobs",)),
    ("kubeflow.org", ("v1",), ("pytorchjobs", "mpijobs", "tfjobs", "xgboostjobs", "paddlejobs", "jaxjobs")),
    ("kubeflow.org", ("v2beta1",), ("mpijobs",)),
    ("trainer.kubeflow.org", ("v1alpha1",), ("trainjobs",)),
)

LOCK_MESSAGE = (
    f"gpuledger: the annotations {', '.join(STAMP_KEYS)} record who created this object; the API server "
    "sets them at creation and they cannot be changed, added or removed afterwards"
)


def _rules(operations: list[str]) -> list[dict[str, Any]]:
    return [{"apiGroups": [group], "apiVersions": list(versions), "operations": list(operations),
             "resources": list(resources)} for group, versions, resources in STAMPED]  # fmt: skip


def _meta(name: str) -> dict[str, Any]:
    return {"name": name, "labels": dict(MANAGED_BY)}


# The request's identity; an empty uid or no groups (some authenticators give none) stamps "".
_STAMP = (
    "Object{metadata: Object.metadata{annotations: {"
    f"'{SUBMITTER}': request.userInfo.username, "
    f"'{SUBMITTER_UID}': has(request.userInfo.uid) ? request.userInfo.uid : '', "
    f"'{SUBMITTER_GROUPS}': has(request.userInfo.groups) ? request.userInfo.groups.join(',') : ''"
    "}}}"
)

# One key's value on the new and the stored object ('' when absent): an added or removed key is a change too.
_LOCKED = " && ".join(
    f"(has(object.metadata.annotations) && '{k}' in object.metadata.annotations ? "
    f"object.metadata.annotations['{k}'] : '') == "
    f"(has(oldObject.metadata.annotations) && '{k}' in oldObject.metadata.annotations ? "
    f"oldObject.metadata.annotations['{k}'] : '')"
    for k in STAMP_KEYS
)


def render_objects() -> list[dict[str, Any]]:
    """The MutatingAdmissionPolicy (+ binding) that stamps and the ValidatingAdmissionPolicy (+ binding) that
    locks the stamp, in an order the API server accepts them in (a binding after its policy)."""
    everywhere: dict[str, Any] = {"namespaceSelector": {}, "objectSelector": {}}
    return [
        {
            "apiVersion": API_VERSION, "kind": "MutatingAdmissionPolicy", "metadata": _meta(STAMP_POLICY),
            "spec": {
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "matchConstraints": {"resourceRules": _rules(["CREATE"])},
                "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": _STAMP}}],
            },
        },
        {
            "apiVersion": API_VERSION, "kind": "MutatingAdmissionPolicyBinding", "metadata": _meta(STAMP_POLICY),
            "spec": {"policyName": STAMP_POLICY, "matchResources": dict(everywhere)},
        },
        {
            "apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicy", "metadata": _meta(LOCK_POLICY),
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": _rules(["UPDATE"])},
                "validations": [{"expression": _LOCKED, "message": LOCK_MESSAGE, "reason": "Forbidden"}],
            },
        },
        {
            "apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicyBinding", "metadata": _meta(LOCK_POLICY),
            "spec": {"policyName": LOCK_POLICY, "validationActions": ["Deny"], "matchResources": dict(everywhere)},
        },
    ]  # fmt: skip
