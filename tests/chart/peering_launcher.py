"""Test-only launcher: `chatfleet_operator.cli run ...` with kopf peering and a liveness endpoint.

Usage: python peering_launcher.py PEERING PRIORITY LIVENESS_URL -- run --namespace=NS ...
It runs the real CLI and only adds to its kopf.operator() call what the chart's `--peering=NAME` (with a
per-replica priority) and `--liveness=URL` flags ask for, until the CLI has those flags.
"""

from __future__ import annotations

import sys
from typing import Any


def main(argv: list[str]) -> int:
    """Patch kopf.operator, then hand over to the operator's CLI."""
    import kopf
    from chatfleet_operator import cli

    peering, priority, liveness, sep, *rest = argv
    assert sep == "--", __doc__
    original = kopf.operator

    def operator(**kwargs: Any) -> Any:
        kwargs.update(
            standalone=False, peering_name=peering, priority=int(priority), liveness_endpoint=liveness
        )
        return original(**kwargs)

    kopf.operator = operator
    return cli.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
