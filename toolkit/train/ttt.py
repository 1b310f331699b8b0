"""Training-time test (TTT): a draft head (EAGLE-3, EAGLE, MTP) unrolled for K steps over a whole sequence.

At step i the query at position t attends to the causal prefix of step-0 keys (k_0[0..t]) plus its own
diagonal keys from steps 1..i (k_1[t], ..., k_i[t]): what the head sees at inference after i draft steps.
Computed blockwise over query rows; where the L x L scores of a call would be large (long rows, big heads)
each block is recomputed in the backward pass, so no such matrix is held, in the forward or for the backward
(memory O(block x L)); the diagonal terms join the same softmax through a shared running max. Shapes: B batch, H query heads, Hkv
key/value heads, L positions, D head dim.
"""
from __future__ import annotations

import math

import torch


RECOMPUTE_BYTES = 1 << 30  # a call whose L x L fp32 scores (over all heads) pass this recomputes its blocks


def ttt_attention(q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor], block: int = 128,
                  valid: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
                  recompute: bool | None = None) -> torch.Tensor:
    """q [B, H, L, D]; ks/vs: step 0..i keys/values [B, Hkv, L, D]; valid bool [B, L] marks real (not padded)
    key positions of step 0; sinks [H] (an MTP block of a GPT-OSS target): a logit per head that joins every
    softmax with no value. Returns [B, H, L, D]. recompute: under autograd, each block is recomputed in the
    backward pass (activation checkpointing), so what is kept for it is its inputs, not its [rows, L] scores,
    which are L x L per head and step kept whole (~36 GB over 7 steps at L = 4096 for an 8B head). None: when
    those scores would pass RECOMPUTE_BYTES; below that, keeping them is faster (no second forward)."""
    B, H, L, D = q.shape
    groups = H // ks[0].shape[1]
    ks = [k.repeat_interleave(groups, 1) if groups > 1 else k for k in ks]
    vs = [v.repeat_interleave(groups, 1) if groups > 1 else v for v in vs]
    scale = 1.0 / math.sqrt(D)
    # diagonal scores of steps 1..i: [B, H, L, i]
    diag = torch.stack([(q * k).sum(-1) for k in ks[1:]], -1) * scale if len(ks) > 1 else None
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, *ks, *vs))
    if recompute is None:
        recompute = B * H * L * L * 4 > RECOMPUTE_BYTES
    chunks = []
    for r0 in range(0, L, block):
        r1 = min(r0 + block, L)
        args = (q[:, :, r0:r1], ks[0][:, :, :r1], vs[0][:, :, :r1],
                None if diag is None else diag[:, :, r0:r1], [v[:, :, r0:r1] for v in vs[1:]],
                None if valid is None else valid[:, :r1], sinks, r0, scale)
        if grad and recompute:
            from torch.utils.checkpoint import checkpoint

            chunks.append(checkpoint(_block, *args, use_reentrant=False))
        else:
            chunks.append(_block(*args))
    return torch.cat(chunks, 2)


def _block(q, k0, v0, diag, vds: list, valid, sinks, r0: int, scale: float) -> torch.Tensor:
    """Query rows r0..r0+rows-1: q [B, H, rows, D] over the causal step-0 prefix k0/v0 [B, H, r1, D] and the
    rows' own diagonal scores diag [B, H, rows, i] with values vds (each [B, H, rows, D]) -> [B, H, rows, D]."""
    B, H, rows, _ = q.shape
    r1 = k0.shape[2]
    s = (q @ k0.transpose(-1, -2)).float() * scale                                     # [B, H, rows, r1]
    causal = torch.arange(r1, device=q.device)[None, :] <= torch.arange(r0, r1, device=q.device)[:, None]
    allowed = causal[None, None] if valid is None else causal[None, None] & valid[:, None, None, :]
    s = s.masked_fill(~allowed, float("-inf"))
    parts = [s] if diag is None else [s, diag.float()]
    sink = None if sinks is None else sinks.float().view(1, H, 1, 1).expand(B, H, rows, 1)
    m = torch.cat([p.amax(-1, keepdim=True) for p in parts + ([sink] if sink is not None else [])], -1)
    m = m.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p0 = (s - m).exp()                                                                 # [B, H, rows, r1]
    total = p0.sum(-1, keepdim=True) + (0 if sink is None else (sink - m).exp())
    pd = None if diag is None else (diag.float() - m).exp()                           # [B, H, rows, i]
    if pd is not None:
        total = total + pd.sum(-1, keepdim=True)
    total = total.clamp_min(1e-30)  # normalized in fp32 before the sums over values: unnormalized, L rows
    acc = (p0 / total).to(v0.dtype) @ v0  # of |v| ~ 40 overflowed fp16 at L = 2048
    for j, v in enumerate(vds):
        acc = acc + (pd[..., j:j + 1] / total).to(v.dtype) * v
    return acc.to(q.dtype)


def _rope(x: torch.Tensor, positions: torch.Tensor, head) -> torch.Tensor:
    """x [B, h, L, D] rotated at positions [L] (HF half-split layout) with the head's tables and yarn / longrope
    attention factor, as the engine's step_inputs does."""
    from toolkit.infer.attention import rope_cos_sin, rotate

    return rotate(x, *rope_cos_sin(positions[None], head.inv_freq, x.dtype, head.config.rope_attention_factor()))


def _attend(attn, x: torch.Tensor, pos: torch.Tensor, head, ks: list, vs: list, block: int, valid):
    """One attention of TTT step len(ks): project x [B, L, *], rotate at `pos`, append this step's key/value
    to ks/vs and attend to the causal step-0 prefix plus the diagonal keys of steps 1..i. -> [B, L, H]."""
    B, L, _ = x.shape
    c = attn.c
    q = attn.q_proj(x).view(B, L, c.num_heads, c.head_dim)
    k = attn.k_proj(x).view(B, L, c.num_kv_heads, c.head_dim)
    v = attn.v_proj(x).view(B, L, c.num_kv_heads, c.head_dim).transpose(1, 2)
    if c.qk_norm:  # an MTP block of a Qwen3 target
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = _rope(q.transpose(1, 2), pos, head), _rope(k.transpose(1, 2), pos, head)
    ks.append(k)
    vs.append(v)
    a = ttt_attention(q, ks, vs, block=block, valid=valid, sinks=getattr(attn, "sinks", None))  # [B, Hq, L, D]
    return attn.o_proj(a.transpose(1, 2).reshape(B, L, c.num_heads * c.head_dim))


def unroll(head, embed: torch.nn.Embedding, hidden: torch.Tensor, input_ids: torch.Tensor, steps: int,
           valid: torch.Tensor | None = None, block: int = 128) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Run a draft head (toolkit/infer/draft_head.py) for `steps` TTT steps over whole sequences; returns
    each step's draft logits [B, L, N] and output hidden states [B, L, H]. Step i at row t predicts token
    t + i + 2 from (token t + i + 1, hidden): step 0's hidden is the target's feature at t (EAGLE-3: three
    aux layers; EAGLE/MTP: the final normed state), step i's is the head's own step i-1 output at row t. The
    query and key of step i at row t sit at position t + i, where the engine puts a draft node of depth i
    after prefix t (train == serve). hidden [B, L, *], input_ids [B, L] (positions beyond L read token 0
    and are masked by the loss)."""
    B, L = input_ids.shape
    rows = torch.arange(L, device=input_ids.device)
    padded = torch.cat([input_ids, input_ids.new_zeros(B, steps + 1)], 1)
    first, *rest = head.layers()
    ks, vs = [[] for _ in range(1 + len(rest))], [[] for _ in range(1 + len(rest))]
    h, logits, outs = hidden, [], []
    for i in range(steps):
        emb = embed(padded[:, i + 1:i + 1 + L])                                   # token t + i + 1
        if i == 0 and head.blank_position0:  # MTP: the pair at position 0 has a zero embedding (as served)
            emb = emb.masked_fill((rows == 0)[None, :, None], 0)
        res, x = head.fuse(emb, h)                                                # the head's input rule
        h = res + _attend(first.self_attn, x, rows + i, head, ks[0], vs[0], block, valid)
        h = h + first.mlp(first.post_attention_layernorm(h))
        for j, lyr in enumerate(rest, 1):
            h = h + _attend(lyr.self_attn, lyr.input_layernorm(h), rows + i, head, ks[j], vs[j], block,
                            valid)
            h = h + lyr.mlp(lyr.post_attention_layernorm(h))
        h = head.finish(h)
        logits.append(head.readout(h))
        outs.append(h)
    return logits, outs
