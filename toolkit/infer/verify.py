"""Verification of a draft tree against the target, as plain tensor functions.

A tree of one sequence has N + 1 nodes: node 0 is the root (the last token already accepted), nodes 1..N are
draft tokens; `parents[i]` is the node that token i follows (parents[0] = -1). `probs[i]` is the target's
distribution for the token after node i (one verify forward gives all N + 1 at once). A chain is the tree
with parents = [-1, 0, 1, 2, ...].

Both functions walk from the root: at each node they either accept one child, or stop and emit a token of
their own (the "bonus" token), so a verify step always yields accepted + 1 tokens.
  * greedy: accept the child whose token is the target argmax (output == plain greedy decoding);
  * sampling: recursive rejection with the draft treated as choosing its candidates deterministically (EAGLE
    top-k trees): try the children in order, accept child c with probability r(c) where r is the current
    residual distribution (at first the target's), else remove c from r and renormalize; when no child is
    accepted, sample the bonus token from r. The emitted token is distributed exactly as r, i.e. as the
    target's distribution (SpecInfer; SGLang's tree_speculative_sampling_target_only does the same).
  * sampling a chain the draft sampled (`sample_chain_verify`): speculative sampling (Leviathan et al. 2023,
    Chen et al. 2023): token x, drawn from the draft's q, is accepted with probability min(1, p(x) / q(x)),
    else the bonus token is drawn from max(p - q, 0) renormalized. Also exactly the target's distribution;
    it accepts sum_x min(p, q) of the time, against p(top-1 of q) above, which is more where the draft is
    calibrated and the target's distribution is spread (sampled text).
"""
from __future__ import annotations

import torch

from toolkit.infer.draft_sampling import chain_draft_probs
from toolkit.infer.sampling import SamplingParams, target_probs
from toolkit.infer.tree import Tree


def _children(parents: list[int]) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in parents]
    for node, parent in enumerate(parents):
        if parent >= 0:
            kids[parent].append(node)
    return kids


def greedy_verify(tokens: torch.Tensor, parents: torch.Tensor, logits: torch.Tensor):
    """tokens/parents [N+1], logits [N+1, V] -> (accepted node path incl. root, emitted tokens)."""
    target = logits.argmax(-1).tolist()
    toks, kids = tokens.tolist(), _children(parents.tolist())
    path, out, node = [0], [], 0
    while True:
        nxt = next((c for c in kids[node] if toks[c] == target[node]), None)
        out.append(target[node])
        if nxt is None:
            return path, out
        path.append(nxt)
        node = nxt


def sample_verify(tokens: torch.Tensor, parents: torch.Tensor, probs: torch.Tensor,
                  generator: torch.Generator | None = None):
    """tokens/parents [N+1], probs [N+1, V] (target_probs of each node) -> (path, emitted tokens).
    Children are tried in their node order (the draft's ranking)."""
    toks, kids = tokens.tolist(), _children(parents.tolist())
    path, out, node = [0], [], 0
    while True:
        residual = probs[node].double().clone()
        accepted = None
        for c in kids[node]:
            t = toks[c]
            total = residual.sum()
            if total <= 0:
                break
            if torch.rand((), generator=generator, dtype=torch.float64, device=probs.device) * total < residual[t]:
                accepted = c
                break
            residual[t] = 0.0  # rejected: the token can no longer be emitted at this node
        if accepted is None:
            if residual.sum() <= 0:  # every possible token was a rejected candidate: cannot happen with
                residual = probs[node].double()  # exact arithmetic; fall back to the target itself
            out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
            return path, out
        out.append(toks[accepted])
        path.append(accepted)
        node = accepted


def sample_chain_verify(tokens: torch.Tensor, probs: torch.Tensor, draft_probs: torch.Tensor,
                        generator: torch.Generator | None = None):
    """A chain whose tokens the draft sampled: tokens [N+1] (node 0 the root), probs [N+1, V] the target's
    distribution after each node, draft_probs [N, V] the distribution token i + 1 was drawn from (over the
    target's vocabulary) -> (path, emitted tokens), as sample_verify returns them."""
    toks = tokens.tolist()
    out = []
    for i in range(len(toks) - 1):
        p, q, x = probs[i].double(), draft_probs[i].double(), toks[i + 1]
        # accept with probability min(1, p(x) / q(x)), i.e. when u * q(x) < p(x) (q(x) > 0: x was drawn from q)
        if torch.rand((), generator=generator, dtype=torch.float64, device=probs.device) * q[x] < p[x]:
            out.append(x)
            continue
        residual = (p - q).clamp_min(0.0)
        if residual.sum() <= 0:  # p == q up to rounding, and x still rejected: cannot happen exactly
            residual = p
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return list(range(i + 1)), out
    out.append(int(torch.multinomial(probs[-1].double(), 1, generator=generator)))  # all accepted: the bonus
    return list(range(len(toks))), out


def verify_tree(tree: Tree, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
                draft_ids: torch.Tensor | None) -> tuple[list[int], list[int]]:
    """One sequence's Tree against the target's logits [N + 1, V] at its nodes, by its sampling params:
    greedy, a chain the draft sampled (tree.draft_logp set; draft_ids [N_draft] the target id of each draft
    id), or top-k proposals. Returns (accepted path of node indices, emitted tokens)."""
    if params.greedy:
        return greedy_verify(tree.tokens, tree.parents, logits)
    probs = target_probs(logits, params)
    if tree.draft_logp is not None:
        draft = chain_draft_probs(tree.draft_logp, params.temperature, draft_ids, logits.shape[-1])
        return sample_chain_verify(tree.tokens, probs, draft, generator)
    return sample_verify(tree.tokens, tree.parents, probs, generator)


def stop_at_empty(path: list[int], out: list[int], empty: list[bool]) -> tuple[list[int], list[int], bool]:
    """A request's constraints (a grammar with allowed_token_ids, bad_words or min_tokens) can leave a node no
    token at all: its row is -inf everywhere (empty [N+1], per node). Nothing can follow such a node, so the
    sequence ends there: the emitted tokens stop at that node's own token (chosen at its parent's row, which
    allowed it) and the kept path before it. -> (path, tokens, True when an empty node was reached)."""
    dead = next((i for i, node in enumerate(path) if empty[node]), None)
    if dead is None:
        return path, out, False
    return path[:max(dead, 1)], out[:dead], True  # the root's KV stays: it is a generated token either way

