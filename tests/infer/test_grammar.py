"""Structured output under speculation: each tree node is masked with the grammar state its own path reaches, so
greedy constrained decoding gives the same tokens with no draft, chains, trees, a lookup branch and an oracle whose
long constrained runs are accepted; what comes out is a sentence of the grammar (a choice exactly, JSON that
parses, ended by the stop token); sampled, the constrained law is the same with a tree as without."""
import json
from collections import Counter

import pytest
import torch

from test_engine_edges import Oracle
from test_engine_sampling import chi2, limit
from toolkit.data.tokenizer import load_tokenizer
from toolkit.infer.drafts import random_head
from toolkit.infer.engine import Engine
from toolkit.infer.grammar import Grammars, allowed_ids
from toolkit.infer.loading import load_target
from toolkit.infer.lookup import LookupConfig
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.sequence import Sequence
from toolkit.infer.tree import TreeConfig

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
          "required": ["name", "tags"], "additionalProperties": False}
CONSTRAINTS = {"choice": ("choice", ["red", "green", "blue"]), "schema": ("json_schema", SCHEMA),
               "regex": ("regex", r"[0-9]{3}-[a-z]{2,4}"), "json": ("json", None)}


@pytest.fixture(scope="module")
def setup(tiny_target):
    torch.set_num_threads(1)
    tok = load_tokenizer(model=str(tiny_target))
    target = load_target(tiny_target)
    return tok, target, Grammars(tok, target.config.vocab_size)


def run(target, grammars, prompts, kind, spec, stop, head=None, tree=None, lookup=None, params=None, gen=None):
    params = params or SamplingParams(max_new_tokens=40)
    eng = Engine(target, head, tree, max_len=128, max_batch=len(prompts), lookup=lookup)
    seqs = [Sequence(p, params, frozenset({stop}), generator=gen, grammar=grammars.mask(kind, spec, frozenset({stop})))
            for p in prompts]
    eng.admit(seqs)
    while eng.running:
        eng.step()
    return [s.result for s in seqs]


@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
def test_greedy_constrained_output_is_the_same_with_every_draft(setup, constraint):
    tok, target, grammars = setup
    kind, spec = CONSTRAINTS[constraint]
    stop = tok.eos_token_id
    prompts = [tok(t).input_ids for t in ("Pick a color:", "The answer is", "JSON please")]
    plain = run(target, grammars, prompts, kind, spec, stop)
    for r in plain:  # a sentence of the grammar: a fresh matcher takes every token, and it is complete
        text = tok.decode(r.tokens[:-1] if r.finish == "stop" else r.tokens)
        if constraint == "choice":
            assert r.finish == "stop" and r.tokens[-1] == stop and text in spec
        if constraint == "regex":
            assert r.finish == "stop" and len(text.split("-")[0]) == 3
        if constraint == "schema" and r.finish == "stop":
            assert set(json.loads(text)) == {"name", "tags"}
        check = grammars.mask(kind, spec, frozenset({stop}))
        for t in r.tokens:
            check.add(t)
        assert check.complete == (r.finish == "stop")
    runs = [p + r.tokens for p, r in zip(prompts, plain)]
    drafts = {"eagle3-tree": (random_head(target.config, seed=1), TreeConfig(3, 2, 6), None),
              "oracle-chain": (Oracle.of(target, runs), TreeConfig(5, 1, 6), None),
              "oracle-tree": (Oracle.of(target, runs, wrong_every=3), TreeConfig(4, 3, 10), None),
              "lookup": (None, None, LookupConfig(4))}
    for name, (head, tree, lookup) in drafts.items():
        got = run(target, grammars, prompts, kind, spec, stop, head, tree, lookup)
        assert [r.tokens for r in got] == [r.tokens for r in plain], name
        if name == "oracle-chain" and constraint != "choice":
            assert max(a for r in got for a in r.accepted) >= 3  # long constrained runs accepted in one step


def test_each_tree_node_is_masked_with_its_own_paths_state(setup):
    """Regex ab|ac|bd, the root having emitted nothing: node 1 ("a") may be followed by b or c, node 2 ("b") by
    d only, node 3 ("x", refused at the root) is left open; after node 4 ("c", under "a") only the stop token."""
    tok, target, grammars = setup
    ids = {c: tok.convert_tokens_to_ids(c) for c in "abcdx"}
    stop = tok.eos_token_id
    mask = grammars.mask("regex", "ab|ac|bd", frozenset({stop}))
    tokens, parents = [0, ids["a"], ids["b"], ids["x"], ids["c"]], [-1, 0, 0, 0, 1]
    allowed = mask.masks(tokens, parents)
    assert allowed[0, ids["a"]] and allowed[0, ids["b"]] and not allowed[0, ids["x"]]
    assert allowed[1, ids["b"]] and allowed[1, ids["c"]] and not allowed[1, ids["d"]]
    assert allowed[2, ids["d"]] and not allowed[2, ids["b"]]
    assert bool(allowed[3].all())
    assert allowed[4].nonzero()[:, 0].tolist() == [stop]
    assert mask.masks()[0].equal(allowed[0])  # the walk rolled every node back: the state is the root's again


def test_allowed_ids_unpack_xgrammars_bits():
    bitmask = torch.tensor([[0b101, -(2 ** 31)]], dtype=torch.int32)  # tokens 0, 2 and 63
    assert allowed_ids(bitmask, 64)[0].nonzero()[:, 0].tolist() == [0, 2, 63]


def test_sampled_constrained_law_is_the_same_with_a_tree(setup):
    tok, target, grammars = setup
    spec = ["red", "green", "blue", "grey", "gold"]
    prompt = tok("Pick a color:").input_ids
    params = SamplingParams(temperature=1.0, max_new_tokens=4)

    def draws(head, tree, seed):
        gen = torch.Generator().manual_seed(seed)
        out = []
        for _ in range(8):
            out += [tuple(r.tokens) for r in run(target, grammars, [prompt] * 100, "choice", spec, tok.eos_token_id,
                                                 head, tree, params=params, gen=gen)]
        return out

    plain, spec_ = draws(None, None, 0), draws(random_head(target.config, seed=1), TreeConfig(3, 3, 8), 1)
    assert {tok.decode(s[:-1]) for s in plain} <= set(spec) and len(set(plain)) > 2
    stat, df = chi2(Counter(plain), Counter(spec_))
    assert stat < limit(df), (stat, df)


def test_a_reasoning_models_grammar_starts_after_its_think_block(setup):
    """With `after` (a reasoning model's </think>; here a token the free reply writes third) the text is free up to
    it and a sentence of the grammar from there, the same with every draft (nodes on either side of `after` in one
    tree); a prompt that already closed its block (after_thinking) constrains from the first token."""
    from toolkit.infer.grammar import GrammarMask, after_thinking

    tok, target, grammars = setup
    stop, spec = tok.eos_token_id, ["red", "green", "blue"]
    prompts = [tok(t).input_ids for t in ("Pick a color:", "The answer is")]
    free = [Engine(target, max_len=128).generate(p, SamplingParams(max_new_tokens=6)).tokens for p in prompts]
    compiled = grammars.compile("choice", spec)

    def run_after(head=None, tree=None, lookup=None):
        eng = Engine(target, head, tree, max_len=128, max_batch=2, lookup=lookup)
        seqs = [Sequence(p, SamplingParams(max_new_tokens=30), frozenset({stop}),
                         grammar=GrammarMask(compiled, frozenset({stop}), target.config.vocab_size, after=f[2],
                                             active=False)) for p, f in zip(prompts, free)]
        eng.admit(seqs)
        while eng.running:
            eng.step()
        return [s.result.tokens for s in seqs]

    plain = run_after()
    for out, f in zip(plain, free):
        k = f.index(f[2])
        assert out[:k + 1] == f[:k + 1] and tok.decode(out[k + 1:-1]) in spec and out[-1] == stop
    runs = [p + o for p, o in zip(prompts, plain)]
    for head, tree, lookup in ((random_head(target.config, seed=1), TreeConfig(3, 2, 6), None),
                               (Oracle.of(target, runs, wrong_every=3), TreeConfig(4, 3, 10), None),
                               (None, None, LookupConfig(4))):
        assert run_after(head, tree, lookup) == plain

    class Tok:  # a tokenizer whose vocabulary has the tags as single tokens
        unk_token_id = 0

        def convert_tokens_to_ids(self, t):
            return {"<think>": 7, "</think>": 8}[t]

        def convert_ids_to_tokens(self, i):
            return {7: "<think>", 8: "</think>"}[i]

        def decode(self, ids):
            return "".join({5: "\n\n", 7: "<think>", 8: "</think>"}.get(i, "x") for i in ids)

    assert after_thinking(Tok(), [1, 7, 5, 8, 5]) == (8, True)    # enable_thinking false: an empty block, closed
    assert after_thinking(Tok(), [1, 7, 5, 8, 5, 3, 1]) == (8, False)  # an earlier turn's block (a tool loop)
    assert after_thinking(Tok(), [1, 7, 5, 8, 5, 7]) == (8, False)  # the template opened one: think first
    assert after_thinking(Tok(), [1, 5]) == (8, False)
    assert after_thinking(tok, prompts[0]) == (None, True)  # SmolLM2 has no </think> token


@pytest.mark.parametrize("schema, problem", [
    # property names and enum / const values are no keywords: OpenAI's weather tool has a property "format" (a
    # 500: the walk took {"type": ...} for a format name), and these were refused as unenforced
    ({"type": "object", "properties": {"format": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                                       "pattern": {"type": "string"}, "maxLength": {"type": "integer"}}}, None),
    ({"const": {"format": "x", "uniqueItems": True}}, None),
    ({"type": "integer", "format": "int64"}, None),  # pydantic / OpenAPI: an annotation off strings
    # pydantic's field of a nested model: merged, so its $ref is enforced (xgrammar ignored the allOf)
    ({"type": "object", "properties": {"a": {"allOf": [{"$ref": "#/$defs/A"}], "description": "d"}},
      "$defs": {"A": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}, None),
    # what xgrammar compiles and does not enforce (replies broke them under random logits), refused by path
    ({"type": "object", "required": ["zz"]}, "schema: required 'zz', which properties does not define"),
    ({"allOf": [{"required": ["a"]}, {"required": ["b"]}]}, "schema: allOf"),
    ({"not": {"type": "string"}}, "schema: not"),
    ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "schema: if"),
    ({"type": "object", "anyOf": [{"type": "object"}]}, "schema: type beside anyOf / oneOf"),
    ({"type": "string", "format": "date", "maxLength": 3}, "schema: format together with pattern / minLength"),
    ({"type": "string", "enum": ["a", 1]}, "schema: enum / const value 1, which type string does not allow"),
    ({"type": "integer", "const": True}, "schema: enum / const value True, which type integer does not allow"),
    ({"type": "object", "properties": {"p": {"type": "array", "items": {"not": {}}}}}, "schema.properties.p.items: not"),
])
def test_schemas_are_enforced_or_refused_by_path(setup, schema, problem):
    grammars = setup[2]
    if problem is None:
        grammars.compile("json_schema", schema)
    else:
        with pytest.raises(ValueError, match="^" + problem.replace("(", r"\(").replace(")", r"\)")):
            grammars.compile("json_schema", schema)
