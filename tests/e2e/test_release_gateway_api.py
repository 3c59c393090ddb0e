"""Canary split by Gateway API HTTPRoute weights, with the CRDs of sigs.k8s.io/gateway-api installed.

The CRDs are cluster-scoped and the session cluster is shared: this module installs them and removes
them in teardown; the operator watches CRDs and asks discovery again when these arrive or go (no
fixed waits).
"""

from __future__ import annotations

import json

import pytest
from chatfleet_platform import gatewayapi
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
