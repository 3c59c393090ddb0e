"""Cluster-level defaults that follow the operator (chatfleet_operator.defaults), not the CRD.

Test design: the effective spec is a pure function, checked on the cases a stored object can be in (field
absent, the old CRD's stored default, its own value); then through a real pass context (gather_context)
with the operator's settings: what the pods are built with, and the update revision, which decides
whether an operator upgrade starts a release.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from chatfleet_operator.builders.deployment import build_deployment
from chatfleet_operator.cache import Snapshot
from chatfleet_operator.defaults import IMAGE, LEGACY_STORED, PROMETHEUS, ClusterDefaults, effective_spec
from chatfleet_operator.reconcile import gather_context
from chatfleet_operator.settings import RuntimeSettings, Settings
from operator_helpers import cbs_body

NOW = datetime(2026, 11, 27, tzinfo=UTC)
MODEL = {"model": {"uri": "hf://org/model"}}
OLD_IMAGE, OLD_PROM = LEGACY_STORED[IMAGE], LEGACY_STORED[PROMETHEUS]
NEW = ClusterDefaults(runtime_image="registry.example/rt:0.2.0", prometheus_address="https://prom.example")


@pytest.mark.parametrize(
    ("spec", "image", "prometheus"),
    [
        pytest.param(MODEL, NEW.runtime_image, NEW.prometheus_address, id="absent"),
        pytest.param(
            {**MODEL, "runtime": {"image": OLD_IMAGE}, "analysis": {"prometheusAddress": OLD_PROM}},
            NEW.runtime_image,
            NEW.prometheus_address,
            id="stored-by-the-old-crd",
        ),
        pytest.param(
            {
                **MODEL,
                "runtime": {"image": "mine/rt:1"},
                "analysis": {"prometheusAddress": "http://p.team.svc:9090"},
            },
            "mine/rt:1",
            "http://p.team.svc:9090",
            id="its-own",
        ),
        pytest.param(
            {**MODEL, "runtime": {"image": ""}}, NEW.runtime_image, NEW.prometheus_address, id="empty"
        ),
    ],
)
def test_what_follows_the_operator(spec, image, prometheus):
    before = repr(spec)
    out = effective_spec(spec, NEW)
    assert (out["runtime"]["image"], out["analysis"]["prometheusAddress"]) == (image, prometheus)
    assert repr(spec) == before  # a copy: the object as read is left alone


def settings(defaults: ClusterDefaults) -> Settings:
    return replace(Settings(), runtime=replace(RuntimeSettings(), defaults=defaults))


def context(spec, defaults: ClusterDefaults):
    return gather_context(cbs_body(spec), Snapshot(), settings(defaults), NOW, "ReplicaRatio")


def test_pods_run_the_operators_image_when_the_spec_names_none():
    ctx = context(MODEL, NEW)
    dep = build_deployment(ctx.ref, ctx.spec, ctx.settings.pod, revision=ctx.update_revision)
    assert {c["image"] for c in dep["spec"]["template"]["spec"]["containers"]} == {NEW.runtime_image}
    assert ctx.spec.analysis.prometheus_address == NEW.prometheus_address


def test_an_object_stored_by_the_old_crd_keeps_its_revision_while_the_defaults_stay():
    """Upgrading to an operator whose defaults equal what the old CRD stored starts no release."""
    stored = {**MODEL, "runtime": {"image": OLD_IMAGE}, "analysis": {"prometheusAddress": OLD_PROM}}
    same = ClusterDefaults()
    assert context(stored, same).update_revision == context(MODEL, same).update_revision
    from chatfleet_operator.builders import revision_hash

    assert context(stored, same).update_revision == revision_hash(stored)  # as the old operator hashed it


def test_a_new_default_image_is_a_new_revision_for_the_fleets_that_follow_it_only():
    old, new = ClusterDefaults(), replace(ClusterDefaults(), runtime_image="registry.example/rt:0.2.0")
    assert context(MODEL, old).update_revision != context(MODEL, new).update_revision  # a release
    own = {**MODEL, "runtime": {"image": "mine/rt:1"}}
    assert context(own, old).update_revision == context(own, new).update_revision  # untouched


def test_the_flags_set_the_defaults_and_refuse_a_bad_address():
    from chatfleet_operator.cli import build_settings, parse_args

    s = build_settings(parse_args(["run", "--runtime-image=r/rt:3", "--prometheus-address=https://p:1"]))
    assert s.runtime.defaults == ClusterDefaults("r/rt:3", "https://p:1")
    with pytest.raises(SystemExit, match="--prometheus-address"):
        build_settings(parse_args(["run", "--prometheus-address=prom:9090"]))
