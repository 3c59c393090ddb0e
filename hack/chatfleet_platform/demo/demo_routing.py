"""`make demo`, step 6 (real nodes only): the chatbot's dialogues routed by InferencePools through Envoy
Gateway, each turn sent by the operator's endpoint picker to the replica that holds its dialogue.

Envoy Gateway (built from its Go module) starts on this host, watching the cluster, with the local
platform's InferencePool extension server (upstream's add-on is not served here); the Gateway API and
InferencePool CRDs appear, and the operator moves the ChatbotServices' routes to pools and starts their
pickers (on the real node). Three dialogues of three turns go through the Gateway; each turn's replica is
shown. Afterwards Envoy Gateway stops and the CRDs go, so the cluster is left routing through Services as
before (Envoy Gateway's fixed ports allow one per host; the tests start their own).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from chatfleet_platform.addons import envoygateway, gatewayapi, inferenceext
from chatfleet_platform.addons.envoygateway import EnvoyGateway
from chatfleet_platform.addons.poolgateway import UPSTREAM_HEADER
from chatfleet_platform.common import procs
from chatfleet_platform.load.realpods import picker_rbac, pod_ready, pods_matching

from .demo_release import REAL_NAME, REAL_NS
from .demo_release import _patch as patch_spec
from .demo_release import _status as status_of

#: The operator's default Gateway name (--gateway), in the ChatbotService's own namespace.
GATEWAY = "chatfleet"
DIALOGUES, TURNS = 3, 3


def _status(demo: Any) -> dict[str, Any]:
    return status_of(demo, REAL_NAME, REAL_NS)


def _scale(demo: Any, replicas: int) -> None:
    patch_spec(demo, {"scaling": {"replicas": replicas}}, REAL_NAME, REAL_NS)


def _routed(demo: Any) -> bool:
    routing = _status(demo).get("routing") or {}
    pools = [p.get("status") for p in routing.get("pools") or []]
    return (
        routing.get("backends") == "InferencePool"
        and pools == ["True", "True"]
        and bool((routing.get("picker") or {}).get("ready"))
    )


def _turn(url: str, dialogue: str, n: int) -> tuple[int, str]:
    body = {"messages": [{"role": "user", "content": f"Turn {n + 1}: tell me more."}], "max_tokens": 8}
    req = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-Session-Id": dialogue},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        resp.read()
        return resp.status, resp.headers.get(UPSTREAM_HEADER, "?")


def run_routing_demo(demo: Any) -> None:
    cluster = demo.cluster
    gateway = EnvoyGateway(cluster, cluster.workdir / "envoy-gateway", identify_upstream=True)
    port = procs.free_port()
    demo.say(
        "starting Envoy Gateway on this host (built from its Go module), watching the cluster, with the "
        "platform's InferencePool extension server (upstream's add-on is not served here)"
    )
    try:
        gateway.start()
        cluster.apply(picker_rbac(REAL_NS))
        cluster.apply(envoygateway.gateway_objects(REAL_NS, GATEWAY, port))
        demo.say(
            "the Gateway API and InferencePool CRDs are installed: the operator routes the ChatbotServices "
            "through InferencePools now, each with its endpoint picker (a pod on the real node)",
            ok=True,
        )
        _scale(demo, 2)
        selector = f"chatfleet.io/service={REAL_NAME},chatfleet.io/track=stable"
        procs.wait_for(
            "2 Ready replicas",
            lambda: sum(pod_ready(p) for p in pods_matching(cluster, REAL_NS, selector)) >= 2,
            timeout=300,
            interval=1.0,
        )
        procs.wait_for(
            "status.routing: the route and both pools accepted, the picker Ready",
            lambda: _routed(demo),
            timeout=180,
            interval=1.0,
            detail=lambda: f"(status.routing: {json.dumps(_status(demo).get('routing'))})",
        )
        gateway.wait_serving(port)
        demo.kubectl_show("get", "httproute,inferencepool", "-n", REAL_NS)
        routing = _status(demo)["routing"]
        demo.say(f"status.routing: {json.dumps(routing)}", dim=True)
        url = f"http://127.0.0.1:{port}"
        demo.say(f"{DIALOGUES} dialogues of {TURNS} turns through the Gateway ({url}), no client header")
        kept = 0
        for d in range(DIALOGUES):
            dialogue = f"demo-dialogue-{d + 1}"
            replicas = [_turn(url, dialogue, n)[1] for n in range(TURNS)]
            kept += len(set(replicas)) == 1
            demo.say(f"{dialogue}: turns answered by {' -> '.join(replicas)}")
        demo.say(
            f"{kept} of {DIALOGUES} dialogues stayed on one replica, the one holding their history (prefix KV)",
            ok=kept == DIALOGUES,
            bad=kept != DIALOGUES,
        )
    finally:
        gateway.stop()
        cluster.kubectl(
            "delete", "gateway", GATEWAY, "-n", REAL_NS, "--ignore-not-found", "--wait=false", check=False
        )
        inferenceext.uninstall(cluster)
        gatewayapi.uninstall(cluster)
        _scale(demo, 1)
    demo.say(
        "Envoy Gateway stopped and its CRDs removed: the operator routes through the Services again",
        dim=True,
    )
