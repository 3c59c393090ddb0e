"""The Deployment of Triton pods: two containers from one image, per docs/pod-contract.md."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.builders.common import (
    common_labels,
    deployment_name,
    object_meta,
    selector_labels,
    with_desired_hash,
)
from chatfleet_operator.builders.tritonconfig import (
    CALIBRATION_DIR,
    WEIGHTS_DIR,
    triton_config_annotations,
    triton_config_volume,
)
from chatfleet_operator.settings import STARTUP_PROBE_PERIOD_SECONDS, PodSettings
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef, TracingSpec

CONFIG_DIR = "/etc/chatfleet/triton"
REPOSITORY_DIR = "/tmp/model-repository"
#: Triton's ports, bound to the pod's loopback: only the chat API (gRPC) and the probes reach them.
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
#: The chat API's ports (docs/security.md "Ports"), each for one caller: chat (end users, through the
#: Service and the gateway), shadow (the gateway's mirror of a canary's shadow phase: answered greedily and
#: recorded, never a user's answer), admin (the kubelet's probes, the pod's own drain, the operator's
#: shadow records), metrics (Prometheus).
CHAT_PORT, SHADOW_PORT, ADMIN_PORT, SCRAPE_PORT = 8080, 8081, 8082, 8090
#: Where Prometheus scrapes a pod: the chat API's scrape port, which re-exports Triton's metrics.
SCRAPE_PORT_NAME, SCRAPE_PATH = "metrics", "/metrics"
#: Triton binds here (the launcher's --address).
LOOPBACK = "127.0.0.1"

#: Tolerated on every GPU pod: the taint GPU node pools commonly carry.
GPU_TOLERATION = {"key": api.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


def startup_failures(pod: PodSettings) -> int:
    """The startup probes' failureThreshold: pod.startup_seconds in probe periods (rounded up, at least 1)."""
    return max(1, -(-pod.startup_seconds // STARTUP_PROBE_PERIOD_SECONDS))


def _probe(path: str, port: str, period: int, failures: int) -> dict[str, Any]:
    """HTTP GET probe."""
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _loopback_probe(path: str, period: int, failures: int) -> dict[str, Any]:
    """Exec probe of Triton's HTTP endpoint on the pod's loopback (the kubelet cannot reach it over HTTP)."""
    url = f"http://{LOOPBACK}:{HTTP_PORT}{path}"
    return {
        "exec": {"command": ["python3", "-m", "chatfleet_runtime.launcher.probe", f"--url={url}"]},
        "periodSeconds": period,
        "timeoutSeconds": 10,
        "failureThreshold": failures,
    }


#: Both containers' preStop hook (docs/pod-contract.md): start the chat API's drain and wait until its
#: streams are done. The triton container runs it too, so Triton gets SIGTERM only after the last stream.
DRAIN_HOOK = {
    "exec": {
        "command": ["python3", "-m", "chatfleet_runtime.chat.drain", f"--url=http://{LOOPBACK}:{ADMIN_PORT}"]
    }
}


def grace_seconds(spec: ChatbotServiceSpec, pod: PodSettings) -> int:
    """terminationGracePeriodSeconds: the longest allowed generation, after the settle time, plus a margin.

    e.g. requestTimeoutSeconds 60, settle 5, margin 10 -> 75: a stream that began just before the pod
    left the endpoints still finishes before the kubelet kills the pod.
    """
    return spec.runtime.request_timeout_seconds + pod.drain_settle_seconds + pod.drain_margin_seconds


def container_security() -> dict[str, Any]:
    """Restricted container security context: no privilege escalation, capabilities dropped."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _weights_volume(spec: ChatbotServiceSpec, pod: PodSettings) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, mount) for the weights: PVC or host path read-only, or an emptyDir the launcher fills."""
    model = spec.model
    mount: dict[str, Any] = {"name": "weights", "mountPath": WEIGHTS_DIR}
    if model.pvc is not None:
        volume = {
            "name": "weights",
            "persistentVolumeClaim": {"claimName": model.pvc.claim_name, "readOnly": True},
        }
        mount["readOnly"] = True
        if model.pvc.sub_path:
            mount["subPath"] = model.pvc.sub_path
    elif model.host_path is not None:
        volume = {"name": "weights", "hostPath": {"path": model.host_path, "type": "Directory"}}
        mount["readOnly"] = True
    else:
        volume = {"name": "weights", "emptyDir": {"sizeLimit": pod.weights_cache_size}}
    return volume, mount


def _triton_container(ref: ObjectRef, spec: ChatbotServiceSpec, pod: PodSettings) -> dict[str, Any]:
    """The `triton` container: the launcher execs tritonserver with GPUs, config and weights mounted."""
    rt, res = spec.runtime, spec.resources
    _, weights_mount = _weights_volume(spec, pod)
    env = [{"name": "CHATFLEET_MODEL_NAME", "value": ref.name}]
    if spec.model.uri:
        env += [
            {"name": "CHATFLEET_MODEL_URI", "value": spec.model.uri},
            {"name": "CHATFLEET_MODEL_REVISION", "value": spec.model.revision},
        ]
    env.append({"name": "HOME", "value": "/tmp"})
    container: dict[str, Any] = {
        "name": "triton",
        "image": rt.image,
        "imagePullPolicy": rt.image_pull_policy,
        "command": [
            "python3",
            "-m",
            "chatfleet_runtime.launcher.launch",
            f"--config-dir={CONFIG_DIR}",
            f"--repository={REPOSITORY_DIR}",
            f"--address={LOOPBACK}",
            f"--http-port={HTTP_PORT}",
            f"--grpc-port={GRPC_PORT}",
            f"--metrics-port={METRICS_PORT}",
        ],
        "env": env,
        "resources": {
            "requests": {"cpu": res.cpu, "memory": res.memory, api.GPU_RESOURCE: str(res.gpus_per_replica)},
            "limits": {"cpu": res.cpu, "memory": res.memory, api.GPU_RESOURCE: str(res.gpus_per_replica)},
        },
        "volumeMounts": [
            {"name": "triton-config", "mountPath": CONFIG_DIR, "readOnly": True},
            weights_mount,
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "startupProbe": _loopback_probe(
            "/v2/health/ready", STARTUP_PROBE_PERIOD_SECONDS, startup_failures(pod)
        ),
        "readinessProbe": _loopback_probe("/v2/health/ready", 10, 3),
        "livenessProbe": _loopback_probe("/v2/health/live", 15, 3),
        "lifecycle": {"preStop": copy.deepcopy(DRAIN_HOOK)},
        "securityContext": container_security(),
    }
    if spec.model.credentials_secret:
        container["envFrom"] = [{"secretRef": {"name": spec.model.credentials_secret}}]
    if _calibration_volume(spec) is not None:
        mount = {"name": "calibration", "mountPath": CALIBRATION_DIR, "readOnly": True}
        container["volumeMounts"].append(mount)
    return container


def _calibration_volume(spec: ChatbotServiceSpec) -> dict[str, Any] | None:
    """The ConfigMap of spec.runtime.calibration.configMapRef, its key as the file `prompts`; None without one.

    optional: a missing ConfigMap or key does not hold the pod in ContainerCreating; the runtime finds no
    file and reports it in the container's termination message, which the operator shows as a condition.
    """
    rt = spec.runtime
    ref = rt.calibration.config_map_ref
    if rt.precision != "int8" or ref is None or rt.calibration.prompts:
        return None
    return {
        "name": "calibration",
        "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": "prompts"}], "optional": True},
    }


#: Where the chat API reads spec.fallback: the pod's chatfleet.io/fallback annotation, which the operator
#: writes on each pod (never in the template: a change restarts nothing); empty while it has none.
CHAT_SETTINGS_DIR = "/etc/chatfleet/chat"
FALLBACK_FILE = f"{CHAT_SETTINGS_DIR}/fallback.json"
CHAT_SETTINGS_VOLUME = {
    "name": "chat-settings",
    "downwardAPI": {
        "items": [
            {
                "path": "fallback.json",
                "fieldRef": {"fieldPath": f"metadata.annotations['{api.ANNOTATION_FALLBACK}']"},
            }
        ]
    },
}


def _label_env(name: str, label: str) -> dict[str, Any]:
    """An env var holding one of the pod's labels (downward API)."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}


#: The sampler the chat API's tracer uses (spec.observability.tracing): a request whose W3C traceparent
#: says sampled is traced, one that says not sampled is not, a new trace by its trace id's ratio.
TRACES_SAMPLER = "parentbased_traceidratio"


def _tracing_env(ref: ObjectRef, tracing: TracingSpec) -> list[dict[str, Any]]:
    """OpenTelemetry's standard environment for the chat API's tracer (docs/pod-contract.md). The resource
    attributes name the pod's track and revision through the downward API variables defined before them
    (Kubernetes expands $(VAR) from earlier entries), so they follow the pod's labels."""
    attributes = (
        f"k8s.namespace.name={ref.namespace},"
        "chatfleet.track=$(CHATFLEET_TRACK),chatfleet.revision=$(CHATFLEET_REVISION)"
    )
    return [
        {"name": "OTEL_SERVICE_NAME", "value": ref.name},
        {"name": "OTEL_RESOURCE_ATTRIBUTES", "value": attributes},
        {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": tracing.endpoint},
        {"name": "OTEL_TRACES_SAMPLER", "value": TRACES_SAMPLER},
        {"name": "OTEL_TRACES_SAMPLER_ARG", "value": tracing.sampler_arg()},
    ]


def _chat_api_container(ref: ObjectRef, spec: ChatbotServiceSpec, pod: PodSettings) -> dict[str, Any]:
    """The `chat-api` container: OpenAI-style HTTP API relaying to Triton over local gRPC."""
    rt = spec.runtime
    env: list[dict[str, Any]] = [
        {"name": "CHATFLEET_MODEL_NAME", "value": ref.name},
        {"name": "CHATFLEET_SESSION_TTL_SECONDS", "value": str(rt.sessions.ttl_seconds)},
        {"name": "CHATFLEET_HISTORY_TURNS", "value": str(rt.sessions.history_turns)},
        {"name": "CHATFLEET_REQUEST_TIMEOUT_SECONDS", "value": str(rt.request_timeout_seconds)},
        {"name": "CHATFLEET_FALLBACK_TEXT", "value": rt.fallback_text},
        # spec.runtime.streaming: false makes the chat API refuse `stream: true` (400 naming `stream`).
        {"name": "CHATFLEET_STREAMING", "value": "true" if rt.streaming else "false"},
        # The pod's own track and revision, echoed on every answer (x-chatfleet-track), read from the
        # pod labels through the downward API so they can never disagree with the selector.
        _label_env("CHATFLEET_TRACK", api.LABEL_TRACK),
        _label_env("CHATFLEET_REVISION", api.LABEL_REVISION),
        # One scrape endpoint per pod: the chat API's /metrics re-exports Triton's (docs/metrics.md).
        {"name": "CHATFLEET_TRITON_METRICS_URL", "value": f"http://{LOOPBACK}:{METRICS_PORT}/metrics"},
        # The drain protocol (docs/pod-contract.md): how long to keep taking requests after leaving the
        # endpoints, and the grace period a new request must fit in.
        {"name": "CHATFLEET_DRAIN_SETTLE_SECONDS", "value": str(pod.drain_settle_seconds)},
        {"name": "CHATFLEET_DRAIN_GRACE_SECONDS", "value": str(grace_seconds(spec, pod))},
        # spec.fallback, as the pod's annotation the operator writes (converge/fallback.py): re-read
        # when kubelet rewrites it, so a change restarts nothing.
        {"name": "CHATFLEET_FALLBACK_FILE", "value": FALLBACK_FILE},
    ]
    if rt.answer_cache is not None:  # only then: a fleet without it keeps the template it had
        cache = rt.answer_cache
        env += [
            {"name": "CHATFLEET_ANSWER_CACHE", "value": "true"},
            {"name": "CHATFLEET_ANSWER_CACHE_TTL_SECONDS", "value": str(cache.ttl_seconds)},
            {"name": "CHATFLEET_ANSWER_CACHE_MAX_ENTRIES", "value": str(cache.max_entries)},
            {"name": "CHATFLEET_ANSWER_CACHE_SAMPLED", "value": "true" if cache.sampled else "false"},
        ]
    if spec.observability.tracing is not None:  # only then: a fleet without it keeps the template it had
        env += _tracing_env(ref, spec.observability.tracing)
    if rt.sessions.redis is not None:
        env.append(
            {
                "name": "CHATFLEET_REDIS_URL",
                "valueFrom": {
                    "secretKeyRef": {"name": rt.sessions.redis.secret_name, "key": rt.sessions.redis.key}
                },
            }
        )
    env.append({"name": "HOME", "value": "/tmp"})
    return {
        "name": "chat-api",
        "image": rt.image,
        "imagePullPolicy": rt.image_pull_policy,
        "command": [
            "python3",
            "-m",
            "chatfleet_runtime.chat.api",
            "--host=0.0.0.0",
            f"--port={CHAT_PORT}",
            f"--shadow-port={SHADOW_PORT}",
            f"--admin-port={ADMIN_PORT}",
            f"--metrics-port={SCRAPE_PORT}",
            f"--triton-grpc={LOOPBACK}:{GRPC_PORT}",
        ],
        "ports": [
            {"name": "chat", "containerPort": CHAT_PORT, "protocol": "TCP"},
            {"name": "shadow", "containerPort": SHADOW_PORT, "protocol": "TCP"},
            {"name": "admin", "containerPort": ADMIN_PORT, "protocol": "TCP"},
            {"name": SCRAPE_PORT_NAME, "containerPort": SCRAPE_PORT, "protocol": "TCP"},
        ],
        "env": env,
        "resources": {
            "requests": {"cpu": pod.chat_api_cpu, "memory": pod.chat_api_memory},
            "limits": {"cpu": pod.chat_api_cpu, "memory": pod.chat_api_memory},
        },
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp", "subPath": "chat-api"},
            {"name": "chat-settings", "mountPath": CHAT_SETTINGS_DIR, "readOnly": True},
        ],
        # Ready once Triton is (its /readyz waits for the model): checked every 2 s until then, after which
        # the kubelet runs the readiness probe at once and liveness begins
        "startupProbe": _probe("/readyz", "admin", STARTUP_PROBE_PERIOD_SECONDS, startup_failures(pod)),
        "readinessProbe": _probe("/readyz", "admin", 5, 3),
        "livenessProbe": _probe("/healthz", "admin", 15, 3),
        "lifecycle": {"preStop": copy.deepcopy(DRAIN_HOOK)},
        "securityContext": container_security(),
    }


def build_pod_template(
    ref: ObjectRef,
    spec: ChatbotServiceSpec,
    pod: PodSettings,
    *,
    track: str,
    revision: str,
    serving: str | None = None,
) -> dict[str, Any]:
    """Pod template: podMetadata first, then our labels and annotations (ours win on conflicts).

    The Triton config rides in the template's annotations, written into the pod by the `triton-config`
    downward API volume (builders/tritonconfig.py).

    `serving` (with a warm pool): the chatfleet.io/serving label new pods start with -- "false" on the
    stable track (the operator lets them join), "true" on a canary or preview track (never pooled).
    """
    res = spec.resources
    labels = {
        **spec.pod_metadata.labels,
        **common_labels(ref),
        **selector_labels(ref, track),
        api.LABEL_REVISION: revision,
    }
    if serving is not None:
        labels[api.LABEL_SERVING] = serving
    config = triton_config_annotations(spec)
    annotations = {
        **{k: v for k, v in spec.pod_metadata.annotations.items() if k != api.ANNOTATION_FALLBACK},
        # The scrape contract (docs/metrics.md): the chat API's scrape port carries every metric the
        # analysis and the HPA read, Triton's re-exported, so annotation discovery finds them all.
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(SCRAPE_PORT),
        "prometheus.io/path": SCRAPE_PATH,
        **config,
    }
    if serving == "false":  # a new stable pod stands by until the operator lets it join
        annotations[api.ANNOTATION_DELETION_COST] = api.STANDBY_DELETION_COST
    node_selector = dict(res.node_selector)
    if res.gpu_product:
        node_selector[api.GPU_PRODUCT_LABEL] = res.gpu_product
    weights_volume, _ = _weights_volume(spec, pod)
    pod_spec: dict[str, Any] = {
        "containers": [_triton_container(ref, spec, pod), _chat_api_container(ref, spec, pod)],
        "tolerations": [GPU_TOLERATION, *[dict(t) for t in res.tolerations if dict(t) != GPU_TOLERATION]],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": pod.run_as_user,
            "runAsGroup": pod.run_as_user,
            "fsGroup": pod.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": grace_seconds(spec, pod),
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": selector_labels(ref, track)},
            }
        ],
        "volumes": [
            triton_config_volume(config),
            weights_volume,
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": res.shm_size}},
            {"name": "tmp", "emptyDir": {"sizeLimit": pod.tmp_size}},
            copy.deepcopy(CHAT_SETTINGS_VOLUME),
        ],
    }
    if (calibration := _calibration_volume(spec)) is not None:
        pod_spec["volumes"].append(calibration)
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if spec.runtime.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in spec.runtime.image_pull_secrets]
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec}


def rolling_update(pod: PodSettings, *, in_place: bool) -> dict[str, Any]:
    """maxSurge/maxUnavailable of a template change that is no release (e.g. an operator upgrade).

    Surge (the settings, default 1/0) needs a free GPU for the extra pod; in place (0/1) replaces one
    pod at a time, so it proceeds when no GPU is free -- the same choice as spec.rollout.gpuCapacity
    makes for releases (release/children.py `template_update_in_place` decides).
    """
    if in_place:
        return {"maxSurge": 0, "maxUnavailable": 1}
    return {"maxSurge": pod.max_surge, "maxUnavailable": pod.max_unavailable}


def build_deployment(
    ref: ObjectRef,
    spec: ChatbotServiceSpec,
    pod: PodSettings,
    *,
    revision: str,
    track: str = api.TRACK_STABLE,
    replicas: int | None = None,
    in_place: bool = False,
    template: Mapping[str, Any] | None = None,
    serving: str | None = None,
) -> dict[str, Any]:
    """Deployment of one track at `revision`; `replicas=None` leaves the count unset; `in_place`: see rolling_update.

    The pod template is built from the spec (with its Triton config), or -- `template` given -- an
    observed one kept as it is, its config included: a stable Deployment goes on running the old
    revision while a release runs (`revision` is then that template's).
    """
    if template is None:
        template = build_pod_template(ref, spec, pod, track=track, revision=revision, serving=serving)
    deployment_spec: dict[str, Any] = {
        "selector": {"matchLabels": selector_labels(ref, track)},
        "revisionHistoryLimit": pod.revision_history_limit,
        "progressDeadlineSeconds": spec.analysis.progress_deadline_seconds,
        "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling_update(pod, in_place=in_place)},
        "template": copy.deepcopy(dict(template)),
    }
    if replicas is not None:
        deployment_spec = {"replicas": replicas, **deployment_spec}
    extra = {api.LABEL_TRACK: track, api.LABEL_REVISION: revision, "app.kubernetes.io/component": "server"}
    return with_desired_hash(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": object_meta(ref, deployment_name(ref, track), extra),
            "spec": deployment_spec,
        }
    )
