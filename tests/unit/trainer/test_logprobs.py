"""The fused LM-head ops against the plain computation and brute force; the Scorer against shared.decoding.generation
(what inference records as behaviour log-probs) on the real tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from services.trainer import losses
from services.trainer.batching import make_batch, micro_batches
from services.trainer.logprobs import Scorer, fused_token_logprobs, fused_topk_kl, score, supports_fused_head


def _leaf(*shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape) * scale).requires_grad_(True)


def _grads(*ts: torch.Tensor) -> list[torch.Tensor | None]:
    out = [None if t.grad is None else t.grad.clone() for t in ts]
    for t in ts:
        t.grad = None
    return out


@pytest.mark.parametrize("head_trainable", [False, True], ids=["frozen-head", "trainable-head"])
def test_fused_token_logprobs_value_and_grad(head_trainable: bool) -> None:
    """Frozen head (LoRA): Jacobian formed in forward. Trainable head (full FT): recomputed in backward."""
    torch.manual_seed(0)
    h, W, t, g = _leaf(37, 16), _leaf(500, 16).requires_grad_(head_trainable), torch.randint(0, 500, (37,)), torch.randn(37)
    out = fused_token_logprobs(h, W, t, chunk=8)
    (out * g).sum().backward()
    gh, gW = _grads(h, W)
    ref = torch.log_softmax(h @ W.T, -1).gather(1, t[:, None])[:, 0]
    (ref * g).sum().backward()
    assert torch.allclose(out, ref, atol=1e-5)
    assert gh is not None and h.grad is not None
    assert torch.allclose(gh, h.grad, atol=1e-5)
    assert (gW is None) == (not head_trainable)
    if head_trainable:
        assert gW is not None and W.grad is not None
        assert torch.allclose(gW, W.grad, atol=1e-5)


@pytest.mark.parametrize("head_trainable", [False, True], ids=["frozen-head", "trainable-head"])
@pytest.mark.parametrize("reverse", [True, False], ids=["reverse", "forward"])
def test_fused_topk_kl_matches_reference_value_and_grad(reverse: bool, head_trainable: bool) -> None:
    torch.manual_seed(1)
    h, W = _leaf(29, 16), _leaf(300, 16).requires_grad_(head_trainable)
    ht, Wt, g = torch.randn(29, 16), torch.randn(300, 16), torch.rand(29)
    out = fused_topk_kl(h, W, ht, Wt, 17, reverse=reverse, chunk=7)
    (out * g).sum().backward()
    gh, gW = _grads(h, W)
    fn = losses.topk_reverse_kl if reverse else losses.topk_forward_kl
    ref = fn(h @ W.T, ht @ Wt.T, 17)
    (ref * g).sum().backward()
    assert torch.allclose(out, ref, atol=1e-5)
    assert gh is not None and h.grad is not None
    assert torch.allclose(gh, h.grad, atol=1e-4)
    if head_trainable:
        assert gW is not None and W.grad is not None
        assert torch.allclose(gW, W.grad, atol=1e-4)


def test_fused_topk_reverse_kl_against_brute_force() -> None:
    torch.manual_seed(2)
    h, W, ht, Wt = torch.randn(5, 8), torch.randn(40, 8), torch.randn(5, 8), torch.randn(40, 8)
    got = fused_topk_kl(h, W, ht, Wt, 6, reverse=True, chunk=2)
    zs, zt = (h @ W.T).tolist(), (ht @ Wt.T).tolist()
    for n in range(5):
        ps = [math.exp(z) for z in zs[n]]
        qs = [math.exp(z) for z in zt[n]]
        top = sorted(range(40), key=lambda v: -ps[v])[:6]
        want = sum(ps[v] / sum(ps) * math.log((ps[v] / sum(ps)) / (qs[v] / sum(qs))) for v in top)
        assert got[n].item() == pytest.approx(want, rel=1e-4, abs=1e-6)


def test_fused_topk_kl_with_k_equal_vocab_is_full_reverse_kl() -> None:
    torch.manual_seed(3)
    h, W, ht, Wt = torch.randn(4, 8), torch.randn(30, 8), torch.randn(4, 8), torch.randn(30, 8)
    got = fused_topk_kl(h, W, ht, Wt, 30)
    assert torch.allclose(got, losses.full_reverse_kl(h @ W.T, ht @ Wt.T), atol=1e-5)


def test_make_batch_and_micro_batches() -> None:
    b = make_batch([[1, 2, 3], [4]], [[5, 6], [7, 8, 9]], pad_id=0)
    assert b.input_ids.tolist() == [[1, 2, 3, 5, 6], [4, 7, 8, 9, 0]]
    assert b.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    # output at position t predicts token t+1: y_1 of row 0 is predicted at position 2 (the last prompt token)
    assert b.cols.tolist() == [2, 3, 0, 1, 2]
    assert b.unflatten(torch.arange(5.0)).tolist() == [[0, 1, 0], [2, 3, 4]]
    assert micro_batches([5, 1, 3, 2], 2) == [[1, 3], [2, 0]]


@pytest.fixture(scope="module")
def tiny(tiny_model_name: str):  # noqa: ANN201
    from shared.models import load_model

    return load_model(tiny_model_name)


def test_scorer_matches_sequence_logprobs_and_recorded_behaviour(tiny) -> None:  # noqa: ANN001
    """π_θ recomputed by the trainer (right-padded batch, fused head) equals what inference records as
    `response_logprobs_t1` (left-padded, KV-cached decode) up to float noise: on-policy IS ratios are 1."""
    from shared.decoding.generation import encode_prompt, generate, render_chat
    from shared.decoding.logprobs import sequence_logprobs
    from shared.decoding.params import SamplingConfig

    model, tok = tiny
    assert supports_fused_head(model)
    prompts = [encode_prompt(tok, render_chat(tok, [{"role": "user", "content": q}])) for q in ("hi", "a longer question?")]
    out = generate(model, tok, prompts, [SamplingConfig(max_new_tokens=7, temperature=1.0, seed=3 + i, n=2)
                                         for i in range(2)])
    pairs = [(prompts[p], s) for p in range(2) for s in out[p]]
    b = make_batch([p for p, _ in pairs], [s.token_ids for _, s in pairs], pad_id=tok.pad_token_id)
    lp = score(model, b, chunk=5)
    for i, (p, s) in enumerate(pairs):
        n = len(s.token_ids)
        ref = sequence_logprobs(model, p, s.token_ids)
        assert torch.allclose(lp[i, :n], ref, atol=1e-4)
        assert torch.allclose(lp[i, :n], torch.tensor(s.logprobs_t1), atol=1e-3)
    plain = Scorer(model, fused=False)
    assert torch.allclose(b.unflatten(plain(b)).detach(), lp, atol=1e-4)


def test_scorer_on_peft_lora_model(tiny) -> None:  # noqa: ANN001
    import copy

    from peft import LoraConfig, get_peft_model

    model, tok = tiny
    pm = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                         task_type="CAUSAL_LM"))
    b = make_batch([[1, 2, 3]], [[4, 5]], pad_id=0)
    s = Scorer(pm)
    assert s.fused
    lp = s(b)
    lp.sum().backward()
    grads = [p.grad for n, p in pm.named_parameters() if "lora_A" in n]
    assert grads and all(g is not None for g in grads)
    ref = torch.log_softmax(pm(input_ids=b.input_ids).logits[0, 2:4].float(), -1).gather(1, torch.tensor([[4], [5]]))[:, 0]
    assert torch.allclose(lp.detach(), ref.detach(), atol=1e-5)
