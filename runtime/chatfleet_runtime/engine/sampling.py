"""Choose each row's next token from the batch's logits, with the row's own sampling settings.

Whole-batch tensor operations, one per setting, with the rows' settings as tensors: logit bias, OpenAI's
presence and frequency penalties, then greedy (temperature 0) or temperature, top-k and top-p sampling.
No per-row Python loop touches the vocabulary, except to draw the noise of a seeded row from its own
generator, which keeps a seeded row reproducible whatever batch it runs in.

Sampling draws by the Gumbel-max trick (``_draw``): the noise of one row is independent of the others,
and top-p looks for each row's nucleus among its best few hundred logits before it ever sorts the whole
vocabulary. A row whose logits are not finite (a broken model output) is marked failed (``Row.fail``);
the others get their token.
"""

from __future__ import annotations

import logging

from chatfleet_runtime.engine.rows import Row

log = logging.getLogger(__name__)


def sample(torch, logits, rows: list[Row], suppress=None) -> list[int]:
    """One token id per row; `suppress` (a tensor of token ids, or None) is never chosen."""
    logits = logits.float()
    if suppress is not None:
        logits[:, suppress] = float("-inf")
    _bias(torch, logits, rows)
    _penalties(torch, logits, rows)
    out = torch.argmax(logits, dim=-1)
    hot = [i for i, row in enumerate(rows) if row.req.params.temperature > 0 and row.error is None]
    if hot:
        index = torch.tensor(hot, dtype=torch.long, device=logits.device)
        drawn, bad = _draw(torch, logits[index], [rows[i] for i in hot])
        out[index] = drawn
        for i in bad:
            rows[hot[i]].fail("internal", "sampling failed: probabilities are not finite")
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


#: Candidate counts tried in turn for rows with top-p or top-k: the first that holds the row's nucleus
#: wins (the whole vocabulary last). A top-k of a few hundred costs a fraction of a full sort (151,936
#: logits x 32 rows on one CPU thread: 25 ms for the best 1,024, 480 ms to sort all).
CANDIDATES = (256, 4096)


def _draw(torch, logits, rows: list[Row]):
    """Sample one token per row (temperature, top-k, top-p); returns the ids and the failed rows' indices.

    Gumbel-max: argmax(logit - log E), E ~ Exp(1) per token, is a draw from softmax(logits). Rows
    without a cut draw over the whole vocabulary; rows with one draw over their nucleus, found among the
    best CANDIDATES logits (how many depends on the row's own logits only, so a seeded row takes the
    same number of draws from its generator in any batch).
    """
    device, vocab = logits.device, logits.shape[1]
    params = [row.req.params for row in rows]
    temperature = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=device)
    logits = logits / temperature[:, None]
    lse = torch.logsumexp(logits, dim=-1)
    finite = torch.isfinite(lse)
    bad = [] if bool(finite.all()) else (~finite).nonzero().flatten().tolist()
    out = torch.zeros(len(rows), dtype=torch.long, device=device)
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    cut = [i for i, p in enumerate(params) if p.top_p < 1.0 or top_k[i] < vocab]
    whole = [i for i in range(len(rows)) if i not in set(cut)]
    if whole:
        index = torch.tensor(whole, dtype=torch.long, device=device)
        noise = _noise(torch, [rows[i] for i in whole], vocab, logits.dtype, device)
        out[index] = torch.argmax(logits[index] - noise.log(), dim=-1)
    for k in (*(c for c in CANDIDATES if c < vocab), vocab):
        if not cut:
            break
        index = torch.tensor(cut, dtype=torch.long, device=device)
        if k < vocab:
            values, ids = torch.topk(logits[index], k, dim=-1)
        else:
            values, ids = torch.sort(logits[index], dim=-1, descending=True)
        # Nucleus: keep the best tokens until their mass reaches top_p (always the first), e.g.
        # probabilities 0.5, 0.3, 0.2 and top_p 0.7 -> mass before each 0, 0.5, 0.8 -> keep the first two.
        probs = torch.exp(values - lse[index, None])
        top_p = torch.tensor([params[i].top_p for i in cut], dtype=logits.dtype, device=device)
        rank = torch.arange(k, device=device)[None, :]
        ks = torch.tensor([top_k[i] for i in cut], dtype=torch.long, device=device)
        keep = ((torch.cumsum(probs, dim=-1) - probs) < top_p[:, None]) & (rank < ks[:, None])
        keep[:, 0] = True
        # Exact when the nucleus ended inside the candidates (or top-k stopped it there).
        done = (~keep[:, -1]) | (ks <= k) | (k == vocab)
        rest = [i for i, d in zip(cut, done.tolist(), strict=True) if not d]
        if len(rest) < len(cut):
            mine = done.nonzero().flatten()
            noise = _noise(torch, [rows[i] for i in mine.tolist() for i in [cut[i]]], k, logits.dtype, device)
            scores = values[mine].masked_fill(~keep[mine], float("-inf")) - noise.log()
            out[index[mine]] = ids[mine].gather(1, torch.argmax(scores, dim=-1, keepdim=True)).squeeze(1)
        cut = rest
    return out, bad


def _noise(torch, rows: list[Row], width: int, dtype, device):
    """Exp(1) noise, one row per row: a seeded row's from its own generator, the rest in one draw."""
    noise = torch.empty((len(rows), width), dtype=dtype, device=device)
    plain = [i for i, row in enumerate(rows) if row.rng is None]
    if plain:
        noise[plain] = torch.empty((len(plain), width), dtype=dtype, device=device).exponential_()
    for i, row in enumerate(rows):
        if row.rng is not None:  # the same draws in any batch
            noise[i] = torch.empty(width, dtype=dtype, device=device).exponential_(generator=row.rng)
    return noise
