"""The decode loop (shared/decoding/batch.py) driven row by row, as the inference engine drives it, on the
tiny model: rows alone, crowded, joining, preempted and from the prompt cache give the tokens and
log-probs of `generate` and of teacher forcing; per-row stopping, streaming that never shows a stop
string, cancellation, and the sampler by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from shared.decoding.batch import DecodeBatch, decode_batch
from shared.decoding.generation import encode_prompt, generate, render_chat
from shared.decoding.logprobs import sequence_logprobs
from shared.decoding.params import Sample, SamplingConfig
from shared.decoding.prompt_cache import PromptCache
from shared.decoding.rows import DecodeRow
from shared.decoding.sampling import draw, sample_rows
from shared.decoding.text import first_stop, stream_safe_length


@pytest.fixture(scope="module")
def tiny(tiny_model_name: str) -> tuple[Any, Any]:
    from shared.models import load_model

    return load_model(tiny_model_name)


def _prompts(tok: Any, n: int) -> list[list[int]]:
    texts = [render_chat(tok, [{"role": "user", "content": f"question {i} {'more ' * i}"}]) for i in range(n)]
    return [encode_prompt(tok, t) for t in texts]


def _run(model: Any, tok: Any, rows: list[DecodeRow]) -> list[Sample]:
    out: dict[int, Sample] = {}
    for i, r in enumerate(rows):
        r.on_finish = lambda s, i=i: out.__setitem__(i, s)
    decode_batch(model, tok, rows)
    return [out[i] for i in range(len(rows))]


def test_batched_greedy_matches_shared_generation_and_teacher_forcing(tiny: Any) -> None:
    model, tok = tiny
    ids = _prompts(tok, 3)
    got = _run(model, tok, [DecodeRow(p, SamplingConfig(max_new_tokens=12)) for p in ids])
    ref = generate(model, tok, ids, max_new_tokens=12)
    for g, r, p in zip(got, ref, ids, strict=True):
        assert g.token_ids == r[0].token_ids
        assert g.logprobs == [0.0] * len(g.token_ids)
        assert g.logprobs_t1 == pytest.approx(r[0].logprobs_t1, abs=1e-4)
        recomputed = sequence_logprobs(model, p, g.token_ids)
        assert torch.allclose(recomputed, torch.tensor(g.logprobs_t1), atol=1e-4)


def test_seeded_sampling_matches_shared_generation_whatever_shares_the_batch(tiny: Any) -> None:
    model, tok = tiny
    ids = _prompts(tok, 2)
    cfg = SamplingConfig(max_new_tokens=10, temperature=0.8, top_k=7, top_p=0.9, seed=5)
    ref = generate(model, tok, [ids[0]], cfg)[0][0]
    alone = _run(model, tok, [DecodeRow(ids[0], cfg)])[0]
    crowded = _run(model, tok, [DecodeRow(ids[1], SamplingConfig(max_new_tokens=3, temperature=1.0)),
                                DecodeRow(ids[0], cfg)])[1]
    assert alone.token_ids == ref.token_ids == crowded.token_ids
    assert alone.logprobs == pytest.approx(ref.logprobs, abs=1e-5)
    assert alone.logprobs_t1 == pytest.approx(ref.logprobs_t1, abs=1e-5)
    assert all(b >= t for b, t in zip(alone.logprobs, alone.logprobs_t1, strict=True))  # filtering concentrates mass


def test_rows_stop_on_their_own_budget_and_counts_match(tiny: Any) -> None:
    model, tok = tiny
    ids = _prompts(tok, 3)
    rows = [DecodeRow(ids[i], SamplingConfig(max_new_tokens=m, temperature=1.0)) for i, m in enumerate((2, 9, 5))]
    got = _run(model, tok, rows)
    for s, m in zip(got, (2, 9, 5), strict=True):
        assert len(s.token_ids) == len(s.logprobs) == len(s.logprobs_t1)
        assert s.finish_reason in ("length", "stop")
        assert len(s.token_ids) == m or s.finish_reason == "stop"


def test_stop_string_cuts_text_and_streaming_never_shows_it(tiny: Any) -> None:
    model, tok = tiny
    p = _prompts(tok, 1)[0]
    free = _run(model, tok, [DecodeRow(p, SamplingConfig(max_new_tokens=20))])[0]
    assert len(free.text) > 6
    stop = free.text[4:7]
    deltas: list[str] = []
    row = DecodeRow(p, SamplingConfig(max_new_tokens=20, stop=(stop,)), stream=True,
                    on_delta=lambda ids, text: deltas.append(text))
    got = _run(model, tok, [row])[0]
    assert got.finish_reason == "stop"
    assert got.text == free.text[:first_stop(free.text, [stop])]
    assert "".join(deltas) == got.text
    assert got.token_ids == free.token_ids[:len(got.token_ids)]


def test_cancel_ends_rows_early(tiny: Any) -> None:
    model, tok = tiny
    p = _prompts(tok, 1)[0]
    seen = {"n": 0}

    def cancelled() -> bool:
        seen["n"] += 1
        return seen["n"] > 4

    got = _run(model, tok, [DecodeRow(p, SamplingConfig(max_new_tokens=50), cancelled=cancelled)])[0]
    assert got.finish_reason == "cancelled"
    assert 0 < len(got.token_ids) < 50 and len(got.logprobs) == len(got.token_ids)


def test_context_window_caps_a_row(tiny: Any) -> None:
    model, tok = tiny
    p = _prompts(tok, 1)[0]
    out: list[Sample] = []
    decode_batch(model, tok, [DecodeRow(p, SamplingConfig(max_new_tokens=50), on_finish=out.append)],
                 context_window=len(p) + 3)
    assert len(out[0].token_ids) == 3 and out[0].finish_reason == "length"


def test_sample_rows_by_hand() -> None:
    probs = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]])
    draws = torch.stack([sample_rows(probs) for _ in range(400)])       # (400, 2)
    assert (draws[:, 0] == 1).all()                                     # a point mass is always drawn
    assert not (draws[:, 1] == 1).any()                                 # probability 0 is never drawn
    frac = (draws[:, 1] == 0).float().mean().item()
    assert abs(frac - 0.5) < 0.1                                        # 4.9 standard deviations


def test_sample_rows_follows_the_distribution_across_blocks() -> None:
    """The two-level draw (block, then token) on a vocabulary that is not a multiple of the block size."""
    g = torch.Generator().manual_seed(0)
    probs = torch.rand(1, 1000, generator=g) ** 4                      # uneven, unnormalised
    probs[0, 300:700] = 0.0                                             # whole blocks and partial ones at 0
    torch.manual_seed(1)
    draws = torch.cat([sample_rows(probs.expand(500, -1)) for _ in range(80)])   # 40,000 draws
    assert not ((draws >= 300) & (draws < 700)).any()
    freq = torch.bincount(draws, minlength=1000).float() / draws.numel()
    tv = 0.5 * (freq - probs[0] / probs[0].sum()).abs().sum().item()
    assert tv < 0.06                                                    # sampling noise at 40k draws: ~0.03


def test_stream_safe_length_by_hand() -> None:
    assert stream_safe_length("hello wor", ["world"]) == 6               # "wor" may become "world"
    assert stream_safe_length("hello", ["xyz"]) == 5
    assert stream_safe_length("ab\ufffd", []) == 2                       # unfinished UTF-8 character
    assert stream_safe_length("a\n", ["\n\n"]) == 1
    assert first_stop("a END b STOP", ["STOP", "END"]) == 2
    assert math.isclose(first_stop("abc", ["x"]), -1)


def _collect(rows: list[DecodeRow]) -> dict[int, Sample]:
    out: dict[int, Sample] = {}
    for i, r in enumerate(rows):
        r.on_finish = lambda s, i=i: out.__setitem__(i, s)
    return out


def test_a_row_that_joins_a_running_batch_decodes_as_if_alone(tiny: Any) -> None:
    """Continuous batching: rows joining mid-way (shorter and longer prompts, greedy and seeded) give the
    tokens and log-probs they give alone; rows leaving shrink and trim the cache without changing them."""

    model, tok = tiny
    ids = _prompts(tok, 4)
    cfgs = [SamplingConfig(max_new_tokens=14), SamplingConfig(max_new_tokens=4, temperature=0.9, seed=11),
            SamplingConfig(max_new_tokens=12, temperature=0.7, top_k=5, seed=3),
            SamplingConfig(max_new_tokens=9, temperature=1.0, top_p=0.8, seed=8)]
    alone = [_run(model, tok, [DecodeRow(p, c)])[0] for p, c in zip(ids, cfgs, strict=True)]

    rows = [DecodeRow(p, c) for p, c in zip(ids, cfgs, strict=True)]
    got = _collect(rows)
    batch = DecodeBatch(model, tok)
    batch.add([rows[3]])                      # the longest prompt first
    batch.step()
    batch.step()
    batch.add([rows[0], rows[1]])             # two shorter ones join at a step boundary
    exact = []                                # a lone row's cache holds no padding once the others left
    for _ in range(3):
        batch.step()
    batch.add([rows[2]])
    while batch.live:
        batch.step()
        if len(batch.live) == 1:
            r = batch.live[0]
            exact.append(batch.width == len(r.prompt_ids) + len(r.sample.token_ids))
    assert len(got) == 4
    for i in range(4):
        assert got[i].token_ids == alone[i].token_ids, i
        assert got[i].logprobs == pytest.approx(alone[i].logprobs, abs=1e-4)
        assert got[i].logprobs_t1 == pytest.approx(alone[i].logprobs_t1, abs=1e-4)
    assert exact and all(exact)


def test_samples_of_one_prompt_share_a_prefill_and_keep_their_own_seeds(tiny: Any) -> None:

    model, tok = tiny
    p = _prompts(tok, 1)[0]
    cfg = SamplingConfig(max_new_tokens=8, temperature=1.0, seed=42)
    rows = [DecodeRow(p, cfg, sample_index=i) for i in range(3)]
    got = _collect(rows)
    batch = DecodeBatch(model, tok)
    batch.add(rows)
    assert batch.stats.steps == 1 and len(batch) == 3      # one prefill forward for three rows
    while batch.live:
        batch.step()
    ref = generate(model, tok, [p], SamplingConfig(max_new_tokens=8, temperature=1.0, seed=42, n=3))[0]
    assert [got[i].token_ids for i in range(3)] == [r.token_ids for r in ref]
    assert len({tuple(got[i].token_ids) for i in range(3)}) > 1                 # distinct samples


def test_a_preempted_row_resumes_with_the_answer_it_would_have_given(tiny: Any) -> None:
    """Recompute preemption: rows evicted mid-answer (greedy, seeded with top-k, streamed with a stop
    string) and added back later give the tokens, log-probs and streamed text they give unpreempted; the
    rows left running are not disturbed, and an evicted row is never drawn twice."""

    model, tok = tiny
    ids = _prompts(tok, 3)
    cfgs = [SamplingConfig(max_new_tokens=16), SamplingConfig(max_new_tokens=14, temperature=0.8, top_k=9, seed=4),
            SamplingConfig(max_new_tokens=15, temperature=1.0, seed=21)]
    alone = [_run(model, tok, [DecodeRow(p, c)])[0] for p, c in zip(ids, cfgs, strict=True)]
    streamed: list[str] = []
    rows = [DecodeRow(p, c) for p, c in zip(ids, cfgs, strict=True)]
    rows[2].stream = True
    rows[2].on_delta = lambda _ids, text: streamed.append(text)
    got = _collect(rows)
    batch = DecodeBatch(model, tok)
    batch.add(rows)
    for _ in range(4):
        batch.step()
    evicted = [rows[1], rows[2]]
    held = [len(r.sample.token_ids) for r in evicted]
    batch.evict(evicted)
    assert batch.live == [rows[0]]
    for _ in range(3):                                   # the others wait while row 0 goes on
        batch.step()
    assert [len(r.sample.token_ids) for r in evicted] == held
    batch.add(evicted)                                   # back: prefill of prompt + tokens so far
    while batch.live:
        batch.step()
    for i in range(3):
        assert got[i].token_ids == alone[i].token_ids, i
        assert got[i].logprobs == pytest.approx(alone[i].logprobs, abs=1e-4)
        assert got[i].logprobs_t1 == pytest.approx(alone[i].logprobs_t1, abs=1e-4)
    assert "".join(streamed) == got[2].text == alone[2].text

    whole = DecodeBatch(model, tok)                      # every row out: the batch is empty, then resumes
    again = [DecodeRow(ids[1], cfgs[1])]
    out = _collect(again)
    whole.add(again)
    whole.step()
    whole.evict(again)
    assert not whole.live
    whole.add(again)
    while whole.live:
        whole.step()
    assert out[0].token_ids == alone[1].token_ids


def test_a_repeated_prompt_joins_from_the_prompt_cache_with_the_same_answer(tiny: Any) -> None:
    """The prompt cache: a prompt prefilled once joins later batches without a forward pass (alone, or
    beside a new prompt that is prefilled), and every row gives the answer it gives uncached."""

    model, tok = tiny
    ids = _prompts(tok, 3)
    cfg = SamplingConfig(max_new_tokens=10, temperature=0.9, seed=13)
    alone = [_run(model, tok, [DecodeRow(p, cfg)])[0] for p in ids]
    cache = PromptCache(64 << 20)

    first = DecodeBatch(model, tok, cache=cache)
    rows = [DecodeRow(ids[0], cfg), DecodeRow(ids[1], cfg)]
    got = _collect(rows)
    first.add(rows)
    while first.live:
        first.step()
    assert len(cache) == 2 and first.stats.cached_prompts == 0

    second = DecodeBatch(model, tok, cache=cache)
    rows2 = [DecodeRow(ids[1], cfg)]
    got2 = _collect(rows2)
    second.add(rows2)
    assert second.stats.steps == 0 and second.stats.cached_prompts == 1     # no forward pass at all
    rows3 = [DecodeRow(ids[2], cfg), DecodeRow(ids[0], cfg)]                 # one new, one cached
    got3 = _collect(rows3)
    second.add(rows3)
    assert second.stats.steps == 1 and second.stats.cached_prompts == 2
    while second.live:
        second.step()
    for g, ref in [(got[0], alone[0]), (got[1], alone[1]), (got2[0], alone[1]), (got3[0], alone[2]),
                   (got3[1], alone[0])]:
        assert g.token_ids == ref.token_ids
        assert g.logprobs_t1 == pytest.approx(ref.logprobs_t1, abs=1e-4)
    assert cache.hits == 2 and len(cache) == 3


def test_the_prompt_cache_is_bounded_and_never_holds_a_preempted_rows_tokens(tiny: Any) -> None:

    model, tok = tiny
    ids = _prompts(tok, 3)
    probe = PromptCache(1 << 30)
    b = DecodeBatch(model, tok, cache=probe)
    b.add([DecodeRow(ids[0], SamplingConfig(max_new_tokens=1))])
    one = probe.bytes                                      # the first prompt's prefill
    cache = PromptCache(int(one * 2.5))                    # room for two prompts of about that size
    b = DecodeBatch(model, tok, cache=cache)
    for p in ids:
        b.add([DecodeRow(p, SamplingConfig(max_new_tokens=1))])
    assert len(cache) == 2 and cache.bytes <= cache.max_bytes
    assert cache.get(("", 0, tuple(ids[0]))) is None       # least recently used went first
    row = DecodeRow(ids[0], SamplingConfig(max_new_tokens=6))
    b = DecodeBatch(model, tok, cache=cache)
    b.add([row])
    b.step()
    b.evict([row])
    before = len(cache), cache.bytes
    b.add([row])                                           # prompt + tokens so far: not a cache entry
    assert (len(cache), cache.bytes) == before


def test_a_reused_lora_slot_does_not_share_cache_entries_with_its_previous_adapter(tiny: Any) -> None:
    from services.inference.multi_lora import AdapterWeights, LoraPool

    model, _ = tiny
    pool = LoraPool(model)
    name = next(n for n, m in model.named_modules() if n.endswith("q_proj"))
    m = dict(model.named_modules())[name]
    w = AdapterWeights("a", {name: (torch.zeros(2, m.in_features), torch.zeros(m.out_features, 2))})
    slot = pool.put(w)
    key = pool.slot_key(slot)
    pool.clear(slot)
    again = pool.put(w)
    assert again == slot and pool.slot_key(again) != key and pool.slot_key(0) == 0


def test_the_prompt_cache_never_serves_one_tenants_prefill_to_another(tiny: Any) -> None:
    """A hit is faster than a miss: a prefill shared across tenants would let one tenant learn what another
    asked. Each tenant (the row's cache salt) has its own entries."""

    model, tok = tiny
    p = _prompts(tok, 1)[0]
    cache = PromptCache(64 << 20)
    b = DecodeBatch(model, tok, cache=cache)
    b.add([DecodeRow(p, SamplingConfig(max_new_tokens=1), cache_salt="acme")])
    b.add([DecodeRow(p, SamplingConfig(max_new_tokens=1), cache_salt="globex")])
    assert b.stats.cached_prompts == 0 and b.stats.steps == 2 and len(cache) == 2
    b.add([DecodeRow(p, SamplingConfig(max_new_tokens=1), cache_salt="acme")])
    assert b.stats.cached_prompts == 1 and b.stats.steps == 2


def test_rows_leaving_a_sliding_window_cache_decode_as_if_alone(tiny: Any) -> None:
    """Gemma 3 keeps some layers in a sliding window (`DynamicSlidingWindowLayer`), which sizes its mask from
    the count of tokens it has seen: trimming its padding columns when a row left made that count disagree
    with its keys (a size-mismatch crash). Rows of a tiny random Gemma 3 decode as alone, past the window too."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    _, tok = tiny
    config = Gemma3TextConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, sliding_window=16, layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=256, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Gemma3ForCausalLM(config).eval()
    prompts = _prompts(tok, 3)[::-1]        # the longest leaves first: every row's first columns become padding
    budgets = (3, 30, 6)
    alone = [_run(model, tok, [DecodeRow(p, SamplingConfig(max_new_tokens=k))])[0]
             for p, k in zip(prompts, budgets, strict=True)]
    together = _run(model, tok, [DecodeRow(p, SamplingConfig(max_new_tokens=k))
                                 for p, k in zip(prompts, budgets, strict=True)])
    assert len(prompts[1]) + budgets[1] > 16                 # past the sliding window
    for a, t in zip(alone, together, strict=True):
        assert t.token_ids == a.token_ids
        assert t.logprobs_t1 == pytest.approx(a.logprobs_t1, abs=1e-4)


def test_a_denormal_temperature_decodes_greedily_instead_of_dividing_into_nan() -> None:
    """Found by tests/security/test_fuzz_rpcs.py: temperature 1.4e-45 made logits / T overflow to inf, the
    softmax NaN, and torch.multinomial raise (INTERNAL). Below GREEDY_BELOW a row is greedy, as in vLLM."""
    logits = torch.tensor([[0.5, 2.0, -1.0, 1.9], [0.5, 2.0, -1.0, 1.9]])
    temp = torch.tensor([1.4e-45, 1e-6])
    gens = [torch.Generator().manual_seed(1), None]
    tok, lp_t1, lp_b = draw(logits, temp, torch.zeros(2, dtype=torch.long), torch.ones(2), gens)
    assert tok.tolist() == [1, 1]
    assert lp_b == [0.0, 0.0] and all(math.isfinite(x) for x in lp_t1)
