"""The flags the local platform installs the chart with (`chatfleet_platform.addons.operatorchart`): the
operator's pod on a real node, from a local image that is never pulled (the real-pod test of the chart's
operator and `make bench-chaos-upgrades` install it so)."""

from __future__ import annotations

import pytest
import yaml
from chart_helpers import CHART, helm, one
from chatfleet_platform.addons.operatorchart import image_values, real_node_values

pytestmark = pytest.mark.harness

REF = "docker.io/chatfleet/chatfleet-operator:0.1.0-abc-build-a"


def test_the_operator_pod_runs_the_local_image_on_a_real_node():
    out = helm(
        "template",
        "cf",
        str(CHART),
        "--namespace",
        "chatfleet-system",
        *image_values(REF),
        *real_node_values(),
    )
    pod = one([d for d in yaml.safe_load_all(out.stdout) if d], "Deployment")["spec"]["template"]["spec"]
    (operator,) = pod["containers"]
    assert (operator["image"], operator["imagePullPolicy"]) == (REF, "Never")
    assert pod["nodeSelector"] == {"chatfleet.io/real-node": "true"}
    assert pod["tolerations"] == [{"key": "chatfleet.io/real-node", "operator": "Exists"}]
