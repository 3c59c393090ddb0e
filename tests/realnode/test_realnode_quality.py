"""The answer-quality gate on real pods: golden prompts asked of the real canary and stable pods.

Test design: the bot of test_realnode_release.py (one stable replica of the tiny model on the real node,
real traffic through the Service, the pods' own metrics in Prometheus) with spec.analysis.quality on and
thresholds the HTTP metrics always meet.

- A broken chat template: the new revision's template drops the roles (the model reads the bare text:
  fluent, 200, fast, and not what stable answers). Every HTTP metric passes; the release must be rolled
  back on the golden prompts alone, at the second failed interval (failureLimit 2), never on an error rate.
- A release that changes only what cannot change answers (maxBatchSize), its golden prompts read from a
  ConfigMap (spec.analysis.quality.promptsFrom): promoted, the gate's agreement 100 % in every interval.
- Shadow traffic, through the real gateway (Traefik, the operator mirroring by TraefikService): the same
  broken template with spec.analysis.quality.shadow on and no golden prompts. Users chat through the
  gateway the whole time; the canary must be rolled back on the mirrored requests' answers alone, in its
  shadow phase, and no user response may come from it (every response names its revision). Last in the
  module: its `gateway` fixture switches the operator to HTTPRoutes for the tests after it.
- Both mirror objects the operator can write (the RequestMirror filter, TraefikService) pass the real
  CRDs' schemas (a server-side dry run): the RequestMirror way is never served by the local Traefik.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from chatfleet_platform.load.dialogues import DialogueLoad
from chatfleet_platform.load.realpods import ChatLoad, on_real_node, serves, service_url
from chatfleet_platform.load.releasetraffic import Bot, rolled_back
from test_realnode_release import bot_spec as release_bot_spec

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]

ROLELESS_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


def bot_spec(prometheus: str) -> dict[str, Any]:
    """test_realnode_release's bot, with the quality gate on and HTTP thresholds it always meets."""
    spec = release_bot_spec(prometheus)
    spec["rollout"]["canary"]["steps"][0]["pauseSeconds"] = 30
    spec["analysis"].update(
        intervalSeconds=10,
        failureLimit=2,
        consecutiveErrorLimit=6,
        progressDeadlineSeconds=300,
        thresholds={"errorRatePercent": 50, "latencyP99Milliseconds": 60000},
        quality={
            "enabled": True,
            "maxTokens": 12,
            "prompts": [
                {"name": "refund", "prompt": "How long do refunds take?"},
                {"name": "hello", "prompt": "Hello! Who are you?"},
                {"name": "order", "prompt": "Where is my order 1234?"},
            ],
        },
    )
    return spec


PROMPTS_YAML = """
- name: refund
  prompt: How long do refunds take?
- name: hello
  prompt: Hello! Who are you?
  expect: {maxLength: 2000}
"""


def apply_stable(bot: Bot, pod_prometheus, runtime_image, host_model_dir, from_config_map=False) -> None:
    """Create the bot (its golden prompts in the spec, or in a ConfigMap it names)."""
    spec = bot_spec(pod_prometheus.url)
    if from_config_map:
        bot.cluster.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "golden", "namespace": bot.ns},
                    "data": {"prompts.yaml": PROMPTS_YAML},
                }
            ]
        )
        quality = spec["analysis"]["quality"]
        del quality["prompts"]
        quality["promptsFrom"] = {"configMapName": "golden"}
    bot.apply(on_real_node(spec, image=runtime_image, model_dir=host_model_dir))


@pytest.fixture(scope="module", autouse=True)
def _gated_bot_ahead(head_start, cluster, real_operator, pod_prometheus, runtime_image, host_model_dir):
    """The promotion test's bot (prompts from a ConfigMap), applied as the module starts (conftest's
    HeadStart)."""
    head_start.begin(
        lambda ns: apply_stable(Bot(cluster, ns), pod_prometheus, runtime_image, host_model_dir, True)
    )


def started(bot: Bot, pod_prometheus, runtime_image, host_model_dir, *, applied: bool = False) -> ChatLoad:
    """Create the bot (unless `applied` ahead), wait until it is Ready, start the client."""
    if not applied:
        apply_stable(bot, pod_prometheus, runtime_image, host_model_dir)
    bot.wait(lambda: bot.cond("Ready").get("status") == "True", 600, "stable Ready")
    return ChatLoad(service_url(bot.cluster, bot.ns, bot.name), workers=2, max_seconds=900).start()


def analysis(bot: Bot) -> dict[str, Any]:
    return (bot.status().get("release") or {}).get("analysis") or {}


def test_a_broken_chat_template_is_rolled_back_on_answers_alone(
    cluster, real_operator, real_ns, pod_prometheus, runtime_image, host_model_dir
):
    bot = Bot(cluster, real_ns)
    load = started(bot, pod_prometheus, runtime_image, host_model_dir)
    try:
        bot.patch({"model": {"chatTemplate": ROLELESS_TEMPLATE}})
        bot.wait(lambda: bot.pods("canary"), 120, "a canary pod")
        bot.wait(lambda: rolled_back(bot), 420, "rollback on answer quality")
        message = bot.cond("Stalled").get("message", "")
        assert "answer agreement" in message and "failureLimit (2)" in message, message
        failing = [f["metric"] for f in analysis(bot).get("figures") or [] if not f.get("ok")]
        assert "error rate" not in failing, analysis(bot)
        assert load.outcomes.get("ok", 0) > 0, load.outcomes
    finally:
        load.stop()


# Ready (up to 600 s) then promotion (up to 600 s): pytest's limit above both, so a slow run fails with
# the wait's own message (status, pods, events) rather than pytest's bare time-out.
@pytest.mark.timeout(1260)
def test_a_release_that_cannot_change_answers_passes_the_gate(
    cluster, real_operator, ahead_ns, pod_prometheus, runtime_image, host_model_dir
):
    bot = Bot(cluster, ahead_ns)
    load = started(bot, pod_prometheus, runtime_image, host_model_dir, applied=True)
    seen: list[dict[str, Any]] = []
    try:
        before = bot.status().get("stableRevision")
        bot.patch({"runtime": {"dynamicBatching": {"maxBatchSize": 4}}})

        def promoted() -> bool:
            a = analysis(bot)
            if a.get("lastVerdict"):
                seen.append(a)
            s = bot.status()
            return s.get("stableRevision") not in (None, before) and not s.get("release")

        bot.wait(promoted, 600, "promotion with the quality gate on")
    finally:
        load.stop()
    assert not rolled_back(bot), bot.cond("Stalled")
    agreement = [
        f.get("canary") for a in seen for f in a.get("figures") or [] if f.get("metric") == "answer agreement"
    ]
    assert agreement and set(agreement) == {100.0}, seen[-1:]
    expectations = [
        f.get("canary")
        for a in seen
        for f in a.get("figures") or []
        if f.get("metric") == "expectations passed"
    ]
    assert expectations and set(expectations) == {100.0}, seen[-1:]  # the ConfigMap's maxLength was read


def shadow_spec(prometheus: str) -> dict[str, Any]:
    """The bot with a shadow phase instead of golden prompts: every request mirrored, 4 compared suffice."""
    spec = bot_spec(prometheus)
    spec["analysis"]["quality"] = {
        "maxTokens": 12,
        "shadow": {"enabled": True, "percent": 100, "minRequests": 4, "comparisonsPerInterval": 4},
    }
    return spec


def test_shadow_traffic_rolls_back_a_broken_template_before_any_user_sees_it(
    cluster, real_operator, real_ns, pod_prometheus, runtime_image, host_model_dir, gateway
):
    bot = Bot(cluster, real_ns)
    bot.apply(on_real_node(shadow_spec(pod_prometheus.url), image=runtime_image, model_dir=host_model_dir))
    bot.wait(lambda: bot.cond("Ready").get("status") == "True", 600, "stable Ready")
    bot.wait(lambda: serves(gateway.url), 60, "the gateway serving the route")
    users = DialogueLoad(gateway.url, concurrency=2, pin=False, max_seconds=900).start()
    try:
        bot.wait(lambda: users.summary()["ok"] >= 4, 120, "users answered")
        stable_revision = bot.status().get("stableRevision")
        bot.patch({"model": {"chatTemplate": ROLELESS_TEMPLATE}})
        bot.wait(lambda: (bot.status().get("release") or {}).get("phase") == "Shadowing", 60, "shadow phase")
        bot.wait(lambda: rolled_back(bot), 480, "rollback in the shadow phase")
    finally:
        summary = users.stop()
    release = bot.status().get("release") or {}
    message = bot.cond("Stalled").get("message", "")
    # another reason (a canary pod restarted before it was Ready, once on a loaded machine) names the pods
    # and the namespace's events with their times
    assert "shadow" in message and "failureLimit (2)" in message, f"{message}\n{bot.snapshot(events=200)}"
    assert release.get("shadowStartedAt") and not release.get("shadowPassedAt"), release
    compared = [f for f in analysis(bot).get("figures") or [] if f.get("metric", "").startswith("shadow ")]
    assert compared and not all(f.get("ok") for f in compared), analysis(bot)
    # every answer names its revision: users were answered by stable's alone, never the canary's
    assert summary["revisions"].get(stable_revision, 0) > 0, summary
    assert release.get("revision") not in summary["revisions"], (
        f"users were answered by the canary: {summary}"
    )


def test_the_operators_mirror_objects_pass_the_api_servers_schemas(cluster, gateway, real_ns):
    """Both ways to mirror, as the operator builds them, against the real CRDs (Gateway API v1.4.0's
    standard channel, Traefik's): the RequestMirror filter with `percent`, and TraefikService <name>-mirror."""
    from chatfleet_operator.builders.httproute import Mirror, build_httproute, build_traefik_mirror
    from chatfleet_operator.spec import ObjectRef

    ref = ObjectRef(real_ns, "bot", "00000000-0000-0000-0000-000000000000")
    for manifest in (
        build_httproute(
            ref, stable_weight=100, canary_weight=0, gateway_name=gateway.name, mirror=Mirror(10)
        ),
        build_httproute(
            ref,
            stable_weight=100,
            canary_weight=0,
            gateway_name=gateway.name,
            mirror=Mirror(10, "TraefikService"),
        ),
        build_traefik_mirror(ref, 10),
    ):
        manifest["metadata"].pop("ownerReferences", None)  # no such owner here: only the schema is asked
        res = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(manifest), check=False)
        assert res.returncode == 0, f"{manifest['kind']}: {res.stderr}"
