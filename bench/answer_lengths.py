"""Answer lengths of the runtime benchmark's requests: mixed, as real chats have, the same for every system.

Request k of a run (the k-th sent) gets its own number of new tokens, drawn from a lognormal distribution
with median cap / 4 and sigma 0.8 (mostly short answers, a tail of long ones), rounded and clipped to
[MIN_TOKENS, cap]. The generator is seeded by (seed, k), so every system generates the same lengths for
the same requests, in whatever order its clients send them. Real chat answers are
longer (hundreds of tokens); the shape is kept and scaled to the cap the machine can afford.

E.g. cap 128: median 32, mean about 41, about 4 % of answers at the cap; 9 batches of 32 in 10 hold an
answer of 100 tokens or more, which is what a static batch waits for.
"""

from __future__ import annotations

import math
import random

#: The shortest answer drawn (a one-line reply).
MIN_TOKENS = 4

#: Spread of the lognormal (of ln length): 0.8 puts the 90th percentile at 2.8x the median.
SIGMA = 0.8


def answer_length(request: int, cap: int, seed: int = 0) -> int:
    """New tokens for request k, e.g. answer_length(4, 128) == 76 on every call and system."""
    rng = random.Random(f"{seed}:{request}")
    drawn = rng.lognormvariate(math.log(cap / 4), SIGMA)
    return max(MIN_TOKENS, min(cap, round(drawn)))


def describe(cap: int, seed: int = 0) -> dict:
    """The distribution's parameters, for the benchmark's JSON."""
    return {
        "distribution": "lognormal, rounded and clipped",
        "median_tokens": cap / 4,
        "sigma": SIGMA,
        "min_tokens": MIN_TOKENS,
        "cap_tokens": cap,
        "seed": seed,
        "key": "(seed, request index): the same draws for every system",
    }
