"""What a draft must satisfy beyond its shapes (drafts.load_eagle3 checks those): aux layer ids that SGLang and
vLLM capture as this engine does, a one-to-one d2t, and the load-time probe of the draft's top-1 agreement with
the target (infer/loading.py warns when it is near zero)."""
from __future__ import annotations

import torch


def aux_layer_problems(ids: list[int], num_layers: int) -> list[str]:
    """Why SGLang and vLLM would not serve these aux layer ids as this toolkit does, if they would not: both
    capture the input of layer id + 1 (so id num_layers - 1 is never reached) and capture in layer order (so
    fc's column blocks must be in ascending id order, and a repeated id is captured once)."""
    problems = []
    if list(ids) != sorted(set(ids)):
        problems.append(f"aux layers {list(ids)} are not strictly increasing (SGLang and vLLM capture them in "
                        "layer order, once each)")
    if ids and min(ids) < 0:  # -1 is no layer: this engine would read its final-norm state, SGLang the embeddings
        problems.append(f"aux layer {min(ids)} is not a layer id: ids count the target's decoder layers from 0 "
                        f"(SGLang and vLLM capture the input of layer id + 1)")
    if ids and max(ids) > num_layers - 2:
        problems.append(f"aux layer {max(ids)} is the target's last ({num_layers} layers): SGLang and vLLM "
                        f"capture the input of layer id + 1, so ids must be <= {num_layers - 2}")
    return problems


def d2t_problems(ids: torch.Tensor) -> list[str]:
    """What is wrong with a d2t's target ids (draft id i -> ids[i]) short of the vocabulary's end (checked by
    the caller): each draft id must name its own target id, none negative, or the draft's probabilities cannot
    be read over the target vocabulary (sampled drafts, draft_sampling.chain_draft_probs)."""
    problems = []
    negative = (ids < 0).nonzero().flatten()
    if len(negative):
        i = int(negative[0])
        problems.append(f"d2t maps draft id {i} to target id {int(ids[i])}, below 0")
    _, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
    shared = (counts[inverse] > 1).nonzero().flatten()
    if len(shared):
        i = int(shared[0])
        j = int((ids == ids[i]).nonzero().flatten()[1])
        problems.append(f"d2t maps draft ids {i} and {j} to the same target id {int(ids[i])}; it must map draft "
                        "ids to target ids one-to-one")
    return problems


@torch.no_grad()
def agreement(head, target, ids: list[int], start: int = 0) -> float:
    """Load-time sanity probe: share of positions (the predictions of tokens start + 2 ..) where the draft's top-1
    (from the target's own hidden states) equals the target's top-1. Near zero means a wrong d2t, wrong aux
    layers or a missing lm_head."""
    x = torch.tensor([ids], device=target.embed_tokens.weight.device)
    logits, aux = target(x, aux_layers=head.aux_layers)
    want = logits[0].argmax(-1)                            # target's token for position t + 1
    pairs = target.embed_tokens(x[:, 1:])                  # (token t + 1, hidden t) -> predicts t + 2
    if getattr(head, "blank_position0", False):  # MTP: trained and served with a zero embedding at position 0
        pairs[:, 0] = 0
    logp, _ = head(pairs, torch.cat(aux, -1)[:, :-1], torch.arange(len(ids) - 1, device=x.device)[None],
                   head.new_cache(len(ids), pairs.dtype, x.device))
    got = head.to_target(logp[0].argmax(-1))
    return float((got == want[1:])[start:].float().mean())
