"""`kubectl chatbot`: release status as a readable tree, promote, abort, pause, resume, retry, undo, history, and the
generated Triton config each track's pods run (`config`: it rides in the Deployments' pod templates).

Manual control writes the same spec fields a GitOps commit would (docs/releases.md), so Git and kubectl
are one mechanism and the operator has one place to read intents from:
  promote NAME  -> spec.rollout.promote = <revision under release>   (skip the remaining steps)
  abort NAME    -> spec.rollout.abort   = <revision under release>   (roll back now)
  pause NAME    -> spec.rollout.paused  = true
  resume NAME   -> spec.rollout.paused  = false
  retry NAME    -> spec.rollout.retry   = <now>  (a rolled-back release starts again; an abort naming its
                                                  revision is cleared, or it would roll the retry back)
  undo NAME [--to-revision R]
                -> spec.model, .runtime, .resources, .podMetadata = those of the revision the last promotion
                   replaced (or R: a revision a kept promotion replaced), from status.releaseHistory[].previous;
                   the operator releases it back like any change, canary and analysis included
Naming the revision makes an intent one-shot: it cannot touch a later release; the retry token starts the
rolled-back release once per new token.
API access goes through chatfleet_operator.kube (the one module that talks to the API).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from chatfleet_operator import api, kube
from chatfleet_operator.builders.common import REVISION_FIELDS
from chatfleet_operator.pluginview import render_config, render_history, render_tree, rollout_outcome
from chatfleet_operator.release.state import ACTIVE_PHASES, ReleasePhase, Result
from chatfleet_operator.timefmt import rfc3339

#: `status --timeout` exit codes, as `kubectl argo rollouts status` users script them.
DONE, FAILED, TIMED_OUT = 0, 1, 2


def current_namespace(context: str | None = None) -> str:
    """Namespace of the kubeconfig's context (the current one unless named; default when none)."""
    path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or str(Path.home() / ".kube" / "config")
    try:
        cfg = yaml.safe_load(Path(path).read_text()) or {}
    except OSError:
        return "default"
    current = context or cfg.get("current-context")
    for ctx in cfg.get("contexts") or []:
        if ctx.get("name") == current:
            return (ctx.get("context") or {}).get("namespace") or "default"
    return "default"


def get_service(namespace: str, name: str) -> dict[str, Any]:
    """The ChatbotService, or exit with a clear message."""
    body = kube.get(api.KIND, namespace, name)
    if body is None:
        raise SystemExit(f"error: chatbotservice {namespace}/{name} not found")
    return body


def patch_spec(namespace: str, name: str, spec: dict[str, Any]) -> None:
    """JSON merge patch of the spec (None removes a field)."""
    kube.request(
        "PATCH",
        kube.object_path(api.KIND, namespace, name),
        body={"spec": spec},
        content_type="application/merge-patch+json",
        kind=api.KIND,
    )


def patch_rollout(namespace: str, name: str, fields: dict[str, Any]) -> None:
    """JSON merge patch of spec.rollout (the GitOps fields)."""
    patch_spec(namespace, name, {"rollout": fields})


def aborts(body: dict[str, Any], revision: str) -> bool:
    """Whether spec.rollout.abort names `revision` ('*': any): a release of it would be rolled back at once."""
    return ((body.get("spec") or {}).get("rollout") or {}).get("abort") in (revision, "*")


def show_status(ns: str, name: str, body: dict[str, Any], output: str) -> str:
    """`status` once: the tree (with the pods) or the status as JSON."""
    if output == "json":
        return json.dumps(body.get("status") or {}, indent=2)
    selector = f"{api.LABEL_SERVICE}={name}"
    pods = kube.request("GET", f"/api/v1/namespaces/{ns}/pods", query={"labelSelector": selector}, kind="Pod")
    return render_tree(body, pods.get("items", []))


def follow(
    ns: str,
    name: str,
    output: str,
    watch: bool,
    timeout: float | None,
    interval: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """`status --watch` / `--timeout`: poll every `interval` seconds; print the status whenever it changes
    (--watch) and stop at the rollout's outcome (--timeout: its exit code; --watch alone: never, Ctrl-C)."""
    deadline = None if timeout is None else clock() + timeout
    shown = None
    while True:
        body = get_service(ns, name)
        state, why = rollout_outcome(body)
        if watch:
            text = show_status(ns, name, body, output)
            if text != shown:
                print(text + "\n", flush=True)
                shown = text
        if timeout is not None and state != "progressing":
            print(f"chatbotservice {ns}/{name}: {'rolled out' if state == 'done' else 'failed'}: {why}")
            return DONE if state == "done" else FAILED
        if deadline is not None and clock() >= deadline:
            print(f"chatbotservice {ns}/{name}: still progressing after {timeout:g}s: {why}", file=sys.stderr)
            return TIMED_OUT
        sleep(interval)


def retry(ns: str, name: str, body: dict[str, Any], now: datetime | None = None) -> int:
    """`retry`: start a rolled-back release again (spec.rollout.retry = the time, a new token); an abort
    naming its revision ('*' any) is cleared with it, or it would roll the retry back at once."""
    rel = (body.get("status") or {}).get("release") or {}
    revision = rel.get("revision") if rel.get("phase") == ReleasePhase.ROLLED_BACK else None
    if not revision:
        print(f"error: no rolled-back release to retry on {ns}/{name}", file=sys.stderr)
        return 1
    fields: dict[str, Any] = {"retry": rfc3339(now or datetime.now(UTC))}
    if aborts(body, revision):
        fields["abort"] = None
    patch_rollout(ns, name, fields)
    print(f"chatbotservice {ns}/{name}: retry of revision {revision} requested")
    return 0


def undo(ns: str, name: str, body: dict[str, Any], to_revision: str | None = None) -> int:
    """`undo`: put back the spec fields of the revision a promotion replaced (the last promotion's, or the
    one that replaced `to_revision`), so the operator releases that revision again. Refused during a
    release (abort it instead), without a kept previous spec, or when the spec already holds it; an abort
    naming the revision going back ('*' any) is cleared with it, or it would roll the undo back."""
    st = body.get("status") or {}
    if ((st.get("release") or {}).get("phase")) in ACTIVE_PHASES:
        print(f"error: a release is in progress on {ns}/{name}: abort it instead", file=sys.stderr)
        return 1
    kept = [
        h
        for h in st.get("releaseHistory") or []
        if h.get("result") == Result.PROMOTED and isinstance(h.get("previous"), dict)
    ]
    if to_revision is None:
        entry = next((h for h in kept if h.get("revision") == st.get("stableRevision")), None)
    else:
        entry = next((h for h in kept if h["previous"].get("revision") == to_revision), None)
    if entry is None or not isinstance(entry["previous"].get("spec"), dict):
        which = f"revision {to_revision}" if to_revision else "the revision before the stable one"
        print(f"error: no kept spec of {which} on {ns}/{name} (kubectl chatbot history)", file=sys.stderr)
        return 1
    previous = entry["previous"]
    spec = body.get("spec") or {}
    fields = {key: previous["spec"].get(key) for key in REVISION_FIELDS}
    if all(spec.get(key) == value for key, value in fields.items()):
        print(
            f"error: the spec of {ns}/{name} already holds revision {previous.get('revision')}'s fields "
            "(that release came from the operator's defaults, not the spec)",
            file=sys.stderr,
        )
        return 1
    if aborts(body, previous.get("revision", "")):
        fields["rollout"] = {"abort": None}
    patch_spec(ns, name, fields)
    print(
        f"chatbotservice {ns}/{name}: undo to revision {previous.get('revision')} requested (a release starts)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `kubectl chatbot` (installed as kubectl-chatbot)."""
    parser = argparse.ArgumentParser(prog="kubectl chatbot", description="Chatfleet releases from kubectl")
    parser.add_argument(
        "command",
        choices=[
            "status",
            "promote",
            "abort",
            "pause",
            "resume",
            "retry",
            "undo",
            "history",
            "get",
            "config",
        ],
    )
    parser.add_argument("name", nargs="?")
    parser.add_argument("-n", "--namespace", default=None)
    parser.add_argument("-A", "--all-namespaces", action="store_true", help="get: every namespace")
    parser.add_argument("-o", "--output", choices=["tree", "json"], default="tree")
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--context", default=None, help="the kubeconfig context to use")
    parser.add_argument("-w", "--watch", action="store_true", help="status: show it again at every change")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"status: wait up to this many seconds for the rollout; exit {DONE} when the spec's revision is "
        f"stable and Ready, {FAILED} when it failed (rolled back, Stalled), {TIMED_OUT} when time ran out",
    )
    parser.add_argument(
        "--to-revision",
        default=None,
        help="undo: the revision to go back to (default: the one before stable)",
    )
    parser.add_argument("--interval", type=float, default=2.0, help=argparse.SUPPRESS)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except kube.UNREACHABLE as exc:
        print(f"error: {kube.unreachable_reason(exc)}", file=sys.stderr)
    except api.ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    """One command of `kubectl chatbot` (parsed by main), its exit code."""
    if args.kubeconfig or args.context:
        kube.configure(args.kubeconfig, context=args.context)
    ns = args.namespace or current_namespace(args.context)
    if args.command == "get" or not args.name:
        where = kube.object_path(api.KIND, None if args.all_namespaces else ns)
        for b in kube.request("GET", where, kind=api.KIND).get("items", []):
            st = b.get("status") or {}
            scope = f"{b['metadata']['namespace']:<20} " if args.all_namespaces else ""
            print(
                f"{scope}{b['metadata']['name']:<30} {st.get('phase', '?'):<12} "
                f"stable={st.get('stableRevision', '-')} canary={st.get('canaryRevision', '-')} "
                f"weight={st.get('canaryWeight', 0)}%"
            )
        return 0
    body = get_service(ns, args.name)
    st = body.get("status") or {}
    rel = st.get("release") or {}
    revision = rel.get("revision") if rel.get("phase") not in (None, ReleasePhase.ROLLED_BACK) else None
    if args.command == "status":
        if args.watch or args.timeout is not None:
            return follow(ns, args.name, args.output, args.watch, args.timeout, args.interval)
        print(show_status(ns, args.name, body, args.output))
        return 0
    if args.command == "history":
        print(render_history(body))
        return 0
    if args.command == "config":
        selector = f"{api.LABEL_SERVICE}={args.name}"
        deployments = kube.request(
            "GET",
            f"/apis/apps/v1/namespaces/{ns}/deployments",
            query={"labelSelector": selector},
            kind="Deployment",
        )
        print(render_config(deployments.get("items", [])))
        return 0
    if args.command in ("promote", "abort"):
        if not revision:
            print(f"error: no release in progress on {ns}/{args.name}", file=sys.stderr)
            return 1
        patch_rollout(ns, args.name, {args.command: revision})
        print(f"chatbotservice {ns}/{args.name}: {args.command} revision {revision} requested")
        return 0
    if args.command == "retry":
        return retry(ns, args.name, body)
    if args.command == "undo":
        return undo(ns, args.name, body, args.to_revision)
    patch_rollout(ns, args.name, {"paused": args.command == "pause"})
    print(f"chatbotservice {ns}/{args.name}: release {'paused' if args.command == 'pause' else 'resumed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
