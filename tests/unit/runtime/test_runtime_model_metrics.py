"""The Triton model's metrics (chatfleet_model_*) through a stand-in for pb_utils.MetricFamily."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from chatfleet_runtime.engine.model_metrics import ModelObserver


class Family:
    """Records what pb_utils.MetricFamily would be asked."""

    HISTOGRAM, COUNTER, GAUGE = "histogram", "counter", "gauge"
    made: list[Family] = []

    def __init__(self, name, description, kind):
        self.name, self.description, self.kind, self.metrics = name, description, kind, []
        Family.made.append(self)

    def Metric(self, labels, buckets=None):
        metric = SimpleNamespace(labels=labels, buckets=buckets, values=[])
        metric.observe = metric.increment = metric.set = metric.values.append
        self.metrics.append(metric)
        return metric


@dataclass
class Cache:
    """A prefix-cache stand-in: its counters, and len() = its entries."""

    hits: int
    misses: int
    reused_tokens: int
    nbytes: int
    entries: int

    def __len__(self):
        return self.entries


def test_families_names_kinds_and_what_a_batch_records():
    Family.made = []
    obs = ModelObserver(Family, "chat", "1")
    assert [(f.name, f.kind) for f in Family.made] == [
        ("chatfleet_model_batch_size", "histogram"),
        ("chatfleet_model_generate_seconds", "histogram"),
        ("chatfleet_model_time_to_first_token_seconds", "histogram"),
        ("chatfleet_model_generated_tokens_total", "counter"),
        ("chatfleet_model_finished_total", "counter"),
        ("chatfleet_model_prefix_cache_hits_total", "counter"),
        ("chatfleet_model_prefix_cache_misses_total", "counter"),
        ("chatfleet_model_prefix_cache_reused_tokens_total", "counter"),
        ("chatfleet_model_prefix_cache_entries", "gauge"),
        ("chatfleet_model_prefix_cache_bytes", "gauge"),
        ("chatfleet_model_precision_info", "gauge"),
        ("chatfleet_model_kv_budget_bytes", "gauge"),
        ("chatfleet_model_kv_budget_rows", "gauge"),
        ("chatfleet_model_prefix_cache_capacity_bytes", "gauge"),
    ]
    assert obs.batch_rows.labels == {"model": "chat", "version": "1"} and obs.batch_rows.buckets[-1] == 512
    obs.batch(3, 0.2, 12)
    obs.batch(2, 0.0, 0)  # in-flight join: a size, no generate time
    obs.finished(SimpleNamespace(token_ids=[1, 2], first_token_s=0.05, finish_reason="length"))
    obs.cache(Cache(hits=2, misses=1, reused_tokens=40, nbytes=1000, entries=3))
    obs.cache(Cache(hits=3, misses=1, reused_tokens=40, nbytes=900, entries=2))
    obs.placement("fp16", "fp32", "cpu")
    assert (obs.batch_rows.values, obs.generate_s.values) == ([3, 2], [0.2])
    assert (obs.tokens.values, obs.ttft.values, obs.finish_metrics["length"].values) == ([2], [0.05], [1])
    assert (obs.cache_hits.values, obs.cache_misses.values, obs.cache_reused.values) == ([2, 1], [1], [40])
    assert (obs.cache_entries.values, obs.cache_bytes.values) == ([3, 2], [1000, 900])
    assert obs.precision_metric.labels == {
        "model": "chat", "version": "1", "requested": "fp16", "precision": "fp32", "device": "cpu"
    }  # fmt: skip
    assert obs.precision_metric.values == [1]
    obs.kv_sizing(SimpleNamespace(budget=9 * 2**30, rows=256, prefix_cache=2**30))
    assert (obs.kv_budget.values, obs.kv_rows.values) == ([9 * 2**30], [256])
    assert obs.prefix_capacity.values == [2**30]
