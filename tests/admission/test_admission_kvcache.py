"""spec.runtime.kvCache at admission: the defaults the API server fills in, and good values accepted.

Test design: a manifest goes through `kubectl apply --dry-run=server -o json` on the real kube-apiserver
(the refusals, with their messages, are cases 66-74 of the corpus in cases/); the object it returns is
what would be stored, so the defaults are read from it.
"""

from __future__ import annotations

import pytest
from admission_stored import stored as stored_object

MODEL = {"uri": "hf://org/model"}


def stored(cluster, tmp_path, runtime: dict | None = None) -> dict:
    """The object the API server would store with spec.runtime = runtime."""
    spec = {"model": MODEL, **({"runtime": runtime} if runtime is not None else {})}
    return stored_object(cluster, tmp_path, spec, "kv-bot")


@pytest.mark.cluster
def test_the_kv_cache_is_on_by_default_and_batches_hundreds(crd_installed, tmp_path):
    runtime = stored(crd_installed, tmp_path)["spec"]["runtime"]
    assert runtime["kvCache"] == {
        "memoryFraction": 0.9,
        "typicalPromptTokens": 512,
        "admissionQueue": 64,
        "admissionWaitMilliseconds": 10000,
    }
    assert runtime["dynamicBatching"]["maxBatchSize"] == 256


@pytest.mark.cluster
@pytest.mark.parametrize(
    "kv_cache",
    [
        pytest.param({"memoryFraction": 1}, id="whole-fraction-as-an-integer"),
        pytest.param({"memoryFraction": 0.05}, id="small-fraction"),
        pytest.param({"memory": "20Gi", "prefixCacheMemory": "19Gi"}, id="prefix-store-below-memory"),
        pytest.param({"memory": 21474836480}, id="memory-as-a-number"),
        pytest.param({"prefixCacheMemory": "8Gi"}, id="prefix-store-alone"),
        pytest.param({"admissionQueue": 0, "admissionWaitMilliseconds": 0}, id="refuse-at-once"),
    ],
)
def test_good_kv_cache_values_are_accepted_as_given(crd_installed, tmp_path, kv_cache):
    got = stored(crd_installed, tmp_path, {"kvCache": kv_cache})["spec"]["runtime"]["kvCache"]
    assert {k: got[k] for k in kv_cache} == kv_cache
