"""Triton model configuration (config.pbtxt) writer and reader, shared by the operator and the runtime.

Standard library only: the operator imports it to render the config files it puts in every pod template
(annotations a downward API volume writes into the pod), the runtime's launcher reads those files back
with it, and local runs build their model repository with it. The parameters' schema and defaults are ``chatfleet_contract.parameters``.

Example::

    >>> cfg = ChatModelConfig(max_batch_size=8, preferred_batch_sizes=(4, 8), kind="KIND_CPU")
    >>> files = model_repository_configs(cfg)
    >>> sorted(files)
    ['chat']
    >>> "max_batch_size: 8" in files["chat"] and "decoupled: true" in files["chat"]
    True
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from chatfleet_contract.parameters import ModelParameters

#: Name of the one model in the repository. It is decoupled and serves streamed and non-streamed requests
#: (``stream: false`` in PARAMETERS) through the same in-flight batch: one copy of the weights per instance.
MODEL_NAME = "chat"
#: How the chat model's error messages start when the request is at fault (the chat API answers 400).
INVALID_REQUEST = "invalid_request: "
#: How a refused request's error message starts when the replica's KV budget is full (the chat API answers
#: 429 with Retry-After).
OVERLOADED = "overloaded: "

#: The environment variable carrying the chat model's readiness URL on the pod's loopback: the launcher sets
#: it for tritonserver, whose model instances watch their load handshake with it.
READY_URL_ENV = "CHATFLEET_TRITON_READY_URL"
PRECISIONS = ("auto", "fp32", "fp16", "bf16", "int8")
KINDS = ("KIND_GPU", "KIND_CPU")


@dataclass(frozen=True)
class ChatModelConfig(ModelParameters):
    """Everything the Triton model configuration carries, in runtime terms (not CRD terms).

    The model parameters (weights, precision, limits, tuning) are the fields of ``ModelParameters``,
    which the runtime reads back; the fields below are Triton's own (instances, batching, models).
    """

    kind: str = "KIND_GPU"
    """Triton instance kind: KIND_GPU in a GPU pod, KIND_CPU for local runs and tests."""
    instance_count: int = 1
    """Model instances per device (per GPU with KIND_GPU)."""
    gpus: tuple[int, ...] = ()
    """GPU indices of the instance group (KIND_GPU): `instance_count` instances on each, every instance
    loading on the GPU Triton assigns it. Empty: Triton's default, every visible GPU."""
    max_batch_size: int = 8
    """Most requests in one batch: the in-flight engine's running batch (static mode: Triton's dynamic batch)."""
    preferred_batch_sizes: tuple[int, ...] = ()
    """Static mode only (inflight_batching false): batch sizes the dynamic batcher aims for; empty lets it
    use any size up to the maximum."""
    max_queue_delay_us: int = 10_000
    """Static mode only (inflight_batching false): how long (microseconds) a request may wait in Triton's
    queue for a batch to fill. In-flight batching renders 0."""
    extra_parameters: Mapping[str, str] = field(default_factory=dict)
    """Further string parameters passed through to the model, over the typed ones (advanced)."""

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision: {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if self.kind not in KINDS:
            raise ValueError(f"kind: {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size: must be at least 1, got {self.max_batch_size}")
        for size in self.preferred_batch_sizes:
            if not 1 <= size <= self.max_batch_size:
                raise ValueError(
                    f"preferred_batch_sizes: {size} is outside 1..max_batch_size ({self.max_batch_size})"
                )
        if self.instance_count < 1:
            raise ValueError(f"instance_count: must be at least 1, got {self.instance_count}")
        if len(set(self.gpus)) != len(self.gpus) or any(g < 0 for g in self.gpus):
            raise ValueError(f"gpus: must be distinct GPU indices (0, 1, ...), got {list(self.gpus)}")

    def parameters(self) -> dict[str, str]:
        """The `parameters { ... }` entries: the typed ones, then the extra ones over them."""
        return {**self.to_parameters(), **{str(k): str(v) for k, v in self.extra_parameters.items()}}

    def model_parameters(self) -> ModelParameters:
        """The parameters as the runtime reads them (extra parameters included)."""
        return ModelParameters.from_parameters(self.parameters())


def _q(value: str) -> str:
    """Quote a string for protobuf text format (JSON escaping is a compatible subset)."""
    return json.dumps(value)


def render_config_pbtxt(cfg: ChatModelConfig, *, name: str = MODEL_NAME) -> str:
    """Render the chat model's config.pbtxt in protobuf text format (always decoupled)."""
    lines = [
        f"name: {_q(name)}",
        'backend: "python"',
        f"max_batch_size: {cfg.max_batch_size}",
        "input [",
        '  { name: "MESSAGES" data_type: TYPE_STRING dims: [ 1 ] },',
        '  { name: "PARAMETERS" data_type: TYPE_STRING dims: [ 1 ] optional: true }',
        "]",
        "output [",
        '  { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] },',
        '  { name: "NUM_TOKENS" data_type: TYPE_INT32 dims: [ 1 ] },',
        '  { name: "FINISH_REASON" data_type: TYPE_STRING dims: [ 1 ] },',
        '  { name: "PROMPT_TOKENS" data_type: TYPE_INT32 dims: [ 1 ] }',
        "]",
        "dynamic_batching {",
    ]
    # The model batches in flight (requests join the running batch between decode steps), so holding
    # requests in Triton's queue would only add latency: hand them over at once.
    inflight = cfg.model_parameters().inflight_batching
    if cfg.preferred_batch_sizes and not inflight:
        sizes = ", ".join(str(s) for s in cfg.preferred_batch_sizes)
        lines.append(f"  preferred_batch_size: [ {sizes} ]")
    delay = 0 if inflight else cfg.max_queue_delay_us
    lines += [f"  max_queue_delay_microseconds: {delay}", "}"]
    gpus = f" gpus: [ {', '.join(str(g) for g in cfg.gpus)} ]" if cfg.gpus and cfg.kind == "KIND_GPU" else ""
    lines += [f"instance_group [ {{ count: {cfg.instance_count} kind: {cfg.kind}{gpus} }} ]"]
    # Decoupled: any number of responses per request (text deltas, then a final one), so one model serves
    # streamed and non-streamed requests alike.
    lines.append("model_transaction_policy { decoupled: true }")
    lines.append("parameters [")
    params = sorted(cfg.parameters().items())
    for i, (key, value) in enumerate(params):
        sep = "," if i < len(params) - 1 else ""
        lines.append(f"  {{ key: {_q(key)} value: {{ string_value: {_q(value)} }} }}{sep}")
    lines.append("]")
    return "\n".join(lines) + "\n"


def model_repository_configs(cfg: ChatModelConfig) -> dict[str, str]:
    """Map model name -> config.pbtxt text for every model of the chat repository: exactly one, ``chat``."""
    return {MODEL_NAME: render_config_pbtxt(cfg)}


_KIND_RE = re.compile(r"\bkind:\s*(KIND_[A-Z]+)")
_GPUS_RE = re.compile(r"\s*gpus:\s*\[[^\]]*\]")


def instance_kinds(pbtxt: str) -> set[str]:
    """The instance_group kinds a config.pbtxt asks for.

    >>> sorted(instance_kinds("instance_group [ { count: 1 kind: KIND_GPU } ]"))
    ['KIND_GPU']
    """
    return set(_KIND_RE.findall(pbtxt))


def on_cpu(pbtxt: str) -> str:
    """The same config with every instance group on the CPU (KIND_CPU, no `gpus` list).

    >>> on_cpu("instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0, 1 ] } ]")
    'instance_group [ { count: 2 kind: KIND_CPU } ]'
    """
    return _GPUS_RE.sub("", _KIND_RE.sub("kind: KIND_CPU", pbtxt))


def config_file_name(model_name: str) -> str:
    """File name of a model's config.pbtxt in the pod's config folder (no '/': one flat folder)."""
    return f"{model_name}.config.pbtxt"


_PARAM_RE = re.compile(
    r'\{\s*key:\s*("(?:[^"\\]|\\.)*")\s*value:\s*\{\s*string_value:\s*("(?:[^"\\]|\\.)*")\s*\}\s*\}'
)


def parse_parameters(pbtxt: str) -> dict[str, str]:
    """Read back the string `parameters` of a config.pbtxt rendered by `render_config_pbtxt`.

    >>> parse_parameters(render_config_pbtxt(ChatModelConfig(model_dir="/w")))["model_dir"]
    '/w'
    """
    return {json.loads(k): json.loads(v) for k, v in _PARAM_RE.findall(pbtxt)}
