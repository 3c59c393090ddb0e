"""The container's termination message: why this replica stopped loading, where the kubelet reads it.

The kubelet copies the file into the container's ``lastState.terminated.message``; the operator reads it
there (the int8 check's ``PrecisionCheckFailed``) and people read it in ``kubectl describe pod`` (the load
watch's hung handshake).
"""

from __future__ import annotations

import os
from pathlib import Path

#: Where the kubelet reads the termination message (the container's terminationMessagePath default).
TERMINATION_LOG = "/dev/termination-log"
#: Environment variable overriding TERMINATION_LOG (tests; a pod never sets it).
TERMINATION_LOG_ENV = "CHATFLEET_TERMINATION_LOG"


def write_termination_message(message: str) -> Path | None:
    """Write the message where the kubelet reads it; None off-pod (the kubelet creates the file in a pod, and
    nothing here creates /dev/termination-log where it does not exist)."""
    override = os.environ.get(TERMINATION_LOG_ENV)
    path = Path(override or TERMINATION_LOG)
    if not override and not path.exists():
        return None
    try:
        path.write_text(message[:4000], encoding="utf-8")
    except OSError:
        return None
    return path
