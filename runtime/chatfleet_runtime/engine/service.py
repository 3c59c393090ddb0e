"""The chat model service: everything the Triton model does, in plain Python (no Triton imports).

``model.py`` (the Triton adapter) only converts tensors and sends responses; this module parses the
model parameters, loads the model once, validates and renders each request, runs one batched generate
per batch (``run``: static mode) or hands each request to the in-flight engine (``submit``), and reports
metrics through an observer. Tests drive it directly.

Request wire format (Triton inputs, see ``tritonconfig``):

- ``MESSAGES``: UTF-8 JSON list of ``{role, content}`` (or plain text, taken as one user message).
- ``PARAMETERS`` (optional): UTF-8 JSON object with ``max_tokens``, ``temperature``, ``top_p``, ``stop``,
  ``seed``, ``top_k``, ``session_id`` (enables prefix reuse for the conversation), ``prefix_cache`` (bool) and
  ``stream`` (bool, default true; false: no deltas, the final response carries the whole text, so a
  non-streaming request joins the same running batch as the streamed ones).

Errors caused by the request start with ``invalid_request:`` so the chat API can map them to HTTP 400.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from chatfleet_contract.parameters import ModelParameters, read_model_config
from chatfleet_contract.tritonconfig import INVALID_REQUEST as INVALID
from chatfleet_contract.tritonconfig import OVERLOADED

from chatfleet_runtime.engine import calibration, kvsizing
from chatfleet_runtime.engine.calibration import Agreement
from chatfleet_runtime.engine.generation import BatchGenerator
from chatfleet_runtime.engine.inflight import InflightEngine
from chatfleet_runtime.engine.prefix_cache import PrefixCache
from chatfleet_runtime.engine.rows import GenerationRequest, GenerationResult
from chatfleet_runtime.engine.termination import write_termination_message
from chatfleet_runtime.prompting import (
    RequestError,
    continuation_flag,
    parse_continuation,
    parse_sampling,
    render_prompt,
    validate_messages,
    validate_session_id,
)

log = logging.getLogger(__name__)

#: Largest `top_k` a request may ask for (0, the default, means every token).
TOP_K_MAX = 1000


class Observer(Protocol):
    """Metric sink (the Triton adapter implements it with pb_utils metrics)."""

    def batch(self, rows: int, generate_s: float, tokens: int) -> None:
        """A batch ran (or, in-flight, requests joined a batch of `rows`)."""

    def finished(self, result: GenerationResult) -> None:
        """A request finished."""

    def cache(self, cache: PrefixCache) -> None:
        """The prefix cache after a batch or a finished request."""

    def placement(self, requested: str, precision: str, device: str) -> None:
        """The precision asked for, the one that runs and the device (once, at load)."""

    def kv_sizing(self, sizing: kvsizing.KvSizing) -> None:
        """The KV memory, budget, prefix store and row limit resolved at load (once)."""


class NullObserver:
    """Observer that records nothing."""

    def batch(self, rows: int, generate_s: float, tokens: int) -> None:
        """Ignore a batch."""

    def finished(self, result: GenerationResult) -> None:
        """Ignore a finished row."""

    def cache(self, cache: PrefixCache) -> None:
        """Ignore cache statistics."""

    def placement(self, requested: str, precision: str, device: str) -> None:
        """Ignore the placement."""

    def kv_sizing(self, sizing: kvsizing.KvSizing) -> None:
        """Ignore the KV sizing."""


@dataclass(frozen=True)
class ServiceSettings(ModelParameters):
    """One model instance's settings: the config.pbtxt parameters (the pod contract's schema and defaults)
    plus what Triton tells the instance about itself."""

    kind: str = "KIND_CPU"
    """Triton's instance kind (KIND_GPU or KIND_CPU) from the instance group."""
    max_batch_size: int = 8
    """Rows in one batch (Triton's max_batch_size); the in-flight engine's cap, under the rows the KV budget fits."""
    instances: int = 1
    """Model instances sharing this instance's device (the instance group's count): they split its KV memory."""
    device_id: int | None = None
    """The GPU Triton assigned this instance (args['model_instance_device_id']); None: the default."""

    @classmethod
    def from_triton_args(cls, args: Mapping[str, str]) -> ServiceSettings:
        """Settings of one Triton model instance from `initialize(args)`: its config and assigned device."""
        config = json.loads(args["model_config"])
        params, kind, max_batch_size = read_model_config(config)
        groups = config.get("instance_group") or [{}]
        raw = args.get("model_instance_device_id")
        on_gpu = str(args.get("model_instance_kind", "")).upper() == "GPU" and kind == "KIND_GPU"
        return cls.from_parameters(
            params,
            kind=kind,
            max_batch_size=max_batch_size,
            instances=max(1, int(groups[0].get("count") or 1)),
            device_id=int(raw) if on_gpu and raw not in (None, "") else None,
        )


@dataclass
class Prepared:
    """A validated request ready for the batch, or the error message to answer with."""

    request: GenerationRequest | None = None
    error: str | None = None


def error_message(kind: str, message: str) -> str:
    """The wire message of a failed row: `invalid_request: ...` for the client's fault, `overloaded: ...` when
    the KV budget refused it, else `internal: ...`."""
    prefix = {"invalid": INVALID, "overloaded": OVERLOADED}.get(kind, "internal: ")
    return prefix + message


def _decode(raw: Any) -> str:
    if isinstance(raw, bytes):
        return raw.decode("utf-8")
    return str(raw)


class ChatService:
    """Loads the model once and serves batches of chat requests."""

    def __init__(
        self, settings: ServiceSettings, observer: Observer | None = None, *, model=None, tokenizer=None
    ):
        from chatfleet_runtime.engine import loading

        self.settings = settings
        self.observer = observer or NullObserver()
        loading.set_threads(settings.torch_threads)
        import torch

        self.placement = loading.choose_placement(
            settings.precision,
            settings.kind,
            cuda_available=torch.cuda.is_available(),
            bf16_supported=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
            cpu_bf16=bool(loading.cpu_bf16_flags(loading.read_cpuinfo())),
            device_id=settings.device_id,
            device_count=torch.cuda.device_count() if torch.cuda.is_available() else 0,
        )
        if self.placement.reason:
            # auto resolving is expected (info); an explicit precision that cannot run is a warning.
            say = log.info if settings.precision == "auto" else log.warning
            say("placement: %s", self.placement.reason)
        # Say what runs: fp16 (or bf16 without CPU bf16) asked on a CPU pod runs fp32, never silently.
        log.info(
            "serving precision %s on %s (asked: %s)",
            self.placement.precision,
            self.placement.device,
            settings.precision,
        )
        self.observer.placement(settings.precision, self.placement.precision, self.placement.device)
        loading.use_attention_kernels(self.placement.device)
        self.tokenizer = tokenizer or loading.load_tokenizer(
            settings.tokenizer_source, settings.chat_template
        )
        self.precision_check: Agreement | None = None
        if model is None and self.placement.precision == "int8":
            model = self._load_int8_checked()
        self.model = model or loading.load_model(settings.model_dir, self.placement)
        self.prefix_cache = PrefixCache(settings.prefix_cache_entries, 0)  # its bytes: kv_sizing below
        self.generator = BatchGenerator(
            self.model,
            self.tokenizer,
            prefix_cache=self.prefix_cache,
            stream_interval_s=settings.stream_interval_ms / 1000,
            cancel_check_interval_s=settings.cancel_check_ms / 1000,
        )
        on_gpu = self.placement.device.startswith("cuda")
        # What one instance holds once loaded: its weights on a GPU, its whole process on a CPU.
        self.kv = self._size_kv(loading.weights_bytes(self.model) if on_gpu else kvsizing.resident_bytes())
        self.prefix_cache.max_bytes = self.kv.prefix_cache
        self.engine: InflightEngine | None = None
        if settings.warmup:
            self.warmup()

    def _size_kv(self, loaded: int) -> kvsizing.KvSizing:
        """Resolve the KV memory (budget, prefix store, rows) once, log it and report it to the observer."""
        s = self.settings
        measure = s.kv_memory_bytes <= 0 and s.kv_memory_fraction > 0
        sizing = kvsizing.kv_sizing(
            device_memory=kvsizing.device_memory(self.placement.device) if measure else 0,
            loaded_bytes=loaded,
            instances=s.instances,
            fraction=s.kv_memory_fraction,
            memory_bytes=s.kv_memory_bytes,
            prefix_bytes=s.prefix_cache_bytes,
            per_position=self.generator.kv_bytes_per_position(),
            typical_prompt=s.kv_typical_prompt_tokens,
            max_new_tokens=s.max_new_tokens,
            max_rows=s.max_batch_size,
        )
        log.info("kv cache: %s", sizing.describe())
        self.observer.kv_sizing(sizing)
        return sizing

    def _load_int8_checked(self):
        """The int8 model, after its agreement with full precision passed; else report it and raise."""
        from chatfleet_runtime.engine import loading

        settings = self.settings
        try:
            prompts, source = calibration.read_prompts(
                settings.calibration_prompts, settings.calibration_file
            )
        except (calibration.PrecisionCheckFailed, ValueError) as exc:
            _refuse_to_serve(f"{calibration.FAILURE_PREFIX} {exc}", cause=exc)
        model, measured = loading.load_int8_checked(
            settings.model_dir, self.placement, self.tokenizer, prompts, source
        )
        self.precision_check = measured
        if measured.ratio < settings.int8_min_agreement:
            _refuse_to_serve(calibration.failure_message(measured, settings.int8_min_agreement))
        log.info(
            "int8 agreement %.3f >= %.3f (%d/%d next-token positions, prompts: %s)",
            measured.ratio,
            settings.int8_min_agreement,
            measured.same,
            measured.positions,
            source,
        )
        return model

    def start_inflight(self) -> InflightEngine:
        """Start the continuous-batching engine (the model uses it instead of run() unless in static mode)."""
        if self.engine is None:
            self.engine = InflightEngine(
                self.generator,
                max_rows=self.kv.rows,
                on_join=lambda rows, joined: self.observer.batch(rows, 0.0, 0),
                kv_budget_bytes=self.kv.budget,
                max_waiting=self.settings.admission_queue,
                max_wait_s=self.settings.admission_wait_ms / 1000,
                prefill_chunk_tokens=self.settings.prefill_chunk_tokens,
            )
        return self.engine

    def submit(self, request: GenerationRequest, on_done) -> None:
        """Hand a prepared request to the in-flight engine; on_done(result, error) is called once."""
        assert self.engine is not None, "start_inflight() first"

        def done(result, error):
            if result is not None:
                self.observer.finished(result)
                self.observer.cache(self.prefix_cache)
            on_done(result, error)

        self.engine.submit(request, done)

    def close(self) -> None:
        """Stop the in-flight engine, if any."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def warmup(self) -> GenerationResult:
        """Run one short generation so the first real request does not pay for lazy initialisation."""
        prep = self.prepare(
            b'[{"role":"user","content":"warm-up"}]', b'{"max_tokens":2,"prefix_cache":false}'
        )
        assert prep.request is not None, prep.error
        return self.generator.generate([prep.request])[0]

    def prepare(
        self,
        messages_raw: Any,
        params_raw: Any = None,
        *,
        on_text: Callable[[str, int, int], None] | None = None,
        is_cancelled: Callable[[], bool] | None = None,
    ) -> Prepared:
        """Validate one request's inputs and render its prompt; never raises for bad input."""
        try:
            text = _decode(messages_raw)
            try:
                messages = json.loads(text)
            except json.JSONDecodeError:
                messages = [{"role": "user", "content": text}]
            if isinstance(messages, str):
                messages = [{"role": "user", "content": messages}]
            params: dict[str, Any] = {}
            if params_raw not in (None, b"", ""):
                try:
                    params = json.loads(_decode(params_raw))
                except json.JSONDecodeError as exc:
                    raise RequestError(f"parameters: not valid JSON ({exc.msg})") from exc
            if not isinstance(params, dict):
                raise RequestError("parameters: must be an object")
            messages = validate_messages(messages, continuing=continuation_flag(params))
            continuing = parse_continuation(params, messages)
            sampling = parse_sampling(
                params,
                max_new_tokens_limit=self.settings.max_new_tokens,
                default_max_tokens=self.settings.default_max_tokens,
            )
            top_k = params.get("top_k", 0)
            if isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 <= top_k <= TOP_K_MAX:
                raise RequestError(f"top_k: must be an integer in 0..{TOP_K_MAX}")
            sampling = dataclasses.replace(sampling, top_k=top_k)
            session_id = params.get("session_id")
            if session_id is not None:
                validate_session_id(session_id)
            prompt = render_prompt(
                self.tokenizer,
                messages,
                max_context_tokens=self.settings.max_context_tokens,
                max_new_tokens=sampling.max_new_tokens,
                continue_final=continuing,
            )
            use_cache = params.get("prefix_cache", True)
            if not isinstance(use_cache, bool):
                raise RequestError("prefix_cache: must be true or false")
            stream = params.get("stream", True)
            if not isinstance(stream, bool):
                raise RequestError("stream: must be true or false")
        except (RequestError, UnicodeDecodeError) as exc:
            return Prepared(error=INVALID + str(exc))
        return Prepared(
            GenerationRequest(
                prompt_ids=prompt.ids,
                params=sampling,
                session_id=session_id,
                system_len=prompt.system_len,
                use_prefix_cache=use_cache,
                on_text=on_text if stream else None,
                is_cancelled=is_cancelled,
            )
        )

    def run(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """One batched generate for all prepared requests; reports batch, row and cache metrics."""
        if not requests:
            return []
        if self.settings.torch_threads:
            # OpenMP thread counts are per OS thread; the backend may call execute from another thread.
            self.generator.torch.set_num_threads(self.settings.torch_threads)
        t0 = time.perf_counter()
        # Never raises for one request's sake: a row that fails carries `error` (see error_message).
        results = self.generator.generate(requests)
        tokens = sum(len(r.token_ids) for r in results)
        self.observer.batch(len(requests), time.perf_counter() - t0, tokens)
        for result in results:
            if result.error is None:
                self.observer.finished(result)
        self.observer.cache(self.prefix_cache)
        return results


def _refuse_to_serve(message: str, cause: Exception | None = None) -> NoReturn:
    """End the load of a replica that must not serve: the message to the termination log and the log, raised.

    The kubelet copies the termination log into the container's lastState.terminated.message, where the
    operator reads it (PrecisionCheckFailed)."""
    write_termination_message(message)
    log.error("%s", message)
    raise calibration.PrecisionCheckFailed(message) from cause
