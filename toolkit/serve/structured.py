"""A request's structured-output constraint, by any of the names clients send it under: OpenAI's
`response_format` (json_object, json_schema), vLLM's `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar` and newer `structured_outputs` {json, regex, choice, grammar, json_object,
disable_any_whitespace}, SGLang's `json_schema` / `regex` / `ebnf`, or a chat request's `tool_choice` required / named
(toolkit/serve/tools.py). At most one per request. The engine enforces it (toolkit/infer/grammar.py).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from toolkit.serve.api_error import ApiError

EXTRAS = (("guided_json", "json_schema"), ("guided_regex", "regex"), ("guided_choice", "choice"),
          ("guided_grammar", "grammar"), ("json_schema", "json_schema"), ("regex", "regex"), ("ebnf", "grammar"))
STRUCTURED_OUTPUTS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar",
                      "json_object": "json"}


@dataclass(frozen=True)
class Constraint:
    field: str                  # the request field it came in (errors name it)
    kind: str                   # grammar.KINDS
    spec: object                # the schema, regex, choices or grammar text (None for any JSON)
    any_whitespace: bool = True  # False: compact JSON (vLLM's disable_any_whitespace)


def constraint(body) -> Constraint | None:
    found: list[Constraint] = []
    options = dict(body.structured_outputs or {})
    compact = options.pop("disable_any_whitespace", False)  # vLLM applies it to every JSON constraint
    fmt = body.response_format or {}
    kind = fmt.get("type", "text")
    if kind == "json_object":
        found.append(Constraint("response_format", "json", None, not compact))
    elif kind == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise ApiError(400, "response_format json_schema needs json_schema.schema, a JSON schema object",
                           "response_format")
        found.append(Constraint("response_format", "json_schema", schema, not compact))
    elif kind != "text":
        raise ApiError(400, f"response_format {kind!r} is not supported; accepted: text, json_object, json_schema",
                       "response_format")
    found += [Constraint(name, kind, getattr(body, name), not compact) for name, kind in EXTRAS
              if getattr(body, name) is not None]
    for key, value in options.items():
        kind = STRUCTURED_OUTPUTS.get(key)
        if kind is None and value:  # vLLM's other options (backend, whitespace pattern) at their off values pass
            raise ApiError(400, f"structured_outputs.{key} is not supported; accepted: "
                                f"{', '.join(STRUCTURED_OUTPUTS)}, disable_any_whitespace", f"structured_outputs.{key}")
        if (kind == "json" and value is True) or (kind not in (None, "json") and value is not None):
            found.append(Constraint(f"structured_outputs.{key}", kind, value, not compact))
    if len(found) > 1:
        raise ApiError(400, f"give one structured-output constraint, not {', '.join(c.field for c in found)}",
                       found[1].field)
    return found[0] if found else None


class Compiler:
    """A request's constraint compiled, or None; the tokenizer's grammar compiler is made at the first request that
    needs one (~0.1-1 s). Compiles run off the event loop: a long regex or the first compiler takes up to a second,
    which would stall every stream."""

    def __init__(self, tok, vocab: int):
        self.tok, self.vocab, self.grammars = tok, vocab, None

    async def __call__(self, body):
        found = constraint(body)
        tool = getattr(body, "tool", None)
        held = tool.constraint(body.tools) if tool is not None else None
        if held is not None:  # tool_choice required or named: the reply is the calls' JSON
            if found is not None:
                raise ApiError(400, f"tool_choice {tool.mode} constrains the reply to tool calls already; leave "
                                    f"out {found.field}", found.field)
            found = Constraint("tools", *held, any_whitespace=False)  # one line, as models write calls
        if found is None:
            return None
        if body.min_tokens:  # a grammar complete before then allows only the stop ids min_tokens holds back
            raise ApiError(400, f"min_tokens cannot be combined with a structured-output constraint ({found.field}): "
                                "a reply the grammar completes early could take no token at all", "min_tokens")
        if self.grammars is None:
            from toolkit.infer.grammar import Grammars

            self.grammars = await asyncio.to_thread(Grammars, self.tok, self.vocab)
        try:
            return await asyncio.to_thread(self.grammars.compile, found.kind, found.spec, found.any_whitespace)
        except ValueError as e:
            raise ApiError(400, f"{found.field}: {e}", found.field) from None
