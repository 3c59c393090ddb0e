"""The chart renders cleanly, keeps the CRDs in sync, runs restricted, and refuses bad values clearly.

Test design: every rendering test runs through the value sets of chart_helpers.VALUE_SETS (default,
hot standby, namespace scope, monitoring on, image by digest, Prometheus over https), so a template branch that breaks under
one of them fails here without a cluster.
"""

from __future__ import annotations

import json
import shlex
import tarfile

import pytest
import yaml
from chart_helpers import CHART, VALUE_SETS, find, helm, one, render, render_text, set_flags
from chatfleet_platform.common.config import REPO_ROOT

SETS = [pytest.param(sets, id=name) for name, sets in VALUE_SETS.items()]


class TestLintAndTemplate:
    @pytest.mark.parametrize("sets", SETS)
    def test_lint_strict_is_clean(self, sets: list[str]) -> None:
        proc = helm("lint", "--strict", str(CHART), *set_flags(sets))
        assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout
        assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout
        assert proc.stderr == ""

    @pytest.mark.parametrize("sets", SETS)
    def test_every_object_is_named_labelled_and_namespaced(self, sets: list[str]) -> None:
        cluster_kinds = {
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterKopfPeering",
            "CustomResourceDefinition",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        }
        for doc in render(sets):
            meta = doc["metadata"]
            assert meta["labels"]["app.kubernetes.io/instance"] == "cf", doc["kind"]
            assert meta["labels"]["app.kubernetes.io/part-of"] == "chatfleet"
            assert ("namespace" in meta) != (doc["kind"] in cluster_kinds), f"{doc['kind']} {meta['name']}"

    def test_package_contains_the_crds(self, tmp_path) -> None:
        helm("package", str(CHART), "--destination", str(tmp_path))
        (archive,) = tmp_path.glob("chatfleet-operator-*.tgz")
        with tarfile.open(archive) as tar:
            files = [m for m in tar.getmembers() if m.name.startswith("chatfleet-operator/crds/")]
            docs = [d for m in files for d in yaml.safe_load_all(tar.extractfile(m).read()) if d]
        assert all(d["kind"] == "CustomResourceDefinition" for d in docs)
        assert {d["metadata"]["name"] for d in docs} == {
            "chatbotservices.chatfleet.io",
            "clusterkopfpeerings.kopf.dev",
            "kopfpeerings.kopf.dev",
        }


class TestCrds:
    def test_chart_crds_are_a_verbatim_copy_of_crds_dir(self) -> None:
        sources = sorted((REPO_ROOT / "crds").glob("*.yaml"))
        assert sources, "crds/ holds no CRD"
        for src in sources:
            copy = CHART / "crds" / src.name
            assert copy.exists(), f"{copy} is missing: run hack/sync-chart-crds.sh"
            assert copy.read_bytes() == src.read_bytes(), (
                f"charts/chatfleet-operator/crds/{src.name} differs from crds/{src.name}: run hack/sync-chart-crds.sh"
            )

    def test_no_symlinks_in_the_chart(self) -> None:
        # Flux's source-controller drops symlinks from Git artifacts; Helm warns about them.
        assert [p for p in CHART.rglob("*") if p.is_symlink()] == []


class TestOperatorDeployment:
    @pytest.mark.parametrize("sets", SETS)
    def test_pod_meets_the_restricted_pod_security_profile(self, sets: list[str]) -> None:
        pod = one(render(sets), "Deployment")["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["securityContext"]["runAsUser"] > 0
        assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
            assert {"requests", "limits"} <= container["resources"].keys()
            assert {"livenessProbe", "readinessProbe", "startupProbe"} <= container.keys()
        assert all("hostPath" not in v for v in pod.get("volumes", []))

    def test_single_replica_runs_standalone_with_recreate(self) -> None:
        docs = render()
        dep = one(docs, "Deployment")
        assert dep["spec"]["replicas"] == 1
        assert dep["spec"]["strategy"] == {"type": "Recreate"}
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[0] == "run" and not any(a.startswith("--peering") for a in args)
        assert not any(a.startswith("--namespace") for a in args)
        assert find(docs, "PodDisruptionBudget") == [] and find(docs, "ClusterKopfPeering") == []

    def test_replicas_above_one_use_kopf_peering_a_pdb_and_spread(self) -> None:
        docs = render(["replicaCount=2"])
        dep = one(docs, "Deployment")
        spec = dep["spec"]["template"]["spec"]
        assert "--peering=chatfleet-operator" in spec["containers"][0]["args"]
        assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
        assert spec["affinity"]["podAntiAffinity"]
        assert one(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
        assert one(docs, "ClusterKopfPeering")["metadata"]["name"] == "chatfleet-operator"

    def test_namespace_scope_watches_the_listed_namespaces(self) -> None:
        docs = render(["watch.scope=namespaces", "watch.namespaces={team-a,team-b}", "replicaCount=2"])
        args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        assert [a for a in args if a.startswith("--namespace")] == [
            "--namespace=team-a",
            "--namespace=team-b",
        ]
        roles = [r for r in find(docs, "Role") if "rbac-for" not in str(r["metadata"].get("labels"))]
        assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
        assert sorted(r["metadata"]["namespace"] for r in find(docs, "KopfPeering")) == ["team-a", "team-b"]
        assert find(docs, "ClusterKopfPeering") == []

    def test_analysis_allowed_hosts_become_flags(self) -> None:
        docs = render(["operator.analysisAllowedHosts={10.96.0.0/12,*.corp.example}"])
        args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        assert [a for a in args if a.startswith("--analysis-allowed-host")] == [
            "--analysis-allowed-host=10.96.0.0/12",
            "--analysis-allowed-host=*.corp.example",
        ]
        assert not [a for a in render_default_args() if a.startswith("--analysis-allowed-host")]

    def test_namespace_scope_defaults_to_the_release_namespace(self) -> None:
        docs = render(["watch.scope=namespaces"], namespace="bots")
        args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--namespace=bots" in args
        roles = [r for r in find(docs, "Role") if "rbac-for" not in str(r["metadata"].get("labels"))]
        assert [r["metadata"]["namespace"] for r in roles] == ["bots"]

    def test_image_defaults_to_app_version_and_prefers_a_digest(self) -> None:
        chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
        image = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == f"ghcr.io/chatfleet/chatfleet-operator:{chart['appVersion']}"
        digest = "sha256:" + "b" * 64
        dep = one(render([f"image.digest={digest}", "image.tag=9.9.9"]), "Deployment")
        assert (
            dep["spec"]["template"]["spec"]["containers"][0]["image"]
            == f"ghcr.io/chatfleet/chatfleet-operator@{digest}"
        )

    def test_rendered_args_are_accepted_by_the_operator_cli(self) -> None:
        """The chart passes only flags `chatfleet_operator.cli run` knows."""
        from chatfleet_operator import cli

        args = one(
            render(
                [
                    "replicaCount=2",
                    "operator.verbose=true",
                    "operator.analysisAllowedHosts={10.0.0.0/8}",
                    "monitoring.operatorPodMonitor.enabled=true",
                    "operator.prometheus.ca.secret=prometheus-ca",
                    "operator.prometheus.bearerToken.secret=prometheus-token",
                    "operator.prometheus.bearerToken.hosts={prometheus.monitoring.svc}",
                ]
            ),
            "Deployment",
        )
        argv = args["spec"]["template"]["spec"]["containers"][0]["args"]
        missing = []
        for flag in argv[1:]:
            try:
                cli.parse_args(["run", flag])
            except SystemExit:
                missing.append(flag.split("=")[0])
        assert not missing, f"the operator CLI lacks {missing}"


def pod_of(docs: list[dict]) -> dict:
    """The operator pod's spec."""
    return one(docs, "Deployment")["spec"]["template"]["spec"]


def mounted(pod: dict, flag: str) -> tuple[str, dict]:
    """(the file a --FLAG=FILE arg names, the volume mounted over its folder)."""
    container = pod["containers"][0]
    (path,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith(f"{flag}=")]
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert path == f"{mount['mountPath']}/" + path.rsplit("/", 1)[1]
    return path.rsplit("/", 1)[1], volume


class TestPrometheusConnection:
    """operator.prometheus: the CA and the token become files in the pod, and the flags name them."""

    def test_default_verifies_with_the_system_cas_and_sends_no_token(self) -> None:
        pod = pod_of(render())
        assert not [
            a
            for a in pod["containers"][0]["args"]
            if a.startswith("--prometheus") and not a.startswith("--prometheus-address")
        ]
        assert [v["name"] for v in pod["volumes"]] == ["tmp"]

    def test_ca_from_a_config_map_and_the_projected_service_account_token(self) -> None:
        pod = pod_of(render(VALUE_SETS["prometheus-tls"]))
        name, ca = mounted(pod, "--prometheus-ca-file")
        assert ca["configMap"] == {"name": "prometheus-ca", "items": [{"key": "ca.crt", "path": name}]}
        name, token = mounted(pod, "--prometheus-bearer-token-file")
        assert token["projected"]["sources"] == [
            {"serviceAccountToken": {"path": name, "expirationSeconds": 3600, "audience": "prometheus"}}
        ]
        assert "--prometheus-insecure-skip-verify" not in pod["containers"][0]["args"]

    def test_ca_and_token_from_secrets(self) -> None:
        pod = pod_of(
            render(
                [
                    "operator.prometheus.ca.secret=prom-tls",
                    "operator.prometheus.ca.key=bundle.pem",
                    "operator.prometheus.bearerToken.secret=prom-token",
                    "operator.prometheus.bearerToken.key=bearer",
                    "operator.prometheus.bearerToken.hosts={prometheus.monitoring.svc}",
                ]
            )
        )
        name, ca = mounted(pod, "--prometheus-ca-file")
        assert ca["secret"] == {"secretName": "prom-tls", "items": [{"key": "bundle.pem", "path": name}]}
        name, token = mounted(pod, "--prometheus-bearer-token-file")
        assert token["secret"] == {
            "secretName": "prom-token",
            "defaultMode": 0o440,  # the operator's group (fsGroup) reads it, nobody else
            "items": [{"key": "bearer", "path": name}],
        }

    def test_the_flags_give_the_operator_the_mounted_files(self) -> None:
        from chatfleet_operator import cli

        args = pod_of(render(VALUE_SETS["prometheus-tls"]))["containers"][0]["args"]
        prometheus = cli.build_settings(cli.parse_args(args)).prometheus
        assert prometheus.ca_file == "/etc/chatfleet/prometheus/ca/ca.crt"
        assert prometheus.bearer_token_file == "/etc/chatfleet/prometheus/token/token"
        assert prometheus.bearer_token_hosts == ("prometheus.monitoring.svc",)
        assert prometheus.insecure_skip_verify is False

    def test_a_token_needs_the_hosts_it_may_go_to(self) -> None:
        """A ChatbotService's author chooses its Prometheus address: without hosts the token could go to
        a Service of theirs."""
        proc = helm(
            "template",
            "cf",
            str(CHART),
            *set_flags(["operator.prometheus.bearerToken.secret=t"]),
            check=False,
        )
        assert proc.returncode != 0 and "operator.prometheus.bearerToken.hosts" in proc.stderr

    def test_insecure_skip_verify_is_a_flag_and_mounts_nothing(self) -> None:
        pod = pod_of(render(["operator.prometheus.insecureSkipVerify=true"]))
        assert [
            a
            for a in pod["containers"][0]["args"]
            if a.startswith("--prometheus") and not a.startswith("--prometheus-address")
        ] == ["--prometheus-insecure-skip-verify"]
        assert [v["name"] for v in pod["volumes"]] == ["tmp"]

    @pytest.mark.parametrize(
        ("sets", "message"),
        [
            pytest.param(
                ["operator.prometheus.ca.configMap=a", "operator.prometheus.ca.secret=b"],
                "operator.prometheus.ca names both a configMap and a secret",
                id="ca-twice",
            ),
            pytest.param(
                ["operator.prometheus.ca.secret=a", "operator.prometheus.insecureSkipVerify=true"],
                "operator.prometheus.insecureSkipVerify is set with operator.prometheus.ca",
                id="ca-and-skip",
            ),
            pytest.param(
                [
                    "operator.prometheus.bearerToken.secret=a",
                    "operator.prometheus.bearerToken.serviceAccountToken.enabled=true",
                ],
                "operator.prometheus.bearerToken names a secret and enables serviceAccountToken",
                id="token-twice",
            ),
        ],
    )
    def test_conflicting_values_fail_with_an_explanation(self, sets: list[str], message: str) -> None:
        proc = helm("template", "cf", str(CHART), *set_flags(sets), check=False)
        assert proc.returncode != 0, f"{shlex.join(sets)} was accepted"
        assert message in proc.stderr, proc.stderr


BAD_VALUES = [
    pytest.param(["replicaCount=0"], "/replicaCount", id="replicas-zero"),
    pytest.param(["watch.scope=everything"], "/watch/scope", id="scope-enum"),
    pytest.param(["watch.namespaces={Team_A}"], "/watch/namespaces/0", id="namespace-not-dns"),
    pytest.param(["runAsUser=0"], "/runAsUser", id="root-user"),
    pytest.param(["image.digest=latest"], "/image/digest", id="digest-pattern"),
    pytest.param(["image.pullPolicy=Sometimes"], "/image/pullPolicy", id="pull-policy-enum"),
    pytest.param(["operator.healthPort=80"], "/operator/healthPort", id="privileged-port"),
    pytest.param(["operator.extraArgs={verbose}"], "/operator/extraArgs/0", id="extra-arg-not-a-flag"),
    pytest.param(
        ["operator.analysisAllowedHosts={http://x}"],
        "/operator/analysisAllowedHosts/0",
        id="allowed-host-not-a-url",
    ),
    pytest.param(["resources.limits=null"], "/resources", id="limits-required"),
    pytest.param(
        ["monitoring.prometheusRule.errorRatePercent=150"],
        "/monitoring/prometheusRule/errorRatePercent",
        id="percent-range",
    ),
    pytest.param(
        ["monitoring.prometheusRule.gpuUtilizationFor=five minutes"],
        "/monitoring/prometheusRule/gpuUtilizationFor",
        id="duration-pattern",
    ),
    pytest.param(
        ["operator.prometheus.bearerToken.serviceAccountToken.expirationSeconds=60"],
        "/operator/prometheus/bearerToken/serviceAccountToken/expirationSeconds",
        id="token-lifetime-below-the-api-minimum",
    ),
    pytest.param(
        ["operator.prometheus.ca.configMap=Not_A_Name"], "/operator/prometheus/ca/configMap", id="ca-name"
    ),
    pytest.param(["replicas=2"], "additional properties 'replicas' not allowed", id="typo-top-level"),
    pytest.param(
        ["monitoring.podMonitor.enabled=true"],
        "additional properties 'podMonitor' not allowed",
        id="typo-nested",
    ),
]


class TestValuesSchema:
    @pytest.mark.parametrize(("sets", "message"), BAD_VALUES)
    def test_bad_values_fail_with_a_message_naming_the_key(self, sets: list[str], message: str) -> None:
        proc = helm("template", "cf", str(CHART), *set_flags(sets), check=False)
        assert proc.returncode != 0, f"{shlex.join(sets)} was accepted"
        assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
        assert message in proc.stderr, proc.stderr

    def test_namespaces_with_cluster_scope_fail_with_an_explanation(self) -> None:
        proc = helm("template", "cf", str(CHART), "--set", "watch.namespaces={team-a}", check=False)
        assert proc.returncode != 0
        assert "watch.namespaces is set but watch.scope is cluster" in proc.stderr, proc.stderr

    def test_schema_covers_every_default_value(self) -> None:
        schema = json.loads((CHART / "values.schema.json").read_text())
        values = yaml.safe_load((CHART / "values.yaml").read_text())

        def walk(node: dict, props: dict, path: str) -> None:
            for key, value in node.items():
                assert key in props, f"{path}{key} has no schema"
                sub = props[key]
                if isinstance(value, dict) and "properties" in sub:
                    walk(value, sub["properties"], f"{path}{key}.")
                assert "description" in sub, f"{path}{key} has no description in the schema"

        walk(values, schema["properties"], "")


def render_default_args() -> list[str]:
    """The operator's args with default values."""
    return one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]


def test_render_text_has_no_crds_unless_asked() -> None:
    assert "CustomResourceDefinition" not in render_text()
    assert "kind: CustomResourceDefinition" in render_text(crds=True)


class TestClusterDefaults:
    """operator.defaults: what a ChatbotService that names none gets, passed to the operator as flags."""

    def test_the_runtime_image_follows_the_charts_app_version_unless_set(self) -> None:
        chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
        args = pod_of(render([]))["containers"][0]["args"]
        assert f"--runtime-image=ghcr.io/chatfleet/chatfleet-runtime:{chart['appVersion']}" in args
        assert "--prometheus-address=http://prometheus.monitoring.svc:9090" in args
        args = pod_of(
            render(
                [
                    "operator.defaults.runtimeImage=registry.example/rt@sha256:" + "a" * 64,
                    "operator.defaults.prometheusAddress=https://prom.example:9091",
                ]
            )
        )["containers"][0]["args"]
        assert "--runtime-image=registry.example/rt@sha256:" + "a" * 64 in args
        assert "--prometheus-address=https://prom.example:9091" in args

    def test_the_operator_takes_them_as_its_defaults(self) -> None:
        from chatfleet_operator.cli import build_settings, parse_args

        args = pod_of(render(["operator.defaults.runtimeImage=registry.example/rt:2"]))["containers"][0][
            "args"
        ]
        settings = build_settings(parse_args(args))  # the args begin with `run`
        assert settings.runtime.defaults.runtime_image == "registry.example/rt:2"
        assert settings.runtime.defaults.prometheus_address == "http://prometheus.monitoring.svc:9090"

    def test_a_bad_address_is_refused_naming_the_value(self) -> None:
        proc = helm(
            "template",
            "cf",
            str(CHART),
            *set_flags(["operator.defaults.prometheusAddress=prom:9090"]),
            check=False,
        )
        assert proc.returncode != 0 and "operator/defaults/prometheusAddress" in proc.stderr


class TestPickerPlacement:
    """operator.gateway.pickerNodeSelector / pickerTolerations: passed as flags, read back by the operator
    into the picker pod's nodeSelector and tolerations."""

    def test_the_values_reach_the_picker_pod_through_the_operators_flags(self) -> None:
        from chatfleet_operator.builders.inferencepool import placement
        from chatfleet_operator.cli import build_settings, parse_args

        values = [
            "operator.gateway.pickerNodeSelector.pool=system",
            "operator.gateway.pickerTolerations[0].key=dedicated",
            "operator.gateway.pickerTolerations[0].value=system",
            "operator.gateway.pickerTolerations[0].effect=NoSchedule",
            "operator.gateway.pickerTolerations[1].key=chatfleet.io/any",
            "operator.gateway.pickerTolerations[1].operator=Exists",
        ]
        args = pod_of(render(values))["containers"][0]["args"]
        release = build_settings(parse_args(args), {}).release
        assert placement(release.picker_node_selector, release.picker_tolerations) == {
            "nodeSelector": {"pool": "system"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"},
                {"key": "chatfleet.io/any", "operator": "Exists"},
            ],
        }
        default = build_settings(parse_args(pod_of(render([]))["containers"][0]["args"]), {}).release
        assert placement(default.picker_node_selector, default.picker_tolerations) == {}

    def test_an_unknown_effect_is_refused_naming_the_value(self) -> None:
        proc = helm(
            "template",
            "cf",
            str(CHART),
            *set_flags(
                [
                    "operator.gateway.pickerTolerations[0].key=a",
                    "operator.gateway.pickerTolerations[0].effect=Never",
                ]
            ),
            check=False,
        )
        assert proc.returncode != 0 and "operator/gateway/pickerTolerations/0/effect" in proc.stderr
