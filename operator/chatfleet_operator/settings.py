"""Operator settings: grouped dataclasses, passed into builders and the reconciler (never globals).

The dataclasses hold plain defaults and never read the environment: `Settings()` is the same wherever and
whenever it is built. `settings_from_env` reads the CHATFLEET_* variables, when it is called (the CLI calls
it once at start-up, then applies its flags over it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from chatfleet_operator.defaults import ClusterDefaults

#: How often the kubelet runs the startup probes (Triton's model load, the chat API's first /readyz). Short,
#: so that a pod is Ready within about 2 s of its model (a 10 s period cost 5 s per pod start on average,
#: on every rollout step); each probe is a stdlib HTTP GET or an 80 ms exec, and stops once started. The
#: startup budget (PodSettings.startup_seconds) is counted in these periods, and is at least one.
STARTUP_PROBE_PERIOD_SECONDS = 2


@dataclass(frozen=True)
class PodSettings:
    """What every Triton pod gets besides the spec."""

    chat_api_cpu: str = "500m"
    """CPU request and limit of the chat-api sidecar container (quantity; env CHATFLEET_CHAT_API_CPU).
    Small: it only relays. Smaller still where CPU is scarcer than GPUs (the local real node's 2 cores)."""
    chat_api_memory: str = "512Mi"
    """Memory request and limit of the chat-api sidecar container (quantity; env CHATFLEET_CHAT_API_MEMORY)."""
    run_as_user: int = 1000
    """UID the containers run as (non-root; the runtime image owns /tmp and the model dirs for it)."""
    drain_settle_seconds: int = 5
    """Seconds a draining pod keeps taking requests after it left the endpoints, for kube-proxy and the
    gateway to see it gone (the pod contract's CHATFLEET_DRAIN_SETTLE_SECONDS)."""
    drain_margin_seconds: int = 10
    """Seconds of the grace period beyond settle + the longest generation: the drain hook's own start and exit."""
    startup_seconds: int = 600
    """The longest Triton's model load may take (env CHATFLEET_STARTUP_SECONDS): the startup probes, every
    2 s, fail this long before the kubelet restarts Triton. A load that hangs in Triton's Python backend
    after initialize() ends sooner, through the runtime's load watch."""
    tmp_size: str = "1Gi"
    """Size limit of the writable /tmp emptyDir (root filesystem is read-only), quantity."""
    weights_cache_size: str = "100Gi"
    """Size limit of the emptyDir the launcher downloads URI weights into, quantity."""
    revision_history_limit: int = 3
    """Old ReplicaSets kept per Deployment."""
    max_surge: int | str = 1
    """Deployment rolling update maxSurge: one extra GPU pod at a time."""
    max_unavailable: int | str = 0
    """Deployment rolling update maxUnavailable: never below the desired serving capacity."""
    upgrade_wave: int = 5
    """Most ChatbotServices the operator updates at once after an upgrade or new settings (a new pod template
    of the same revision, a release of a new default image; wave.py); the others keep their pods until a
    place frees. 0: no limit. Flag --upgrade-wave, env CHATFLEET_UPGRADE_WAVE."""
    allowed_host_paths: tuple[str, ...] = ()
    """Host directory prefixes a spec.model.hostPath may name, on whole path segments ('/data' allows
    /data and /data/x, not /database; a '..' segment never). Default none: no ChatbotService author may
    mount a host directory, so the operator builds no Deployment for a spec with one (HostPathNotAllowed).
    Flag --allowed-host-path (repeatable), env CHATFLEET_ALLOWED_HOST_PATHS (comma-separated); the chart
    sets it from operator.allowedHostPaths, which also feeds its ValidatingAdmissionPolicy."""


@dataclass(frozen=True)
class HpaMetricSettings:
    """Per-pod metric names the HPA targets (served by a Prometheus adapter; see docs/metrics.md)."""

    gpu_utilization: str = "chatfleet_gpu_utilization_percent"
    """Pods metric: GPU utilization of the pod's GPUs, percent (0-100)."""
    queue_time: str = "chatfleet_queue_time_seconds"
    """Pods metric: average time a request waits in Triton's queue, seconds."""
    request_latency: str = "chatfleet_request_latency_seconds"
    """Pods metric: average end-to-end request latency, seconds."""
    in_flight: str = "chatfleet_inflight_requests"
    """Pods metric: requests being served or queued per pod."""


@dataclass(frozen=True)
class RetrySettings:
    """Backoff for unsatisfiable specs and failed passes (controller.py's retry timer)."""

    base_delay: float = 5.0
    """First retry delay in seconds; doubles on every retry."""
    max_delay: float = 300.0
    """Retry delay ceiling in seconds (5 minutes): slow enough to never hot-loop."""
    trigger_debounce: float = 0.2
    """Seconds to coalesce bursts of child events before a triggered reconcile runs."""
    progress_status_seconds: float = 5.0
    """Least seconds between two status writes of one ChatbotService that differ only by progress (counts,
    RollingOut -> WaitingForPods); the later one waits and is coalesced. Ready flipping, a problem, a new
    generation or a release step is written at once (env CHATFLEET_PROGRESS_STATUS_SECONDS; 0: no wait)."""
    first_status_seconds: float = 120.0
    """Seconds a new ChatbotService's first rollout may take before its status says it is on its way: its
    first status waits, from its Deployment's creation, for Ready or a problem, and says "progressing" only
    once this has passed. Until then the object reads as the CRD's default (phase Pending,
    observedGeneration 0: kstatus InProgress). Saves one of the three writes of every new ChatbotService
    whose pods are Ready within it (env CHATFLEET_FIRST_STATUS_SECONDS; 0: the first status at once)."""


@dataclass(frozen=True)
class RuntimeSettings:
    """How the operator process runs."""

    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty means cluster-wide."""
    workers: int = 16
    """Threads for blocking API calls (env CHATFLEET_WORKERS, default 16)."""
    defaults: ClusterDefaults = field(default_factory=ClusterDefaults)
    """What a spec that leaves out spec.runtime.image or spec.analysis.prometheusAddress gets (flags
    --runtime-image and --prometheus-address, env CHATFLEET_RUNTIME_IMAGE and CHATFLEET_PROMETHEUS_ADDRESS;
    chatfleet_operator.defaults)."""
    cluster_domain: str = "cluster.local"
    """DNS domain of the cluster, used in status.endpoint."""


@dataclass(frozen=True)
class ReleaseSettings:
    """Release settings of one operator process (tests shorten or redirect them)."""

    gateway_name: str = "chatfleet"
    """Gateway the HTTPRoutes attach to when the cluster serves Gateway API (flag --gateway, env CHATFLEET_GATEWAY)."""
    gateway_namespace: str | None = None
    """Namespace of that Gateway; None: each ChatbotService's own namespace (flag --gateway-namespace, env
    CHATFLEET_GATEWAY_NAMESPACE). A shared Gateway must admit the routes (listeners' allowedRoutes)."""
    gateway_mirror: str = "RequestMirror"
    """How the Gateway mirrors requests in a release's shadow phase: RequestMirror (Gateway API's filter) or
    TraefikService (Traefik 3.6, which lacks that filter; needs Traefik's CRD provider). Flag
    --gateway-mirror, env CHATFLEET_GATEWAY_MIRROR."""
    routing: str = "auto"
    """What a canary's HTTPRoute sends its weights to: auto (InferencePools with the endpoint picker where
    the cluster serves inference.networking.k8s.io/v1, else Services) or Service (always Services). Flag
    --routing, env CHATFLEET_ROUTING."""
    picker_image: str = "chatfleet/chatfleet-operator:0.1.0"
    """Image of the InferencePools' endpoint picker (python -m chatfleet_picker; the operator's image carries
    it, and the chart sets the operator's own). Flag --picker-image, env CHATFLEET_PICKER_IMAGE."""
    picker_service_account: str = "chatfleet-picker"
    """ServiceAccount the picker runs under in each fleet's namespace; its Role must let it list and watch
    pods (the chart writes the three in the namespaces it knows). Flag --picker-service-account, env
    CHATFLEET_PICKER_SERVICE_ACCOUNT."""
    picker_node_selector: tuple[tuple[str, str], ...] = ()
    """Node labels the picker's pods must match, as (key, value) pairs; none: any node. Flag
    --picker-node-selector KEY=VALUE (repeated), env CHATFLEET_PICKER_NODE_SELECTOR (comma-separated)."""
    picker_tolerations: tuple[tuple[str, str | None, str], ...] = ()
    """Taints the picker's pods tolerate, as (key, value or None for any value, effect or "" for every
    effect). Flag --picker-toleration KEY[=VALUE][:EFFECT] (repeated, the syntax of `kubectl taint`), env
    CHATFLEET_PICKER_TOLERATIONS (comma-separated). With neither set, the picker (a small CPU pod) goes to
    any node whose taints it tolerates, i.e. an untainted one."""
    probe_url_template: str = "http://{service}-{track}.{namespace}.svc.{domain}:8080/v1/chat/completions"
    """Where probe prompts go; {namespace} {service} {track} {domain} are filled in (spec.analysis.probe.url wins)."""
    route_settle_seconds: float = 10.0
    """Seconds the canary's pods stay after an HTTPRoute moved all traffic off them (promotion, rollback):
    a Gateway data plane applies a route change a moment after the pods' endpoints change, and a route
    that still points at a Service without endpoints answers 503 (Argo Rollouts'
    abortScaleDownDelaySeconds guards the same race). The pods drain once they go."""
    route_join_seconds: float = 3.0
    """Seconds a canary pod has been Ready before an HTTPRoute sends it users: the gateway reads the
    Service's EndpointSlices, which list a pod a moment after it turns Ready (the EndpointSlice controller,
    then the gateway's own batching: Traefik's provider throttle is 2 s), and a route that weights a
    Service whose endpoints it has not read yet answers that share 503 (`no available server`). The
    joining twin of route_settle_seconds; the step's pause counts from the join."""
    discovery_cache_seconds: float = 10.0
    """Seconds the answer 'does the cluster serve gateway.networking.k8s.io' (or the Inference Extension's
    group) is reused."""
    analysis_allowed_hosts: tuple[str, ...] = ()
    """Hosts the release analysis may call besides *.svc and *.svc.<domain> (spec.analysis.prometheusAddress,
    spec.analysis.probe.url): exact names, *.suffix wildcards, IPs or CIDRs such as the Service CIDR.
    Default none, so no namespace's user can make the operator call an arbitrary URL; loopback
    (127.0.0.1) only when listed, e.g. on the local test platform. Flag --analysis-allowed-host (repeatable),
    env CHATFLEET_ANALYSIS_ALLOWED_HOSTS (comma-separated)."""


@dataclass(frozen=True)
class AutoscaleSettings:
    """How an autoscaled ChatbotService is scaled (docs/autoscaling.md)."""

    metrics_source: str = "auto"
    """auto: a KEDA ScaledObject when the cluster serves keda.sh/v1alpha1, else an HPA on Pods metrics;
    keda or hpa: always that one (flag --autoscaler, env CHATFLEET_AUTOSCALER)."""


@dataclass(frozen=True)
class PrometheusSettings:
    """How the operator connects to the Prometheus each ChatbotService names (spec.analysis.prometheusAddress),
    for the release analysis and the autoscale forecast. An https:// address has its certificate verified;
    an http:// address uses none of these but the token."""

    ca_file: str | None = None
    """PEM file of the CA(s) that signed Prometheus' serving certificate; None: the system's CAs (flag
    --prometheus-ca-file, env CHATFLEET_PROMETHEUS_CA_FILE; the chart mounts it from a ConfigMap or a
    Secret). Loaded by every new connection, so a renewed CA is used without a restart."""
    bearer_token_file: str | None = None
    """File holding a token sent as `Authorization: Bearer` with every query, e.g. to a proxy that
    authenticates in front of Prometheus; None: no Authorization header (flag --prometheus-bearer-token-file,
    env CHATFLEET_PROMETHEUS_BEARER_TOKEN_FILE). Read at every query, so a rotated Secret or projected
    service-account token is used as soon as the kubelet writes it."""
    bearer_token_hosts: tuple[str, ...] = ()
    """The only hosts the bearer token is sent to, over https only (flag --prometheus-bearer-token-host,
    repeatable; env CHATFLEET_PROMETHEUS_BEARER_TOKEN_HOSTS, comma-separated; exact names or IPs). A tenant
    writes spec.analysis.prometheusAddress and may point it at a Service of their own: without this list
    the operator would hand them its token. Required with a token file; a query to any other address, or
    over http, goes without it and fails as an analysis error naming this setting."""
    insecure_skip_verify: bool = False
    """Skip verifying Prometheus' certificate (default false: verified, and a certificate no trusted CA
    signed fails the measurement as an Error naming ca_file). The connection is still encrypted but anyone
    on the path can pose as Prometheus and pass a canary; not together with ca_file (flag
    --prometheus-insecure-skip-verify, env CHATFLEET_PROMETHEUS_INSECURE_SKIP_VERIFY=true)."""


@dataclass(frozen=True)
class Settings:
    """All settings of one operator process."""

    pod: PodSettings = field(default_factory=PodSettings)
    """Pod-level defaults."""
    hpa_metrics: HpaMetricSettings = field(default_factory=HpaMetricSettings)
    """HPA metric names."""
    retry: RetrySettings = field(default_factory=RetrySettings)
    """Backoff policy."""
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    """Process-level settings."""
    release: ReleaseSettings = field(default_factory=ReleaseSettings)
    """Releases: the Gateway HTTPRoutes attach to, the probe URL, discovery caching."""
    autoscale: AutoscaleSettings = field(default_factory=AutoscaleSettings)
    """Which autoscaler (KEDA, HPA, or discovered)."""
    prometheus: PrometheusSettings = field(default_factory=PrometheusSettings)
    """How Prometheus is reached: its CA, a bearer token, verification."""


def _text(value: str) -> str:
    return value.strip()


def _items(value: str) -> tuple[str, ...]:
    """A comma-separated list: its non-empty items."""
    return tuple(item.strip() for item in value.split(",") if item.strip())


#: A label or taint key: an optional DNS-subdomain prefix and a name (Kubernetes' qualified name).
_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def node_selector_item(text: str) -> tuple[str, str]:
    """KEY=VALUE, a node label the picker's pods must match; ValueError saying what is wrong."""
    key, sep, value = text.strip().partition("=")
    if not sep:
        raise ValueError(f"{text.strip()!r} is not KEY=VALUE")
    if not _KEY.fullmatch(key):
        raise ValueError(f"{key!r} is not a label key")
    if not _LABEL_VALUE.fullmatch(value):
        raise ValueError(f"{value!r} is not a label value")
    return key, value


def toleration_item(text: str) -> tuple[str, str | None, str]:
    """KEY[=VALUE][:EFFECT] (kubectl taint's syntax): (key, value or None: any value, effect or "": every
    effect); ValueError saying what is wrong, e.g. 'gpu:NoSchedul' -> the effects allowed."""
    body, _, effect = text.strip().partition(":")
    key, sep, value = body.partition("=")
    if not _KEY.fullmatch(key):
        raise ValueError(f"{key!r} is not a taint key")
    if sep and not _LABEL_VALUE.fullmatch(value):
        raise ValueError(f"{value!r} is not a taint value")
    if effect and effect not in TAINT_EFFECTS:
        raise ValueError(f"effect {effect!r} is not one of {', '.join(TAINT_EFFECTS)}")
    return key, (value if sep else None), effect


def _node_selector(value: str) -> tuple[tuple[str, str], ...]:
    return tuple(node_selector_item(item) for item in _items(value))


def _tolerations(value: str) -> tuple[tuple[str, str | None, str], ...]:
    return tuple(toleration_item(item) for item in _items(value))


def _flag(value: str) -> bool:
    """true for 1, true or yes (any case); false otherwise."""
    return value.strip().lower() in ("1", "true", "yes")


def _whole(value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError("is not a whole number") from None


def _startup_seconds(value: str) -> int:
    """A startup budget: whole seconds, at least one startup probe period."""
    seconds = _whole(value)
    if seconds < STARTUP_PROBE_PERIOD_SECONDS:
        raise ValueError(f"is below {STARTUP_PROBE_PERIOD_SECONDS} (one startup probe period)")
    return seconds


def _decimal(value: str) -> float:
    try:
        return float(value.strip())
    except ValueError:
        raise ValueError("is not a number") from None


#: Each environment variable the operator reads: (the field's path in Settings, parser). An empty variable
#: is the same as an unset one: the default stays.
ENVIRONMENT: dict[str, tuple[str, Callable[[str], Any]]] = {
    "CHATFLEET_CHAT_API_CPU": ("pod.chat_api_cpu", _text),
    "CHATFLEET_CHAT_API_MEMORY": ("pod.chat_api_memory", _text),
    "CHATFLEET_STARTUP_SECONDS": ("pod.startup_seconds", _startup_seconds),
    "CHATFLEET_ALLOWED_HOST_PATHS": ("pod.allowed_host_paths", _items),
    "CHATFLEET_UPGRADE_WAVE": ("pod.upgrade_wave", _whole),
    "CHATFLEET_PROGRESS_STATUS_SECONDS": ("retry.progress_status_seconds", _decimal),
    "CHATFLEET_FIRST_STATUS_SECONDS": ("retry.first_status_seconds", _decimal),
    "CHATFLEET_WORKERS": ("runtime.workers", _whole),
    "CHATFLEET_RUNTIME_IMAGE": ("runtime.defaults.runtime_image", _text),
    "CHATFLEET_PROMETHEUS_ADDRESS": ("runtime.defaults.prometheus_address", _text),
    "CHATFLEET_GATEWAY": ("release.gateway_name", _text),
    "CHATFLEET_GATEWAY_NAMESPACE": ("release.gateway_namespace", _text),
    "CHATFLEET_GATEWAY_MIRROR": ("release.gateway_mirror", _text),
    "CHATFLEET_ROUTING": ("release.routing", _text),
    "CHATFLEET_PICKER_IMAGE": ("release.picker_image", _text),
    "CHATFLEET_PICKER_SERVICE_ACCOUNT": ("release.picker_service_account", _text),
    "CHATFLEET_PICKER_NODE_SELECTOR": ("release.picker_node_selector", _node_selector),
    "CHATFLEET_PICKER_TOLERATIONS": ("release.picker_tolerations", _tolerations),
    "CHATFLEET_ANALYSIS_ALLOWED_HOSTS": ("release.analysis_allowed_hosts", _items),
    "CHATFLEET_AUTOSCALER": ("autoscale.metrics_source", _text),
    "CHATFLEET_PROMETHEUS_CA_FILE": ("prometheus.ca_file", _text),
    "CHATFLEET_PROMETHEUS_BEARER_TOKEN_FILE": ("prometheus.bearer_token_file", _text),
    "CHATFLEET_PROMETHEUS_BEARER_TOKEN_HOSTS": ("prometheus.bearer_token_hosts", _items),
    "CHATFLEET_PROMETHEUS_INSECURE_SKIP_VERIFY": ("prometheus.insecure_skip_verify", _flag),
}


#: Variables an older operator read, with what replaced them: set, they stop the start-up with that line
#: (silently ignored, a 60 meant for 10-second periods would have become a 1-minute budget).
RETIRED: dict[str, str] = {
    "CHATFLEET_STARTUP_FAILURE_THRESHOLD": (
        "no longer read: set CHATFLEET_STARTUP_SECONDS, the startup budget in seconds (default 600; the "
        "startup probes now run every 2 s, so a failure count no longer says how long)"
    ),
}


def _with(obj: Any, path: Sequence[str], value: Any) -> Any:
    """A copy of the frozen dataclass `obj` with the field at `path` set, e.g. ("runtime", "workers")."""
    head, *rest = path
    return replace(obj, **{head: _with(getattr(obj, head), rest, value) if rest else value})


def settings_from_env(environ: Mapping[str, str]) -> Settings:
    """Settings() with every CHATFLEET_* variable of `environ` that is set and not empty.

    Raises ValueError naming the variable when one cannot be read (e.g. CHATFLEET_WORKERS=many).
    """
    for name, why in RETIRED.items():
        if environ.get(name, "").strip():
            raise ValueError(f"{name}: {why}")
    settings = Settings()
    for name, (path, parse) in ENVIRONMENT.items():
        raw = environ.get(name, "")
        if not raw.strip():
            continue
        try:
            value = parse(raw)
        except ValueError as exc:
            raise ValueError(f"{name}: {raw!r} {exc}") from None
        settings = _with(settings, path.split("."), value)
    return settings
