"""The chart's limit on spec.model.hostPath: operator.allowedHostPaths feeds both the operator's
--allowed-host-path flags and a ValidatingAdmissionPolicy that refuses any other host path at admission.

Test design: rendering tests need only helm; the cluster tests install the chart (or its policy alone)
bound to a namespace of their own, so no other test's ChatbotServices meet the policy, and apply
ChatbotServices with kubectl. The policy's CEL must agree with the operator's own check
(converge/policy.py `host_path_allowed`) on the same table of paths.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from chart_helpers import CHART, find, helm, render, set_flags
from chatfleet_operator.converge.policy import host_path_allowed
from chatfleet_platform.common.config import REPO_ROOT
from chatfleet_platform.servers import services

POLICY = "templates/admissionpolicy.yaml"
ALLOWED = ("/data", "/srv/models")
ALLOWED_SET = "operator.allowedHostPaths={" + ",".join(ALLOWED) + "}"


def cbs(name: str, host_path: str) -> dict:
    """A ChatbotService whose weights come from a host path."""
    return {
        "apiVersion": "chatfleet.io/v1alpha1",
        "kind": "ChatbotService",
        "metadata": {"name": name},
        "spec": {"model": {"hostPath": host_path}},
    }


# ---- rendering -----------------------------------------------------------------------------------


def test_the_policy_and_the_operator_get_the_same_prefixes() -> None:
    docs = render([ALLOWED_SET])
    (policy,) = find(docs, "ValidatingAdmissionPolicy")
    (binding,) = find(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [
        {
            "apiGroups": ["chatfleet.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["chatbotservices"],
        }
    ]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert json.loads(variables["allowed"]) == list(ALLOWED)
    (validation,) = policy["spec"]["validations"]
    assert "/data, /srv/models" in validation["messageExpression"]
    assert "spec.model.hostPath" in validation["messageExpression"]
    (dep,) = find(docs, "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--allowed-host-path")] == [
        f"--allowed-host-path={p}" for p in ALLOWED
    ]


def test_default_allows_no_host_path() -> None:
    docs = render([])
    (policy,) = find(docs, "ValidatingAdmissionPolicy")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert json.loads(variables["allowed"]) == []
    assert "allows no host paths" in policy["spec"]["validations"][0]["messageExpression"]
    (dep,) = find(docs, "Deployment")
    assert not [a for a in dep["spec"]["template"]["spec"]["containers"][0]["args"] if "host-path" in a]


def test_binding_covers_only_the_watched_namespaces() -> None:
    docs = render(["watch.scope=namespaces", "watch.namespaces={team-a,team-b}"])
    (binding,) = find(docs, "ValidatingAdmissionPolicyBinding")
    selector = binding["spec"]["matchResources"]["namespaceSelector"]
    assert selector == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
        ]
    }
    (cluster_wide,) = find(render([]), "ValidatingAdmissionPolicyBinding")
    assert "matchResources" not in cluster_wide["spec"]  # scope cluster: every namespace


@pytest.mark.parametrize(
    "prefix", ["data", "/data/", "/data/../etc", "/data//x", ".."], ids=lambda p: p.replace("/", "_") or "_"
)
def test_bad_prefixes_are_refused_by_the_schema(prefix: str) -> None:
    proc = helm(
        "template", "cf", str(CHART), *set_flags([f"operator.allowedHostPaths={{{prefix}}}"]), check=False
    )
    assert proc.returncode != 0 and "allowedHostPaths" in proc.stderr, proc.stderr


# ---- on the local cluster ------------------------------------------------------------------------


@pytest.fixture
def bound_ns(cluster) -> Iterator[str]:
    """A namespace of this test's own, with the chart's CRDs served."""
    name = f"hp-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    cluster.install_crds(CHART / "crds", ("chatbotservices.chatfleet.io",))
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def apply(cluster, namespace: str, doc: dict, *, dry_run: bool = False):
    """kubectl apply of one object (server-side dry run when asked); the CompletedProcess."""
    extra = ["--dry-run=server"] if dry_run else []
    return cluster.kubectl(
        "apply", *extra, "-f", "-", input=json.dumps(doc), namespace=namespace, check=False
    )


def policy_in_force(cluster, namespace: str) -> bool:
    """Whether the policy refuses a '..' path yet (bindings take effect a moment after they are created)."""
    return apply(cluster, namespace, cbs("probe", "/x/../y"), dry_run=True).returncode != 0


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_installed_chart_refuses_a_host_path_outside_the_allowed_prefixes(cluster, bound_ns: str) -> None:
    env = {**cluster.env, "HELM_CACHE_HOME": str(REPO_ROOT / ".work" / "helm-cache")}
    release = f"hp-{uuid.uuid4().hex[:6]}"
    sets = ["watch.scope=namespaces", f"watch.namespaces={{{bound_ns}}}", ALLOWED_SET]
    helm(
        "install",
        release,
        str(CHART),
        "-n",
        bound_ns,
        "--wait",
        "--timeout",
        "120s",
        *set_flags(sets),
        env=env,
    )
    try:
        assert services.wait_until(lambda: policy_in_force(cluster, bound_ns), 30), (
            "the policy never took effect"
        )
        # outside: refused at admission, with the field and the allowed prefixes named; nothing stored
        for name, path in [
            ("etc", "/etc/kubernetes"),
            ("lookalike", "/database"),
            ("escape", "/data/../etc"),
        ]:
            proc = apply(cluster, bound_ns, cbs(name, path))
            assert proc.returncode != 0, f"{path} was admitted"
            assert "spec.model.hostPath" in proc.stderr and "/data, /srv/models" in proc.stderr, proc.stderr
            assert path in proc.stderr
            gone = cluster.kubectl("get", "chatbotservice", name, namespace=bound_ns, check=False)
            assert gone.returncode != 0
        # inside: admitted
        for name, path in [("data", "/data"), ("below", "/data/llama"), ("srv", "/srv/models/x")]:
            proc = apply(cluster, bound_ns, cbs(name, path))
            assert proc.returncode == 0, proc.stderr
        # an update that keeps the stored hostPath passes; one that moves it outside does not
        kept = cbs("below", "/data/llama")
        kept["metadata"]["labels"] = {"team": "a"}
        assert apply(cluster, bound_ns, kept).returncode == 0
        moved = apply(cluster, bound_ns, cbs("below", "/etc"))
        assert moved.returncode != 0 and "spec.model.hostPath /etc" in moved.stderr, moved.stderr
    finally:
        cluster.kubectl("delete", "chatbotservice", "--all", "--wait=false", namespace=bound_ns, check=False)
        helm("uninstall", release, "-n", bound_ns, "--wait", "--timeout", "60s", check=False, env=env)


#: (path, allowed?) per allowed set: the operator's own table (tests/unit/operator/test_operator_policy.py).
TABLE = [
    "/data",
    "/data/x",
    "/data/x/y",
    "/database",
    "/dat",
    "/",
    "/data/../etc",
    "/data/..",
    "/data/x..y",
    "/srv/m",
    "/anything/at/all",
    "/../etc",
]


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize(
    "allowed", [(), ("/data",), ("/data", "/srv"), ("/",)], ids=lambda a: ",".join(a) or "none"
)
def test_the_policy_agrees_with_the_operators_check(cluster, bound_ns: str, allowed: tuple[str, ...]) -> None:
    """The chart's policy alone (rendered, applied), bound to this test's namespace, judges every path of
    the table as the operator does."""
    release = f"hp-{uuid.uuid4().hex[:6]}"
    sets = ["watch.scope=namespaces", f"watch.namespaces={{{bound_ns}}}"]
    if allowed:
        sets.append("operator.allowedHostPaths={" + ",".join(allowed) + "}")
    text = helm("template", release, str(CHART), *set_flags(sets), "--show-only", POLICY).stdout
    cluster.kubectl("apply", "-f", "-", input=text)
    try:
        assert services.wait_until(lambda: policy_in_force(cluster, bound_ns), 30), (
            "the policy never took effect"
        )
        disagree = []
        for i, path in enumerate(TABLE):
            admitted = apply(cluster, bound_ns, cbs(f"p{i}", path), dry_run=True).returncode == 0
            if admitted != host_path_allowed(path, allowed):
                disagree.append(f"{path}: admission {admitted}, operator {not admitted}")
        assert not disagree, disagree
    finally:
        cluster.kubectl("delete", "-f", "-", input=text, check=False)
