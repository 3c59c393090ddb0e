"""The plain-read path of Cluster.kubectl (chatfleet_platform.cluster.apireader): which calls it takes, how
it names resources, and that it prints what kubectl prints. Against the real API server and kubectl:
tests/integration/platform/test_platform.py::test_plain_reads_answer_as_kubectl_does."""

from __future__ import annotations

import json
from typing import Any

import pytest
from chatfleet_platform.cluster import apireader
from chatfleet_platform.cluster.apireader import (
    ApiReader,
    Get,
    Resource,
    Unanswered,
    parse,
    resources_by_name,
)

pytestmark = pytest.mark.harness


def group(name: str, *versions: tuple[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "versions": [{"version": v, "resources": rs} for v, rs in versions]}


def res(plural: str, kind: str, *, singular: str = "", short: tuple[str, ...] = (), ns: bool = True) -> dict:
    return {
        "resource": plural,
        "responseKind": {"kind": kind},
        "scope": "Namespaced" if ns else "Cluster",
        "singularResource": singular or kind.lower(),
        "shortNames": list(short),
    }


CORE = group("", ("v1", [res("pods", "Pod", short=("po",)), res("events", "Event", short=("ev",))]))
CORE_ALL = group(
    "",
    (
        "v1",
        [
            res("pods", "Pod", short=("po",)),
            res("configmaps", "ConfigMap", short=("cm",)),
            res("nodes", "Node", short=("no",), ns=False),
        ],
    ),
)
APPS = group("apps", ("v1", [res("deployments", "Deployment", short=("deploy",))]))
EVENTS = group("events.k8s.io", ("v1", [res("events", "Event", short=("ev",))]))
CHATFLEET = group(
    "chatfleet.io",
    ("v1alpha1", [res("chatbotservices", "ChatbotService", short=("cbs",))]),
    ("v1alpha0", [res("chatbotservices", "ChatbotService", short=("cbs",))]),
)


class TestParse:
    @pytest.mark.parametrize(
        ("args", "namespace", "want"),
        [
            (("get", "pods", "-o", "json"), None, Get(("pods",), (), None, False, None, "json", False)),
            (("get", "pods", "-ojson", "-n", "a"), None, Get(("pods",), (), "a", False, None, "json", False)),
            (
                ("get", "cm", "x", "--output=name", "--ignore-not-found"),
                "b",
                Get(("cm",), ("x",), "b", False, None, "name", True),
            ),
            (
                ("get", "pods,svc", "-l", "app=bot", "-o", "json"),
                "c",
                Get(("pods", "svc"), (), "c", False, "app=bot", "json", False),
            ),
            (
                ("get", "deployment/bot", "deployment/other", "-o=json"),
                None,
                Get(("deployment",), ("bot", "other"), None, False, None, "json", False),
            ),
            (("get", "cbs", "-A", "-o", "json"), None, Get(("cbs",), (), None, True, None, "json", False)),
            (
                ("get", "pods", "--selector=a=b,c!=d", "--namespace=x", "-o", "name"),
                None,
                Get(("pods",), (), "x", False, "a=b,c!=d", "name", False),
            ),
        ],
    )
    def test_the_calls_it_takes(self, args, namespace, want):
        assert parse(args, namespace) == want

    @pytest.mark.parametrize(
        "args",
        [
            ("apply", "-f", "-"),
            ("get", "pods"),  # a table: kubectl's
            ("get", "pods", "-o", "wide"),
            ("get", "pods", "-o", "jsonpath={.items}"),
            ("get", "pods", "-o", "yaml"),
            ("get", "events", "--sort-by=.lastTimestamp", "-o", "json"),
            ("get", "pods", "--watch", "-o", "json"),
            ("get", "-o", "json"),  # no type
            ("get", "pods,svc", "x", "-o", "json"),  # names of several types
            ("get", "deploy/a", "svc/b", "-o", "json"),
            ("get", "pods", "x", "-A", "-o", "json"),
            ("get", "pods", "-o"),
        ],
    )
    def test_everything_else_is_kubectls(self, args):
        assert parse(args) is None


class TestNames:
    def test_every_name_kubectl_resolves(self):
        known = resources_by_name([CORE, APPS, CHATFLEET])
        pod = Resource("", "v1", "pods", "Pod", True)
        assert {known[n] for n in ("pods", "pod", "po", "pods.v1")} == {pod}
        deploy = Resource("apps", "v1", "deployments", "Deployment", True)
        for n in (
            "deployments",
            "deployment",
            "deploy",
            "deployments.apps",
            "deploy.apps",
            "deployments.v1.apps",
        ):
            assert known[n] == deploy, n
        assert known["cbs"].version == "v1alpha1"  # the preferred (first) version answers bare names
        assert known["chatbotservices.v1alpha0.chatfleet.io"].version == "v1alpha0"

    def test_the_core_group_keeps_a_bare_name_another_group_also_claims(self):
        known = resources_by_name([CORE, EVENTS])
        assert known["events"].group == "" and known["ev"].group == ""
        assert known["events.events.k8s.io"].group == "events.k8s.io"

    def test_paths_and_name_lines(self):
        pod = Resource("", "v1", "pods", "Pod", True)
        node = Resource("", "v1", "nodes", "Node", False)
        cbs = Resource("chatfleet.io", "v1alpha1", "chatbotservices", "ChatbotService", True)
        assert pod.path("ns", "a b") == "/api/v1/namespaces/ns/pods/a%20b"
        assert pod.path(None) == "/api/v1/pods"  # all namespaces
        assert node.path("ns", "n1") == "/api/v1/nodes/n1"  # cluster-scoped: the namespace is ignored
        assert cbs.path("ns") == "/apis/chatfleet.io/v1alpha1/namespaces/ns/chatbotservices"
        assert pod.name_of("a") == "pod/a" and cbs.name_of("bot") == "chatbotservice.chatfleet.io/bot"


class TestPrinting:
    def test_json_as_go_prints_it(self):
        text = apireader.go_json({"b": 1, "a": {"y": "<&>", "x": ["é"]}})
        assert text == (
            '{\n    "a": {\n        "x": [\n            "é"\n        ],\n        "y": "\\u003c\\u0026\\u003e"\n'
            '    },\n    "b": 1\n}\n'
        )

    def test_a_list_carries_each_items_kind_and_no_managed_fields(self):
        pod = Resource("", "v1", "pods", "Pod", True)
        item = {"metadata": {"name": "a", "managedFields": [{"manager": "x"}]}, "spec": {}}
        get = Get(("pods",), (), "ns", False, None, "json", False)
        doc = json.loads(apireader.printed(get, [(pod, item)]))
        assert doc == {
            "apiVersion": "v1",
            "items": [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}, "spec": {}}],
            "kind": "List",
            "metadata": {"resourceVersion": ""},
        }
        assert "managedFields" in item["metadata"]  # the caller's object is left as it was


class FakeApi(ApiReader):
    """An ApiReader whose HTTP is a dict of path -> (status, body); records the paths asked."""

    def __init__(self, answers: dict[str, tuple[int, Any]]):
        super().__init__("127.0.0.1", 1, None)  # type: ignore[arg-type]
        self.answers, self.asked = answers, []

    def _request(self, path, timeout, accept="application/json"):
        self.asked.append(path)
        if path not in self.answers:
            raise Unanswered(f"no answer for {path}")
        return self.answers[path]


def discovery(*groups: dict) -> dict[str, tuple[int, Any]]:
    core = [g for g in groups if not g["metadata"]["name"]]
    rest = [g for g in groups if g["metadata"]["name"]]
    return {
        "/api": (200, {"kind": "APIGroupDiscoveryList", "items": core}),
        "/apis": (200, {"kind": "APIGroupDiscoveryList", "items": rest}),
    }


def not_found(plural: str, name: str) -> tuple[int, dict]:
    return 404, {
        "kind": "Status",
        "reason": "NotFound",
        "message": f'{plural} "{name}" not found',
        "details": {"name": name, "kind": plural},
    }


CM_A = {"metadata": {"name": "a", "namespace": "ns"}, "data": {"k": "v"}}


class TestReader:
    def answer(self, extra: dict, *args: str) -> Any:
        api = FakeApi({**discovery(CORE_ALL, APPS), **extra})
        get = parse(args, "ns")
        assert get is not None
        return api.get(get, ["kubectl", *args]), api

    def test_one_object_bare(self):
        done, _ = self.answer(
            {"/api/v1/namespaces/ns/configmaps/a": (200, CM_A)}, "get", "cm", "a", "-o", "json"
        )
        assert (done.returncode, done.stderr) == (0, "")
        assert json.loads(done.stdout) == {**CM_A, "apiVersion": "v1", "kind": "ConfigMap"}

    def test_not_found_as_kubectl_says_it(self):
        path = "/api/v1/namespaces/ns/configmaps/b"
        done, _ = self.answer({path: not_found("configmaps", "b")}, "get", "configmap", "b", "-o", "json")
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == 'Error from server (NotFound): configmaps "b" not found\n'
        done, _ = self.answer(
            {path: not_found("configmaps", "b")}, "get", "configmap", "b", "-o", "json", "--ignore-not-found"
        )
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")

    def test_several_names_some_missing_print_what_was_found_and_fail(self):
        answers = {
            "/api/v1/namespaces/ns/configmaps/a": (200, CM_A),
            "/api/v1/namespaces/ns/configmaps/b": not_found("configmaps", "b"),
        }
        done, _ = self.answer(answers, "get", "cm", "a", "b", "-o", "name")
        assert (done.returncode, done.stdout) == (1, "configmap/a\n")
        assert 'configmaps "b" not found' in done.stderr

    def test_an_empty_list_is_printed_unless_not_found_is_ignored(self):
        answers = {"/api/v1/namespaces/ns/pods?labelSelector=app%3Dx": (200, {"items": []})}
        done, _ = self.answer(answers, "get", "pods", "-l", "app=x", "-o", "json")
        assert json.loads(done.stdout)["items"] == [] and done.returncode == 0
        done, _ = self.answer(answers, "get", "pods", "-l", "app=x", "-o", "json", "--ignore-not-found")
        assert done.stdout == ""

    def test_a_type_gone_from_the_server_is_kubectls_to_report(self):
        gone = (404, {"kind": "Status", "reason": "NotFound", "message": "the server could not find it"})
        with pytest.raises(Unanswered):
            self.answer({"/api/v1/namespaces/ns/configmaps/a": gone}, "get", "cm", "a", "-o", "json")

    def test_an_unknown_type_is_looked_up_again_once_then_left_to_kubectl(self):
        api = FakeApi(discovery(CORE_ALL))
        with pytest.raises(Unanswered):
            api.get(parse(("get", "cbs", "-o", "json"), "ns"), ["kubectl"])
        assert api.asked == ["/api", "/apis", "/api", "/apis"]

    def test_discovery_is_read_once_for_known_types(self):
        api = FakeApi({**discovery(CORE_ALL), "/api/v1/nodes": (200, {"items": []})})
        for _ in range(3):
            api.get(parse(("get", "nodes", "-o", "json"), "ns"), ["kubectl"])
        assert api.asked.count("/apis") == 1

    def test_other_errors_are_kubectls(self):
        with pytest.raises(Unanswered):
            self.answer(
                {"/api/v1/namespaces/ns/pods": (403, {"reason": "Forbidden"})}, "get", "pods", "-o", "json"
            )
