"""Sample bodies and observed objects for the operator unit tests."""

from __future__ import annotations

import copy
from typing import Any


def cbs_body(spec: dict[str, Any] | None = None, *, name: str = "bot", generation: int = 1) -> dict[str, Any]:
    """A ChatbotService body as the API server would hand it over."""
    return {
        "apiVersion": "chatfleet.io/v1alpha1",
        "kind": "ChatbotService",
        "metadata": {"name": name, "namespace": "ns", "uid": "uid-1", "generation": generation},
        "spec": copy.deepcopy(spec) if spec is not None else {"model": {"uri": "hf://org/model"}},
    }


def as_observed(manifest: dict[str, Any], rv: int = 10, **status: Any) -> dict[str, Any]:
    """What the API server returns for an applied manifest: defaults added, resourceVersion, status."""
    obj = copy.deepcopy(manifest)
    obj["metadata"]["resourceVersion"] = str(rv)
    obj["metadata"]["uid"] = f"uid-{manifest['kind']}"
    obj["metadata"]["generation"] = 1
    if manifest["kind"] == "Deployment":
        for c in obj["spec"]["template"]["spec"]["containers"]:
            c["terminationMessagePath"] = "/dev/termination-log"
        obj["status"] = status or {}
    return obj
