"""The apply planner: desired vs observed, quantities, and the no-op pass."""

from __future__ import annotations

from decimal import Decimal

import pytest
from chatfleet_operator.rollout.plan import contains, parse_quantity, plan_children


class TestParseQuantity:
    @pytest.mark.parametrize(
        ("text", "value"),
        [
            pytest.param("500m", Decimal("0.5"), id="milli"),
            pytest.param("0.5", Decimal("0.5"), id="decimal"),
            pytest.param("1Gi", Decimal(2**30), id="binary"),
            pytest.param("1e3", Decimal(1000), id="exponent"),
            pytest.param("4", Decimal(4), id="plain"),
            pytest.param("hello", None, id="not-a-quantity"),
        ],
    )
    def test_values(self, text, value):
        assert parse_quantity(text) == value


class TestContains:
    @pytest.mark.parametrize(
        ("observed", "desired", "expected"),
        [
            pytest.param({"a": 1, "b": 2}, {"a": 1}, True, id="extra-observed-fields-ignored"),
            pytest.param({"a": 1}, {"a": 2}, False, id="changed-scalar"),
            pytest.param({"cpu": "500m"}, {"cpu": "0.5"}, True, id="quantity-normalized"),
            pytest.param({"x": [1, 2]}, {"x": [1]}, False, id="list-length-matters"),
            pytest.param({}, {"readOnly": False}, True, id="omitted-false"),
            pytest.param({}, {"labels": {}}, True, id="omitted-empty-map"),
            pytest.param(
                {"labels": {"a": "b"}}, {"labels": {"a": "b", "c": "d"}}, False, id="label-removed-by-hand"
            ),
            pytest.param({"n": 1}, {"n": "1"}, True, id="int-vs-string-number"),
            pytest.param({"s": "a"}, {"s": None}, True, id="none-desired"),
        ],
    )
    def test_contains(self, observed, desired, expected):
        assert contains(observed, desired) is expected


class TestPlanChildren:
    CM = {"kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "v"}}

    @pytest.mark.parametrize(
        ("observed", "expected"),
        [
            pytest.param({}, [("apply", "ConfigMap", "a", "missing")], id="create"),
            pytest.param({("ConfigMap", "a"): {**CM, "extra": 1}}, [], id="no-op"),
            pytest.param(
                {("ConfigMap", "a"): {**CM, "data": {"k": "edited"}}},
                [("apply", "ConfigMap", "a", "drifted")],
                id="drift-put-back",
            ),
            pytest.param(
                {
                    ("ConfigMap", "a"): CM,
                    ("HorizontalPodAutoscaler", "h"): {"kind": "HorizontalPodAutoscaler"},
                },
                [("delete", "HorizontalPodAutoscaler", "h", "not desired")],
                id="delete-unwanted-hpa",
            ),
        ],
    )
    def test_plan(self, observed, expected):
        actions = plan_children([self.CM], observed, ("HorizontalPodAutoscaler",))
        assert [(a.verb, a.kind, a.name, a.why) for a in actions] == expected
