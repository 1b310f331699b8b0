"""Replayed acceptance (toolkit/train/replay.py) against loops written from its definition; the check that it
equals the engine step for step runs in the training tests (eval_replay_differing_rows == 0)."""
import torch

from toolkit.train.replay import accept_lengths, replay_chain, replayed_tau


def naive_lengths(step_logits, target_top, draft_ids):
    B, L = target_top.shape
    out = torch.zeros(B, L, dtype=torch.long)
    for b in range(B):
        for t in range(L):
            for i, logits in enumerate(step_logits):
                if t + i + 1 >= L - 1 or int(draft_ids[int(logits[b, t].argmax())]) != int(target_top[b, t + i + 1]):
                    break
                out[b, t] += 1
    return out


def test_accept_lengths_count_the_first_steps_in_a_row_that_hit():
    g = torch.Generator().manual_seed(0)
    B, L, N, K = 3, 12, 5, 4
    draft_ids = torch.tensor([7, 2, 9, 4, 0])                     # draft id -> target id
    target_top = draft_ids[torch.randint(0, N, (B, L), generator=g)]
    target_top[0, 5] = 11                                         # a target token outside the draft vocabulary
    # step i copies the target's argmax at t + i + 1 with probability ~0.7, else a random draft id
    steps = []
    for i in range(K):
        pick = torch.randint(0, N, (B, L), generator=g)
        shifted = torch.cat([target_top[:, i + 1:], target_top[:, -1:].expand(B, i + 1)], 1)
        right = (draft_ids[None, None] == shifted[..., None]).long().argmax(-1)
        choice = torch.where(torch.rand(B, L, generator=g) < 0.7, right, pick)
        steps.append(torch.nn.functional.one_hot(choice, N).float() * 5 + torch.rand(B, L, N, generator=g))
    got = accept_lengths(steps, target_top, draft_ids)
    assert torch.equal(got, naive_lengths(steps, target_top, draft_ids))
    assert got.max() >= 2 and (got == 0).any()  # the case is not trivial
    # a miss stops the count even when a later step hits
    one = [torch.tensor([[[0., 9.], [0., 9.], [0., 9.], [0., 9.], [0., 9.]]])] * 3
    one[1] = one[1].flip(-1)
    assert accept_lengths(one, torch.tensor([[1, 1, 1, 1, 1]]), torch.tensor([0, 1])).tolist() == [[1, 1, 1, 0, 0]]


def test_replay_jumps_over_accepted_tokens_and_stops_at_the_answer_end():
    # prompt of 4 tokens: the prefill emits token 4; the first verify step drafts from row 3
    lengths = torch.tensor([9, 9, 9, 2, 5, 5, 0, 1, 3, 0, 0, 0, 0])
    # row 3 accepts 2 -> 3 tokens (rows 4, 5 skipped); row 6 accepts 0; row 7 accepts 1; row 9 accepts 0 ...
    assert replay_chain(lengths, 4, 9) == [2, 0, 1, 0, 0]
    assert replay_chain(lengths, 4, 3) == [1]                     # the answer ends inside the first step
    assert replay_chain(lengths, 4, 1) == []                      # the prefill's token alone: no verify step
    assert replayed_tau([[2, 0, 1, 0, 0], [1]]) == (4 + 6) / 6
    assert replayed_tau([]) == 0.0
