"""Adversarial batches on a tiny random Llama: prompts of 1..45 tokens that finish at different steps (a stop id,
max_new_tokens of 1 and more), joins, leaves and released requests in reused rows, a cache sized exactly to the
longest request under the widest tree, stop strings and EOS inside a run of accepted drafts, and per-sequence
sampling parameters. Greedy output must be transformers' greedy token for token, draft trees must not depend on
what a row held before, and the metrics must count only the tokens a sequence emitted."""
import pytest
import torch

from toolkit.infer.draft_head import DraftHead
from toolkit.infer.drafts import random_head
from toolkit.infer.eagle2 import Eagle2Head
from toolkit.infer.engine import Engine
from toolkit.infer.graphs import eager_capture
from toolkit.infer.loading import load_target
from toolkit.infer.lookup import LookupConfig
from toolkit.infer.metrics import summarize
from toolkit.infer.mtp import MTPHead
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.sequence import Sequence, StopStrings
from toolkit.infer.tree import TreeConfig

V = 64
PROMPTS = [[1], [1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45] + list(range(3, 36)), [7, 7, 7, 7], [1, 2, 3],
           [40, 41, 42, 40, 41, 42, 40], [11, 60], [1] + list(range(20, 39)), [63, 0, 62, 5, 5]]
LENGTHS = [24, 3, 17, 1, 24, 9, 20, 2]  # max_new_tokens: the sequences leave at different steps
DIVERSE = [4, 40, 31, 43, 56]  # its greedy continuation repeats no bigram for 21 tokens: room for stop strings


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(our target, the transformers model it was loaded from): 4 layers, a 64-token vocabulary."""
    import transformers

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: one thread is faster, and the box is shared
    folder = tmp_path_factory.mktemp("tiny-edges")
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # a peaked next-token law: greedy has no near-ties for batching to flip
        hf.lm_head.weight.normal_(0.0, 1.0)
    hf.save_pretrained(folder)
    yield load_target(folder), hf
    torch.set_num_threads(threads)


_greedy: dict = {}


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy continuation (no EOS stop), cached per prompt."""
    key = tuple(prompt)
    if len(_greedy.get(key, ())) < n:
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=max(n, 24), min_new_tokens=max(n, 24),
                          do_sample=False, eos_token_id=None, pad_token_id=0)
        _greedy[key] = out[0, len(prompt):].tolist()
    return _greedy[key][:n]


class Oracle(DraftHead):
    """A draft that knows the greedy continuations: the pair (token at position p + 1, hidden p) proposes the
    token that followed that token at that position in `table`. Keyed by content, not by row, so it follows a
    sequence when rows move. wrong_every k > 0: at every k-th position the right token is only the second
    candidate (chains get rejected there, trees must take a non-first child)."""

    def __init__(self, table: dict, embed: torch.Tensor, aux_layers: list[int], wrong_every: int = 0):
        super().__init__()
        self.table, self.embed_w, self.aux_layers, self.wrong_every = table, embed, aux_layers, wrong_every
        self.d2t = torch.zeros(len(embed), dtype=torch.long)

    @classmethod
    def of(cls, target, runs: list[list[int]], wrong_every: int = 0) -> "Oracle":
        table = {(i, full[i]): full[i + 1] for full in runs for i in range(len(full) - 1)}
        return cls(table, target.embed_tokens.weight.detach(), target.config.default_aux_layers(), wrong_every)

    def new_cache(self, max_len, dtype=torch.float32, device="cpu", batch=1):
        return None

    def step_inputs(self, positions, mask, dtype):
        return None

    def forward(self, emb, hidden, positions, cache, slots=None, mask=None, log_probs=True, pre=None, kv_len=None):
        B, T = positions.shape
        scores = torch.zeros(B, T, len(self.embed_w))
        tokens = (emb[:, :, None, :] == self.embed_w).all(-1).float().argmax(-1)    # the embedding's row
        for b in range(B):
            for t in range(T):
                p = int(positions[b, t]) + 1
                right = self.table.get((p, int(tokens[b, t])), 0)
                wrong = (right + 1) % len(self.embed_w)
                swap = self.wrong_every and p % self.wrong_every == 0
                scores[b, t, wrong if swap else right], scores[b, t, right if swap else wrong] = 10.0, 9.0
        return scores.log_softmax(-1), torch.zeros(B, T, self.embed_w.shape[1])


def random_weights(head, seed: int):
    """A head's own weights random (std 0.2) around a frozen copy of the target's lm_head."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name != "lm_head.weight":
                p.normal_(0.0, 0.2)
    return head.eval()


def make_head(kind: str, target, runs=None):
    c, lm = target.config, target.lm_head.weight.detach().float()
    if kind == "oracle":
        return Oracle.of(target, runs, wrong_every=4)
    if kind == "eagle3":
        return random_head(c, seed=1)
    if kind == "eagle2":
        return random_weights(Eagle2Head(c, lm), 3)
    return random_weights(MTPHead(c, lm), 4)


DRAFTS = {"plain": (None, None, None), "oracle-chain": ("oracle", TreeConfig(5, 1, 6), None),
          "oracle-tree": ("oracle", TreeConfig(4, 3, 10), None), "eagle3-tree": ("eagle3", TreeConfig(3, 2, 6), None),
          "eagle2-chain": ("eagle2", TreeConfig(4, 1, 5), None), "mtp-chain": ("mtp", TreeConfig(3, 1, 4), None),
          "lookup": (None, None, LookupConfig(5)),
          "oracle-tree+lookup": ("oracle", TreeConfig(3, 2, 6), LookupConfig(4)),
          "mtp-tree+lookup": ("mtp", TreeConfig(3, 2, 5), LookupConfig(4))}


def check_counts(r) -> None:
    """Every emitted token is the prefill's or one of a step's accepted + 1; lookup's share is of the accepted."""
    assert 1 + sum(r.accepted) + len(r.accepted) == len(r.tokens) and min(r.accepted, default=0) >= 0
    assert r.from_lookup <= sum(r.accepted) and r.verify_steps == len(r.accepted)


@pytest.mark.parametrize("draft", list(DRAFTS))
def test_ragged_batch_finishing_at_different_steps_equals_transformers_greedy(tiny, draft):
    target, hf = tiny
    kind, tree, lookup = DRAFTS[draft]
    want = [hf_greedy(hf, p, n) for p, n in zip(PROMPTS, LENGTHS)]
    head = None if kind is None else make_head(kind, target, [p + hf_greedy(hf, p, 24) for p in PROMPTS])
    stop = want[4][6]  # one sequence stops early on a stop id, maybe inside an accepted run; the others go on
    eng = Engine(target, head, tree, max_len=64, max_batch=len(PROMPTS), lookup=lookup)
    seqs = [Sequence(p, SamplingParams(max_new_tokens=n), frozenset({stop})) for p, n in zip(PROMPTS, LENGTHS)]
    eng.admit(seqs)
    while eng.running:
        eng.step()
    for s, w in zip(seqs, want):
        cut = w.index(stop) + 1 if stop in w else len(w)
        assert s.result.tokens == w[:cut]
        assert s.result.finish == ("stop" if stop in w else "length")
        check_counts(s.result)
    if kind == "oracle":
        assert max(a for s in seqs for a in s.result.accepted) >= 3  # runs of drafts were accepted


def offered(monkeypatch) -> dict:
    """Records, per sequence and prefix, the tree each verify step offered it (padding nodes dropped)."""
    record, real = {}, Engine._verify

    def verify(self, trees, seqs, grafted=False):
        for tree, s in zip(trees, seqs):
            nodes = [i for i, p in enumerate(tree.parents.tolist()) if i == 0 or p >= 0]
            if len(nodes) > 1:  # not a plain step
                record.setdefault(id(s), {})[s.prefix] = [tree.tokens.tolist()[i] for i in nodes]
        return real(self, trees, seqs, grafted)

    monkeypatch.setattr(Engine, "_verify", verify)
    return record


@pytest.mark.parametrize("draft, graphs", [("eagle3-tree", False), ("eagle3-tree", True), ("eagle2-chain", False),
                                           ("mtp-tree+lookup", True), ("plain", False), ("lookup", False)])
def test_reused_rows_do_not_leak_into_later_requests(tiny, draft, graphs, monkeypatch):
    """Rows first serve other requests; then requests join one to three at a time while others run, leave at
    different steps, and one is released mid-way. Each one's tokens, and the draft tree offered at each of its
    prefixes, are what it gets alone in a fresh engine."""
    target, hf = tiny
    kind, tree, lookup = DRAFTS[draft]
    head = None if kind is None else make_head(kind, target)
    kw = {"cuda_graphs": True, "graph_capture": eager_capture} if graphs else {}
    record = offered(monkeypatch)
    solo, want_trees = Engine(target, head, tree, max_len=64, lookup=lookup, **kw), []
    for p, n in zip(PROMPTS, LENGTHS):
        s = Sequence(p, SamplingParams(max_new_tokens=n))
        solo.admit([s])
        while solo.running:
            solo.step()
        want_trees.append(record.pop(id(s), {}))
    eng = Engine(target, head, tree, max_len=64, max_batch=3, lookup=lookup, **kw)
    eng.generate_batch([[50, 51, 52, 53] * 10, [9] * 30, [4, 4]], SamplingParams(max_new_tokens=20))
    record.clear()
    seqs = [Sequence(p, SamplingParams(max_new_tokens=n)) for p, n in zip(PROMPTS, LENGTHS)]
    waiting, steps, released = list(seqs), 0, seqs[2]
    while waiting or eng.running:
        free = eng.max_batch - len(eng.running)
        if waiting and free:
            k = min(free, 1 + steps % 3)
            eng.admit(waiting[:k])
            waiting = waiting[k:]
        if released in eng.running and len(released.result.tokens) >= 5:
            eng.release(released)
        eng.step()
        steps += 1
    for i, (s, p, n) in enumerate(zip(seqs, PROMPTS, LENGTHS)):
        w = hf_greedy(hf, p, n)
        assert s.result.tokens == (w[:len(s.result.tokens)] if s is released else w), f"sequence {i}"
        got = record.get(id(s), {})
        assert all(got[k] == want_trees[i][k] for k in got), f"sequence {i}: a draft saw another row's cache"
        check_counts(s.result)
    assert len(released.result.tokens) < LENGTHS[2] and released.result.finish is None


@pytest.mark.parametrize("graphs", [False, True])
def test_a_cache_sized_exactly_to_the_longest_request_under_the_widest_tree(tiny, graphs):
    """max_len 8 with a 10-node tree plus a 10-token lookup branch: a request ends exactly at the cache's last
    slot while its tree reaches past it. Output stays exact, the cache never grows, a request one token too long
    or a max_new_tokens of 0 is refused with a clear error."""
    target, hf = tiny
    kw = {"cuda_graphs": True, "graph_capture": eager_capture} if graphs else {}
    eng = Engine(target, random_head(target.config, seed=1), TreeConfig(4, 3, 10), max_len=8, max_batch=3,
                 lookup=LookupConfig(10), **kw)
    shape = eng.cache.k.shape
    cases = [([5, 6, 5, 6, 5, 6, 5], 1), ([1], 7), ([7, 7, 7, 7, 7, 7], 2)]  # prompt + max_new_tokens == 8
    for p, n in cases:
        assert eng.generate(p, SamplingParams(max_new_tokens=n)).tokens == hf_greedy(hf, p, n)
    seqs = [Sequence(p, SamplingParams(max_new_tokens=n)) for p, n in cases]
    eng.admit(seqs)
    while eng.running:
        eng.step()
    assert [s.result.tokens for s in seqs] == [hf_greedy(hf, p, n) for p, n in cases]
    assert eng.cache.k.shape == shape
    with pytest.raises(ValueError, match="max length 8"):
        eng.generate([3] * 8, SamplingParams(max_new_tokens=1))
    with pytest.raises(ValueError, match="max length 8"):
        eng.generate([3], SamplingParams(max_new_tokens=8))
    with pytest.raises(ValueError, match="max_new_tokens must be positive"):
        SamplingParams(max_new_tokens=0)


class PieceTokenizer:
    """Token i decodes to "<i>": a stop string can start inside one token and end inside the next."""

    @staticmethod
    def decode(ids) -> str:
        return "".join(f"<{int(i)}>" for i in ids)


def stop_needle(tokens: list[int], ends_at) -> tuple[int, str]:
    """(k, "a><b") for the first k with ends_at(k) where "a><b" (from the pieces of tokens k - 1 and k) first
    appears in the text at token k: plain decoding stops there."""
    for k in range(1, len(tokens)):
        needle = f"{tokens[k - 1]}><{tokens[k]}"
        if ends_at(k) and needle not in PieceTokenizer.decode(tokens[:k]):
            return k, needle
    raise AssertionError(f"no fitting stop string in {tokens}")


@pytest.mark.parametrize("tree", [TreeConfig(5, 1, 6), TreeConfig(4, 3, 10)], ids=["chain", "tree"])
@pytest.mark.parametrize("where", ["inside-a-run", "across-two-steps"])
def test_a_stop_string_inside_an_accepted_run_stops_where_plain_decoding_stops(tiny, tree, where):
    """A draft that is always right makes every step accept num_steps tokens; a stop string completed by a token in
    the middle of such a run (or one that starts in one step's tokens and ends in the next's) ends the output at
    that token, and the tokens accepted after it are neither emitted nor counted."""
    target, hf = tiny
    prompt = DIVERSE
    full = hf_greedy(hf, prompt, 24)
    run = tree.num_steps + 1  # tokens a step emits: token 0 is the prefill's, step j emits run * (j-1) + 1 .. run * j
    inside = (lambda k: k % run not in (0, 1)) if where == "inside-a-run" else (lambda k: k % run == 1 and k > 1)
    k, needle = stop_needle(full, inside)  # starts inside token k - 1's text, ends inside token k's
    stop = StopStrings(PieceTokenizer(), [needle])
    plain = Engine(target, max_len=64).generate(prompt, SamplingParams(max_new_tokens=24), stop_strings=stop)
    assert plain.tokens == full[:k + 1] and plain.finish == "stop"
    oracle = Oracle.of(target, [prompt + full])
    res = Engine(target, oracle, tree, max_len=64).generate(prompt, SamplingParams(max_new_tokens=24),
                                                            stop_strings=stop)
    assert res.tokens == full[:k + 1] and res.finish == "stop"
    assert res.accepted == [tree.num_steps] * (len(res.accepted) - 1) + [(k - 1) % run]
    check_counts(res)


@pytest.mark.parametrize("tree", [TreeConfig(5, 1, 6), TreeConfig(4, 3, 10)], ids=["chain", "tree"])
def test_eos_accepted_mid_path_drops_the_rest_and_counts_none_of_it(tiny, tree):
    """EOS is the 3rd of a step's accepted drafts: the step emits up to it, and τ, the per-position acceptance
    and the histogram count 2 accepted tokens for that step (not the num_steps the target accepted)."""
    target, hf = tiny
    prompt = DIVERSE
    full = hf_greedy(hf, prompt, 24)
    run = tree.num_steps + 1
    k = next(k for k in range(run + 1, 24) if k % run == 3 and full[k] not in full[:k])  # 3rd token of a step
    oracle = Oracle.of(target, [prompt + full])
    eng = Engine(target, oracle, tree, max_len=64)
    free = eng.generate(prompt, SamplingParams(max_new_tokens=24))
    assert free.tokens == full and free.accepted[:2] == [tree.num_steps] * 2
    res = eng.generate(prompt, SamplingParams(max_new_tokens=24), stop_ids={full[k]})
    assert res.tokens == full[:k + 1] and res.finish == "stop"
    steps = (k - 1) // run + 1
    assert res.accepted == [tree.num_steps] * (steps - 1) + [2]
    s = summarize([res], positions=tree.num_steps)
    assert s["tokens"] == k + 1 and s["tau"] == pytest.approx(k / steps)
    assert s["accepted_length_histogram"][2] == 1 and s["accepted_length_histogram"][tree.num_steps] == steps - 1
    assert s["accept_rate_by_position"][2] == pytest.approx((steps - 1) / steps)  # position 3: not for EOS's step


SAMPLED = [SamplingParams(temperature=1.0, max_new_tokens=12), SamplingParams(max_new_tokens=9),
           SamplingParams(temperature=2.0, top_k=3, max_new_tokens=15), SamplingParams(temperature=0.7, top_p=0.5,
                                                                                      max_new_tokens=7),
           SamplingParams(temperature=1.5, top_k=1, max_new_tokens=10)]


@pytest.mark.parametrize("draft", ["plain", "tree", "sampled-chain", "chain+lookup"])
def test_each_sequence_samples_with_its_own_params_and_generator(tiny, draft):
    """Sequences with different temperature / top-k / top-p (one greedy, one top-k 1: greedy in effect) join a
    running batch; each one's seeded sample is the one it draws alone, and the two greedy ones are greedy."""
    target, hf = tiny
    head = None if draft == "plain" else random_head(target.config, seed=1)
    tree = {"tree": TreeConfig(3, 2, 6), "sampled-chain": TreeConfig(4, 1, 5), "chain+lookup": TreeConfig(3, 1, 4)}
    kw = {"sample_draft": draft == "sampled-chain", "lookup": LookupConfig(4) if draft == "chain+lookup" else None}
    prompts = [PROMPTS[i] for i in (3, 1, 4, 7, 6)]
    solo = Engine(target, head, tree.get(draft), max_len=64, **kw)
    want = [solo.generate(p, sp, generator=torch.Generator().manual_seed(100 + i)).tokens
            for i, (p, sp) in enumerate(zip(prompts, SAMPLED))]
    eng = Engine(target, head, tree.get(draft), max_len=64, max_batch=4, **kw)
    seqs = [Sequence(p, sp, generator=torch.Generator().manual_seed(100 + i))
            for i, (p, sp) in enumerate(zip(prompts, SAMPLED))]
    eng.admit(seqs[:2])
    eng.step()
    eng.admit(seqs[2:4])
    waiting = seqs[4:]  # joins once a row frees up
    while waiting or eng.running:
        if waiting and len(eng.running) < eng.max_batch:
            eng.admit(waiting)
            waiting = []
        eng.step()
    assert [s.result.tokens for s in seqs] == want
    for i in (1, 4):
        assert want[i] == hf_greedy(hf, prompts[i], SAMPLED[i].max_new_tokens)


def test_an_interrupted_run_leaves_the_engine_usable(tiny, monkeypatch):
    """Ctrl-C (or an error) inside generate_batch must not leave its sequences running: every later call would
    be refused as if the engine were serving them."""
    target, hf = tiny
    eng = Engine(target, random_head(target.config, seed=1), TreeConfig(3, 2, 6), max_len=64, max_batch=2)
    real, calls = Engine._verify, []

    def interrupted(self, *args, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, *args, **kw)

    monkeypatch.setattr(Engine, "_verify", interrupted)
    with pytest.raises(KeyboardInterrupt):
        eng.generate_batch([PROMPTS[1], PROMPTS[2]], SamplingParams(max_new_tokens=10))
    assert eng.running == []
    assert eng.generate(PROMPTS[4], SamplingParams(max_new_tokens=10)).tokens == hf_greedy(hf, PROMPTS[4], 10)


def test_a_prompt_id_outside_the_vocabulary_is_refused_before_any_prefill(tiny):
    """Refused by check (a clear error, nothing admitted), not by the embedding mid-admit: on CUDA that is a
    device-side assert, which loses every running request."""
    target, _ = tiny
    eng = Engine(target, max_len=64, max_batch=2)
    for bad in ([1, V], [1, -1]):
        with pytest.raises(ValueError, match=f"id {bad[1]} outside the vocabulary 0..{V - 1}"):
            eng.admit([Sequence([1, 2, 3], SamplingParams(max_new_tokens=4)), Sequence(bad, SamplingParams())])
        assert eng.running == []
