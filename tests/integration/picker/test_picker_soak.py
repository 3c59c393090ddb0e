"""The picker under sustained load, bounded in count: 6,000 requests of 6,000 distinct dialogues, each one
ext_proc exchange as Envoy has it (headers, then the buffered body), against a picker that remembers at
most 1,000. Its dialogue table stays at its bound (its own metric) and its memory stops growing once the
table is full (RSS after 3,000 and after 6,000 requests); every request is answered with a replica."""

from __future__ import annotations

import asyncio
import sys
import urllib.request
from pathlib import Path

import pytest
from needs import need_module

need_module("envoy_data_plane", "run `make setup` (the picker extra: envoy-data-plane)")

from chatfleet_platform.common import procs  # noqa: E402 - after the checks above
from extproc_gateway import destinations  # noqa: E402 - after the checks above

pytestmark = [pytest.mark.slow]
REPLICAS = ["127.0.0.1:9", "127.0.0.1:10", "127.0.0.1:11"]  # never dialled: the picker only names them


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_the_dialogue_table_and_memory_stay_bounded_under_sustained_load(tmp_path):
    port, metrics = procs.free_port(), procs.free_port()
    argv = [
        sys.executable,
        "-m",
        "chatfleet_picker",
        "--host=127.0.0.1",
        f"--pool=stable={port}",
        f"--metrics-port={metrics}",
        "--max-dialogues=1000",
        "--scrape-interval=60",
        *(f"--endpoint={r},stable,a" for r in REPLICAS),
    ]
    log = tmp_path / "picker.log"
    proc = procs.start("picker", argv, log=log)
    try:
        procs.wait_for("picker", lambda: procs.port_in_use(port), timeout=30, log=log, proc=proc)
        picked = asyncio.run(destinations(port, (f"soak-{i}" for i in range(3000))))
        half = rss_kib(proc.pid)
        picked += asyncio.run(destinations(port, (f"soak-{i}" for i in range(3000, 6000))))
        full = rss_kib(proc.pid)
        assert set(picked) == set(REPLICAS)  # every request answered, spread over the replicas
        assert metric(metrics, "chatfleet_picker_dialogues") == 1000
        assert metric(metrics, 'chatfleet_picker_picks_total{pool="stable",reason="new"}') == 6000
        assert full - half < 8 * 1024, f"RSS grew {full - half} KiB over the second 3,000 requests"
    finally:
        procs.stop(proc)
