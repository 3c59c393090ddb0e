"""`python -m chatfleet_platform.cli up|down|status|env`: the local platform from the command line."""

from __future__ import annotations

import argparse
import sys

from chatfleet_platform.addons.gateway import GATEWAY_NAME, SHARED_NAMESPACE, Gateway
from chatfleet_platform.cluster.cluster import Cluster, default_workdir
from chatfleet_platform.common.config import PlatformError


def _progress(msg: str) -> None:
    print(f"[platform] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    ap = argparse.ArgumentParser(prog="chatfleet-platform", description=__doc__)
    ap.add_argument("--workdir", default=None, help=f"working folder (default {default_workdir()})")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the cluster (harmless when running); prints export KUBECONFIG=")
    up.add_argument("--nodes", type=int, default=4, help="simulated GPU nodes (default 4)")
    up.add_argument("--taint", action="store_true", help="taint GPU nodes nvidia.com/gpu=present:NoSchedule")
    up.add_argument(
        "--real-nodes",
        type=int,
        default=0,
        help="real nodes (kubelet + containerd on this host) beside the simulated ones (default 0)",
    )
    up.add_argument("--gpus", type=int, default=4, help="fake GPUs on each real node (default 4)")
    up.add_argument(
        "--gateway",
        action="store_true",
        help=f"also Traefik with Gateway {GATEWAY_NAME} in {SHARED_NAMESPACE} (the Gateway API data plane)",
    )
    sub.add_parser("down", help="stop what `up` started and remove the working folder")
    sub.add_parser("status", help="processes, ports and nodes")
    sub.add_parser("env", help="print export KUBECONFIG=...")
    args = ap.parse_args(argv)
    cluster = Cluster(args.workdir or default_workdir(), progress=_progress)
    try:
        if args.cmd == "up":
            cluster.up(nodes=args.nodes, taint=args.taint, real_nodes=args.real_nodes, gpus=args.gpus)
            if args.gateway:
                gw = Gateway(cluster).up()
                _progress(f"HTTPRoutes attach to Gateway {gw.namespace}/{gw.name}; requests go to {gw.url}")
            print(f"export KUBECONFIG={cluster.kubeconfig}")
        elif args.cmd == "down":
            stopped = cluster.down()
            _progress(f"stopped {len(stopped)} process(es); removed {cluster.workdir}")
        elif args.cmd == "env":
            print(f"export KUBECONFIG={cluster.kubeconfig}")
        elif args.cmd == "status":
            state = cluster.state()
            if not state:
                print(f"no cluster in {cluster.workdir} (make cluster-up)")
                return 1
            for name, alive in cluster.running().items():
                pid = (state["pids"].get(name) or ["-"])[0]
                print(f"{name:26} {'running' if alive else 'stopped'}  pid {pid}")
            print(f"ports: {state['ports']}")
            gw = Gateway(cluster)
            if gw.running():
                print(f"traefik (Gateway API data plane): {gw.url}")
            if cluster.is_up():
                print(
                    cluster.kubectl(
                        "get", "nodes", "-L", "nvidia.com/gpu.product,nvidia.com/gpu.count"
                    ).stdout
                )
    except PlatformError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
