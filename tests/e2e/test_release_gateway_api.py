"""Canary split by Gateway API HTTPRoute weights, with the CRDs of sigs.k8s.io/gateway-api installed (and,
for InferencePool routing, the Inference Extension's InferencePool CRD).

The CRDs are cluster-scoped and the session cluster is shared: this module installs them and removes
them in teardown; the operator watches CRDs and asks discovery again when these arrive or go (no
fixed waits).
"""

from __future__ import annotations

import json

import pytest
from chatfleet_platform.addons import gatewayapi, inferenceext
from release_e2e import Release, bot_spec, promoted_to

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]


@pytest.fixture(scope="module")
def gateway_api(cluster):
    """The standard-channel Gateway API CRDs, installed for this module only."""
    gatewayapi.install(cluster)  # the operator watches CRDs: their arrival runs every bot again
    try:
        yield
    finally:
        gatewayapi.uninstall(cluster)


def route_weights(bot: Release) -> list[int]:
    res = bot.kubectl("get", "httproute", "bot", "-o", "json", check=False)
    if res.returncode != 0:
        return []
    return [b.get("weight", 1) for b in json.loads(res.stdout)["spec"]["rules"][-1]["backendRefs"]]


def test_canary_weights_move_on_the_httproute(gateway_api, bot, prometheus, traffic):
    bot.apply(bot_spec(prometheus.url))
    bot.wait(lambda r: r.cond("Ready").get("status") == "True", 60, "Ready")
    # A first pass may still have run before the operator saw the CRDs arrive; the next one routes.
    bot.wait(lambda r: route_weights(r) == [100, 0], 30, "stable-only HTTPRoute")
    bot.patch({"model": {"revision": "v2"}})
    bot.wait(lambda r: r.release().get("traffic") == "HTTPRoute", 30, "HTTPRoute in effect")
    seen = set()

    def watch(r: Release) -> bool:
        seen.add(tuple(route_weights(r)))
        return r.status().get("stableRevision") == r.status().get("updateRevision") and not r.release()

    bot.wait(watch, 150, "promotion via HTTPRoute")
    assert (75, 25) in seen and (50, 50) in seen, seen
    assert route_weights(bot) == [100, 0]
    assert bot.service_selector("bot-canary")["chatfleet.io/track"] == "canary"
    new = bot.status()["stableRevision"]
    assert promoted_to(new)(bot)


def route_backends(bot: Release) -> list[tuple[str, str, int]]:
    res = bot.kubectl("get", "httproute", "bot", "-o", "json", check=False)
    if res.returncode != 0:
        return []
    refs = json.loads(res.stdout)["spec"]["rules"][-1]["backendRefs"]
    return [(b.get("kind", "Service"), b["name"], b.get("weight", 1)) for b in refs]


def exists(bot: Release, kind: str, name: str) -> bool:
    return bot.kubectl("get", kind, name, "-o", "name", check=False).returncode == 0


def test_with_the_inference_extension_the_route_goes_to_pools_and_back(gateway_api, cluster, bot, prometheus):
    """InferencePool routing: with the Inference Extension's InferencePool CRD (pinned, from its Go module)
    installed too, the canary's HTTPRoute sends its weights to one InferencePool per track, the endpoint
    picker is written (under the chart's ServiceAccount) and status.routing says so; when the CRD goes,
    the routing goes back to Services and the pools' and picker's objects are deleted. No gateway
    controller programs pools here (kwok pods have no addresses): the pools' acceptance stays Unknown,
    which the status must say; a real gateway in front of the picker is tests/integration/picker's."""
    inferenceext.install(cluster)
    try:
        _pools_and_back(cluster, bot, prometheus)
    finally:
        if cluster.kubectl("get", "crd", *inferenceext.CRD_NAMES, check=False).returncode == 0:
            inferenceext.uninstall(cluster)


def _pools_and_back(cluster, bot, prometheus):
    bot.apply(bot_spec(prometheus.url))
    bot.wait(lambda r: r.cond("Ready").get("status") == "True", 60, "Ready")
    pools = [("InferencePool", "bot", 100), ("InferencePool", "bot-canary", 0)]
    bot.wait(lambda r: route_backends(r) == pools, 40, "an HTTPRoute over the two pools")
    routing = bot.wait(
        lambda r: (r.status().get("routing") or {}).get("pools") and r.status()["routing"],
        30,
        "status.routing",
    )
    assert routing["backends"] == "InferencePool"
    assert [(p["name"], p["status"]) for p in routing["pools"]] == [
        ("bot", "Unknown"),
        ("bot-canary", "Unknown"),
    ]
    pool = json.loads(bot.kubectl("get", "inferencepool", "bot-canary", "-o", "json").stdout)
    assert pool["spec"]["selector"]["matchLabels"] == {
        "chatfleet.io/service": "bot",
        "chatfleet.io/track": "canary",
    }
    assert pool["spec"]["endpointPickerRef"]["name"] == "bot-picker"
    picker = bot.deployment("bot-picker")
    assert picker["spec"]["template"]["spec"]["serviceAccountName"] == "chatfleet-picker"
    assert exists(bot, "service", "bot-picker")
    assert "Routing: HTTPRoute -> InferencePool" in bot.plugin("status", "bot")

    # a release moves the weights on the pools
    bot.patch({"model": {"revision": "v2"}})
    seen = set()

    def stepped(r: Release) -> bool:
        seen.add(tuple(route_backends(r)))
        return any(w > 0 for kind, name, w in route_backends(r) if name == "bot-canary")

    bot.wait(stepped, 90, "a canary weight on pool bot-canary")
    assert all(kind == "InferencePool" for b in seen for kind, _, _ in b), seen

    inferenceext.uninstall(cluster)
    bot.wait(
        lambda r: route_backends(r) and all(k == "Service" for k, _, _ in route_backends(r)),
        60,
        "Services again",
    )
    bot.wait(
        lambda r: (r.status().get("routing") or {}).get("backends") == "Service", 30, "status.routing Service"
    )
    for kind in ("deployment", "service"):
        bot.wait(lambda r, k=kind: not exists(r, k, "bot-picker"), 30, f"{kind} bot-picker deleted")
