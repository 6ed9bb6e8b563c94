"""Last-position logits --> each row's next token and its two log-probs (defined in
shared/decoding/logprobs.py), with per-row temperature, top-k, top-p and seed.

Seeded rows draw from their own CPU generator (`seed * 1000003 + sample_index`), so a seeded request
gives the same tokens whatever else shares its batch and whenever it joins; unseeded rows share one
vectorised draw per step (`sample_rows`) from torch's global generator.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shared.decoding.logprobs import filter_top_k_top_p
from shared.decoding.params import GREEDY_BELOW


def seeded_generator(seed: int | None, sample_index: int) -> torch.Generator | None:
    """The generator of sample `sample_index` of a request seeded `seed`; None (the global generator)
    when unseeded (seed None or 0)."""
    if seed is None or seed == 0:
        return None
    g = torch.Generator()
    g.manual_seed((int(seed) * 1000003 + sample_index) % (1 << 63))  # distinct, reproducible; any int64 seed
    return g


def sample_rows(probs: torch.Tensor, block: int = 256) -> torch.Tensor:
    """One draw per row of `probs` (B, V), unnormalised, by inverting the CDF in two levels: a block of
    `block` tokens from the block sums, then a token inside the block.

    Same distribution as `torch.multinomial(probs, 1)` at a fraction of its CPU cost on a 49k vocabulary:
    one vectorised pass (the block sums) instead of a full sequential cumsum or multinomial's per-row
    set-up. A token of probability 0 is never drawn: both searches look for the first cumulative sum
    strictly above u * total with u < 1 (scaled by 1 - 1e-6 so that rounding cannot reach the total)."""
    B, V = probs.shape
    nb = -(-V // block)
    p = F.pad(probs, (0, nb * block - V)) if nb * block != V else probs
    blocks = p.reshape(B, nb, block)                                                    # (B, nb, block)
    cdf = blocks.sum(dim=-1).cumsum(dim=-1)                                             # (B, nb)
    u = torch.rand(B, 1, device=probs.device) * (1 - 1e-6) * cdf[:, -1:]                # (B, 1)
    b = torch.searchsorted(cdf, u, right=True).clamp(max=nb - 1)                        # (B, 1)
    before = torch.where(b > 0, cdf.gather(1, (b - 1).clamp(min=0)), torch.zeros_like(u))
    inner = blocks[torch.arange(B, device=probs.device), b.squeeze(1)].cumsum(dim=-1)   # (B, block)
    r = torch.minimum(u - before, inner[:, -1:] * (1 - 1e-6)).clamp(min=0)
    j = torch.searchsorted(inner, r, right=True).clamp(max=block - 1)                   # (B, 1)
    return (b * block + j).squeeze(1)


def draw(logits: torch.Tensor, temp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
         gens: list[torch.Generator | None], allowed: torch.Tensor | None = None,
         ) -> tuple[torch.Tensor, list[float], list[float]]:
    """Each row's next token, its temperature-1 log-prob and its behaviour log-prob. logits (B, V) float;
    temp / top_k / top_p (B,) (temperature < GREEDY_BELOW = greedy, top_k 0 and top_p 1 = off); gens[i] row i's
    seeded generator or None.

    Vocabulary-wide passes cost as much as a small model's forward pass, so they are kept few: greedy
    rows need an argmax and a logsumexp; sampled rows one softmax of the behaviour distribution (plus
    a logsumexp at T=1 when it differs), the draw, and log p of the drawn token. In a mixed batch the
    sampling passes run over every row (cheaper than copying out the sampled ones) and the greedy
    rows' draws are ignored.

    allowed (B, V) bool, optional: grammar masks (shared/decoding/constraints.py `allowed_mask`); a row draws
    only allowed tokens. Its behaviour log-prob is under the masked distribution (what it was drawn from);
    its temperature-1 log-prob stays the unmasked model's (shared/decoding/logprobs.py)."""
    B = logits.shape[0]
    raw = logits
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    device = logits.device
    greedy = temp < GREEDY_BELOW                                                    # (B,)
    is_greedy = greedy.tolist()
    n_greedy = sum(is_greedy)
    if n_greedy == B:
        tok = torch.argmax(logits, dim=-1)
        lp = raw.gather(1, tok[:, None]).squeeze(1) - torch.logsumexp(raw, dim=-1)
        return tok, lp.tolist(), [0.0] * B
    filtered = bool((top_k > 0).any()) or bool((top_p < 1).any())
    plain = not filtered and allowed is None and bool(((temp == 1) | greedy).all())
    if plain:                                              # T=1, unfiltered: one distribution
        dist = logits
    else:
        dist = logits / torch.where(greedy, torch.ones_like(temp), temp).unsqueeze(1)
        if filtered:
            dist = filter_top_k_top_p(dist, top_k, top_p)
    probs = torch.softmax(dist, dim=-1)                                             # (B, V)
    shared = [i for i in range(B) if not is_greedy[i] and gens[i] is None]
    tok = sample_rows(probs) if shared else torch.zeros(B, dtype=torch.long, device=device)
    for i, gen in enumerate(gens):
        if gen is not None and not is_greedy[i]:              # seeded generators live on the CPU
            tok[i] = torch.multinomial(probs[i].cpu(), 1, generator=gen).squeeze().to(device)
    if n_greedy:
        tok = torch.where(greedy, torch.argmax(logits, dim=-1), tok)
    p_tok = probs.gather(1, tok[:, None]).squeeze(1)                                # (B,)
    lp = torch.log(p_tok)                        # log p(tok) under `dist` (= T=1 when plain)
    tiny = p_tok < 1e-30                         # log of a denormal loses precision: redo exactly
    if bool(tiny.any()):
        exact = torch.log_softmax(dist, dim=-1).gather(1, tok[:, None]).squeeze(1)
        lp = torch.where(tiny, exact, lp)
    lp_t1 = lp if plain else raw.gather(1, tok[:, None]).squeeze(1) - torch.logsumexp(raw, dim=-1)
    lp_b = torch.where(greedy, torch.zeros_like(lp), lp)        # greedy: a point mass, recorded as 0.0
    return tok, lp_t1.tolist(), lp_b.tolist()
