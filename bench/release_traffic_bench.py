"""`make bench-release-traffic`: what users see of releases on real pods, through the Service and through Traefik.

Everything is real: the local Kubernetes, a real node (kubelet, containerd, runc) running the project's
runtime image (Triton + the chat API on the tiny model, on CPU), Redis for the sessions, Prometheus
scraping the pods, Traefik serving the operator's HTTPRoute, and the operator. Users are threads of this
process (`chatfleet_platform.load.dialogues.DialogueLoad`): five-turn streamed dialogues with a session id.

Table 1, zero drop: USERS (32) users chat continuously while the scenario runs PROMOTIONS (5)
promotions, ROLLBACKS (5) rollbacks (spec.rollout.abort once the canary serves) and SCALE_DOWNS (5)
scale-downs, interleaved, first through the Service (replica ratio; no Gateway API in the cluster yet),
then through the gateway (HTTPRoute with sticky dialogues), Traefik with its fast proxy as the platform
runs it, then the same through Traefik's default proxy (the baseline: Go's ReverseProxy, which cuts a
streamed answer now and then; see chatfleet_platform.addons.gateway). Counted: streams cut, non-2xx answers,
turns with no answer, lost histories. Goal 0, 0, 0, 0.

Table 2, sticky dialogues: DIALOGUES (1,000) five-turn dialogues through the gateway while a release
goes 10 -> 50 -> 100 % and is promoted, once with spec.rollout.stickyDialogues and the client echoing
x-chatfleet-revision, once without (the baseline: weights alone, what a Gateway API user gets without
us). Counted: dialogues that changed revision mid-conversation. Goal 0 with pinning; the share without.

Writes bench-results/release-traffic.json and prints both tables.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack"))

from chatfleet_platform.addons import scrape  # noqa: E402
from chatfleet_platform.addons.gateway import SHARED_NAMESPACE, Gateway  # noqa: E402
from chatfleet_platform.cluster import images  # noqa: E402
from chatfleet_platform.cluster.cluster import Cluster  # noqa: E402
from chatfleet_platform.cluster.realnode import CLIENT_ADDRESSES, NodePlan, readable_by_pods  # noqa: E402
from chatfleet_platform.common.config import (  # noqa: E402
    CHATBOT_CRD_FILE,
    CHATBOT_CRD_NAME,
    LOCAL_ANALYSIS_ARGS,
    LOCAL_HOST_PATH_ARGS,
    REAL_NODE_OPERATOR_ENV,
)
from chatfleet_platform.load.dialogues import DialogueLoad  # noqa: E402
from chatfleet_platform.load.realpods import fleet_podmonitor, service_url  # noqa: E402
from chatfleet_platform.load.releasetraffic import (  # noqa: E402
    Bot,
    PlainScenario,
    Scenario,
    make_plain,
    traffic_spec,
)
from chatfleet_platform.localruntime.tiny import build_tiny_model  # noqa: E402
from chatfleet_platform.servers import services  # noqa: E402

USERS = int(os.environ.get("USERS", "32"))
PROMOTIONS = int(os.environ.get("PROMOTIONS", "5"))
ROLLBACKS = int(os.environ.get("ROLLBACKS", "5"))
SCALE_DOWNS = int(os.environ.get("SCALE_DOWNS", "5"))
DIALOGUES = int(os.environ.get("DIALOGUES", "1000"))
ALL_ROWS = ("plain", "service", "gateway", "gateway-default", "pinned", "unpinned")
ROWS = set(os.environ.get("ROWS", ",".join(ALL_ROWS)).split(","))
"""Which rows to run (default all, in ALL_ROWS' order): e.g. ROWS=service,plain for table 1's Service
path and its plain-Deployment baseline alone."""
if ROWS - set(ALL_ROWS):
    raise SystemExit(f"ROWS: unknown {sorted(ROWS - set(ALL_ROWS))}; choose from {', '.join(ALL_ROWS)}")
THINK_SECONDS = (2.0, 4.0)
"""Table 2's think time between turns."""
OUT = REPO / "bench-results" / "release-traffic.json"


def say(msg: str) -> None:
    """Progress line."""
    print(f"[bench-release-traffic] {msg}", flush=True)


class Platform:
    """The cluster with a real node, the images, Prometheus on the pods, Redis, the operator; Traefik later."""

    def __init__(self) -> None:
        self.cluster = Cluster(REPO / ".work" / "bench-release-traffic", progress=lambda m: None)
        self.prom: services.Prometheus | None = None
        self.redis: services.Redis | None = None
        self.gateway: Gateway | None = None
        self.image = ""
        self.model_dir = Path()
        self.nodes: list[NodePlan] = []
        self.node: NodePlan | None = None
        self.node_ip = ""

    def up(self, operator: bool = True, *, real_nodes: int = 1, gpus: int = 8) -> None:
        """Everything but the gateway (its CRDs switch the operator to HTTPRoutes), on `real_nodes` real
        nodes of `gpus` GPUs each; the operator too unless told not to (`start_operator` then starts it
        with flags of the caller's)."""
        say(f"building images (cached) and starting the platform with {real_nodes} real node(s)")
        self.image = images.ImageBuilder().build(list(images.ALL_NAMES))["runtime"]["ref"]
        self.cluster.up(nodes=1)
        self.nodes = self.cluster.add_real_nodes(real_nodes, gpus=gpus)
        self.node = self.nodes[0]
        self.node_ip = self.node.ip
        self.cluster.install_crd(CHATBOT_CRD_FILE, CHATBOT_CRD_NAME)
        configs = scrape.podmonitor_scrape_configs(
            fleet_podmonitor(),
            api_server=self.cluster.server,
            pki_dir=self.cluster.workdir / "pki",
            scrape_interval="1s",
        )
        self.prom = services.Prometheus(
            self.cluster.workdir / "bench-prometheus", scrape_configs=configs
        ).start()
        self.redis = services.Redis(self.cluster.workdir / "bench-redis", also_bind=(self.node_ip,)).start()
        self.model_dir = readable_by_pods(build_tiny_model(REPO / ".work" / "realnode-model"))
        if operator:
            self.start_operator()

    def start_operator(self, *args: str, env: dict[str, str] | None = None) -> None:
        """Start the operator (a host process watching every namespace) with these extra flags and
        environment (over the real node's, REAL_NODE_OPERATOR_ENV)."""
        self.cluster.start_extra(
            "operator",
            [
                sys.executable,
                "-m",
                "chatfleet_operator.cli",
                "run",
                *LOCAL_ANALYSIS_ARGS,
                *LOCAL_HOST_PATH_ARGS,  # the tiny model under .work (spec.model.hostPath)
                f"--gateway-namespace={SHARED_NAMESPACE}",
                "--gateway-mirror=TraefikService",  # Traefik 3.6 lacks Gateway API's RequestMirror
                *args,
            ],
            env={**self.cluster.env, **REAL_NODE_OPERATOR_ENV, **(env or {})},
        )

    def stop_operator(self) -> None:
        """Stop the operator process (SIGTERM: kopf finishes its passes and exits)."""
        self.cluster.stop_extra("operator")

    def gateway_up(self, fast_proxy: bool = True) -> Gateway:
        """Traefik and the Gateway API CRDs (from now on releases use HTTPRoutes); once up, Traefik is
        restarted on the same port when asked for the other proxy."""
        first = self.gateway is None
        if self.gateway is not None and self.gateway.fast_proxy == fast_proxy:
            return self.gateway
        self.gateway = Gateway(self.cluster, fast_proxy=fast_proxy).up()
        if first:
            time.sleep(12)  # the operator's Gateway API discovery is cached 10 s
        return self.gateway

    def namespace(self, prefix: str = "bench") -> str:
        """A new namespace, its default ServiceAccount there, with Secret `redis` (key `url`: the session
        store, as the real node's pods reach it)."""
        assert self.redis is not None
        ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.cluster.kubectl("create", "namespace", ns)
        assert services.wait_until(
            lambda: self.cluster.kubectl("get", "sa", "default", namespace=ns, check=False).returncode == 0,
            30,
        )
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "redis", "namespace": ns},
            "stringData": {"url": self.redis.url_at(self.node_ip)},
        }
        self.cluster.apply([secret])
        return ns

    def bot(
        self,
        *,
        resources: dict[str, Any] | None = None,
        wait: bool = True,
        over: dict[str, dict[str, Any]] | None = None,
        **spec_kw: Any,
    ) -> Bot:
        """A new namespace with the Redis Secret and a bot (Ready, unless `wait` is False); `resources`
        over the real node's (e.g. smaller CPU requests, so more pods fit its 2 cores); each section of
        `over` over the spec's (e.g. {"runtime": {"maxNewTokens": 96}, "streamRelay": {...}})."""
        assert self.prom is not None
        bot = Bot(self.cluster, self.namespace())
        spec = traffic_spec(self.prom.url, image=self.image, model_dir=self.model_dir, **spec_kw)
        spec["resources"].update(resources or {})
        for section, values in (over or {}).items():
            spec[section] = {**spec.get(section, {}), **values}
        bot.apply(spec)
        if wait:
            bot.wait(bot.ready, 600, "bot Ready")
        return bot

    def drop(self, bot: Bot) -> None:
        """Delete the bot's namespace (frees the real node's memory)."""
        self.cluster.delete_namespace(bot.ns, first=[CHATBOT_CRD_NAME], timeout=120)

    def down(self) -> None:
        """Stop what this run started."""
        for part in (self.gateway, self.redis, self.prom):
            if part is not None:
                try:
                    part.down() if isinstance(part, Gateway) else part.stop()
                except Exception as exc:  # keep tearing down
                    say(f"teardown: {exc}")
        self.cluster.down()


def zero_drop(platform: Platform, path: str, label: str = "") -> dict[str, Any]:
    """Table 1's row for one path ("service", "plain" or "gateway"): the interleaved operations under USERS
    users. "plain" is the baseline without Chatfleet: the operator's pods in a plain Deployment with no
    drain (releasetraffic.plain_deployment), changed by kubectl alone, through the same Service."""
    bot = platform.bot()
    try:
        scenario: Scenario | PlainScenario
        if path == "plain":
            say("plain: the ChatbotService's objects orphaned, the stable Deployment made plain (no drain)")
            scenario = make_plain(bot)
        else:
            scenario = Scenario(bot)
        if path == "gateway":
            assert platform.gateway is not None
            load = DialogueLoad(platform.gateway.url, concurrency=USERS, pin=True, max_seconds=7200)
        else:
            url = service_url(platform.cluster, bot.ns, bot.name)
            load = DialogueLoad(url, concurrency=USERS, pin=False, sources=CLIENT_ADDRESSES, max_seconds=7200)
        load.start()
        bot.wait(lambda: load.summary()["ok"] >= 20, 300, "dialogues under way")
        t0 = time.monotonic()
        t0_wall = time.time()
        for i in range(max(PROMOTIONS, ROLLBACKS, SCALE_DOWNS)):
            if i < PROMOTIONS:
                scenario.promote()
            if i < ROLLBACKS:
                scenario.roll_back()
            if i < SCALE_DOWNS:
                scenario.scale_down()
            say(f"{path}: round {i + 1} done: {scenario.log[-3:]}; so far {load.summary()}")
        summary = load.stop()
        summary.update(
            path=label or path,
            operations=scenario.log,
            seconds=round(time.monotonic() - t0),
            bad_turns=placed(load, scenario, t0),
        )
        if platform.gateway is not None and path == "gateway":
            gateway_view(platform.gateway.access_log, summary["bad_turns"], t0_wall)
        return summary
    finally:
        platform.drop(bot)


def placed(load: DialogueLoad, scenario: Scenario | PlainScenario, t0: float) -> list[dict[str, Any]]:
    """Each turn not answered well, with when it began (seconds into the scenario) and the operation
    then under way (with how far into it), so a cut can be traced to what the release was doing."""
    out = []
    for r in load.bad_turns():
        during = [
            f"{name} +{r.at - began:.1f}s of {ended - began:.0f}s"
            for name, began, ended in scenario.spans
            if began <= r.at <= ended
        ]
        out.append(
            {
                "at_s": round(r.at - t0, 1),
                "outcome": "lost history" if r.lost else r.outcome,
                "revision": r.revision,
                "error": r.error,
                "during": during[0] if during else "between operations",
            }
        )
    return out


def gateway_view(access_log: Path, bad: list[dict[str, Any]], t0_wall: float) -> None:
    """Add to each bad turn what Traefik's access log says of the requests that began within a second
    of it (which pod, the origin's status, how many bytes came through, how long it took)."""
    if not bad or not access_log.exists():
        return
    entries = []
    for line in access_log.read_text(errors="replace").splitlines():
        try:
            e = json.loads(line)
            began = datetime.fromisoformat(e["StartUTC"].replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError):
            continue
        entries.append((began, e))
    for b in bad:
        at = t0_wall + b["at_s"]
        near = sorted(
            ((abs(began - at), e) for began, e in entries if abs(began - at) <= 1.0),
            key=lambda pair: (pair[1].get("DownstreamContentSize", 0), pair[0]),
        )
        b["traefik"] = [
            {
                k: e.get(k)
                for k in (
                    "ServiceURL",
                    "OriginStatus",
                    "DownstreamStatus",
                    "OriginContentSize",
                    "DownstreamContentSize",
                    "Duration",
                )
            }
            for _, e in near[:3]
        ]


def pinning(platform: Platform, pin: bool) -> dict[str, Any]:
    """Table 2's row: DIALOGUES dialogues through a 10 -> 50 -> 100 % release, pinned or not."""
    assert platform.gateway is not None
    bot = platform.bot(
        sticky=pin, steps=(10, 50, 100), pause_seconds=20, idle_seconds=10, max_drain_seconds=300
    )
    try:
        # Users read each answer before the next turn (2-4 s), so the dialogues live through the release
        # (with the table-1 think time they would all be over before its 50 % step).
        load = DialogueLoad(
            platform.gateway.url,
            concurrency=USERS,
            pin=pin,
            max_dialogues=DIALOGUES,
            max_seconds=3600,
            think_seconds=THINK_SECONDS,
        ).start()
        # The release begins once a tenth of the dialogues are done, so most of them live through it.
        bot.wait(lambda: load.summary()["dialogues"] >= DIALOGUES // 10, 600, "the first dialogues")
        scenario = Scenario(bot)
        done = threading.Event()
        errors: list[BaseException] = []

        def release() -> None:
            try:
                scenario.promote()
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                done.set()

        threading.Thread(target=release, daemon=True).start()
        load.wait(3600)
        done.wait(900)
        summary = load.summary()
        summary.update(
            pin=pin,
            operations=scenario.log,
            release_error=str(errors[0]) if errors else "",
            bad_turns=placed(load, scenario, scenario.spans[0][1] if scenario.spans else 0.0),
        )
        return summary
    finally:
        platform.drop(bot)


def table(rows: list[dict[str, Any]], cols: list[tuple[str, str]]) -> str:
    """A plain text table."""
    widths = [max([len(h), *(len(str(r.get(k, ""))) for r in rows)]) for k, h in cols]
    line = "  ".join(h.ljust(w) for (_, h), w in zip(cols, widths, strict=True))
    body = [
        "  ".join(str(r.get(k, "")).ljust(w) for (k, _), w in zip(cols, widths, strict=True)) for r in rows
    ]
    return "\n".join([line, *body])


def main() -> int:
    """Run both tables in one session of the platform; print them and write the JSON."""
    platform = Platform()
    results: dict[str, Any] = {
        "users": USERS,
        "dialogues": DIALOGUES,
        "operations": {"promotions": PROMOTIONS, "rollbacks": ROLLBACKS, "scale_downs": SCALE_DOWNS},
        "rows": sorted(ROWS),
        "zero_drop": [],
        "pinning": [],
    }
    zero, pins = results["zero_drop"], results["pinning"]
    try:
        platform.up()
        ops = f"{PROMOTIONS} promotions, {ROLLBACKS} rollbacks, {SCALE_DOWNS} scale-downs"
        if "plain" in ROWS:
            say(f"table 1 through the Service, plain Deployment without the drain (baseline): {ops}")
            zero.append(zero_drop(platform, "plain", "Service, plain Deployment, no drain (baseline)"))
        if "service" in ROWS:
            say(f"table 1 through the Service: {ops}")
            zero.append(zero_drop(platform, "service", "Service (Chatfleet, replica ratio)"))
        if "gateway" in ROWS:
            platform.gateway_up()
            say("table 1 through the gateway (Traefik's fast proxy, HTTPRoute, sticky dialogues)")
            zero.append(zero_drop(platform, "gateway", "gateway (Traefik fast proxy)"))
        if "gateway-default" in ROWS:
            platform.gateway_up(fast_proxy=False)
            say("table 1 through the gateway with Traefik's default proxy (baseline)")
            zero.append(zero_drop(platform, "gateway", "gateway (Traefik default proxy, baseline)"))
        if "pinned" in ROWS:
            platform.gateway_up()
            say(f"table 2: {DIALOGUES} dialogues through a 10/50/100 release, pinned")
            pins.append(pinning(platform, True))
        if "unpinned" in ROWS:
            platform.gateway_up()
            say(f"table 2: {DIALOGUES} dialogues through a 10/50/100 release, not pinned (baseline)")
            pins.append(pinning(platform, False))
    finally:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(results, indent=1, default=str))
        platform.down()
    print()
    print(
        f"Table 1: {USERS} users, {PROMOTIONS} promotions + {ROLLBACKS} rollbacks + {SCALE_DOWNS} scale-downs"
    )
    print(
        table(
            results["zero_drop"],
            [
                ("path", "path"),
                ("turns", "turns"),
                ("dialogues", "dialogues"),
                ("cut", "streams cut"),
                ("non_2xx", "non-2xx"),
                ("failed", "no answer"),
                ("lost_history", "lost histories"),
                ("seconds", "seconds"),
            ],
        )
    )
    print()
    print(f"Table 2: {DIALOGUES} five-turn dialogues through a 10 -> 50 -> 100 % release (gateway)")
    print(
        table(
            results["pinning"],
            [
                ("pin", "pinning"),
                ("dialogues", "dialogues"),
                ("switched", "changed revision"),
                ("switched_share", "share"),
                ("cut", "streams cut"),
                ("non_2xx", "non-2xx"),
                ("release_error", "release error"),
            ],
        )
    )
    for row in [*results["zero_drop"], *results["pinning"]]:
        for bad in row.get("bad_turns", []):
            print(f"  {row.get('path', 'pin=' + str(row.get('pin')))}: {bad}")
    print(f"\nwritten: {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
