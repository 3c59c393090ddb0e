"""The quality gate in a pass: golden prompts asked of one pod per track, scored, combined with the metrics.

Test design: the same release as test_release_pass.py (a canary of v2 over stable v1), a fake Prometheus
that always finds perfect HTTP metrics, and `ask_all` replaced by a function that answers by pod address,
so a canary whose answers differ from stable's is caught on quality alone. Tick by tick, as a pass runs.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from chatfleet_operator.analysis import assess as a
from chatfleet_operator.analysis import quality
from chatfleet_operator.analysis.assess import Measurement, Sample, combine
from chatfleet_operator.converge.facts import PodFacts, Track
from chatfleet_operator.release import measure
from chatfleet_operator.release.measure import Releases, answering_pod
from chatfleet_operator.release.state import ReleaseState
from chatfleet_operator.release.strategy import Verdict, analysis_hold
from chatfleet_operator.spec import ChatbotServiceSpec, QualitySpec
from pass_helpers import NOW
from test_release_pass import NEW, OLD, FakeProvider, children_and_rev, run

GOLDEN = {
    "enabled": True,
    "prompts": [
        {"name": "refund", "prompt": "Our refund window?", "expect": {"contains": ["30 days"]}},
        {"name": "hello", "prompt": "Hello!"},
    ],
}
PERFECT_METRICS = FakeProvider(lambda now: Sample(now, 5.0, {"error rate": 0.0}, {"error rate": 0.0}))


def with_quality(raw, **extra):
    return {**raw, "analysis": {**raw["analysis"], "failureLimit": 2, "quality": {**GOLDEN, **extra}}}


asked_prompts: list[list[str]] = []
"""The prompt names of each ask_all call (cleared by the tests that read it)."""


def answers_by_ip(table, asked):
    """An ask_all that answers from `table[ip]` (a function of the prompt) and records who was asked."""

    def ask_all(url, model, prompts, **kw):
        ip = url.split("//")[1].split(":")[0]
        asked.append((ip, kw["max_tokens"], kw["seed"]))
        asked_prompts.append([p.name for p in prompts])
        return [quality.Answer(table[ip](p.prompt)) for p in prompts]

    return ask_all


def good(prompt):
    return "Refunds within 30 days." if "refund" in prompt else "Hi! How can I help?"


def broken(prompt):  # what a broken chat template gives: fluent, 200, wrong
    return "<|im_start|>assistant <|im_start|>assistant"


def release_passes(
    monkeypatch, canary_answers, runtime=None, stable_pod_ticks=None, config_maps=None, **quality_extra
):
    """Run the release tick by tick (each at the next analysis time) and return the plans."""
    asked = []
    monkeypatch.setattr(
        measure, "ask_all", answers_by_ip({"10.0.0.1": good, "10.0.0.2": canary_answers}, asked)
    )
    read = (lambda ns, name: config_maps.get((ns, name))) if config_maps is not None else None
    releases = Releases(provider=PERFECT_METRICS, read_config_map=read)
    old, new = with_quality(OLD, **quality_extra), with_quality(NEW, **quality_extra)
    if runtime:
        old, new = ({**raw, "runtime": {**raw.get("runtime", {}), **runtime}} for raw in (old, new))
    children, old_rev = children_and_rev(old)
    out = run(releases, new, children, [], {"stableRevision": old_rev}, NOW)
    new_rev = out.plan.release.revision
    children.update({(m["kind"], m["metadata"]["name"]): m for m in out.desired})
    pods = [
        PodFacts("bot-s", old_rev, "stable", "Running", True, ip="10.0.0.1"),
        PodFacts("bot-c", new_rev, "canary", "Running", True, ip="10.0.0.2"),
    ]
    status = {"stableRevision": old_rev, "release": out.plan.release.to_status()}
    plans = []
    for i, tick in enumerate((1, 21, 31, 41)):
        seen = pods if stable_pod_ticks is None or i < stable_pod_ticks else pods[1:]
        out = run(releases, new, children, seen, status, NOW + timedelta(seconds=tick))
        plans.append(out.plan)
        status = {"stableRevision": old_rev, "release": out.plan.release.to_status()}
    return plans, asked


def test_a_canary_with_perfect_metrics_and_wrong_answers_is_rolled_back_in_two_intervals(monkeypatch):
    plans, asked = release_passes(monkeypatch, broken)
    # tick 1: canary Ready, analysis from 20 s later; tick 21: 1st check fails on quality alone
    first = plans[1].release.analysis
    assert first["failed"] == 1 and first["lastVerdict"] == "Failed", first
    assert "answer agreement" in first["lastMessage"] and "garbled answers 100%" in first["lastMessage"]
    assert "refund: contains '30 days'" in first["lastMessage"]
    metrics = {f["metric"] for f in first["figures"]}
    assert {"error rate", "answer agreement", "expectations passed", "garbled answers"} <= metrics
    # tick 31: 2nd failure -> rolled back (failureLimit 2), within 2 analysis intervals
    assert plans[2].release.phase == "RolledBack" and plans[2].release.analysis["failed"] == 2, plans[
        2
    ].release
    # each track asked once per interval, greedy with the spec's seed and max tokens
    assert sorted(asked[:2]) == [("10.0.0.1", 32, 0), ("10.0.0.2", 32, 0)]


def test_a_canary_that_answers_as_stable_does_passes(monkeypatch):
    plans, _ = release_passes(monkeypatch, good)
    for plan in plans[1:]:
        assert plan.release.analysis["failed"] == 0, plan.release.analysis
    last = plans[-1].release.analysis
    assert last["lastVerdict"] == "Successful" and "answer agreement 100%" in last["lastMessage"]


def test_compare_with_stable_off_keeps_the_expectations(monkeypatch):
    def new_weights(prompt):  # other words, same facts: agreement is not asked, expectations still hold
        return "You have 30 days to ask for a refund." if "refund" in prompt else "Hello there."

    plans, _ = release_passes(monkeypatch, new_weights, compareWithStable=False)
    last = plans[-1].release.analysis
    assert last["failed"] == 0 and "answer agreement" not in last["lastMessage"], last

    def forgot(prompt):
        return "Ask support." if "refund" in prompt else "Hello there."

    plans, _ = release_passes(monkeypatch, forgot, compareWithStable=False)
    assert plans[1].release.analysis["failed"] == 1
    assert "expectations passed 0% < 100%" in plans[1].release.analysis["lastMessage"]


def test_no_ready_pod_to_ask_is_inconclusive_never_a_pass():
    m = Releases(provider=PERFECT_METRICS)
    track = Track("r1", 1, 0, (PodFacts("c", "r1", "canary", "Running", False, ip="10.0.0.9"),), True)
    assert answering_pod(track) is None
    standby = PodFacts("b", "r1", "stable", "Running", True, serving="false", ip="10.0.0.3")
    serving = PodFacts("c", "r1", "stable", "Running", True, ip="10.0.0.4")
    old_rev = PodFacts("a", "r0", "stable", "Running", True, ip="10.0.0.5")
    assert answering_pod(Track("r1", 3, 2, (standby, serving, old_rev), True)) == serving
    assert m is not None


@pytest.mark.parametrize(
    ("first", "second", "verdict"),
    [
        pytest.param(a.SUCCESSFUL, a.FAILED, a.FAILED, id="a quality failure fails good metrics"),
        pytest.param(a.FAILED, a.SUCCESSFUL, a.FAILED, id="a metrics failure fails good answers"),
        pytest.param(a.INCONCLUSIVE, a.SUCCESSFUL, a.INCONCLUSIVE, id="answers alone never pass"),
        pytest.param(a.ERROR, a.SUCCESSFUL, a.ERROR, id="an error stays an error"),
        pytest.param(a.ERROR, a.FAILED, a.FAILED, id="a failure outranks an error"),
        pytest.param(a.SUCCESSFUL, a.SUCCESSFUL, a.SUCCESSFUL, id="both pass"),
    ],
)
def test_combine_takes_the_worse_verdict_and_both_figures(first, second, verdict):
    f1 = a.Figure("error rate", 0.0, 0.0, 1.0, "%", first != a.FAILED)
    f2 = a.Figure("answer agreement", 50.0, None, 100.0, "%", second != a.FAILED)
    m = combine(Measurement(NOW, first, "m1", (f1,)), Measurement(NOW, second, "m2", (f2,)))
    assert m.verdict == verdict and m.figures == (f1, f2)
    worse = "m1" if first == verdict else "m2"
    assert m.message.startswith(worse)


def test_spec_parses_the_quality_gate_and_refuses_a_bad_regex_by_field():
    spec = ChatbotServiceSpec.from_dict(
        {
            "analysis": {
                "quality": {
                    **GOLDEN,
                    "maxTokens": 16,
                    "thresholds": {"minAgreementPercent": 90, "maxLengthDriftPercent": 25},
                    "prompts": [
                        *GOLDEN["prompts"],
                        {"name": "json", "prompt": "{}", "expect": {"regex": "("}},
                    ],
                }
            }
        }
    )
    q = spec.analysis.quality
    assert q.enabled and q.max_tokens == 16 and len(q.prompts) == 3
    assert q.prompts[0].expect.contains == ("30 days",)
    checks = {c.name: c for c in quality.checks_of(q)}
    assert checks["answer agreement"].min_value == 90 and checks["answer length drift"].max_value == 25
    assert quality.spec_errors(q) == [
        "spec.analysis.quality.prompts[2].expect.regex is not a valid regular expression: "
        "missing ), unterminated subpattern at position 0"
    ]
    assert "answer agreement" not in {
        c.name for c in quality.checks_of(QualitySpec(compare_with_stable=False))
    }


def test_a_bad_regex_is_an_error_measurement_that_names_the_field(monkeypatch):
    monkeypatch.setattr(measure, "ask_all", lambda *a, **k: pytest.fail("asked despite a refused spec"))
    plans, _ = release_passes(
        monkeypatch, good, prompts=[{"name": "x", "prompt": "hi", "expect": {"regex": "("}}]
    )
    last = plans[1].release.analysis
    assert last["lastVerdict"] == "Error" and "prompts[0].expect.regex" in last["lastMessage"], last


def test_max_tokens_is_capped_at_the_runtimes_limit(monkeypatch):
    """The runtime refuses max_tokens over spec.runtime.maxNewTokens (HTTP 400 for every prompt, so stable
    'answered none' and every interval was an Error on real pods): the gate asks for at most that."""
    _, asked = release_passes(monkeypatch, good, runtime={"maxNewTokens": 8})
    assert asked and {m for _, m, _ in asked} == {8}, asked


def test_a_step_without_stable_pods_is_judged_against_stables_kept_answers(monkeypatch):
    """At the replica ratio's 100 % stable has no pod to ask: its answers of an earlier interval (same
    revision, same prompts) stand in, so the last step is judged, not Inconclusive until the deadline."""
    plans, asked = release_passes(monkeypatch, broken, stable_pod_ticks=2)
    # tick 21 asks both; at tick 31 stable has no pod: only the canary is asked, and it still fails
    assert [ip for ip, _, _ in asked[2:]] == ["10.0.0.2"], asked
    assert plans[2].release.phase == "RolledBack" and plans[2].release.analysis["failed"] == 2, plans[2]


def test_without_stable_pods_or_kept_answers_the_gate_is_inconclusive(monkeypatch):
    plans, _ = release_passes(monkeypatch, broken, stable_pod_ticks=0)
    last = plans[-1].release.analysis
    assert last["lastVerdict"] == "Inconclusive" and "none of its answers kept" in last["lastMessage"], last


PROMPTS_YAML = """
- name: refund
  prompt: Our refund window?
  expect: {contains: ["30 days"]}
- name: hello
  prompt: Hello!
"""


def test_prompts_from_a_config_map_gate_the_release_like_inline_ones(monkeypatch):
    asked_prompts.clear()
    maps = {("ns", "golden"): {"prompts.yaml": PROMPTS_YAML}}
    source = {"prompts": None, "promptsFrom": {"configMapName": "golden"}}
    plans, _ = release_passes(monkeypatch, broken, config_maps=maps, **source)
    assert plans[2].release.phase == "RolledBack", plans[2].release
    assert "refund: contains '30 days'" in plans[1].release.analysis["lastMessage"]
    assert asked_prompts[0] == ["refund", "hello"], asked_prompts
    plans, _ = release_passes(monkeypatch, good, config_maps=maps, **source)
    assert plans[-1].release.analysis["lastVerdict"] == "Successful", plans[-1].release.analysis


@pytest.mark.parametrize(
    ("maps", "why"),
    [
        pytest.param(
            {}, "(ConfigMap 'golden', key 'prompts.yaml'): the ConfigMap does not exist", id="no map"
        ),
        pytest.param(
            {("ns", "golden"): {"other": "[]"}},
            "the ConfigMap has no key 'prompts.yaml' (keys: other)",
            id="no key",
        ),
        pytest.param(
            {("ns", "golden"): {"prompts.yaml": "- name: x\n  promt: hi\n"}},
            "key 'prompts.yaml')[0].promt is not a field of a golden prompt",
            id="a typo",
        ),
    ],
)
def test_a_config_map_that_cannot_give_prompts_is_an_error_naming_the_field(monkeypatch, maps, why):
    monkeypatch.setattr(measure, "ask_all", lambda *a, **k: pytest.fail("asked without valid prompts"))
    plans, _ = release_passes(
        monkeypatch, good, config_maps=maps, prompts=None, promptsFrom={"configMapName": "golden"}
    )
    for plan in plans[1:]:  # an Error every interval: never a pass, never a failure
        last = plan.release.analysis
        assert last["lastVerdict"] == "Error" and last["failed"] == 0, last
    assert "spec.analysis.quality.promptsFrom" in last["lastMessage"] and why in last["lastMessage"], last


@pytest.mark.parametrize(
    ("message", "says", "hint"),
    [
        pytest.param(
            "golden prompts: no Ready pod of the canary to ask yet",
            "no Ready pod of the canary",
            False,
            id="gate",
        ),
        pytest.param("no traffic on the canary in the analysis window", "no traffic", True, id="no traffic"),
    ],
)
def test_a_paused_release_says_why_the_analysis_is_inconclusive(message, says, hint):
    """The pause names what the measurement said (before: always "no traffic on the canary", also when
    only the golden prompts had no pod to ask)."""
    rel = ReleaseState(revision="r2", analysis={"lastVerdict": "Inconclusive", "lastMessage": message})
    gate = analysis_hold(rel, Verdict())
    assert gate is not None and says in gate.message, gate
    assert ("send traffic or enable spec.analysis.probe" in gate.message) is hint, gate
