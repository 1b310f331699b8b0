"""Gemma 2 / Gemma 3 targets in the engine, against transformers on tiny random configs: logits and hidden states
match (scaled embedding, (1 + w) sandwich norms, GELU, query_pre_attn_scalar, soft-caps, sliding layers with
Gemma 3's own RoPE base, linear-scaled full layers), greedy decoding past the window equals transformers' generate
plain and with an EAGLE-3 draft (chain, tree, CUDA-graph buckets run eagerly); a multimodal Gemma 3 checkpoint
loads its text model; both config spellings read alike; what the engine cannot run on them is refused by name."""
import json

import pytest
import torch
from hf_reference import assert_forward_matches, assert_greedy_matches
from safetensors.torch import load_file, save_file

from toolkit.infer.config import ConfigError, ModelConfig
from toolkit.infer.drafts import random_head
from toolkit.infer.engine import Engine
from toolkit.infer.graphs import eager_capture
from toolkit.infer.loading import load_target
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig

V, W = 173, 8
BASE = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=0,
            sliding_window=W, query_pre_attn_scalar=24)
VARIANTS = {
    # every other layer slides; scores and logits soft-capped (small caps, so random weights reach them)
    "gemma2": ("Gemma2Config", dict(num_hidden_layers=4, attn_logit_softcapping=4.0, final_logit_softcapping=3.0)),
    # layers 0, 1 slide with base 10,000, layer 2 attends fully with base 1e6 scaled linearly by 8; q/k norms
    "gemma3": ("Gemma3TextConfig", dict(num_hidden_layers=6, sliding_window_pattern=3, rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}})),
}
PROMPTS = [[5, 17, 33, 8, 61, 7, 22, 40, 11, 3, 9, 70], [9, 4, 30]]


def tiny_gemma(case: str):
    """A random transformers model of VARIANTS[case] (seed 0) with norms away from 0 and a peaked readout."""
    import transformers

    cls, extra = VARIANTS[case]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**BASE, **extra),
                                                          dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)  # Gemma's norms scale by (1 + w)
        model.model.embed_tokens.weight.normal_(0.0, 0.2)  # tied: the readout too
    return model


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def gemma(request, tmp_path_factory):
    """(case, folder, transformers model): tiny_gemma(case), saved."""
    model = tiny_gemma(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    return request.param, folder, model


def test_the_config_reads_what_transformers_reads(gemma):
    case, folder, _ = gemma
    c = ModelConfig.from_folder(folder)
    g = c.gemma
    assert g.query_pre_attn_scalar == 24 and g.activation == "gelu_pytorch_tanh" and c.tie_word_embeddings
    assert c.sliding_window == W
    if case == "gemma2":
        assert (g.attn_softcap, g.final_softcap, g.local_rope_theta) == (4.0, 3.0, None)
        assert c.full_layers == (1, 3) and not c.qk_norm and c.rope_theta == 10000.0
    else:
        assert (g.attn_softcap, g.final_softcap) == (None, None) and c.qk_norm
        assert c.full_layers == (2, 5) and g.local_layers == (0, 1, 3, 4)
        assert c.rope_theta == 1e6 and c.rope_scaling == {"rope_type": "linear", "factor": 8.0}
        assert g.local_rope_theta == 10000.0


def test_logits_and_hidden_states_match_transformers_past_the_window(gemma):
    _, folder, hf = gemma
    ours = load_target(folder)
    assert_forward_matches(ours, hf, 3 * W + 5, [0, 1, 2, -1])


def test_greedy_decoding_equals_generate_and_eagle3_drafts_are_lossless(gemma):
    _, folder, hf = gemma
    target = load_target(folder)
    head, want = assert_greedy_matches(target, hf, 20, trees=(TreeConfig(3, 1, 4), TreeConfig(3, 3, 8)),
                                       prompts=PROMPTS)
    graphed = Engine(target, head, TreeConfig(3, 3, 8), max_len=64, max_batch=2, cuda_graphs=True,
                     graph_capture=eager_capture)
    got = graphed.generate_batch(PROMPTS, SamplingParams(max_new_tokens=20), stop_ids={1})
    assert [r.tokens for r in got] == want


def test_an_eagle3_head_of_a_gemma_target_is_a_plain_llama_layer_of_the_full_layers_rope(gemma, tmp_path):
    """The draft attends as Llama does (head_dim^-0.5, no caps, x * w norms) with the full-attention layers' RoPE,
    written in both spellings, and reads back the same."""
    from toolkit.infer.drafts import load_eagle3, save_eagle3

    case, folder, _ = gemma
    target = load_target(folder)
    head = random_head(target.config, list(range(0, V, 2)))
    assert head.config.gemma is None and head.config.model_type == "llama" and not head.config.norm_fp32_product
    hf_cfg = json.loads((folder / "config.json").read_text())
    save_eagle3(head, tmp_path, hf_cfg, str(folder), "0" * 16)
    cfg = json.loads((tmp_path / "config.json").read_text())
    theta = 10000.0 if case == "gemma2" else 1e6
    assert cfg["rope_theta"] == theta and cfg["rope_parameters"]["rope_theta"] == theta
    if case == "gemma3":
        assert cfg["rope_scaling"] == {"rope_type": "linear", "factor": 8.0}
    back = load_eagle3(tmp_path, target.config)
    assert torch.equal(back.inv_freq, head.inv_freq) and torch.equal(head.inv_freq, target.inv_freq)


@pytest.mark.parametrize("gemma", ["gemma3"], indirect=True)
def test_a_multimodal_gemma3_checkpoint_loads_its_text_model(gemma, tmp_path):
    """model_type gemma3: the text config nested, the text weights under language_model.model. (the hub's names),
    a vision tower beside them that is not loaded."""
    _, folder, _ = gemma
    text = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": {**text, "model_type": "gemma3_text"}, "vision_config": {"model_type": "siglip_vision_model"}}))
    w = {("language_model." + k if k.startswith("model.") else k): v
         for k, v in load_file(str(folder / "model.safetensors")).items()}
    w["vision_tower.vision_model.embeddings.patch_embedding.weight"] = torch.zeros(4, 3, 2, 2)
    w["multi_modal_projector.mm_input_projection_weight"] = torch.zeros(4, 64)
    save_file(w, str(tmp_path / "model.safetensors"))
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        assert torch.equal(load_target(tmp_path)(ids)[0], load_target(folder)(ids)[0])


def test_gemma3_configs_of_transformers_4_read_as_5s():
    """4.x: rope_theta / rope_scaling (the full layers') / rope_local_base_freq / sliding_window_pattern; 5.x:
    per-layer-type rope_parameters and layer_types."""
    base = {**BASE, "model_type": "gemma3_text", "num_hidden_layers": 6}
    old = ModelConfig.from_hf({**base, "rope_theta": 1e6, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                               "rope_local_base_freq": 10000.0, "sliding_window_pattern": 3})
    new = ModelConfig.from_hf({**base, "layer_types": ["sliding_attention"] * 2 + ["full_attention"] +
                               ["sliding_attention"] * 2 + ["full_attention"], "rope_parameters": VARIANTS["gemma3"][1][
                                   "rope_parameters"]})
    assert old == new
    assert torch.equal(old.inv_freq(), new.inv_freq()) and torch.equal(old.local_inv_freq(), new.local_inv_freq())
    default = ModelConfig.from_hf({**base, "sliding_window": 4096})  # defaults: theta 1e6 / 1e4, pattern 6
    assert default.rope_theta == 1e6 and default.gemma.local_rope_theta == 1e4 and default.sliding_window == 4096
    assert default.gemma.local_layers == (0, 1, 2, 3, 4) and default.gemma.query_pre_attn_scalar == 24


def test_embedding_scale_rounds_to_the_weights_dtype_as_transformers():
    from toolkit.infer.gemma import embed_scale

    c = ModelConfig.from_hf({**BASE, "model_type": "gemma3_text", "num_hidden_layers": 2, "hidden_size": 3072})
    one = torch.ones(1, 1, 3072)
    assert embed_scale(c, one.bfloat16())[0, 0, 0].item() == 55.5
    assert embed_scale(c, one)[0, 0, 0].item() == pytest.approx(3072 ** 0.5)


@pytest.mark.parametrize("bad, named", [
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"hidden_activation": "relu"}, "hidden_activation 'relu'"),
    ({"layer_types": ["full_attention"]}, "layer_types"),
    ({"query_pre_attn_scalar": 0}, "query_pre_attn_scalar"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default"},
                          "sliding_attention": {"rope_type": "linear", "factor": 2.0}}}, "sliding layers' rope type"),
])
def test_what_the_engine_cannot_run_is_refused_by_name(bad, named):
    with pytest.raises(ConfigError, match=named):
        ModelConfig.from_hf({**BASE, "model_type": "gemma3_text", "num_hidden_layers": 2, **bad})


def test_the_paths_built_from_llama_pieces_refuse_gemma(gemma):
    from toolkit.infer.compiled_decode import CompiledDecode
    from toolkit.infer.kv_cache import KVCache
    from toolkit.infer.mtp import MTPHead

    _, folder, _ = gemma
    target = load_target(folder)
    with pytest.raises(ValueError, match="compiled decode step .* does not cover gemma"):
        CompiledDecode(target, KVCache(target.config, 1, 16))
    with pytest.raises(ValueError, match="MTP head .* does not cover gemma"):
        MTPHead(target.config, target.lm_head.weight.detach())


def test_auto_kernels_on_a_gpu_pick_torch_for_gemma_and_llama4_and_triton_for_llama():
    """`--kernels auto` (serve's and bench's default) picks the Triton kernels on CUDA only for the layers they cover:
    a Gemma or Llama 4 target would otherwise be refused by default on a GPU."""
    from types import SimpleNamespace

    from toolkit.infer.loading import pick_kernels

    def on_cuda(cfg: dict):
        return SimpleNamespace(config=ModelConfig.from_hf(cfg), embed_tokens=SimpleNamespace(
            weight=SimpleNamespace(is_cuda=True)))

    gemma = {**BASE, "model_type": "gemma3_text", "num_hidden_layers": 2}
    llama4 = {**BASE, "model_type": "llama4_text", "num_hidden_layers": 2}
    llama = {**BASE, "model_type": "llama", "num_hidden_layers": 2}
    assert [pick_kernels("auto", on_cuda(c)) for c in (gemma, llama4, llama)] == ["torch", "torch", "triton"]


def test_graph_padding_leaves_no_nan_in_a_soft_capped_sliding_target(tmp_path):
    """A graph bucket larger than the batch: its padding rows / tokens once kept a larger call's positions, past a
    2-slot window's reach of slot 0 they attend, so Gemma 2's explicit softmax saw a row of -inf only (NaN), wrote NaN
    k / v to the scratch slot, and the next call's logits were NaN. Now padding sits at position 0, and a row that
    sees nothing weighs nothing."""
    import transformers

    from toolkit.infer.graphs import eager_capture, graph_target
    from toolkit.infer.kv_cache import KVCache

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.Gemma2Config(**{
        **BASE, "num_hidden_layers": 2, "sliding_window": 2}), dtype=torch.float32)
    model.save_pretrained(tmp_path)
    target = load_target(tmp_path)
    cache = KVCache(target.config, 2, 32)
    graphed = graph_target(target, cache, [], [2], [2], capture=eager_capture)

    def call(B, pos):
        positions = torch.tensor([[pos, pos + 1]] * B)
        mask = torch.arange(pos + 2)[None, None, :] <= positions[:, :, None]
        return graphed(tokens=torch.full((B, 2), 5), positions=positions, slots=positions, mask=mask)[0]

    for B, pos in ((2, 20), (1, 22), (2, 24)):
        assert torch.isfinite(call(B, pos)).all(), (B, pos)
    assert torch.isfinite(cache.k).all() and torch.isfinite(cache.v).all()
    q = torch.randn(1, 2, 1, 4)
    none = torch.full((1, 1, 1, 3), float("-inf"))
    from toolkit.infer.attention import eager_attention

    assert torch.equal(eager_attention(q, torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), none, softcap=5.0),
                       torch.zeros(1, 2, 1, 4))


def test_a_multimodal_text_config_of_a_few_keys_takes_the_config_class_defaults():
    """gemma-3-4b-it's config.json: its text_config names six keys (save_pretrained leaves out the defaults), its
    rope_scaling in 4.x's old spelling ("type"); a quantization_config at the top level is still read."""
    hub = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "text_config": {
        "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "type": "linear"}, "sliding_window": 1024}}
    c = ModelConfig.from_hf(hub)
    assert (c.vocab_size, c.num_heads, c.num_kv_heads, c.head_dim) == (262208, 8, 4, 256)
    assert c.rope_theta == 1e6 and c.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert c.gemma.local_rope_theta == 1e4 and c.gemma.query_pre_attn_scalar == 256 and c.tie_word_embeddings
    assert c.sliding_window == 1024 and c.full_layers == tuple(range(5, 34, 6))
    with pytest.raises(ConfigError, match=r"quantization_config: awq\) is not supported"):
        ModelConfig.from_hf({**hub, "quantization_config": {"quant_method": "awq"}})
    llama4 = ModelConfig.from_hf({"model_type": "llama4", "text_config": {"model_type": "llama4_text"}})
    assert (llama4.vocab_size, llama4.num_layers, llama4.rope_theta) == (202048, 48, 500000.0)
