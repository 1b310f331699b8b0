"""Continuous batching in the engine: sequences admitted at different steps, finishing at different steps or
released mid-way, each produce exactly what they produce alone (greedy), and their rows are reused."""
import pytest
import torch

from toolkit.infer.drafts import random_head
from toolkit.infer.engine import Engine
from toolkit.infer.sequence import Sequence
from toolkit.infer.loading import load_target
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig


@pytest.fixture(scope="module")
def target(tiny_target):
    return load_target(tiny_target)


PROMPTS = [[1, 504, 3575, 282, 19], [1, 88, 9], [1, 4000, 17, 2201, 77, 301, 5, 6, 7], [1, 12],
           [1, 600, 601, 602], [1, 9, 9, 9, 9, 9, 9], [1, 31000, 4], [1, 45, 46, 47, 48, 49, 50, 51]]


@pytest.mark.parametrize("tree", [None, TreeConfig(4, 1, 5), TreeConfig(3, 3, 8)], ids=["plain", "chain", "tree"])
def test_sequences_joining_and_leaving_match_each_alone(target, tree, monkeypatch):
    import toolkit.infer.runner as runner_module

    head = None if tree is None else random_head(target.config, seed=1)
    drafted = []  # per step, the tree tokens each running sequence was offered, in row order
    real_draft_trees = runner_module.draft_trees

    def recording(*args):
        trees = real_draft_trees(*args)
        drafted.append([t.tokens.tolist() for t in trees])
        return trees

    monkeypatch.setattr(runner_module, "draft_trees", recording)
    lengths = [12, 5, 20, 9, 14, 3, 17, 8]  # different max_new_tokens: sequences leave at different steps
    solo, want, want_drafts = Engine(target, head, tree, max_len=64), [], []
    for p, n in zip(PROMPTS, lengths):
        drafted.clear()
        want.append(solo.generate(p, SamplingParams(max_new_tokens=n)).tokens)
        want_drafts.append([d[0] for d in drafted])

    eng = Engine(target, head, tree, max_len=64, max_batch=3)
    seqs = [Sequence(p, SamplingParams(max_new_tokens=n)) for p, n in zip(PROMPTS, lengths)]
    waiting, steps, got_drafts = list(seqs), 0, {id(s): [] for s in seqs}
    cancelled = seqs[4]
    while waiting or eng.running:
        free = eng.max_batch - len(eng.running)
        if waiting and free:  # join at a step boundary, one or two at a time
            batch, waiting = waiting[:min(free, 1 + steps % 2)], waiting[min(free, 1 + steps % 2):]
            eng.admit(batch)
        if cancelled in eng.running and len(cancelled.result.tokens) >= 4:
            eng.release(cancelled)  # a client went away: its row frees up for the next one
        running, drafted[:] = list(eng.running), []
        eng.step()
        for s, d in zip(running, drafted[0] if drafted else []):
            got_drafts[id(s)].append(d)
        steps += 1
        assert len(eng.running) <= 3
    for i, (s, w) in enumerate(zip(seqs, want)):
        if s is cancelled:
            assert s.done and s.result.tokens == w[:len(s.result.tokens)] and len(s.result.tokens) < len(w)
        else:
            assert s.result.tokens == w, f"sequence {i}"
            # the draft saw the same cache as alone: its KV rows moved with the sequence
            assert got_drafts[id(s)] == want_drafts[i], f"sequence {i}"
    assert steps < sum(lengths)  # they did run side by side


def test_admit_refuses_beyond_free_rows_and_generate_batch_needs_an_idle_engine(target):
    eng = Engine(target, max_len=32, max_batch=2)
    eng.admit([Sequence([1, 2, 3], SamplingParams(max_new_tokens=8))])
    with pytest.raises(ValueError, match="1 free of 2"):
        eng.admit([Sequence([1, 2], SamplingParams(max_new_tokens=4)) for _ in range(2)])
    with pytest.raises(RuntimeError, match="idle engine"):
        eng.generate([1, 2], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="max length 32"):
        eng.admit([Sequence(list(range(30)), SamplingParams(max_new_tokens=8))])


def test_a_seeded_sequence_samples_the_same_alone_and_in_a_batch(target):
    """Per-sequence generators: with no draft, a seeded request's sample does not depend on its neighbours."""
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    alone = Engine(target, max_len=64).generate(PROMPTS[0], params, generator=torch.Generator().manual_seed(7))
    eng = Engine(target, max_len=64, max_batch=4)
    seqs = [Sequence(p, params, generator=torch.Generator().manual_seed(7 if i == 2 else i))
            for i, p in enumerate([PROMPTS[3], PROMPTS[1], PROMPTS[0], PROMPTS[2]])]
    eng.admit(seqs)
    while eng.running:
        eng.step()
    assert seqs[2].result.tokens == alone.tokens


def test_speculation_paused_and_resumed_keeps_output_and_draft_state(target, monkeypatch):
    """step(speculate=False) decodes plainly but keeps the draft's cache in step: when speculation resumes at a
    position, the draft offers the same tree there as a run that never paused."""
    import toolkit.infer.runner as runner_module

    head, tree = random_head(target.config, seed=1), TreeConfig(3, 2, 5)
    real_draft_trees, offered = runner_module.draft_trees, {}

    def recording(head_, embed, cache, prefixes, *rest):
        trees = real_draft_trees(head_, embed, cache, prefixes, *rest)
        offered.setdefault(run, {})[prefixes[0]] = trees[0].tokens.tolist()
        return trees

    monkeypatch.setattr(runner_module, "draft_trees", recording)
    outputs = {}
    for run in ("always", "paused"):
        eng = Engine(target, head, tree, max_len=64)
        seq = Sequence(PROMPTS[2], SamplingParams(max_new_tokens=24))
        eng.admit([seq])
        k = 0
        while eng.running:
            eng.step(speculate=run == "always" or (k // 2) % 2 == 0)  # 2 speculative steps, 2 plain, ...
            k += 1
        outputs[run] = seq.result
    assert outputs["paused"].tokens == outputs["always"].tokens
    common = set(offered["always"]) & set(offered["paused"])
    assert len(common) >= 3 and all(offered["always"][p] == offered["paused"][p] for p in common)
    plain_steps = [a for i, a in enumerate(outputs["paused"].accepted) if (i // 2) % 2 == 1]
    assert plain_steps and all(a == 0 for a in plain_steps)


def naive_greedy(target, prompt, n):
    """Greedy tokens from full forwards without a cache: the reference that shares nothing with admit."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(target(torch.tensor([ids]))[0][0, -1].argmax()))
    return ids[len(prompt):]


def test_prefill_groups_bound_padding_and_cover_every_row_in_order():
    from toolkit.infer.prefill_plan import prefill_groups

    assert prefill_groups([5]) == [range(0, 1)]
    assert prefill_groups([10, 11, 30, 3, 3, 3]) == [range(0, 2), range(2, 3), range(3, 6)]
    lengths = [42, 45, 46, 50, 50, 105, 121, 122, 136, 216, 7, 3]
    groups = prefill_groups(lengths)
    assert [i for g in groups for i in g] == list(range(len(lengths)))
    for g in groups:
        part = lengths[g.start:g.stop]
        assert len(part) == 1 or max(part) * len(part) <= 1.25 * sum(part)


@pytest.mark.parametrize("tree", [None, TreeConfig(3, 2, 6)], ids=["plain", "tree"])
def test_admit_in_groups_equals_one_padded_prefill_and_plain_greedy(target, tree, monkeypatch):
    """Prompts of 9, 9, 2 and 30 tokens are prefilled as three groups (two rows, then one, then one), the
    first group at row 0 and the others after it; greedy output is plain greedy decoding's (full forwards, no
    cache) and what one padded prefill of all four gives."""
    import toolkit.infer.engine as engine_module

    prompts = [PROMPTS[2], [1, 5, 6, 7, 8, 9, 10, 11, 12], [1, 12], list(range(1, 31))]
    assert engine_module.prefill_groups([len(p) for p in prompts]) == [range(0, 2), range(2, 3), range(3, 4)]
    head = None if tree is None else random_head(target.config, seed=1)
    params = SamplingParams(max_new_tokens=10)
    want = [naive_greedy(target, p, 10) for p in prompts]
    grouped = Engine(target, head, tree, max_len=64, max_batch=4).generate_batch(prompts, params)
    assert [r.tokens for r in grouped] == want
    monkeypatch.setattr(engine_module, "prefill_groups", lambda lengths: [range(len(lengths))])
    padded = Engine(target, head, tree, max_len=64, max_batch=4).generate_batch(prompts, params)
    assert [r.tokens for r in padded] == want
