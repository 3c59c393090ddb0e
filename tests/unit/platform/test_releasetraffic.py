"""The plain-Deployment baseline of `make bench-release-traffic` is the operator's pods without the drain.

Test design: the operator's own builder makes the stable Deployment of the benchmark's spec; the pure
conversion must keep the pods (image, probes, resources, sessions) and change exactly the drain: the
preStop hook, the grace period, the chat API's SIGTERM handling (checked by running the replaced
command's server swap in a subprocess) and the rollout strategy.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from chatfleet_operator.builders import build_deployment
from chatfleet_operator.builders.deployment import DRAIN_HOOK
from chatfleet_operator.settings import PodSettings
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef
from chatfleet_platform.load.releasetraffic import (
    PLAIN_GRACE_SECONDS,
    PLAIN_PRESTOP_SECONDS,
    plain_deployment,
    traffic_spec,
)

pytestmark = pytest.mark.harness


@pytest.fixture
def operators():
    spec = traffic_spec("http://prom:9090", image="chatfleet/runtime:x", model_dir=Path("/models/tiny"))
    dep = build_deployment(
        ObjectRef("ns", "bot", "u", 1), ChatbotServiceSpec.from_dict(spec), PodSettings(), revision="r"
    )
    dep["metadata"].update(resourceVersion="7", ownerReferences=[{"kind": "ChatbotService"}])
    dep["status"] = {"replicas": 1}
    return dep


def containers(dep):
    return {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}


def test_the_drain_is_replaced_and_nothing_else_of_the_pods_changes(operators):
    plain = plain_deployment(operators)
    before, after = containers(operators), containers(plain)
    assert set(before) == set(after) == {"triton", "chat-api"}
    assert all(c["lifecycle"]["preStop"] == DRAIN_HOOK for c in before.values())  # the operator's drain
    for name, c in after.items():
        assert c["lifecycle"] == {"preStop": {"sleep": {"seconds": PLAIN_PRESTOP_SECONDS}}}
        for key in ("image", "resources", "readinessProbe", "livenessProbe", "volumeMounts", "ports"):
            assert c.get(key) == before[name].get(key), (name, key)
    assert after["triton"]["command"] == before["triton"]["command"]
    assert plain["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == PLAIN_GRACE_SECONDS
    env = {e["name"]: e for e in after["chat-api"]["env"]}
    assert env["CHATFLEET_DRAIN_GRACE_SECONDS"]["value"] == str(PLAIN_GRACE_SECONDS - PLAIN_PRESTOP_SECONDS)
    assert "CHATFLEET_REDIS_URL" in env  # the sessions stay in Redis
    assert "strategy" not in plain["spec"] and "status" not in plain
    assert set(plain["metadata"]) <= {"name", "namespace", "labels"}
    assert plain["spec"]["template"]["metadata"] == operators["spec"]["template"]["metadata"]
    assert "preStop" in operators["spec"]["template"]["spec"]["containers"][0]["lifecycle"]  # input kept


def test_the_chat_api_runs_the_same_arguments_on_uvicorns_stock_server(operators):
    before, after = (
        containers(operators)["chat-api"]["command"],
        containers(plain_deployment(operators))["chat-api"]["command"],
    )
    i = before.index("-m")
    assert after[:i] == before[:i] and after[i] == "-c" and after[i + 2 :] == before[i + 2 :]
    probe = after[i + 1].replace(
        "raise SystemExit(api.main(sys.argv[1:]))",
        "print(type(api.DrainingServer(__import__('uvicorn').Config(None), None)).__name__)",
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "Server"  # uvicorn's own, not DrainingServer


def test_a_failure_report_names_each_pod_not_ready_its_chat_apis_state_and_its_logs(monkeypatch):
    """Bot.snapshot (what a failing real-pod test prints) on a canned cluster: the ready pod is left out,
    the unready one gets the stack-dump line and each container's log lines."""
    import json

    from chatfleet_platform.load import releasetraffic

    pods = {
        "items": [
            {
                "metadata": {"name": "ok"},
                "status": {"containerStatuses": [{"name": "chat-api", "ready": True}]},
            },
            {
                "metadata": {"name": "stuck"},
                "status": {
                    "containerStatuses": [
                        {"name": "chat-api", "ready": False},
                        {"name": "triton", "ready": True},
                    ]
                },
            },
        ]
    }

    class Cluster:
        def kubectl(self, *args, namespace=None, check=True, **kw):
            if args[:2] == ("get", "pods") and "json" in args:
                out = json.dumps(pods)
            elif args[0] == "logs":
                out = f"log of {args[1]}/{args[3]}\n"
            elif args[:2] == ("get", "endpointslices"):
                out = json.dumps({"items": []})
            else:
                out = ""
            return subprocess.CompletedProcess(args, 0, out, "")

    monkeypatch.setattr(
        releasetraffic, "dump_stacks", lambda cluster, pod: f"dumped {pod['metadata']['name']}"
    )
    report = releasetraffic.Bot(Cluster(), "ns").snapshot()
    assert "stuck: dumped stuck" in report and "ok: dumped" not in report
    assert "stuck/chat-api (ready=False) last log lines:\n  log of stuck/chat-api" in report
    assert "stuck/triton (ready=True) last log lines:\n  log of stuck/triton" in report


def test_each_wait_is_kept_with_its_test_and_its_time_and_a_time_out_too(monkeypatch):
    from chatfleet_platform.load import releasetraffic

    monkeypatch.setattr(releasetraffic, "WAITS", [])
    monkeypatch.setattr(releasetraffic, "WAIT_INTERVAL", 0.01)
    intervals: list[float] = []
    real_wait_until = releasetraffic.wait_until

    def wait_until(predicate, timeout, interval):
        intervals.append(interval)
        return real_wait_until(predicate, timeout, interval)

    monkeypatch.setattr(releasetraffic, "wait_until", wait_until)
    monkeypatch.setattr(releasetraffic.Bot, "status", lambda self: {})
    monkeypatch.setattr(releasetraffic.Bot, "snapshot", lambda self, events=25: "")
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/realnode/test_x.py::test_y (call)")
    bot = releasetraffic.Bot(cluster=None, ns="ns")
    polls = iter([False, False, "pod-1"])
    assert bot.wait(lambda: next(polls), 5, "a pod") == "pod-1"
    with pytest.raises(AssertionError, match=r"never did not happen in 0\.05s"):
        bot.wait(lambda: False, 0.05, "never")
    first, timed_out = releasetraffic.WAITS
    assert first["test"] == "tests/realnode/test_x.py::test_y" and first["what"] == "a pod" and first["ok"]
    assert intervals == [0.01, 0.01]  # WAIT_INTERVAL, read at each wait
    assert timed_out["what"] == "never" and not timed_out["ok"]
