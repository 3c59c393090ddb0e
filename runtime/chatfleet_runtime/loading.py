"""Load the chat model and tokenizer from a local path or URI, in the precision the config asks for.

Production weights come from a path the operator mounts (a PVC or host path) or from a URI the launcher
resolves to a local folder first; tests use the tiny model built by `chatfleet_runtime.tiny`. The code
path is the same: `resolve_model_path` -> `load_tokenizer` / `load_model`.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

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
    from chatfleet_runtime import model_sources

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


def choose_placement(
    precision: str, kind: str, *, cuda_available: bool, bf16_supported: bool = True
) -> Placement:
    """Pick device and effective precision: fp32 on CPU, fp16/bf16 on GPU, int8 where supported.

    >>> choose_placement("fp16", "KIND_CPU", cuda_available=False)
    Placement(device='cpu', precision='fp32', reason='fp16 is not served on CPU; using fp32')
    """
    device = "cuda" if kind == "KIND_GPU" and cuda_available else "cpu"
    reason = "" if kind != "KIND_GPU" or cuda_available else "no CUDA device; running on CPU. "
    if device == "cpu":
        if precision in ("fp16", "bf16"):
            return Placement("cpu", "fp32", f"{reason}{precision} is not served on CPU; using fp32".strip())
        return Placement("cpu", precision, reason.strip())
    if precision == "bf16" and not bf16_supported:
        return Placement("cuda", "fp16", "bf16 is not supported by this GPU; using fp16")
    return Placement("cuda", precision)


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


def load_model(path: str | Path, placement: Placement):
    """Load the causal LM in eval mode on the placement's device and precision."""
    import torch
    from transformers import AutoModelForCausalLM

    if placement.precision == "int8" and placement.device == "cuda":
        try:
            from transformers import BitsAndBytesConfig

            return AutoModelForCausalLM.from_pretrained(
                str(path), quantization_config=BitsAndBytesConfig(load_in_8bit=True), device_map="cuda"
            ).eval()
        except ImportError as exc:  # pragma: no cover - GPU images only
            raise RuntimeError("precision int8 on GPU needs bitsandbytes in the image") from exc
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype(placement.precision))
    model = model.to(placement.device).eval()
    if placement.precision == "int8":
        # Dynamic int8 quantization of the Linear layers: supported on x86/ARM CPUs by torch itself
        # (deprecated upstream in favour of torchao, which this image does not carry).
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    return model


def set_threads(n: int | None) -> None:
    """Bound torch's intra-op threads (pods set it from their CPU limit; 0/None keeps torch's default)."""
    import torch

    if n:
        torch.set_num_threads(int(n))
    elif os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
