"""Choose each row's next token from the batch's logits, with the row's own sampling settings.

Whole-batch tensor operations, one per setting, with the rows' settings as tensors: logit bias, OpenAI's
presence and frequency penalties, then greedy (temperature 0) or temperature, top-k and top-p sampling.
No per-row Python loop touches the vocabulary, except to draw the noise of a seeded row from its own
generator, which keeps a seeded row reproducible whatever batch it runs in.

Sampling draws by the Gumbel-max trick (``_draw``): the noise of one row is independent of the others,
and top-p looks for each row's nucleus among its best few hundred logits, then, for a flat distribution,
by a histogram of its log-probabilities (``nucleus``), drawn from by inverse CDF: the whole vocabulary
is never sorted for top-p. A row whose logits are not finite (a broken model output) is marked failed
(``Row.fail``); the others get their token.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from chatfleet_runtime.engine.rows import Row

log = logging.getLogger(__name__)


def sample(torch, logits, rows: list[Row], suppress=None) -> list[int]:
    """One token id per row; `suppress` (a tensor of token ids, or None) is never chosen."""
    logits = logits.float()
    if suppress is not None:
        logits[:, suppress] = float("-inf")
    _bias(torch, logits, rows)
    _penalties(torch, logits, rows)
    hot = [i for i, row in enumerate(rows) if row.req.params.temperature > 0 and row.error is None]
    if len(hot) == len(rows):  # every row samples: no greedy pick, no copy of the batch's logits
        out, bad = _draw(torch, logits, rows)
    else:
        out, bad = torch.argmax(logits, dim=-1), []
        if hot:
            index = torch.tensor(hot, dtype=torch.long, device=logits.device)
            drawn, bad_hot = _draw(torch, logits[index], [rows[i] for i in hot])
            out[index] = drawn
            bad = [hot[i] for i in bad_hot]
    for i in bad:
        rows[i].fail("internal", "sampling failed: probabilities are not finite")
    return out.tolist()


def _bias(torch, logits, rows: list[Row]) -> None:
    """Add every row's logit_bias in one indexed add."""
    triples = [(i, t, b) for i, row in enumerate(rows) for t, b in row.req.params.logit_bias]
    if not triples:
        return
    at = torch.tensor([(i, t) for i, t, _ in triples], dtype=torch.long, device=logits.device)
    bias = torch.tensor([b for _, _, b in triples], dtype=logits.dtype, device=logits.device)
    logits.index_put_((at[:, 0], at[:, 1]), bias, accumulate=True)


def _penalties(torch, logits, rows: list[Row]) -> None:
    """OpenAI's penalties over the tokens generated so far, for every row that has them, in two indexed adds.

    logit -= count * frequency + (count > 0) * presence, e.g. a token seen twice with presence 0.5 and
    frequency 0.2 -> logit - 1.2 (0.2 * 2 + 0.5). Costs the tokens generated, not the vocabulary.
    """
    at: list[int] = []
    ids: list[int] = []
    amounts: list[float] = []
    for i, row in enumerate(rows):
        p = row.req.params
        if not row.generated or not (p.presence_penalty or p.frequency_penalty):
            continue
        if p.frequency_penalty:  # once per occurrence: repeated ids accumulate
            at += [i] * len(row.generated)
            ids += row.generated
            amounts += [-p.frequency_penalty] * len(row.generated)
        if p.presence_penalty:  # once per distinct id
            seen = sorted(set(row.generated))
            at += [i] * len(seen)
            ids += seen
            amounts += [-p.presence_penalty] * len(seen)
    if not at:
        return
    device = logits.device
    index = (
        torch.tensor(at, dtype=torch.long, device=device),
        torch.tensor(ids, dtype=torch.long, device=device),
    )
    logits.index_put_(index, torch.tensor(amounts, dtype=logits.dtype, device=device), accumulate=True)


#: Candidates tried first for rows with top-p or top-k: the best 256 logits hold the nucleus of a peaked
#: distribution (a trained model's usual case), and a top-k of a few hundred costs a fraction of a full
#: sort (151,936 logits x 32 rows on one CPU thread: 25 ms for the best 1,024, 480 ms to sort all).
CANDIDATES = 256
#: Rows with a top-k up to this many are drawn among their best top-k logits (exact by definition).
TOP_K_CANDIDATES = 4096
#: Buckets of the nucleus histogram (``nucleus``), and how far below the best log-probability they reach.
BUCKETS = 4096
SPAN = 40.0


def _draw(torch, logits, rows: list[Row]):
    """Sample one token per row (temperature, top-k, top-p); returns the ids and the failed rows' indices.

    Gumbel-max: argmax(logit - log E), E ~ Exp(1) per token, is a draw from softmax(logits). Rows
    without a cut draw over the whole vocabulary. Rows with one draw over their nucleus, looked for in
    turn: among the best CANDIDATES logits; for a row with a top-k of at most TOP_K_CANDIDATES, among its
    best top-k; for a top-p-only row whose nucleus is larger (a flat distribution), by a histogram of its
    log-probabilities and one uniform draw (``_draw_in_nucleus``: inverse CDF, no noise per token); the
    rest (a top-k above TOP_K_CANDIDATES with a large nucleus) by a full sort. Which way a row goes, and
    how many draws it takes from its generator, depends on the row's own logits only, so a seeded row
    draws the same in any batch.
    """
    device, vocab = logits.device, logits.shape[1]
    params = [row.req.params for row in rows]
    temperature = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=device)
    logits = logits.div_(temperature[:, None])  # in place: the caller's logits are spent on this step
    lse = torch.logsumexp(logits, dim=-1)
    finite = torch.isfinite(lse)
    bad = [] if bool(finite.all()) else (~finite).nonzero().flatten().tolist()
    out = torch.zeros(len(rows), dtype=torch.long, device=device)
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    top_p = [p.top_p for p in params]
    cut = [i for i in range(len(rows)) if top_p[i] < 1.0 or top_k[i] < vocab]
    whole = sorted(set(range(len(rows))) - set(cut))

    def draw_all(chosen: list[int]) -> None:
        """Gumbel-max over the whole vocabulary of the chosen rows."""
        index = torch.tensor(chosen, dtype=torch.long, device=device)
        scores = _noise(torch, [rows[i] for i in chosen], vocab, logits.dtype, device).log_().neg_()
        scores += _rows_of(torch, logits, chosen)  # logit - log E
        out[index] = torch.argmax(scores, dim=-1)

    if whole:
        draw_all(whole)
    covered: dict[int, float] = {}
    if cut and vocab > CANDIDATES:
        cut, covered = _draw_among_best(torch, logits, lse, rows, cut, CANDIDATES, top_k, top_p, out)
    small = [i for i in cut if top_k[i] <= TOP_K_CANDIDATES]
    if small:  # exact: a top-k row's candidates are its best top-k
        _draw_among_best(torch, logits, lse, rows, small, min(TOP_K_CANDIDATES, vocab), top_k, top_p, out)
    large = [i for i in cut if top_k[i] > TOP_K_CANDIDATES]
    # A row whose best CANDIDATES hold half its top-p is peaked: its nucleus most likely lies within the
    # best TOP_K_CANDIDATES, which costs less than the histogram (a flat row's best 256 hold next to nothing).
    likely = [i for i in large if covered.get(i, 0.0) >= top_p[i] / 2]
    if likely:
        missed, _ = _draw_among_best(torch, logits, lse, rows, likely, TOP_K_CANDIDATES, top_k, top_p, out)
        settled = set(likely) - set(missed)
        large = [i for i in large if i not in settled]
    flat = [i for i in large if top_k[i] == vocab and i not in bad]
    if flat:
        uniform = torch.stack([_uniform(torch, rows[i], logits.dtype, device) for i in flat])
        ids, found = _draw_in_nucleus(
            torch,
            _rows_of(torch, logits, flat) - _rows_of(torch, lse, flat)[:, None],
            [top_p[i] for i in flat],
            uniform,
        )
        drawn = {i for i, f in zip(flat, found.tolist(), strict=True) if f}
        if drawn:
            out[torch.tensor(sorted(drawn), dtype=torch.long, device=device)] = ids[found]
        large = [i for i in large if i not in drawn]
    if large:  # a top-k above TOP_K_CANDIDATES, or a nucleus the histogram did not find: sort them
        _draw_among_best(torch, logits, lse, rows, large, vocab, top_k, top_p, out)
    return out, bad


def _draw_among_best(torch, logits, lse, rows, chosen, k, top_k, top_p, out):
    """Draw the chosen rows whose nucleus lies within their best k logits.

    Returns the rows left and, for each of them, the probability mass its best k hold.
    """
    device, vocab = logits.device, logits.shape[1]
    index = torch.tensor(chosen, dtype=torch.long, device=device)
    if k < vocab:
        values, ids = torch.topk(_rows_of(torch, logits, chosen), k, dim=-1)
    else:
        values, ids = torch.sort(_rows_of(torch, logits, chosen), dim=-1, descending=True)
    # Nucleus: keep the best tokens until their mass reaches top_p (always the first), e.g.
    # probabilities 0.5, 0.3, 0.2 and top_p 0.7 -> mass before each 0, 0.5, 0.8 -> keep the first two.
    probs = torch.exp(values - lse[index, None])
    p = torch.tensor([top_p[i] for i in chosen], dtype=logits.dtype, device=device)
    rank = torch.arange(k, device=device)[None, :]
    ks = torch.tensor([top_k[i] for i in chosen], dtype=torch.long, device=device)
    keep = ((torch.cumsum(probs, dim=-1) - probs) < p[:, None]) & (rank < ks[:, None])
    keep[:, 0] = True
    # Exact when the nucleus ended inside the candidates (or top-k stopped it there).
    done = (~keep[:, -1]) | (ks <= k) | (k == vocab)
    left = [i for i, d in zip(chosen, done.tolist(), strict=True) if not d]
    if len(left) < len(chosen):
        mine = done.nonzero().flatten()
        noise = _noise(torch, [rows[chosen[j]] for j in mine.tolist()], k, logits.dtype, device)
        scores = values[mine].masked_fill(~keep[mine], float("-inf")) - noise.log()
        out[index[mine]] = ids[mine].gather(1, torch.argmax(scores, dim=-1, keepdim=True)).squeeze(1)
    if not left:
        return left, {}
    held = probs.sum(dim=-1).tolist()
    return left, {i: m for i, m, d in zip(chosen, held, done.tolist(), strict=True) if not d}


def _rows_of(torch, t, chosen: list[int]):
    """The chosen rows of t: t itself when they are all of its rows, in order (no copy)."""
    if chosen == list(range(t.shape[0])):
        return t
    return t[torch.tensor(chosen, dtype=torch.long, device=t.device)]


def nucleus(torch, logprobs, top_p: list[float]):
    """Each row's top-p nucleus as a mask over the vocabulary, without sorting it; rows not found: all False.

    See ``_histogram``, which finds it.
    """
    return _histogram(torch, logprobs, top_p).keep


class _Nucleus(NamedTuple):
    """Each row's nucleus: the mask over the vocabulary, each token's bucket, each bucket's kept mass."""

    keep: Any  #: (rows, vocabulary) bool
    bucket: Any  #: (rows, vocabulary) long: bucket 0 holds the best tokens
    kept_mass: Any  #: (rows, BUCKETS): the mass of each bucket's kept tokens (0 past the nucleus)
    found: Any  #: (rows,) bool: False where the nucleus reaches past SPAN (keep all False)


def _histogram(torch, logprobs, top_p: list[float]) -> _Nucleus:
    """Each row's nucleus by a histogram of its log-probabilities, without sorting the vocabulary.

    The same set as sorting and keeping the tokens whose mass before them is under top_p: each row's
    log-probabilities go into BUCKETS equal buckets from its best down to SPAN below it (or its worst);
    the buckets' masses, summed from the top, say which bucket the nucleus ends in. Every token in a
    bucket above it is kept, none below it; only that bucket's own tokens (a few hundred for a flat
    distribution over 151,936 tokens, rather than the whole vocabulary) are sorted to find where the
    mass reaches top_p. E.g. masses 0.5, 0.3, 0.2 by bucket and top_p 0.7: the nucleus ends in the
    second bucket (mass before it 0.5 < 0.7 <= 0.8), whose tokens are sorted to find the last one kept.
    A row whose nucleus reaches the last bucket (top_p within e^-40 of 1) is not found (all False): its
    caller sorts it instead.
    """
    rows, device = logprobs.shape[0], logprobs.device
    p = torch.tensor(top_p, dtype=logprobs.dtype, device=device)
    depth = torch.arange(BUCKETS, device=device)
    best = logprobs.max(dim=-1).values
    worst = torch.maximum(logprobs.min(dim=-1).values, best - SPAN)
    scale = (BUCKETS - 1) / (best - worst).clamp_min(1e-12)
    # Bucket 0 holds the best tokens. -inf (suppressed) tokens land in the last bucket with no mass.
    bucket = (best[:, None] - logprobs).mul_(scale[:, None]).clamp_(0, BUCKETS - 1).long()
    mass = torch.zeros((rows, BUCKETS), dtype=logprobs.dtype, device=device)
    mass.scatter_add_(1, bucket, logprobs.exp())
    above = torch.cumsum(mass, dim=-1)
    end = (above < p[:, None]).sum(dim=-1).clamp_(max=BUCKETS - 1)  # the bucket the nucleus ends in
    before = above.gather(1, end[:, None]).squeeze(1) - mass.gather(1, end[:, None]).squeeze(1)
    keep = bucket < end[:, None]
    # The end buckets' tokens, every row's together, sorted by row and best first within a row.
    r, c = (bucket == end[:, None]).nonzero(as_tuple=True)
    v = logprobs[r, c]
    order = torch.argsort(v, descending=True, stable=True)
    order = order[torch.argsort(r[order], stable=True)]
    r, c, v = r[order], c[order], v[order]
    tail = v.exp()
    take = (before[r] + _before_in_row(torch, tail, r, rows)) < p[r]
    keep[r[take], c[take]] = True
    found = end < BUCKETS - 1  # else the nucleus reaches past SPAN: not found here
    keep[~found] = False
    # kept mass: whole buckets above the end, the taken part of the end bucket, nothing below
    kept_mass = mass.masked_fill_(depth[None, :] >= end[:, None], 0.0)
    taken = torch.zeros(rows, dtype=logprobs.dtype, device=device).index_add_(0, r[take], tail[take])
    kept_mass.scatter_(1, end[:, None], taken[:, None])
    kept_mass[~found] = 0.0
    return _Nucleus(keep, bucket, kept_mass, found)


def _before_in_row(torch, values, r, rows: int):
    """For values grouped by row (r ascending): the sum of the values before each one in its own row."""
    total = torch.cumsum(values, dim=0)
    counts = torch.bincount(r, minlength=rows)
    start = (torch.cumsum(counts, dim=0) - counts)[r]
    return total - values - (total[start] - values[start])


def _draw_in_nucleus(torch, logprobs, top_p: list[float], uniform):
    """One token per row from its nucleus by inverse CDF: one uniform draw per row, not one per token.

    Returns (ids, found). The draw u x (the nucleus's mass) falls in one bucket (the bucket masses summed
    from the top, searched); within that bucket the row's kept tokens, in vocabulary order, are summed
    until they pass what is left of u. Every kept token is chosen with probability p / nucleus mass, as
    a sort would give. E.g. kept buckets of mass 0.5 and 0.3 (nucleus 0.8) and u 0.75: 0.6 falls in the
    second bucket, 0.1 into it.
    """
    rows = logprobs.shape[0]
    keep, bucket, kept_mass, found = _histogram(torch, logprobs, top_p)
    target = uniform * kept_mass.sum(dim=-1)
    # the first bucket whose running mass passes the target (buckets past the nucleus hold none of it)
    kept_above = torch.cumsum(kept_mass, dim=-1)
    chosen = torch.searchsorted(kept_above, target[:, None], right=True).clamp_(max=BUCKETS - 1)
    left = target - (kept_above - kept_mass).gather(1, chosen).squeeze(1)  # u past the buckets above
    r, c = ((bucket == chosen) & keep).nonzero(as_tuple=True)
    probs = logprobs[r, c].exp()  # the chosen bucket's kept tokens only
    passed = _before_in_row(torch, probs, r, rows) + probs > left[r]
    place = torch.arange(len(r), device=r.device)
    last = torch.full((rows,), -1, dtype=torch.long, device=r.device).scatter_reduce_(0, r, place, "amax")
    first = torch.full((rows,), len(r), dtype=torch.long, device=r.device).scatter_reduce_(
        0, r[passed], place[passed], "amin"
    )
    pick = torch.where(first < len(r), first, last)  # rounding past the bucket's end: its last token
    ids = torch.where(pick >= 0, c[pick.clamp(min=0)] if len(c) else pick, torch.zeros_like(pick))
    return ids, found


def _uniform(torch, row: Row, dtype, device):
    """One U(0, 1) draw for the row: a seeded row's from its own generator."""
    return torch.rand((), dtype=dtype, device=device, generator=row.rng)


def _noise(torch, rows: list[Row], width: int, dtype, device):
    """Exp(1) noise, one row per row, as -log U: a seeded row's from its own generator, the rest in one draw.

    (-log of a uniform draw is an Exp(1) draw, and costs about a quarter of ``exponential_`` on a CPU.)
    """
    plain = [i for i, row in enumerate(rows) if row.rng is None]
    if len(plain) == len(rows):
        return torch.rand((len(rows), width), dtype=dtype, device=device).log_().neg_()
    noise = torch.empty((len(rows), width), dtype=dtype, device=device)
    if plain:
        noise[plain] = torch.rand((len(plain), width), dtype=dtype, device=device)
    for i, row in enumerate(rows):
        if row.rng is not None:  # the same draws in any batch
            noise[i] = torch.rand(width, dtype=dtype, device=device, generator=row.rng)
    return noise.log_().neg_()
