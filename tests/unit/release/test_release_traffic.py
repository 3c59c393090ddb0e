"""Table tests of the traffic split arithmetic (mirrors the docstring of rollout.traffic.split)."""

from __future__ import annotations

import pytest
from chatfleet_operator.release.traffic import (
    HTTPROUTE,
    REPLACE_IN_PLACE,
    REPLICA_RATIO,
    SURGE,
    canary_replicas,
    split,
)


@pytest.mark.parametrize(
    ("total", "weight", "traffic", "capacity", "expected"),
    [
        pytest.param(4, 10, REPLICA_RATIO, SURGE, (4, 1, 20), id="ratio-surge-10"),
        pytest.param(4, 50, REPLICA_RATIO, SURGE, (2, 2, 50), id="ratio-surge-50"),
        pytest.param(4, 50, HTTPROUTE, SURGE, (4, 2, 50), id="route-surge-keeps-stable-full"),
        pytest.param(4, 10, REPLICA_RATIO, REPLACE_IN_PLACE, (3, 1, 25), id="ratio-in-place"),
        pytest.param(1, 10, REPLICA_RATIO, REPLACE_IN_PLACE, (0, 1, 100), id="one-replica-in-place"),
        pytest.param(3, 100, REPLICA_RATIO, SURGE, (0, 3, 100), id="ratio-100"),
        pytest.param(3, 100, HTTPROUTE, SURGE, (3, 3, 100), id="route-100-keeps-stable"),
        pytest.param(4, 0, HTTPROUTE, SURGE, (4, 0, 0), id="weight-0"),
        pytest.param(2, 50, HTTPROUTE, REPLACE_IN_PLACE, (1, 1, 50), id="route-in-place"),
    ],
)
def test_split(total, weight, traffic, capacity, expected):
    s = split(total, weight, traffic, capacity)
    assert (s.stable, s.canary, s.effective_weight) == expected


@pytest.mark.parametrize(
    ("total", "weight", "expected"), [(4, 0, 0), (4, 10, 1), (4, 25, 1), (4, 50, 2), (4, 100, 4), (0, 50, 0)]
)
def test_canary_replicas(total, weight, expected):
    assert canary_replicas(total, weight) == expected
