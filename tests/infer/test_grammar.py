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
from toolkit.data.chat import load_tokenizer
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
