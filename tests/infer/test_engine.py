"""Lossless greedy: speculative output == plain output of the same engine == transformers greedy, on the
real SmolLM2, for chains and trees, with and without a prompt-lookup branch; and EOS / max_new_tokens stop
exactly where plain decoding stops."""
import functools

import pytest
import torch

from toolkit.infer.draft_head import DraftHead
from toolkit.infer.drafts import random_head
from toolkit.infer.engine import Engine
from toolkit.infer.loading import load_target
from toolkit.infer.lookup import LookupConfig
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig

PROMPTS = ["<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nWrite a Python function that adds two numbers.<|im_end|>\n<|im_start|>assistant\n",
           "The three primary colors are"]
REPEAT = ("<|im_start|>user\nRepeat this sentence three times: the cat sat on the mat.<|im_end|>\n"
          "<|im_start|>assistant\n")  # SmolLM2 copies it, then loops: the lookup branch gets accepted


class OracleHead(DraftHead):
    """A stand-in draft that knows the plain greedy continuation `seq`: the pair at position p proposes
    seq[p + 2] first, except at every 4th position, where it proposes a wrong token first and the right one
    second. So chains accept runs and get rejected; trees must pick non-first children."""

    def __init__(self, seq, vocab, hidden, aux_layers):
        super().__init__()
        self.seqs = seq if isinstance(seq[0], list) else [seq]  # one continuation per batch row
        self.vocab, self.hidden, self.aux_layers = vocab, hidden, aux_layers
        self.d2t = torch.zeros(vocab, dtype=torch.long)

    def new_cache(self, max_len, dtype=torch.float32, device="cpu", batch=1):
        return None

    def step_inputs(self, positions, mask, dtype):
        return None  # no RoPE, no attention

    def forward(self, emb, hidden, positions, cache, slots=None, mask=None, log_probs=True, pre=None):
        B, T = positions.shape
        scores = torch.zeros(B, T, self.vocab)
        for b in range(B):
            for t in range(T):
                p, seq = int(positions[b, t]) + 2, self.seqs[b]
                right = seq[p] if p < len(seq) else 0
                wrong = (right + 1) % self.vocab
                first, second = (wrong, right) if p % 4 == 0 else (right, wrong)
                scores[b, t, first], scores[b, t, second] = 10.0, 9.0
        return scores.log_softmax(-1), torch.zeros(B, T, self.hidden)


@pytest.fixture(scope="module")
def smollm2(smollm2_dir, smollm2_tokenizer):
    return load_target(smollm2_dir), smollm2_tokenizer


def plain(model, ids, n):
    return Engine(model, max_len=512).generate(ids, SamplingParams(max_new_tokens=n)).tokens


@functools.lru_cache
def _plain_cached(model, ids, n):
    return plain(model, list(ids), n)


def plain_cached(model, ids, n):
    return _plain_cached(model, tuple(ids), n)


def test_plain_engine_equals_transformers_greedy(smollm2, smollm2_dir):
    from transformers import AutoModelForCausalLM

    model, tok = smollm2
    ref = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    for prompt in PROMPTS:
        ids = tok(prompt, add_special_tokens=False).input_ids
        hf = ref.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                          pad_token_id=tok.eos_token_id)[0, len(ids):].tolist()
        assert plain(model, ids, 24) == hf


@pytest.mark.parametrize("tree", [TreeConfig(5, 1, 6), TreeConfig(3, 2, 6), TreeConfig(4, 3, 10)],
                         ids=["chain5", "tree-s3-k2-n6", "tree-s4-k3-n10"])
def test_speculative_greedy_equals_plain_greedy(smollm2, tree):
    model, tok = smollm2
    c = model.config
    for prompt in PROMPTS:
        ids = tok(prompt, add_special_tokens=False).input_ids
        want = plain(model, ids, 40)
        oracle = OracleHead(ids + want + [0] * 16, c.vocab_size, c.hidden_size, c.default_aux_layers())
        res = Engine(model, oracle, tree, max_len=512).generate(ids, SamplingParams(max_new_tokens=40))
        assert res.tokens == want
        assert res.tau > 1.5 and res.verify_steps < 39  # drafts were accepted, paths compacted
        real = Engine(model, random_head(c, seed=1), tree, max_len=512)
        assert real.generate(ids, SamplingParams(max_new_tokens=12)).tokens == want[:12]


@pytest.mark.parametrize("tree", [None, TreeConfig(5, 1, 6), TreeConfig(3, 2, 6)], ids=["plain", "chain", "tree"])
def test_batch_of_four_prompts_of_different_lengths_equals_each_alone(smollm2, tree):
    model, tok = smollm2
    c = model.config
    prompts = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS] + [[504, 3575, 282]]
    want = [plain(model, ids, 20) for ids in prompts]
    head = None if tree is None else OracleHead([ids + w + [0] * 16 for ids, w in zip(prompts, want)],
                                                c.vocab_size, c.hidden_size, c.default_aux_layers())
    eng = Engine(model, head, tree, max_len=256, max_batch=4)
    stop = want[1][5]  # one sequence stops early; the others go on
    got = eng.generate_batch(prompts, SamplingParams(max_new_tokens=20), stop_ids={stop})
    for ids, w, r in zip(prompts, want, got):
        cut = w.index(stop) + 1 if stop in w else len(w)
        assert r.tokens == w[:cut]
    real = Engine(model, None if tree is None else random_head(c, seed=1), tree, max_len=256, max_batch=4)
    assert [r.tokens for r in real.generate_batch(prompts, SamplingParams(max_new_tokens=8))] == \
        [w[:8] for w in want]


def test_stops_exactly_where_plain_decoding_stops(smollm2):
    model, tok = smollm2
    ids = tok(PROMPTS[0], add_special_tokens=False).input_ids
    want = plain(model, ids, 60)
    stop = want[7]  # a token that first occurs at some index: both must stop right after it
    first = want.index(stop)
    c = model.config
    oracle = OracleHead(ids + want + [0] * 16, c.vocab_size, c.hidden_size, c.default_aux_layers())
    for head, tree in ((None, None), (oracle, TreeConfig(5, 1, 6)), (oracle, TreeConfig(3, 2, 6))):
        eng = Engine(model, head, tree, max_len=512)
        assert eng.generate(ids, SamplingParams(max_new_tokens=60), stop_ids={stop}).tokens == want[:first + 1]
        for n in (1, 2, 9, 13):
            assert eng.generate(ids, SamplingParams(max_new_tokens=n)).tokens == want[:n]


def test_stop_strings_stop_where_plain_decoding_stops(smollm2):
    from toolkit.infer.sequence import StopStrings

    model, tok = smollm2
    ids = tok(PROMPTS[1], add_special_tokens=False).input_ids
    want = plain(model, ids, 40)
    text = tok.decode(want)
    needle = text[len(text) // 2: len(text) // 2 + 3]  # a string that first completes mid-generation
    stop = StopStrings(tok, [needle, "never appears \u2603"])
    cut = next(i for i in range(1, len(want) + 1) if needle in tok.decode(want[:i]))
    c = model.config
    oracle = OracleHead(ids + want + [0] * 16, c.vocab_size, c.hidden_size, c.default_aux_layers())
    for head, tree in ((None, None), (oracle, TreeConfig(5, 1, 6)), (oracle, TreeConfig(3, 2, 6))):
        got = Engine(model, head, tree, max_len=512).generate(ids, SamplingParams(max_new_tokens=40),
                                                              stop_strings=stop)
        assert got.tokens == want[:cut]
    with pytest.raises(ValueError):
        StopStrings(tok, [""])


@pytest.mark.parametrize("needle", ["ありがとうございました", "龘龘龘龘龘"])
def test_a_stop_string_of_many_tokens_per_character_is_found(smollm2, needle):
    """Byte-level BPE spends 2-4 tokens on some characters: the decoded tail must still hold the whole string
    when its last token arrives (the check runs once per token, so a miss is never caught later)."""
    from toolkit.infer.sequence import StopStrings

    _, tok = smollm2
    ids = tok("Answer: ", add_special_tokens=False).input_ids
    string = tok(needle, add_special_tokens=False).input_ids
    assert len(string) > len(needle) + 8  # more tokens than characters + the old margin
    stop = StopStrings(tok, [needle])
    fired = [stop(ids + string[:i]) for i in range(1, len(string) + 1)]
    assert fired == [False] * (len(string) - 1) + [True]


def test_bad_tree_and_length_are_refused(smollm2):
    model, _ = smollm2
    with pytest.raises(ValueError, match="num_steps \\+ 1"):
        TreeConfig(5, 1, 4)
    with pytest.raises(ValueError, match="2..7"):
        TreeConfig(2, 2, 9)
    with pytest.raises(ValueError, match="max length"):
        Engine(model, max_len=16).generate(list(range(10)), SamplingParams(max_new_tokens=10))


@pytest.mark.parametrize("draft, tree", [(None, None), ("random", TreeConfig(5, 1, 6)), ("random", TreeConfig(3, 2, 6)),
                                         ("oracle", TreeConfig(4, 3, 10))],
                         ids=["lookup-alone", "chain5", "tree-s3-k2-n6", "oracle-tree-s4-k3-n10"])
def test_lookup_branch_keeps_greedy_exact(smollm2, draft, tree):
    model, tok = smollm2
    c = model.config
    from_lookup, random = 0, random_head(c, seed=1) if draft == "random" else None
    for prompt in (PROMPTS[1], REPEAT):
        ids = tok(prompt, add_special_tokens=False).input_ids
        want = plain_cached(model, ids, 40)
        head = random if draft != "oracle" else OracleHead(ids + want + [0] * 16, c.vocab_size, c.hidden_size,
                                                           c.default_aux_layers())
        res = Engine(model, head, tree, max_len=512, lookup=LookupConfig(8)).generate(
            ids, SamplingParams(max_new_tokens=40))
        assert res.tokens == want
        from_lookup += res.from_lookup
        assert res.from_lookup <= sum(res.accepted)
    if draft != "oracle":  # a random head is hardly ever right: the lookup branch carries the run
        assert from_lookup >= 10


def test_lookup_branch_in_a_batch_equals_each_alone(smollm2):
    model, tok = smollm2
    c = model.config
    prompts = [tok(p, add_special_tokens=False).input_ids for p in (REPEAT, PROMPTS[0], PROMPTS[2])] + [[504, 3575]]
    want = [plain(model, ids, 24) for ids in prompts]
    stop = want[1][5]
    for head, tree in ((None, None), (random_head(c, seed=1), TreeConfig(3, 2, 6))):
        eng = Engine(model, head, tree, max_len=256, max_batch=4, lookup=LookupConfig(6))
        got = eng.generate_batch(prompts, SamplingParams(max_new_tokens=24), stop_ids={stop})
        for w, r in zip(want, got):
            assert r.tokens == w[:w.index(stop) + 1 if stop in w else len(w)]
        assert got[0].from_lookup > 0
