"""The chaos benchmark's fault plan (bench/chaos_bench.py), checked without running it.

Test design: the plan is pure; every fault asked for must be in it once, in the order the run applies
them, a kill first where kills are the most (the load under way before a node or Redis goes), and the
published plan's node losses and Redis restarts apart.
No speed is asserted (benchmarks are not tests).
"""

from __future__ import annotations

import sys
from collections import Counter

import pytest
from chatfleet_platform.common.config import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

import chaos_bench as cb

pytestmark = pytest.mark.harness


@pytest.mark.parametrize(
    ("kills", "nodes", "restarts"), [(10, 2, 2), (10, 0, 0), (3, 1, 1), (1, 3, 2), (0, 2, 2)]
)
def test_every_fault_asked_for_is_planned_once(kills, nodes, restarts):
    plan = cb.fault_plan(kills, nodes, restarts)
    assert Counter(plan) == Counter({"kill": kills, "node": nodes, "redis": restarts}) - Counter()
    if kills > nodes + restarts:  # the load under way before the first node loss or Redis restart
        assert plan[0] == "kill", plan


def test_the_published_plan_spreads_the_node_losses_and_redis_restarts_among_the_kills():
    plan = cb.fault_plan(10, 2, 2)
    at = {kind: [i for i, k in enumerate(plan) if k == kind] for kind in ("node", "redis")}
    assert at == {"node": [2, 10], "redis": [5, 12]}, plan
