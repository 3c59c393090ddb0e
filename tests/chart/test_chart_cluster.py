"""The chart on the local platform: server-side dry run, install/upgrade/uninstall, and the RBAC proof.

Test design: each test installs its own release (unique name) into its own namespace and removes both.
The CRDs are cluster-wide and shared with the other suites; Helm never deletes them, and neither do we.
The RBAC proof runs the real operator as a subprocess with a kubeconfig holding a token of the chart's
ServiceAccount, pointed at a recording proxy (chart_apiproxy.py), and drives one ChatbotService through
create -> Ready -> release -> delete; every request is recorded with its answer, none may be refused,
and every granted permission must have been used.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_apiproxy import Record, RecordingProxy
from chart_helpers import CHART, VALUE_SETS, granted, helm, render_text, set_flags
from chatfleet_platform.common.config import REPO_ROOT
from chatfleet_platform.servers import services
from needs import missing, need_executable

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CRD_NAME = "chatbotservices.chatfleet.io"
#: Granted permissions that no request exercises, each with its reason (keep this list short).
UNOBSERVED_BY_DESIGN = {
    # Checked by the OwnerReferencesPermissionEnforcement admission plugin when an owned object sets
    # blockOwnerDeletion; that plugin is off on the local platform, on in OpenShift and many others.
    ("chatfleet.io", "chatbotservices/finalizers", "update"): "admission-time check, not a request",
    # Applied only when the cluster serves Gateway API and a release splits traffic by weight (the release
    # e2e suite installs those CRDs; this test's cluster may not serve them).
    **{
        ("gateway.networking.k8s.io", "httproutes", v): "needs Gateway API and a weighted release"
        for v in ("list", "watch", "create", "patch")
    },
    # Written instead of the HPA only when the cluster serves KEDA (this test's cluster does not run it;
    # tests/integration/operator/test_operator_keda.py does, under the operator's own credentials).
    **{("keda.sh", "scaledobjects", v): "needs KEDA" for v in ("list", "watch", "create", "patch", "delete")},
    # Traefik's mirror of a release's shadow phase, only with --gateway-mirror TraefikService, Traefik's
    # CRDs and a shadow phase (tests/realnode/test_realnode_quality.py, under the operator's credentials).
    **{
        ("traefik.io", "traefikservices", v): "needs Traefik's CRDs and a shadow phase"
        for v in ("list", "watch", "create", "patch", "delete")
    },
    # InferencePools, and the deletes of the endpoint picker's Deployment and Service, only where the
    # cluster serves Gateway API and its Inference Extension (the release e2e suite installs both CRDs;
    # this test's cluster serves neither), the deletes when it stops serving the latter.
    **{
        ("inference.networking.k8s.io", "inferencepools", v): "needs the Inference Extension's CRD"
        for v in ("list", "watch", "create", "patch", "delete")
    },
    ("apps", "deployments", "delete"): "only the endpoint picker's, when InferencePool routing ends",
    ("", "services", "delete"): "only the endpoint picker's, when InferencePool routing ends",
    # Pod labels are patched only with spec.scaling.autoscale.warmPool (test_operator_keda.py).
    ("", "pods", "patch"): "needs a warm pool",
    # A ConfigMap is read by name only at a quality measurement with spec.analysis.quality.promptsFrom,
    # which needs real pods and Prometheus (tests/realnode/test_realnode_quality.py).
    ("", "configmaps", "get"): "needs an analysed release with golden prompts from a ConfigMap",
}


def unique(prefix: str) -> str:
    """A unique DNS label."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def release_ns(cluster) -> Iterator[str]:
    """A namespace for a release (the `namespace` fixture is the one the operator watches)."""
    name = unique("cfsys")
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def helm_env(cluster) -> dict[str, str]:
    """helm against the local cluster."""
    return {**cluster.env, "HELM_CACHE_HOME": str(REPO_ROOT / ".work" / "helm-cache")}


def uninstall(cluster, release: str, namespace: str) -> None:
    """helm uninstall, tolerating an already removed release."""
    helm(
        "uninstall",
        release,
        "-n",
        namespace,
        "--wait",
        "--timeout",
        "60s",
        check=False,
        env=helm_env(cluster),
    )


def apply_chart_crds(cluster) -> None:
    """The chart's CRDs, Established (idempotent; shared by every suite)."""
    cluster.install_crds(CHART / "crds", (CRD_NAME, "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"))


DRY_RUN_SETS = [
    pytest.param(sets, id=name)
    for name, sets in VALUE_SETS.items()
    if name not in ("monitoring", "namespaces")
]


@pytest.mark.parametrize("sets", DRY_RUN_SETS)
def test_rendered_manifests_pass_server_side_dry_run(cluster, namespace: str, sets: list[str]) -> None:
    apply_chart_crds(cluster)
    # objects rendered into named namespaces (the fleets' NetworkPolicy) go to this test's namespace
    sets = [x.replace("{team-a,team-b}", f"{{{namespace}}}") for x in sets]
    text = render_text(
        [*sets, f"watch.namespaces={{{namespace}}}"] if "watch.scope=namespaces" in sets else sets,
        namespace=namespace,
        release=unique("dry"),
    )
    proc = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-f", "-", input=text, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "created (server dry run)" in proc.stdout


PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator@v0.80.1"


def prometheus_operator_crds() -> Path:
    """The Prometheus Operator CRDs in the Go module cache, or fail (hack/chart-monitoring-crds.sh fetches them)."""
    go = need_executable("go", "run `make setup` (the Go toolchain locates the Prometheus Operator CRDs)")
    cache = subprocess.run(
        [go, "env", "GOMODCACHE"], capture_output=True, text=True, timeout=30
    ).stdout.strip()
    crds = Path(cache) / PROMETHEUS_OPERATOR / "example" / "prometheus-operator-crd"
    if not crds.is_dir():
        missing(
            "the Prometheus Operator CRDs (Go module cache)",
            "run `make setup` (or hack/chart-monitoring-crds.sh)",
        )
    return crds


def test_monitoring_objects_pass_server_side_dry_run(cluster, namespace: str) -> None:
    """PodMonitors and the PrometheusRule against the real monitoring.coreos.com CRDs (strict fields)."""
    crds = prometheus_operator_crds()
    for kind in ("podmonitors", "prometheusrules"):
        cluster.install_crd(crds / f"monitoring.coreos.com_{kind}.yaml", f"{kind}.monitoring.coreos.com")
    text = render_text(VALUE_SETS["monitoring"], namespace=namespace, release=unique("mon"))
    proc = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-f", "-", input=text, check=False
    )
    assert proc.returncode == 0, proc.stderr
    # the fleets', the relays' and the operator's
    assert proc.stdout.count("podmonitor.monitoring.coreos.com/") == 3, proc.stdout
    assert "prometheusrule.monitoring.coreos.com/" in proc.stdout, proc.stdout


def test_install_upgrade_uninstall(cluster, release_ns: str) -> None:
    env, release = helm_env(cluster), unique("cf")
    try:
        # install: CRDs from crds/ (kept if they exist), the operator's Deployment available.
        out = helm(
            "install", release, str(CHART), "-n", release_ns, "--wait", "--timeout", "120s", env=env
        ).stdout
        assert f"kubectl -n {release_ns} rollout status deployment/{release}-chatfleet-operator" in out
        assert "helm show crds" in out  # NOTES explain CRD upgrades
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
        dep = json.loads(
            cluster.kubectl(
                "get", "deployment", f"{release}-chatfleet-operator", "-o", "json", namespace=release_ns
            ).stdout
        )
        assert dep["status"].get("availableReplicas") == 1
        assert dep["spec"]["template"]["spec"]["serviceAccountName"] == f"{release}-chatfleet-operator"

        # upgrade to a hot standby pair: peering object and PDB appear.
        helm(
            "upgrade",
            release,
            str(CHART),
            "-n",
            release_ns,
            "--wait",
            "--timeout",
            "120s",
            *set_flags(["replicaCount=2"]),
            env=env,
        )
        assert cluster.kubectl("get", "clusterkopfpeering", "chatfleet-operator", check=False).returncode == 0
        assert (
            cluster.kubectl("get", "pdb", f"{release}-chatfleet-operator", namespace=release_ns).returncode
            == 0
        )
        replicas = cluster.kubectl(
            "get",
            "deployment",
            f"{release}-chatfleet-operator",
            "-o",
            "jsonpath={.status.availableReplicas}",
            namespace=release_ns,
        ).stdout
        assert replicas == "2"

        # upgrade back to the defaults (--reset-values: a bare upgrade reuses the last values): what
        # replicaCount=2 added is removed again.
        helm(
            "upgrade",
            release,
            str(CHART),
            "-n",
            release_ns,
            "--reset-values",
            "--wait",
            "--timeout",
            "120s",
            env=env,
        )
        assert (
            cluster.kubectl(
                "get", "pdb", f"{release}-chatfleet-operator", namespace=release_ns, check=False
            ).returncode
            != 0
        )
        history = json.loads(helm("history", release, "-n", release_ns, "-o", "json", env=env).stdout)
        assert [h["status"] for h in history] == ["superseded", "superseded", "deployed"]
    finally:
        uninstall(cluster, release, release_ns)

    # uninstall: every templated object is gone, cluster-scoped ones included; the CRD stays (by design).
    left = cluster.kubectl(
        "get",
        "deployment,serviceaccount,networkpolicy",
        "-l",
        f"app.kubernetes.io/instance={release}",
        "-o",
        "name",
        namespace=release_ns,
    ).stdout
    assert left.strip() == ""
    left = cluster.kubectl(
        "get",
        "clusterrole,clusterrolebinding,validatingadmissionpolicy,validatingadmissionpolicybinding",
        "-l",
        f"app.kubernetes.io/instance={release}",
        "-o",
        "name",
    ).stdout
    assert left.strip() == ""
    assert cluster.kubectl("get", "crd", CRD_NAME, check=False).returncode == 0


def can_i(cluster, user: str, verb: str, resource: str, namespace: str) -> bool:
    """`kubectl auth can-i` as a user: the API server's RBAC decision. `resource/sub` names a subresource
    (kubectl reads `TYPE/NAME` as an object's name, so it goes by --subresource)."""
    resource, _, sub = resource.partition("/")
    extra = [f"--subresource={sub}"] if sub else []
    res = cluster.kubectl(
        "auth", "can-i", verb, resource, *extra, "--as", user, namespace=namespace, check=False
    )
    return res.stdout.strip() == "yes"


def test_tenants_bound_to_the_default_roles_reach_chatbotservices(cluster, release_ns: str) -> None:
    """The chart's tenant ClusterRoles, aggregated by the API server's controller into `view` and `edit`:
    a user bound to `edit` in a namespace creates, changes and scales ChatbotServices there, never writes
    their status, and nothing elsewhere; one bound to `view` reads them only."""
    apply_chart_crds(cluster)
    docs = [
        d
        for d in yaml.safe_load_all(render_text())
        if d
        and d["kind"] == "ClusterRole"
        and d["metadata"]["labels"].get("chatfleet.io/rbac-for") == "tenants"
    ]
    suffix = unique("t")
    for doc in docs:  # a name of this test's own (cluster-scoped); aggregation goes by the labels
        doc["metadata"]["name"] += f"-{suffix}"
    names = [d["metadata"]["name"] for d in docs]
    assert len(names) == 2, names
    alice, bob = f"alice-{suffix}", f"bob-{suffix}"
    try:
        cluster.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
        )
        cluster.kubectl(
            "create",
            "rolebinding",
            "alice-edit",
            "--clusterrole=edit",
            f"--user={alice}",
            namespace=release_ns,
        )
        cluster.kubectl(
            "create", "rolebinding", "bob-view", "--clusterrole=view", f"--user={bob}", namespace=release_ns
        )
        cbs = "chatbotservices.chatfleet.io"
        deadline = time.monotonic() + 60
        while not (
            can_i(cluster, alice, "create", cbs, release_ns) and can_i(cluster, bob, "get", cbs, release_ns)
        ):
            assert time.monotonic() < deadline, "the tenant rules never reached the edit and view roles"
            time.sleep(1)
        for verb in ("create", "update", "patch", "delete", "list", "watch"):
            assert can_i(cluster, alice, verb, cbs, release_ns), verb
        assert can_i(cluster, alice, "patch", f"{cbs}/scale", release_ns)
        assert not can_i(cluster, alice, "patch", f"{cbs}/status", release_ns)
        assert not can_i(cluster, alice, "create", cbs, "default")  # bound in one namespace only
        assert can_i(cluster, bob, "list", cbs, release_ns) and can_i(
            cluster, bob, "get", f"{cbs}/status", release_ns
        )
        for verb in ("create", "patch", "delete"):
            assert not can_i(cluster, bob, verb, cbs, release_ns), verb
    finally:
        cluster.kubectl("delete", "clusterrole", *names, "--ignore-not-found", check=False)


def test_bad_values_are_refused_by_helm_install(cluster, release_ns: str) -> None:
    proc = helm(
        "install",
        unique("bad"),
        str(CHART),
        "-n",
        release_ns,
        "--set",
        "runAsUser=0",
        check=False,
        env=helm_env(cluster),
    )
    assert proc.returncode != 0
    assert "at '/runAsUser': minimum: got 0, want 1" in proc.stderr


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        pytest.param(
            [], ["It watches ChatbotServices in every namespace.", "kubectl apply -n default"], id="cluster"
        ),
        pytest.param(
            ["watch.scope=namespaces", "replicaCount=2"],
            [
                "It watches ChatbotServices in: {ns}.",
                "kubectl apply -n {ns}",
                "2 replicas run as hot standbys",
            ],
            id="namespaces-ha",
        ),
    ],
)
def test_notes_tell_what_to_do_next(cluster, release_ns: str, sets: list[str], expected: list[str]) -> None:
    apply_chart_crds(cluster)  # a dry run installs no CRDs, and the peering object needs its own
    out = helm(
        "install",
        unique("notes"),
        str(CHART),
        "-n",
        release_ns,
        "--dry-run=client",
        *set_flags(sets),
        env=helm_env(cluster),
    ).stdout
    notes = out.split("NOTES:", 1)[1]
    for line in expected:
        assert line.format(ns=release_ns) in notes, notes
    assert "helm show crds" in notes and "Monitoring is off" in notes


# ---- the RBAC proof ------------------------------------------------------------------------------


def sa_kubeconfig(path: Path, server: str, token: str) -> Path:
    """A kubeconfig that authenticates with a ServiceAccount token (and nothing else)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "proxy", "cluster": {"server": server}}],
        "users": [{"name": "operator-sa", "user": {"token": token}}],
        "contexts": [{"name": "operator-sa", "context": {"cluster": "proxy", "user": "operator-sa"}}],
        "current-context": "operator-sa",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


#: Every ChatbotService body the polling below has seen (checked against kstatus' needs afterwards).
SEEN: list[dict[str, Any]] = []


def get_cbs(cluster, namespace: str, name: str) -> dict[str, Any] | None:
    """The ChatbotService, or None (remembered in SEEN)."""
    proc = cluster.kubectl("get", "chatbotservice", name, "-o", "json", namespace=namespace, check=False)
    body = json.loads(proc.stdout) if proc.returncode == 0 else None
    if body is not None:
        SEEN.append(body)
    return body


def kstatus_invariant_broken(body: dict[str, Any]) -> str | None:
    """Why kstatus would call this body Current while it is not Ready (None when it would not)."""
    status = body.get("status") or {}
    if status.get("observedGeneration") != body["metadata"]["generation"] or not status.get("conditions"):
        return None  # kstatus: InProgress
    true = {c["type"] for c in status["conditions"] if c["status"] == "True"}
    if "Ready" not in true and not true & {"Reconciling", "Stalled"}:
        return f"Ready is not True but neither Reconciling nor Stalled is: {status['conditions']}"
    return None


def ready_at(cluster, namespace: str, name: str, generation: int) -> dict[str, Any] | None:
    """The ChatbotService when Ready=True for `generation`."""
    body = get_cbs(cluster, namespace, name)
    status = (body or {}).get("status") or {}
    if status.get("observedGeneration") != generation:
        return None
    ready = [c for c in status.get("conditions", []) if c["type"] == "Ready"]
    return body if ready and ready[0]["status"] == "True" else None


@pytest.mark.timeout(300)
def test_operator_runs_under_the_chart_serviceaccount_with_no_permission_missing_or_unused(
    cluster, namespace: str, release_ns: str, tmp_path: Path
) -> None:
    env, release = helm_env(cluster), unique("rbac")
    SEEN.clear()
    # the chart's admission policy admits the test's hostPath (/models/tiny; the pods are simulated)
    sets = [
        "watch.scope=namespaces",
        f"watch.namespaces={{{namespace}}}",
        "operator.allowedHostPaths={/models}",
    ]
    helm(
        "install",
        release,
        str(CHART),
        "-n",
        release_ns,
        "--wait",
        "--timeout",
        "120s",
        *set_flags(sets),
        env=env,
    )
    sa = f"{release}-chatfleet-operator"
    token = cluster.kubectl("create", "token", sa, "--duration=1h", namespace=release_ns).stdout.strip()
    proxy = RecordingProxy(cluster.server, cluster.workdir / "pki" / "ca.crt").start()
    kubeconfig = sa_kubeconfig(tmp_path / "operator-sa.kubeconfig", proxy.url, token)
    log = tmp_path / "operator.log"
    proc = None
    try:
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "chatfleet_operator.cli",
                    "run",
                    f"--namespace={namespace}",
                    "--allowed-host-path=/models",  # as the chart's operator.allowedHostPaths above
                ],
                cwd=REPO_ROOT,
                env={**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"},
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        started = services.wait_until(lambda: "Initial authentication has finished" in log.read_text(), 30)
        assert started, log.read_text()[-3000:]

        # create: a chatbot that autoscales and keeps sessions in Redis. No Secret is read, not even the
        # one it names: the pods name it and the kubelet reads it (simulated pods here start without it;
        # a real kubelet's CreateContainerConfigError shows in tests/realnode/test_realnode_missing_secret.py).
        cbs = {
            "apiVersion": "chatfleet.io/v1alpha1",
            "kind": "ChatbotService",
            "metadata": {"name": "rbac-bot", "namespace": namespace},
            "spec": {
                "model": {"hostPath": "/models/tiny"},
                "runtime": {"sessions": {"redis": {"secretName": "redis"}}},
                "scaling": {"autoscale": {"minReplicas": 1, "maxReplicas": 2}},
                # One unanalysed step: a release completes without a Prometheus on the local platform.
                "rollout": {"canary": {"steps": [{"weight": 100, "pauseSeconds": 0, "analysis": False}]}},
            },
        }
        cluster.kubectl("apply", "-f", "-", input=json.dumps(cbs))
        # generation 2: the operator set spec.scaling.replicas, the scale its HPA reads and writes
        first = services.wait_until(lambda: ready_at(cluster, namespace, "rbac-bot", 2), 90)
        assert first, (
            f"never Ready:\n{cluster.kubectl('get', 'cbs', 'rbac-bot', '-o', 'yaml', namespace=namespace).stdout}\n{log.read_text()[-3000:]}"
        )
        assert cluster.kubectl("get", "hpa", "rbac-bot", namespace=namespace, check=False).returncode == 0

        assert first["spec"]["scaling"]["replicas"] == 1
        # release: a new revision (generation 3) that also switches to fixed replicas (the HPA goes).
        patch = {"spec": {"runtime": {"maxNewTokens": 128}, "scaling": {"autoscale": None, "replicas": 1}}}
        cluster.kubectl(
            "patch",
            "chatbotservice",
            "rbac-bot",
            "--type=merge",
            "-p",
            json.dumps(patch),
            namespace=namespace,
        )
        second = services.wait_until(lambda: ready_at(cluster, namespace, "rbac-bot", 3), 90)
        assert second, log.read_text()[-3000:]
        assert second["status"]["stableRevision"] != first["status"]["stableRevision"]
        gone = services.wait_until(
            lambda: (
                cluster.kubectl("get", "hpa", "rbac-bot", namespace=namespace, check=False).returncode != 0
            ),
            30,
        )
        assert gone, "the HPA was not deleted"

        # delete: the garbage collector removes the owned objects.
        cluster.kubectl(
            "delete", "chatbotservice", "rbac-bot", "--wait=true", "--timeout=60s", namespace=namespace
        )
        cleaned = services.wait_until(
            lambda: (
                cluster.kubectl(
                    "get",
                    "deployment,service,pdb",
                    "-l",
                    "chatfleet.io/service=rbac-bot",
                    "-o",
                    "name",
                    namespace=namespace,
                ).stdout.strip()
                == ""
            ),
            60,
        )
        assert cleaned
        time.sleep(2)  # the operator sees the deletion and goes quiet
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        proxy.stop()
        uninstall(cluster, release, release_ns)

    text = log.read_text(errors="replace")
    records = list(proxy.records)
    (tmp_path / "requests.json").write_text(json.dumps([r.__dict__ for r in records], indent=1))

    # 1. Nothing was refused, and the operator itself did the work (not another operator in the cluster).
    refused = [f"{r.method} {r.path} -> {r.status}" for r in records if r.status in (401, 403)]
    assert not refused, f"requests refused under the chart's ServiceAccount: {refused}"
    assert "forbidden" not in text.lower(), text[-3000:]
    assert not [r.path for r in records if "/secrets" in r.path], "the operator asked for a Secret"
    created = {r.permission()[1] for r in records if r.creates_by_apply()}
    assert {
        "deployments",
        "services",
        "poddisruptionbudgets",
        "horizontalpodautoscalers",
    } <= created

    # 2. Every status seen lets Flux's kstatus tell Ready from not Ready (docs/gitops.md).
    broken = [why for body in SEEN if (why := kstatus_invariant_broken(body))]
    assert not broken, broken[:3]

    # 3. Every granted permission was used (or is listed with its reason above).
    used = set()
    for r in records:
        perm = r.permission()
        if perm is not None and r.status is not None and (r.status < 400 or r.status == 404):
            used.add(perm[:3])
            if r.creates_by_apply():
                used.add((perm[0], perm[1], "create"))
    docs = [d for d in yaml.safe_load_all(render_text(sets, release=release, namespace=release_ns)) if d]
    perms = granted(
        rule
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
        and d["metadata"]["labels"].get("chatfleet.io/rbac-for") != "tenants"
        for rule in d["rules"]
    )  # the operator's (the tenants' roles are tested on their own below)
    unused = sorted(perms - used - UNOBSERVED_BY_DESIGN.keys())
    assert not unused, f"granted but never used in create -> Ready -> release -> delete: {unused}"


# ---- hot standby ---------------------------------------------------------------------------------


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthz(port: int) -> int | None:
    """HTTP status of kopf's liveness endpoint, None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as rsp:
            return rsp.status
    except OSError:
        return None


def applied(proxy: RecordingProxy, kind: str) -> list[Record]:
    """Server-side applies of one kind (plural) sent through a proxy."""
    return [
        r
        for r in proxy.records
        if r.method == "PATCH" and f"/{kind}/" in r.path and "apply" in r.content_type
    ]


@pytest.mark.timeout(300)
def test_hot_standby_with_kopf_peering_under_the_chart_serviceaccount(
    cluster, namespace: str, release_ns: str, tmp_path: Path
) -> None:
    """replicaCount=2: the standby pauses, serves its liveness probe, and takes over when the leader stops."""
    env, release = helm_env(cluster), unique("ha")
    sets = [
        "watch.scope=namespaces",
        f"watch.namespaces={{{namespace}}}",
        "replicaCount=2",
        "operator.allowedHostPaths={/models}",  # the test's hostPath (/models/tiny; simulated pods)
    ]
    helm(
        "install",
        release,
        str(CHART),
        "-n",
        release_ns,
        "--wait",
        "--timeout",
        "120s",
        *set_flags(sets),
        env=env,
    )
    # Wait out "storage is (re)initializing" of freshly created CRDs: kopf's first keep-alive is not retried
    # (the next one comes a lifetime later), so the peering must be writable before the leader starts.
    writable = services.wait_until(
        lambda: (
            cluster.kubectl(
                "patch",
                "kopfpeering",
                "chatfleet-operator",
                "--type=merge",
                "-p",
                "{}",
                namespace=namespace,
                check=False,
            ).returncode
            == 0
        ),
        30,
    )
    assert writable
    sa = f"{release}-chatfleet-operator"
    token = cluster.kubectl("create", "token", sa, "--duration=1h", namespace=release_ns).stdout.strip()
    ca = cluster.workdir / "pki" / "ca.crt"
    proxies = {name: RecordingProxy(cluster.server, ca).start() for name in ("leader", "standby")}
    ports = {name: free_port() for name in proxies}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = {name: tmp_path / f"{name}.log" for name in proxies}

    def start(name: str, priority: int) -> None:
        kubeconfig = sa_kubeconfig(tmp_path / f"{name}.kubeconfig", proxies[name].url, token)
        argv = [sys.executable, "-m", "chatfleet_operator.cli", "run", f"--namespace={namespace}"]
        argv += ["--peering=chatfleet-operator", f"--priority={priority}"]
        argv += [f"--liveness=http://127.0.0.1:{ports[name]}/healthz", "--allowed-host-path=/models"]
        with open(logs[name], "wb") as fh:
            procs[name] = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env={
                    **os.environ,
                    "KUBECONFIG": str(kubeconfig),
                    "POD_ID": f"{release}-{name}",
                    "PYTHONUNBUFFERED": "1",
                },
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        ok = services.wait_until(lambda: "Initial authentication has finished" in logs[name].read_text(), 30)
        assert ok, logs[name].read_text()[-3000:]

    def stop(name: str) -> None:
        proc = procs.pop(name, None)
        if proc is not None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def peers() -> dict[str, Any]:
        body = cluster.kubectl(
            "get", "kopfpeering", "chatfleet-operator", "-o", "json", namespace=namespace
        ).stdout
        return json.loads(body).get("status") or {}

    try:
        # 1. The leader (higher priority) keeps itself alive in the chart's KopfPeering.
        start("leader", 200)
        assert services.wait_until(lambda: f"{release}-leader" in peers(), 30), logs["leader"].read_text()[
            -2000:
        ]
        # 2. The standby joins the peering and stays paused (kopf starts paused and resumes only when no
        #    peer outranks it), and still answers its liveness probe.
        start("standby", 100)
        joined = services.wait_until(lambda: f"{release}-standby" in peers(), 30)
        assert joined, logs["standby"].read_text()[-3000:]
        assert services.wait_until(lambda: healthz(ports["standby"]) == 200, 15)
        assert healthz(ports["leader"]) == 200

        # 3. Only the leader works.
        cbs = {
            "apiVersion": "chatfleet.io/v1alpha1",
            "kind": "ChatbotService",
            "metadata": {"name": "ha-bot", "namespace": namespace},
            "spec": {
                "model": {"hostPath": "/models/tiny"},
                "rollout": {"canary": {"steps": [{"weight": 100, "pauseSeconds": 0, "analysis": False}]}},
            },
        }
        cluster.kubectl("apply", "-f", "-", input=json.dumps(cbs))
        assert services.wait_until(lambda: ready_at(cluster, namespace, "ha-bot", 1), 90), logs[
            "leader"
        ].read_text()[-3000:]
        assert applied(proxies["leader"], "deployments")
        assert not applied(proxies["standby"], "deployments"), "the paused standby wrote"
        assert "Resuming operations" not in logs["standby"].read_text()

        # 4. The leader stops (a rolling update, a drained node): the standby resumes and serves the next change.
        stop("leader")
        resumed = services.wait_until(lambda: "Resuming operations" in logs["standby"].read_text(), 30)
        assert resumed, logs["standby"].read_text()[-3000:]
        patch = {"spec": {"runtime": {"maxNewTokens": 128}}}
        cluster.kubectl(
            "patch", "chatbotservice", "ha-bot", "--type=merge", "-p", json.dumps(patch), namespace=namespace
        )
        second = services.wait_until(lambda: ready_at(cluster, namespace, "ha-bot", 2), 90)
        assert second, logs["standby"].read_text()[-3000:]
        assert applied(proxies["standby"], "deployments")
    finally:
        for name in list(procs):
            stop(name)
        for proxy in proxies.values():
            proxy.stop()
        cluster.kubectl(
            "delete", "chatbotservice", "ha-bot", "--wait=false", namespace=namespace, check=False
        )
        uninstall(cluster, release, release_ns)

    records = [r for proxy in proxies.values() for r in proxy.records]
    refused = [f"{r.method} {r.path} -> {r.status}" for r in records if r.status in (401, 403)]
    assert not refused, f"requests refused under the chart's ServiceAccount: {refused}"
    peering = {r.permission()[:3] for r in records if r.permission() and r.permission()[0] == "kopf.dev"}
    assert peering == {("kopf.dev", "kopfpeerings", v) for v in ("list", "watch", "patch")}
