"""Names of the API: group/version/plural, label and annotation keys, condition types, reasons."""

from __future__ import annotations

import json

GROUP = "chatfleet.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ChatbotService"
PLURAL = "chatbotservices"
SINGULAR = "chatbotservice"

#: Field manager name used for server-side apply and status writes.
FIELD_MANAGER = "chatfleet-operator"

# Labels (decided with the lead; the release issue relies on them).
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_SERVICE = f"{GROUP}/service"
LABEL_TRACK = f"{GROUP}/track"
LABEL_REVISION = f"{GROUP}/revision"
#: With a warm pool: "true" on the pods the Service selects, "false" on standby ones (docs/autoscaling.md).
LABEL_SERVING = f"{GROUP}/serving"
NAME_VALUE = "chatbotservice"
MANAGED_BY_VALUE = "chatfleet-operator"

TRACK_STABLE = "stable"
TRACK_CANARY = "canary"
TRACK_PREVIEW = "preview"

# Annotations.
#: Hash of the desired manifest last applied to an owned object (drift and no-op detection).
ANNOTATION_DESIRED_HASH = f"{GROUP}/desired-hash"
#: Prefix of the pod template annotations holding the Triton config.pbtxt files (builders/tritonconfig.py).
TRITON_CONFIG_PREFIX = "triton.chatfleet.io/"

#: The ReplicaSet removes pods with the lowest cost first on scale-down (standby and drained pods).
ANNOTATION_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
#: On each pod (never the template): spec.fallback as the chat API's settings file (converge/fallback.py).
ANNOTATION_FALLBACK = f"{GROUP}/fallback"
#: Deletion cost of standby and drained pods (serving pods carry none, i.e. 0); new stable pods start with it.
STANDBY_DELETION_COST = "-100"

# GPU node labels (NVIDIA GPU feature discovery) and the extended resource.
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"

# Condition types (adjectives, Kubernetes conventions; kstatus reads Ready/Reconciling/Stalled).
COND_READY = "Ready"
COND_RECONCILING = "Reconciling"
COND_STALLED = "Stalled"
COND_DEGRADED = "Degraded"
#: Whether the autoscaler can read its metrics (HPA ScalingActive / KEDA ScaledObject Ready).
COND_SCALING_ACTIVE = "ScalingActive"
#: Whether the parent Gateway serves the canary's HTTPRoute (its Accepted and ResolvedRefs; release/route.py).
COND_ROUTE_SERVED = "RouteServed"
#: Present only while the operator holds back a new pod template of the same revision (an operator
#: upgrade waiting for its place in the upgrade wave, or a halted wave; wave.py).
COND_UPGRADE_HELD = "UpgradeHeld"

#: status.autoscaling.metricsSource values.
METRICS_KEDA = "KEDA"
METRICS_HPA = "HPA"


class Reason:
    """CamelCase condition and event reasons (one place, so docs and tests can list them)."""

    # Ready / Reconciling
    READY = "Ready"
    PROGRESSING = "Progressing"
    ROLLING_OUT = "RollingOut"
    SCALING = "Scaling"
    WAITING_FOR_PODS = "WaitingForPods"
    RECONCILED = "Reconciled"
    # Problems (Stalled=True, Ready=False)
    NO_MATCHING_GPU_NODES = "NoMatchingGPUNodes"
    INSUFFICIENT_GPUS = "InsufficientGPUs"
    SECRET_NOT_FOUND = "SecretNotFound"
    SECRET_KEY_NOT_FOUND = "SecretKeyNotFound"
    #: spec.model.hostPath outside the operator's allowed host path prefixes: nothing is built for it.
    HOST_PATH_NOT_ALLOWED = "HostPathNotAllowed"
    IMAGE_PULL_FAILED = "ImagePullFailed"
    UNSCHEDULABLE = "Unschedulable"
    PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
    CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
    #: The runtime refused to serve int8: its agreement with full precision is under the threshold (or the
    #: calibration prompts could not be read); the pod's termination message says which.
    PRECISION_CHECK_FAILED = "PrecisionCheckFailed"
    APPLY_FAILED = "ApplyFailed"
    INVALID_ANALYSIS_TARGET = "InvalidAnalysisTarget"
    RECONCILE_ERROR = "ReconcileError"
    # ScalingActive (the autoscaler's own reason is kept when it says why it cannot scale)
    METRICS_AVAILABLE = "MetricsAvailable"
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    AUTOSCALER_PENDING = "AutoscalerPending"
    # RouteServed (False keeps the Gateway's own reason, e.g. NotAllowedByListeners, BackendNotFound)
    ROUTE_ACCEPTED = "Accepted"
    ROUTE_PENDING = "Pending"
    ROUTE_NOT_ACCEPTED = "RouteNotAccepted"
    """False without a reason of the Gateway's: its Accepted is False."""
    REFS_NOT_RESOLVED = "RefsNotResolved"
    """False without a reason of the Gateway's: its ResolvedRefs is False."""
    # UpgradeHeld (wave.py)
    UPGRADE_QUEUED = "UpgradeQueued"
    """A new pod template of the same revision waits for a place in the upgrade wave."""
    UPGRADE_HALTED = "UpgradeHalted"
    """The upgrade wave is halted: an admitted fleet's rollout fails."""
    # Degraded
    CRASH_LOOP = "CrashLoopBackOff"
    HEALTHY = "Healthy"


class Phase:
    """Values of status.phase, derived from conditions for printer columns only."""

    PENDING = "Pending"
    PROGRESSING = "Progressing"
    READY = "Ready"
    DEGRADED = "Degraded"
    FAILED = "Failed"


class ApiError(Exception):
    """A non-2xx answer of the API server (raised by kube.py, understood by the reconciler)."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        self.status, self.reason, self.body = status, reason, body
        message = body
        try:
            message = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            pass
        super().__init__(f"{status} {reason}: {message}")
        self.message = message
