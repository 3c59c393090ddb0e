"""Load the chat model and tokenizer from a local path or URI, in the precision the config asks for.

Production weights come from a path the operator mounts (a PVC or host path) or from a URI the launcher
resolves to a local folder first; tests use the tiny model built by `chatfleet_platform.localruntime.tiny`. The code
path is the same: `resolve_model_path` -> `load_tokenizer` / `load_model`.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    """Where and how the model runs: the torch device, the dtype name, and why it was chosen."""

    device: str
    precision: str
    reason: str = ""


def resolve_model_path(uri: str, *, revision: str | None = None, cache_dir: str | None = None) -> Path:
    """Turn a path, file:// URI or remote URI (any scheme of `model_sources`) into a local folder.

    hf:// goes through the hub cache; s3://, gs://, oci:// and http(s):// are fetched once into a folder
    under cache_dir (default $CHATFLEET_MODEL_CACHE or /tmp/chatfleet-models) keyed by URI and revision.
    """
    from chatfleet_runtime.sources import model_sources

    source = model_sources.parse_uri(uri)
    if source.scheme == "file":
        path = Path(source.path)
        if not path.is_dir():
            raise FileNotFoundError(f"model path {str(path)!r} is not a folder")
        return path
    if source.scheme == "hf":
        return _hub_download(f"{source.host}/{source.key_prefix}", revision, cache_dir)
    root = Path(cache_dir or os.environ.get("CHATFLEET_MODEL_CACHE") or "/tmp/chatfleet-models")
    key = hashlib.sha256(f"{uri}\n{revision or ''}".encode()).hexdigest()[:16]
    dest = root / key
    marker = dest / model_sources.MARKER
    if marker.exists() and marker.read_text() == uri:
        return dest
    return model_sources.fetch(uri, dest, revision=revision)


def _hub_download(repo_id: str, revision: str | None, cache_dir: str | None) -> Path:
    """Fetch a hub snapshot (production only: tests never reach a hub)."""
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir))


def instance_device(
    kind: str, *, cuda_available: bool, device_id: int | None = None, device_count: int = 1
) -> str:
    """The torch device of one Triton model instance: the GPU Triton assigned it, or the CPU.

    Triton puts `count` instances on each GPU of the instance group and tells each its GPU
    (args['model_instance_device_id']); loading there, not on the default device, is what keeps the
    other GPUs of a multi-GPU replica busy.
    >>> instance_device("KIND_GPU", cuda_available=True, device_id=1, device_count=2)
    'cuda:1'
    >>> instance_device("KIND_GPU", cuda_available=False, device_id=1, device_count=0)
    'cpu'
    """
    if kind != "KIND_GPU" or not cuda_available:
        return "cpu"
    if device_id is None:
        return "cuda"
    if not 0 <= device_id < device_count:
        raise ValueError(f"model_instance_device_id {device_id}: only {device_count} GPU(s) visible")
    return f"cuda:{device_id}"


#: CPU flags (as /proc/cpuinfo spells them) with bf16 matmul instructions: Intel AMX (Sapphire Rapids and
#: newer) and AVX512-BF16 (Cooper Lake, Sapphire Rapids, AMD Zen 4 and newer). Without either, torch
#: emulates bf16 on CPU and fp32 is faster.
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The CPU feature flags of /proc/cpuinfo's text (its first `flags` line; empty when there is none).

    >>> sorted(cpu_flags("processor : 0\\nflags\\t\\t: fpu avx2 amx_bf16\\n"))
    ['amx_bf16', 'avx2', 'fpu']
    """
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_bf16_flags(cpuinfo: str) -> list[str]:
    """Which of CPU_BF16_FLAGS the CPU reports (empty: bf16 would be emulated, so it is not served).

    >>> cpu_bf16_flags("flags : fpu avx512f avx512_bf16 amx_bf16 amx_tile")
    ['amx_bf16', 'avx512_bf16']
    >>> cpu_bf16_flags("flags : fpu avx2 f16c")
    []
    """
    flags = cpu_flags(cpuinfo)
    return [f for f in CPU_BF16_FLAGS if f in flags]


def read_cpuinfo(path: str = "/proc/cpuinfo") -> str:
    """The text of /proc/cpuinfo, read at run time ('' where there is none, e.g. not Linux)."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def choose_placement(
    precision: str,
    kind: str,
    *,
    cuda_available: bool,
    bf16_supported: bool = True,
    cpu_bf16: bool = False,
    device_id: int | None = None,
    device_count: int = 1,
) -> Placement:
    """Pick device and effective precision (docs/runtime.md "Precision" has the whole table).

    auto: bf16 on a GPU that supports it, else fp16; on CPU bf16 when the CPU has AMX-BF16 or AVX512-BF16
    (`cpu_bf16`), else fp32. Explicit bf16 falls back the same way; fp16 on CPU runs fp32.
    >>> choose_placement("fp16", "KIND_CPU", cuda_available=False).precision
    'fp32'
    >>> choose_placement("auto", "KIND_CPU", cuda_available=False, cpu_bf16=True).precision
    'bf16'
    >>> choose_placement("auto", "KIND_GPU", cuda_available=True, bf16_supported=False).precision
    'fp16'
    """
    device = instance_device(
        kind, cuda_available=cuda_available, device_id=device_id, device_count=device_count
    )
    reason = "" if kind != "KIND_GPU" or cuda_available else "no CUDA device; running on CPU. "
    if device == "cpu":
        if precision == "auto":
            if cpu_bf16:
                why = f"{reason}auto: the CPU has bf16 instructions; using bf16"
                return Placement("cpu", "bf16", why.strip())
            return Placement(
                "cpu", "fp32", f"{reason}auto: the CPU has no AMX-BF16/AVX512-BF16; using fp32".strip()
            )
        if precision == "bf16" and not cpu_bf16:
            return Placement(
                "cpu", "fp32", f"{reason}bf16 needs AMX-BF16 or AVX512-BF16 on CPU; using fp32".strip()
            )
        if precision == "fp16":
            # CPUs have no fast fp16 matmul (torch converts per op; only AMX-FP16 parts accelerate it),
            # and fp16's narrow range gains nothing over bf16 where bf16 exists.
            return Placement("cpu", "fp32", f"{reason}fp16 is not served on CPU; using fp32".strip())
        return Placement("cpu", precision, reason.strip())
    if precision == "auto":
        half = "bf16" if bf16_supported else "fp16"
        return Placement(device, half, f"auto: {half} ({'' if bf16_supported else 'no '}bf16 on this GPU)")
    if precision == "bf16" and not bf16_supported:
        return Placement(device, "fp16", "bf16 is not supported by this GPU; using fp16")
    return Placement(device, precision)


def torch_dtype(precision: str):
    """The torch dtype holding the weights for a precision name (int8 loads fp32/fp16 then quantizes)."""
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.float32}[
        precision
    ]


def load_tokenizer(path: str | Path, chat_template: str | None = None):
    """Load the tokenizer from a folder or URI (left padding, a pad token, optional template override)."""
    from transformers import AutoTokenizer

    path = resolve_model_path(str(path))
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if chat_template:
        tokenizer.chat_template = chat_template
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"tokenizer at {path}: has no chat template and none was configured")
    return tokenizer


def int8_gpu_load_kwargs(device_map: Any = "cuda") -> dict[str, Any]:
    """`from_pretrained` keyword arguments for 8-bit weights on GPU (bitsandbytes LLM.int8()).

    Built apart from the load so the GPU path is checked without a GPU: bitsandbytes must import
    (it is pinned in the runtime extra) and the quantization config must be an 8-bit one.
    """
    try:
        import bitsandbytes  # noqa: F401  (transformers needs it at load time; fail early and clearly)
    except ImportError as exc:
        raise RuntimeError("precision int8 on GPU needs bitsandbytes (the runtime extra pins it)") from exc
    from transformers import BitsAndBytesConfig

    return {"quantization_config": BitsAndBytesConfig(load_in_8bit=True), "device_map": device_map}


def quantize_int8_cpu(model):
    """Dynamic int8 quantisation of every Linear layer (lm_head included) with torch.ao, on CPU.

    Weights are stored as int8 with a per-tensor scale; activations are quantised on the fly, so
    no calibration data is needed. A tied lm_head (sharing the input embedding's weight) becomes its
    own int8 copy while the embedding stays float; the config is marked untied so nothing ties the
    float embedding back onto the quantised head.
    """
    import warnings

    import torch

    if getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False
        text = model.config.get_text_config()
        if text is not model.config and hasattr(text, "tie_word_embeddings"):
            text.tie_word_embeddings = False
    with warnings.catch_warnings():  # torch.ao dynamic quantisation warns that torchao is its successor
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def weights_bytes(model) -> int:
    """Bytes held by the model's weights, quantised (packed int8) ones included."""
    seen: set[int] = set()
    total = 0

    def add(value) -> None:
        nonlocal total
        if isinstance(value, (tuple, list)):
            for v in value:
                add(v)
        elif hasattr(value, "element_size") and hasattr(value, "numel"):
            key = value.data_ptr() if value.numel() else id(value)
            if key not in seen:
                seen.add(key)
                total += value.numel() * value.element_size()

    for value in model.state_dict().values():
        add(value)
    return total


def use_attention_kernels(device: str) -> None:
    """On a GPU, leave cuDNN's fused attention out of torch's choice of attention kernel (SDPA).

    Measured on an H100 (torch 2.11, docs/runtime.md "The GPU sheet"): in fp16 and bf16 torch chose
    cuDNN's attention, which spends ~2.2 ms of CPU on every call whose shape it has not planned before;
    a decode step's KV is one column longer than the last one's, so every call is new: 24 layers x 2.15 ms
    was 52 ms of the Qwen2-0.5B shape's ~87 ms step while the GPU sat idle 97 % of the time (transformers'
    own ``generate()`` ran 63.5 ms a token too; fp32, which cuDNN's attention does not take, 22 ms).
    Flash and memory-efficient attention, which torch picks without it, plan nothing per shape. Process-wide,
    as a pod serves one model.
    """
    if device.startswith("cuda"):
        import torch

        torch.backends.cuda.enable_cudnn_sdp(False)


def load_model(path: str | Path, placement: Placement):
    """Load the causal LM in eval mode on the placement's device and precision."""
    from transformers import AutoModelForCausalLM

    if placement.precision == "int8" and placement.device.startswith("cuda"):
        kwargs = int8_gpu_load_kwargs({"": placement.device})
        return AutoModelForCausalLM.from_pretrained(str(path), **kwargs).eval()
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype(placement.precision))
    model = model.to(placement.device).eval()
    if placement.precision == "int8":
        model = quantize_int8_cpu(model)
    return model


def load_int8_checked(path: str | Path, placement: Placement, tokenizer, prompts: list[str], source: str):
    """(int8 model, Agreement with the full-precision model) on the calibration prompts (calibration.py).

    The full-precision reference (fp32 on CPU, bf16 or fp16 on GPU) runs the prompts first and only its
    predicted token ids are kept; on CPU it is then quantised (torch dynamic quantisation: int8 weights,
    activation scales computed per batch at run time, so there are no static scales to calibrate and the
    prompts serve the check), on GPU it is freed and the bitsandbytes int8 model loaded.
    """
    from chatfleet_runtime.engine import calibration

    ids = calibration.prompt_ids(tokenizer, prompts)
    on_gpu = placement.device.startswith("cuda")
    if on_gpu:
        import torch

        half = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        reference = load_model(path, Placement(placement.device, half))
        expected = calibration.predictions(reference, ids)
        del reference
        torch.cuda.empty_cache()
        model = load_model(path, placement)
    else:
        reference = load_model(path, Placement(placement.device, "fp32"))
        expected = calibration.predictions(reference, ids)
        model = quantize_int8_cpu(reference)
        del reference
    return model, calibration.measure(expected, model, ids, source)


def set_threads(n: int | None) -> None:
    """Bound torch's intra-op threads (pods set it from their CPU limit; 0/None keeps torch's default)."""
    import torch

    if n:
        torch.set_num_threads(int(n))
    elif os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
