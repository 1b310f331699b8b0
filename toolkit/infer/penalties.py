"""Logit bias and repetition, frequency and presence penalties (OpenAI's and vLLM's), applied to a verify step
node by node.

A penalty makes the target's distribution after a token depend on the tokens generated before it. In a draft tree
those are the sequence's output so far plus the draft tokens on the path from the root to that node, so each
node's logits are penalized with that node's own counts (vLLM's rejection sampler adds the draft tokens to the
output the same way). Verification then compares the draft with exactly the distribution plain decoding samples
from at that position, and stays lossless. Applied to the raw logits, before temperature, min-p, top-k and top-p,
in vLLM's order:
  logit bias: a fixed offset per token id (OpenAI's `logit_bias`, the same at every node);
  repetition r: a token seen in the prompt or the output has its logit divided by r when positive and multiplied
      by r when not (CTRL's rule, as transformers and vLLM apply it);
  frequency f, presence p: logit - f * (its count in the output) - p * (1 if in the output) (OpenAI's rule);
  min_tokens m: the sequence's stop ids (EOS and the request's own) get -inf while fewer than m tokens come before
      (vLLM's rule; transformers' min_new_tokens): at a node of depth d, the output so far + d;
  allowed_token_ids (vLLM's): every other id gets -inf;
  bad_words (vLLM's): a banned token-id sequence's last token gets -inf where the output (at a node: with the
      node's path) ends with the rest of it; a one-token word is never generated.
"""
from __future__ import annotations

import torch

from toolkit.infer.sampling import SamplingParams


class Penalties:
    """One sequence's logit bias and token counts: which ids its prompt holds, how often each was generated."""

    def __init__(self, params: SamplingParams, prompt: list[int], vocab: int, device: torch.device,
                 stop_ids=frozenset()):
        self.params, self.generated = params, 0
        self.stop_ids = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)    # [S]
        self.in_prompt = torch.zeros(vocab, dtype=torch.bool, device=device)                # [V]
        self.in_prompt[torch.tensor(prompt, device=device)] = True
        self.counts = torch.zeros(vocab, dtype=torch.float32, device=device)               # [V]
        self.allowed = None
        if params.allowed_token_ids:
            self.allowed = torch.zeros(vocab, dtype=torch.bool, device=device)
            self.allowed[torch.tensor(params.allowed_token_ids, device=device)] = True
        self.recent: list[int] = []  # the output's last tokens, as many as the longest bad word needs
        self.keep = max((len(w) for w in params.bad_words), default=1) - 1
        self.single = [w[0] for w in params.bad_words if len(w) == 1]   # banned everywhere
        self.longer = [w for w in params.bad_words if len(w) > 1]       # banned where the context ends in w[:-1]
        self.bias = None
        if params.logit_bias:
            ids, values = zip(*params.logit_bias)  # ids inside the vocabulary: Engine.check refused others
            self.bias = torch.zeros(vocab, dtype=torch.float32, device=device)
            self.bias[torch.tensor(ids, device=device)] = torch.tensor(values, dtype=torch.float32, device=device)

    def add(self, token: int) -> None:
        self.counts[token] += 1
        self.generated += 1
        if self.keep:
            self.recent = (self.recent + [token])[-self.keep:]

    def banned(self, n: int, tokens: torch.Tensor | None, ancestors: torch.Tensor | None) -> list[list[int]]:
        """Per node, the ids bad_words forbid after it: its context is the output so far, then its path's draft
        tokens (node 0, the root, is the output's last token already)."""
        single, longer = self.single, self.longer
        if not longer:
            return [single] * n
        paths = [[]] if n == 1 or tokens is None else [  # ancestors [n, n]: node indices grow with depth
            [int(tokens[j]) for j in row.nonzero()[:, 0].tolist() if j] for row in ancestors.cpu()]
        out = []
        for path in paths:
            context = self.recent + path
            out.append(single + [w[-1] for w in longer if len(context) >= len(w) - 1 and
                                 context[len(context) - len(w) + 1:] == list(w[:-1])])
        return out

    def apply(self, logits: torch.Tensor, tokens: torch.Tensor | None = None,
              ancestors: torch.Tensor | None = None) -> torch.Tensor:
        """logits [n, V] at a tree's nodes -> penalized float32 logits [n, V]. tokens [n] are the nodes' ids and
        ancestors [n, n] (bool: j is i or an ancestor of i) their paths; node 0 is the root, already counted.
        Without a tree (n = 1, the token after the prompt or after the output so far) the counts alone."""
        p, n = self.params, logits.shape[0]
        counts = self.counts.expand(n, -1)                                                  # [n, V]
        if tokens is not None and n > 1:  # each node's path from the root, the root itself not again
            on_path = ancestors[:, 1:].to(device=logits.device, dtype=counts.dtype)                 # [n, n - 1]
            ids = tokens[1:].to(logits.device).expand(n, -1)                                        # [n, n - 1]
            counts = counts.clone().scatter_add_(1, ids, on_path)  # no host sync (nonzero would wait for the GPU)
        logits = logits.float()
        if self.allowed is not None:
            logits = logits.masked_fill(~self.allowed, float("-inf"))
        if p.bad_words:
            rows = [(i, t) for i, ids in enumerate(self.banned(n, tokens, ancestors)) for t in ids]
            if rows:
                rows = torch.tensor(rows, device=logits.device)
                logits = logits.index_put((rows[:, 0], rows[:, 1]), torch.tensor(float("-inf"), device=logits.device))
        if self.bias is not None:
            logits = logits + self.bias
        if p.repetition_penalty != 1.0:
            seen = (counts > 0) | self.in_prompt
            r = p.repetition_penalty
            logits = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
        if p.frequency_penalty:
            logits = logits - p.frequency_penalty * counts
        if p.presence_penalty:
            logits = logits - p.presence_penalty * (counts > 0).float()
        if self.generated < p.min_tokens and len(self.stop_ids):
            depth = ancestors.sum(-1).to(logits.device) - 1 if tokens is not None and n > 1 else 0      # [n]
            early = torch.as_tensor(self.generated + depth < p.min_tokens, device=logits.device).reshape(-1, 1)
            stops = logits[:, self.stop_ids]                                                         # [n, S]
            logits = logits.index_copy(1, self.stop_ids, stops.masked_fill(early, float("-inf")))
        return logits
