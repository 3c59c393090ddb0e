"""The chart's RBAC grants exactly what the operator uses: nothing more, nothing less, no wildcards.

Test design: `operator_permissions()` derives the permissions from the operator's code, not from a copy
of the chart: kopf's registry (every watched or indexed kind: list + watch; kinds with change handlers,
if any: patch for kopf's annotations), kube.seed_replicas (patch of a ChatbotService), kube.KINDS (owned
kinds are server-side applied: patch, plus create when an apply creates; ConfigMaps are only read by name;
Events only posted), kinds.DELETABLE and the picker's objects of kinds.DELETABLE_COMPONENTS (delete), kube.patch_status (status patch), owner references with
blockOwnerDeletion (finalizers update) and kopf's own needs (CRD discovery; namespaces with scope namespaces; peering with replicas > 1).
Each rendered rule set must equal that set, per scope. The cluster test in test_chart_cluster.py proves
the same against the API server: the operator runs under the chart's ServiceAccount, every request it
sends is recorded, and none is refused.
"""

from __future__ import annotations

from typing import Any

import pytest
from chart_helpers import Perm, find, granted, render

CLUSTER_SCOPED = {("", "nodes"), ("", "namespaces"), ("apiextensions.k8s.io", "customresourcedefinitions")}


def operator_permissions(*, scope: str, peering: bool) -> set[Perm]:
    """Every permission the operator uses, derived from its code (see the module docstring)."""
    import kopf
    from chatfleet_operator import api, kinds, kube, main  # noqa: F401  (main registers the handlers)
    from chatfleet_operator.builders.common import owner_reference
    from chatfleet_operator.spec import ObjectRef

    registry = kopf.get_default_registry()
    used: set[Perm] = set()
    for handlers in (registry._indexing, registry._watching, registry._changing):
        for handler in handlers.get_all_handlers():
            sel = handler.selector
            plural = sel.plural or sel.any_name
            used |= {(sel.group or "", plural, "list"), (sel.group or "", plural, "watch")}
    for handler in registry._changing.get_all_handlers():
        # kopf keeps handler progress and the last-handled configuration in annotations of the object.
        used.add((handler.selector.group, handler.selector.plural or handler.selector.any_name, "patch"))
    used.add((api.GROUP, api.PLURAL, "patch"))  # kube.seed_replicas: an autoscaled one's first scale

    group_of = {
        kind: (prefix.split("/")[2] if prefix.startswith("/apis/") else "")
        for kind, (prefix, _) in kube.KINDS.items()
    }
    for kind, (_, plural) in kube.KINDS.items():
        group = group_of[kind]
        if kind == "ConfigMap":
            used.add((group, plural, "get"))  # kube.config_map_data: spec.analysis.quality.promptsFrom
        elif kind == "Event":
            used.add((group, plural, "create"))  # kube.post_event
        elif kind == api.KIND:
            used.add((group, f"{plural}/status", "patch"))  # kube.patch_status
        else:
            used |= {(group, plural, "patch"), (group, plural, "create")}  # kube.apply (server-side apply)
    for kind in kinds.DELETABLE:
        used.add((group_of[kind], kube.KINDS[kind][1], "delete"))
    # kinds.DELETABLE_COMPONENTS: the endpoint picker's objects, deleted when the routing goes back to Services
    from chatfleet_operator.builders.inferencepool import build_picker

    for m in build_picker(ObjectRef("ns", "name", "uid"), "image", "account"):
        if m["metadata"]["labels"].get(api.LABEL_COMPONENT) in kinds.DELETABLE_COMPONENTS:
            used.add((group_of[m["kind"]], kube.KINDS[m["kind"]][1], "delete"))
    used.add(("", "pods", "patch"))  # kube.label_pod: the warm pool's serving label and deletion cost
    if owner_reference(ObjectRef("ns", "name", "uid")).get("blockOwnerDeletion"):
        used.add((api.GROUP, f"{api.PLURAL}/finalizers", "update"))

    used |= {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")}
    if scope == "namespaces":
        used |= {("", "namespaces", "list"), ("", "namespaces", "watch")}
    if peering:
        plural = "clusterkopfpeerings" if scope == "cluster" else "kopfpeerings"
        used |= {("kopf.dev", plural, v) for v in ("list", "watch", "patch")}
    return used


#: The label of the tenants' ClusterRoles (aggregated into view/edit/admin), which are not the operator's.
TENANTS = ("chatfleet.io/rbac-for", "tenants")


def is_tenants(doc: dict[str, Any]) -> bool:
    return doc["metadata"].get("labels", {}).get(TENANTS[0]) == TENANTS[1]


#: The label of the endpoint pickers' ServiceAccount, Role and RoleBinding (picker-rbac.yaml), not the operator's.
PICKERS = ("chatfleet.io/rbac-for", "endpoint-pickers")


def is_pickers(doc: dict[str, Any]) -> bool:
    return doc["metadata"].get("labels", {}).get(PICKERS[0]) == PICKERS[1]


def operators(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The operator's own objects of `kind` (not the tenants' roles, not the pickers')."""
    return [doc for doc in find(docs, kind) if not is_tenants(doc) and not is_pickers(doc)]


def rules_of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """All rules of all the operator's Roles or ClusterRoles (not the tenants', not the pickers')."""
    return [rule for doc in operators(docs, kind) for rule in doc["rules"]]


def tenant_roles(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The tenants' ClusterRoles by the default role they give to first: view, edit."""
    return {
        doc["metadata"]["name"].rsplit("-", 1)[1]: doc for doc in find(docs, "ClusterRole") if is_tenants(doc)
    }


def test_tenants_get_chatbotservices_through_the_default_roles() -> None:
    """view reads ChatbotServices (status and scale too); edit and admin also write and scale them; no
    tenant role writes the status (the operator's) or reaches anything else."""
    roles = tenant_roles(render([]))
    assert set(roles) == {"view", "edit"}
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    into = {
        name: {
            k[len(aggregate) :]
            for k, v in doc["metadata"]["labels"].items()
            if k.startswith(aggregate) and v == "true"
        }
        for name, doc in roles.items()
    }
    assert into == {"view": {"view", "edit", "admin"}, "edit": {"edit", "admin"}}
    view, edit = (granted(roles[name]["rules"]) for name in ("view", "edit"))
    cbs = "chatbotservices"
    assert view == {
        ("chatfleet.io", r, v)
        for r in (cbs, f"{cbs}/status", f"{cbs}/scale")
        for v in ("get", "list", "watch")
    }
    writes = {"create", "update", "patch", "delete", "deletecollection"}
    assert edit == {("chatfleet.io", cbs, v) for v in writes} | {
        ("chatfleet.io", f"{cbs}/scale", v) for v in ("update", "patch")
    }
    assert not {p for p in view | edit if p[1] == f"{cbs}/status" and p[2] in writes}


@pytest.mark.parametrize("off", ["rbac.aggregateToDefaultRoles=false", "rbac.create=false"])
def test_tenant_roles_can_be_left_out(off: str) -> None:
    assert tenant_roles(render([off])) == {}


CASES = [
    pytest.param("cluster", False, [], id="cluster"),
    pytest.param("cluster", True, ["replicaCount=2"], id="cluster-ha"),
    pytest.param("namespaces", False, ["watch.scope=namespaces"], id="namespaces"),
    pytest.param("namespaces", True, ["watch.scope=namespaces", "replicaCount=2"], id="namespaces-ha"),
]


@pytest.mark.parametrize(("scope", "peering", "sets"), CASES)
def test_rbac_grants_exactly_what_the_operator_uses(scope: str, peering: bool, sets: list[str]) -> None:
    docs = render(sets)
    perms = granted(rules_of(docs, "ClusterRole")) | granted(rules_of(docs, "Role"))
    used = operator_permissions(scope=scope, peering=peering)
    never_used = sorted(perms - used)
    missing = sorted(used - perms)
    assert not never_used, f"granted but never used by the operator: {never_used}"
    assert not missing, f"used by the operator but not granted: {missing}"


@pytest.mark.parametrize(("scope", "peering", "sets"), CASES)
def test_no_wildcards_and_narrow_writes(scope: str, peering: bool, sets: list[str]) -> None:
    docs = render(sets)
    rules = rules_of(docs, "ClusterRole") + rules_of(docs, "Role")
    for rule in rules:
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key], f"wildcard in {key}: {rule}"
    for group, resource, verb in granted(rules):
        # No escalation paths: no RBAC, no impersonation, no pods/exec, no tokens.
        assert group != "rbac.authorization.k8s.io" and verb not in ("escalate", "bind", "impersonate")
        assert resource not in ("pods/exec", "pods/attach", "serviceaccounts/token", "nodes/proxy")
    # Peering keep-alives may patch only the chart's own peering object.
    for rule in rules:
        if rule["apiGroups"] == ["kopf.dev"] and "patch" in rule["verbs"]:
            assert rule["resourceNames"] == ["chatfleet-operator"]


@pytest.mark.parametrize(("scope", "peering", "sets"), CASES)
def test_no_access_to_secrets(scope: str, peering: bool, sets: list[str]) -> None:
    """Not even get: the pods name Secrets and the kubelet reads them; a missing one shows in the pods'
    status (CreateContainerConfigError), so the operator never needs to see one."""
    from chatfleet_operator import kube

    docs = render(sets)
    perms = granted(rules_of(docs, "ClusterRole")) | granted(rules_of(docs, "Role"))
    secrets = sorted(p for p in perms if p[1] == "secrets" or p[1].startswith("secrets/"))
    assert not secrets, f"the operator's RBAC grants verbs on Secrets: {secrets}"
    assert "Secret" not in kube.KINDS, "kube.py can address Secrets (kinds.py lists the kind)"


def test_namespace_scope_keeps_writes_inside_the_watched_namespaces() -> None:
    docs = render(["watch.scope=namespaces", "watch.namespaces={team-a,team-b}"])
    cluster_perms = granted(rules_of(docs, "ClusterRole"))
    assert {(g, r) for g, r, _ in cluster_perms} <= CLUSTER_SCOPED
    assert {v for _, _, v in cluster_perms} == {"list", "watch"}, "cluster-wide access must be read-only"
    roles = operators(docs, "Role")
    bindings = operators(docs, "RoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings + find(docs, "ClusterRoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "cf-chatfleet-operator", "namespace": "chatfleet-system"}
        ]


def test_rules_are_commented() -> None:
    """Every rule in the template carries a comment saying why it exists."""
    from chart_helpers import CHART

    lines = (CHART / "templates" / "rbac.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("- apiGroups:"):
            before = [ln for ln in lines[max(0, i - 6) : i] if ln.strip()]
            assert any(ln.lstrip().startswith("#") for ln in before), f"rule at line {i + 1} has no comment"


def test_the_pickers_read_pods_and_routes_in_the_fleets_namespaces_and_nothing_else() -> None:
    """InferencePool routing's endpoint pickers: the chart writes their ServiceAccount and a Role to list
    and watch pods and HTTPRoutes (the route's weights), bound to that ServiceAccount only, in the watched
    namespaces or the ones listed."""
    docs = render(["watch.scope=namespaces", "watch.namespaces={team-a,team-b}"])
    roles = [d for d in find(docs, "Role") if is_pickers(d)]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert role["rules"] == [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
            {
                "apiGroups": ["gateway.networking.k8s.io"],
                "resources": ["httproutes"],
                "verbs": ["list", "watch"],
            },
        ]
    for binding in (d for d in find(docs, "RoleBinding") if is_pickers(d)):
        ns = binding["metadata"]["namespace"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "chatfleet-picker", "namespace": ns}
        ]
        assert binding["roleRef"]["kind"] == "Role"
    listed = render(["operator.gateway.pickerNamespaces={bots}"])
    assert [d["metadata"]["namespace"] for d in find(listed, "ServiceAccount") if is_pickers(d)] == ["bots"]
    # scope cluster without a list: none (status.routing.picker then says the pods cannot be created)
    assert not [d for d in find(render(), "Role") if is_pickers(d)]
    off = render(["watch.scope=namespaces", "operator.gateway.routing=Service"])
    assert not [d for d in find(off, "Role") if is_pickers(d)]
