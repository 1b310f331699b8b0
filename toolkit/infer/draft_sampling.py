"""Sampled chain drafts: the draft draws each token from its own tempered distribution q instead of proposing
its top-1, and the target verifies with speculative sampling (verify.sample_chain_verify: accept x with
probability min(1, p(x) / q(x))). That accepts sum_x min(p, q) of the time against p(top-1 of q) for top-1
proposals: more when the head is calibrated and the target's distribution is spread, as in sampled text.

The draw is the Gumbel-max trick inside tree.grow (argmax of log q + Gumbel noise), so the draft loop stays
free of random ops and host syncs and can be replayed from a CUDA graph; the noise comes from each
sequence's own generator, here.
"""
from __future__ import annotations

import torch


def gumbel_inputs(params: list, generators: list, num_steps: int, draft_vocab: int, device) -> dict:
    """tree.grow's sampled-chain inputs for B sequences with these SamplingParams and generators: gumbel
    [B, num_steps, N] and inv_temp [B]. A greedy sequence gets no noise and 1 / T = 1: its draft is the top-1."""
    noise = torch.zeros(len(params), num_steps, draft_vocab, device=device)
    for b, (p, g) in enumerate(zip(params, generators)):
        if not p.greedy:
            # float64 uniforms: float32 ones (24 bits) cap the noise at -log(-log(1 - 2**-24)) = 16.6, and over
            # a 49k-row vocabulary the true maximum passes that in ~0.3% of draws, so the draw would not be
            # exactly softmax(logp / T), the law verification divides by; float64's cap is 36.7
            u = torch.rand(noise.shape[1:], generator=g, device=device, dtype=torch.float64)
            noise[b] = -torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))
    inv_temp = torch.tensor([1.0 if p.greedy else 1.0 / p.temperature for p in params], device=device)
    return {"gumbel": noise, "inv_temp": inv_temp}


def chain_draft_probs(draft_logp: torch.Tensor, temperature: float, target_ids: torch.Tensor,
                      vocab_size: int) -> torch.Tensor:
    """The law each node of a sampled chain was drawn from, over the target's vocabulary: draft_logp
    [n, N] (tree.grow's fourth output), target_ids [N] (the target id of each draft id) -> [n, vocab_size]."""
    q = (draft_logp.float() / temperature).softmax(-1)
    # index_add_: were two draft ids to map to one target id (load_eagle3 refuses such a d2t), the law of that
    # target id is the sum of both masses; index_copy_ kept one and verification divided by the wrong q
    return q.new_zeros(len(q), vocab_size).index_add_(1, target_ids, q)
