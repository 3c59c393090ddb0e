"""The apply planner: desired vs observed, quantities, and the no-op pass."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest
from chatfleet_operator.converge.changes import contains, diff_children, is_quantity_field, parse_quantity


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
            pytest.param(
                {"limits": {"cpu": "500m"}}, {"limits": {"cpu": "0.5"}}, True, id="quantity-normalized"
            ),
            pytest.param(
                {"target": {"averageValue": "50m"}},
                {"target": {"averageValue": "0.05"}},
                True,
                id="hpa-target-quantity-normalized",
            ),
            pytest.param(
                {"labels": {"a": "500m"}}, {"labels": {"a": "0.5"}}, False, id="label-not-a-quantity"
            ),
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


class TestIsQuantityField:
    @pytest.mark.parametrize(
        ("path", "expected"),
        [
            pytest.param(("spec", "containers", "resources", "limits", "memory"), True, id="limits"),
            pytest.param(("resources", "requests", "nvidia.com/gpu"), True, id="requests"),
            pytest.param(("volumes", "emptyDir", "sizeLimit"), True, id="size-limit"),
            pytest.param(("metrics", "pods", "target", "averageValue"), True, id="hpa-average-value"),
            pytest.param(("metadata", "labels", "chatfleet.io/revision"), False, id="label"),
            pytest.param(("metadata", "annotations", "chatfleet.io/desired-hash"), False, id="annotation"),
            pytest.param(("selector", "matchLabels", "x"), False, id="selector"),
            pytest.param(("containers", "env", "value"), False, id="env-value"),
            pytest.param((), False, id="root"),
        ],
    )
    def test_paths(self, path, expected):
        assert is_quantity_field(path) is expected


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
        actions = diff_children([self.CM], observed, ("HorizontalPodAutoscaler",))
        assert [(a.verb, a.kind, a.name, a.why) for a in actions] == expected


def _hex_ids(count: int, seed: int, length: int = 10) -> list[str]:
    """Random hex ids as revision hashes look, with every digits-e-digits one forced in too."""
    rng = random.Random(seed)
    ids = ["".join(rng.choice("0123456789abcdef") for _ in range(length)) for _ in range(count)]
    for _ in range(count // 20):  # about 1 in 600 random ids has the shape: make plenty of them
        cut = rng.randrange(1, length - 1)
        ids.append(
            "".join(rng.choice("0123456789") for _ in range(cut))
            + "e"
            + "".join(rng.choice("0123456789") for _ in range(length - cut - 1))
        )
    return ids


class TestHashesAreStrings:
    """Labels, annotations, selectors and env values compare as strings; only quantity fields parse.

    A revision hash such as '90e9577223' reads as 90 * 10**9577223 when parsed as a quantity.
    """

    @staticmethod
    def _deployment(revision: str, digest: str) -> dict:
        return {
            "kind": "Deployment",
            "metadata": {
                "name": "bot",
                "labels": {"chatfleet.io/revision": revision},
                "annotations": {"chatfleet.io/desired-hash": digest},
            },
            "spec": {
                "selector": {"matchLabels": {"chatfleet.io/revision": revision}},
                "template": {
                    "spec": {
                        "containers": [{"name": "c", "env": [{"name": "REVISION", "value": revision}]}],
                    },
                },
            },
        }

    @pytest.mark.parametrize(
        ("observed", "desired"),
        [
            pytest.param("90e9577223", "4a1c09e2f1", id="exponent-shaped-desired-label"),
            pytest.param("4a1c09e2f1", "90e9577223", id="exponent-shaped-observed-label"),
            pytest.param("1e3", "1000", id="equal-as-numbers-differ-as-strings"),
        ],
    )
    def test_revision_change_is_planned_not_raised(self, observed, desired):
        actions = diff_children(
            [self._deployment(desired, desired)],
            {("Deployment", "bot"): self._deployment(observed, observed)},
        )
        assert [(a.verb, a.why) for a in actions] == [("apply", "drifted")]

    @pytest.mark.parametrize("length", [10, 16], ids=["revision", "desired-hash"])
    def test_generated_hashes(self, length):
        ids = _hex_ids(3000, seed=length, length=length)
        rng = random.Random(length)
        pairs = [(a, rng.choice(ids)) for a in ids] + [(a, a) for a in ids]
        for a, b in pairs:
            assert contains(self._deployment(a, a), self._deployment(b, b)) is (a == b), (a, b)

    @pytest.mark.parametrize(
        "text", ["90e9577223", "1e999999999", "9" * 40 + "e" + "9" * 40], ids=["hash", "huge", "very-long"]
    )
    def test_parse_quantity_never_raises(self, text):
        assert parse_quantity(text) is None
