"""A missing Secret, diagnosed from a real pod: the operator reads no Secret, the kubelet does.

Test design: a ChatbotService on the real node names a Redis Secret (spec.runtime.sessions.redis) that
does not exist. The real kubelet cannot build the chat-api container's environment and leaves it waiting
in CreateContainerConfigError ('secret "..." not found') at once, before any image runs; the operator
turns that into Stalled=True / Ready=False with reason SecretNotFound naming the Secret and the spec
field, and one Warning event. A Secret without the named key then shows as SecretKeyNotFound. Simulated
(kwok) nodes never check Secrets, so this needs the real node. The operator here runs with no access to
Secrets in its code (kube.py has no Secret call); the chart's RBAC grants none (test_chart_rbac.py).
"""

from __future__ import annotations

import json

import pytest
from chatfleet_platform.load.realpods import on_real_node
from chatfleet_platform.servers.services import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAME = "secretless"


def stalled(cluster, ns: str, reason: str) -> dict | None:
    """The Stalled condition when it is True with `reason`."""
    res = cluster.kubectl("get", "cbs", NAME, "-o", "json", namespace=ns, check=False)
    conds = {c["type"]: c for c in json.loads(res.stdout or "{}").get("status", {}).get("conditions", [])}
    cond = conds.get("Stalled", {})
    return cond if cond.get("status") == "True" and cond.get("reason") == reason else None


def warnings(cluster, ns: str, reason: str) -> list[dict]:
    """Warning events of that reason on the ChatbotService."""
    out = cluster.kubectl(
        "get", "events", "-o", "json", "--field-selector", f"involvedObject.name={NAME}", namespace=ns
    ).stdout
    return [e for e in json.loads(out)["items"] if e["type"] == "Warning" and e["reason"] == reason]


@pytest.mark.timeout(420)
def test_a_missing_secret_shows_as_a_condition_naming_it(
    cluster, real_operator, real_ns, runtime_image, host_model_dir
):
    spec = on_real_node({"runtime": {"maxNewTokens": 4}}, image=runtime_image, model_dir=host_model_dir)
    spec["runtime"]["sessions"]["redis"] = {"secretName": "redis-url", "key": "url"}
    doc = {"apiVersion": "chatfleet.io/v1alpha1", "kind": "ChatbotService", "metadata": {"name": NAME}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps({**doc, "spec": spec}), namespace=real_ns)

    # 1. No Secret: the kubelet's CreateContainerConfigError becomes SecretNotFound, naming the field.
    cond = wait_until(lambda: stalled(cluster, real_ns, "SecretNotFound"), 120, 0.5)
    pods = cluster.kubectl("get", "pods", "-o", "wide", namespace=real_ns, check=False).stdout
    assert cond, f"no Stalled SecretNotFound:\n{pods}\n{real_operator.log_text()[-3000:]}"
    assert (
        "Secret 'redis-url' named by spec.runtime.sessions.redis.secretName does not exist" in cond["message"]
    )
    (event,) = warnings(cluster, real_ns, "SecretNotFound")
    assert "spec.runtime.sessions.redis.secretName" in event["message"]

    # 2. The Secret without the key: SecretKeyNotFound, naming the key field (the kubelet retries the pod,
    #    the operator's backoff retry reads its new message).
    cluster.kubectl(
        "create", "secret", "generic", "redis-url", "--from-literal=address=redis://r:6379", namespace=real_ns
    )
    cond = wait_until(lambda: stalled(cluster, real_ns, "SecretKeyNotFound"), 180, 0.5)
    assert cond, real_operator.log_text()[-3000:]
    assert "spec.runtime.sessions.redis.key" in cond["message"] and "no key 'url'" in cond["message"]
