"""The one decode loop (prompt ids + sampling parameters --> sampled tokens with log-probs), in modules:

- batch.py        `DecodeBatch` (continuous batching: rows join and leave between steps), `decode_batch`
- rows.py         `DecodeRow` (one sequence and its callbacks), `BatchStats`, `RowRouter` (per-row LoRA)
- kv_cache.py     the left-padded KV-cache layout rows share
- prompt_cache.py prefills kept for repeated prompts
- forward.py      last-position-only logits (`logits_to_keep`)
- sampling.py     logits --> next token and its two log-probs (per-row temperature, top-k/p, seed)
- logprobs.py     the definitions of the recorded and recomputed log-probs, teacher-forced scoring
- text.py         EOS ids, stop strings, how much text may stream
- params.py       `SamplingConfig`, `Sample`

`shared.decoding.generation.generate` is its prompts-in, samples-out form.
"""
