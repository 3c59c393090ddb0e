"""The operator benchmark's fair floor (bench/operator_bench.py) copies what the operator wrote, checked
without a cluster.

Test design: a stand-in for the cluster's kubectl answers with the objects of two ChatbotServices as the
API server returns them; the floor's template must hold exactly bot-0's objects, without what the server
writes, and renaming must reach every name part of bot-0 and none of bot-01's. No speed is asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from chatfleet_platform.common.config import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

import operator_bench as ob

pytestmark = pytest.mark.harness


def served(kind: str, name: str, owner: str, **spec) -> dict:
    return {
        "apiVersion": "v1" if kind in ("Service", "ConfigMap") else "apps/v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": "template",
            "uid": "u",
            "resourceVersion": "9",
            "generation": 2,
            "creationTimestamp": "2026-11-27T00:00:00Z",
            "managedFields": [{}],
            "labels": {"app.kubernetes.io/instance": owner},
            "annotations": {"deployment.kubernetes.io/revision": "1", "chatfleet.io/desired-hash": "h"},
            "ownerReferences": [{"kind": "ChatbotService", "name": owner}],
        },
        "spec": spec,
        "status": {"availableReplicas": 1},
    }


class FakeCluster:
    def __init__(self, items):
        self.items = items

    def kubectl(self, *args, **kw):
        return subprocess.CompletedProcess(args, 0, json.dumps({"items": self.items}), "")


def scripted_watch(scripts: list, asked: list) -> type:
    """A stand-in for kubernetes.watch.Watch: each stream plays the next script (a list of events, or
    "gone" for 410 Gone) and records the resourceVersion it was asked for."""

    class Watch:
        def stream(self, _lister, **kwargs):
            asked.append(kwargs["resource_version"])
            script = scripts.pop(0)
            if script == "gone":
                raise ob.kubernetes.client.ApiException(status=410, reason="Expired")
            yield from script

        def stop(self):
            pass

    return Watch


def test_the_template_is_bot_0s_objects_without_server_fields():
    items = [
        served("Deployment", "bot-0-stable", "bot-0", replicas=1),
        served("Service", "bot-0", "bot-0", clusterIP="10.96.0.9", clusterIPs=["10.96.0.9"], ports=[]),
        served("Deployment", "bot-01-stable", "bot-01", replicas=1),
        served("ConfigMap", "unowned", "nobody"),
    ]
    items[-1]["metadata"]["ownerReferences"] = []
    template = ob.fair_manifests(FakeCluster(items), "template", "bot-0")
    assert [(d["kind"], d["metadata"]["name"]) for d in template] == [
        ("Deployment", "bot-0-stable"),
        ("Service", "bot-0"),
    ]
    for d in template:
        assert "status" not in d and set(d["metadata"]) == {"name", "labels", "annotations"}
        assert d["metadata"]["annotations"] == {"chatfleet.io/desired-hash": "h"}
    assert template[1]["spec"] == {"ports": []}


def test_renaming_reaches_every_name_part_of_bot_0_only():
    docs = [{"metadata": {"name": "bot-0-stable", "labels": {"a": "bot-0", "b": "bot-01", "c": "xbot-0"}}}]
    (got,) = ob.renamed(docs, "bot-0", "fair-7")
    assert got["metadata"] == {
        "name": "fair-7-stable",
        "labels": {"a": "fair-7", "b": "bot-01", "c": "xbot-0"},
    }


def test_a_template_without_a_deployment_is_refused():
    with pytest.raises(RuntimeError, match="no Deployment"):
        ob.fair_manifests(FakeCluster([served("Service", "bot-0", "bot-0")]), "template", "bot-0")


def test_a_restart_is_judged_by_what_the_new_process_wrote():
    stats = {"passes": 200, "writes": {"PATCH status": 0, "APPLY Deployment": 1}}
    got = ob.restart_figures(stats, kopf_patches=1, fleet=200)
    assert got == {
        "chatbotservices": 200,
        "passes": 200,
        "writes": 2,
        "writes_by_kind": {"APPLY Deployment": 1, "kopf bookkeeping": 1},
    }
    quiet = ob.restart_figures({"passes": 200, "writes": {}}, 0, 200)
    assert quiet["writes"] == 0 and quiet["writes_by_kind"] == {"kopf bookkeeping": 0}


def test_profile_summary_shares_inclusive_and_self_time_by_function_not_line():
    collapsed = "\n".join(
        [
            "run (kopf/reactor.py:10);reconcile_pass (op/reconcile.py:5);apply (op/kube.py:7) 6",
            "run (kopf/reactor.py:10);reconcile_pass (op/reconcile.py:9) 2",
            "run (kopf/reactor.py:12);loads (json/__init__.py:3) 2",
            "not a stack line",
        ]
    )
    summary = ob.profile_summary(collapsed)
    assert summary["samples"] == 10
    assert summary["inclusive_pct"]["run (kopf/reactor.py)"] == 100.0
    assert summary["inclusive_pct"]["reconcile_pass (op/reconcile.py)"] == 80.0
    assert summary["self_pct"] == {
        "apply (op/kube.py)": 60.0,
        "reconcile_pass (op/reconcile.py)": 20.0,
        "loads (json/__init__.py)": 20.0,
    }
    assert ob.profile_summary("") == {}


def test_each_rounds_ratios_and_their_median():
    """--rounds: each round's operator / fair floor ratios per size, and the median over the rounds."""

    def row(n, ready_s, cpu_s):
        return {"chatbotservices": n, "all_ready_s": ready_s, "machine_cpu_seconds_to_ready": cpu_s}

    rounds = [
        ob.ratios([row(1000, 50.0, 100.0)], [row(1000, 100.0, 150.0)]),
        ob.ratios([row(1000, 80.0, 120.0)], [row(1000, 100.0, 180.0)]),
        ob.ratios([row(1000, 40.0, 100.0)], [row(1000, None, 190.0)]),  # the operator's row timed out
    ]
    assert rounds[0]["1000"] == {"time": 2.0, "machine_cpu": 1.5, "operator_s": 100.0, "floor_s": 50.0}
    assert rounds[2]["1000"]["time"] is None
    assert ob.median_ratios(rounds) == {"1000": {"time": 1.625, "machine_cpu": 1.5}}


def test_the_ready_count_lists_once_then_each_new_watch_resumes_and_a_gone_one_lists_again(monkeypatch):
    """The benchmark's count of Ready objects: a list in pages, then watches from its resourceVersion,
    every minute's new watch from the last version seen (a bookmark's included), so the API server never
    sends every object again; after 410 Gone, the list again."""
    asked: list[dict] = []
    listed: list[dict] = []

    def obj(name: str, rv: str, ready: bool) -> dict:
        return {
            "metadata": {"name": name, "resourceVersion": rv},
            "status": {"availableReplicas": int(ready)},
        }

    pages = [
        {"metadata": {"continue": "p2"}, "items": [obj("a", "1", True)]},
        {"metadata": {"resourceVersion": "3"}, "items": [obj("b", "2", False)]},
        {"metadata": {"resourceVersion": "10"}, "items": [obj("a", "9", True), obj("b", "2", False)]},
    ]
    scripts = [
        [{"type": "MODIFIED", "object": obj("b", "4", False)}],
        [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}}],
        "gone",
        [{"type": "MODIFIED", "object": obj("b", "11", True)}],
    ]

    def lister(**kwargs):
        listed.append({k: v for k, v in kwargs.items() if k in ("limit", "_continue")})
        return types.SimpleNamespace(data=json.dumps(pages.pop(0)))

    monkeypatch.setattr(ob.kubernetes.watch, "Watch", scripted_watch(scripts, asked))
    assert ob.count_until_ready(lister, "ns", "deployments", 2, ob.time.monotonic(), 60) is not None
    assert listed == [{"limit": 500}, {"limit": 500, "_continue": "p2"}, {"limit": 500}]
    assert asked == ["3", "4", "7", "10"]


def test_the_api_servers_figures_count_watches_started_and_closed_beside_the_events_sent():
    """A client that falls behind is closed by the API server and watches again: the watch events alone
    cannot tell that from more changes, so the watches started and the watchers closed are counted by
    resource, and the events the watch cache fanned out (each once) beside those it sent."""
    metrics = "\n".join(
        [
            "# HELP apiserver_request_total x",
            'apiserver_request_total{code="201",resource="pods",subresource="",verb="POST"} 10',
            'apiserver_request_total{code="200",resource="pods",subresource="",verb="WATCH"} 3',
            'apiserver_request_total{code="200",resource="pods",subresource="",verb="LIST"} 2',
            'apiserver_request_total{code="101",resource="pods",subresource="exec",verb="CONNECT"} 1',
            'apiserver_watch_events_total{group="",resource="pods",version="v1"} 40',
            'apiserver_watch_events_sizes_sum{group="",resource="pods",version="v1"} 4096',
            'apiserver_terminated_watchers_total{group="",resource="pods"} 2',
            'apiserver_watch_cache_events_dispatched_total{group="",resource="pods"} 20',
        ]
    )
    cluster = types.SimpleNamespace(kubectl=lambda *a: types.SimpleNamespace(stdout=metrics))
    assert ob.api_requests(cluster) == {
        "POST pods": 10,
        "WATCH STARTS pods": 3,
        "LIST pods": 2,
        "WATCH EVENTS pods": 40,
        "WATCH KiB pods": 4,
        "WATCH TERMINATED pods": 2,
        "WATCH DISPATCHED pods": 20,
    }


def test_the_custom_resource_floor_splits_the_operators_ratio_in_two():
    """--custom-resource-floor: the operator over the floor with the ChatbotServices and their status
    writes, and that floor over the fair floor; their product is the operator over the fair floor."""

    def row(n, ready_s, cpu_s):
        return {"chatbotservices": n, "all_ready_s": ready_s, "machine_cpu_seconds_to_ready": cpu_s}

    one = ob.ratios([row(1000, 50.0, 100.0)], [row(1000, 75.0, 150.0)], [row(1000, 60.0, 110.0)])["1000"]
    assert one["time"] == 1.5
    assert one["time_over_cr_floor"] == 1.25 and one["time_cr_floor_over_floor"] == 1.2
    assert one["machine_cpu_over_cr_floor"] == round(150 / 110, 3)
    assert one["cr_floor_s"] == 60.0
    median = ob.median_ratios([{"1000": one}, {"1000": one}])["1000"]
    assert set(median) == set(ob.RATIOS_WITH_CR_FLOOR)


def test_each_object_seen_ready_is_handed_on_once_even_across_a_new_list(monkeypatch):
    """The custom-resource floor writes a ChatbotService's Ready status when its Deployment is first seen
    available: once, though a 410 Gone lists every object again."""
    pages = [
        {
            "metadata": {"resourceVersion": "3"},
            "items": [{"metadata": {"name": "a"}, "status": {"availableReplicas": 1}}],
        },
        {
            "metadata": {"resourceVersion": "9"},
            "items": [{"metadata": {"name": "a"}, "status": {"availableReplicas": 1}}],
        },
    ]
    scripts = [
        "gone",
        [
            {
                "type": "ADDED",
                "object": {
                    "metadata": {"name": "b", "resourceVersion": "10"},
                    "status": {"availableReplicas": 1},
                },
            }
        ],
    ]

    monkeypatch.setattr(ob.kubernetes.watch, "Watch", scripted_watch(scripts, []))
    handed: list[str] = []
    lister = lambda **_kw: types.SimpleNamespace(data=json.dumps(pages.pop(0)))  # noqa: E731
    done = ob.count_until_ready(
        lister,
        "ns",
        "deployments",
        2,
        ob.time.monotonic(),
        60,
        lambda obj: handed.append(obj["metadata"]["name"]),
    )
    assert done is not None and handed == ["a", "b"]


def test_a_new_clusters_nodes_settle_before_a_row(monkeypatch):
    """No row pays for its cluster's start: the benchmark waits until the nodes' writes stop (fewer than
    one per hundred nodes in a window), and goes on after its limit if they never do."""
    counts = iter([100, 2500, 3600, 3605, 3605])
    monkeypatch.setattr(ob, "node_writes", lambda _cluster: next(counts))
    monkeypatch.setattr(ob.time, "sleep", lambda _s: None)
    ob.settle_nodes(object(), 1600, window_s=10)
    assert next(counts) == 3605  # stopped at 3,600 -> 3,605 (5 < 16), one reading left

    monkeypatch.setattr(ob, "node_writes", lambda _cluster: ob.time.monotonic() * 1000)
    ticks = iter(range(0, 10_000, 10))
    monkeypatch.setattr(ob.time, "monotonic", lambda: next(ticks))
    ob.settle_nodes(object(), 1600, window_s=10, limit_s=60)  # returns after its limit


def test_node_writes_count_nodes_and_their_status_not_their_leases(monkeypatch):
    monkeypatch.setattr(
        ob,
        "api_requests",
        lambda _c: {
            "PATCH nodes/status": 7,
            "PUT nodes": 2,
            "PUT leases": 50,
            "GET nodes": 9,
            "PATCH pods/status": 4,
        },
    )
    assert ob.node_writes(object()) == 9


def test_the_profiles_are_compared_pairwise_for_each_size_with_two_rows(monkeypatch, tmp_path):
    """--apiserver-profile: for each size, every pair of profiled rows (operator, custom-resource floor,
    fair floor) compared, then each row alone; a size with one row profiled gets no file."""
    monkeypatch.setattr(ob, "RESULTS", tmp_path)
    monkeypatch.setattr(ob, "REPO", tmp_path)
    monkeypatch.setattr(
        ob,
        "PROFILED_ROWS",
        {
            "operator-10": tmp_path / "o",
            "crfloor-10": tmp_path / "c",
            "fair-10": tmp_path / "f",
            "fair-20": tmp_path / "f2",
        },
    )
    calls = []
    monkeypatch.setattr(
        ob, "top", lambda p, base=None, cumulative=False: calls.append((p.name, base and base.name)) or ""
    )
    assert ob.write_profile_comparisons([10, 20]) == ["apiserver-profile-10.txt"]
    text = (tmp_path / "apiserver-profile-10.txt").read_text()
    assert text.count("more than") == 3 and "the operator's row, more than the fair floor's row" in text
    assert ("o", "c") in calls and ("c", "f") in calls and ("o", "f") in calls and ("f", None) in calls


def test_a_refused_profile_is_raised_where_the_profiled_block_ends(tmp_path):
    """--apiserver-profile on an API server without /debug/pprof: the slices' thread fails, and the error
    (naming CHATFLEET_APISERVER_PROFILING) is raised when the row's block ends, not lost with the thread."""
    import apiserver_profile

    profile = apiserver_profile.ApiServerProfile(Path("/bin/false"), {}, tmp_path / "row")
    with pytest.raises(RuntimeError, match="CHATFLEET_APISERVER_PROFILING"), profile:
        profile._thread.join(timeout=5)
    assert profile.slices == []


def test_reading_profiles_without_go_names_what_is_missing(monkeypatch):
    import apiserver_profile

    monkeypatch.setattr(apiserver_profile.shutil, "which", lambda _name: None)
    with pytest.raises(RuntimeError, match="Go is needed"):
        apiserver_profile.go()


def test_a_floors_rows_delete_their_namespaces_only_on_a_shared_cluster(monkeypatch):
    """One loop runs every floor's rows: on the cluster the operator's rows reuse, each row's namespace is
    deleted after it; on a cluster of their own (--fresh-cluster, rounds), none is."""
    deleted: list[str] = []
    monkeypatch.setattr(ob, "delete_namespace", lambda _cluster, ns: deleted.append(ns))
    row = lambda _cluster, _template, n, _tmp, _timeout: {"chatbotservices": n, "namespace": f"x-{n}"}  # noqa: E731
    args = types.SimpleNamespace(custom_resource_floor=True)
    assert [key for key, _, _ in ob.floors_of(args)] == ["fair_floor", "custom_resource_floor"]
    rows = ob.floor_rows(object(), row, "x", None, [200, 1000], None, 60, delete=True)
    assert [r["chatbotservices"] for r in rows] == [200, 1000] and deleted == ["x-200", "x-1000"]
    ob.floor_rows(object(), row, "x", None, [200], None, 60, delete=False)
    assert deleted == ["x-200", "x-1000"]
    assert [key for key, _, _ in ob.floors_of(types.SimpleNamespace(custom_resource_floor=False))] == [
        "fair_floor"
    ]
