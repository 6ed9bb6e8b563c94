"""Model + SeqBatch --> per-token log-probs and top-k KL terms, without materialising (N, V) logits.

The LM head is the dominant cost of RL and distillation steps on small models (vocabulary 49,152 vs
hidden 576 for SmolLM2): the usual path keeps logits, log-softmax and their gradients as (N, V) tensors.
Here the decoder body runs once, the hidden states of the N completion-predicting positions are
gathered, and the head + softmax run in token chunks inside custom autograd functions that save only
(N,) statistics and recompute each chunk's logits in backward (the "fused linear cross-entropy" trick).
Values and gradients equal the plain computation (tested against it and against brute force).

Models whose logits are not `lm_head(final hidden)` (soft-capping, logit scaling) are detected once
and scored through the ordinary forward instead.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from services.trainer import losses
from services.trainer.batching import SeqBatch

DEFAULT_CHUNK = 1024


# --- fused ops ---------------------------------------------------------------------------------------


class _Logits:
    """h_chunk @ Wᵀ as float32 (n, V), written into one reused buffer when plain fp32 matmuls run (CPU):
    a fresh 10+ MB allocation per chunk costs page faults that can exceed the arithmetic."""

    def __init__(self, h: torch.Tensor, W: torch.Tensor, chunk: int) -> None:
        self.W = W
        plain = (h.dtype == W.dtype == torch.float32 and not torch.is_autocast_enabled(h.device.type))
        self.buf = torch.empty((min(chunk, h.shape[0]), W.shape[0]), dtype=torch.float32, device=h.device) if plain else None

    def __call__(self, hc: torch.Tensor) -> torch.Tensor:
        if self.buf is None:
            return (hc @ self.W.T).float()
        out = self.buf[:hc.shape[0]]
        torch.mm(hc, self.W.T, out=out)
        return out


def _softmax_(z: torch.Tensor) -> torch.Tensor:
    """In place: logits (n, V) float32 --> probabilities; returns logsumexp (n,)."""
    m = z.amax(-1, keepdim=True)
    z.sub_(m).exp_()
    total = z.sum(-1, keepdim=True)
    z.div_(total)
    return (m + total.log()).squeeze(1)


class _LinearLogProb(torch.autograd.Function):
    """log softmax(h Wᵀ)[y] per row, chunked over rows.

    ∂ out_i / ∂ h_i = W_{y_i} − Σ_v p_iv W_v. With a frozen head (LoRA: the LM head is not adapted) that
    (N, H) Jacobian is computed in the forward pass while p is at hand, and backward is one multiply: no
    second pass over the vocabulary. With a trainable head (full fine-tuning) the forward saves h and the
    logsumexp, and backward recomputes each chunk's logits to form ∂/∂W as well.
    """

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, W: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
        N = h.shape[0]
        out = torch.empty(N, dtype=torch.float32, device=h.device)
        lse = torch.empty(N, dtype=torch.float32, device=h.device)
        frozen = not W.requires_grad
        jac: Any = torch.empty(h.shape, dtype=torch.float32, device=h.device) if frozen else None
        logits = _Logits(h.detach(), W.detach(), chunk)
        for s in range(0, N, chunk):
            e = s + chunk
            z = logits(h[s:e].detach())                                                          # (n, V)
            target = z.gather(1, targets[s:e, None]).squeeze(1)
            if frozen:
                lse[s:e] = _softmax_(z)                                                          # z is now p
                jac[s:e] = W[targets[s:e]].float() - (z.to(W.dtype) @ W).float()                # (n, H)
            else:
                lse[s:e] = torch.logsumexp(z, dim=-1)
            out[s:e] = target - lse[s:e]
        if frozen:
            ctx.save_for_backward(jac)
        else:
            ctx.save_for_backward(h, W, targets, lse)
        ctx.frozen, ctx.chunk, ctx.h_dtype = frozen, chunk, h.dtype
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        g = g.float()
        if ctx.frozen:
            (jac,) = ctx.saved_tensors
            return (jac * g[:, None]).to(ctx.h_dtype), None, None, None
        h, W, targets, lse = ctx.saved_tensors
        need_h, need_W = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        gh: Any = torch.empty_like(h) if need_h else None
        gW: Any = torch.zeros(W.shape, dtype=torch.float32, device=W.device) if need_W else None
        logits = _Logits(h, W, ctx.chunk)
        for s in range(0, h.shape[0], ctx.chunk):
            e = s + ctx.chunk
            hc, gc = h[s:e], g[s:e]
            # d out_i / d z_ij = 1[j = y_i] − p_ij
            dz = logits(hc).sub_(lse[s:e, None]).exp_()                                          # (n, V) = p
            dz.mul_(-gc[:, None]).scatter_add_(1, targets[s:e, None], gc[:, None])
            dz = dz.to(h.dtype)
            if need_h:
                gh[s:e] = dz @ W
            if need_W:
                gW.addmm_(dz.T.float(), hc.float())
        return gh, (gW.to(W.dtype) if need_W else None), None, None


class _LinearTopKKL(torch.autograd.Function):
    """Top-k KL between student softmax(h Wᵀ) and teacher softmax(h_T W_Tᵀ) per row (see losses.py).

    reverse=True:  D = Σ_{v∈topk(p)} p_v (log p_v − log q_v);  ∂D/∂z_j = p_j (a_j − S), a_v = log p_v −
                   log q_v + 1 on the top-k (0 elsewhere), S = Σ_K p_v a_v.
    reverse=False: D = Σ_{v∈topk(q)} q_v (log q_v − log p_v);  ∂D/∂z_j = p_j Q − q_j 1[j∈K], Q = Σ_K q_v.
    Both are ∂D/∂z = p ⊙ α + scatter(K, β), so ∂D/∂h = α (p W) + Σ_K β_v W_v: with a frozen head it is
    formed in the forward pass; with a trainable head backward recomputes p chunk by chunk.
    """

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, W: torch.Tensor, ht: torch.Tensor, Wt: torch.Tensor, k: int,
                reverse: bool, chunk: int) -> torch.Tensor:
        N, V = h.shape[0], W.shape[0]
        k = min(k, V)
        frozen = not W.requires_grad
        out = torch.empty(N, dtype=torch.float32, device=h.device)
        if frozen:
            jac = torch.empty(h.shape, dtype=torch.float32, device=h.device)
        else:
            lse = torch.empty(N, dtype=torch.float32, device=h.device)
            alpha = torch.empty(N, dtype=torch.float32, device=h.device)
            beta = torch.empty(N, k, dtype=torch.float32, device=h.device)
            idx = torch.empty(N, k, dtype=torch.long, device=h.device)
        with torch.no_grad():
            s_logits, t_logits = _Logits(h, W, chunk), _Logits(ht, Wt, chunk)
            for s in range(0, N, chunk):
                e = s + chunk
                zs = s_logits(h[s:e])                                                            # (n, V)
                zt = t_logits(ht[s:e])                                                           # (n, V)
                top = (zs if reverse else zt).topk(k, dim=-1).indices                            # (n, k)
                zs_k, zt_k = zs.gather(1, top), zt.gather(1, top)
                lse_t = torch.logsumexp(zt, -1)
                lse_s = _softmax_(zs) if frozen else torch.logsumexp(zs, -1)                    # frozen: zs is now p
                ls, lt = zs_k - lse_s[:, None], zt_k - lse_t[:, None]                            # (n, k)
                if reverse:
                    pk = ls.exp()
                    out[s:e] = (pk * (ls - lt)).sum(-1)
                    b = pk * (ls - lt + 1)
                    a = -b.sum(-1)
                else:
                    qk = lt.exp()
                    out[s:e] = (qk * (lt - ls)).sum(-1)
                    a, b = qk.sum(-1), -qk
                if frozen:
                    pW = (zs.to(W.dtype) @ W).float()                                            # (n, H)
                    bW = torch.bmm(b[:, None, :].to(W.dtype), W[top]).squeeze(1).float()         # (n, H)
                    jac[s:e] = a[:, None] * pW + bW
                else:
                    lse[s:e], alpha[s:e], beta[s:e], idx[s:e] = lse_s, a, b, top
        if frozen:
            ctx.save_for_backward(jac)
        else:
            ctx.save_for_backward(h, W, lse, alpha, beta, idx)
        ctx.frozen, ctx.chunk, ctx.h_dtype = frozen, chunk, h.dtype
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        g = g.float()
        if ctx.frozen:
            (jac,) = ctx.saved_tensors
            return (jac * g[:, None]).to(ctx.h_dtype), None, None, None, None, None, None
        h, W, lse, alpha, beta, idx = ctx.saved_tensors
        need_h, need_W = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        gh: Any = torch.empty_like(h) if need_h else None
        gW: Any = torch.zeros(W.shape, dtype=torch.float32, device=W.device) if need_W else None
        logits = _Logits(h, W, ctx.chunk)
        for s in range(0, h.shape[0], ctx.chunk):
            e = s + ctx.chunk
            hc, gc = h[s:e], g[s:e]
            dz = logits(hc).sub_(lse[s:e, None]).exp_()                                          # (n, V) = p
            dz.mul_((alpha[s:e] * gc)[:, None]).scatter_add_(1, idx[s:e], beta[s:e] * gc[:, None])
            dz = dz.to(h.dtype)
            if need_h:
                gh[s:e] = dz @ W
            if need_W:
                gW.addmm_(dz.T.float(), hc.float())
        return gh, (gW.to(W.dtype) if need_W else None), None, None, None, None, None


def fused_token_logprobs(h: torch.Tensor, W: torch.Tensor, targets: torch.Tensor,
                         chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """log softmax(h Wᵀ)[targets]: (N, H), (V, H), (N,) -> (N,) float32."""
    return _LinearLogProb.apply(h, W, targets, chunk)


def fused_topk_kl(h: torch.Tensor, W: torch.Tensor, ht: torch.Tensor, Wt: torch.Tensor, k: int, *,
                  reverse: bool = True, chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Top-k reverse (student's top-k) or forward (teacher's top-k) KL per row: -> (N,) float32."""
    return _LinearTopKKL.apply(h, W, ht.detach(), Wt.detach(), k, reverse, chunk)


# --- model plumbing ----------------------------------------------------------------------------------


def _unwrap(model: Any) -> Any:
    """PeftModel / DDP --> the underlying *ForCausalLM (LoRA layers stay injected in it)."""
    while True:
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def lm_parts(model: Any) -> tuple[Any, Any]:
    """(decoder body returning hidden states, LM head) of a causal LM."""
    lm = _unwrap(model)
    body = lm.get_decoder() if hasattr(lm, "get_decoder") else getattr(lm, lm.base_model_prefix)
    head = lm.get_output_embeddings()
    if body is None or head is None:
        raise TypeError(f"{type(lm).__name__} exposes no decoder/output embeddings")
    return body, head


def supports_fused_head(model: nn.Module) -> bool:
    """True when the model's logits are exactly `lm_head(decoder(x))` with a bias-free linear head
    (checked numerically on a short input, once per model; the answer is cached on the model)."""
    cached = getattr(model, "_trainer_fused_head", None)
    if cached is not None:
        return bool(cached)
    ok = _check_fused_head(model)
    object.__setattr__(model, "_trainer_fused_head", ok)
    return ok


@torch.no_grad()
def _check_fused_head(model: Any) -> bool:
    try:
        body, head = lm_parts(model)
    except (TypeError, AttributeError):
        return False
    if not isinstance(head, nn.Linear) or head.bias is not None:
        return False
    device = head.weight.device
    x = torch.arange(3, 11, device=device)[None] % head.weight.shape[0]
    ref = model(input_ids=x).logits.float()
    mine = head(body(input_ids=x).last_hidden_state).float()
    return bool(torch.allclose(ref, mine, atol=1e-4, rtol=1e-3))


class Scorer(nn.Module):
    """Wraps a causal LM (plain, peft or DDP-wrapped): the trainer's only way to score tokens.

    `forward` is the whole differentiable computation, so `DistributedDataParallel(Scorer(model))`
    synchronises gradients unchanged under torchrun.
    """

    def __init__(self, model: nn.Module, chunk: int = DEFAULT_CHUNK, fused: bool | None = None) -> None:
        super().__init__()
        self.model = model
        self.chunk = chunk
        self.fused = supports_fused_head(model) if fused is None else fused

    def hidden(self, batch: SeqBatch) -> torch.Tensor:
        """(N, H) final hidden states at the positions that predict completion tokens."""
        body, _ = lm_parts(self.model)
        hs = body(input_ids=batch.input_ids, use_cache=False).last_hidden_state                 # (B, L, H)
        return hs[batch.rows, batch.cols]

    def head_weight(self) -> torch.Tensor:
        return lm_parts(self.model)[1].weight

    def _logits(self, batch: SeqBatch) -> torch.Tensor:
        return self.model(input_ids=batch.input_ids, use_cache=False).logits[batch.rows, batch.cols].float()

    def forward(self, batch: SeqBatch, teacher: tuple[torch.Tensor, torch.Tensor] | None = None, k: int = 256,
                reverse: bool = True) -> torch.Tensor:
        """Without `teacher`: log π(y_t) for the N completion tokens, (N,).
        With `teacher` = (teacher hidden (N, H) or logits (N, V), teacher head weight or None): the
        top-k KL per token, (N,)."""
        if teacher is None:
            if self.fused:
                return fused_token_logprobs(self.hidden(batch), self.head_weight(), batch.completion_ids[
                    batch.rows, batch.tpos], self.chunk)
            logits = self._logits(batch)
            return torch.log_softmax(logits, -1).gather(1, batch.completion_ids[batch.rows, batch.tpos, None])[:, 0]
        t_repr, t_weight = teacher
        if self.fused and t_weight is not None:
            return fused_topk_kl(self.hidden(batch), self.head_weight(), t_repr, t_weight, k, reverse=reverse,
                                 chunk=self.chunk)
        t_logits = t_repr if t_weight is None else (t_repr @ t_weight.T).float()
        fn = losses.topk_reverse_kl if reverse else losses.topk_forward_kl
        return fn(self._logits(batch), t_logits, k)


@torch.no_grad()
def teacher_view(teacher: Any, batch: SeqBatch, fused: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The frozen teacher's representation of the completion positions: (hidden (N, H), head weight)
    when its head can be fused, else (logits (N, V), None)."""
    if fused:
        body, head = lm_parts(teacher)
        hs = body(input_ids=batch.input_ids, use_cache=False).last_hidden_state
        return hs[batch.rows, batch.cols], head.weight
    return teacher(input_ids=batch.input_ids, use_cache=False).logits[batch.rows, batch.cols].float(), None


@torch.no_grad()
def score(model: nn.Module, batch: SeqBatch, chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """log π(y_t) without gradients, as (B, T) (0 on padding): for π_old, π_ref and evaluation."""
    s = Scorer(model, chunk)
    return batch.unflatten(s(batch))
