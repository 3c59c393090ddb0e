"""What the operator refuses to build whatever the spec says: its own limits on any author's spec. Pure.

A ChatbotService author is not trusted with the node: spec.model.hostPath mounts a host directory into
the pods, so the operator builds it only under the prefixes its settings allow (PodSettings
.allowed_host_paths, default none). The chart's ValidatingAdmissionPolicy refuses the same at admission;
this check covers clusters without it (no chart, policy removed, objects admitted before it).
"""

from __future__ import annotations

from collections.abc import Sequence

from chatfleet_operator.api import Reason
from chatfleet_operator.converge.diagnose import Problem
from chatfleet_operator.settings import PodSettings
from chatfleet_operator.spec import ChatbotServiceSpec

#: The flag and chart value that set the allowed prefixes (named in messages, so the user knows whom to ask).
HOST_PATH_SETTING = "--allowed-host-path (chart value operator.allowedHostPaths)"


def host_path_prefix_error(prefix: str) -> str | None:
    """Why `prefix` cannot be an allowed host path prefix; None when it can.

    e.g. '/data' -> None; 'data' -> 'must be absolute'; '/data/../etc' -> "must have no '..' segment".
    """
    if not prefix.startswith("/"):
        return f"{prefix!r} must be an absolute path"
    if ".." in prefix.split("/"):
        return f"{prefix!r} must have no '..' segment"
    return None


def host_path_allowed(path: str, prefixes: Sequence[str]) -> bool:
    """Whether `path` is one of `prefixes` or below one, on whole path segments, with no '..' segment.

    e.g. prefixes ('/data',): '/data' and '/data/x' -> True; '/database', '/data/../etc', '/' -> False;
    prefixes ('/',): any absolute path without '..' -> True; prefixes (): always False.
    """
    if not path.startswith("/") or ".." in path.split("/"):
        return False
    for prefix in prefixes:
        base = prefix.rstrip("/")
        if path in (prefix, base) or path.startswith(base + "/"):
            return True
    return False


def host_path_problems(spec: ChatbotServiceSpec, pod: PodSettings) -> list[Problem]:
    """HostPathNotAllowed when spec.model.hostPath is outside the allowed prefixes; [] otherwise.

    e.g. hostPath '/etc', allowed ('/data',) -> "spec.model.hostPath '/etc' is not under an allowed
    host path prefix (/data) of --allowed-host-path (chart value operator.allowedHostPaths); ...".
    """
    path = spec.model.host_path
    if path is None or host_path_allowed(path, pod.allowed_host_paths):
        return []
    if pod.allowed_host_paths:
        why = (
            f"is not under an allowed host path prefix ({', '.join(pod.allowed_host_paths)}) of "
            f"{HOST_PATH_SETTING}"
        )
    else:
        why = f"is not allowed: the operator allows no host paths ({HOST_PATH_SETTING} is empty)"
    return [
        Problem(
            Reason.HOST_PATH_NOT_ALLOWED,
            f"spec.model.hostPath {path!r} {why}; no Deployment is built for it. Use spec.model.uri or "
            "spec.model.pvc, or ask the cluster's operator admin to allow the path",
        )
    ]
