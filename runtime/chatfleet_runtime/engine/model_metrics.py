"""The Triton model's own metrics (``chatfleet_model_*``, on Triton's metrics page; docs/metrics.md).

``ModelObserver`` is the ``service.Observer`` the Triton adapter hands ``ChatService``. It takes the
metric-family class as an argument (``pb_utils.MetricFamily`` inside Triton), so it is plain Python and
tested with a stand-in; the names, descriptions and buckets are the table ``FAMILIES``.
"""

from __future__ import annotations

BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
SECONDS_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]

#: attribute -> (metric name, description, kind, histogram buckets or None)
FAMILIES = {
    "batch_rows": (
        "chatfleet_model_batch_size",
        "Requests per batched generate (one per dynamic batch)",
        "HISTOGRAM",
        BATCH_BUCKETS,
    ),
    "generate_s": (
        "chatfleet_model_generate_seconds",
        "Wall time of one batched generate",
        "HISTOGRAM",
        SECONDS_BUCKETS,
    ),
    "ttft": (
        "chatfleet_model_time_to_first_token_seconds",
        "From the start of the batch's generate to a row's first token (queue time is nv_inference_queue_duration_us)",
        "HISTOGRAM",
        SECONDS_BUCKETS,
    ),
    "tokens": ("chatfleet_model_generated_tokens_total", "Tokens generated", "COUNTER", None),
    "finish": ("chatfleet_model_finished_total", "Rows finished, by finish reason", "COUNTER", None),
    "cache_hits": (
        "chatfleet_model_prefix_cache_hits_total",
        "Prefill that reused a cached KV prefix",
        "COUNTER",
        None,
    ),
    "cache_misses": (
        "chatfleet_model_prefix_cache_misses_total",
        "Prefix look-ups without a usable entry",
        "COUNTER",
        None,
    ),
    "cache_reused": (
        "chatfleet_model_prefix_cache_reused_tokens_total",
        "Prompt tokens not recomputed thanks to the cache",
        "COUNTER",
        None,
    ),
    "cache_entries": (
        "chatfleet_model_prefix_cache_entries",
        "Entries (conversations + system prompts) in the KV prefix cache",
        "GAUGE",
        None,
    ),
    "cache_bytes": ("chatfleet_model_prefix_cache_bytes", "Bytes held by the KV prefix cache", "GAUGE", None),
    "precision": (
        "chatfleet_model_precision_info",
        "1 for the precision that runs (label precision) and the one asked for (label requested)",
        "GAUGE",
        None,
    ),
    "kv_budget": (
        "chatfleet_model_kv_budget_bytes",
        "The running batch's KV budget in bytes, resolved at start (0: no budget)",
        "GAUGE",
        None,
    ),
    "kv_rows": (
        "chatfleet_model_kv_budget_rows",
        "Rows the in-flight engine runs at most: those of a typical request the KV budget fits, up to max_batch_size",
        "GAUGE",
        None,
    ),
    "prefix_capacity": (
        "chatfleet_model_prefix_cache_capacity_bytes",
        "Bytes the KV prefix cache may hold (its share of the KV memory)",
        "GAUGE",
        None,
    ),
}
#: `finish` has one metric per reason (label reason); `precision` one made at placement (more labels).
FINISH_REASONS = ("stop", "length", "cancelled")


class ModelObserver:
    """Records the service's batches, finished rows, prefix cache, placement and KV sizing as Triton metrics."""

    def __init__(self, metric_family, model: str, version: str):
        self._labels = labels = {"model": model, "version": version}
        # Families must outlive their metrics: keep every one referenced.
        self._families = []

        def family(name: str, description: str, kind: str):
            fam = metric_family(name=name, description=description, kind=getattr(metric_family, kind))
            self._families.append(fam)
            return fam

        for attr, (name, description, kind, buckets) in FAMILIES.items():
            fam = family(name, description, kind)
            if attr == "finish":
                self.finish_metrics = {r: fam.Metric(labels={**labels, "reason": r}) for r in FINISH_REASONS}
            elif attr == "precision":
                self.precision = fam
            elif buckets:
                setattr(self, attr, fam.Metric(labels=labels, buckets=buckets))
            else:
                setattr(self, attr, fam.Metric(labels=labels))
        self._seen = (0, 0, 0)

    def placement(self, requested, precision, device):
        """Record the effective precision (fp16/bf16 asked on CPU run fp32: the labels say so)."""
        labels = {**self._labels, "requested": requested, "precision": precision, "device": device}
        self.precision_metric = self.precision.Metric(labels=labels)
        self.precision_metric.set(1)

    def kv_sizing(self, sizing):
        """Record the KV budget, the rows it fits and the prefix store's size (once, at start)."""
        self.kv_budget.set(sizing.budget)
        self.kv_rows.set(sizing.rows)
        self.prefix_capacity.set(sizing.prefix_cache)

    def batch(self, rows, generate_s, tokens):
        """Record one batched generate (in-flight batching: the batch size when requests join)."""
        self.batch_rows.observe(rows)
        if generate_s > 0:
            self.generate_s.observe(generate_s)

    def finished(self, result):
        """Record one finished row (and its tokens)."""
        if result.token_ids:
            self.tokens.increment(len(result.token_ids))
        if result.first_token_s is not None:
            self.ttft.observe(result.first_token_s)
        metric = self.finish_metrics.get(result.finish_reason)
        if metric is not None:
            metric.increment(1)

    def cache(self, cache):
        """Record the prefix cache's counters (as deltas) and gauges."""
        hits, misses, reused = cache.hits, cache.misses, cache.reused_tokens
        h0, m0, r0 = self._seen
        if hits > h0:
            self.cache_hits.increment(hits - h0)
        if misses > m0:
            self.cache_misses.increment(misses - m0)
        if reused > r0:
            self.cache_reused.increment(reused - r0)
        self._seen = (hits, misses, reused)
        self.cache_entries.set(len(cache))
        self.cache_bytes.set(cache.nbytes)
