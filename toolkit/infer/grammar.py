"""Structured output: a grammar (JSON, a JSON schema, a regex, an EBNF grammar) that every generated token must
keep the text inside, enforced by masking the target's logits (xgrammar, the backend vLLM and SGLang use).

A grammar's state after a token depends on the tokens before it, so in a verify step each tree node is masked
with the state its own path reaches: a depth-first walk accepts each node's token into the matcher, fills the
node's mask, visits its children and rolls back. A draft token its parent's mask refuses is not walked into: it
gets -inf there, so verification never accepts it (its own row is left open: no one samples from it). Greedy
output is then plain constrained decoding's token for token, and sampling keeps its law. The mask comes first,
before the penalties and temperature (vLLM's order: min-p then measures against the likeliest allowed token).
"""
from __future__ import annotations

import json
import re

import torch

KINDS = ("json", "json_schema", "regex", "choice", "grammar")
SOURCE_LINE = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")  # xgrammar's "[22:32:28] /project/cpp/x.cc:94: " prefix
# string formats xgrammar 0.2 enforces (checked one by one); others it would silently let through
FORMATS = {"email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri",
           "uri-reference", "uri-template", "json-pointer", "relative-json-pointer"}


def allowed_ids(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """xgrammar's packed bitmask [n, words] (bit j of word w: token 32 w + j) -> bool [n, vocab]."""
    bits = (bitmask[:, :, None] >> torch.arange(32, dtype=bitmask.dtype, device=bitmask.device)) & 1
    return bits.bool().reshape(bitmask.shape[0], -1)[:, :vocab]


NOTES = {"title", "description", "default", "examples", "$comment", "$schema", "$id", "deprecated", "readOnly",
         "writeOnly"}  # keywords that say, not constrain
MAPS = ("properties", "patternProperties", "$defs", "definitions")  # {name: subschema}
ONES = ("items", "additionalProperties", "propertyNames", "additionalItems")  # a subschema (items: or a list)
LISTS = ("prefixItems", "anyOf", "oneOf")  # [subschema, ...]
IGNORED = ("allOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
           "unevaluatedProperties", "unevaluatedItems")  # compiled by xgrammar 0.2 without a word, not enforced
TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "null": (type(None),),
         "object": (dict,), "array": (list,)}


def normalized(schema):
    """The schema with pydantic's one-element allOf (a nested model's field: {"allOf": [{"$ref": ...}], "description":
    ...}) merged into its parent, which xgrammar would otherwise not enforce at all; everything else as given."""
    if isinstance(schema, list):
        return [normalized(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (normalized(v) if k not in ("enum", "const", "default", "examples") else v) for k, v in schema.items()}
    if isinstance(out.get("allOf"), list) and len(out["allOf"]) == 1 and isinstance(out["allOf"][0], dict):
        only = out.pop("allOf")[0]
        if set(only) & (set(out) - NOTES):  # both sides constrain one keyword: left for unenforced to refuse
            out["allOf"] = [only]
        else:
            out = {**out, **only}
    return out


def _subschemas(schema: dict, path: str):
    """(subschema, its path) for every place in `schema` that holds a schema (not enum / const values, nor the names
    of properties, which may well be "format" or "pattern")."""
    for key in MAPS:
        if isinstance(schema.get(key), dict):
            yield from ((sub, f"{path}.{key}.{name}") for name, sub in schema[key].items())
    for key in ONES:
        value = schema.get(key)
        if isinstance(value, dict):
            yield value, f"{path}.{key}"
        elif isinstance(value, list):
            yield from ((sub, f"{path}.{key}[{i}]") for i, sub in enumerate(value))
    for key in LISTS:
        if isinstance(schema.get(key), list):
            yield from ((sub, f"{path}.{key}[{i}]") for i, sub in enumerate(schema[key]))


def _typed(value, types) -> bool:
    return any(isinstance(value, TYPES.get(t, ())) and not (isinstance(value, bool) and t in ("integer", "number"))
               for t in types)


def unenforced(schema, path: str = "schema") -> str | None:
    """The first keyword of a (normalized) JSON schema that xgrammar would compile but not enforce (so a reply could
    break the schema unnoticed), named with its path; None when there is none. vLLM refuses some of these kinds;
    the rest it passes on, and its replies may break them."""
    if not isinstance(schema, dict):
        return None
    if schema.get("uniqueItems") or any(k in schema for k in ("contains", "minContains", "maxContains")):
        return f"{path}: uniqueItems / contains"
    if ignored := next((k for k in IGNORED if k in schema), None):
        return f"{path}: {ignored}"
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    if isinstance(schema.get("format"), str) and (not types or "string" in types):  # elsewhere an annotation
        if schema["format"] not in FORMATS:
            return f"{path}: format {schema['format']!r} (enforced: {', '.join(sorted(FORMATS))})"
        if any(k in schema for k in ("pattern", "minLength", "maxLength")):
            return f"{path}: format together with pattern / minLength / maxLength"
    if "pattern" in schema and ("minLength" in schema or "maxLength" in schema):
        return f"{path}: pattern together with minLength / maxLength"
    missing = [n for n in schema.get("required") or [] if n not in (schema.get("properties") or {})]
    if missing:
        return f"{path}: required {missing[0]!r}, which properties does not define"
    if any(k in schema for k in ("anyOf", "oneOf")) and (beside := sorted(set(schema) - NOTES - {
            "anyOf", "oneOf", "$defs", "definitions"})):
        return f"{path}: {beside[0]} beside anyOf / oneOf (move it into each branch)"
    values = schema["enum"] if isinstance(schema.get("enum"), list) else [schema["const"]] if "const" in schema else []
    if types and (wrong := [v for v in values if not _typed(v, types)]):
        return f"{path}: enum / const value {wrong[0]!r}, which type {'/'.join(types)} does not allow"
    return next((found for sub, where in _subschemas(schema, path) if (found := unenforced(sub, where))), None)


class GrammarMask:
    """One sequence's grammar state (an xgrammar GrammarMatcher over a compiled grammar)."""

    def __init__(self, compiled, stop_ids: frozenset, vocab: int, after: int | None = None, active: bool = True):
        """after: a token that opens the constrained part (a reasoning model's `</think>`): until the sequence
        has it (active False) the text is free, so the model thinks first and answers in the grammar (vLLM's
        structured output beside a reasoning parser)."""
        import xgrammar as xgr

        # the model's end-of-turn ids: allowed once the grammar is complete, and only then (a request's own
        # stop_token_ids are not among them: text the grammar needs must stay writable, as in vLLM)
        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=sorted(stop_ids) or None)
        self.vocab, self.after, self.active = vocab, after, active or after is None
        self.from_start = self.active  # the text is constrained from its first token (no thinking first)
        self.words = xgr.get_bitmask_shape(1, vocab)[1]

    def add(self, token: int) -> None:
        """Take in a generated token (the engine only emits tokens the mask allowed)."""
        if not self.active:
            self.active = token == self.after
            return
        if not self.matcher.is_terminated() and not self.matcher.accept_token(token):
            raise RuntimeError(f"token {token} breaks the sequence's grammar: the mask and the engine disagree")

    @property
    def complete(self) -> bool:
        """The text is a whole sentence of the grammar and took its stop token (or can take no more)."""
        return self.matcher.is_terminated()

    def bitmask(self, tokens: list[int] | None = None, parents: list[int] | None = None) -> torch.Tensor:
        """Packed int32 [n, words]: what each node of a tree (tokens, parents: -1 for the root, node 0) may be
        followed by; without a tree, [1, words] for the next token."""
        n = 1 if tokens is None else len(tokens)
        bitmask = torch.full((n, self.words), -1, dtype=torch.int32)  # all allowed: a node the walk never reaches
        children: list[list[int]] = [[] for _ in range(n)]
        for node in range(1, n):
            if parents[node] >= 0:  # -1 past the root: a padding node
                children[parents[node]].append(node)
        # (node, leaving, the grammar constrains its parent's row): accept on entry (the root is already in), roll
        # back on leaving; a path still before `after` accepts nothing (its rows stay open)
        stack = [(0, False, None)]
        while stack:
            node, leaving, constrained = stack.pop()
            if leaving:
                self.matcher.rollback(1)
                continue
            active = self.active if node == 0 else constrained or tokens[node] == self.after
            if node and constrained:
                token, row = tokens[node], bitmask[parents[node]]
                if not (token < self.vocab and int(row[token // 32]) >> (token % 32) & 1):
                    continue  # its parent refuses it: -inf there, so never accepted
                if not self.matcher.accept_token(token):
                    raise RuntimeError(f"grammar refused token {token} its own mask allowed")
                stack.append((node, True, None))
            if active and self.matcher.is_terminated():  # a stop token: the sequence ends here, rows stay open
                continue
            if active:
                self.matcher.fill_next_token_bitmask(bitmask, node)
            stack += [(child, False, active) for child in reversed(children[node])]
        return bitmask

    def masks(self, tokens: list[int] | None = None, parents: list[int] | None = None) -> torch.Tensor:
        """bool [n, V]: `bitmask` unpacked (for tests and readers; apply uses the packed form)."""
        return allowed_ids(self.bitmask(tokens, parents), self.vocab)

    def apply(self, logits: torch.Tensor, tokens: torch.Tensor | None = None,
              parents: torch.Tensor | None = None) -> torch.Tensor:
        """logits [n, V] at a tree's nodes (or the one next position) -> float32 logits, -inf where refused."""
        import xgrammar as xgr

        bitmask = self.bitmask(None if tokens is None else tokens.tolist(),
                               None if parents is None else parents.tolist())
        logits = logits.to(torch.float32, copy=True)  # the batch's logits stay raw (log-probs are read from them)
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=self.vocab)
        return logits


class Grammars:
    """Compiles request constraints for one tokenizer (xgrammar caches compiled grammars by their text):
    json (OpenAI's json_object: a JSON object), json_schema (a schema: dict or JSON text), regex, choice (one of
    a list of strings, matched exactly), grammar (EBNF, as xgrammar and vLLM read it)."""

    def __init__(self, tokenizer, vocab: int):
        import xgrammar as xgr

        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
        self.compiler = xgr.GrammarCompiler(self.info)
        self.vocab = vocab

    def compile(self, kind: str, spec=None, any_whitespace: bool = True):
        """A compiled grammar, or ValueError naming what is wrong with `spec`. any_whitespace False: JSON without
        free whitespace between its tokens (vLLM's disable_any_whitespace; small models may pad with it forever)."""
        if kind == "json":  # vLLM's reading of json_object: an object, not any JSON value
            kind, spec = "json_schema", {"type": "object"}
        if kind == "json_schema":
            try:
                schema = json.loads(spec) if isinstance(spec, str) else spec
            except ValueError as e:
                raise ValueError(f"not JSON: {e}") from None
            schema = normalized(schema)
            problem = unenforced(schema)
            if problem:
                raise ValueError(f"{problem} is not supported (the grammar would not enforce it)")
        if kind == "choice" and not (isinstance(spec, list) and spec and all(isinstance(c, str) and c for c in spec)):
            raise ValueError("give a non-empty list of non-empty strings")
        if kind not in KINDS:
            raise ValueError(f"unknown constraint {kind!r}; accepted: {', '.join(KINDS)}")
        try:
            if kind == "json_schema":
                return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=any_whitespace)
            if kind == "regex":
                return self.compiler.compile_regex(spec)
            if kind == "choice":
                return self.compiler.compile_regex("|".join(f"({re.escape(c)})" for c in spec))
            return self.compiler.compile_grammar(spec)
        except Exception as e:  # xgrammar raises RuntimeError (and its own types) for a bad schema / regex / grammar
            first = (str(e).splitlines() or [type(e).__name__])[0]
            raise ValueError(SOURCE_LINE.sub("", first)) from None

    def mask(self, kind: str, spec, stop_ids: frozenset, any_whitespace: bool = True) -> GrammarMask:
        return GrammarMask(self.compile(kind, spec, any_whitespace), stop_ids, self.vocab)


def after_thinking(tokenizer, prompt: list[int]) -> tuple[int | None, bool]:
    """(the `</think>` token a reasoning model's constrained answer starts after, whether the prompt has already
    closed its think block: Qwen3 with enable_thinking false ends it with an empty one); (None, True) where
    `</think>` is no single token (then the grammar holds from the first token)."""
    start, end = (tokenizer.convert_tokens_to_ids(t) for t in ("<think>", "</think>"))
    if end is None or end == tokenizer.unk_token_id or tokenizer.convert_ids_to_tokens(end) != "</think>":
        return None, True
    last = {t: max((i for i, x in enumerate(prompt) if x == t), default=-1) for t in (start, end)}
    # closed by the generation prompt itself: only whitespace after it (an earlier turn's block that a template
    # keeps, Qwen3's in a tool loop, is followed by that turn's answer and the next headers)
    return end, last[end] > last[start] and not tokenizer.decode(prompt[last[end] + 1:]).strip()
