"""Release analysis (provider protocol, Prometheus provider, pure assessor): comes with the release issue."""
