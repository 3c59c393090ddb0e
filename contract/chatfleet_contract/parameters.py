"""The chat models' `parameters` in config.pbtxt: one schema, one set of defaults, writer and reader.

The operator writes these string parameters into config.pbtxt (``ChatModelConfig.parameters``); the
Triton model reads them back (``ModelParameters.from_parameters``) from the same fields, so a key, a
type or a default is spelled once. Triton hands the model its config as JSON: ``read_model_config``
turns that into the parameters, the instance kind and the batch limit.

Round trip::

    >>> p = ModelParameters(max_new_tokens=64, warmup=False)
    >>> p.to_parameters()["max_new_tokens"], p.to_parameters()["warmup"]
    ('64', 'false')
    >>> ModelParameters.from_parameters(p.to_parameters()) == p
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

#: Where the pod's weights are (the operator mounts or the launcher fetches them there).
WEIGHTS_DIR = "/models/weights"

#: Field metadata: the parameter is written even at its default (the operator's config always holds it).
ALWAYS = {"always": True}

P = TypeVar("P", bound="ModelParameters")


@dataclass(frozen=True)
class ModelParameters:
    """The chat models' string parameters, typed; field name = parameter key, field default = the default.

    Written: the fields marked ALWAYS, and every other field whose value differs from its default.
    Read: a key that is missing or empty takes the field's default.
    """

    model_dir: str = field(default=WEIGHTS_DIR, metadata=ALWAYS)
    """Local path of the weights inside the pod (the operator mounts or fetches them there)."""
    tokenizer_dir: str | None = field(default=None, metadata=ALWAYS)
    """Local path of the tokenizer; None means the tokenizer sits beside the weights (written as model_dir)."""
    precision: str = field(default="fp32", metadata=ALWAYS)
    """Weights and activations: auto, fp32, fp16, bf16 or int8 (what runs per device: docs/runtime.md
    "Precision")."""
    max_new_tokens: int = field(default=256, metadata=ALWAYS)
    """Upper bound on generated tokens per request (a request may ask for fewer)."""
    max_context_tokens: int = field(default=2048, metadata=ALWAYS)
    """Prompt plus history is truncated (oldest turns first) to fit this many tokens."""
    history_turns: int = field(default=5, metadata=ALWAYS)
    """Sliding window of conversation turns kept as history."""
    prefix_cache_entries: int = field(default=1024, metadata=ALWAYS)
    """Conversations and system prompts whose KV is kept for prefix reuse (least recently used evicted)."""
    chat_template: str | None = None
    """Jinja chat template overriding the tokenizer's own; None keeps the tokenizer's."""
    tokenizer_uri: str | None = None
    """A tokenizer given as a URI (spec.model.tokenizer): wins over tokenizer_dir, fetched like the weights."""
    model_revision: str | None = None
    """The weights' revision (spec.model.revision); written so that a new revision rolls the pods."""
    prefix_cache_bytes: int = 0
    """Bytes the KV prefix (session) store may hold, taken from the KV memory (``kvsizing``); 0: a tenth of
    the KV memory (256 MiB when there is no KV memory budget)."""
    torch_threads: int = 0
    """torch's intra-op threads (0: torch's default); set it to the pod's CPU limit on CPU pods."""
    default_max_tokens: int = 64
    """max_tokens of a request that names none."""
    warmup: bool = True
    """Run one short generation at load, so Triton's readiness means warmed up."""
    stream_interval_ms: int = 20
    """Streamed text goes out at once for the first token, then at most every this many ms (0: every token)."""
    cancel_check_ms: int = 200
    """How often each running request asks Triton whether its client is gone (an IPC round trip)."""
    inflight_batching: bool = True
    """Requests join the running batch between steps (continuous batching); false: static batching."""
    kv_memory_bytes: int = 0
    """The KV memory in bytes (spec.runtime.kvCache.memory): the prefix store plus the running batch's KV
    budget, which bounds rows x longest (prompt + max tokens) x bytes per position; a request beyond it
    waits, then is refused (`overloaded:`, the chat API's 429). 0: `kv_memory_fraction` decides."""
    kv_memory_fraction: float = 0.9
    """With `kv_memory_bytes` 0, the KV memory is this share of what is left of the device after loading (GPU:
    its total memory less the weights; CPU: the container's memory limit less the process), split evenly
    between the model instances sharing it (``kvsizing.kv_sizing``). 0: no KV budget (rows: max_batch_size)."""
    kv_typical_prompt_tokens: int = 512
    """The prompt length the row limit is sized for: rows = budget / (bytes per position x (this +
    max_new_tokens)), at most max_batch_size."""
    admission_queue: int = 64
    """Requests that may wait for room in the KV budget; one more is refused at once."""
    admission_wait_ms: int = 10_000
    """How long a request may wait for room in the KV budget before it is refused."""
    prefill_chunk_tokens: int = 1024
    """A prompt longer than this is prefilled in chunks of this many tokens between decode steps (in-flight
    batching), so a long prompt never stalls the running streams for its whole length. 0: in one pass."""
    load_handshake_timeout_s: int = 120
    """Seconds Triton may take to mark the model ready after the last instance's initialize() returned;
    past them the load is judged hung and the instance ends its stub, so tritonserver fails the load and the
    container restarts (``chatfleet_runtime.engine.load_watch``). 0: no watch."""

    calibration_prompts: str | None = None
    """int8 only: the calibration prompts as a JSON list of strings (spec.runtime.calibration.prompts)."""
    calibration_file: str | None = None
    """int8 only: a file holding the calibration prompts (the mounted spec.runtime.calibration.configMapRef)."""
    int8_min_agreement: float = 0.98
    """int8 only: the next-token agreement with full precision the int8 model must reach before it serves."""

    @property
    def tokenizer_source(self) -> str:
        """Where the tokenizer loads from: its URI, else its folder, else the weights folder.

        >>> ModelParameters(model_dir="/w").tokenizer_source
        '/w'
        """
        return self.tokenizer_uri or self.tokenizer_dir or self.model_dir

    def to_parameters(self) -> dict[str, str]:
        """The `parameters { ... }` entries, all strings as Triton wants them."""
        params: dict[str, str] = {}
        for f in schema():
            value = getattr(self, f.name)
            if f.metadata.get("always") or value != f.default:
                params[f.name] = to_text(value)
        params["tokenizer_dir"] = self.tokenizer_dir or self.model_dir  # None: beside the weights
        return params

    @classmethod
    def from_parameters(cls: type[P], params: Mapping[str, str], **fields: Any) -> P:
        """Typed parameters from config.pbtxt strings (unknown keys ignored); `fields` sets the subclass's own.

        A tokenizer_dir equal to model_dir reads as None (beside the weights), as the writer spells it.
        """
        values: dict[str, Any] = {}
        for f in schema():
            raw = params.get(f.name)
            if raw not in (None, ""):
                values[f.name] = _from_text(raw, f.default)
        if values.get("tokenizer_dir") == values.get("model_dir", WEIGHTS_DIR):
            values.pop("tokenizer_dir", None)
        return cls(**values, **fields)


def schema() -> tuple[dataclasses.Field, ...]:
    """The parameter fields (a subclass's own fields are not parameters)."""
    return dataclasses.fields(ModelParameters)


def to_text(value: Any) -> str:
    """A parameter value as its config.pbtxt string (booleans as true/false)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _from_text(raw: str, default: Any) -> Any:
    """A config.pbtxt string as the type of the field's default (a boolean is false only when 'false')."""
    if isinstance(default, bool):
        return str(raw).lower() != "false"
    if isinstance(default, int):
        return int(raw)
    if isinstance(default, float):
        return float(raw)
    return str(raw)


def read_model_config(model_config: Mapping[str, Any]) -> tuple[dict[str, str], str, int]:
    """(parameters, instance kind, max_batch_size) from Triton's JSON model config.

    >>> read_model_config({"max_batch_size": 4, "instance_group": [{"kind": "KIND_GPU"}],
    ...                    "parameters": {"precision": {"string_value": "fp16"}}})
    ({'precision': 'fp16'}, 'KIND_GPU', 4)
    """
    params = {k: v.get("string_value", "") for k, v in (model_config.get("parameters") or {}).items()}
    groups = model_config.get("instance_group") or [{}]
    kind = "KIND_GPU" if groups[0].get("kind") == "KIND_GPU" else "KIND_CPU"
    return params, kind, max(1, int(model_config.get("max_batch_size") or 1))
