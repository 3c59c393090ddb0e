"""The shadow phase in a pass: mirrored requests compared with stable's answers before any weight.

Test design: a canary release of v2 over stable v1 (4 replicas) with spec.analysis.quality.shadow, behind an
HTTPRoute; a fake Prometheus that always finds perfect HTTP metrics; the canary pod's shadow records and
stable's answers replaced by functions (`take_records`, `ask_records`), so a canary whose answers differ
is caught on the mirrored requests alone -- while its route weight never leaves 0. Tick by tick, as passes run.
"""

from __future__ import annotations

import copy
from datetime import timedelta
from types import SimpleNamespace

from chatfleet_operator.analysis import quality, shadow
from chatfleet_operator.analysis.assess import Sample
from chatfleet_operator.cache import Snapshot
from chatfleet_operator.converge.facts import PodFacts
from chatfleet_operator.reconcile import gather_context
from chatfleet_operator.release import measure
from chatfleet_operator.release.children import desired_children, plan_pass
from chatfleet_operator.release.measure import Releases
from chatfleet_operator.settings import ReleaseSettings, Settings
from pass_helpers import NOW, REF
from test_release_pass import FakeProvider

OLD = {
    "model": {"uri": "hf://org/m", "revision": "v1"},
    "scaling": {"replicas": 4},
    "analysis": {
        "intervalSeconds": 10,
        "failureLimit": 2,
        "quality": {
            "shadow": {"enabled": True, "percent": 25, "minRequests": 3, "comparisonsPerInterval": 2}
        },
    },
}
NEW = {**OLD, "model": {"uri": "hf://org/m", "revision": "v2"}}
PERFECT_METRICS = FakeProvider(lambda now: Sample(now, 5.0, {"error rate": 0.0}, {"error rate": 0.0}))


def context(
    raw, *, children=None, pods=(), status=None, now=NOW, traffic="HTTPRoute", mirror="RequestMirror"
):
    meta = {"namespace": REF.namespace, "name": REF.name, "uid": REF.uid, "generation": REF.generation}
    body = {"metadata": meta, "spec": copy.deepcopy(raw), "status": dict(status or {})}
    settings = Settings(release=ReleaseSettings(gateway_mirror=mirror))
    return gather_context(
        body, Snapshot(children=dict(children or {}), pods=list(pods)), settings, now, traffic
    )


def run(releases, raw, children, pods, status, now, **kw):
    ctx = releases.measure_if_due(context(raw, children=children, pods=pods, status=status, now=now, **kw))
    plan = plan_pass(ctx)
    return SimpleNamespace(
        plan=plan, desired={(m["kind"], m["metadata"]["name"]): m for m in desired_children(ctx, plan)}
    )


def record(i, text):
    return shadow.Record(i, ({"role": "user", "content": f"question {i}"},), 32, text)


def weighted_rule(desired):
    return desired[("HTTPRoute", "bot")]["spec"]["rules"][-1]


def canary_weight(desired):
    refs = weighted_rule(desired)["backendRefs"]
    return sum(r["weight"] for r in refs if r["name"] == "bot-canary")


def release(
    monkeypatch, canary_text, *, ticks=(1, 21, 31, 41, 51), mirror="RequestMirror", traffic="HTTPRoute"
):
    """Run the release tick by tick; the canary pod gives two new records per interval. Returns the passes
    and what stable was asked."""
    counter, asked = iter(range(1, 100)), []

    def take(url, timeout_seconds=5.0):
        assert url == "http://10.0.0.2:8082/shadow/records"  # the admin port
        return [record(i, canary_text(i)) for i in (next(counter), next(counter))], 0, None

    def ask(url, model, records, **kw):
        asked.append((url, [r.id for r in records], kw["seed"]))
        return [quality.Answer(f"Answer to question {r.id}.") for r in records]

    monkeypatch.setattr(measure, "take_records", take)
    monkeypatch.setattr(measure, "ask_records", ask)
    releases = Releases(provider=PERFECT_METRICS)
    old_ctx = context(OLD, traffic=traffic, mirror=mirror)
    children = {(m["kind"], m["metadata"]["name"]): m for m in desired_children(old_ctx, plan_pass(old_ctx))}
    old_rev = old_ctx.update_revision
    out = run(releases, NEW, children, [], {"stableRevision": old_rev}, NOW, mirror=mirror, traffic=traffic)
    passes = [out]
    new_rev = out.plan.release.revision
    children.update(out.desired)
    pods = [
        PodFacts("bot-s", old_rev, "stable", "Running", True, ip="10.0.0.1"),
        PodFacts("bot-c", new_rev, "canary", "Running", True, ip="10.0.0.2"),
    ]
    status = {"stableRevision": old_rev, "release": out.plan.release.to_status()}
    for tick in ticks:
        out = run(
            releases,
            NEW,
            children,
            pods,
            status,
            NOW + timedelta(seconds=tick),
            mirror=mirror,
            traffic=traffic,
        )
        passes.append(out)
        children.update(out.desired)
        status = {"stableRevision": old_rev, "release": out.plan.release.to_status()}
    return passes, asked


def good(i):
    return f"Answer to question {i}."


def broken(i):  # a broken chat template: fluent, 200, wrong
    return "<|im_start|>assistant <|im_start|>assistant"


def test_the_release_starts_in_a_shadow_phase_at_weight_0_with_a_mirror(monkeypatch):
    passes, _ = release(monkeypatch, good, ticks=(1,))
    out = passes[0]
    rel = out.plan.release
    assert rel.phase == "Shadowing" and rel.shadow_started_at == "2026-11-21T10:00:00Z"
    assert out.plan.canary_replicas == 1 and out.plan.stable_replicas == 4  # 25 % of 4 pods, surge
    assert canary_weight(out.desired) == 0
    # no mirror before a canary pod is Ready (a mirror without endpoints can fail the users' rule)
    assert "filters" not in weighted_rule(out.desired)
    out = passes[1]
    assert weighted_rule(out.desired)["filters"] == [
        {
            "type": "RequestMirror",
            "requestMirror": {"backendRef": {"name": "bot-canary", "port": 8081}, "percent": 25},
        }
    ]
    ports = {p["name"]: p["port"] for p in out.desired[("Service", "bot-canary")]["spec"]["ports"]}
    assert ports == {"chat": 8080, "shadow": 8081} and "shadow" not in {
        p["name"] for p in out.desired[("Service", "bot")]["spec"]["ports"]
    }


def test_a_canary_that_answers_as_stable_passes_the_shadow_phase_then_takes_its_first_weight(monkeypatch):
    passes, asked = release(monkeypatch, good)
    # tick 21: 2 pairs < minRequests 3 -> inconclusive, still shadowing, weight 0
    first = passes[2].plan.release
    assert first.phase == "Shadowing" and first.analysis["lastVerdict"] == "Inconclusive", first.analysis
    assert "2 of the 3 mirrored requests needed" in first.analysis["lastMessage"]
    # tick 31: 4 pairs -> passed: step 1 (weight 10) with no mirror, an event says so
    after = passes[3]
    rel = after.plan.release
    assert (
        rel.phase == "Progressing" and rel.step_index == 0 and rel.shadow_passed_at == "2026-11-21T10:00:31Z"
    )
    assert "shadow answer agreement 100%" in rel.analysis["lastMessage"]
    assert [e.reason for e in after.plan.events] == ["ShadowPassed"]
    assert "filters" not in weighted_rule(after.desired) and canary_weight(after.desired) == 10
    # stable asked the records' messages, comparisonsPerInterval at a time, greedy with the spec's seed
    assert asked[:2] == [
        ("http://10.0.0.1:8080/v1/chat/completions", [1, 2], 0),
        ("http://10.0.0.1:8080/v1/chat/completions", [3, 4], 0),
    ]


def test_a_canary_with_wrong_answers_is_rolled_back_in_the_shadow_phase_without_ever_taking_weight(
    monkeypatch,
):
    passes, _ = release(monkeypatch, broken)
    phases = [p.plan.release.phase for p in passes]
    assert phases[:4] == ["Shadowing"] * 4 and phases[4] == "RolledBack", phases
    rel = passes[4].plan.release
    assert rel.analysis["failed"] == 2 and "shadow garbled answers 100%" in rel.message, rel.message
    assert rel.shadow_passed_at is None
    # stable has 1 of its 4 pods Ready here: a canary that answered users would cover the rest (weight
    # 50); this one answered none, so it covers nothing (its pod only outlives the route change)
    assert passes[4].plan.canary_weight == 0
    assert all(canary_weight(p.desired) == 0 for p in passes), [canary_weight(p.desired) for p in passes]


def test_traefik_mirror_routes_through_a_traefik_service_while_shadowing_only(monkeypatch):
    passes, _ = release(monkeypatch, good, mirror="TraefikService")
    shadowing = passes[1].desired
    assert weighted_rule(shadowing)["backendRefs"] == [
        {"group": "traefik.io", "kind": "TraefikService", "name": "bot-mirror", "weight": 100}
    ]
    ts = shadowing[("TraefikService", "bot-mirror")]
    assert ts["apiVersion"] == "traefik.io/v1alpha1" and ts["spec"]["mirroring"] == {
        "name": "bot",
        "port": 8080,
        "mirrors": [{"name": "bot-canary", "port": 8081, "percent": 25}],
    }
    after = passes[3].desired  # shadow passed: the route is the weighted split again, the mirror object gone
    assert passes[3].plan.release.phase == "Progressing"
    assert ("TraefikService", "bot-mirror") not in after and canary_weight(after) == 10


def test_without_gateway_api_the_release_waits_with_no_canary_pod_and_says_why(monkeypatch):
    passes, _ = release(monkeypatch, good, ticks=(1, 21), traffic="ReplicaRatio")
    for p in passes:
        assert p.plan.release.phase == "Shadowing" and p.plan.canary_replicas == 0
        assert p.plan.gate.reason == "ShadowNeedsGatewayAPI"
        assert "spec.analysis.quality.shadow" in p.plan.gate.message


def test_too_few_pairs_stay_inconclusive_and_a_pass_needs_enough():
    pairs = [(record(i, good(i)), quality.Answer(good(i))) for i in range(2)]
    m = shadow.too_few(NOW, pairs, 3, 5)
    assert m.verdict == "Inconclusive" and "(5 waiting)" in m.message
    assert shadow.too_few(NOW, [*pairs, (record(9, "x"), quality.Answer(None, "HTTP 503"))], 3, 0) is not None
    assert shadow.too_few(NOW, [*pairs, (record(9, "x"), quality.Answer("y"))], 3, 0) is None


def test_records_of_reads_the_pods_answer_and_leaves_malformed_entries_out():
    payload = {
        "records": [
            {"id": 1, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "answer": "Hello"},
            {
                "id": 2,
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 16,
                "answer": None,
                "error": "HTTP 500",
            },
            {"id": 3, "messages": []},
            "junk",
        ],
        "overflowed": 4,
    }
    records, overflowed = shadow.records_of(payload)
    assert [r.id for r in records] == [1, 2] and overflowed == 4
    assert shadow.canary_answer(records[1]) == quality.Answer(None, "HTTP 500")
    assert shadow.request_body("bot", records[0], 7) == {
        "model": "bot",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 16,
        "temperature": 0,
        "seed": 7,
        "stream": False,
    }
    assert shadow.records_of(None) == ([], 0)


def test_compare_with_stable_off_leaves_agreement_out_of_the_shadow_gates():
    from chatfleet_operator.spec import QualitySpec

    names = [c.name for c in shadow.checks_of(QualitySpec(compare_with_stable=False))]
    assert shadow.AGREEMENT not in names and shadow.GARBLED in names


def test_the_mirror_and_the_shadow_clock_wait_for_the_gateway_to_read_the_canary_pods_endpoint(monkeypatch):
    """A pod just turned Ready is not yet among the endpoints the gateway reads; the mirror (and the shadow
    analysis's clock) starts once it has been Ready route_join_seconds (3 s), as a step's weight does, and
    the pass comes back by then."""
    from chatfleet_operator.timefmt import rfc3339

    monkeypatch.setattr(measure, "take_records", lambda url, timeout_seconds=5.0: ([], 0, None))
    releases = Releases(provider=PERFECT_METRICS)
    old_ctx = context(OLD)
    children = {(m["kind"], m["metadata"]["name"]): m for m in desired_children(old_ctx, plan_pass(old_ctx))}
    old_rev = old_ctx.update_revision
    first = run(releases, NEW, children, [], {"stableRevision": old_rev}, NOW)
    children.update(first.desired)
    status = {"stableRevision": old_rev, "release": first.plan.release.to_status()}
    ready_at = NOW + timedelta(seconds=10)
    pods = [
        PodFacts("bot-s", old_rev, "stable", "Running", True, ip="10.0.0.1"),
        PodFacts(
            "bot-c",
            first.plan.release.revision,
            "canary",
            "Running",
            True,
            ip="10.0.0.2",
            ready_since=rfc3339(ready_at),
        ),
    ]
    young = run(releases, NEW, children, pods, status, ready_at + timedelta(seconds=1))
    assert "filters" not in weighted_rule(young.desired)
    assert young.plan.release.canary_ready_at is None
    assert young.plan.requeue_after <= 2.0  # looked at again once the pod has joined
    joined = run(releases, NEW, children, pods, status, ready_at + timedelta(seconds=3))
    assert weighted_rule(joined.desired)["filters"][0]["type"] == "RequestMirror"
    assert joined.plan.release.canary_ready_at is not None
