"""The log-probabilities Apprentice records and recomputes: their one definition.

For a completion token y_t after context x, y_<t, with raw next-token logits z_t (a vector over the
vocabulary) and the request's temperature T, top-k k and top-p p:

- behaviour log-prob (`Sample.logprobs`, events.proto `Interaction.response_logprobs`):
      log p_b(y_t),   p_b = softmax(filter_{k,p}(z_t / T))
  the distribution y_t was actually drawn from (`filter_top_k_top_p`); greedy decoding (T = 0) is a
  point mass, recorded as 0.0.
- temperature-1 log-prob (`Sample.logprobs_t1`, `Interaction.response_logprobs_t1`):
      log softmax(z_t)[y_t] = z_t[y_t] - logsumexp(z_t)
  unfiltered: exactly what a trainer recomputes as log pi_theta(y_t | x, y_<t), so importance ratios
  pi_theta / pi_rollout use this one.
- teacher-forced log-prob (`sequence_logprobs`): log softmax(z_t / T)[y_t] for given completion tokens;
  at T = 1 it is the temperature-1 log-prob above (the eval gate's likelihood, the tests' reference).

Grammar-constrained tokens (`SamplingConfig.grammar`, shared/decoding/constraints.py): the behaviour
log-prob is under the masked distribution, p_b = softmax(filter_{k,p}(mask(z_t) / T)) with disallowed
tokens at -inf, since that is what y_t was drawn from (the rollout policy); the temperature-1 log-prob
stays the unmasked model's log softmax(z_t)[y_t], since the trainer recomputes pi_theta without the mask.
So for a constrained token logprobs >= logprobs_t1 at T = 1, the gap being the log of the mass the mask
removed.

The decode loop computes the first two for every token it draws (shared/decoding/sampling.py `draw`);
the vLLM engine computes the behaviour log-prob from the top-K candidates vLLM returns
(`behaviour_logprob`); the trainer's fused kernels (services/trainer/logprobs.py) compute the
temperature-1 log-prob without materialising the logits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from shared.decoding.params import GREEDY_BELOW


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """filter_{k,p}: mask (set to -inf) tokens outside each row's top-k and nucleus. logits (B, V);
    top_k (B,) with 0 = off; top_p (B,) with 1 = off.

    The nucleus is the smallest prefix, by decreasing probability after top-k, whose mass reaches p: a
    token is removed when the mass ranked above it is already >= p (so at least one token stays)."""
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)            # (B, V)
    ranks = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)          # (1, V)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, logits.shape[-1])).unsqueeze(1)
    remove = ranks >= k                                                                 # beyond top-k
    probs = torch.softmax(sorted_logits.masked_fill(remove, float("-inf")), dim=-1)
    cum_before = torch.cumsum(probs, dim=-1) - probs                                    # mass ranked above
    remove |= cum_before >= top_p.unsqueeze(1)                                          # keeps >= 1 token
    mask = torch.zeros_like(remove).scatter(1, sorted_idx, remove)
    return logits.masked_fill(mask, float("-inf"))


def behaviour_logprob(token: int, raw: Mapping[int, float], temperature: float, top_k: int, top_p: float) -> float:
    """log p_b(token) from raw (T = 1) log-probs of a candidate set that contains `token`.

    p_b restricted to `raw`'s tokens:
    1) scale: s_i = raw_i / T (raw_i = logit_i - logZ, and softmax ignores the shared constant);
    2) keep the top_k largest (if top_k > 0);
    3) keep the smallest prefix, by decreasing probability, whose mass reaches top_p (if top_p < 1);
    4) renormalise over what is kept. Greedy (T = 0) is a point mass: 0.0.
    Exact when the filtered support lies inside the candidates; otherwise the normaliser misses the
    behaviour mass outside them.
    """
    if temperature < GREEDY_BELOW:
        return 0.0
    if token not in raw:
        raise KeyError(f"token {token} missing from the candidate log-probs")
    if temperature == 1.0 and top_k <= 0 and top_p >= 1.0:
        return raw[token]             # nothing filtered: the raw log-prob is already over the whole vocabulary
    ranked = sorted(raw.items(), key=lambda kv: kv[1], reverse=True)
    scaled = [(t, lp / temperature) for t, lp in ranked]
    if top_k > 0:
        scaled = scaled[:top_k]
    m = scaled[0][1]
    log_z = m + math.log(sum(math.exp(s - m) for _, s in scaled))
    if 0 < top_p < 1:
        kept, mass = [], 0.0
        for t, s in scaled:
            if mass >= top_p:
                break
            kept.append((t, s))
            mass += math.exp(s - log_z)
        scaled = kept
        log_z = m + math.log(sum(math.exp(s - m) for _, s in scaled))
    for t, s in scaled:
        if t == token:
            return s - log_z
    return float("-inf")  # the token was outside the (approximate) filtered support


def top_alternatives(logits: torch.Tensor, temp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                     k: int, allowed: torch.Tensor | None = None) -> tuple[list[list[int]], list[list[float]]]:
    """The k most likely tokens per row and their behaviour log-probs (OpenAI's `top_logprobs`), from the
    distribution `Sample.logprobs` uses: log p_b = log softmax(filter_{k,p}(z / T)); a token the filter
    removed is -inf. Greedy rows (T <= 0) are the point mass their recorded 0.0 comes from: the argmax
    0.0, every other alternative -inf. Ranked by raw logits, which is p_b's order (scaling keeps it, the
    filter drops the tail), so the lists come out most likely first. One extra vocabulary pass, run only
    when a row asked for alternatives. logits (B, V); temp / top_k / top_p (B,); `allowed` (B, V) the
    grammar masks the draw used (shared/decoding/sampling.py `draw`): a masked token is -inf too."""
    k = max(1, min(k, logits.shape[-1]))
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    greedy = temp < GREEDY_BELOW
    dist = logits / torch.where(greedy, torch.ones_like(temp), temp).unsqueeze(1)
    if bool((top_k > 0).any()) or bool((top_p < 1).any()):     # the sort of the filter only when it filters
        dist = filter_top_k_top_p(dist, top_k, top_p)
    top = torch.topk(logits, k, dim=-1).indices                                          # (B, k)
    vals = torch.log_softmax(dist, dim=-1).gather(1, top)
    point = torch.full_like(vals, float("-inf"))
    point[:, 0] = 0.0
    vals = torch.where(greedy.unsqueeze(1), point, vals)
    return top.tolist(), vals.tolist()


def alternatives_from_raw(raw: Mapping[int, float], temperature: float, top_k: int, top_p: float,
                          k: int) -> list[tuple[int, float]]:
    """`top_alternatives` for an engine that returns raw (T = 1) top-K log-probs per position (vLLM's
    `logprobs=K`): the k largest candidates with `behaviour_logprob`'s value each (its exactness caveats
    apply), most likely first; greedy is the point mass on the first."""
    ranked = sorted(raw.items(), key=lambda kv: kv[1], reverse=True)[:max(0, k)]
    if temperature < GREEDY_BELOW:
        return [(t, 0.0 if i == 0 else float("-inf")) for i, (t, _) in enumerate(ranked)]
    return [(t, behaviour_logprob(t, raw, temperature, top_k, top_p)) for t, _ in ranked]


def sequence_logprobs(model: Any, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                      temperature: float = 1.0) -> torch.Tensor:
    """log softmax(z_t / T)[y_t] for each completion token, teacher-forced. Shape (len(completion_ids),).

    Runs with gradients if the caller has them enabled; wrap in no_grad to score.
    """
    device = next(model.parameters()).device
    full = torch.tensor([list(prompt_ids) + list(completion_ids)], device=device)          # (1, P+C)
    logits = model(input_ids=full).logits[0, len(prompt_ids) - 1:-1, :].float()           # (C, V)
    logp = F.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, torch.tensor(list(completion_ids), device=device)[:, None]).squeeze(1)
