"""The time-to-first-token SLO (spec.scaling.autoscale.slo): a sustained breach raises the fleet's floor at once. Pure.

The HPA (or KEDA's) scales on per-pod averages, once per sync period (15 s by default), and a sudden rise
of demand shows in its metrics only as fast as they move. The SLO loop reads what users feel -- the
fleet's p95 time to first token -- every `SloSpec.check_seconds`, and when it stays over the target for
`breachSeconds` it raises the floor the forecast also raises: the Deployment grows in that same pass and
the autoscaler's minimum with it, so the HPA cannot take the replicas back. It then waits one model load
(the new pods must load before they can help) before it judges again, and releases the floor once the
SLO has been met for twice that long; from then on the autoscaler's metrics and the forecast decide.

`slo_step` folds one measurement into status.autoscaling.slo; the measuring itself (one instant query)
is autoscale/measure.py's. Only transitions change the stored state (a breach that starts or ends, a
floor raised or released), so a fleet within its SLO writes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from chatfleet_operator.spec import SloSpec
from chatfleet_operator.timefmt import parse_time, rfc3339

#: The rate window of the p95 query, seconds: two scrapes of a 15 s scrape interval.
WINDOW_SECONDS = 30


def p95_ttft_query(namespace: str, name: str) -> str:
    """The fleet's p95 time to first token in milliseconds over the last WINDOW_SECONDS, all its pods."""
    sel = f'namespace="{namespace}",model="{name}"'
    return (
        f"1000 * histogram_quantile(0.95, sum by (le) "
        f"(rate(chatfleet_time_to_first_token_seconds_bucket{{{sel}}}[{WINDOW_SECONDS}s])))"
    )


def _since(stamp: Any, now: datetime) -> float | None:
    when = parse_time(str(stamp or ""))
    return None if when is None else (now - when).total_seconds()


def settle_seconds(slo: SloSpec, load_seconds: float | None) -> float:
    """How long after a raise the next judgement waits: one model load, at least the breach window."""
    return max(float(slo.breach_seconds), float(load_seconds or 0))


def slo_step(
    slo: SloSpec,
    old: Mapping[str, Any] | None,
    p95_ms: float | None,
    now: datetime,
    total: int,
    max_replicas: int,
    load_seconds: float | None = None,
    error: str = "",
) -> dict[str, Any]:
    """status.autoscaling.slo after one measurement (`p95_ms` None: no requests in the window).

    e.g. target 450 ms, breaching since 6 s with breachSeconds 5, p95 900 ms, 4 replicas -> floor 8
    (a step of min(100 %, 900 / 450 - 1) of them, at least one, at most maxReplicas); met again for twice
    the settle time -> the floor released. An error (Prometheus unreachable) changes nothing but the reason.
    """
    st: dict[str, Any] = {k: v for k, v in (old or {}).items() if k != "error"}
    target = slo.ttft_p95_milliseconds
    st["targetMilliseconds"] = target
    if error:
        st["error"] = error
        return st
    floor = int(st.get("floor") or 0)
    settle = settle_seconds(slo, load_seconds)
    raised_ago = _since(st.get("raisedAt"), now)
    if p95_ms is not None and p95_ms > target:
        st.pop("metSince", None)
        st.setdefault("breachingSince", rfc3339(now))
        breached = _since(st["breachingSince"], now) or 0.0
        if breached >= slo.breach_seconds and (raised_ago is None or raised_ago >= settle):
            base = max(total, floor)
            step = max(1, math.ceil(base * min(1.0, p95_ms / target - 1)))
            new = min(max_replicas, base + step)
            if new > floor:
                capped = " (maxReplicas)" if new == max_replicas else ""
                st.update(
                    floor=new,
                    raisedAt=rfc3339(now),
                    reason=f"p95 time to first token {p95_ms:.0f} ms over {target} ms for {breached:.0f} s: "
                    f"floor {floor or 'none'} -> {new}{capped} ({base} replicas before)",
                )
        return st
    st.pop("breachingSince", None)
    if not floor:
        return st
    st.setdefault("metSince", rfc3339(now))
    met = _since(st["metSince"], now) or 0.0
    if met >= 2 * settle and (raised_ago is None or raised_ago >= 2 * settle):
        for key in ("floor", "raisedAt", "metSince"):
            st.pop(key, None)
        st["reason"] = (
            f"met for {met:.0f} s: floor {floor} released (the autoscaler's metrics and the forecast decide)"
        )
    return st


def slo_floor(state: Mapping[str, Any] | None) -> int:
    """The floor the SLO holds (0: none)."""
    return int((state or {}).get("floor") or 0)
