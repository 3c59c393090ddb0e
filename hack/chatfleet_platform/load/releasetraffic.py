"""Releases under real dialogue traffic: the scenarios of the zero-drop tests and `make bench-release-traffic`.

A ChatbotService on the real node keeps its sessions in Redis and serves real streams. While
`DialogueLoad` users chat through a URL (the Traefik gateway, or the Service's ClusterIP), the scenario
drives the operations a release can bring, each waited for through the ChatbotService's status:
- `promote`: a new revision (a harmless runtime change) through every step and the promotion;
- `roll_back`: a new revision aborted once its canary serves (`spec.rollout.abort`), then the spec set
  back to the stable revision;
- `scale_down`: one more replica, Ready, then one fewer.
Each pod that goes away drains (its preStop hook); the load counts what the users saw.

The product-off baseline (`make_plain`, `PlainScenario`): the same bot's stable Deployment without the
operator and without the drain (`plain_deployment`), put through the same three operations by kubectl.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatfleet_platform.servers.services import wait_until

from .realpods import dump_stacks, on_real_node

#: A short interval keeps a release to a couple of minutes on two cores; generous limits, because a
#: loaded CPU is slow and these scenarios are about dropped streams, not latency.
ANALYSIS = {
    "intervalSeconds": 5,
    "failureLimit": 2,
    "consecutiveErrorLimit": 6,
    "progressDeadlineSeconds": 300,
    "thresholds": {
        "errorRatePercent": 5,
        "latencyP99Milliseconds": 60000,
        "timeToFirstTokenP99Milliseconds": 60000,
    },
}


def traffic_spec(
    prometheus: str,
    *,
    image: str,
    model_dir: Path,
    redis_secret: str = "redis",
    sticky: bool = True,
    steps: tuple[int, ...] = (50, 100),
    pause_seconds: int = 10,
    idle_seconds: int = 10,
    max_drain_seconds: int = 120,
    replicas: int = 1,
) -> dict[str, Any]:
    """The bot of these scenarios on the real node: streaming, sessions in Redis, sticky dialogues."""
    spec = {
        "model": {"hostPath": "/", "maxContextTokens": 512},
        "runtime": {"maxNewTokens": 8, "streaming": True, "requestTimeoutSeconds": 60},
        "scaling": {"replicas": replicas},
        "rollout": {
            "strategy": "canary",
            "canary": {"steps": [{"weight": w, "pauseSeconds": pause_seconds} for w in steps]},
            "stickyDialogues": {
                "enabled": sticky,
                "idleSeconds": idle_seconds,
                "maxDrainSeconds": max_drain_seconds,
            },
        },
        "analysis": {"prometheusAddress": prometheus, **copy.deepcopy(ANALYSIS)},
    }
    spec = on_real_node(spec, image=image, model_dir=model_dir)
    spec["runtime"]["sessions"]["redis"] = {"secretName": redis_secret, "key": "url"}
    spec["runtime"]["sessions"]["historyTurns"] = 5
    return spec


#: How often Bot.wait polls: the predicates are plain reads (chatfleet_platform.cluster.apireader, about a
#: millisecond of CPU each) or in-process figures, so a short period costs little, and a wait ends on
#: average half a period after its condition holds (at 2 s, about a second a wait; a real-pod layer
#: waits some hundred times).
WAIT_INTERVAL = 0.5
#: Every Bot.wait of this process: {test, what, seconds, ok}, in order (the real-pod layer prints the
#: longest and writes them all to .work/test-results/realnode-waits.json).
WAITS: list[dict[str, Any]] = []

#: Events with their times (UTC, to the second), to read beside a test's own clock.
EVENT_COLUMNS = (
    "-o=custom-columns=FIRST:.firstTimestamp,LAST:.lastTimestamp,AT:.eventTime,N:.count,TYPE:.type,"
    "REASON:.reason,OBJECT:.involvedObject.name,MESSAGE:.message"
)


class Bot:
    """A ChatbotService of one namespace, seen through kubectl: apply, patch, status, conditions, pods."""

    def __init__(self, cluster: Any, ns: str, name: str = "bot") -> None:
        self.cluster, self.ns, self.name = cluster, ns, name

    def kubectl(self, *args: str, **kw: Any) -> subprocess.CompletedProcess:
        """kubectl in the bot's namespace."""
        return self.cluster.kubectl(*args, namespace=self.ns, **kw)

    def apply(self, spec: dict[str, Any]) -> None:
        """Create or replace the ChatbotService with `spec`."""
        doc = {
            "apiVersion": "chatfleet.io/v1alpha1",
            "kind": "ChatbotService",
            "metadata": {"name": self.name},
        }
        self.kubectl("apply", "-f", "-", input=json.dumps({**doc, "spec": spec}))

    def patch(self, spec: dict[str, Any]) -> None:
        """Merge-patch the spec."""
        self.kubectl("patch", "cbs", self.name, "--type=merge", "-p", json.dumps({"spec": spec}))

    def spec(self) -> dict[str, Any]:
        """The spec as stored (defaults filled in by the API server)."""
        return json.loads(self.kubectl("get", "cbs", self.name, "-o", "json").stdout)["spec"]

    def status(self) -> dict[str, Any]:
        """status ({} when unreadable)."""
        res = self.kubectl("get", "cbs", self.name, "-o", "json", check=False)
        return json.loads(res.stdout).get("status", {}) if res.returncode == 0 else {}

    def cond(self, ctype: str) -> dict[str, Any]:
        """One condition of status ({} when absent)."""
        return next((c for c in self.status().get("conditions", []) if c["type"] == ctype), {})

    def wait(self, predicate, timeout: float, what: str) -> Any:
        """Wait for predicate(), polled every WAIT_INTERVAL s; on a time-out, fail with the status, the pods
        and the latest events. Each wait is kept in WAITS (where a suite's time goes)."""
        t0 = time.monotonic()
        value = wait_until(predicate, timeout, WAIT_INTERVAL)
        WAITS.append(
            {
                "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
                "what": what,
                "seconds": round(time.monotonic() - t0, 1),
                "ok": bool(value),
            }
        )
        if not value:
            status = json.dumps(self.status(), indent=1)[-3000:]
            raise AssertionError(f"{what} did not happen in {timeout}s; status:\n{status}\n{self.snapshot()}")
        return value

    def pods(self, track: str) -> list[dict[str, Any]]:
        """The pods of one track (terminating ones included)."""
        res = self.kubectl("get", "pods", "-l", f"chatfleet.io/track={track}", "-o", "json")
        return json.loads(res.stdout)["items"]

    def endpoints(self, service: str | None = None, check: bool = True) -> list[dict[str, Any]]:
        """The endpoints of a Service's EndpointSlices (default: the bot's own); [] when unreadable and not
        `check`."""
        res = self.kubectl(
            "get",
            "endpointslices",
            "-l",
            f"kubernetes.io/service-name={service or self.name}",
            "-o",
            "json",
            check=check,
        )
        if res.returncode != 0:
            return []
        return [e for s in json.loads(res.stdout)["items"] for e in s.get("endpoints") or []]

    def endpoint_pods(self, service: str | None = None) -> set[str]:
        """Names of the Ready pods behind a Service (default: the bot's own)."""
        return {
            e["targetRef"]["name"]
            for e in self.endpoints(service)
            if e.get("conditions", {}).get("ready") and e.get("targetRef")
        }

    def snapshot(self, events: int = 25) -> str:
        """What a failing test names: the pods (ready, restarts), the Service's endpoints, the latest
        `events` events."""
        pods = self.kubectl("get", "pods", "-o", "wide", check=False).stdout
        endpoints = [
            (e.get("targetRef", {}).get("name"), e.get("conditions", {})) for e in self.endpoints(check=False)
        ]
        listed = self.kubectl("get", "events", "--sort-by=.lastTimestamp", EVENT_COLUMNS, check=False).stdout
        return "\n".join(
            [
                "pods:",
                pods.rstrip(),
                f"endpoints of {self.name}: {endpoints}",
                "latest events:",
                *listed.splitlines()[-events:],
                *self._unready_details(),
            ]
        )

    def _unready_details(self) -> list[str]:
        """For each pod with a container not ready: its chat API's CPU use and every thread's stack
        (SIGUSR1), then each container's last log lines (the chat API's hold the stacks)."""
        lines: list[str] = []
        listed = self.kubectl("get", "pods", "-o", "json", check=False).stdout
        for pod in json.loads(listed or "{}").get("items", []):
            statuses = pod.get("status", {}).get("containerStatuses") or []
            if all(s.get("ready") for s in statuses):
                continue
            name = pod["metadata"]["name"]
            lines.append(f"{name}: {dump_stacks(self.cluster, pod)}")
            for s in statuses:
                tail = "60" if s["name"] == "chat-api" else "15"
                log = self.kubectl("logs", name, "-c", s["name"], f"--tail={tail}", check=False)
                lines.append(f"{name}/{s['name']} (ready={s.get('ready')}) last log lines:")
                lines.extend("  " + line for line in (log.stdout or log.stderr).splitlines())
        return lines

    def ready(self) -> bool:
        """Ready=True."""
        return self.cond("Ready").get("status") == "True"


def rolled_back(bot: Bot) -> bool:
    """Stalled=True with reason RolledBack."""
    stalled = bot.cond("Stalled")
    return stalled.get("status") == "True" and stalled.get("reason") == "RolledBack"


def serving_pods(bot: Bot, track: str) -> list[dict[str, Any]]:
    """Pods of a track, not going away, with every container ready."""
    return [
        p
        for p in bot.pods(track)
        if not p["metadata"].get("deletionTimestamp")
        and all(s.get("ready") for s in p.get("status", {}).get("containerStatuses") or [{}])
    ]


def ready_pods(bot: Bot, track: str) -> int:
    """How many serving_pods the track has."""
    return len(serving_pods(bot, track))


@dataclass
class Scenario:
    """Operations on one bot under load, timed; `log` keeps (operation, seconds) in order."""

    bot: Bot
    timeout: float = 600.0
    log: list[tuple[str, float]] = field(default_factory=list)
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    """(operation, began, ended) in monotonic time: to place what the users saw."""
    _n: int = 0

    def _timed(self, name: str, t0: float) -> None:
        self.log.append((name, round(time.monotonic() - t0, 1)))
        self.spans.append((name, t0, time.monotonic()))

    def promote(self) -> str:
        """A new revision through every step, the drain of pinned dialogues and the promotion; its hash."""
        t0 = time.monotonic()
        self._n += 1
        before = self.bot.status().get("stableRevision")
        self.bot.patch({"runtime": {"fallbackText": f"Busy, release {self._n}. Try again."}})
        self.bot.wait(lambda: self.bot.status().get("release"), 60, "a release")
        rev = self.bot.status()["release"]["revision"]
        self.bot.wait(
            lambda: self.bot.status().get("stableRevision") == rev and not self.bot.status().get("release"),
            self.timeout,
            f"promotion of {rev} (from {before})",
        )
        self.bot.wait(lambda: not self.bot.pods("canary"), 180, "canary pods gone after promotion")
        self._timed("promotion", t0)
        return rev

    def roll_back(self) -> None:
        """A new revision aborted once its canary serves, then the spec back to stable (release cancelled)."""
        t0 = time.monotonic()
        self._n += 1
        fallback = self.bot.spec()["runtime"].get("fallbackText")
        self.bot.patch({"runtime": {"fallbackText": f"Busy, doomed release {self._n}."}})
        self.bot.wait(lambda: self.bot.status().get("release"), 60, "a release")
        rev = self.bot.status()["release"]["revision"]
        self.bot.wait(lambda: ready_pods(self.bot, "canary") >= 1, self.timeout, "a Ready canary pod")
        time.sleep(10)  # the canary takes its share of the dialogues before it goes
        self.bot.patch({"rollout": {"abort": rev}})
        self.bot.wait(lambda: rolled_back(self.bot), 120, f"rollback of {rev}")
        self.bot.wait(lambda: not self.bot.pods("canary"), 180, "canary pods gone after rollback")
        self.bot.patch({"runtime": {"fallbackText": fallback}, "rollout": {"abort": ""}})
        self.bot.wait(
            lambda: not self.bot.status().get("release") and self.bot.ready(), 120, "release cleared"
        )
        self._timed("rollback", t0)

    def scale_down(self) -> None:
        """One more replica until it is Ready, then back to one fewer (a pod drains away)."""
        t0 = time.monotonic()
        n = int(self.bot.spec()["scaling"]["replicas"])
        self.bot.patch({"scaling": {"replicas": n + 1}})
        self.bot.wait(lambda: ready_pods(self.bot, "stable") >= n + 1, self.timeout, f"{n + 1} Ready pods")
        time.sleep(5)  # the new pod takes its share of the dialogues
        self.bot.patch({"scaling": {"replicas": n}})
        self.bot.wait(lambda: len(self.bot.pods("stable")) == n, 180, f"back to {n} pods")
        self._timed("scale-down", t0)


#: The plain baseline's chat API: the runtime's own app and settings served by uvicorn's stock Server
#: (on SIGTERM it stops accepting at once and finishes the requests in flight), not DrainingServer.
STOCK_UVICORN = (
    "import sys, uvicorn\n"
    "from chatfleet_runtime.chat import api\n"
    "api.DrainingServer = lambda config, pipeline: uvicorn.Server(config)\n"
    "raise SystemExit(api.main(sys.argv[1:]))\n"
)
#: What a careful team writes without an operator: a preStop sleep for the endpoints to drop the pod,
#: and Kubernetes' default grace period.
PLAIN_PRESTOP_SECONDS = 5
PLAIN_GRACE_SECONDS = 30
PLAIN_RELEASE = "bench.chatfleet.io/release"


def plain_deployment(deployment: dict[str, Any]) -> dict[str, Any]:
    """The operator's stable Deployment as a team would run it without Chatfleet's drain. Pure.

    Same pods (image, probes, resources, sessions), but: the drain hook replaced by a preStop sleep of
    PLAIN_PRESTOP_SECONDS in both containers, the default grace period, the chat API on uvicorn's stock
    SIGTERM handling (STOCK_UVICORN; its graceful shutdown bounded by the grace left after the sleep),
    Kubernetes' default RollingUpdate, and nothing of the server's (status, owner, resourceVersion).
    """
    d = copy.deepcopy(deployment)
    meta = d["metadata"]
    d["metadata"] = {k: meta[k] for k in ("name", "namespace", "labels") if k in meta}
    d.pop("status", None)
    d["spec"].pop("strategy", None)
    pod = d["spec"]["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = PLAIN_GRACE_SECONDS
    for c in pod["containers"]:
        c["lifecycle"] = {"preStop": {"sleep": {"seconds": PLAIN_PRESTOP_SECONDS}}}
        if c["name"] != "chat-api":
            continue
        cmd = c["command"]
        i = cmd.index("-m")
        if cmd[i + 1] != "chatfleet_runtime.chat.api":
            raise ValueError(f"chat-api container runs {cmd[i + 1]}, not chatfleet_runtime.chat.api")
        c["command"] = [*cmd[:i], "-c", STOCK_UVICORN, *cmd[i + 2 :]]
        grace = str(PLAIN_GRACE_SECONDS - PLAIN_PRESTOP_SECONDS)
        c["env"] = [
            {**e, "value": grace} if e["name"] == "CHATFLEET_DRAIN_GRACE_SECONDS" else e for e in c["env"]
        ]
    return d


@dataclass
class PlainScenario:
    """Table 1's operations on a plain Deployment (the baseline): the same changes by kubectl alone.

    `promote`: a template change, rolled out (RollingUpdate); `roll_back`: a template change rolled back
    by `kubectl rollout undo` once a new pod is Ready and served a while; `scale_down`: one more replica,
    Ready, then one fewer. Same `log` and `spans` as Scenario.
    """

    bot: Bot
    deployment: str
    timeout: float = 600.0
    log: list[tuple[str, float]] = field(default_factory=list)
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    _n: int = 0

    _timed = Scenario._timed

    def _get(self) -> dict[str, Any]:
        return json.loads(self.bot.kubectl("get", "deployment", self.deployment, "-o", "json").stdout)

    def _release(self) -> None:
        self._n += 1
        patch = {"spec": {"template": {"metadata": {"annotations": {PLAIN_RELEASE: str(self._n)}}}}}
        self.bot.kubectl("patch", "deployment", self.deployment, "--type=merge", "-p", json.dumps(patch))

    def _rolled_out(self) -> bool:
        d = self._get()
        s, want = d.get("status", {}), d["spec"]["replicas"]
        return (
            s.get("observedGeneration", 0) >= d["metadata"]["generation"]
            and s.get("updatedReplicas") == want
            and s.get("readyReplicas") == want
            and s.get("replicas") == want
            and len(self.bot.pods("stable")) == want
        )

    def promote(self) -> None:
        """A template change, rolled out until only the new pods are left."""
        t0 = time.monotonic()
        self._release()
        self.bot.wait(self._rolled_out, self.timeout, "the rollout of the plain Deployment")
        self._timed("promotion", t0)

    def roll_back(self) -> None:
        """A template change, `kubectl rollout undo` once a new pod has served a while, rolled out."""
        t0 = time.monotonic()
        hash_before = {p["metadata"]["labels"].get("pod-template-hash") for p in self.bot.pods("stable")}
        self._release()

        def new_pod_ready() -> bool:
            return any(
                p["metadata"]["labels"].get("pod-template-hash") not in hash_before
                and not p["metadata"].get("deletionTimestamp")
                and all(s.get("ready") for s in p.get("status", {}).get("containerStatuses") or [{}])
                for p in self.bot.pods("stable")
            )

        self.bot.wait(new_pod_ready, self.timeout, "a Ready pod of the new template")
        time.sleep(10)  # the new pod takes its share of the dialogues before it goes
        self.bot.kubectl("rollout", "undo", f"deployment/{self.deployment}")
        self.bot.wait(self._rolled_out, self.timeout, "the rollback of the plain Deployment")
        self._timed("rollback", t0)

    def scale_down(self) -> None:
        """One more replica until it is Ready, then back to one fewer (a pod goes away)."""
        t0 = time.monotonic()
        n = int(self._get()["spec"]["replicas"])
        self.bot.kubectl("scale", "deployment", self.deployment, f"--replicas={n + 1}")
        self.bot.wait(lambda: ready_pods(self.bot, "stable") >= n + 1, self.timeout, f"{n + 1} Ready pods")
        time.sleep(5)  # the new pod takes its share of the dialogues
        self.bot.kubectl("scale", "deployment", self.deployment, f"--replicas={n}")
        self.bot.wait(lambda: len(self.bot.pods("stable")) == n, 180, f"back to {n} pods")
        self._timed("scale-down", t0)


def make_plain(bot: Bot, timeout: float = 600.0) -> PlainScenario:
    """Turn a Ready bot into the plain baseline: the ChatbotService deleted with its objects orphaned (the
    operator lets go of them), its stable Deployment replaced by plain_deployment's and rolled out."""
    bot.kubectl("delete", "cbs", bot.name, "--cascade=orphan", "--wait=true")

    def orphaned() -> dict[str, Any] | None:
        res = bot.kubectl("get", "deployments", "-l", "chatfleet.io/track=stable", "-o", "json")
        (d,) = json.loads(res.stdout)["items"]
        return None if d["metadata"].get("ownerReferences") else d

    deployment = bot.wait(orphaned, 60, "the stable Deployment orphaned")
    name = deployment["metadata"]["name"]
    bot.kubectl("replace", "-f", "-", input=json.dumps(plain_deployment(deployment)))
    scenario = PlainScenario(bot, name, timeout)
    bot.wait(scenario._rolled_out, timeout, "the plain Deployment rolled out")
    return scenario
