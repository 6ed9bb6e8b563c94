"""What to sample (`SamplingConfig`) and what came out (`Sample`): the decode loop's request and result.

The meaning of `Sample.logprobs` and `Sample.logprobs_t1` is defined in shared/decoding/logprobs.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GREEDY_BELOW = 1e-5
"""A temperature below this decodes greedily, as vLLM does (its _SAMPLING_EPS): logits divided by a denormal
temperature overflow to inf and the softmax to NaN, and a distribution that sharp is a point mass anyway."""


@dataclass(frozen=True)
class Grammar:
    """A constraint on what may be generated, enforced token by token by masking the logits
    (shared/decoding/constraints.py): a sample can only be a string the grammar accepts.

    kind: `json_schema` (source: the schema as JSON text), `json_object` (any JSON object; source ""),
    `lark` (source: an llguidance Lark grammar, which may embed JSON schemas with `%json{...}`).
    """

    kind: str
    source: str = ""
    scope: str = ""
    """The tenant whose request compiled it: compiled grammars are cached per whole `Grammar`, so one tenant
    never finds (or times) the schemas another tenant sent (shared/decoding/constraints.py)."""


@dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int = 64
    temperature: float = 0.0      # 0 = greedy
    top_p: float = 1.0            # 1 = off
    top_k: int = 0                # 0 = off
    stop: tuple[str, ...] = ()    # text stops before the first occurrence
    seed: int | None = None
    n: int = 1                    # samples per prompt
    grammar: Grammar | None = None  # None = unconstrained
    top_logprobs: int = 0         # alternatives per position in Sample.top_logprobs (0 = none: no extra pass)


@dataclass
class Sample:
    token_ids: list[int] = field(default_factory=list)   # generated tokens, EOS included when it was produced
    text: str = ""                                         # decoded, without EOS, cut before a stop string
    logprobs: list[float] = field(default_factory=list)    # behaviour distribution (shared/decoding/logprobs.py)
    logprobs_t1: list[float] = field(default_factory=list) # temperature-1, unfiltered
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    # per position, when SamplingConfig.top_logprobs > 0: the k most likely (token, log-prob) under the same
    # distribution as `logprobs` (shared/decoding/logprobs.py `top_alternatives`), most likely first
    finish_reason: str = "length"                          # stop | length | cancelled
    cached_prompt_tokens: int = 0
    # prompt tokens the engine took from its prefix cache instead of computing them (OpenAI's
    # `usage.prompt_tokens_details.cached_tokens`); the cache is per tenant, so another tenant's prompt never counts
