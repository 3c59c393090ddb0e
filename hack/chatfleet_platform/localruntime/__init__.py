"""The runtime on 127.0.0.1 for development: tests, `make serve`, the demos and the benchmark.

Never shipped in an image: the tiny offline model (``tiny``), the local Redis, Triton and chat API
processes (``testing``), a printed chat exchange (``demo``) and ``make serve`` (``serve``).
"""
