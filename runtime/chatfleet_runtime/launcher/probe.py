"""A kubelet exec probe for a server bound to the pod's loopback (Triton's HTTP port).

``python3 -m chatfleet_runtime.launcher.probe --url=http://127.0.0.1:8000/v2/health/ready``: exit 0 when the URL
answers 200 within the time-out, 1 otherwise, with one line saying why. Triton listens on 127.0.0.1 only
(docs/security.md "Ports"), so the kubelet, which probes from the node, cannot reach it with an HTTP
probe. Standard library only: it runs every few seconds and must start fast.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request


def check(url: str, timeout_s: float) -> tuple[bool, str]:
    """(healthy, one line): healthy when the URL answers 200 within timeout_s."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status == 200, f"{url}: {resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"{url}: {exc.code}"
    except OSError as exc:
        return False, f"{url}: unreachable ({exc})"


def main(argv: list[str] | None = None) -> int:
    """Probe once; exit 0 (healthy) or 1."""
    parser = argparse.ArgumentParser(description="probe a loopback-only HTTP endpoint for the kubelet")
    parser.add_argument("--url", required=True)
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds")
    args = parser.parse_args(argv)
    healthy, line = check(args.url, args.timeout)
    print(line, flush=True)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
