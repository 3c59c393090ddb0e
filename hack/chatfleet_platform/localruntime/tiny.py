"""Build a tiny, randomly initialised Llama-style chat model and its tokenizer, fully offline.

No weights can be downloaded where tests run, so the test setup, `make serve`, the demo and the
benchmark build one locally: a byte-level BPE tokenizer trained on a small built-in corpus, with the
special tokens and the Jinja chat template a real chat model carries, wrapped in
`PreTrainedTokenizerFast`, and a random `LlamaForCausalLM` saved with `save_pretrained`. The result
loads through the same code path as production weights (`chatfleet_runtime.engine.loading`).

CLI: ``python -m chatfleet_platform.localruntime.tiny OUTDIR [--size tiny|small]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|pad|>", "<|user|>", "<|assistant|>", "<|system|>")

#: Renders ``<|bos|><|system|>...<|eos|><|user|>...<|eos|><|assistant|>``; a conversation's rendering
#: is a token prefix of the rendering with one more message, which is what prefix reuse relies on.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|eos|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

#: Model sizes: tiny for tests (205,120 parameters), small for the benchmark (compute matters more).
SIZES = {
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4},
    "small": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8},
}

_CORPUS = """
Hello! How can I help you today? I am a helpful assistant. What is the weather like?
The quick brown fox jumps over the lazy dog. Please tell me a story about a dragon.
Kubernetes runs containers in pods; an operator reconciles custom resources into deployments.
Triton serves models with dynamic batching, streaming responses and metrics for Prometheus.
Thank you very much. You are welcome. Could you explain how this works, step by step?
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Punctuation: , . ; : ! ? ( ) [ ] { } " ' - _ / \\ @ # $ % & *
"""


def _corpus() -> list[str]:
    """Training text: the built-in lines plus a bounded slice of the standard library's sources."""
    lines = [line for line in _CORPUS.splitlines() if line.strip()]
    stdlib = Path(json.__file__).resolve().parent.parent
    for path in sorted(stdlib.glob("*.py"))[:40]:
        try:
            lines.extend(path.read_text(encoding="utf-8", errors="ignore").splitlines()[:400])
        except OSError:
            continue
    return lines


def build_tokenizer(vocab_size: int = 1024):
    """Train a byte-level BPE tokenizer offline and wrap it as a chat-capable PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return wrap_tokenizer(tok)


def wrap_tokenizer(tok):
    """A `tokenizers.Tokenizer` as a PreTrainedTokenizerFast with SPECIAL_TOKENS' roles and CHAT_TEMPLATE."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        additional_special_tokens=["<|user|>", "<|assistant|>", "<|system|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_model(tokenizer, size: str = "tiny", seed: int = 0, tie_word_embeddings: bool = False):
    """A randomly initialised LlamaForCausalLM sized for CPU tests (see SIZES)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    dims = SIZES[size]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        num_key_value_heads=max(1, dims["num_attention_heads"] // 2),
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=tie_word_embeddings,
        **dims,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model.eval()


def build_tiny_model(
    outdir: str | Path, size: str = "tiny", seed: int = 0, *, tie_word_embeddings: bool = False
) -> Path:
    """Build tokenizer + model into OUTDIR (idempotent: a complete OUTDIR is reused) and return it."""
    tag = f"{size}:{seed}" + (":tied" if tie_word_embeddings else "")

    def build() -> tuple[Any, Any]:
        tokenizer = build_tokenizer()
        return tokenizer, build_model(
            tokenizer, size=size, seed=seed, tie_word_embeddings=tie_word_embeddings
        )

    return save_once(Path(outdir), ".chatfleet-tiny", tag, build)


def save_once(out: Path, marker_name: str, tag: str, build: Callable[[], tuple[Any, Any]]) -> Path:
    """OUTDIR with the (tokenizer, model) `build` makes, saved once: a folder whose marker file holds
    `tag` is complete and reused; the marker is written last, so a half-saved folder is built again."""
    marker = out / marker_name
    if marker.exists() and marker.read_text() == tag:
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer, model = build()
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    marker.write_text(tag)
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: build the tiny model into a folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(build_tiny_model(args.outdir, size=args.size, seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
