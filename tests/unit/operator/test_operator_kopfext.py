"""kopf tuning: the lean diff-base yields exactly kopf's own essence."""

from __future__ import annotations

import kopf
import pytest
from chatfleet_operator.kopfext import LeanDiffBaseStorage

META = {"name": "a", "namespace": "n", "uid": "u", "managedFields": [{"manager": "x"}]}


class TestLeanDiffBaseStorage:
    @pytest.mark.parametrize(
        "body",
        [
            pytest.param({"metadata": META, "spec": {"model": {"uri": "x"}}}, id="plain"),
            pytest.param(
                {
                    "metadata": {
                        **META,
                        "labels": {"l": "1"},
                        "annotations": {
                            "keep": "1",
                            "operator.chatfleet.io/last-handled-configuration": "{}",
                            "kubectl.kubernetes.io/last-applied-configuration": "{}",
                        },
                    },
                    "spec": {"a": [1, {"b": 2}]},
                    "status": {"phase": "Ready"},
                },
                id="annotations-and-status",
            ),
        ],
    )
    def test_same_essence_as_kopf(self, body):
        args = {"prefix": "operator.chatfleet.io", "key": "last-handled-configuration"}
        lean = LeanDiffBaseStorage(**args).build(body=kopf.Body(body))
        assert lean == kopf.AnnotationsDiffBaseStorage(**args).build(body=kopf.Body(body))
