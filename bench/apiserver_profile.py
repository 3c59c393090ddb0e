"""The API server's CPU profile over a benchmark row, for bench/operator_bench.py --apiserver-profile.

The local platform's API server serves /debug/pprof when started with CHATFLEET_APISERVER_PROFILING=1. A
CPU profile there covers a fixed number of seconds, so a row is profiled as back-to-back slices (from its
first request until it is all Ready, the last slice running a few seconds past), merged by `go tool
pprof`. Two rows' merged profiles are compared with `-diff_base`: where the API server spent more CPU
for the operator's row than for its fair floor, by function.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

SLICE_S = 10


class ApiServerProfile:
    """Back-to-back CPU profile slices of the API server while the `with` block runs."""

    def __init__(self, kubectl: Path, env: dict[str, str], out: Path) -> None:
        self.kubectl, self.env, self.out = kubectl, env, out
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._error: Exception | None = None
        self.slices: list[Path] = []

    def __enter__(self) -> ApiServerProfile:
        self.out.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=SLICE_S + 30)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            self._slices()
        except Exception as exc:  # raised again where the block ends, not lost with the thread
            self._error = exc

    def _slices(self) -> None:
        while not self._stop.is_set():
            path = self.out / f"slice-{len(self.slices):04d}.pb.gz"
            with path.open("wb") as f:
                res = subprocess.run(
                    [str(self.kubectl), "get", "--raw", f"/debug/pprof/profile?seconds={SLICE_S}"],
                    stdout=f,
                    stderr=subprocess.PIPE,
                    env=self.env,
                    timeout=SLICE_S + 60,
                )
            if res.returncode != 0:
                raise RuntimeError(
                    "the API server's /debug/pprof answered "
                    f"{res.stderr.decode().strip()!r} (started without CHATFLEET_APISERVER_PROFILING=1?)"
                )
            self.slices.append(path)

    def merged(self) -> Path:
        """The slices merged into one profile (out/merged.pb.gz)."""
        path = self.out / "merged.pb.gz"
        with path.open("wb") as f:
            subprocess.run([go(), "tool", "pprof", "-proto", *map(str, self.slices)], stdout=f, check=True)
        return path


def go() -> str:
    """The Go toolchain the platform is built with (its pprof reads the profiles)."""
    exe = shutil.which("go")
    if exe is None:
        raise RuntimeError("Go is needed to read the API server's profiles (the platform is built with it)")
    return exe


def top(profile: Path, base: Path | None = None, cumulative: bool = False, nodes: int = 50) -> str:
    """`go tool pprof -top` of a profile by function (sorted by flat time, or by cumulative time: which
    callers the time went under), or of its difference from `base` (what the profile spent more)."""
    diff = ["-diff_base", str(base)] if base else []
    cum = ["-cum"] if cumulative else []
    res = subprocess.run(
        [go(), "tool", "pprof", "-top", *cum, f"-nodecount={nodes}", *diff, str(profile)],
        capture_output=True,
        text=True,
        check=True,
    )
    return res.stdout
