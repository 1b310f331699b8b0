"""Draft trees: chain (topk = 1) and the EAGLE-2 dynamic tree, with SGLang's meaning of the knobs.

  num_steps         draft forwards per round (tree depth)
  topk              candidates kept per expanded node, and nodes expanded per step
  num_draft_tokens  tokens the target verifies per round, the root (last emitted token) included

Step 0 takes the topk tokens of the draft's prediction at the root. Each later step runs the draft once on
the topk frontier nodes of highest cumulative log-prob, and adds their topk children as candidates. At the
end all candidates are reranked by cumulative log-prob and the best num_draft_tokens - 1 are kept (a child
never scores above its parent, so the kept set is a tree). Node 0 of the result is the root. SGLang multiplies
probabilities (the same order) and takes torch.topk at each choice; so do we, but the rerank keeps creation order
among equal scores, where SGLang's torch.topk may keep a child without its equal parent
(tests/infer/test_tree_sglang.py checks the trees against SGLang's algorithm).
One deliberate difference, for topk > 1: an expanded node's draft forward attends to the draft-cache slots of its
own ancestors, as EAGLE's topK_genrate does (it reorders its tree mask by the chosen parents). SGLang's
draft_forward keeps one cache row per top-k branch, so once step 2+ picks several children of one parent, the
other branches' nodes attend to tokens that are not their ancestors (sgl-project/sglang#8409 describes it and
measured a higher accept length fixed; closed unmerged). The same head can so reach a higher tree τ here than in
SGLang; chains (topk = 1) are the same in both.

Everything is tensors of fixed shapes, with no host sync (`grow`), so the whole draft loop can be captured as
one CUDA graph per batch size (graphs.py). B sequences, k = topk, M = k + (num_steps - 1) k^2 candidates,
E = (num_steps - 1) k expanded nodes (each gets a draft-cache slot: prefix + its expansion index).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from toolkit.infer.kv_cache import KVCache


@dataclass(frozen=True)
class TreeConfig:
    num_steps: int = 5
    topk: int = 1
    num_draft_tokens: int = 6

    def __post_init__(self):
        if self.num_steps < 1 or self.topk < 1:
            raise ValueError(f"--num-steps and --topk must be >= 1, got {self.num_steps}, {self.topk}")
        most = 1 + self.topk + (self.num_steps - 1) * self.topk * self.topk
        if not 2 <= self.num_draft_tokens <= most:
            raise ValueError(f"--num-draft-tokens {self.num_draft_tokens}: must be in 2..{most} for "
                             f"--num-steps {self.num_steps} --topk {self.topk}")
        if self.topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise ValueError(f"a chain (--topk 1) verifies num_steps + 1 = {self.num_steps + 1} tokens, "
                             f"got --num-draft-tokens {self.num_draft_tokens}")


@dataclass
class Tree:
    tokens: torch.Tensor   # int64 [n] target ids, node 0 = root
    parents: torch.Tensor  # int64 [n], parents[0] = -1, parents[i] < i
    depth: torch.Tensor    # int64 [n], depth[0] = 0
    draft_logp: torch.Tensor | None = None  # float [n - 1, N]: a sampled chain's law of node i + 1 (tree.grow)

    def ancestor_mask(self) -> torch.Tensor:
        """bool [n, n]: node i may attend to node j (j is i or one of its ancestors)."""
        return ancestor_masks(self.parents[None], int(self.depth.max()))[0]


def ancestor_masks(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """parents [B, n] (root -1) -> bool [B, n, n]: node i sees j when j is i or an ancestor of i."""
    B, n = parents.shape
    eye = torch.eye(n, dtype=torch.bool, device=parents.device).expand(B, n, n)
    up = parents.clamp(min=0)[:, :, None].expand(B, n, n)
    has_parent = (parents >= 0)[:, :, None]
    mask = eye
    for _ in range(max_depth):  # each pass inherits the parent's row: one more generation of ancestors
        mask = eye | (mask.gather(1, up) & has_parent)
    return mask


def window_mask(prefix: torch.Tensor, window: torch.Tensor, width: int) -> torch.Tensor:
    """Which of `width` cache slots each new token sees: slot j < prefix[b] (the sequence so far), or slot
    prefix[b] + e where window[b, t, e] is set. prefix [B], window bool [B, T, E] -> bool [B, T, width]."""
    E = window.shape[-1]
    rel = torch.arange(width, device=prefix.device) - prefix[:, None]                # [B, W]: slot - prefix
    inside = window.gather(2, rel.clamp(0, E - 1)[:, None].expand(-1, window.shape[1], -1)) & (rel < E)[:, None]
    return (rel < 0)[:, None] | inside


@torch.no_grad()
def grow(head, embed: torch.nn.Embedding, forward, prefix: torch.Tensor, roots: torch.Tensor, root_out: torch.Tensor,
         root_logp: torch.Tensor, cfg: TreeConfig, mask_len: int | None = None, gumbel: torch.Tensor | None = None,
         inv_temp: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """The trees after each root, as tensors: (tokens, parents, depth), each [B, num_draft_tokens].
    prefix/roots [B]; root_out [B, H]; root_logp [B, N]. forward(emb, hidden, positions, slots, mask,
    log_probs=True, pre=None) runs the head over the draft cache (log_probs False: logits, for a greedy chain;
    pre: the step's RoPE tables and attention bias, DraftHead.step_inputs, made by a chain for all steps), where
    sequence b holds positions 0..prefix[b]-1. mask_len: the width of the masks given to forward (CUDA graphs
    attend over the whole cache); default: what the slots reach.
    A sampled chain (topk 1): with gumbel [B, num_steps, N] and inv_temp [B], step i draws its token from
    softmax(logp * inv_temp) (Gumbel-max: argmax of logp * inv_temp + gumbel; a row of zero noise takes the
    top-1 as before), and the draft's log-probs of each step [B, num_steps, N] come back as a fourth output."""
    k, E = cfg.topk, (cfg.num_steps - 1) * cfg.topk
    W = mask_len if mask_len is not None else int(prefix.max()) + E  # the host sync graphs avoid
    if gumbel is not None and k != 1:
        raise ValueError(f"drafts are sampled in chains only (topk 1), got topk {k}")
    grower = grow_chain if k == 1 else grow_tree
    return grower(head, embed, forward, prefix, roots, root_out, root_logp, cfg, W, gumbel, inv_temp)


def chooser(k: int, gumbel: torch.Tensor | None, inv_temp: torch.Tensor | None):
    """choose(logp [B, *, N], step) -> (log-probs, draft ids) [B, *, k] of each node's children: the top-k, or
    in a sampled chain one Gumbel-max draw from softmax(logp * inv_temp)."""
    def choose(logp: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        if gumbel is None:
            return logp.topk(k)
        scale = inv_temp.view(len(logp), *[1] * (logp.dim() - 1))
        noise = gumbel[:, step].view(len(logp), *[1] * (logp.dim() - 2), -1)
        ids = (logp.float() * scale + noise).argmax(-1, keepdim=True)
        return logp.gather(-1, ids), ids

    return choose


def rows(x, r: slice):
    """The rows r of every tensor in a nested tuple (None stays None)."""
    return tuple(rows(t, r) for t in x) if isinstance(x, tuple) else None if x is None else x[r]


def grow_chain(head, embed, forward, prefix, roots, root_out, root_logp, cfg: TreeConfig, W: int, gumbel=None,
               inv_temp=None) -> tuple[torch.Tensor, ...]:
    """grow for topk 1: the tree is the chain itself (cumulative log-probs fall with depth, so the rerank keeps
    every node in order), and step s's node sits at depth s in slot = position = prefix + s - 1, seeing the
    slots up to its own. So a step is the head's forward, the choice and the embedding: no frontier, ancestor
    or rerank bookkeeping (~20 small kernels a step in grow_tree, each a launch gap in a CUDA graph), and a
    greedy chain takes the argmax of the logits (no log-softmax over the draft vocabulary), which with the d2t
    map and the embedding is one kernel on Triton (DraftHead.greedy_next)."""
    B, n, dev = len(prefix), cfg.num_steps + 1, root_logp.device
    # every step's inputs at once, step-major so that step s's B rows are one contiguous slice: slots, masks,
    # and what the head derives from them (RoPE tables, attention bias): made once a round, not once a step
    slots = (prefix[None, :] + torch.arange(cfg.num_steps - 1, device=dev)[:, None]).reshape(-1, 1)  # [(S-1)B, 1]
    masks = torch.arange(W, device=dev) <= slots[:, :, None]                       # [(steps - 1) B, 1, W]
    pre = head.step_inputs(slots, masks, embed.weight.dtype)
    choose = chooser(1, gumbel, inv_temp)
    fused = gumbel is not None and head.kernels == "triton"  # a sampled pick as one kernel, log-softmax included
    chain_logp = []  # a sampled chain's laws, handed to verification

    def pick(logp: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logp [B, N] (logits where no law is needed first) -> (target ids [B, 1], their embeddings [B, 1, H];
        None after the last step)."""
        embed_next = embed if step < cfg.num_steps - 1 else None  # the last token feeds no step
        if gumbel is None:  # greedy: argmax, d2t and embedding (one kernel on Triton)
            ids, emb = head.greedy_next(logp, embed_next)
        elif fused:  # log-softmax, Gumbel-max draw, d2t and embedding (one kernel)
            law, ids, emb = head.sampled_next(logp, gumbel[:, step], inv_temp, embed_next)
            chain_logp.append(law)
        else:
            chain_logp.append(logp)
            ids = head.to_target(choose(logp, step)[1][:, 0])
            emb = None if embed_next is None else embed(ids)
        return ids[:, None], None if emb is None else emb[:, None]

    ids, emb = pick(root_logp, 0)
    tok, hid = [roots[:, None], ids], root_out[:, None]
    for step in range(1, cfg.num_steps):
        r = slice((step - 1) * B, step * B)                                          # this step's rows
        logp, hid = forward(emb, hid, slots[r], slots[r], masks[r], pre=rows(pre, r),  # [B, 1, N], [B, 1, H]
                            log_probs=gumbel is not None and not fused)  # else logits: argmax / the pick's softmax
        ids, emb = pick(logp[:, 0], step)
        tok.append(ids)
    depth = torch.arange(n, device=dev).repeat(B, 1)                                 # [B, n], own memory
    out = (torch.cat(tok, 1), depth - 1, depth)
    return (*out, torch.stack([x.float() for x in chain_logp], 1)) if gumbel is not None else out


def grow_tree(head, embed, forward, prefix, roots, root_out, root_logp, cfg: TreeConfig, W: int, gumbel=None,
              inv_temp=None) -> tuple[torch.Tensor, ...]:
    """grow for any topk (grow_chain is the same for topk 1, in fewer kernels). Layer s of the tree (s >= 1) sits
    at depth s, and step s expands the top-k of layer s alone, so each step's positions, cache slots and
    expansion indices, the masks' prefix part and every node's depth are the round's, made once; a step gathers
    what its k chosen nodes inherit (their parent's output and expanded ancestors) and runs the head. In a CUDA
    graph each small kernel is a launch gap: kernels/aot.py counts them."""
    B, k, S, dev = len(prefix), cfg.topk, cfg.num_steps, root_logp.device
    E, H = (S - 1) * k, root_out.shape[-1]
    choose = chooser(k, gumbel, inv_temp)
    chain_logp = [root_logp]
    lp, ids = choose(root_logp, 0)                                                   # step 0: the root's children
    layer_score, layer_ids = lp, ids                                                 # the last layer's [B, k | k^2]
    scores, draft_ids, nodes = [lp], [ids], []
    if S > 1:  # the round's fixed parts, step-major so that step s's rows are one contiguous slice
        own = torch.eye(E, dtype=torch.bool, device=dev).view(S - 1, k, E)          # step s's own expansions
        steps = torch.arange(S - 1, device=dev)
        positions = (prefix[None, :] + steps[:, None])[:, :, None].expand(S - 1, B, k).contiguous()  # prefix + s - 1
        slots = prefix[None, :, None] + (steps[:, None] * k + torch.arange(k, device=dev))[:, None, :]  # [S-1, B, k]
        rel = torch.arange(W, device=dev) - prefix[:, None]                         # [B, W]: slot - prefix
        before = (rel < 0)[:, None]                                                  # [B, 1, W] the sequence so far
        in_window = ((rel >= 0) & (rel < E))[:, None]                                # slots of this round's expansions
        window = rel.clamp(0, E - 1)[:, None].expand(B, k, W)                        # ... and which expansion each is
        out = root_out[:, None].expand(B, k, H).contiguous()      # layer 1's parent output: the root's
    first = 1                                                                        # node id of the layer's first
    for step in range(1, S):
        if step == 1:  # as SGLang: all k of the root's children, as they come from the root's top-k (no top-k of
            # them again: with equal scores that could reorder them, and so the next layer's candidates)
            seen = own[0].expand(B, k, E)                                            # their own expansions only
            hid, chosen_ids, chosen_score = out, layer_ids, layer_score
            nodes.append(torch.arange(1, k + 1, device=dev).expand(B, k))
        else:  # the top-k of the last layer's k^2, in torch.topk's order (SGLang's fast_topk)
            pick = layer_score.topk(k).indices                                       # [B, k] within the layer
            src = pick // k                                                          # which parent: k children each
            seen = anc.gather(1, src[:, :, None].expand(B, k, E)) | own[step - 1]   # [B, k, E]
            hid = out.gather(1, src[:, :, None].expand(B, k, H))
            chosen_ids, chosen_score = layer_ids.gather(1, pick), layer_score.gather(1, pick)
            nodes.append(pick + first)
        mask = before | (seen.gather(2, window) & in_window)                         # [B, k, W]
        logp, out = forward(embed(head.to_target(chosen_ids)), hid, positions[step - 1],
                            slots[step - 1], mask)                                   # [B, k, N], [B, k, H]
        lp, ids = choose(logp, step)                                                 # [B, k, k]
        if gumbel is not None:  # a sampled chain hands its laws to verification
            chain_logp.append(logp[:, 0])
        layer_score = (chosen_score[:, :, None] + lp).flatten(1)                     # cumulative, [B, k^2]
        layer_ids, anc = ids.flatten(1), seen
        scores.append(layer_score)
        draft_ids.append(layer_ids)
        first += k if step == 1 else k * k
    M = k + (S - 1) * k * k
    tok = torch.cat([roots[:, None], head.to_target(torch.cat(draft_ids, 1))], 1)   # [B, 1 + M]
    score = torch.cat(scores, 1)                                                     # [B, M], the root's left out
    parent = torch.zeros(B, 1 + M, dtype=torch.long, device=dev)                     # layer 1's: the root
    parent[:, 0].fill_(-1)
    if nodes:  # layer s + 1's k^2 nodes are the children of step s's k picks, k each
        parent[:, 1 + k:].view(B, S - 1, k, k).copy_(torch.stack(nodes, 1)[..., None].expand(B, S - 1, k, k))
    depth = torch.ones(1 + M, dtype=torch.long, device=dev)
    depth[:1].zero_()
    if S > 1:  # layer s at depth s
        depth[1 + k:].view(S - 1, k * k).copy_(torch.arange(2, S + 1, device=dev)[:, None].expand(S - 1, k * k))
    depth = depth.expand(B, 1 + M)
    # rerank by (-score, depth), creation order breaking ties: the nodes are made in order of depth, so one
    # stable sort by score keeps depth and creation order among equals
    order = (-score).sort(stable=True, dim=1).indices + 1
    keep = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=dev),
                      order[:, :cfg.num_draft_tokens - 1].sort(1).values], 1)        # [B, n], creation order
    new_id = torch.full_like(tok, -1).scatter_(1, keep, torch.arange(keep.shape[1], device=dev).expand_as(keep))
    parents = new_id.gather(1, parent.gather(1, keep).clamp(min=0))
    parents[:, 0].fill_(-1)
    if gumbel is not None:  # a chain keeps every node in creation order: step i's log-probs drew node i + 1
        return tok.gather(1, keep), parents, depth.gather(1, keep), torch.stack([x.float() for x in chain_logp], 1)
    return tok.gather(1, keep), parents, depth.gather(1, keep)


def draft_trees(head, embed: torch.nn.Embedding, cache: KVCache, prefixes: list[int], roots: list[int],
                root_out: torch.Tensor, root_logp: torch.Tensor, cfg: TreeConfig, forward=None, gumbel=None,
                inv_temp=None) -> list[Tree]:
    """Grow one tree per sequence after its root (the last emitted token), all sequences in lockstep.
    root_out [B, H], root_logp [B, N]. Sequence b's draft cache holds positions 0..prefixes[b]-1 (the
    root's own pair is the last); its expanded nodes go to slots prefixes[b], prefixes[b] + 1, ...
    forward(emb, hidden, positions, slots, mask, **kw): the head over `cache` (default: the head); kw are the
    head's log_probs and pre.
    gumbel/inv_temp: a sampled chain (grow); each Tree then carries its draft_logp."""
    if forward is None:
        def forward(emb, hidden, positions, slots, mask, **kw):
            return head(emb, hidden, positions, cache, slots=slots, mask=mask, **kw)

    dev = root_logp.device
    grown = grow(head, embed, forward, torch.tensor(prefixes, device=dev), torch.tensor(roots, device=dev),
                 root_out, root_logp, cfg, gumbel=gumbel, inv_temp=inv_temp)
    return [Tree(*parts) for parts in zip(*grown)]
