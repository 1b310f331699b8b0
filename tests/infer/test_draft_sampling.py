"""The Gumbel noise of sampled chain drafts (toolkit/infer/draft_sampling.py) has the Gumbel law's whole upper
range: from float32 uniforms it could not exceed -log(-log(1 - 2**-24)) = 16.64, which the largest of 4M
Gumbel draws passes about one time in five, so the draft's draw would not be exactly softmax(logp / T), the law
verification divides by."""
import math

import torch

from toolkit.infer.draft_sampling import chain_draft_probs, gumbel_inputs
from toolkit.infer.sampling import SamplingParams

FLOAT32_CAP = -math.log(-math.log1p(-2.0 ** -24))


def test_the_noise_reaches_past_what_float32_uniforms_allow():
    g = torch.Generator().manual_seed(6)  # a seed whose largest draw of 2**22 lies past the cap (17.39)
    noise = gumbel_inputs([SamplingParams(temperature=0.8)], [g], 1, 2 ** 22, "cpu")["gumbel"]
    assert 16.6 < FLOAT32_CAP < 16.7 and noise.max() > FLOAT32_CAP
    assert noise.dtype == torch.float32 and torch.isfinite(noise).all()


def test_greedy_rows_get_no_noise_and_sampled_rows_their_own_generators_noise():
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.5), SamplingParams(temperature=2.0)]
    gens = [torch.Generator().manual_seed(s) for s in (1, 2, 2)]
    out = gumbel_inputs(params, gens, 3, 50, "cpu")
    assert out["gumbel"].shape == (3, 3, 50) and not out["gumbel"][0].any()
    assert torch.equal(out["gumbel"][1], out["gumbel"][2])  # same seed, same noise: it comes from the generator
    assert torch.allclose(out["inv_temp"], torch.tensor([1.0, 2.0, 0.5]))
    # one Gumbel-max draw per step: the empirical law of argmax(logp / T + g) over many rows is softmax(logp / T)
    logp = torch.tensor([0.0, -0.5, -1.0, -3.0]).log_softmax(-1)
    gen = torch.Generator().manual_seed(0)
    draws = gumbel_inputs([SamplingParams(temperature=0.7)] * 1, [gen], 40000, 4, "cpu")["gumbel"][0]
    picks = (logp / 0.7 + draws).argmax(-1)
    freq = torch.bincount(picks, minlength=4).float() / len(picks)
    assert (freq - (logp / 0.7).softmax(-1)).abs().sum() / 2 < 0.01


def test_draft_probabilities_of_ids_sharing_a_target_id_add_up():
    """Over the target vocabulary a target id's draft probability is the mass of every draft id mapped to it
    (load_eagle3 refuses such a d2t; index_copy_ kept one of the two masses, so verification divided by the
    wrong q and the emitted law was not the target's)."""
    target_ids = torch.tensor([0, 1, 1])  # d2t [0, 0, -1]: draft ids 1 and 2 both propose target id 1
    q = chain_draft_probs(torch.tensor([[0.2, 0.4, 0.4]]).log(), 1.0, target_ids, 3)
    assert torch.allclose(q, torch.tensor([[0.2, 0.8, 0.0]]))
