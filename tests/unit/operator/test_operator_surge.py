"""spec.scaling.autoscale.surge: the warm pool sized for a declared surge.

Test design: `surge_pool` on a table (the standbys a factor asks for, maxReplicas, a load that fits, a
decision that is too slow); then passes through the fake API client: the stable Deployment runs the
serving replicas plus the surge's standbys, the Service selects serving pods only, and status says how
many and why.
"""

from __future__ import annotations

import pytest
from chatfleet_operator import api
from chatfleet_operator.autoscale.warmpool import surge_pool
from chatfleet_operator.cache import Snapshot, World
from chatfleet_operator.reconcile import reconcile_pass
from chatfleet_operator.settings import Settings
from chatfleet_operator.spec import ScalingSpec, SloSpec, SurgeSpec
from operator_helpers import cbs_body
from test_operator_autoscale import scaling
from test_operator_reconcile import NODES, NOW, FakeClient

SURGE = SurgeSpec(factor=5, within_seconds=10)


def test_the_spec_parses_and_turns_the_pool_on():
    s = ScalingSpec.from_dict({"autoscale": {"surge": {"factor": 5}}})
    assert s.autoscale is not None and s.autoscale.surge == SURGE and s.pooled and s.warm_pool == 0
    assert not ScalingSpec.from_dict({"autoscale": {}}).pooled


@pytest.mark.parametrize(
    "serving, max_replicas, load, slo, standby, said",
    [
        (2, 13, 40.0, None, 8, "5x within 10 s of 2 serving: 8 more loaded ahead (model load 40 s)"),
        (12, 13, 40.0, None, 1, "48 more loaded ahead (model load 40 s), 1 within maxReplicas 13"),
        (13, 13, 40.0, None, 0, "0 within maxReplicas 13"),
        (2, 13, None, None, 8, "model load not measured yet"),
        (2, 13, 3.0, SloSpec(400, 2), 0, "a decision (3 s) and a model load (3 s) fit in it"),
        (2, 13, 3.0, None, 8, "the decision to grow takes about 30 s (the HPA's sync"),
    ],
)
def test_the_standbys_a_surge_asks_for(serving, max_replicas, load, slo, standby, said):
    pool = surge_pool(SURGE, serving, max_replicas, load, slo)
    assert pool.standby == standby and said in pool.reason


SPEC = {
    "model": {"uri": "hf://a/b"},
    "analysis": {"prometheusAddress": "http://prometheus.monitoring.svc:9090"},
    "scaling": {
        "replicas": 2,
        "autoscale": {
            "minReplicas": 2,
            "maxReplicas": 10,
            "targets": {"inFlightRequests": 4},
            "warmPool": {"replicas": 1},
            "surge": {"factor": 3, "withinSeconds": 10},
        },
    },
}


def test_a_pass_runs_the_surges_standbys_beside_the_serving_pods():
    client, snap, body = FakeClient(), Snapshot(nodes=NODES), cbs_body(SPEC)
    body["status"] = {"autoscaling": {"modelLoadSeconds": {"revision": "r", "seconds": 40, "samples": 3}}}
    out = reconcile_pass(client, body, snap, World(), Settings(), NOW, autoscaling=scaling())
    dep = snap.children[("Deployment", "bot")]
    assert dep["spec"]["replicas"] == 2 + 4  # 3x of 2 serving: 4 standbys (more than warmPool's 1)
    assert dep["spec"]["template"]["metadata"]["labels"][api.LABEL_SERVING] == "false"
    assert snap.children[("Service", "bot")]["spec"]["selector"][api.LABEL_SERVING] == "true"
    surge = out.status["autoscaling"]["surge"]
    assert surge["standby"] == 4 and "3x within 10 s of 2 serving" in surge["reason"]
    assert out.status["autoscaling"]["warmPool"]["desired"] == 4
