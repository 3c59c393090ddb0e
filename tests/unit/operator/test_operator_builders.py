"""Builders: one test class per builder, table-driven. Pure: no cluster."""

from __future__ import annotations

import pytest
from chatfleet_operator import api
from chatfleet_operator.builders import (
    build_deployment,
    build_hpa,
    build_pdb,
    build_service,
    chat_model_config,
    revision_hash,
    selector_labels,
    triton_config_annotations,
)
from chatfleet_operator.builders.common import seconds_quantity
from chatfleet_operator.settings import HpaMetricSettings, PodSettings
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef

REF = ObjectRef("ns", "bot", "uid-1", 3)


def spec_of(**parts) -> ChatbotServiceSpec:
    """Spec with a default model and the given parts."""
    return ChatbotServiceSpec.from_dict({"model": {"uri": "hf://org/m"}, **parts})


def deployment(**parts):
    """Deployment built from spec parts."""
    spec = spec_of(**parts)
    replicas = None if spec.scaling.autoscale else spec.scaling.replicas
    return build_deployment(REF, spec, PodSettings(), revision="abc", replicas=replicas)


def containers(dep):
    """Containers by name."""
    return {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}


CONFIG = "triton.chatfleet.io/chat.config.pbtxt"


def config_of(spec: ChatbotServiceSpec) -> dict[str, str]:
    """{file name: config.pbtxt} as the pod gets it: the template's annotations, through its volume."""
    template = build_deployment(REF, spec, PodSettings(), revision="abc")["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == "triton-config"]
    return {
        item["path"]: annotations[item["fieldRef"]["fieldPath"].split("'")[1]]
        for item in volume["downwardAPI"]["items"]
    }


class TestTritonConfig:
    def test_files_come_from_the_runtime_generator_through_the_pod_template(self):
        assert sorted(config_of(spec_of())) == ["chat.config.pbtxt"]
        assert sorted(triton_config_annotations(spec_of())) == [CONFIG]

    @pytest.mark.parametrize("streaming", [True, False])
    def test_the_pod_gets_exactly_one_model_the_decoupled_chat(self, streaming):
        """One engine per replica, one copy of the weights: a single decoupled model, streaming or not."""
        ((name, text),) = config_of(spec_of(runtime={"streaming": streaming})).items()
        assert name == "chat.config.pbtxt" and text.startswith('name: "chat"\n')
        assert "model_transaction_policy { decoupled: true }" in text

    @pytest.mark.parametrize(
        ("runtime", "expected"),
        [
            pytest.param({"dynamicBatching": {"maxBatchSize": 32}}, "max_batch_size: 32", id="max-batch"),
            pytest.param({"instancesPerGPU": 3}, "count: 3 kind: KIND_GPU", id="instances-per-gpu"),
            pytest.param({"precision": "bf16"}, '"bf16"', id="precision"),
            pytest.param({"maxNewTokens": 99}, '"99"', id="max-new-tokens"),
        ],
    )
    def test_spec_reaches_config_pbtxt(self, runtime, expected):
        assert expected in config_of(spec_of(runtime=runtime))["chat.config.pbtxt"]

    @pytest.mark.parametrize(
        ("kv_cache", "expected"),
        [
            # the defaults: a share of the device, derived prefix store, nothing written but the entries
            pytest.param({}, {}, id="defaults"),
            pytest.param(
                {"memory": "20Gi", "prefixCacheMemory": "2Gi"},
                {"kv_memory_bytes": str(20 * 2**30), "prefix_cache_bytes": str(2 * 2**30)},
                id="quantities-in-bytes",
            ),
            pytest.param({"memory": 1500000000}, {"kv_memory_bytes": "1500000000"}, id="a-number-of-bytes"),
            pytest.param({"memoryFraction": 0.5}, {"kv_memory_fraction": "0.5"}, id="fraction"),
            pytest.param(
                {"typicalPromptTokens": 1024, "admissionQueue": 8, "admissionWaitMilliseconds": 2500},
                {"kv_typical_prompt_tokens": "1024", "admission_queue": "8", "admission_wait_ms": "2500"},
                id="rows-and-queue",
            ),
        ],
    )
    def test_kv_cache_reaches_the_model_parameters(self, kv_cache, expected):
        """spec.runtime.kvCache becomes the model's KV parameters (written when not the runtime's default),
        and the runtime reads them back as given."""
        from chatfleet_contract.parameters import ModelParameters
        from chatfleet_contract.tritonconfig import parse_parameters

        params = parse_parameters(config_of(spec_of(runtime={"kvCache": kv_cache}))["chat.config.pbtxt"])
        kv_keys = {k for k in params if k.startswith(("kv_", "prefix_cache", "admission_"))}
        assert {k: params[k] for k in kv_keys} == {"prefix_cache_entries": "1024", **expected}
        read = ModelParameters.from_parameters(params)
        kv = spec_of(runtime={"kvCache": kv_cache}).runtime.kv_cache
        assert (read.kv_memory_fraction, read.kv_typical_prompt_tokens) == (
            kv.memory_fraction,
            kv.typical_prompt_tokens,
        )
        assert read.admission_queue == kv.admission_queue
        assert read.admission_wait_ms == kv.admission_wait_milliseconds

    @pytest.mark.parametrize(
        ("quantity", "expected"),
        [
            ("1Gi", 2**30),
            ("1.5k", 1500),
            ("20G", 20 * 10**9),
            ("1500000000", 1500000000),
            ("0.5", 1),
            (None, 0),
        ],
    )
    def test_quantity_bytes(self, quantity, expected):
        from chatfleet_operator.builders.tritonconfig import quantity_bytes

        assert quantity_bytes(quantity) == expected

    def test_max_batch_size_defaults_to_hundreds_of_rows(self):
        """maxBatchSize caps the in-flight batch, under the rows the KV cache fits: 256 by default."""
        assert "max_batch_size: 256" in config_of(spec_of())["chat.config.pbtxt"]

    def test_the_in_flight_model_takes_requests_at_once(self):
        """In-flight batching (the only mode the operator configures): no queue delay, no preferred sizes,
        whatever dynamicBatching asks (those two fields only shape static batching)."""
        text = config_of(
            spec_of(
                runtime={
                    "dynamicBatching": {
                        "maxBatchSize": 16,
                        "preferredBatchSizes": [4, 8],
                        "maxQueueDelayMicroseconds": 500,
                    }
                }
            )
        )["chat.config.pbtxt"]
        assert "max_queue_delay_microseconds: 0" in text and "preferred_batch_size" not in text

    @pytest.mark.parametrize(("streaming", "value"), [(True, "true"), (False, "false")])
    def test_streaming_reaches_the_chat_api_not_the_model(self, streaming, value):
        """spec.runtime.streaming is the chat API's CHATFLEET_STREAMING; the model config is the same."""
        env = containers(deployment(runtime={"streaming": streaming}))["chat-api"]["env"]
        assert {e["name"]: e.get("value") for e in env}["CHATFLEET_STREAMING"] == value
        assert config_of(spec_of(runtime={"streaming": streaming})) == config_of(spec_of())

    def test_the_answer_cache_reaches_the_chat_api_only_when_enabled(self):
        """spec.runtime.answerCache: the chat API's CHATFLEET_ANSWER_CACHE_*; absent or disabled, the pod
        template is the one a spec without it gets (no rollout of fleets that never asked for it)."""
        cache = {"enabled": True, "ttlSeconds": 60, "maxEntries": 50, "sampled": True}
        env = containers(deployment(runtime={"answerCache": cache}))["chat-api"]["env"]
        values = {e["name"]: e.get("value") for e in env}
        assert [
            values[f"CHATFLEET_ANSWER_CACHE{k}"] for k in ("", "_TTL_SECONDS", "_MAX_ENTRIES", "_SAMPLED")
        ] == [
            "true",
            "60",
            "50",
            "true",
        ]
        plain = deployment()["spec"]["template"]
        assert (
            deployment(runtime={"answerCache": {"enabled": False, "ttlSeconds": 60}})["spec"]["template"]
            == plain
        )
        assert not any(
            e["name"].startswith("CHATFLEET_ANSWER_CACHE")
            for e in containers(deployment())["chat-api"]["env"]
        )

    def test_tokenizer_uri_and_path(self):
        assert (
            chat_model_config(spec_of(model={"uri": "hf://a/b", "tokenizer": "/tok"})).tokenizer_dir == "/tok"
        )
        cfg = chat_model_config(spec_of(model={"uri": "hf://a/b", "tokenizer": "hf://a/tok"}))
        assert cfg.tokenizer_dir is None and cfg.tokenizer_uri == "hf://a/tok"
        assert cfg.parameters()["tokenizer_uri"] == "hf://a/tok"

    def test_a_config_change_is_a_template_change_and_pod_metadata_cannot_override_it(self):
        base = build_deployment(REF, spec_of(), PodSettings(), revision="abc")["spec"]["template"]
        bigger = spec_of(runtime={"maxNewTokens": 99})
        changed = build_deployment(REF, bigger, PodSettings(), revision="abc")["spec"]["template"]
        assert base != changed and '"99"' in changed["metadata"]["annotations"][CONFIG]
        sneaky = spec_of(podMetadata={"annotations": {CONFIG: 'name: "other"'}})
        ours = build_deployment(REF, sneaky, PodSettings(), revision="abc")["spec"]["template"]
        assert ours["metadata"]["annotations"][CONFIG] == base["metadata"]["annotations"][CONFIG]

    def test_only_our_config_annotations_become_files(self):
        extra = "triton.chatfleet.io/rogue.config.pbtxt"
        spec = spec_of(podMetadata={"annotations": {extra: 'name: "rogue"'}})
        assert sorted(config_of(spec)) == ["chat.config.pbtxt"]


class TestDeployment:
    def test_pod_contract_containers(self):
        c = containers(deployment())
        assert c["triton"]["command"][:3] == ["python3", "-m", "chatfleet_runtime.launcher.launch"]
        assert "--config-dir=/etc/chatfleet/triton" in c["triton"]["command"]
        assert "ports" not in c["triton"]  # Triton listens on the pod's loopback only
        assert "--address=127.0.0.1" in c["triton"]["command"]
        assert c["chat-api"]["command"][:3] == ["python3", "-m", "chatfleet_runtime.chat.api"]
        assert c["chat-api"]["ports"] == [
            {"name": "chat", "containerPort": 8080, "protocol": "TCP"},
            {"name": "shadow", "containerPort": 8081, "protocol": "TCP"},
            {"name": "admin", "containerPort": 8082, "protocol": "TCP"},
            {"name": "metrics", "containerPort": 8090, "protocol": "TCP"},
        ]
        for flag in ("--shadow-port=8081", "--admin-port=8082", "--metrics-port=8090"):
            assert flag in c["chat-api"]["command"]

    def test_both_containers_are_probed_every_2_s_until_started_within_the_startup_budget(self):
        """A pod is Ready within a probe period of its model: both startup probes run every 2 s, and the
        budget (startup_seconds) is the same length of time whatever the period."""
        spec = spec_of()
        for seconds, failures in [(600, 300), (601, 301), (2, 1)]:
            dep = build_deployment(
                REF, spec, PodSettings(startup_seconds=seconds), revision="abc", replicas=1
            )
            c = containers(dep)
            for name in ("triton", "chat-api"):
                probe = c[name]["startupProbe"]
                assert (probe["periodSeconds"], probe["failureThreshold"]) == (2, failures), name
        assert containers(deployment())["chat-api"]["startupProbe"]["httpGet"] == {
            "path": "/readyz",
            "port": "admin",
        }

    def test_probes_reach_no_user_port(self):
        """The kubelet probes the chat API on its admin port and Triton through an exec on its loopback."""
        c = containers(deployment())
        assert c["chat-api"]["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
        assert c["chat-api"]["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
        for probe, path in [
            ("startupProbe", "ready"),
            ("readinessProbe", "ready"),
            ("livenessProbe", "live"),
        ]:
            command = c["triton"][probe]["exec"]["command"]
            assert command == [
                "python3",
                "-m",
                "chatfleet_runtime.launcher.probe",
                f"--url=http://127.0.0.1:8000/v2/health/{path}",
            ]

    @pytest.mark.parametrize(
        ("resources", "gpus", "selector"),
        [
            pytest.param({}, "1", None, id="defaults"),
            pytest.param(
                {"gpusPerReplica": 4, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
                "4",
                {api.GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"},
                id="product",
            ),
            pytest.param(
                {"gpuProduct": "NVIDIA-L4", "nodeSelector": {"zone": "a"}},
                "1",
                {"zone": "a", api.GPU_PRODUCT_LABEL: "NVIDIA-L4"},
                id="product-and-selector",
            ),
        ],
    )
    def test_gpus_and_placement(self, resources, gpus, selector):
        dep = deployment(resources=resources)
        pod = dep["spec"]["template"]["spec"]
        limits = containers(dep)["triton"]["resources"]["limits"]
        assert limits[api.GPU_RESOURCE] == gpus
        assert pod.get("nodeSelector") == selector

    def test_tolerates_gpu_taint_and_extra(self):
        extra = {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
        tolerations = deployment(resources={"tolerations": [extra]})["spec"]["template"]["spec"][
            "tolerations"
        ]
        assert tolerations[0] == {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        assert tolerations[1] == extra

    @pytest.mark.parametrize(
        "toleration",
        [
            pytest.param({"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}, id="exists"),
            pytest.param(
                {"key": "d", "operator": "Equal", "value": "x", "effect": "PreferNoSchedule"}, id="prefer"
            ),
            pytest.param(
                {"key": "d", "operator": "Equal", "value": "x", "effect": "NoExecute"}, id="no-execute"
            ),
        ],
    )
    def test_every_admitted_toleration_operator_and_effect_reaches_the_pod(self, toleration):
        tolerations = deployment(resources={"tolerations": [toleration]})["spec"]["template"]["spec"][
            "tolerations"
        ]
        assert toleration in tolerations

    @pytest.mark.parametrize("policy", ["Always", "IfNotPresent", "Never"])
    def test_every_admitted_pull_policy_reaches_both_containers(self, policy):
        dep = deployment(runtime={"imagePullPolicy": policy})
        assert {n: c["imagePullPolicy"] for n, c in containers(dep).items()} == {
            "triton": policy,
            "chat-api": policy,
        }

    def test_shm_is_memory_backed(self):
        volumes = {
            v["name"]: v
            for v in deployment(resources={"shmSize": "8Gi"})["spec"]["template"]["spec"]["volumes"]
        }
        assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
        assert volumes["triton-config"]["downwardAPI"]["items"][0] == {
            "path": "chat.config.pbtxt",
            "fieldRef": {"fieldPath": f"metadata.annotations['{CONFIG}']"},
        }

    @pytest.mark.parametrize(
        ("model", "volume_key", "read_only"),
        [
            pytest.param({"uri": "hf://a/b"}, "emptyDir", None, id="uri"),
            pytest.param(
                {"pvc": {"claimName": "w", "subPath": "m"}}, "persistentVolumeClaim", True, id="pvc"
            ),
            pytest.param({"hostPath": "/models/x"}, "hostPath", True, id="host-path"),
        ],
    )
    def test_weights_source(self, model, volume_key, read_only):
        dep = build_deployment(
            REF, ChatbotServiceSpec.from_dict({"model": model}), PodSettings(), revision="r"
        )
        volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        assert volume_key in volumes["weights"]
        mount = next(m for m in containers(dep)["triton"]["volumeMounts"] if m["name"] == "weights")
        assert mount["mountPath"] == "/models/weights" and mount.get("readOnly") == read_only

    def test_security_context(self):
        dep = deployment()
        assert dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
        for c in containers(dep).values():
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}

    def test_pod_metadata_and_ours_win(self):
        dep = deployment(
            podMetadata={"labels": {"sim.chatfleet.io/health": "unready"}, "annotations": {"a": "b"}}
        )
        meta = dep["spec"]["template"]["metadata"]
        assert meta["labels"]["sim.chatfleet.io/health"] == "unready"
        assert meta["labels"][api.LABEL_TRACK] == "stable" and meta["labels"][api.LABEL_REVISION] == "abc"
        assert meta["annotations"]["a"] == "b"
        assert meta["annotations"]["prometheus.io/scrape"] == "true"
        assert meta["annotations"]["prometheus.io/port"] == "8090"  # the chat API's scrape port
        assert meta["annotations"]["prometheus.io/path"] == "/metrics"
        env = {e["name"]: e for e in containers(dep)["chat-api"]["env"]}
        assert env["CHATFLEET_TRITON_METRICS_URL"]["value"] == "http://127.0.0.1:8002/metrics"
        chat_ports = {p["containerPort"]: p["name"] for p in containers(dep)["chat-api"]["ports"]}
        assert (chat_ports[8080], chat_ports[8090]) == ("chat", "metrics")

    @pytest.mark.parametrize(
        ("scaling", "replicas"),
        [
            pytest.param({}, 1, id="default"),
            pytest.param({"replicas": 3}, 3, id="fixed"),
            pytest.param(
                {"autoscale": {"minReplicas": 1, "maxReplicas": 3}}, None, id="autoscaled-left-to-hpa"
            ),
        ],
    )
    def test_replicas(self, scaling, replicas):
        assert deployment(scaling=scaling)["spec"].get("replicas") == replicas

    def test_spread_and_env(self):
        dep = deployment(runtime={"sessions": {"redis": {"secretName": "r"}}})
        spread = dep["spec"]["template"]["spec"]["topologySpreadConstraints"][0]
        assert spread["topologyKey"] == "kubernetes.io/hostname"
        env = {e["name"]: e for e in containers(dep)["chat-api"]["env"]}
        assert env["CHATFLEET_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "r", "key": "url"}
        assert env["CHATFLEET_MODEL_NAME"]["value"] == "bot"

    @pytest.mark.parametrize("track", [api.TRACK_STABLE, api.TRACK_CANARY, api.TRACK_PREVIEW])
    def test_chat_api_knows_its_track_and_revision_from_the_pod_labels(self, track):
        spec = spec_of()
        dep = build_deployment(REF, spec, PodSettings(), revision="rev9", track=track)
        env = {e["name"]: e for e in containers(dep)["chat-api"]["env"]}
        labels = dep["spec"]["template"]["metadata"]["labels"]
        for var, label in (("CHATFLEET_TRACK", api.LABEL_TRACK), ("CHATFLEET_REVISION", api.LABEL_REVISION)):
            path = env[var]["valueFrom"]["fieldRef"]["fieldPath"]
            assert path == f"metadata.labels['{label}']"
            assert label in labels
        assert (labels[api.LABEL_TRACK], labels[api.LABEL_REVISION]) == (track, "rev9")

    @pytest.mark.parametrize("timeout, grace", [(60, 75), (1, 16), (600, 615)])
    def test_grace_period_fits_the_longest_generation_after_the_settle_time(self, timeout, grace):
        dep = deployment(runtime={"requestTimeoutSeconds": timeout})
        assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == grace
        env = {e["name"]: e.get("value") for e in containers(dep)["chat-api"]["env"]}
        assert (env["CHATFLEET_DRAIN_SETTLE_SECONDS"], env["CHATFLEET_DRAIN_GRACE_SECONDS"]) == (
            "5",
            str(grace),
        )

    def test_both_containers_drain_before_they_get_sigterm(self):
        hook = {
            "exec": {
                "command": ["python3", "-m", "chatfleet_runtime.chat.drain", "--url=http://127.0.0.1:8082"]
            }
        }
        for name, c in containers(deployment()).items():
            assert c["lifecycle"] == {"preStop": hook}, name

    def test_progress_deadline_from_analysis(self):
        assert deployment(analysis={"progressDeadlineSeconds": 42})["spec"]["progressDeadlineSeconds"] == 42


class TestService:
    def test_ports_and_selector(self):
        svc = build_service(REF, "bot", selector_labels(REF))
        # the chat port only: no Triton port, no admin or scrape port behind a Service
        assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("chat", 8080)]
        assert svc["spec"]["selector"] == {api.LABEL_SERVICE: "bot", api.LABEL_TRACK: "stable"}


class TestHpa:
    @pytest.mark.parametrize(
        ("targets", "expected"),
        [
            pytest.param(
                {"gpuUtilizationPercent": 70}, [("chatfleet_gpu_utilization_percent", "70")], id="gpu"
            ),
            pytest.param(
                {"queueTimeMilliseconds": 50}, [("chatfleet_queue_time_seconds", "50m")], id="queue"
            ),
            pytest.param(
                {"requestLatencyMilliseconds": 2000},
                [("chatfleet_request_latency_seconds", "2")],
                id="latency",
            ),
            pytest.param({"inFlightRequests": 8}, [("chatfleet_inflight_requests", "8")], id="in-flight"),
        ],
    )
    def test_metrics(self, targets, expected):
        spec = spec_of(scaling={"autoscale": {"minReplicas": 2, "maxReplicas": 5, "targets": targets}})
        assert spec.scaling.autoscale is not None
        hpa = build_hpa(REF, spec.scaling.autoscale, HpaMetricSettings())
        got = [
            (m["pods"]["metric"]["name"], m["pods"]["target"]["averageValue"]) for m in hpa["spec"]["metrics"]
        ]
        assert got == expected
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 5)
        # the ChatbotService's scale, not the stable Deployment a release shrinks
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": "chatfleet.io/v1alpha1",
            "kind": "ChatbotService",
            "name": "bot",
        }

    @pytest.mark.parametrize(
        ("ms", "quantity"),
        [
            pytest.param(50, "50m", id="50ms"),
            pytest.param(1000, "1", id="1s"),
            pytest.param(1500, "1500m", id="1.5s"),
        ],
    )
    def test_seconds_quantity(self, ms, quantity):
        assert seconds_quantity(ms) == quantity


class TestPdb:
    def test_max_unavailable_one(self):
        pdb = build_pdb(REF)
        assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": {api.LABEL_SERVICE: "bot"}}}


class TestRevisionHash:
    @pytest.mark.parametrize(
        ("change", "same"),
        [
            pytest.param({"scaling": {"replicas": 5}}, True, id="scaling-is-not-a-revision"),
            pytest.param({"rollout": {"strategy": "blueGreen"}}, True, id="rollout-is-not-a-revision"),
            pytest.param({"runtime": {"image": "x:2"}}, False, id="image"),
            pytest.param({"resources": {"gpusPerReplica": 2}}, False, id="resources"),
            pytest.param({"podMetadata": {"labels": {"a": "b"}}}, False, id="pod-metadata"),
            pytest.param({"model": {"uri": "hf://x/y"}}, False, id="model"),
        ],
    )
    def test_which_changes_make_a_revision(self, change, same):
        base = {"model": {"uri": "hf://a/b"}}
        assert (revision_hash(base) == revision_hash({**base, **change})) is same
