"""The Gateway API data plane on real pods: Traefik serves an HTTPRoute between two bots on the real node.

Test design: two ChatbotServices, `alpha` and `beta`, run one pod each on the real node (the tiny model on
the CPU); each answers with its own name as the response's "model", and each has a hostname of its own
(`spec.rollout.hostnames`) on the operator's HTTPRoute for it. An HTTPRoute written here, not by the
operator, attaches to the platform's shared Gateway (`gateway` fixture: Traefik on 127.0.0.1) for one
hostname of its own, so no other route on the Gateway can catch these requests. It has two rules: requests
with the header `x-chatfleet-backend: beta` go to beta only, and all others are split 75/25 between
alpha and beta. Traefik sends to the pods' addresses from the Services' EndpointSlices, over the node's
bridge.

- 40 requests through `gateway.url` must reach both bots in about that ratio (Traefik's weighted round
  robin is deterministic: 30/10), every one answered 200.
- The header-matched rule must send every request to beta.
- A weight change (0/100) must take effect within seconds, as a release's steps need.
- The operator's own route of each bot must answer for that bot's hostname, every request.
- The pods must reach the session's Redis for pods (`pod_redis`) on the node's bridge address, and both
  servers must listen on 127.0.0.1 or that bridge address, nowhere else.
- Security: nothing a user sends through the Gateway reaches a replica's drain, records, probes or
  Triton; the pod stays Ready and serving.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from chatfleet_platform.load.realpods import chat_body, on_real_node
from chatfleet_platform.servers.services import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

HOST = "split.gateway.chatfleet.test"
HEADER = "x-chatfleet-backend"
BOTS = ("alpha", "beta")


def bot_host(name: str) -> str:
    """The hostname of a bot's own HTTPRoute (spec.rollout.hostnames)."""
    return f"{name}.gateway.chatfleet.test"


def bot_doc(name: str, image: str, model_dir) -> dict[str, Any]:
    spec = {
        "model": {"hostPath": "/", "maxContextTokens": 512},
        "runtime": {"maxNewTokens": 4},
        "rollout": {"hostnames": [bot_host(name)]},
    }
    return {
        "apiVersion": "chatfleet.io/v1alpha1",
        "kind": "ChatbotService",
        "metadata": {"name": name},
        "spec": on_real_node(spec, image=image, model_dir=model_dir),
    }


def route(ns: str, gateway, weights: tuple[int, int]) -> dict[str, Any]:
    """HTTPRoute `split`: the header rule to beta, then alpha/beta by `weights`, for HOST only."""
    header_rule = {
        "matches": [{"headers": [{"name": HEADER, "value": "beta"}]}],
        "backendRefs": [{"name": "beta", "port": 8080}],
    }
    weighted = {
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
        "backendRefs": [
            {"name": "alpha", "port": 8080, "weight": weights[0]},
            {"name": "beta", "port": 8080, "weight": weights[1]},
        ],
    }
    return gateway.route("split", ns, HOST, [header_rule, weighted])


def ask(url: str, headers: dict[str, str] | None = None, host: str = HOST) -> tuple[int, str]:
    """One chat through the gateway for `host`: (status, the answering bot's name, or the body's start)."""
    port = int(url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(chat_body("hello", max_tokens=2)),
            headers={"Host": host, "Content-Type": "application/json", **(headers or {})},
        )
        resp = conn.getresponse()
        body = resp.read().decode(errors="replace")
    except (http.client.HTTPException, OSError) as exc:
        return 0, type(exc).__name__
    finally:
        conn.close()
    if resp.status != 200:
        return resp.status, body[:200]
    return 200, json.loads(body).get("model", "?")


def route_ok(cluster, ns: str, gateway) -> bool:
    """The route is Accepted by the Gateway and its backends resolved (Traefik wrote that status)."""
    res = cluster.kubectl("get", "httproute", "split", "-o", "json", namespace=ns, check=False)
    if res.returncode != 0:
        return False
    for parent in json.loads(res.stdout).get("status", {}).get("parents", []):
        if parent["parentRef"]["name"] == gateway.name:
            conds = {c["type"]: c["status"] for c in parent.get("conditions", [])}
            return conds.get("Accepted") == "True" and conds.get("ResolvedRefs") == "True"
    return False


def listeners(port: int) -> set[str]:
    """Local addresses with a TCP socket listening on `port`."""
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True)
    return {line.split()[3].rsplit(":", 1)[0] for line in out.stdout.splitlines() if line.strip()}


def ready(cluster, ns: str, name: str) -> bool:
    res = cluster.kubectl("get", "cbs", name, "-o", "json", namespace=ns, check=False)
    conds = {c["type"]: c for c in json.loads(res.stdout or "{}").get("status", {}).get("conditions", [])}
    return conds.get("Ready", {}).get("status") == "True"


@pytest.fixture(scope="module")
def bots(cluster, real_operator, runtime_image, host_model_dir, reaper) -> Iterator[str]:
    """A real-* namespace with alpha and beta Ready on the real node (one pod each); deleted afterwards in
    the background (`reaper`: the next module starts while its pods drain)."""
    ns = f"real-gw-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    try:
        for name in BOTS:
            doc = bot_doc(name, runtime_image, host_model_dir)
            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), namespace=ns)
        for name in BOTS:
            ok = wait_until(lambda name=name: ready(cluster, ns, name), 240, 0.5)
            pods = cluster.kubectl("get", "pods", "-o", "wide", namespace=ns, check=False).stdout
            assert ok, f"{ns}/{name} never turned Ready on the real node:\n{pods}"
        yield ns
    finally:
        reaper.delete(ns)


def test_an_httproute_splits_and_matches_headers_between_real_pods(cluster, gateway, bots):
    ns = bots
    assert listeners(gateway.port) == {"127.0.0.1"}, "Traefik must listen on 127.0.0.1 only"
    cluster.apply([route(ns, gateway, (75, 25))])
    assert wait_until(lambda: route_ok(cluster, ns, gateway), 30, 0.5), cluster.kubectl(
        "get", "httproute", "split", "-o", "yaml", namespace=ns
    ).stdout
    # the route's status comes with the configuration; Traefik applies it after its provider throttle
    assert wait_until(lambda: ask(gateway.url)[0] == 200, 30, 0.5), (
        f"{ask(gateway.url)}; log:\n{gateway.log.read_text()[-3000:]}"
    )

    answers = [ask(gateway.url) for _ in range(40)]
    assert {status for status, _ in answers} == {200}, answers
    split = Counter(model for _, model in answers)
    assert set(split) == set(BOTS), split
    assert 26 <= split["alpha"] <= 34, f"75/25 of 40 requests: {split}"

    pinned = Counter(ask(gateway.url, {HEADER: "beta"}) for _ in range(8))
    assert pinned == Counter({(200, "beta"): 8}), pinned

    t0 = time.monotonic()
    cluster.apply([route(ns, gateway, (0, 100))])
    moved = wait_until(lambda: all(ask(gateway.url) == (200, "beta") for _ in range(6)), 20, 0.5)
    assert moved, f"weights 0/100 not in effect after 20 s: {[ask(gateway.url) for _ in range(6)]}"
    print(f"weight change in effect after {time.monotonic() - t0:.1f}s; 75/25 split of 40: {dict(split)}")


def test_the_operators_routes_answer_for_their_own_hostnames_only(cluster, gateway, bots):
    """Each bot's own HTTPRoute (spec.rollout.hostnames) takes its hostname and nothing else: without
    hostnames both routes would match every request on the shared listener, and one bot would answer all."""
    ns = bots
    for name in BOTS:
        res = cluster.kubectl("get", "httproute", name, "-o", "jsonpath={.spec.hostnames}", namespace=ns)
        assert json.loads(res.stdout or "null") == [bot_host(name)], res.stdout
    for name in BOTS:
        answered = wait_until(lambda name=name: ask(gateway.url, host=bot_host(name)) == (200, name), 30, 0.5)
        assert answered, f"{bot_host(name)}: {ask(gateway.url, host=bot_host(name))}"
        answers = Counter(ask(gateway.url, host=bot_host(name)) for _ in range(6))
        assert answers == Counter({(200, name): 6}), answers


def test_real_node_pods_reach_the_pod_redis(cluster, pod_redis, real_node, bots):
    ns = bots
    assert pod_redis.url.startswith(f"redis://{real_node.ip}:")
    assert listeners(pod_redis.server.port) == {"127.0.0.1", real_node.ip}
    sessions = pod_redis.secret(ns)
    assert sessions == {"secretName": "redis", "key": "url"}
    stored = cluster.kubectl("get", "secret", "redis", "-o", "jsonpath={.data.url}", namespace=ns).stdout
    assert stored, "Secret redis has no key url"
    pod = cluster.kubectl(
        "get",
        "pods",
        "-l",
        "chatfleet.io/service=alpha",
        "-o",
        "jsonpath={.items[0].metadata.name}",
        namespace=ns,
    ).stdout
    port = pod_redis.server.port
    probe = (
        f"import socket;s=socket.create_connection(({real_node.ip!r},{port}),5);"
        "s.sendall(b'SET from-pod yes\\r\\n');print(s.recv(64).decode().strip())"
    )
    res = cluster.kubectl(
        "exec", pod, "-c", "chat-api", "--", "python3", "-c", probe, namespace=ns, check=False
    )
    assert res.stdout.strip() == "+OK", f"{res.stdout}\n{res.stderr}"
    check = subprocess.run(
        ["redis-cli", "-p", str(port), "GET", "from-pod"], capture_output=True, text=True, timeout=10
    )
    assert check.stdout.strip() == "yes", check


#: What an end user might send through the gateway to take a replica out of service or read its state.
USER_ATTEMPTS = [
    ("POST", "/drain"),
    ("GET", "/drain"),
    ("POST", "/drain/"),
    ("POST", "//drain"),
    ("POST", "/DRAIN"),
    ("POST", "/%64rain"),
    ("POST", "/v1/../drain"),
    ("POST", "/drain?now=1"),
    ("PUT", "/drain"),
    ("POST", "/shadow/records"),
    ("GET", "/metrics"),
    ("GET", "/readyz"),
    ("GET", "/v2/health/ready"),
    ("POST", "/v2/models/chat/infer"),
    ("GET", "/v2/models/chat/config"),
]


def send(url: str, method: str, path: str, host: str) -> int:
    """One raw request through the gateway (the path as given, not normalised); its status, 0 on failure."""
    port = int(url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True)
        conn.putheader("Host", host)
        conn.putheader("Content-Length", "2")
        conn.endheaders(b"{}")
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (http.client.HTTPException, OSError):
        return 0
    finally:
        conn.close()


def pod_of(cluster, ns: str, name: str) -> dict[str, Any]:
    """The one pod of a bot."""
    res = cluster.kubectl("get", "pods", "-l", f"chatfleet.io/service={name}", "-o", "json", namespace=ns)
    (pod,) = json.loads(res.stdout)["items"]
    return pod


def refused(ip: str, port: int) -> bool:
    """Whether nothing listens on ip:port (the connection is refused at once)."""
    import socket

    try:
        socket.create_connection((ip, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_user_through_the_gateway_cannot_drain_a_pod_or_reach_triton(cluster, gateway, bots):
    """Security (docs/security.md "Ports"): whatever a user sends through the Gateway, the replica's state
    does not change -- no route reaches the drain, the records, the probes or Triton -- and the pod stays
    Ready and serving. Triton listens on the pod's loopback, and the Service carries the chat port only."""
    ns, name = bots, "alpha"
    host = bot_host(name)
    assert wait_until(lambda: ask(gateway.url, host=host) == (200, name), 30, 0.5), ask(
        gateway.url, host=host
    )
    pod = pod_of(cluster, ns, name)
    restarts = {c["name"]: c["restartCount"] for c in pod["status"]["containerStatuses"]}

    statuses = {f"{m} {p}": send(gateway.url, m, p, host) for m, p in USER_ATTEMPTS}
    assert all(not 200 <= s < 300 for s in statuses.values()), statuses

    # still Ready and serving, never draining: the admin port answers the kubelet's probe path
    pod = pod_of(cluster, ns, name)
    conds = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conds["Ready"] == "True", pod["status"]
    assert {c["name"]: c["restartCount"] for c in pod["status"]["containerStatuses"]} == restarts
    answers = Counter(ask(gateway.url, host=host) for _ in range(4))
    assert answers == Counter({(200, name): 4}), answers
    ip = pod["status"]["podIP"]
    with urllib.request.urlopen(f"http://{ip}:8082/readyz", timeout=10) as resp:
        assert json.loads(resp.read())["status"] == "ready"
    # the drain answers the pod's own loopback only, even on the admin port
    drain = urllib.request.Request(f"http://{ip}:8082/drain", data=b"", method="POST")
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(drain, timeout=10)
    assert denied.value.code == 403

    # Triton: no Service port, nothing listening on the pod's address (loopback only)
    svc = json.loads(cluster.kubectl("get", "service", name, "-o", "json", namespace=ns).stdout)
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("chat", 8080)]
    assert all(refused(ip, port) for port in (8000, 8001, 8002)), "Triton must listen on 127.0.0.1 only"
    print(f"user attempts through the gateway: {statuses}")
