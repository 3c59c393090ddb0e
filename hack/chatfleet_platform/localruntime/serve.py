"""`make serve`: the runtime locally on the tiny model, in the foreground, until Ctrl-C.

Starts Redis, Triton (real tritonserver from the pytriton wheel) and the chat API on 127.0.0.1, prints
one line ``CHAT_API=<base URL>`` once everything is ready, and stops exactly what it started on
SIGINT/SIGTERM. Work folder: ``$CHATFLEET_SERVE_DIR`` or ``.work/runtime-serve`` (logs are there).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from chatfleet_platform.localruntime.testing import local_runtime


def main(argv: list[str] | None = None) -> int:
    """Run until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=os.environ.get("CHATFLEET_SERVE_DIR", ".work/runtime-serve"))
    parser.add_argument(
        "--model-dir",
        default=os.environ.get("CHATFLEET_MODEL_DIR"),
        help="weights folder (default: tiny model)",
    )
    parser.add_argument("--no-redis", action="store_true")
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    workdir = Path(args.workdir).resolve()
    print(f"starting Redis, Triton and the chat API (logs in {workdir}) ...", file=sys.stderr, flush=True)
    with local_runtime(
        workdir, model_dir=Path(args.model_dir) if args.model_dir else None, with_redis=not args.no_redis
    ) as rt:
        print(f"CHAT_API={rt.api_url}", flush=True)
        print(f"  admin={rt.api.admin_url} metrics={rt.api.metrics_url}", file=sys.stderr, flush=True)
        print(
            f"  triton http={rt.triton.http_url} grpc={rt.triton.grpc_url} metrics={rt.triton.metrics_url}",
            file=sys.stderr,
            flush=True,
        )
        stop.wait()
        print("stopping ...", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
