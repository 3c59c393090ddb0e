"""An operator upgrade between two builds rolls the fleets a few at a time (kwok GPU nodes, the real
Deployment controller and scheduler, two operator processes).

Test design: the "old build" (an operator process whose pod settings give the chat API 250m of CPU) makes
four ChatbotServices Ready in a namespace no other operator watches; it stops, and the "new build" (the
default 500m: a new pod template with the same revision, as a new annotation or env var in the builders
would make) starts with `--upgrade-wave=1`. While it works, the Deployments are sampled: no two fleets
may be rolling the new template at once, and every fleet ends on the new template, Ready, with no
UpgradeHeld left. The fleets that waited said so: a Normal event UpgradeQueued each (the condition
UpgradeHeld they carried meanwhile may come and go between two samples on a loaded machine; the event
stays). Before the wave, the new process re-templated all four in its first passes.
"""

from __future__ import annotations

import time

import pytest
from chatfleet_platform.load.upgrades import chat_api_cpu, sample
from operator_it import Kube, chatbot
from operator_process import OperatorProcess

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAMES = [f"bot-{i}" for i in range(4)]


def test_an_upgrade_between_two_builds_rolls_one_fleet_at_a_time(chatfleet_crd, solo_namespace, tmp_path):
    cluster = chatfleet_crd
    scope = (solo_namespace,)
    old = OperatorProcess(cluster, tmp_path / "old", scope, env={"CHATFLEET_CHAT_API_CPU": "250m"})
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    kube = Kube(cluster, solo_namespace, old)
    old.start()
    try:
        kube.apply(*[chatbot(n) for n in NAMES])
        for n in NAMES:
            kube.wait_ready(n, timeout=90)
    finally:
        old.stop()
    assert {chat_api_cpu(d) for d in kube.get("deployment", selector="chatfleet.io/track=stable")} == {"250m"}

    new = OperatorProcess(cluster, tmp_path / "new", scope, extra_args=("--upgrade-wave=1",))
    kube.operator = new
    new.start()
    most_rolling, now = 0, None
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            now = sample(cluster, "500m", namespace=solo_namespace)
            most_rolling = max(most_rolling, len(now.rolling))
            if len(now.done) == len(NAMES) and not now.held:
                break
            time.sleep(0.3)
        assert most_rolling <= 1, f"{most_rolling} fleets rolled the new template at once"
        assert now is not None and now.done == tuple(f"{solo_namespace}/{n}" for n in NAMES), (
            f"not every fleet reached the new template: {now}\n{new.log_text()[-3000:]}"
        )
        queued = {n: [e["type"] for e in kube.events(n) if e["reason"] == "UpgradeQueued"] for n in NAMES}
        assert sum(map(len, queued.values())) >= 1, queued  # with one place, at least one fleet waited
        assert all(types in ([], ["Normal"]) for types in queued.values()), queued  # told once each
        for n in NAMES:
            # the Deployments are rolled out; the operator's pass that sees it writes Ready (a moment later
            # on a loaded machine: make test once read it False right after the last rollout)
            kube.wait_ready(n, timeout=60)
            assert kube.condition(n, "UpgradeHeld") == {}
    finally:
        new.stop()
