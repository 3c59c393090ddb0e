"""spec.streamRelay: the stream relay the operator runs in front of the fleet (builders/relay.py).

Outside the revision (builders/common.py REVISION_FIELDS): turning it on or changing it starts no release and
changes no pod of the fleet; it writes (or deletes) the relay's own Deployment and Services.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chatfleet_operator.spec.fields import field_value


@dataclass(frozen=True)
class StreamRelaySpec:
    """spec.streamRelay (the CRD's defaults repeated: off, 2 relays, 3 s of silence, 3 resumes)."""

    enabled: bool = False
    replicas: int = 2
    stall_seconds: int = 3
    """A stream silent this long from its replica is cut and resumed elsewhere (a node gone silent)."""
    max_resumes: int = 3
    """How many times one stream may be resumed; 0: none (a cut reaches the client as stream_cut)."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StreamRelaySpec:
        """Parse spec.streamRelay (absent: off)."""
        return cls(
            enabled=bool(field_value(d, "enabled", False)),
            replicas=int(field_value(d, "replicas", 2)),
            stall_seconds=int(field_value(d, "stallSeconds", 3)),
            max_resumes=int(field_value(d, "maxResumes", 3)),
        )
