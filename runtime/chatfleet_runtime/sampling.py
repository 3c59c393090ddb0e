"""Choose each row's next token from the batch's logits, with the row's own sampling settings.

Per row: logit bias, OpenAI's presence and frequency penalties, then greedy (temperature 0) or
temperature and top-p sampling with the row's seeded generator. A row whose sampling fails is marked
failed (``Row.fail``); the others get their token.
"""

from __future__ import annotations

import logging

from chatfleet_runtime.rows import Row

log = logging.getLogger(__name__)


def sample(torch, logits, rows: list[Row], suppress=None) -> list[int]:
    """One token id per row; `suppress` (a tensor of token ids, or None) is never chosen."""
    logits = logits.float()
    if suppress is not None:
        logits[:, suppress] = float("-inf")
    for i, row in enumerate(rows):
        p = row.req.params
        if p.logit_bias:
            ids = torch.tensor([t for t, _ in p.logit_bias], dtype=torch.long, device=logits.device)
            bias = torch.tensor([b for _, b in p.logit_bias], dtype=logits.dtype, device=logits.device)
            logits[i, ids] += bias
        if row.generated and (p.presence_penalty or p.frequency_penalty):
            # OpenAI's penalties over the tokens generated so far: logit -= count * frequency
            # + (count > 0) * presence, e.g. a token seen twice, 0.5 and 0.2 -> logit - 1.2.
            seen = torch.tensor(row.generated, dtype=torch.long, device=logits.device)
            counts = torch.bincount(seen, minlength=logits.shape[1])[: logits.shape[1]].to(logits.dtype)
            logits[i] -= counts * p.frequency_penalty + (counts > 0).to(logits.dtype) * p.presence_penalty
    out = torch.argmax(logits, dim=-1)
    for i, row in enumerate(rows):
        p = row.req.params
        if p.temperature <= 0:
            continue
        try:  # one row's sampling trouble fails that row only
            probs = torch.softmax(logits[i] / p.temperature, dim=-1)
            if p.top_p < 1.0:
                sorted_p, order = torch.sort(probs, descending=True)
                keep = torch.cumsum(sorted_p, 0) - sorted_p < p.top_p
                keep[0] = True
                filtered = torch.zeros_like(probs)
                filtered[order[keep]] = sorted_p[keep]
                probs = filtered / filtered.sum()
            out[i] = torch.multinomial(probs, 1, generator=row.rng)[0]
        except Exception as exc:
            log.warning("sampling failed for one row: %s", exc)
            row.fail("internal", f"sampling failed: {exc}")
    return out.tolist()
