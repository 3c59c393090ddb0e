"""spec.observability.tracing at admission: the default the API server fills in, and good endpoints accepted.

Test design: a manifest goes through `kubectl apply --dry-run=server -o json` on the real kube-apiserver
(the refusals, with their messages, are cases 82-85 of the corpus in cases/); the object it returns is
what would be stored.
"""

from __future__ import annotations

import pytest
from admission_stored import stored as stored_object

MODEL = {"uri": "hf://org/model"}


def stored(cluster, tmp_path, observability: dict | None) -> dict:
    """The spec the API server would store with spec.observability = observability."""
    spec = {"model": MODEL, **({"observability": observability} if observability is not None else {})}
    return stored_object(cluster, tmp_path, spec, "traced-bot")["spec"]


@pytest.mark.cluster
def test_tracing_is_off_unless_asked_and_samples_one_in_ten_by_default(crd_installed, tmp_path):
    assert "observability" not in stored(crd_installed, tmp_path, None)
    tracing = {"endpoint": "http://otel-collector.monitoring:4318"}
    got = stored(crd_installed, tmp_path, {"tracing": tracing})["observability"]["tracing"]
    assert got == {**tracing, "samplingRatio": 0.1}


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("endpoint", "ratio"),
    [
        pytest.param("http://otel-collector.monitoring:4318", 1, id="cluster-dns-every-trace"),
        pytest.param("https://collector.example.com/otlp", 0, id="https-with-a-path-no-new-trace"),
        pytest.param("http://10.0.0.7:4318/", 0.05, id="an-address"),
    ],
)
def test_good_endpoints_and_ratios_are_accepted_as_given(crd_installed, tmp_path, endpoint, ratio):
    tracing = {"endpoint": endpoint, "samplingRatio": ratio}
    assert stored(crd_installed, tmp_path, {"tracing": tracing})["observability"]["tracing"] == tracing
