"""bench-routing's fleet on real pods (`--fleet pods`, the default): the operator's own ChatbotService on the
local real node, routed by the operator.

Everything is real: the local Kubernetes with a real node (kubelet, containerd, runc) running the project's
runtime image (Triton + the chat API) on the Qwen2-0.5B-shaped model (a hostPath under .work), sessions in
Redis, sticky dialogues on; the operator (a host process, `--routing=auto`) sees the Gateway API and
InferencePool CRDs that Envoy Gateway installs, so it routes the ChatbotService through an HTTPRoute to its
InferencePools and runs its endpoint picker as a pod on the real node (the operator's image, the chart's
picker RBAC). Envoy Gateway (chatfleet_platform.addons.envoygateway) serves that route from its own Envoy
on this host, with the local platform's InferencePool extension.

The baselines go to the same pods: Envoy (the same wheel) configured directly over the pods' addresses, as
a gateway configures itself for a route to the Services (poolgateway.ServiceBackend): each request to a
random endpoint (`service`), or hashed on X-Session-Id (`session-hash`).

The canary is the operator's own release (steps 20, 50, 100 %, spec.rollout.paused held at each step while
the bench runs the stage), with one stable and one canary pod (the real node's 2 cores hold three chat pods
at most); the baseline's weighted Services get the same weights over the same two pods.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack"))

from chatfleet_operator.builders.deployment import CHAT_PORT  # noqa: E402
from chatfleet_platform.addons import envoygateway  # noqa: E402
from chatfleet_platform.addons.envoygateway import EnvoyGateway  # noqa: E402
from chatfleet_platform.addons.poolgateway import PoolGateway, ServiceBackend  # noqa: E402
from chatfleet_platform.cluster import images  # noqa: E402
from chatfleet_platform.cluster.realnode import PICKER_PLACEMENT_ARGS, readable_by_pods  # noqa: E402
from chatfleet_platform.common import procs  # noqa: E402
from chatfleet_platform.common.config import (  # noqa: E402
    LOCAL_ANALYSIS_ARGS,
    LOCAL_HOST_PATH_ARGS,
    REAL_NODE_OPERATOR_ENV,
)
from chatfleet_platform.load.realpods import picker_rbac  # noqa: E402
from chatfleet_platform.load.releasetraffic import (  # noqa: E402
    Bot,
    ready_pods,
    rolled_back,
    serving_pods,
    traffic_spec,
)
from release_traffic_bench import Platform  # noqa: E402

GATEWAY_NAMESPACE, GATEWAY_NAME = "routing-gateway", "chatfleet-pools"
#: The canary's steps; each is held (spec.rollout.paused) while the bench runs it.
STEPS = (20, 50, 100)
#: A step's pause: long enough to pause the release again once it reaches the next step.
STEP_PAUSE_SECONDS = 30


def say(msg: str) -> None:
    print(f"[bench-routing] {msg}", flush=True)


def addresses(bot: Bot, track: str) -> list[str]:
    """IP:port of the chat API of each Ready pod of a track (what a gateway sees behind its Service)."""
    return sorted(f"{pod['status']['podIP']}:{CHAT_PORT}" for pod in serving_pods(bot, track))


class PodFleet:
    """The platform, Envoy Gateway, the operator and the bot: a fleet as routing_bench's modes use one
    (HostFleet's methods)."""

    def __init__(
        self, workdir: Path, model_dir: Path, *, replicas: int, max_new_tokens: int, context_tokens: int
    ) -> None:
        self.workdir, self.model_dir = workdir, readable_by_pods(model_dir)
        self.replicas, self.max_new_tokens, self.context_tokens = replicas, max_new_tokens, context_tokens
        self.platform = Platform()
        self.gateway: EnvoyGateway | None = None
        self.direct = PoolGateway(workdir / "direct-envoy")
        self.port = procs.free_port()
        self.bot: Bot | None = None
        self.revision_of: dict[str, str] = {}
        self.weight = 0

    # -- set-up -----------------------------------------------------------------------------------------

    def __enter__(self) -> PodFleet:
        try:
            self._up()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _up(self) -> None:
        platform = self.platform
        platform.up(operator=False)
        cluster = platform.cluster
        operator_image = images.ImageBuilder().build(["operator"])["operator"]["ref"]
        self.gateway = EnvoyGateway(cluster, self.workdir / "envoy-gateway", identify_upstream=True)
        self.gateway.start()  # the Gateway API and InferencePool CRDs: the operator routes by pools
        cluster.kubectl("create", "namespace", GATEWAY_NAMESPACE)
        cluster.apply(envoygateway.gateway_objects(GATEWAY_NAMESPACE, GATEWAY_NAME, self.port))
        cluster.start_extra(
            "operator",
            [
                sys.executable,
                "-m",
                "chatfleet_operator.cli",
                "run",
                *LOCAL_ANALYSIS_ARGS,
                *LOCAL_HOST_PATH_ARGS,
                f"--gateway={GATEWAY_NAME}",
                f"--gateway-namespace={GATEWAY_NAMESPACE}",
                "--routing=auto",
                f"--picker-image={operator_image}",
                *PICKER_PLACEMENT_ARGS,
            ],
            env={**cluster.env, **REAL_NODE_OPERATOR_ENV},
        )
        self.bot = self._bot()
        say(f"pods: {', '.join(addresses(self.bot, 'stable'))}; picker Ready; Envoy Gateway serves the pools")

    def _bot(self) -> Bot:
        """The ChatbotService on `replicas` pods, its route and pools served, its picker Ready."""
        platform, cluster = self.platform, self.platform.cluster
        assert platform.prom is not None
        ns = platform.namespace("routing")
        cluster.apply(picker_rbac(ns))
        spec = traffic_spec(
            platform.prom.url,
            image=platform.image,
            model_dir=self.model_dir,
            steps=STEPS,
            pause_seconds=STEP_PAUSE_SECONDS,
        )
        # The steps move when the bench resumes them and their pause is over: no analysis (its verdicts
        # are not what this bench measures).
        for step in spec["rollout"]["canary"]["steps"]:
            step["analysis"] = False
        spec["model"]["maxContextTokens"] = self.context_tokens
        spec["runtime"]["maxNewTokens"] = self.max_new_tokens
        bot = Bot(cluster, ns)
        say(f"ChatbotService {ns}/bot on the real node ({self.model_dir.name})")
        bot.apply(spec)
        bot.wait(bot.ready, 900, "bot Ready")
        bot.patch({"scaling": {"replicas": self.replicas}})
        bot.wait(
            lambda: ready_pods(bot, "stable") >= self.replicas, 600, f"{self.replicas} Ready stable pods"
        )
        bot.wait(lambda: (routing(bot).get("picker") or {}).get("ready"), 300, "the picker pod Ready")
        assert self.gateway is not None
        self.gateway.wait_serving_route(ns, bot.name, timeout=180)
        bot.wait(lambda: routing(bot).get("backends") == "InferencePool", 60, "routing by InferencePool")
        return bot

    def __exit__(self, *exc: object) -> None:
        for stop in (self.direct.stop, self.gateway.stop if self.gateway else None, self.platform.down):
            if stop is None:
                continue
            try:
                stop()
            except Exception as e:  # keep tearing down
                say(f"teardown: {e}")

    # -- modes ------------------------------------------------------------------------------------------

    def services_with(self, backends: list[ServiceBackend], **kw: Any) -> str:
        """Envoy configured directly for `backends` (the baselines); its URL."""
        self.direct.serve_services(backends, identify_upstream=True, **kw)
        return self.direct.url

    def pools_at(self, weight: int) -> str:
        """Envoy Gateway's URL: the operator's route carries the release's weight (held at `weight`)."""
        assert weight == self.weight, (weight, self.weight)
        return f"http://127.0.0.1:{self.port}"

    def affinity_start(self) -> list[str]:
        """Phase 1: the stable pods' addresses."""
        assert self.bot is not None
        return addresses(self.bot, "stable")

    def canary_start(self) -> dict[str, str]:
        """One stable pod, then the operator's release held at its first step; {pod address: revision}."""
        bot = self.bot
        assert bot is not None
        bot.patch({"scaling": {"replicas": 1}})
        bot.wait(lambda: len(bot.pods("stable")) == 1, 300, "one stable pod")
        self.revision_of = {a: "a" for a in addresses(bot, "stable")}
        bot.patch({"runtime": {"fallbackText": "Busy, release 1. Try again."}})
        bot.wait(lambda: bot.status().get("release"), 60, "a release")
        self._hold(STEPS[0])
        return self.revision_of

    def _hold(self, weight: int) -> None:
        """Until the release holds at `weight` (paused), its canary pod Ready and Envoy serving the weight."""
        bot, gateway = self.bot, self.gateway
        assert bot is not None and gateway is not None

        def at_weight() -> bool:
            assert not rolled_back(bot), bot.cond("Stalled")
            return (bot.status().get("release") or {}).get("weight") == weight

        bot.wait(at_weight, 600, f"the release at {weight} %")
        bot.patch({"rollout": {"paused": True}})
        bot.wait(lambda: ready_pods(bot, "canary") >= 1, 600, "a Ready canary pod")
        gateway.wait_serving_route(bot.ns, bot.name, timeout=120)
        self.revision_of.update({a: "b" for a in addresses(bot, "canary")})
        self.weight = weight
        say(
            f"release held at {weight} % (stable {addresses(bot, 'stable')}, canary {addresses(bot, 'canary')})"
        )

    def canary_at(self, weight: int) -> tuple[list[str], list[str]]:
        """The release moved on to `weight` (resumed, then held); the stable and the canary pods' addresses."""
        bot = self.bot
        assert bot is not None
        if weight != self.weight:
            bot.patch({"rollout": {"paused": False}})
            self._hold(weight)
        return addresses(bot, "stable"), addresses(bot, "canary")


def routing(bot: Bot) -> dict[str, Any]:
    return bot.status().get("routing") or {}
