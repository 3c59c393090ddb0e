"""bf16 vs fp32 on this CPU: decode tokens/s of one batch through the runtime's BatchGenerator.

``python bench/precision_cpu.py MODEL_DIR [--batch 32] [--tokens 16] [--threads 2]``, MODEL_DIR e.g. the
benchmark's shaped model (``python -m chatfleet_platform.localruntime.shaped OUTDIR --layers 8``).
Prints the CPU's bf16 flags (what ``precision: auto`` reads) and one line per precision. bf16 is run
even where the CPU lacks bf16 instructions (torch then emulates it), to show why auto picks fp32 there.
"""

from __future__ import annotations

import argparse
import sys
import time


def run(model_dir: str, precision: str, batch: int, tokens: int) -> float:
    """Tokens per second of one greedy batch (after a one-row warm-up) in the given precision."""
    from chatfleet_runtime.engine.generation import BatchGenerator
    from chatfleet_runtime.engine.loading import Placement, load_model, load_tokenizer
    from chatfleet_runtime.engine.rows import GenerationRequest
    from chatfleet_runtime.prompting import SamplingParams, render_prompt

    tokenizer = load_tokenizer(model_dir)
    generator = BatchGenerator(load_model(model_dir, Placement("cpu", precision)), tokenizer)

    def request(i: int) -> GenerationRequest:
        messages = [{"role": "user", "content": f"Question {i}: how do pods scale on Kubernetes?"}]
        ids = render_prompt(tokenizer, messages, max_context_tokens=512, max_new_tokens=tokens).ids
        return GenerationRequest(ids, SamplingParams(max_new_tokens=tokens))

    generator.generate([request(0)])
    start = time.perf_counter()
    results = generator.generate([request(i) for i in range(batch)])
    elapsed = time.perf_counter() - start
    return sum(len(r.token_ids) for r in results) / elapsed


def main(argv: list[str] | None = None) -> int:
    """Measure fp32 then bf16 and print both and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    import torch
    from chatfleet_runtime.engine.loading import cpu_bf16_flags, read_cpuinfo

    torch.set_num_threads(args.threads)
    print(f"CPU bf16 flags: {cpu_bf16_flags(read_cpuinfo()) or 'none'}; threads {args.threads}")
    rates = {p: run(args.model_dir, p, args.batch, args.tokens) for p in ("fp32", "bf16")}
    for precision, rate in rates.items():
        print(f"{precision}: {rate:.1f} tokens/s (batch {args.batch} x {args.tokens} greedy tokens)")
    print(f"bf16 / fp32: {rates['bf16'] / rates['fp32']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
