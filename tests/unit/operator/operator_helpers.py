"""Sample bodies and observed objects for the operator unit tests."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.controller import Controller
from chatfleet_operator.kinds import BY_NAME
from chatfleet_operator.settings import RetrySettings, Settings

DEBOUNCE = 0.05


def cbs_body(spec: dict[str, Any] | None = None, *, name: str = "bot", generation: int = 1) -> dict[str, Any]:
    """A ChatbotService body as the API server would hand it over."""
    return {
        "apiVersion": "chatfleet.io/v1alpha1",
        "kind": "ChatbotService",
        "metadata": {"name": name, "namespace": "ns", "uid": "uid-1", "generation": generation},
        "spec": copy.deepcopy(spec) if spec is not None else {"model": {"uri": "hf://org/model"}},
    }


def as_observed(manifest: dict[str, Any], rv: int = 10, **status: Any) -> dict[str, Any]:
    """What the API server returns for an applied manifest: defaults added, resourceVersion, status."""
    obj = copy.deepcopy(manifest)
    obj["metadata"]["resourceVersion"] = str(rv)
    obj["metadata"]["uid"] = f"uid-{manifest['kind']}"
    obj["metadata"]["generation"] = 1
    if manifest["kind"] == "Deployment":
        for c in obj["spec"]["template"]["spec"]["containers"]:
            c["terminationMessagePath"] = "/dev/termination-log"
        obj["status"] = status or {}
    return obj


class ScriptedController(Controller):
    """A Controller whose passes (reconcile_pass, patched by the test to record and return an outcome) need
    no API: the ChatbotService bodies sit in the watch cache (kopf's index is a plain mapping here).
    `settle` waits until what the last events asked for has run to its end, however loaded the machine:
    a fixed sleep was too short under a parallel test run (a pass ended after the test's next event)."""

    def __init__(self) -> None:
        super().__init__(Settings(retry=RetrySettings(base_delay=30.0, trigger_debounce=DEBOUNCE)), None)  # type: ignore[arg-type]
        self.client = self  # reconcile_pass's first argument: the controller itself
        self.cache: dict[Any, list[dict[str, Any]]] = {}
        self.world.indexes = {BY_NAME[api.KIND].index: self.cache}
        self.in_flight = 0

    async def _triggered(self, key: Any) -> None:
        self.in_flight += 1
        try:
            await super()._triggered(key)
        finally:
            self.in_flight -= 1

    def quiet(self) -> bool:
        """No pass asked for, running, or about to be asked for (the rediscovery timer)."""
        return not self._pending and not self.in_flight and self._rediscovery is None

    async def settle(self) -> None:
        await asyncio.sleep(DEBOUNCE * 2)
        assert await until(self.quiet), "the controller never settled"


async def until(check: Callable[[], bool], within_s: float = 30.0) -> bool:
    """Whether `check` came true within `within_s`, asked every 10 ms: a wait on a condition, however
    loaded the machine, where a fixed sleep is too short under a parallel test run."""
    deadline = asyncio.get_running_loop().time() + within_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True
