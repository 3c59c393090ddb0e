"""Cluster-level defaults of a ChatbotService that follow the operator, not the CRD (pure).

The runtime image and the Prometheus address were once CRD schema defaults, which the API server writes
into every stored object: an operator upgrade never upgraded a fleet's runtime, and moving a cluster's
Prometheus meant editing every object. Now they come from the operator's settings (``--runtime-image``,
``--prometheus-address``; the chart's ``operator.defaults``) whenever a spec does not name them, and an
object that names them keeps its own.

Objects stored under the old CRD carry its defaults as if their authors had written them. A value equal
to the old default (``LEGACY_STORED``) is read as unset, so those fleets follow the operator too; an author
who wants exactly that value anyway pins it in another spelling (a digest, or a different host name).

The pass hashes the effective spec (``effective_spec``) for the update revision, so a default that
changes with an operator upgrade starts a release of every fleet that follows it, with the release's
analysis and rollback, like any spec change; and a default equal to what an object stored hashes as
before (no release at the upgrade that makes this change).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Where each default lives in the spec: (section, field).
IMAGE = ("runtime", "image")
PROMETHEUS = ("analysis", "prometheusAddress")

#: What CRD v1alpha1 up to 0.1.0 stored into every object that did not name these fields.
LEGACY_STORED: dict[tuple[str, str], str] = {
    IMAGE: "ghcr.io/chatfleet/chatfleet-runtime:0.1.0",
    PROMETHEUS: "http://prometheus.monitoring.svc:9090",
}


@dataclass(frozen=True)
class ClusterDefaults:
    """The operator's defaults for fields a spec may leave out."""

    runtime_image: str = LEGACY_STORED[IMAGE]
    prometheus_address: str = LEGACY_STORED[PROMETHEUS]

    def value(self, where: tuple[str, str]) -> str:
        return self.runtime_image if where == IMAGE else self.prometheus_address


def follows_operator(spec: Mapping[str, Any] | None, where: tuple[str, str]) -> bool:
    """Whether the spec leaves this field to the operator: absent, empty, or the old CRD's stored default.

    >>> follows_operator({"runtime": {"image": "registry.example/rt:2"}}, IMAGE)
    False
    >>> follows_operator({"runtime": {"image": "ghcr.io/chatfleet/chatfleet-runtime:0.1.0"}}, IMAGE)
    True
    """
    section, name = where
    value = ((spec or {}).get(section) or {}).get(name)
    return not value or value == LEGACY_STORED[where]


def effective_spec(spec: Mapping[str, Any] | None, defaults: ClusterDefaults) -> dict[str, Any]:
    """The spec with every field that follows the operator set to the operator's default (a copy)."""
    out = copy.deepcopy(dict(spec or {}))
    for where in (IMAGE, PROMETHEUS):
        if follows_operator(spec, where):
            section, name = where
            out[section] = {**(out.get(section) or {}), name: defaults.value(where)}
    return out
