"""The answer-cache benchmark's workload (bench/answer_cache_bench.py), checked without a runtime.

Test design: the dialogues must be the same for both rows (seeded), carry the asked share of frequent
first questions (each frequent question in more than one surface, so the cache's normalisation is what
makes them hits), and give half the dialogues a follow-up turn. No speed is asserted.
"""

from __future__ import annotations

import sys

import pytest
from chatfleet_platform.common.config import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

import answer_cache_bench as acb

pytestmark = pytest.mark.harness


def test_the_dialogues_are_seeded_and_carry_the_asked_mix():
    plan = acb.dialogues(400, faqs=10, repeat=0.7, seed=3)
    assert plan == acb.dialogues(400, faqs=10, repeat=0.7, seed=3)  # both rows get the same
    frequent = {q.lower() for q in acb.FAQS[:10]}
    firsts = [d[0] for d in plan]
    share = sum(1 for q in firsts if " ".join(q.split()).lower() in frequent) / len(plan)
    assert 0.62 <= share <= 0.78
    assert len(set(firsts)) > len({" ".join(q.split()).lower() for q in firsts})  # surfaces differ
    followed = sum(1 for d in plan if len(d) == 2) / len(plan)
    assert 0.4 <= followed <= 0.6 and all(1 <= len(d) <= 2 for d in plan)
