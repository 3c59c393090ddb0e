"""What `kubectl chatbot` prints: the release status tree, the rollout's outcome, the history table and
the generated Triton config. Pure: the plugin (plugin.py) fetches the objects and calls these."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.analysis.assess import Figure
from chatfleet_operator.release.planner import stepped
from chatfleet_operator.release.state import ACTIVE_PHASES, ReleasePhase
from chatfleet_operator.timefmt import parse_time


def _ago(value: Any, now: datetime) -> str:
    """'12s ago' from an RFC 3339 timestamp ('' when absent)."""
    if not value:
        return ""
    t = parse_time(value)
    if t is None:
        return str(value)
    return f"{max(0, int((now - t).total_seconds()))}s ago"


def _cond(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    """A condition by type ({} when absent)."""
    return next((c for c in status.get("conditions") or [] if c.get("type") == ctype), {})


def _figure(f: dict[str, Any]) -> str:
    """One analysis figure as text, spelt as the analysis spells it (a ceiling, a floor, noise)."""
    figure = Figure.from_status(f)
    return f"[{'ok ' if figure.ok else 'BAD'}] {figure.text()}"


def render_tree(body: dict[str, Any], pods: list[dict[str, Any]], now: datetime | None = None) -> str:
    """The status tree of one ChatbotService (pure, so it is unit-tested)."""
    now = now or datetime.now(UTC)
    meta, spec, st = body.get("metadata", {}), body.get("spec") or {}, body.get("status") or {}
    ready = _cond(st, api.COND_READY)
    lines = [
        f"ChatbotService {meta.get('namespace')}/{meta.get('name')}   phase {st.get('phase', '?')}   "
        f"Ready {ready.get('status', '?')} ({ready.get('reason', '')})"
    ]
    rel = st.get("release") or {}
    stable, update = st.get("stableRevision", "-"), st.get("updateRevision", "-")
    items: list[tuple[str, list[str]]] = []
    revs = f"stable {stable}"
    if rel:
        revs += f" -> {rel.get('revision')} ({rel.get('strategy')}, traffic {rel.get('traffic')}"
        revs += f", GPUs {rel.get('capacity')})"
    elif update != stable:
        revs += f", spec {update}"
    items.append((f"Revisions: {revs}", []))
    if rel:
        steps = ((spec.get("rollout") or {}).get("canary") or {}).get("steps") or []
        idx = int(rel.get("stepIndex") or 0)
        sub = []
        if stepped(rel.get("strategy")) and steps:
            phase = rel.get("phase")
            shadow = rel.get("shadowPassedAt") or phase == ReleasePhase.SHADOWING
            # rolled back while shadowing: no step ever took a weight
            shadow_failed = (
                phase == ReleasePhase.ROLLED_BACK
                and rel.get("shadowStartedAt")
                and not rel.get("shadowPassedAt")
            )
            marks = []
            if shadow or shadow_failed:
                now_or_done = "now" if phase == ReleasePhase.SHADOWING else "done"
                marks.append(f"shadow {'rolled back' if shadow_failed else now_or_done}")
            for i, s in enumerate(steps):
                if shadow_failed or phase == ReleasePhase.SHADOWING:
                    mark = "-" if shadow_failed else "next"
                elif phase == ReleasePhase.ROLLED_BACK:
                    mark = "done" if i < idx else "rolled back" if i == idx else "-"
                elif phase != ReleasePhase.STEPPING:
                    mark = "done"
                else:
                    mark = "done" if i < idx else "now" if i == idx else "next"
                marks.append(f"{s.get('weight')}% {mark}")
            sub.append("Steps: " + ", ".join(marks))
        if rel.get("waitingForGPUs"):
            sub.append("WAITING FOR GPUs: pods of the new revision cannot be scheduled")
        if rel.get("message"):
            sub.append(f"Message: {rel['message']}")
        weight = st.get("canaryWeight", 0)
        head = f"Release: {rel.get('phase')}, step {idx + 1}, weight {weight}%"
        if rel.get("effectiveWeight") is not None and rel.get("traffic") == "ReplicaRatio":
            head += f" (effective {rel['effectiveWeight']}% by replicas)"
        head += f", started {_ago(rel.get('startedAt'), now)}"
        items.append((head, sub))
        a = rel.get("analysis") or {}
        ahead = (
            f"Analysis: {a.get('checks', 0)} checks, {a.get('failed', 0)} failed, {a.get('errors', 0)} errors, "
            f"{a.get('inconclusive', 0)} inconclusive; last {a.get('lastVerdict', '-')} "
            f"{_ago(a.get('lastMeasuredAt'), now)}"
        )
        asub = [_figure(f) for f in a.get("figures") or []]
        if a.get("lastVerdict") in ("Error", "Inconclusive") and a.get("lastMessage"):
            asub.append(a["lastMessage"])
        items.append((ahead, asub))
    if st.get("abortReason") and (rel.get("phase") == ReleasePhase.ROLLED_BACK or not rel):
        items.append((f"Last rollback: {st['abortReason']}", []))
    by_track: dict[str, list[int]] = {}
    for p in pods:
        labels = p.get("metadata", {}).get("labels") or {}
        track = labels.get(api.LABEL_TRACK, "?")
        ok = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (p.get("status") or {}).get("conditions") or []
        )
        counts = by_track.setdefault(f"{track} {labels.get(api.LABEL_REVISION, '')}", [0, 0])
        counts[0] += int(ok)
        counts[1] += 1
    auto = st.get("autoscaling") or {}
    if auto:
        sub = []
        fc = auto.get("forecast") or {}
        if fc:
            rps = fc.get("requestsPerSecond")
            peak = "no forecast" if rps is None else f"peak {rps:g} req/s over {fc.get('leadSeconds')} s"
            sub.append(
                f"Forecast floor {fc.get('floor')} ({peak}, {_ago(fc.get('computedAt'), now)}): {fc.get('reason', '')}"
            )
        pool = auto.get("warmPool") or {}
        if pool:
            sub.append(
                f"Warm pool: {pool.get('ready', 0)}/{pool.get('desired', 0)} Ready, {pool.get('gpus', 0)} GPUs held"
            )
        load = auto.get("modelLoadSeconds") or {}
        if load:
            sub.append(
                f"Model load: {load.get('seconds')} s (revision {load.get('revision')}, {load.get('samples')} pods)"
            )
        active = _cond(st, api.COND_SCALING_ACTIVE)
        head = f"Autoscaling: {auto.get('metricsSource', '?')}, desired {st.get('desiredReplicas', '?')}"
        if active:
            head += f", metrics {active.get('status')} ({active.get('reason')})"
            if active.get("status") == "False":
                sub.append(str(active.get("message", "")))
        items.append((head, sub))
    routing = st.get("routing") or {}
    if routing:
        served = _cond(st, api.COND_ROUTE_SERVED)
        head = f"Routing: HTTPRoute -> {routing.get('backends', '?')}"
        if served:
            head += f", route served {served.get('status')} ({served.get('reason')})"
        sub = [
            f"InferencePool {p.get('name')}: accepted {p.get('status')} ({p.get('reason', '')})"
            + (f": {p['message']}" if p.get("status") == "False" and p.get("message") else "")
            for p in routing.get("pools") or []
        ]
        picker = routing.get("picker")
        if picker is not None:
            sub.append(
                f"Endpoint picker: {'Ready' if picker.get('ready') else 'not Ready'}"
                + (f": {picker['message']}" if picker.get("message") else "")
            )
        items.append((head, sub))
    pods_text = ", ".join(f"{k}: {r}/{n} Ready" for k, (r, n) in sorted(by_track.items())) or "none"
    items.append((f"Pods: {pods_text}", []))
    for i, (head, sub) in enumerate(items):
        last = i == len(items) - 1
        lines.append(("`-- " if last else "|-- ") + head)
        for j, s in enumerate(sub):
            lines.append(("    " if last else "|   ") + ("`-- " if j == len(sub) - 1 else "|-- ") + s)
    return "\n".join(lines)


def rollout_outcome(body: dict[str, Any]) -> tuple[str, str]:
    """Where a ChatbotService's rollout of its spec stands (pure): ("done" | "failed" | "progressing", why).

    done: the status is of the current generation, Ready is True, nothing reconciles, no release runs and
    the stable revision is the spec's. failed: Stalled is True (a problem only a spec change ends), or the
    release of the spec's revision was rolled back. Anything else is still progressing.
    """
    meta, st = body.get("metadata") or {}, body.get("status") or {}
    rel = st.get("release") or {}
    update = st.get("updateRevision")
    stalled = _cond(st, api.COND_STALLED)
    if rel.get("phase") == ReleasePhase.ROLLED_BACK and rel.get("revision") == update:
        return "failed", f"revision {update} was rolled back: {rel.get('message', '')}".rstrip(": ")
    if stalled.get("status") == "True":
        return "failed", f"Stalled: {stalled.get('reason', '')}: {stalled.get('message', '')}".rstrip(": ")
    if st.get("observedGeneration") != meta.get("generation"):
        return (
            "progressing",
            f"status is of generation {st.get('observedGeneration')}, spec {meta.get('generation')}",
        )
    if rel.get("phase") in ACTIVE_PHASES:
        return (
            "progressing",
            f"release of {rel.get('revision')}: {rel.get('phase')}, traffic {rel.get('traffic')}",
        )
    ready, reconciling = _cond(st, api.COND_READY), _cond(st, api.COND_RECONCILING)
    if reconciling.get("status") == "True":
        return "progressing", f"Reconciling: {reconciling.get('reason', '')}"
    if ready.get("status") != "True":
        return "progressing", f"not Ready: {ready.get('reason', '')}"
    if st.get("stableRevision") != update:
        return "progressing", f"stable {st.get('stableRevision')}, spec {update}"
    return "done", f"revision {update} is stable and Ready"


def render_history(body: dict[str, Any]) -> str:
    """status.releaseHistory as a table, newest first."""
    rows = [("REVISION", "RESULT", "AT", "MESSAGE")]
    for h in (body.get("status") or {}).get("releaseHistory") or []:
        rows.append((h.get("revision", ""), h.get("result", ""), h.get("at", ""), h.get("message", "")))
    if len(rows) == 1:
        return "no releases yet"
    widths = [max(len(str(r[i])) for r in rows) for i in range(3)]
    return "\n".join("  ".join(str(r[i]).ljust(widths[i]) for i in range(3)) + "  " + str(r[3]) for r in rows)


def render_config(deployments: list[dict[str, Any]]) -> str:
    """The config.pbtxt files each Deployment's pods get (pod template annotations), stable first.

    e.g. "# deployment/bot (track stable, revision 5f2c...): chat.config.pbtxt" then the file's text.
    """
    order = {api.TRACK_STABLE: 0, api.TRACK_CANARY: 1, api.TRACK_PREVIEW: 2}
    out = []
    for dep in sorted(
        deployments, key=lambda d: order.get((d["metadata"].get("labels") or {}).get(api.LABEL_TRACK, ""), 9)
    ):
        labels = dep["metadata"].get("labels") or {}
        template = dep.get("spec", {}).get("template", {}).get("metadata", {})
        annotations = template.get("annotations") or {}
        for key in sorted(k for k in annotations if k.startswith(api.TRITON_CONFIG_PREFIX)):
            out.append(
                f"# deployment/{dep['metadata']['name']} (track {labels.get(api.LABEL_TRACK, '?')}, revision "
                f"{labels.get(api.LABEL_REVISION, '?')}): {key[len(api.TRITON_CONFIG_PREFIX) :]}"
            )
            out.append(annotations[key].rstrip("\n"))
    return "\n".join(out) if out else "no Triton config found (no Deployment yet?)"
