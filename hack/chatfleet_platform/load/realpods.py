"""Real pods on the local platform: a ChatbotService put on the real node, a chat client through the Service,
and per-pod figures from Prometheus.
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatfleet_platform.cluster import realnode
from chatfleet_platform.cluster.realnode import CLIENT_ADDRESSES, REAL_LABEL, REAL_TAINT
from chatfleet_platform.common.config import REPO_ROOT, require_binaries

SYSTEM_PROMPT = "You are a helpful assistant."
#: A chat template with a real-world defect: it refuses the system role (as some published templates do).
#: Warm-up sends no system message, so a canary with it turns Ready and then fails real requests.
NO_SYSTEM_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>"
)


def on_real_node(spec: dict[str, Any], *, image: str, model_dir: Path) -> dict[str, Any]:
    """The same spec, made to run on the local real node's CPU.

    It swaps in the tiny local model (hostPath) for the hub or bucket weights, the locally built image,
    fp32 (the CPU's precision), CPU-sized resources and the real node's selector and toleration. Sessions
    keep no Redis, and replicas are bounded.
    """
    s = copy.deepcopy(spec)
    model = s.setdefault("model", {})
    for key in ("uri", "revision", "tokenizer", "credentialsSecret", "pvc"):
        model.pop(key, None)
    model["hostPath"] = str(model_dir)
    model["maxContextTokens"] = min(int(model.get("maxContextTokens", 1024)), 1024)
    rt = s.setdefault("runtime", {})
    rt.update({"image": image, "imagePullPolicy": "IfNotPresent", "precision": "fp32"})
    rt["maxNewTokens"] = min(int(rt.get("maxNewTokens", 64)), 64)
    sessions = rt.setdefault("sessions", {})
    sessions.pop("redis", None)
    # the Service's ClientIP affinity lasts the session TTL: a minute (the least admitted), so ChatLoad's
    # users (addresses) can come back as new users after reuse_after = 65 s
    sessions["ttlSeconds"] = 60
    res = s.setdefault("resources", {})
    res.pop("gpuProduct", None)
    res.update({"cpu": "250m", "memory": "3Gi", "shmSize": "256Mi"})
    res["nodeSelector"] = {REAL_LABEL: "true"}
    res["tolerations"] = [{**REAL_TAINT, "operator": "Equal"}]
    scaling = s.setdefault("scaling", {})
    if "autoscale" in scaling:
        scaling["autoscale"].update({"minReplicas": 1, "maxReplicas": 1})
    else:
        scaling["replicas"] = min(int(scaling.get("replicas", 1)), 1)
    return s


def service_url(cluster: Any, namespace: str, name: str) -> str:
    """http://<ClusterIP>:8080 of a ChatbotService's Service (reached through kube-proxy from this host)."""
    res = cluster.kubectl("get", "service", name, "-o", "jsonpath={.spec.clusterIP}", namespace=namespace)
    return f"http://{res.stdout.strip()}:8080"


def chat_body(text: str, *, stream: bool = False, max_tokens: int = 4) -> dict[str, Any]:
    """An OpenAI-shaped chat request with a system message, as chat front-ends send them."""
    return {
        "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def chat_once(url: str, *, stream: bool, timeout: float = 30, source: str | None = None) -> str:
    """One chat through url, from a given source address (a user); the outcome.

    'ok', 'http-<code>', 'cut' (a stream without [DONE]) or 'conn' (no connection or no answer).
    """
    return chat_attempt(url, stream=stream, timeout=timeout, source=source)[0]


def serves(url: str) -> bool:
    """Whether one chat through url is answered. A gateway that has written a route is not yet serving it:
    Traefik answers 503 "no available server" until it has read the route's Service endpoints (a load
    started at once met six of them)."""
    return chat_once(url, stream=False, timeout=10) == "ok"


def chat_attempt(
    url: str, *, stream: bool, timeout: float = 30, source: str | None = None
) -> tuple[str, str]:
    """chat_once's outcome and what lies behind a failed one (the exception, or the answer's start)."""
    parsed = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(
        parsed.hostname, parsed.port or 80, timeout=timeout, source_address=(source, 0) if source else None
    )
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(chat_body("hello there", stream=stream)),
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        body = resp.read().decode(errors="replace")
    except (http.client.HTTPException, ConnectionError, TimeoutError, OSError) as exc:
        return "conn", f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    if resp.status != 200:
        return f"http-{resp.status}", body[:200]
    if stream:
        return ("ok", "") if "data: [DONE]" in body else ("cut", body[-200:])
    return ("ok", "") if '"choices"' in body else ("bad-body", body[:200])


@dataclass
class ChatLoad:
    """Users chatting through a URL from background threads, bounded in time.

    Each user is one of `sources` (the real node's client addresses). A user arrives, chats `turns` turns
    (plain and streamed by turns) and leaves. An address comes back as a new user only `reuse_after`
    seconds later, once the Service's ClientIP affinity (the session TTL) has forgotten it. So users
    keep arriving, as on a real service. A replica-ratio release pins a dialogue to its track, so only
    new users reach a canary: a fixed set of users who all arrived before it would never reach it.
    """

    url: str
    workers: int = 2
    max_seconds: float = 600
    sources: tuple[str, ...] = CLIENT_ADDRESSES
    turns: int = 3
    reuse_after: float = 65.0
    outcomes: Counter = field(default_factory=Counter)
    timeline: list[tuple[float, str, str, str]] = field(default_factory=list)
    """(finished, outcome, source address, detail) of each chat; the detail of a failed one is what a
    failing test names."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _last_left: dict[str, float] = field(default_factory=dict)
    _busy: set[str] = field(default_factory=set)
    _last_arrival: float = -1e9

    def _arrive(self) -> str | None:
        """The address of a new user: one never used, or left more than reuse_after ago (None: wait).

        Arrivals are spaced reuse_after / len(sources) apart, so users arrive steadily, not in bursts.
        """
        now = time.monotonic()
        with self._lock:
            if now - self._last_arrival < self.reuse_after / len(self.sources):
                return None
            for addr in self.sources:
                if addr not in self._busy and now - self._last_left.get(addr, -1e9) >= self.reuse_after:
                    self._busy.add(addr)
                    self._last_arrival = now
                    return addr
        return None

    def _leave(self, addr: str) -> None:
        with self._lock:
            self._busy.discard(addr)
            self._last_left[addr] = time.monotonic()

    def start(self) -> ChatLoad:
        t0 = time.monotonic()

        def work(i: int) -> None:
            n = 0
            while not self._stop.is_set() and time.monotonic() - t0 < self.max_seconds:
                user = self._arrive() if self.sources else None
                if self.sources and user is None:
                    time.sleep(0.2)
                    continue
                for _ in range(self.turns):
                    if self._stop.is_set():
                        break
                    outcome, detail = chat_attempt(self.url, stream=(n + i) % 2 == 1, source=user)
                    with self._lock:
                        self.outcomes[outcome] += 1
                        self.timeline.append((time.monotonic(), outcome, user or "", detail))
                    n += 1
                    time.sleep(0.1)
                if user:
                    self._leave(user)

        self._threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(self.workers)]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> Counter:
        self._stop.set()
        for t in self._threads:
            t.join(60)
        return self.outcomes

    def failed(self) -> int:
        return sum(v for k, v in self.outcomes.items() if k != "ok")

    def failures_since(self, t: float, limit: int = 12) -> list[str]:
        """The failed chats finished after monotonic time t, as readable lines (at most `limit`)."""
        with self._lock:
            rows = [r for r in self.timeline if r[0] >= t and r[1] != "ok"][:limit]
        return [
            f"+{ts - t:.1f}s from {src or 'host'}: {outcome} ({detail})" for ts, outcome, src, detail in rows
        ]

    def since(self, t: float) -> Counter:
        """Outcomes of the requests finished after monotonic time t."""
        with self._lock:
            return Counter(o for ts, o, _, _ in self.timeline if ts >= t)


def pod_request_counts(
    prometheus_url: str, namespace: str, model: str, window: str = "15m"
) -> dict[tuple[str, str], float]:
    """{(pod, track): requests counted by that pod} from the pods' own metrics, scraped via pod discovery.

    max_over_time over `window`, not the instant value: a pod that is gone (a rolled-back canary) has
    staleness markers from the moment its target disappeared, and an instant query would drop it.
    """
    series = f'chatfleet_requests_total{{namespace="{namespace}",model="{model}"}}'
    query = f"sum by (pod, track) (max_over_time({series}[{window}]))"
    with urllib.request.urlopen(
        f"{prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': query})}", timeout=10
    ) as r:
        data = json.load(r)["data"]["result"]
    return {(s["metric"].get("pod", ""), s["metric"].get("track", "")): float(s["value"][1]) for s in data}


def chart_template(show_only: str, *values: str) -> list[dict[str, Any]]:
    """The documents of one chart template as `helm template` renders it with `values` (KEY=VALUE)."""
    import yaml

    sets = [arg for value in values for arg in ("--set", value)]
    out = subprocess.run(
        [
            str(require_binaries(("helm",)).helm),
            "template",
            "cf",
            str(REPO_ROOT / "charts" / "chatfleet-operator"),
            "--namespace",
            "chatfleet-system",
            *sets,
            "--show-only",
            show_only,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def fleet_podmonitor() -> dict[str, Any]:
    """The chart's fleet PodMonitor as `helm template` renders it with monitoring on."""
    docs = chart_template("templates/podmonitor-fleets.yaml", "monitoring.fleetPodMonitor.enabled=true")
    # the template also holds the relays' monitor (their pods carry no chatfleet.io/service label)
    (fleets,) = [d for d in docs if d["metadata"]["name"].endswith("-fleets")]
    return fleets


def picker_rbac(namespace: str) -> list[dict[str, Any]]:
    """The chart's ServiceAccount, Role and RoleBinding of the endpoint picker, for one fleet namespace."""
    return chart_template("templates/picker-rbac.yaml", f"operator.gateway.pickerNamespaces={{{namespace}}}")


def pod_ready(pod: dict[str, Any]) -> bool:
    """The pod's Ready condition is True."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def pods_matching(cluster: Any, namespace: str, selector: str) -> list[dict[str, Any]]:
    """The pods of `namespace` that match the label selector, by name."""
    res = cluster.kubectl("get", "pods", "-l", selector, "-o", "json", namespace=namespace)
    return sorted(json.loads(res.stdout)["items"], key=lambda p: p["metadata"]["name"])


def metric_sum(url: str, name: str) -> float:
    """A series' value on a /metrics page (summed over labels; 0 when absent or unreachable)."""
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def container_pid(cluster: Any, pod: dict[str, Any], container: str) -> int:
    """The host PID of a container's main process (found through the real node's containerd)."""
    cid = next(s["containerID"] for s in pod["status"]["containerStatuses"] if s["name"] == container)
    cid = cid.split("://", 1)[1]
    names = cluster.realnodes.host_state().get("nodes", [])
    sock = next(
        n.socket for n in realnode.plans(cluster.workdir, len(names), 0) if n.name == pod["spec"]["nodeName"]
    )
    out = subprocess.run(
        ["ctr", "--address", str(sock), "-n", "k8s.io", "tasks", "ls"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return next(int(line.split()[1]) for line in out.splitlines() if line.startswith(cid))


def kill_container_process(cluster: Any, pod: dict[str, Any], container: str) -> int:
    """SIGKILL a container's main process from the host (a crash: the kubelet restarts the container, the pod
    and its address stay); returns the PID killed."""
    pid = container_pid(cluster, pod, container)
    os.kill(pid, signal.SIGKILL)
    return pid


def process_cpu_seconds(stat: str, ticks: int = os.sysconf("SC_CLK_TCK")) -> float:
    """User + system CPU seconds from a /proc/<pid>/stat line (the fields after the command's ")"). Pure."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / ticks


def cpu_share(pid: int, seconds: float = 1.0) -> float:
    """The share of one core a host process used over the next `seconds` (busy, or blocked and idle)."""
    stat = Path(f"/proc/{pid}/stat")
    before = process_cpu_seconds(stat.read_text())
    time.sleep(seconds)
    return (process_cpu_seconds(stat.read_text()) - before) / seconds


def dump_stacks(cluster: Any, pod: dict[str, Any], container: str = "chat-api") -> str:
    """One line on a pod's chat API that is not ready: its CPU use over a second, and SIGUSR1 sent (it
    writes every thread's stack to its log, read next); or why neither could be done."""
    try:
        pid = container_pid(cluster, pod, container)
        busy = cpu_share(pid)
        os.kill(pid, signal.SIGUSR1)
        time.sleep(0.5)
    except (StopIteration, KeyError, IndexError, OSError, subprocess.CalledProcessError) as exc:
        return f"{container}: no stack dump ({exc!r})"
    return f"{container} (host pid {pid}): {busy:.0%} of a core over 1 s; its threads' stacks are in its log"
