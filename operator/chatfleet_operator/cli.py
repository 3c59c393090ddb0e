"""Command line: `python -m chatfleet_operator.cli run [--namespace NS ...]` runs the operator."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import re
import resource
import signal
import sys
from collections.abc import Mapping
from dataclasses import replace

from chatfleet_operator.builders.httproute import MIRROR_METHODS
from chatfleet_operator.converge.policy import host_path_prefix_error
from chatfleet_operator.release.traffic import ROUTINGS
from chatfleet_operator.settings import (
    PrometheusSettings,
    ReleaseSettings,
    Settings,
    node_selector_item,
    settings_from_env,
    toleration_item,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(prog="chatfleet-operator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the operator in the foreground against the current KUBECONFIG")
    run.add_argument(
        "--namespace", "-n", action="append", default=[], help="watch only this namespace (repeatable)"
    )
    run.add_argument("--workers", type=int, default=None, help="threads for API calls (default 16)")
    run.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    run.add_argument(
        "--upgrade-wave",
        type=int,
        default=None,
        metavar="N",
        help="most ChatbotServices the operator updates at once after an upgrade (a new pod template of the "
        "same revision, a release of a new default image); the others wait their turn (default 5; 0: no "
        "limit; env CHATFLEET_UPGRADE_WAVE)",
    )
    run.add_argument(
        "--stats-file", default=None, help="write pass/latency/write counters here on exit (JSON)"
    )
    run.add_argument(
        "--liveness",
        default=None,
        metavar="URL",
        help="serve kopf's health endpoint, e.g. http://0.0.0.0:8080/healthz",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the operator's Prometheus metrics on http://ADDRESS:PORT/metrics (off when absent; "
        "0 picks a free port, written to the log)",
    )
    run.add_argument(
        "--metrics-address",
        default="0.0.0.0",
        metavar="ADDRESS",
        help="address the metrics server binds (default 0.0.0.0; 127.0.0.1 keeps it to this host)",
    )
    run.add_argument(
        "--peering",
        default=None,
        metavar="NAME",
        help="run with kopf peering NAME (leader election across replicas); standalone when absent",
    )
    run.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority (highest works, others stand by); random when --peering is given without it",
    )
    run.add_argument(
        "--analysis-allowed-host",
        action="append",
        default=None,
        metavar="HOST",
        help="a host the release analysis may call besides *.svc names (exact name, *.suffix, IP or CIDR; "
        "repeatable; default env CHATFLEET_ANALYSIS_ALLOWED_HOSTS, comma-separated)",
    )
    run.add_argument(
        "--allowed-host-path",
        action="append",
        default=None,
        metavar="PREFIX",
        help="a host directory prefix spec.model.hostPath may name ('/data' allows /data and /data/x, not "
        "/database; repeatable; default env CHATFLEET_ALLOWED_HOST_PATHS, comma-separated; none: every "
        "hostPath is refused)",
    )
    run.add_argument(
        "--gateway",
        default=None,
        metavar="NAME",
        help="the Gateway the release HTTPRoutes attach to (default env CHATFLEET_GATEWAY, else chatfleet)",
    )
    run.add_argument(
        "--gateway-namespace",
        default=None,
        metavar="NS",
        help="namespace of that Gateway (default env CHATFLEET_GATEWAY_NAMESPACE, else each route's own)",
    )
    run.add_argument(
        "--gateway-mirror",
        choices=MIRROR_METHODS,
        default=None,
        help="how the Gateway mirrors requests in a release's shadow phase: RequestMirror (Gateway API's "
        "filter; default, env CHATFLEET_GATEWAY_MIRROR) or TraefikService (Traefik 3.6, with its CRD provider)",
    )
    run.add_argument(
        "--routing",
        choices=ROUTINGS,
        default=None,
        help="what a canary's HTTPRoute sends its weights to: auto (default, env CHATFLEET_ROUTING): "
        "InferencePools and their endpoint picker where the cluster serves inference.networking.k8s.io/v1, "
        "else Services; Service: always Services",
    )
    run.add_argument(
        "--picker-image",
        default=None,
        metavar="IMAGE",
        help="image of the InferencePools' endpoint picker (default env CHATFLEET_PICKER_IMAGE, else "
        "chatfleet/chatfleet-operator:0.1.0: the operator's image carries it)",
    )
    run.add_argument(
        "--picker-service-account",
        default=None,
        metavar="NAME",
        help="ServiceAccount of the endpoint picker in each fleet's namespace, allowed to list and watch pods "
        "(default env CHATFLEET_PICKER_SERVICE_ACCOUNT, else chatfleet-picker; the chart writes it)",
    )
    run.add_argument(
        "--picker-node-selector",
        action="append",
        metavar="KEY=VALUE",
        help="a node label the endpoint picker's pods must match (repeat for more; default env "
        "CHATFLEET_PICKER_NODE_SELECTOR, comma-separated, else any node)",
    )
    run.add_argument(
        "--picker-toleration",
        action="append",
        metavar="KEY[=VALUE][:EFFECT]",
        help="a taint the endpoint picker's pods tolerate, in kubectl taint's syntax (repeat for more; "
        "default env CHATFLEET_PICKER_TOLERATIONS, comma-separated, else none)",
    )
    run.add_argument(
        "--autoscaler",
        choices=("auto", "keda", "hpa"),
        default=None,
        help="what scales an autoscaled ChatbotService: a KEDA ScaledObject or an HPA; auto (default, env "
        "CHATFLEET_AUTOSCALER): KEDA when the cluster serves keda.sh/v1alpha1",
    )
    run.add_argument(
        "--prometheus-ca-file",
        default=None,
        metavar="FILE",
        help="PEM CA bundle that signed the certificates of https:// Prometheus addresses (default env "
        "CHATFLEET_PROMETHEUS_CA_FILE, else the system's CAs)",
    )
    run.add_argument(
        "--prometheus-bearer-token-file",
        default=None,
        metavar="FILE",
        help="send the token in FILE as `Authorization: Bearer` with every Prometheus query, read at each "
        "query so a rotated token works (default env CHATFLEET_PROMETHEUS_BEARER_TOKEN_FILE, else none)",
    )
    run.add_argument(
        "--prometheus-bearer-token-host",
        action="append",
        default=None,
        metavar="HOST",
        help="a host the bearer token may be sent to, over https only (repeatable; required with "
        "--prometheus-bearer-token-file; default env CHATFLEET_PROMETHEUS_BEARER_TOKEN_HOSTS, comma-separated)",
    )
    run.add_argument(
        "--prometheus-insecure-skip-verify",
        action="store_true",
        default=None,
        help="do not verify Prometheus' TLS certificate (default off, env "
        "CHATFLEET_PROMETHEUS_INSECURE_SKIP_VERIFY=true); not with --prometheus-ca-file",
    )
    run.add_argument(
        "--runtime-image",
        default=None,
        metavar="IMAGE",
        help="the runtime image of every ChatbotService that names none in spec.runtime.image (env "
        "CHATFLEET_RUNTIME_IMAGE); a change starts a release of each such fleet",
    )
    run.add_argument(
        "--prometheus-address",
        default=None,
        metavar="URL",
        help="the Prometheus of every ChatbotService that names none in spec.analysis.prometheusAddress "
        "(env CHATFLEET_PROMETHEUS_ADDRESS)",
    )
    sub.add_parser("version", help="print the version")
    return parser.parse_args(argv)


def build_settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    """Settings of one operator process from the `run` flags over the environment (default os.environ,
    read now); a value that cannot be read exits naming its variable or flag."""
    try:
        base = settings_from_env(os.environ if environ is None else environ)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    runtime = replace(base.runtime, namespaces=tuple(args.namespace))
    if args.workers:
        runtime = replace(runtime, workers=args.workers)
    if args.runtime_image or args.prometheus_address:
        d = runtime.defaults
        runtime = replace(
            runtime,
            defaults=replace(
                d,
                runtime_image=args.runtime_image or d.runtime_image,
                prometheus_address=args.prometheus_address or d.prometheus_address,
            ),
        )
    if not re.fullmatch(r"https?://\S+", runtime.defaults.prometheus_address):
        raise SystemExit(
            f"--prometheus-address (CHATFLEET_PROMETHEUS_ADDRESS): {runtime.defaults.prometheus_address!r} "
            "is not an http(s) URL"
        )
    if not re.fullmatch(r"\S+", runtime.defaults.runtime_image):
        raise SystemExit(
            f"--runtime-image (CHATFLEET_RUNTIME_IMAGE): {runtime.defaults.runtime_image!r} is not an image"
        )
    pod = base.pod
    if args.allowed_host_path is not None:
        pod = replace(pod, allowed_host_paths=tuple(args.allowed_host_path))
    if args.upgrade_wave is not None:
        pod = replace(pod, upgrade_wave=args.upgrade_wave)
    if pod.upgrade_wave < 0:
        raise SystemExit(
            f"--upgrade-wave (CHATFLEET_UPGRADE_WAVE): {pod.upgrade_wave} is below 0 (0: no limit)"
        )
    bad = [why for prefix in pod.allowed_host_paths if (why := host_path_prefix_error(prefix))]
    if bad:
        raise SystemExit(f"--allowed-host-path (CHATFLEET_ALLOWED_HOST_PATHS): {'; '.join(bad)}")
    release = base.release
    if args.analysis_allowed_host is not None:
        release = replace(release, analysis_allowed_hosts=tuple(args.analysis_allowed_host))
    if args.gateway:
        release = replace(release, gateway_name=args.gateway)
    if args.gateway_namespace:
        release = replace(release, gateway_namespace=args.gateway_namespace)
    if args.gateway_mirror:
        release = replace(release, gateway_mirror=args.gateway_mirror)
    if args.routing:
        release = replace(release, routing=args.routing)
    if args.picker_image:
        release = replace(release, picker_image=args.picker_image)
    if args.picker_service_account:
        release = replace(release, picker_service_account=args.picker_service_account)
    release = picker_placement(args, release)
    if release.routing not in ROUTINGS:
        raise SystemExit(f"CHATFLEET_ROUTING must be {' or '.join(ROUTINGS)}, not {release.routing!r}")
    if release.gateway_mirror not in MIRROR_METHODS:
        raise SystemExit(
            f"CHATFLEET_GATEWAY_MIRROR must be {' or '.join(MIRROR_METHODS)}, not {release.gateway_mirror!r}"
        )
    autoscale = base.autoscale
    if args.autoscaler:
        autoscale = replace(autoscale, metrics_source=args.autoscaler)
    prometheus = prometheus_settings(args, base.prometheus)
    return replace(
        base, pod=pod, runtime=runtime, release=release, autoscale=autoscale, prometheus=prometheus
    )


def picker_placement(args: argparse.Namespace, release: ReleaseSettings) -> ReleaseSettings:
    """The picker's node selector and tolerations from the flags over `release` (the environment's); a
    value that cannot be read exits naming its flag."""
    for flag, given, field, parse in (
        ("--picker-node-selector", args.picker_node_selector, "picker_node_selector", node_selector_item),
        ("--picker-toleration", args.picker_toleration, "picker_tolerations", toleration_item),
    ):
        if given is None:
            continue
        try:
            release = replace(release, **{field: tuple(parse(item) for item in given)})
        except ValueError as exc:
            raise SystemExit(f"{flag}: {exc}") from None
    return release


def prometheus_settings(args: argparse.Namespace, prometheus: PrometheusSettings) -> PrometheusSettings:
    """How Prometheus is reached, from the flags over `prometheus` (the environment's); a CA with skipped
    verification exits."""
    if args.prometheus_ca_file:
        prometheus = replace(prometheus, ca_file=args.prometheus_ca_file)
    if args.prometheus_bearer_token_file:
        prometheus = replace(prometheus, bearer_token_file=args.prometheus_bearer_token_file)
    if args.prometheus_bearer_token_host is not None:
        prometheus = replace(prometheus, bearer_token_hosts=tuple(args.prometheus_bearer_token_host))
    if args.prometheus_insecure_skip_verify:
        prometheus = replace(prometheus, insecure_skip_verify=True)
    if prometheus.bearer_token_file and not prometheus.bearer_token_hosts:
        raise SystemExit(
            "--prometheus-bearer-token-file (CHATFLEET_PROMETHEUS_BEARER_TOKEN_FILE) needs "
            "--prometheus-bearer-token-host (CHATFLEET_PROMETHEUS_BEARER_TOKEN_HOSTS): the hosts the token may "
            "be sent to; a ChatbotService's author chooses its Prometheus address"
        )
    if prometheus.ca_file and prometheus.insecure_skip_verify:
        raise SystemExit(
            "--prometheus-ca-file (CHATFLEET_PROMETHEUS_CA_FILE) and --prometheus-insecure-skip-verify "
            "(CHATFLEET_PROMETHEUS_INSECURE_SKIP_VERIFY) exclude each other: set the CA to verify, or neither"
        )
    return prometheus


def run(args: argparse.Namespace) -> int:
    """Configure the API client, install the Controller, and run kopf until SIGINT/SIGTERM."""
    import kopf

    from chatfleet_operator import garbage, kopfext, kube, main, metrics
    from chatfleet_operator.controller import Controller

    settings = build_settings(args)
    kopf.configure(verbose=args.verbose)  # kopf's log format on the root logger
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    kopfext.ORCHESTRATOR_STOPS.install()  # kopf stuck on watchers it stopped: warned, and the probe fails
    kopfext.repair_index_gates()  # a namespace deleted while we start must not stop every handler
    kube.configure(pool_size=max(32, settings.runtime.workers * 2))
    controller = Controller(settings, kube)
    main.install(controller)
    if args.metrics_port is not None:  # before kopf starts: the first passes are counted and scrapable
        port = metrics.serve(args.metrics_port, args.metrics_address)
        logging.getLogger("chatfleet").info(
            "Serving metrics on http://%s:%d/metrics", args.metrics_address, port
        )
    namespaces = list(settings.runtime.namespaces)

    def dump_stats(*_: object) -> None:
        """Write passes, raw pass and request latencies, write counters, memory and the garbage collector's
        CPU to --stats-file.

        The raw figures only: the benchmark computes their percentiles (bench/percentiles.py).
        """
        if args.stats_file:
            times = os.times()
            data = {
                **metrics.raw_figures(),
                **garbage.figures(),
                "cpu_seconds": times.user + times.system,
                "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
            with open(args.stats_file + ".tmp", "w") as fh:
                json.dump(data, fh)
            os.replace(args.stats_file + ".tmp", args.stats_file)

    signal.signal(signal.SIGUSR1, dump_stats)  # the benchmark asks for figures mid-run
    peering: dict[str, object] = {"standalone": True}
    if args.peering:
        # kopf pauses every peer that shares the top priority, and a Deployment cannot give each pod its
        # own: a random priority per process makes exactly one replica the leader.
        priority = args.priority if args.priority is not None else random.randint(1, 2**31 - 1)
        peering = {"standalone": False, "peering_name": args.peering, "priority": priority}
    gate = kopfext.GateWatch()
    metrics.HANDLERS_HELD.set_function(gate.held_seconds)

    async def operate() -> None:
        """kopf's operator, and beside it the watch on its start-up gate (stopped with it)."""
        watch = asyncio.create_task(gate.run(kopfext.GATE_SAMPLE_SECONDS, kopfext.GATE_WARN_SECONDS))
        try:
            await kopf.operator(
                clusterwide=not namespaces,
                namespaces=namespaces,
                liveness_endpoint=args.liveness,
                **peering,
            )
        finally:
            watch.cancel()

    try:
        asyncio.run(operate())
    finally:
        dump_stats()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `chatfleet-operator`."""
    args = parse_args(argv)
    if args.command == "version":
        from chatfleet_operator import __version__

        print(__version__)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
