"""The release's I/O edge: the traffic mode the cluster offers, and the analysis measurement when due.

The reconciler asks `Releases.traffic_mode` while it gathers the pass's context, and
`Releases.measure_if_due` before it plans (release/children.py `plan_pass`, pure). The Prometheus
measurement, the optional probe load and -- while the old revision drains its pinned dialogues -- the
check of its recent requests happen here, in the pass's worker thread; they never raise (an unreachable
Prometheus is an Error measurement, or a check without a figure). Each measurement is counted here, by
verdict and by figure (metrics.py), where it is taken.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace

from chatfleet_operator import api, metrics
from chatfleet_operator.analysis import quality, queries, shadow
from chatfleet_operator.analysis.answers import ask_all, ask_records, take_records
from chatfleet_operator.analysis.assess import INCONCLUSIVE, Measurement, Sample, assess, combine
from chatfleet_operator.analysis.probe import send_probe
from chatfleet_operator.analysis.provider import (
    PrometheusProvider,
    Provider,
    measurement_request,
    short_error,
)
from chatfleet_operator.analysis.targets import analysis_target_errors, fill_template
from chatfleet_operator.builders.deployment import ADMIN_PORT, CHAT_PORT
from chatfleet_operator.context import DialogueCheck, PassContext
from chatfleet_operator.converge.facts import PodFacts, Track
from chatfleet_operator.discovery import ServedGroup
from chatfleet_operator.release.planner import analysis_due, dialogue_check_due, strategy_of
from chatfleet_operator.release.state import ReleasePhase, last_verdict
from chatfleet_operator.release.traffic import HTTPROUTE, POOL_BACKENDS, REPLICA_RATIO, SERVICE_BACKENDS
from chatfleet_operator.settings import ReleaseSettings
from chatfleet_operator.spec import ChatbotServiceSpec, GoldenPromptSpec, ObjectRef, QualitySpec

log = logging.getLogger("chatfleet")

Prompts = tuple[GoldenPromptSpec, ...]
#: The seed a canary's shadow port answers with (greedy: it changes nothing, and stable gets the same).
SHADOW_SEED = 0


class Releases:
    """Measures and plans releases for the passes of one operator process."""

    def __init__(
        self,
        settings: ReleaseSettings | None = None,
        provider: Provider | None = None,
        serves_gateway_api: Callable[[], bool] | None = None,
        cluster_domain: str = "cluster.local",
        serves_inference_pools: Callable[[], bool] | None = None,
        read_config_map: Callable[[str, str], Mapping[str, str] | None] | None = None,
    ) -> None:
        self.settings = settings or ReleaseSettings()
        self.provider = provider or PrometheusProvider()
        self._gateway_api = ServedGroup(
            "Gateway API", serves_gateway_api, self.settings.discovery_cache_seconds
        )
        self._pools = ServedGroup(
            "Gateway API Inference Extension", serves_inference_pools, self.settings.discovery_cache_seconds
        )
        self.cluster_domain = cluster_domain
        self._read_config_map = read_config_map
        """(namespace, name) -> the ConfigMap's data, None when absent: spec.analysis.quality.promptsFrom."""
        #: Per ChatbotService, stable's last answers to the golden prompts: (stable revision, the quality
        #: spec and the prompts asked, the answers). Greedy answers of one revision do not change, so a
        #: step that has scaled stable to zero (the replica ratio's 100 %) is judged against them. Lost on
        #: restart.
        self._stable_answers: dict[
            tuple[str, str], tuple[str, tuple[QualitySpec, Prompts], list[quality.Answer]]
        ] = {}
        #: Per ChatbotService in a shadow phase: (the canary revision, the records taken and not yet
        #: asked of stable, the pairs compared). Lost on restart: the phase then gathers its evidence anew.
        self._shadow: dict[
            tuple[str, str], tuple[str, list[shadow.Record], list[tuple[shadow.Record, quality.Answer]]]
        ] = {}

    def rediscover(self) -> None:
        """Forget the cached answers about Gateway API and its Inference Extension (CRDs appeared or went)."""
        self._gateway_api.forget()
        self._pools.forget()

    def traffic_mode(self) -> str:
        """HTTPRoute when the cluster serves Gateway API (discovery, cached a few seconds), else ReplicaRatio."""
        return HTTPROUTE if self._gateway_api.served() else REPLICA_RATIO

    def backends(self) -> str:
        """InferencePool where --routing is auto and the cluster serves inference.networking.k8s.io/v1
        (discovery, cached), else Service. Only an HTTPRoute has backends (gather_context)."""
        if self.settings.routing == SERVICE_BACKENDS or not self._pools.served():
            return SERVICE_BACKENDS
        return POOL_BACKENDS

    def target_errors(self, ref: ObjectRef, spec: ChatbotServiceSpec) -> list[str]:
        """Why the analysis URLs of this spec must not be called (each message names its field); [] if fine."""
        return analysis_target_errors(
            spec.analysis.probe,
            spec.analysis.prometheus_address,
            ref.namespace,
            ref.name,
            default_probe_template=self.settings.probe_url_template,
            allowed=self.settings.analysis_allowed_hosts,
            cluster_domain=self.cluster_domain,
        ) + quality.spec_errors(spec.analysis.quality)

    def measure(self, ctx: PassContext) -> Measurement:
        """One measurement (probing first when the last one had no data and the spec asks). Never raises."""
        ref, spec = ctx.ref, ctx.spec
        track = strategy_of(spec).track
        plan = measurement_request(ref.namespace, ref.name, spec, track)
        refused = self.target_errors(ref, spec)
        if refused:  # nothing is called: an Error measurement naming the field (never a pass)
            return assess(Sample(ctx.now, error="; ".join(refused)), [q.check for q in plan.metrics])
        probe = spec.analysis.probe
        if probe.enabled and last_verdict(ctx.old_status) == INCONCLUSIVE:
            template = probe.url or self.settings.probe_url_template
            url = fill_template(template, ref.namespace, ref.name, track, self.cluster_domain)
            send_probe(
                url,
                ref.name,
                requests=probe.requests,
                prompts=probe.prompts,
                budget_seconds=min(10.0, spec.analysis.interval_seconds / 2),
            )
        sample = self.provider.measure(plan, ctx.now)
        m = assess(sample, [q.check for q in plan.metrics])
        if spec.analysis.quality.enabled:
            m = combine(m, self.measure_answers(ctx))
        if shadowing(ctx):
            m = combine(m, self.measure_shadow(ctx))
        else:  # the phase is over (or never was): its evidence goes
            self._shadow.pop((ref.namespace, ref.name), None)
        log.info(
            "Measured release of ChatbotService %s/%s: %s %s", ref.namespace, ref.name, m.verdict, m.message
        )
        return m

    def measure_answers(self, ctx: PassContext) -> Measurement:
        """The quality gate's measurement: the golden prompts asked of one pod per track, scored. Never raises."""
        q = ctx.spec.analysis.quality
        checks = quality.checks_of(q)
        prompts, errors = self.golden_prompts(ctx.ref.namespace, q)
        if errors:  # never a pass, never a rollback on its own: an Error naming the field
            return assess(Sample(ctx.now, error="; ".join(errors)), checks)
        canary, stable = answering_pod(ctx.canary), answering_pod(ctx.stable)
        key = (ctx.ref.namespace, ctx.ref.name)
        kept = self._stable_answers.get(key)
        asked = (q, prompts)
        kept_answers = kept[2] if kept is not None and kept[:2] == (ctx.stable.revision, asked) else None
        if canary is None or (stable is None and kept_answers is None):
            which = "the canary" if canary is None else "stable (and none of its answers kept)"
            return Measurement(ctx.now, INCONCLUSIVE, f"golden prompts: no Ready pod of {which} to ask yet")
        budget = min(60.0, max(5.0, ctx.spec.analysis.interval_seconds / 2))

        def ask(pod: PodFacts) -> list[quality.Answer]:
            url = f"http://{pod.ip}:{CHAT_PORT}/v1/chat/completions"
            return ask_all(
                url,
                ctx.ref.name,
                prompts,
                # the runtime refuses more than its spec.runtime.maxNewTokens (a 400 for every prompt)
                max_tokens=min(q.max_tokens, ctx.spec.runtime.max_new_tokens),
                seed=q.seed,
                timeout_seconds=q.timeout_seconds,
                budget_seconds=budget,
            )

        if stable is not None:
            stable_answers = ask(stable)
            if any(a.text is not None for a in stable_answers):
                self._stable_answers[key] = (ctx.stable.revision, asked, stable_answers)
        else:
            stable_answers = kept_answers or []
        result = quality.score(prompts, ask(canary), stable_answers)
        m = assess(quality.to_sample(result, ctx.now, len(prompts)), checks)
        if result.misses and m.verdict != INCONCLUSIVE:
            shown = "; ".join(result.misses[:5]) + (" ..." if len(result.misses) > 5 else "")
            m = replace(m, message=f"{m.message} (golden prompts: {shown})")
        return m

    def measure_shadow(self, ctx: PassContext) -> Measurement:
        """The shadow phase's measurement: the records taken from every Ready canary pod, up to
        comparisonsPerInterval of them asked of one stable pod, all pairs since the phase began scored.
        Never raises."""
        q = ctx.spec.analysis.quality
        key = (ctx.ref.namespace, ctx.ref.name)
        revision = ctx.canary.revision
        kept = self._shadow.get(key)
        pending, pairs = (kept[1], kept[2]) if kept is not None and kept[0] == revision else ([], [])
        problems = []
        for pod in serving_pods(ctx.canary):
            records, overflowed, error = take_records(f"http://{pod.ip}:{ADMIN_PORT}/shadow/records")
            pending += records
            if error:
                problems.append(error)
            if overflowed:
                log.info("Canary pod %s lost %d shadow records to its bound", pod.name, overflowed)
        stable = answering_pod(ctx.stable)
        batch = pending[: q.shadow.comparisons_per_interval] if stable is not None else []
        if batch:
            budget = min(60.0, max(5.0, ctx.spec.analysis.interval_seconds / 2))
            url = f"http://{stable.ip}:{CHAT_PORT}/v1/chat/completions"
            answers = ask_records(
                url,
                ctx.ref.name,
                batch,
                seed=SHADOW_SEED,
                timeout_seconds=q.timeout_seconds,
                budget_seconds=budget,
            )
            pairs += list(zip(batch, answers, strict=True))
            del pending[: len(batch)]
        pending, pairs = pending[-shadow.KEEP :], pairs[-shadow.KEEP :]
        self._shadow[key] = (revision, pending, pairs)
        short = shadow.too_few(ctx.now, pairs, q.shadow.min_requests, len(pending))
        if short is not None:
            why = f" (no records from {'; '.join(problems)})" if problems else ""
            return replace(short, message=short.message + why)
        counted = shadow.compared(pairs)
        result = shadow.score(pairs)  # the scorer leaves out the requests stable did not answer
        m = assess(quality.to_sample(result, ctx.now, counted), shadow.checks_of(q))
        m = replace(m, message=f"{m.message} (shadow: {counted} mirrored requests compared)")
        if result.misses and m.verdict != INCONCLUSIVE:
            shown = "; ".join(result.misses[:3]) + (" ..." if len(result.misses) > 3 else "")
            m = replace(m, message=f"{m.message} ({shown})")
        return m

    def golden_prompts(self, namespace: str, q: QualitySpec) -> tuple[Prompts, list[str]]:
        """The prompts to ask: the inline ones, then those of promptsFrom's ConfigMap key (read now, so an
        edit applies at the next interval); or what is wrong, each message naming the field."""
        if q.prompts_from is None:
            return (q.prompts, []) if q.prompts else ((), ["spec.analysis.quality.prompts is empty"])
        src = q.prompts_from
        where = f"spec.analysis.quality.promptsFrom (ConfigMap {src.config_map!r}, key {src.key!r})"
        if self._read_config_map is None:
            return (), [f"{where}: this operator cannot read ConfigMaps"]
        try:
            data = self._read_config_map(namespace, src.config_map)
        except Exception as exc:  # never raise: an Error measurement, counted apart
            return (), [f"{where} could not be read: {short_error(exc)}"]
        if data is None:
            return (), [f"{where}: the ConfigMap does not exist"]
        if src.key not in data:
            return (), [
                f"{where}: the ConfigMap has no key {src.key!r} (keys: {', '.join(sorted(data)) or 'none'})"
            ]
        more, errors = quality.prompts_from_text(data[src.key], where, q.prompts)
        return (q.prompts + more, errors)

    def old_revision_requests(self, ctx: PassContext) -> DialogueCheck:
        """Requests the stable track served in the last idleSeconds (only pinned dialogues reach it). Never raises."""
        ref, spec = ctx.ref, ctx.spec
        refused = self.target_errors(ref, spec)
        if refused:
            return DialogueCheck(None, "; ".join(refused))
        target = queries.Target(ref.namespace, ref.name, api.TRACK_STABLE)
        promql = queries.requests_within(target, spec.rollout.sticky.idle_seconds)
        address = spec.analysis.prometheus_address
        try:
            value = self.provider.query(address, promql)
        except Exception as exc:  # never raise: the drain holds, bounded by maxDrainSeconds
            return DialogueCheck(None, f"Prometheus at {address} did not answer: {short_error(exc)}")
        return DialogueCheck(value or 0.0)

    def measure_if_due(self, ctx: PassContext) -> PassContext:
        """The context with this pass's measurement and dialogue check, each when one is due."""
        if analysis_due(ctx.spec, ctx.release_status.release, ctx.canary, ctx.now):
            measurement = self.measure(ctx)
            metrics.analysis_measured(measurement.verdict, measurement.figures)
            ctx = replace(ctx, measurement=measurement)
        if dialogue_check_due(ctx.spec, ctx.release_status.release, ctx.now):
            ctx = replace(ctx, dialogue_check=self.old_revision_requests(ctx))
        return ctx


def shadowing(ctx: PassContext) -> bool:
    """Whether this pass's release is in its shadow phase (the old status says; the plan comes after)."""
    rel = ctx.release_status.release
    return (
        ctx.spec.analysis.quality.shadow.enabled and rel is not None and rel.phase == ReleasePhase.SHADOWING
    )


def serving_pods(track: Track) -> list[PodFacts]:
    """The pods of a track that are Ready, serving, of its revision and have an address, by name."""
    ready = [
        p
        for p in track.pods
        if p.ready and p.ip and not p.deleting and p.serving != "false" and p.revision == track.revision
    ]
    return sorted(ready, key=lambda p: p.name)


def answering_pod(track: Track) -> PodFacts | None:
    """The pod of a track the golden prompts go to: the first by name that is Ready, serving, of the
    track's revision and has an address (the same pod each interval while it lives)."""
    ready = serving_pods(track)
    return ready[0] if ready else None
