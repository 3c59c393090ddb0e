"""Release analysis: PromQL queries (pure), the Prometheus provider (the only HTTP here), a pure assessor."""
