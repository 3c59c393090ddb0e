"""What a pass writes into status is declared in the CRD's status schema (else the API server prunes it).

Test design: the API server drops status fields its schema does not declare, silently; the next pass then
reads a status without them. `status.autoscaling.forecast.model` was written and pruned that way, so a kept
forecast said "no forecast yet" in its reason (seen in a benchmark's status). Passes through the autoscaling
paths (a forecast with the error-sized pool and its scale-down, a declared surge, an SLO breach), and a plain
pass, must write only declared fields.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from chatfleet_operator.cache import Snapshot, World
from chatfleet_operator.reconcile import reconcile_pass
from chatfleet_operator.settings import Settings
from chatfleet_platform.common.config import CHATBOT_CRD_FILE
from operator_helpers import cbs_body
from test_operator_autoscale import scaling
from test_operator_forecast_error import body_with, day
from test_operator_reconcile import NODES, NOW, FakeClient
from test_operator_slo import Fleet
from test_operator_surge import SPEC as SURGE_SPEC


@pytest.fixture(scope="module")
def status_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CHATBOT_CRD_FILE.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]


def undeclared(value: Any, schema: dict[str, Any], path: str = "status") -> list[str]:
    """Paths in `value` that `schema` does not declare (what the API server would prune)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out: list[str] = []
    if isinstance(value, dict):
        props, more = schema.get("properties"), schema.get("additionalProperties")
        for key, item in value.items():
            if props is not None and key in props:
                out += undeclared(item, props[key], f"{path}.{key}")
            elif isinstance(more, dict):
                out += undeclared(item, more, f"{path}.{key}")
            elif more is not True:
                out.append(f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            out += undeclared(item, schema["items"], f"{path}[]")
    return out


def test_the_checker_finds_an_undeclared_field(status_schema):
    assert undeclared({"autoscaling": {"forecast": {"floor": 2, "nope": 1}}}, status_schema) == [
        "status.autoscaling.forecast.nope"
    ]


def one_pass(body: dict, series=None) -> dict:
    out = reconcile_pass(FakeClient(), body, Snapshot(nodes=NODES), World(), Settings(), NOW,
                         autoscaling=scaling(series=series))  # fmt: skip
    return out.status


def test_a_forecast_with_its_error_sized_pool_and_scale_down(status_schema):
    body = body_with(True)
    body["spec"]["scaling"]["autoscale"]["forecast"]["scaleDown"] = "Forecast"
    status = one_pass(body, day(12.0, scale=1 / 3))
    assert status["autoscaling"]["forecast"]["model"].startswith("Holt-Winters")
    assert undeclared(status, status_schema) == []


def test_a_declared_surge(status_schema):
    body = cbs_body(SURGE_SPEC)
    body["status"] = {"autoscaling": {"modelLoadSeconds": {"revision": "r", "seconds": 40, "samples": 3}}}
    status = one_pass(body)
    assert status["autoscaling"]["surge"]["standby"] > 0
    assert undeclared(status, status_schema) == []


def test_an_slo_breach(status_schema):
    fleet = Fleet()
    fleet.run(0)
    fleet.p95 = 1000.0
    for t in (6, 11):
        status = fleet.run(t).status
    assert status["autoscaling"]["slo"]["floor"] == 4
    assert undeclared(status, status_schema) == []


def test_a_plain_pass(status_schema):
    status = one_pass(cbs_body({"model": {"uri": "hf://a/b"}}))
    assert undeclared(status, status_schema) == []
