"""Prompt lookup (n-gram) drafts, alone or grafted onto the head's tree: a branch that costs no draft forward.

A model that copies from its prompt or repeats itself (MT-bench's turn 2 rewrites turn 1; SmolLM2's greedy
answers loop) is predicted well by its own text: find the last n tokens earlier in the sequence and propose
what followed them there (prompt lookup decoding, Saxena 2023; transformers' `prompt_lookup_num_tokens`,
SGLang's and vLLM's n-gram speculation). Arctic Inference pairs such a suffix draft with a trained head; here
the lookup continuation is merged into the head's tree as one more branch (a trie: shared prefixes are one
node), so the target verifies both in the same forward and the longer accepted path wins.

Every node of the merged tree is a deterministic proposal, so greedy verification stays exact and the
recursive rejection of verify.sample_verify stays lossless; the branch only adds candidates.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from toolkit.infer.tree import Tree


@dataclass(frozen=True)
class LookupConfig:
    num_tokens: int = 10  # most tokens the branch proposes per round
    max_ngram: int = 3    # the longest suffix looked up; shorter ones are tried when it is not found
    min_ngram: int = 1

    def __post_init__(self):
        if self.num_tokens < 1:
            raise ValueError(f"--lookup {self.num_tokens}: the branch needs at least 1 token (0 turns lookup off)")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"lookup n-gram sizes must satisfy 1 <= min ({self.min_ngram}) <= max "
                             f"({self.max_ngram})")


def add_args(p: argparse.ArgumentParser, alone: str = "") -> None:
    """`--lookup N` and `--lookup-max-ngram M` (bench and serve); `alone`: what the flag does without a head."""
    p.add_argument("--lookup", type=int, default=0, metavar="N",
                   help="also propose up to N tokens by prompt lookup each round, merged into the head's tree as one "
                        f"more branch and verified in the same forward (0 = off){alone}")
    p.add_argument("--lookup-max-ngram", "--speculative-ngram-max-match-window-size", type=int, default=None,
                   metavar="M",
                   help="the longest suffix the lookup matches (then shorter ones, down to --lookup-min-ngram; "
                        "default 3, 12 on an SGLang NGRAM line as SGLang's)")
    p.add_argument("--lookup-min-ngram", "--speculative-ngram-min-match-window-size", type=int, default=1, metavar="M",
                   help="the shortest suffix the lookup matches (vLLM's prompt_lookup_min; SGLang's name for both "
                        "is the match window size)")


def from_args(args: argparse.Namespace) -> LookupConfig | None:
    """The LookupConfig the flags ask for, or None; refuses a negative length and --sample-draft with it."""
    if args.lookup < 0:
        raise ValueError(f"--lookup {args.lookup}: give the lookup branch's length, or 0 for none")
    if args.lookup and args.sample_draft:
        raise ValueError("--sample-draft and --lookup do not mix: a sampled chain's draft law does not cover the "
                         "lookup branch; drop one of them")
    top = 3 if args.lookup_max_ngram is None else args.lookup_max_ngram
    return LookupConfig(args.lookup, top, args.lookup_min_ngram) if args.lookup else None


def propose(context: list[int], cfg: LookupConfig) -> list[int]:
    """The continuation after the most recent earlier occurrence of the context's last n tokens, for the
    longest n in max_ngram..min_ngram that occurs; at most cfg.num_tokens tokens, [] when nothing matches.
    An occurrence may overlap the suffix itself (a run "a a a" proposes "a ...")."""
    size = len(context)
    arr = np.asarray(context, dtype=np.int64)
    for n in range(min(cfg.max_ngram, size - 1), cfg.min_ngram - 1, -1):
        windows = sliding_window_view(arr[:size - 1], n)       # [size - n, n]: every start with a token after it
        hits = np.flatnonzero((windows == arr[size - n:]).all(1))
        if hits.size:
            start = int(hits[-1]) + n
            return arr[start:start + cfg.num_tokens].tolist()
    return []


def graft_all(trees: list[Tree], chains: list[list[int]]) -> list[Tree]:
    """Each sequence's tree with its branch grafted on, all padded to the largest merged tree: the part of a
    branch that agrees with the head's own drafts adds no node, and a CPU verify step pays per node."""
    merged = [_merge(t, c) for t, c in zip(trees, chains)]
    width = max(len(m[0]) for m in merged)
    return [_padded(m, width, t.tokens.device) for m, t in zip(merged, trees)]


def graft(tree: Tree, chain: list[int], width: int | None = None) -> Tree:
    """The tree with `chain` (tokens proposed after the root) merged in as a branch from the root, sharing
    the nodes it agrees with, then padded to `width` nodes (None: no padding). New nodes follow the tree's
    own (node i's parent stays < i); padding nodes have no parent (-1) and so sit on no path: verification
    never reaches them and no real node attends to them."""
    merged = _merge(tree, chain)
    if width is not None and len(merged[0]) > width:
        raise ValueError(f"tree of {len(tree.tokens)} nodes + a {len(chain)}-token branch does not fit {width}")
    return _padded(merged, len(merged[0]) if width is None else width, tree.tokens.device)


def _merge(tree: Tree, chain: list[int]) -> tuple[list[int], list[int], list[int]]:
    """graft's trie merge, unpadded: the merged tree's tokens, parents and depths as lists."""
    if tree.draft_logp is not None:
        raise ValueError("a sampled chain's draft law does not cover a lookup branch: lookup needs top-1 drafts")
    tokens, parents, depth = tree.tokens.tolist(), tree.parents.tolist(), tree.depth.tolist()
    child = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens)) if p >= 0}
    node = 0
    for tok in chain:
        nxt = child.get((node, tok))
        if nxt is None:
            nxt = len(tokens)
            tokens.append(tok)
            parents.append(node)
            depth.append(depth[node] + 1)
            child[(node, tok)] = nxt
        node = nxt
    return tokens, parents, depth


def _padded(merged: tuple[list[int], list[int], list[int]], width: int, dev) -> Tree:
    tokens, parents, depth = merged
    pad = width - len(tokens)
    return Tree(torch.tensor(tokens + [0] * pad, device=dev), torch.tensor(parents + [-1] * pad, device=dev),
                torch.tensor(depth + [0] * pad, device=dev))
