"""Structured output: a grammar (JSON, a JSON schema, a regex, an EBNF grammar) that every generated token must
keep the text inside, enforced by masking the target's logits (xgrammar, the backend vLLM and SGLang use).

A grammar's state after a token depends on the tokens before it, so in a verify step each tree node is masked
with the state its own path reaches: a depth-first walk accepts each node's token into the matcher, fills the
node's mask, visits its children and rolls back. A draft token the grammar refuses at its parent gets -inf
there, so verification never accepts it (its own mask is left open: no one samples from it). Greedy output is
then plain constrained decoding's token for token, and sampling keeps its law. The mask comes first, before the
penalties and temperature (vLLM's order: min-p then measures against the likeliest allowed token).
"""
from __future__ import annotations

import re

import torch


def allowed_ids(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """xgrammar's packed bitmask [n, words] (bit j of word w: token 32 w + j) -> bool [n, vocab]."""
    bits = (bitmask[:, :, None] >> torch.arange(32, dtype=bitmask.dtype, device=bitmask.device)) & 1
    return bits.bool().reshape(bitmask.shape[0], -1)[:, :vocab]


class GrammarMask:
    """One sequence's grammar state (an xgrammar GrammarMatcher over a compiled grammar)."""

    def __init__(self, compiled, stop_ids: frozenset, vocab: int):
        import xgrammar as xgr

        # the stop ids are the ones this sequence stops at: allowed once the grammar is complete, and only then
        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=sorted(stop_ids) or None)
        self.vocab = vocab
        self.words = xgr.get_bitmask_shape(1, vocab)[1]

    def add(self, token: int) -> None:
        """Take in a generated token (the engine only emits tokens the mask allowed)."""
        if not self.matcher.is_terminated() and not self.matcher.accept_token(token):
            raise RuntimeError(f"token {token} breaks the sequence's grammar: the mask and the engine disagree")

    @property
    def complete(self) -> bool:
        """The text is a whole sentence of the grammar and took its stop token (or can take no more)."""
        return self.matcher.is_terminated()

    def masks(self, tokens: list[int] | None = None, parents: list[int] | None = None) -> torch.Tensor:
        """bool [n, V]: what each node of a tree (tokens, parents: -1 for the root, node 0) may be followed by;
        without a tree, [1, V] for the next token."""
        n = 1 if tokens is None else len(tokens)
        bitmask = torch.full((n, self.words), -1, dtype=torch.int32)  # all allowed: a node the walk never reaches
        children: list[list[int]] = [[] for _ in range(n)]
        for node in range(1, n):
            children[parents[node]].append(node)
        stack = [(0, False)]  # (node, leaving): accept on entry (the root is already in), roll back on leaving
        while stack:
            node, leaving = stack.pop()
            if leaving:
                self.matcher.rollback(1)
                continue
            if node and not self.matcher.accept_token(tokens[node]):
                continue  # refused at its parent: masked there, so never accepted
            if node:
                stack.append((node, True))
            if not self.matcher.is_terminated():  # after a stop token the row stays open: the sequence ends there
                self.matcher.fill_next_token_bitmask(bitmask, node)
            stack += [(child, False) for child in reversed(children[node])]
        return allowed_ids(bitmask, self.vocab)

    def apply(self, logits: torch.Tensor, tokens: torch.Tensor | None = None,
              parents: torch.Tensor | None = None) -> torch.Tensor:
        """logits [n, V] at a tree's nodes (or the one next position) -> float32 logits, -inf where refused."""
        allowed = self.masks(None if tokens is None else tokens.tolist(),
                             None if parents is None else parents.tolist())
        return logits.float().masked_fill(~allowed.to(logits.device), float("-inf"))


KINDS = ("json", "json_schema", "regex", "choice", "grammar")
SOURCE_LINE = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")  # xgrammar's "[22:32:28] /project/cpp/x.cc:94: " prefix


class Grammars:
    """Compiles request constraints for one tokenizer (xgrammar caches compiled grammars by their text):
    json (any JSON value, OpenAI's json_object), json_schema (a schema: dict or JSON text), regex, choice (one of
    a list of strings, matched exactly), grammar (EBNF, as xgrammar and vLLM read it)."""

    def __init__(self, tokenizer, vocab: int):
        import xgrammar as xgr

        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
        self.compiler = xgr.GrammarCompiler(self.info)
        self.vocab = vocab

    def compile(self, kind: str, spec=None, any_whitespace: bool = True):
        """A compiled grammar, or ValueError naming what is wrong with `spec`. any_whitespace False: JSON without
        free whitespace between its tokens (vLLM's disable_any_whitespace; small models may pad with it forever)."""
        import json

        try:
            if kind == "json":
                if any_whitespace:
                    return self.compiler.compile_builtin_json_grammar()
                spec, kind = {"type": "object"}, "json_schema"  # OpenAI's json_object: an object
            if kind == "json_schema":
                return self.compiler.compile_json_schema(spec if isinstance(spec, str) else json.dumps(spec),
                                                         any_whitespace=any_whitespace)
            if kind == "regex":
                return self.compiler.compile_regex(spec)
            if kind == "choice":
                if not spec or not all(isinstance(c, str) and c for c in spec):
                    raise ValueError("give a non-empty list of non-empty strings")
                return self.compiler.compile_regex("|".join(f"({re.escape(c)})" for c in spec))
            if kind == "grammar":
                return self.compiler.compile_grammar(spec)
        except ValueError:
            raise
        except Exception as e:  # xgrammar raises RuntimeError (and its own types) for a bad schema / regex / grammar
            first = (str(e).splitlines() or [type(e).__name__])[0]
            raise ValueError(f"{kind}: {SOURCE_LINE.sub('', first)}") from None
        raise ValueError(f"unknown constraint {kind!r}; accepted: {', '.join(KINDS)}")

    def mask(self, kind: str, spec, stop_ids: frozenset, any_whitespace: bool = True) -> GrammarMask:
        return GrammarMask(self.compile(kind, spec, any_whitespace), stop_ids, self.vocab)
