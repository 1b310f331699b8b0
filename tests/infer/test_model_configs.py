"""Config variants real checkpoints use, each against transformers' own model loaded from the same folder:
the logits and aux hidden states match (fp32, <= 1e-4), or the config is refused with an error naming the key.
RoPE in both spellings (5.x rope_parameters, 4.x rope_scaling + rope_theta) and at positions past
original_max_position_embeddings; biases, head_dim, tied embeddings, sliding windows, sharded / bf16 files."""
import copy
import json

import pytest
import torch

from toolkit.infer.config import ConfigError, ModelConfig
from toolkit.infer.loading import load_target

TINY = dict(vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)
HALF = 16 // 2  # rotary frequencies of TINY's head_dim
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
LONGROPE = {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 64,
            "short_factor": [1.0 + 0.3 * i for i in range(HALF)], "long_factor": [1.0 + 2 * i for i in range(HALF)]}


def hf_folder(kind, folder, edit=None, **extra):
    """A tiny random transformers model of `kind` saved to `folder`, its config.json then edited by `edit`."""
    import transformers

    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[kind]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cls(**{**TINY, **extra}), dtype=torch.float32)
    with torch.no_grad():  # random norms and biases, so a swapped or skipped one shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_(1.0 if "norm" in name else 0.0, 0.2)
    model.save_pretrained(folder)
    if edit is not None:
        path = folder / "config.json"
        cfg = json.loads(path.read_text())
        edit(cfg)
        path.write_text(json.dumps(cfg))
    return folder


def assert_matches(folder, start=0, T=24):
    """Ours == transformers (from the same folder) at positions start .. start + T - 1."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ours = load_target(folder)
    ids = torch.randint(0, TINY["vocab_size"], (2, T), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(start, start + T).expand(2, T)
    with torch.no_grad():
        out = ref(ids, position_ids=positions, output_hidden_states=True)
        logits, hidden = ours(ids, positions=positions, aux_layers=[0, 1])
    assert (logits - out.logits).abs().max() <= 1e-4
    for layer, h in zip([0, 1], hidden):  # the last layer's is normed in hidden_states
        assert (h - out.hidden_states[layer + 1]).abs().max() <= 1e-4, layer
    return ours


def spelled_4x(cfg):
    """transformers 4.x's spelling: top-level rope_theta, rope_scaling (null for plain RoPE)."""
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = None if rope == {"rope_type": "default"} else rope


ROPES = {"linear": {"rope_type": "linear", "factor": 2.0}, "dynamic": {"rope_type": "dynamic", "factor": 2.0},
         "yarn": YARN, "yarn+attention_factor": {**YARN, "attention_factor": 0.8},
         "yarn+mscale": {**YARN, "mscale": 0.9, "mscale_all_dim": 0.7},
         "yarn+betas,no truncate": {**YARN, "beta_fast": 16, "beta_slow": 2, "truncate": False},
         "llama3": LLAMA3, "longrope": LONGROPE, "theta 5e5": {"rope_type": "default", "rope_theta": 5e5}}
FIXED = ("linear", "yarn", "yarn+attention_factor", "yarn+mscale", "yarn+betas,no truncate", "llama3", "theta 5e5")


@pytest.mark.parametrize("spelling", ["5.x", "4.x"])
@pytest.mark.parametrize("rope", sorted(ROPES))
def test_every_rope_type_matches_in_both_spellings(rope, spelling, tmp_path):
    """Fixed-frequency types also far past original_max_position_embeddings (64) up to max_position_embeddings;
    dynamic and longrope up to where transformers starts recomputing its frequencies."""
    hf_folder("llama", tmp_path, spelled_4x if spelling == "4.x" else None, rope_parameters=dict(ROPES[rope]))
    assert_matches(tmp_path, start=0)
    assert_matches(tmp_path, start=232 if rope in FIXED + ("dynamic",) else 40)


@pytest.mark.parametrize("rope, limit, why", [
    (ROPES["dynamic"], 256, "max_position_embeddings 256 of the model's dynamic rope scaling"),
    (LONGROPE, 64, "original_max_position_embeddings 64 of the model's longrope scaling")])
def test_length_dependent_ropes_refuse_what_they_cannot_match(rope, limit, why, tmp_path):
    """transformers recomputes dynamic's and longrope's frequencies from the longest position of a forward;
    past that length ours would silently differ, so a longer sequence or engine context is refused."""
    from toolkit.infer.engine import Engine

    hf_folder("qwen2", tmp_path, rope_parameters=dict(rope))
    model = assert_matches(tmp_path, start=limit - 24)  # the last positions that still match
    with pytest.raises(ConfigError, match=f"a sequence of {limit + 1} tokens exceeds {why}"):
        model(torch.zeros(1, limit + 1, dtype=torch.long))
    with pytest.raises(ConfigError, match=f"max_len {limit + 1} exceeds {why}.*use --max-len <= {limit}"):
        model.config.check_max_len(limit + 1)
    assert Engine(model, max_len=None, max_batch=1).max_len == limit  # the default context stops there


def _both_spellings(cfg):  # a stale 4.x key beside the 5.x one
    cfg["rope_scaling"] = {"type": "linear", "factor": 2.0}
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    cfg["rope_theta"] = 3e5


def _without_original(rope):
    def edit(cfg):
        cfg["rope_parameters"] = {k: v for k, v in rope.items() if k != "original_max_position_embeddings"}
    return edit


def _yarn_null_factor(cfg):
    del cfg["max_position_embeddings"]  # LlamaConfig's default 2048: factor 2048 / 64
    cfg["rope_parameters"] = {**YARN, "factor": None, "rope_theta": 1e4}


@pytest.mark.parametrize("extra, edit", [
    ({}, _both_spellings),  # 4.x rope_scaling wins, with the top-level theta
    ({}, _without_original(LLAMA3)), ({}, _without_original(YARN)),  # max_position_embeddings stands in
    ({"rope_parameters": dict(YARN)}, lambda cfg: cfg.update(original_max_position_embeddings=2)),  # wins
    ({}, _yarn_null_factor)], ids=["both spellings", "llama3 no original", "yarn no original",
                                   "top-level original", "yarn null factor, no max_position_embeddings"])
def test_rope_resolved_as_transformers_resolves_it(extra, edit, tmp_path):
    assert_matches(hf_folder("llama", tmp_path, edit, **extra))


@pytest.mark.parametrize("kind, extra, key, value", [
    ("qwen3", {"head_dim": 128}, "head_dim", 128),  # Qwen3Config's, not hidden_size // heads
    ("mistral", {"num_attention_heads": 16, "num_key_value_heads": 8, "sliding_window": None},
     "num_key_value_heads", 8)])  # MistralConfig's, not the query heads
def test_absent_keys_take_the_config_class_defaults(kind, extra, key, value, tmp_path):
    assert_matches(hf_folder(kind, tmp_path, lambda cfg: cfg.pop(key), **extra))
    assert getattr(ModelConfig.from_folder(tmp_path), {"num_key_value_heads": "num_kv_heads"}.get(key, key)) == value


@pytest.mark.parametrize("kind, extra, edit", [
    ("llama", {"attention_bias": True}, None), ("qwen3", {"attention_bias": True, "head_dim": 24}, None),
    ("mistral", {"head_dim": 24, "sliding_window": None}, None),  # Mistral-Nemo: head_dim != hidden / heads
    ("qwen2", {"head_dim": 24}, None), ("llama", {"rms_norm_eps": 1e-2}, None),
    ("llama", {"hidden_act": "swish"}, None),  # ACT2FN's SiLU too
    # keys their transformers modeling ignores: Qwen2 keeps q/k/v biases only, Mistral none
    ("qwen2", {}, lambda cfg: cfg.update(attention_bias=True)),
    ("mistral", {"sliding_window": None}, lambda cfg: cfg.update(attention_bias=True)),
    ("llama", {}, lambda cfg: cfg.update(partial_rotary_factor=0.5)),  # ignored by its default RoPE
    ("llama", {"rms_norm_eps": 1e-6}, lambda cfg: cfg.pop("rms_norm_eps"))])
def test_biases_head_dims_and_norms_match(kind, extra, edit, tmp_path):
    assert_matches(hf_folder(kind, tmp_path, edit, **extra))


@pytest.mark.parametrize("key, value, message", [
    ("hidden_act", "gelu", r"hidden_act 'gelu' is not supported; accepted: \('silu', 'swish'\)"),
    ("mlp_bias", True, "mlp_bias true .* is not supported; accepted: false"),
    ("quantization_config", {"quant_method": "gptq"}, r"quantization_config: gptq\) is not supported"),
    ("rope_parameters", {"rope_type": "yarn", "factor": 2.0, "partial_rotary_factor": 0.5},
     "partial_rotary_factor 0.5 with rope type 'yarn'"),
    ("rope_parameters", {"rope_type": "proportional"}, "rope type 'proportional' is not supported; accepted"),
    ("rope_parameters", {**LONGROPE, "short_factor": [1.0] * 3}, "longrope short_factor has 3 entries")])
def test_keys_that_change_the_math_and_are_not_implemented_are_refused_by_name(key, value, message):
    cfg = {"model_type": "llama", **TINY, key: value}
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_hf(cfg)


@pytest.mark.parametrize("drop, change, message", [
    ("num_attention_heads", {}, "no num_attention_heads \\(a llama model's shape; accepted: positive integers\\)"),
    (None, {"num_attention_heads": "nine"}, "num_attention_heads 'nine': expected a positive integer"),
    (None, {"hidden_size": 0}, "hidden_size 0: expected a positive integer"),
    (None, {"intermediate_size": 1.5}, "intermediate_size 1.5: expected a positive integer"),
    ("intermediate_size", {}, "no intermediate_size \\(a llama model's shape")])
def test_a_shape_key_absent_or_of_another_type_is_named(drop, change, message, tmp_path):
    """Once a KeyError ('num_attention_heads') or a TypeError ('<=' between str and int) from deep in the build,
    for a target or a draft folder alike; the folder's config.json is named."""
    from toolkit.infer.drafts import load_eagle3

    cfg = {"model_type": "llama", **TINY, **change}
    cfg.pop(drop, None)
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_hf(cfg)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLMEagle3"]}))
    with pytest.raises(ConfigError, match=f"{tmp_path / 'config.json'}: {message}"):
        ModelConfig.from_folder(tmp_path)
    target = ModelConfig.from_hf({"model_type": "llama", **TINY})
    with pytest.raises(ConfigError, match=f"draft {tmp_path}/config.json: {message}"):
        load_eagle3(tmp_path, target)


@pytest.mark.parametrize("kind, extra", [
    ("mistral", {"sliding_window": 8}),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1})])
def test_a_sequence_longer_than_the_sliding_window_attends_within_it(kind, extra, tmp_path):
    """Without a KV cache (training, evaluation): 3x the window, each sliding layer's query sees its last 8
    positions (Qwen2 with max_window_layers 1: layer 0 attends over everything, as transformers)."""
    hf_folder(kind, tmp_path, **extra)
    model = assert_matches(tmp_path, T=24)
    assert model.config.full_layers == ((0,) if kind == "qwen2" else ())


def test_qwen2_window_is_ignored_without_use_sliding_window(tmp_path):
    assert_matches(hf_folder("qwen2", tmp_path, use_sliding_window=False, sliding_window=8), T=24)


def _rewrite(folder, change):
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    change(weights)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("change", ["no lm_head", "a different lm_head", "lm_head only"])
def test_tied_embeddings_follow_what_the_checkpoint_holds(change, tmp_path):
    """transformers 5 ties a tie_word_embeddings model to whichever matrix the file holds, and keeps both
    when it holds two that differ (the config is then wrong)."""
    def edit(w):
        if change == "no lm_head":
            w.pop("lm_head.weight", None)
        elif change == "a different lm_head":
            w["lm_head.weight"] = torch.randn_like(w["model.embed_tokens.weight"])
        else:
            w["lm_head.weight"] = w.pop("model.embed_tokens.weight")

    _rewrite(hf_folder("llama", tmp_path, tie_word_embeddings=True), edit)
    ours = assert_matches(tmp_path)
    assert ours.config.tie_word_embeddings == (change != "a different lm_head")
    # training reads the target's embedding and lm_head for the head's input and readout: the same two matrices
    from toolkit.train.head import target_tensors

    parts = target_tensors(tmp_path, ["embed_tokens.weight", "lm_head.weight"])
    assert torch.equal(parts["embed_tokens.weight"], ours.embed_tokens.weight.detach())
    assert torch.equal(parts["lm_head.weight"], ours.lm_head.weight.detach())


def test_untied_model_without_lm_head_is_refused(tmp_path):
    _rewrite(hf_folder("llama", tmp_path), lambda w: w.pop("lm_head.weight"))
    with pytest.raises(ValueError, match=r"missing \['lm_head.weight'\]"):
        load_target(tmp_path)


def test_sharded_bf16_checkpoint_beside_consolidated_safetensors(tmp_path):
    """Mistral's repositories ship consolidated.safetensors (their own names) beside the HF shards: only the
    files model.safetensors.index.json lists are the model, as transformers reads it. bf16 loads to fp32."""
    import transformers
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    cfg = transformers.MistralConfig(**TINY, sliding_window=None)
    transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(
        tmp_path, max_shard_size="40KB")
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    save_file({"layers.0.attention.wq.weight": torch.zeros(64, 64)}, str(tmp_path / "consolidated.safetensors"))
    shard = sorted(tmp_path.glob("model-*.safetensors"))[0]
    assert all(w.dtype == torch.bfloat16 for w in load_file(str(shard)).values())
    assert_matches(tmp_path)


def test_deepseek_softmax_scale_follows_transformers_for_any_scaled_rope():
    """transformers' DeepSeek-V3 multiplies the softmax scale by mscale(factor, mscale_all_dim)^2 whenever
    the rope type is not default (yarn_apply_mscale), not only under yarn."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4,
                num_experts_per_tok=2, n_group=2, topk_group=1, kv_lora_rank=8, q_lora_rank=None,
                qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, max_position_embeddings=512)
    for rope in ({"rope_type": "linear", "factor": 4.0, "mscale_all_dim": 0.7},
                 {**YARN, "mscale": 1.0, "mscale_all_dim": 1.0}, {"rope_type": "default"}):
        cfg = DeepseekV3Config(**base, rope_parameters={**rope, "rope_theta": 1e4})
        ours = ModelConfig.from_hf(cfg.to_dict())
        assert ours.softmax_mscale() * (8 + 4) ** -0.5 == pytest.approx(DeepseekV3Attention(cfg, 0).scaling)


@pytest.mark.parametrize("names", ["hub", "transformers5"])
def test_a_multimodal_mistral3_checkpoint_loads_its_text_model(names, tmp_path):
    """Mistral 3 (Mistral-Small-3.1): model_type mistral3, the Mistral text config in text_config, the text weights
    under language_model.model. / language_model.lm_head. (the hub's) or model.language_model. / lm_head.
    (transformers 5's), a vision tower and projector beside them that are not loaded."""
    from safetensors.torch import load_file, save_file

    hf_folder("mistral", tmp_path / "text")
    text = json.loads((tmp_path / "text" / "config.json").read_text())
    (tmp_path / "mm").mkdir()
    (tmp_path / "mm" / "config.json").write_text(json.dumps({
        "model_type": "mistral3", "architectures": ["Mistral3ForConditionalGeneration"], "text_config": text,
        "vision_config": {"model_type": "pixtral"}}))
    prefix = {"hub": ("language_model.model.", "language_model."), "transformers5": ("model.language_model.", "")}
    inner, head = prefix[names]
    vision = "vision_tower." if names == "hub" else "model.vision_tower."
    w = {(head + k if k.startswith("lm_head.") else inner + k.removeprefix("model.")): v
         for k, v in load_file(str(tmp_path / "text" / "model.safetensors")).items()}
    w[vision + "patch_conv.weight"] = torch.zeros(4, 3, 2, 2)
    w[vision.replace("vision_tower", "multi_modal_projector") + "linear_1.weight"] = torch.zeros(4, 4)
    save_file(w, str(tmp_path / "mm" / "model.safetensors"))
    ids = torch.tensor([[5, 17, 33, 8, 61, 7, 22]])
    with torch.no_grad():
        assert torch.equal(load_target(tmp_path / "mm")(ids)[0], load_target(tmp_path / "text")(ids)[0])


MOE_TINY = dict(vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=4, max_position_embeddings=256, moe_intermediate_size=32, num_experts_per_tok=2)


@pytest.mark.parametrize("cls, sizes, absent", [
    ("MixtralConfig", dict(num_local_experts=4), ["rope_theta", "rope_parameters"]),
    ("DeepseekV3Config", dict(n_routed_experts=16, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
                              qk_nope_head_dim=8, v_head_dim=16, num_key_value_heads=4),
     ["n_group", "topk_group", "routed_scaling_factor", "n_shared_experts", "first_k_dense_replace"]),
    ("Glm4MoeConfig", dict(n_routed_experts=8), ["n_shared_experts", "first_k_dense_replace"]),
    ("Phi3Config", dict(rope_parameters={**LONGROPE, "rope_theta": 1e4}), ["original_max_position_embeddings"])])
def test_absent_routing_and_rope_keys_take_the_config_class_defaults(cls, sizes, absent):
    """The engine's own defaults (theta 1e4, one routing group, no scaling, no shared expert, no dense layers) loaded
    such configs without a word and computed other logits; Phi-3's class attribute overrides the rope dict's."""
    import transformers

    cfg = {**{k: v for k, v in MOE_TINY.items() if cls != "Phi3Config" or "moe" not in k and "experts" not in k},
           **sizes, "model_type": getattr(transformers, cls).model_type}
    if cls == "DeepseekV3Config":
        cfg.update(n_routed_experts=16, num_experts_per_tok=2)
    cfg = {k: v for k, v in cfg.items() if k not in absent}
    ref = getattr(transformers, cls)(**copy.deepcopy(cfg))  # fills in what is absent (its rope dict in place)
    ours = ModelConfig.from_hf(cfg)
    rope = ref.rope_parameters
    assert ours.rope_theta == rope["rope_theta"]
    if ours.moe is not None and cls != "MixtralConfig":
        m = ours.moe
        assert (m.n_group, m.topk_group, m.routed_scaling_factor) == (
            getattr(ref, "n_group", 1), getattr(ref, "topk_group", 1), ref.routed_scaling_factor)
        assert m.shared_size == ref.moe_intermediate_size * ref.n_shared_experts
        assert m.dense_layers == tuple(range(ref.first_k_dense_replace))
    if cls == "Phi3Config":
        assert ours.rope_scaling["original_max_position_embeddings"] == rope["original_max_position_embeddings"] \
            == 4096


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
def test_null_key_value_heads_are_one_per_query_head(kind):
    """transformers reads num_key_value_heads null as num_attention_heads; the family default (Qwen2's 32) was taken
    and the config refused as 4 heads not a multiple of 32."""
    assert ModelConfig.from_hf({**TINY, "model_type": kind, "num_key_value_heads": None}).num_kv_heads == 4
