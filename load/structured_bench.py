"""Cost of grammar-constrained decoding (shared/decoding/constraints.py) in the decode loop the transformers
engine runs (shared/decoding/batch.py): tokens/s of the same rows with and without a JSON schema, on the
same model in the same run, and their ratio (target >= 0.8x). Both sides must decode the same batch shape:
a real model closes an unbounded JSON string after a few tokens, and a batch whose rows finish early
decodes fewer tokens per (fixed-cost) step, which read as a 0.71x "slowdown" on SmolLM2 that was no cost of
the mask at all. So the schema's string has a minimum length past any budget, the prompt asks for a long
answer, and each line prints how many tokens each side decoded; sampled at T=1, seeded.

    .venv/bin/python -m load.structured_bench [--model tiny|<hf dir or name>] [--tokens 128] [--batch 1 8]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from shared.decoding.batch import decode_batch
from shared.decoding.generation import encode_prompt, render_chat
from shared.decoding.params import Grammar, SamplingConfig
from shared.decoding.rows import DecodeRow
from shared.models import TINY, load_model

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "minLength": 100_000},
                                           "score": {"type": "integer"}},
          "required": ["answer", "score"], "additionalProperties": False}


def _tokens_per_s(model: Any, tok: Any, prompt: list[int], batch: int, tokens: int, grammar: Grammar | None,
                  repeats: int) -> tuple[float, int]:
    best, decoded = 0.0, 0
    for rep in range(repeats):
        rows = [DecodeRow(prompt, SamplingConfig(max_new_tokens=tokens, temperature=1.0, seed=1 + i + 100 * rep,
                                                 grammar=grammar), sample_index=i) for i in range(batch)]
        t0 = time.perf_counter()
        stats = decode_batch(model, tok, rows)
        best = max(best, stats.tokens / (time.perf_counter() - t0))
        decoded = stats.tokens
    return best, decoded


def main() -> None:
    """Print one line per batch size: tokens/s free, tokens/s constrained, ratio."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model, tok = load_model(TINY if a.model == "tiny" else a.model)
    prompt = encode_prompt(tok, render_chat(tok, [{"role": "user", "content": "Write a long story about the sea."}]))
    grammar = Grammar("json_schema", json.dumps(SCHEMA))
    _tokens_per_s(model, tok, prompt, 1, 8, grammar, 1)          # warm-up: tokenizer + grammar caches, kernels
    for b in a.batch:
        free, n_free = _tokens_per_s(model, tok, prompt, b, a.tokens, None, a.repeats)
        constrained, n_con = _tokens_per_s(model, tok, prompt, b, a.tokens, grammar, a.repeats)
        print(f"model {a.model} batch {b:>3} x {a.tokens} tokens: free {free:8.1f} tok/s ({n_free} tokens), "
              f"json_schema {constrained:8.1f} tok/s ({n_con} tokens), ratio {constrained / free:.2f}x")


if __name__ == "__main__":
    main()
