"""Build a randomly initialised model with a real chat model's shape, cut to fewer layers, fully offline.

The tiny model (``tiny.py``) is so small that a batch of 32 costs about what one row does, so batching
looks free. This one has the configuration of Qwen2-0.5B-Instruct (written out below: no weights can be
downloaded where the benchmark runs), random weights, and only the first ``layers`` of its 24 decoder
layers, so a 2-core machine can afford it. Everything else is the real shape: hidden 896, 14 query
heads over 2 KV heads, MLP 4864, and the full 151,936-entry vocabulary with tied embeddings, whose output
projection is a large share of a 0.5B model's cost per token (896 x 151,936 ≈ 136M multiply-adds, about
as much as 9 of its decoder layers).

The tokenizer is the tiny model's byte-level BPE (``tiny.build_tokenizer``: same chat template and special
tokens), its vocabulary padded to 151,936 with tokens no merge produces: prompts tokenize exactly as with
the tiny model, and every id the model can emit decodes to text (two of the trained tokens joined).

CLI: ``python -m chatfleet_platform.localruntime.shaped OUTDIR [--layers N]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: Qwen2-0.5B-Instruct's configuration (its config.json), the dimensions that set the cost of a token.
QWEN2_0_5B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151_936,
    "max_position_embeddings": 32_768,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
}

#: Qwen2's end-of-text token, which its tokenizer class takes as the unknown token.
UNK_TOKEN = "<|endoftext|>"


def pad_vocabulary(tokenizer, vocab_size: int):
    """The tokenizer with its BPE vocabulary padded to vocab_size by tokens that no merge produces.

    Each added token is two trained tokens joined (e.g. "Ġthe" + "ĠK" -> "ĠtheĠK"), taken in a fixed
    order and skipping strings already present, so encoding is unchanged and decoding any id gives text.
    The last id is Qwen2's special ``<|endoftext|>``, its unk token: transformers loads a folder whose
    config says qwen2 with Qwen2's tokenizer class, which would otherwise add it beyond the vocabulary.
    """
    from tokenizers import Tokenizer

    from chatfleet_platform.localruntime.tiny import wrap_tokenizer

    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    specials = {t["content"] for t in state["added_tokens"]}
    parts = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if t not in specials]
    taken = set(vocab)
    next_id = max(vocab.values()) + 1
    for first in parts:
        for second in parts:
            if next_id >= vocab_size - 1:
                break
            joined = first + second
            if joined not in taken:
                vocab[joined] = next_id
                taken.add(joined)
                next_id += 1
    if next_id < vocab_size - 1:
        raise ValueError(f"cannot pad {len(parts)} tokens to a vocabulary of {vocab_size}")
    vocab[UNK_TOKEN] = next_id
    state["added_tokens"].append(
        {"id": next_id, "content": UNK_TOKEN, "single_word": False, "lstrip": False, "rstrip": False}
        | {"normalized": False, "special": True}
    )
    padded = wrap_tokenizer(Tokenizer.from_str(json.dumps(state)))
    padded.unk_token = UNK_TOKEN
    return padded


def build_model(tokenizer, layers: int, seed: int = 0, *, dims=QWEN2_0_5B, dtype=None, device=None):
    """A random Qwen2ForCausalLM with `dims`' configuration (QWEN2_0_5B's unless given) and its first
    `layers` decoder layers, made on `device` (the CPU unless given) in `dtype` (torch's default unless
    given: a model built on a GPU in half precision never passes through fp32 on the host)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if not 1 <= layers <= dims["num_hidden_layers"]:
        raise ValueError(f"layers: {layers} is outside 1..{dims['num_hidden_layers']}")
    torch.manual_seed(seed)
    config = Qwen2Config(
        **{**{k: v for k, v in dims.items() if k != "rope_theta"}, "num_hidden_layers": layers},
        rope_parameters={"rope_type": "default", "rope_theta": dims["rope_theta"]},
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype or previous)
    try:
        with torch.device(device or "cpu"):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    for key in ("eos_token_id", "pad_token_id", "bos_token_id"):
        setattr(model.generation_config, key, getattr(tokenizer, key))
    return model.eval()


def build_shaped_model(outdir: str | Path, layers: int = 2, seed: int = 0) -> Path:
    """Build tokenizer + model into OUTDIR (idempotent: a complete OUTDIR is reused) and return it."""
    from chatfleet_platform.localruntime.tiny import build_tokenizer, save_once

    out = Path(outdir)

    def build():
        tokenizer = pad_vocabulary(build_tokenizer(), QWEN2_0_5B["vocab_size"])
        return tokenizer, build_model(tokenizer, layers, seed)

    return save_once(out, ".chatfleet-shaped", f"qwen2-0.5b:{layers}:{seed}", build)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: build the shaped model into a folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(build_shaped_model(args.outdir, layers=args.layers, seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
