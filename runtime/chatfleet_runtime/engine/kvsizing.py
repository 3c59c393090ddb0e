"""The KV cache sized by a memory budget, once at start: the pure arithmetic, and the device memory it shares.

One model instance's **KV memory** is ``kv_memory_bytes`` when set (spec.runtime.kvCache.memory), else

    kv_memory_fraction x (device memory - instances x loaded) / instances

where the device memory is the GPU's total memory (KIND_GPU) or the container's memory limit (KIND_CPU;
the host's memory when the container has none), ``loaded`` is what one instance holds once loaded (on a
GPU its weights; on a CPU its process's resident memory: weights, torch, tokenizer), every instance
holding its own, and ``instances`` is how many model instances share the device (``instance_group``
count). The prefix (session) store takes ``prefix_cache_bytes`` of it (0: a tenth), and the running
batch's **KV budget** is the rest: ``InflightEngine`` admits a request only while rows x longest (prompt + max tokens)
x bytes per position stays within it (``admission.plan_admission``).

The engine's row limit follows from the budget: the rows of a typical request that fit,
budget // (bytes per position x (typical prompt + max new tokens)), at most ``max_batch_size``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: The prefix store's size when nothing sizes the KV memory (kv_memory_fraction 0, no kv_memory_bytes).
UNBUDGETED_PREFIX_BYTES = 256 * 2**20
#: The prefix store's share of the KV memory when prefix_cache_bytes is 0.
PREFIX_SHARE = 0.1


class KvSizingError(ValueError):
    """The KV memory cannot hold what it must (the message names the parameter to change)."""


@dataclass(frozen=True)
class KvSizing:
    """What the KV memory of one instance comes to, in bytes and rows."""

    memory: int
    """KV memory of this instance (prefix store + running batch); 0: no budget."""
    budget: int
    """The running batch's KV budget (memory - prefix store); 0: no budget."""
    prefix_cache: int
    """Bytes the prefix (session) store may hold."""
    rows: int
    """Rows the in-flight engine runs at most."""
    row_bytes: int
    """KV bytes of one typical row (bytes per position x (typical prompt + max new tokens))."""
    source: str
    """How the memory was found, for the start-up log line."""

    def describe(self) -> str:
        """One log line: the budget, what it is, and the rows it fits."""
        if not self.budget:
            return f"no KV budget ({self.source}); up to {self.rows} rows; prefix store {_mib(self.prefix_cache)}"
        return (
            f"KV memory {_mib(self.memory)} ({self.source}): running batch budget {_mib(self.budget)}, "
            f"prefix store {_mib(self.prefix_cache)}; {self.budget // self.row_bytes} rows of "
            f"{_mib(self.row_bytes)} fit, running at most {self.rows}"
        )


def kv_sizing(
    *,
    device_memory: int,
    loaded_bytes: int,
    instances: int,
    fraction: float,
    memory_bytes: int,
    prefix_bytes: int,
    per_position: int,
    typical_prompt: int,
    max_new_tokens: int,
    max_rows: int,
) -> KvSizing:
    """Size one instance's KV memory, its prefix store, its running batch's budget and row limit.

    An 80 GiB GPU, 1 GiB of weights, one instance, fraction 0.9: 71.1 GiB of KV memory, a tenth of it
    for the prefix store, 64 GiB for the running batch; at 12 KiB per position (Qwen2-0.5B, bf16) a row of
    512 + 256 positions takes 9 MiB, so 7,280 rows fit, and max_batch_size (256) bounds them:

    >>> s = kv_sizing(device_memory=80 * 2**30, loaded_bytes=2**30, instances=1, fraction=0.9,
    ...               memory_bytes=0, prefix_bytes=0, per_position=12288, typical_prompt=512,
    ...               max_new_tokens=256, max_rows=256)
    >>> round(s.memory / 2**30, 1), round(s.budget / 2**30, 1), s.budget // s.row_bytes, s.rows
    (71.1, 64.0, 7280, 256)

    A 7B model with full multi-head KV (512 KiB per position, 14 GiB of weights) fits fewer rows than that:

    >>> kv_sizing(device_memory=80 * 2**30, loaded_bytes=14 * 2**30, instances=1, fraction=0.9,
    ...           memory_bytes=0, prefix_bytes=0, per_position=2**19, typical_prompt=512,
    ...           max_new_tokens=256, max_rows=256).rows
    142
    """
    row_bytes = per_position * (max(0, typical_prompt) + max(1, max_new_tokens))
    instances = max(1, instances)
    if memory_bytes > 0:
        memory = memory_bytes
        source = "kv_memory_bytes"
    elif fraction > 0:
        left = device_memory - instances * loaded_bytes
        if left <= 0:
            raise KvSizingError(
                f"kv_memory_fraction: the loaded model ({instances} x {_mib(loaded_bytes)}) leaves nothing of the "
                f"device's {_mib(device_memory)} for the KV cache; set kv_memory_bytes or use fewer instances"
            )
        memory = int(fraction * left) // instances
        share = f", split between {instances} instances" if instances > 1 else ""
        source = (
            f"{fraction:g} x ({_mib(device_memory)} device - {_mib(instances * loaded_bytes)} loaded){share}"
        )
    else:
        prefix = prefix_bytes if prefix_bytes > 0 else UNBUDGETED_PREFIX_BYTES
        return KvSizing(0, 0, prefix, max(1, max_rows), row_bytes, "kv_memory_fraction 0")
    prefix = prefix_bytes if prefix_bytes > 0 else int(memory * PREFIX_SHARE)
    if prefix >= memory:
        raise KvSizingError(
            f"prefix_cache_bytes: {prefix} bytes leave nothing of the KV memory ({memory} bytes, {source}) "
            "for the running batch; it must be less"
        )
    budget = memory - prefix
    if budget < row_bytes:
        raise KvSizingError(
            f"the KV budget ({budget} bytes: {source}, less the prefix store) does not fit one row of "
            f"kv_typical_prompt_tokens + max_new_tokens ({typical_prompt} + {max_new_tokens} positions x "
            f"{per_position} bytes = {row_bytes}); give the KV cache more memory (spec.runtime.kvCache) or "
            "size rows for shorter prompts"
        )
    return KvSizing(memory, budget, prefix, max(1, min(max_rows, budget // row_bytes)), row_bytes, source)


def _mib(n: int) -> str:
    """Bytes as MiB for log lines.

    >>> _mib(3 * 2**20 + 1)
    '3.0 MiB'
    """
    return f"{n / 2**20:.1f} MiB"


def container_memory_limit(
    cgroup: str | Path = "/sys/fs/cgroup", meminfo: str | Path = "/proc/meminfo"
) -> int:
    """The container's memory limit in bytes (cgroup v2, else v1), or the host's memory when it has none."""
    host = _host_memory(Path(meminfo))
    cgroup = Path(cgroup)
    for path in (cgroup / "memory.max", cgroup / "memory" / "memory.limit_in_bytes"):
        try:
            raw = path.read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            return min(int(raw), host) if host else int(raw)
        break  # "max": no limit
    if not host:
        raise KvSizingError(f"cannot read the memory of this container ({cgroup}) or host ({meminfo})")
    return host


def _host_memory(meminfo: Path) -> int:
    """MemTotal of /proc/meminfo in bytes (0 when unreadable)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def device_memory(device: str) -> int:
    """Total memory of the device the model runs on: a CUDA device's, or the container's limit on the CPU."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    return container_memory_limit()


def resident_bytes(statm: str | Path = "/proc/self/statm") -> int:
    """This process's resident memory in bytes (what a CPU instance holds once loaded; 0 when unreadable)."""
    try:
        return int(Path(statm).read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
