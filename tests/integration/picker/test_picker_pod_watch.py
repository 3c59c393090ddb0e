"""The endpoint picker against the local API server: it lists and watches the ChatbotService's pods (as
the operator deploys it: --namespace, --selector) and answers an ext_proc request, as the gateway sends
it, with a Ready pod's IP on the chat port; pods of another ChatbotService, not Ready or gone are never
picked. The pods are kwok's (they get IPs and Ready from kwok's stages; nothing listens there, which the
picker does not need: its load reads fail and keep the last load)."""

from __future__ import annotations

import sys

import pytest
from needs import need_module

need_module("envoy_data_plane", "run `make setup` (the picker extra: envoy-data-plane)")

from chatfleet_platform.common import procs  # noqa: E402 - after the checks above
from extproc_gateway import ask  # noqa: E402 - after the checks above

pytestmark = [pytest.mark.cluster]


def pod(name: str, service: str, track: str, revision: str) -> dict:
    labels = {"chatfleet.io/service": service, "chatfleet.io/track": track, "chatfleet.io/revision": revision}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeSelector": {"type": "kwok"},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "chat", "image": "chat:1"}],
        },
    }


def test_the_picker_picks_ready_pods_of_its_chatbotservice_from_the_api(cluster, namespace, tmp_path):
    cluster.apply(
        [pod("bot-s1", "bot", "stable", "a"), pod("other-s1", "other", "stable", "a")], namespace=namespace
    )
    cluster.kubectl(
        "wait", "--for=condition=Ready", "pod/bot-s1", "pod/other-s1", "--timeout=60s", namespace=namespace
    )

    def ip(name: str) -> str:
        return cluster.kubectl(
            "get", "pod", name, "-o", "jsonpath={.status.podIP}", namespace=namespace
        ).stdout

    stable, canary = procs.free_port(), procs.free_port()
    log = tmp_path / "picker.log"
    argv = [
        sys.executable,
        "-m",
        "chatfleet_picker",
        "--host=127.0.0.1",
        f"--pool=stable={stable}",
        f"--pool=canary={canary}",
        f"--namespace={namespace}",
        "--selector=chatfleet.io/service=bot",
        "--target-port=8080",
        "--scrape-interval=0.5",
    ]
    proc = procs.start("picker", argv, log=log, env={**cluster.env, "PATH": "/usr/bin:/bin"})
    try:
        procs.wait_for("picker", lambda: procs.port_in_use(stable), timeout=30, log=log, proc=proc)
        # the pod watch fills the fleet: the one Ready pod of `bot`, never `other`'s
        procs.wait_for(
            "a pick", lambda: ask(stable, "d1") == f"{ip('bot-s1')}:8080", timeout=30, log=log, proc=proc
        )
        # a canary pod appears: a new dialogue sent to the canary pool lands on it, d1 stays on its revision
        cluster.apply([pod("bot-c1", "bot", "canary", "b")], namespace=namespace)
        cluster.kubectl("wait", "--for=condition=Ready", "pod/bot-c1", "--timeout=60s", namespace=namespace)
        procs.wait_for(
            "the canary pod",
            lambda: ask(canary, "d2") == f"{ip('bot-c1')}:8080",
            timeout=30,
            log=log,
            proc=proc,
        )
        assert ask(canary, "d1") == f"{ip('bot-s1')}:8080"
        # the stable pod goes: d1's revision has no replica left, so it follows the pool it is routed to
        cluster.kubectl(
            "delete", "pod", "bot-s1", "--grace-period=0", "--force", namespace=namespace, check=False
        )
        procs.wait_for(
            "the deleted pod to leave",
            lambda: ask(stable, "d3") == f"{ip('bot-c1')}:8080",
            timeout=30,
            log=log,
            proc=proc,
        )
    finally:
        procs.stop(proc)
    assert "Traceback" not in log.read_text(), log.read_text()[-2000:]
