"""MTP draft modules: the forward against a transformers reference, the native MiMo and DeepSeek-V3 layouts
(every weight mapped, none left random), our export round trip, and lossless greedy decoding in the engine."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from toolkit.infer.config import ModelConfig
from toolkit.infer.engine import Engine
from toolkit.infer.draft_folder import load_draft
from toolkit.infer.loading import load_target
from toolkit.infer.model import Transformer
from toolkit.infer.mtp import MTPHead, load_mtp, save_mtp
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig

H, I, HEADS, KV, V, LAYERS = 32, 48, 4, 2, 96, 3


def hf_config(model_type="llama", **extra):
    return {"architectures": ["LlamaForCausalLM"], "model_type": model_type, "vocab_size": V, "hidden_size": H,
            "intermediate_size": I, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "num_key_value_heads": KV, "head_dim": H // HEADS, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "max_position_embeddings": 256,
            "tie_word_embeddings": False, "eos_token_id": 2, **extra}


def random_mtp(c: ModelConfig, seed=0) -> tuple[MTPHead, torch.Tensor]:
    torch.manual_seed(seed)
    lm_head = torch.randn(c.vocab_size, c.hidden_size)
    head = MTPHead(c, lm_head)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name != "lm_head.weight":
                base = 1.0 if p.dim() == 1 and "norm" in name else 0.0
                p.copy_(torch.randn_like(p) * (0.2 if p.dim() > 1 else 0.1) + base)
    return head.eval(), lm_head


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_forward_matches_a_transformers_reference(family):
    """eh_proj(cat[enorm(emb), hnorm(h)]) -> the target's own decoder layer (transformers') -> shared_head.norm
    -> lm_head, over a whole causal sequence."""
    import transformers

    c = ModelConfig.from_hf(hf_config(family))
    head, lm_head = random_mtp(c)
    T = 7
    g = torch.Generator().manual_seed(1)
    emb, hid = torch.randn(1, T, H, generator=g), torch.randn(1, T, H, generator=g)
    pos = torch.arange(T)[None]
    logp, out = head(emb, hid, pos, head.new_cache(16))

    kind = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[family]
    cfg = getattr(transformers, f"{kind}Config")(**{k: v for k, v in hf_config(family).items()
                                                    if k not in ("architectures", "model_type")})
    cfg._attn_implementation = "eager"
    import importlib

    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    layer = getattr(modeling, f"{kind}DecoderLayer")(cfg, 0)
    layer.load_state_dict({k.removeprefix("block."): v for k, v in head.state_dict().items()
                           if k.startswith("block.")})
    rope = getattr(modeling, f"{kind}RotaryEmbedding")(cfg)

    def rms(x, w):
        return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    with torch.no_grad():
        x = torch.cat([rms(emb, head.enorm.weight), rms(hid, head.hnorm.weight)], -1) @ head.eh_proj.weight.T
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        y = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=rope(x, pos))
        y = y[0] if isinstance(y, tuple) else y
        want_out = rms(y, head.shared_head.norm.weight)
        want = (want_out @ lm_head.T).log_softmax(-1)
    assert (out - want_out).abs().max() < 1e-4
    assert (logp - want).abs().max() < 1e-4


def test_the_engine_feeds_a_zero_embedding_at_position_0_as_vllm_and_sglang_mimo_serve_it():
    """vLLM's DeepSeek / MiMo MTP and SGLang's MiMoMTP zero the token embedding paired with position 0; the
    engine's prefill does the same (the draft steps after it never see position 0)."""
    from toolkit.infer.sequence import Sequence

    c = ModelConfig.from_hf(hf_config())
    torch.manual_seed(5)
    target = Transformer(c).eval()
    head, _ = random_mtp(c)
    head.lm_head.weight.data = target.lm_head.weight.detach().clone()
    prompt = [5, 17, 33, 8]
    seq = Sequence(prompt, SamplingParams(max_new_tokens=4))
    engine = Engine(target, head, TreeConfig(2, 1, 3), max_len=64)
    engine.admit([seq])
    with torch.no_grad():
        _, hidden = target(torch.tensor([prompt]), aux_layers=head.aux_layers)
        pairs = torch.tensor([prompt[1:] + [seq.result.tokens[0]]])
        emb = target.embed_tokens(pairs)
        blank = emb.clone()
        blank[:, 0] = 0
        want = head(blank, hidden[0], torch.arange(4)[None], head.new_cache(16))[0][0, -1]
        read = head(emb, hidden[0], torch.arange(4)[None], head.new_cache(16))[0][0, -1]
    assert torch.allclose(seq.root_logp, want, atol=1e-5)
    assert (read - want).abs().max() > 1e-4  # position 0's embedding does reach the root's prediction


def test_the_agreement_probe_feeds_position_0_a_zero_embedding_as_served():
    """The load-time probe (draft_checks.agreement) measures the function training and the engine serve: an MTP
    head's pair at position 0 reads a zero embedding there too."""
    from toolkit.infer.draft_checks import agreement

    c = ModelConfig.from_hf(hf_config())
    torch.manual_seed(5)
    target = Transformer(c).eval()
    head, _ = random_mtp(c)
    seen = []
    head.register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    agreement(head, target, [5, 17, 33, 8, 61, 9])
    assert not seen[0][0, 0].any() and seen[0][0, 1:].abs().sum(-1).gt(0).all()


def write_native(folder, layout: str, n_mtp: int = 2, drop: str | None = None, extra: str | None = None):
    """A tiny target that ships MTP layers: MiMo (Qwen2 body, model.mtp_layers.{i}.*) or DeepSeek-V3-style
    (num_nextn_predict_layers, model.layers.{L + i}.*) over a Llama body. Returns (config, raw weights)."""
    cfg = hf_config("mimo" if layout == "mimo" else "llama", num_nextn_predict_layers=n_mtp)
    cfg["architectures"] = ["MiMoForCausalLM" if layout == "mimo" else "LlamaForCausalLM"]
    torch.manual_seed(3)
    body = Transformer(ModelConfig.from_hf(cfg))
    w = {("" if k == "lm_head.weight" else "model.") + k: v.detach().clone() for k, v in body.state_dict().items()}
    g = torch.Generator().manual_seed(4)
    block = {k: torch.randn(v.shape, generator=g) * 0.2 for k, v in body.layers[0].state_dict().items()}
    for i in range(n_mtp):
        if layout == "mimo":
            p = f"model.mtp_layers.{i}."
            special = {"token_layernorm.weight": [H], "hidden_layernorm.weight": [H], "input_proj.weight": [H, 2 * H],
                       "final_layernorm.weight": [H]}
        else:
            p = f"model.layers.{LAYERS + i}."
            special = {"enorm.weight": [H], "hnorm.weight": [H], "eh_proj.weight": [H, 2 * H],
                       "shared_head.norm.weight": [H], "shared_head.head.weight": [V, H], "embed_tokens.weight": [V, H]}
        for k, shape in special.items():
            w[p + k] = torch.randn(*shape, generator=g) * 0.2 + (1 if k.endswith("norm.weight") else 0)
        for k, v in block.items():
            w[p + k] = v + i
    if drop:
        w.pop(drop)
    if extra:
        w[extra] = torch.zeros(3)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in w.items()}, str(folder / "model.safetensors"))
    return cfg, w


@pytest.mark.parametrize("layout", ["mimo", "deepseek"])
def test_native_mtp_layers_map_every_weight(tmp_path, layout):
    _, w = write_native(tmp_path / "t", layout)
    target = load_target(tmp_path / "t")  # the MTP weights are not the target's, and are not refused
    head = load_draft(str(tmp_path / "t"), target, None)
    assert isinstance(head, MTPHead) and head.aux_layers == [-1]
    p = "model.mtp_layers.0." if layout == "mimo" else f"model.layers.{LAYERS}."
    names = ({"enorm": "token_layernorm", "hnorm": "hidden_layernorm", "shared_head.norm": "final_layernorm"}
             if layout == "mimo" else {"enorm": "enorm", "hnorm": "hnorm", "shared_head.norm": "shared_head.norm"})
    for ours, theirs in names.items():
        assert torch.equal(head.get_submodule(ours).weight, w[p + theirs + ".weight"])
    proj = w[p + ("input_proj" if layout == "mimo" else "eh_proj") + ".weight"]
    want = torch.cat([proj[:, H:], proj[:, :H]], 1) if layout == "mimo" else proj  # MiMo: [hidden, emb]
    assert torch.equal(head.eh_proj.weight, want)
    for k, v in head.block.state_dict().items():
        assert torch.equal(v, w[p + k]), k
    assert torch.equal(head.lm_head.weight, target.lm_head.weight)  # the target's head, not shared_head.head
    # every weight of the module must come from the file: a missing one is refused by name
    write_native(tmp_path / "m", layout, drop=p + "post_attention_layernorm.weight")
    with pytest.raises(ValueError, match="post_attention_layernorm"):
        load_mtp(tmp_path / "m", load_target(tmp_path / "m"))
    write_native(tmp_path / "x", layout, extra=p + "mystery.weight")
    with pytest.raises(ValueError, match="mystery"):
        load_mtp(tmp_path / "x", load_target(tmp_path / "x"))


@pytest.mark.parametrize("layout", ["mimo", "deepseek"])
def test_a_cached_rotary_inv_freq_in_the_mtp_layer_is_skipped_as_the_target_loader_skips_it(tmp_path, layout):
    """Older transformers saved self_attn.rotary_emb.inv_freq; load_target, SGLang and vLLM skip it (it comes
    from the config), and so does load_mtp."""
    p = "model.mtp_layers.0." if layout == "mimo" else f"model.layers.{LAYERS}."
    write_native(tmp_path / "t", layout, n_mtp=1, extra=p + "self_attn.rotary_emb.inv_freq")
    head = load_mtp(tmp_path / "t", load_target(tmp_path / "t"))
    assert isinstance(head, MTPHead)


@pytest.mark.parametrize("layout", ["mimo", "deepseek"])
def test_the_target_loader_skips_only_the_mtp_layers_its_config_declares(tmp_path, layout):
    """Layers past the body are skipped as MTP layers only when config.json declares them
    (num_nextn_predict_layers) and only as many: a folder with more layers than its config says is refused by
    name rather than loaded as a shorter model."""
    cfg, _ = write_native(tmp_path / "t", layout, n_mtp=2)
    (tmp_path / "t" / "config.json").write_text(json.dumps({**cfg, "num_nextn_predict_layers": 1}))
    extra = "mtp_layers.1." if layout == "mimo" else f"layers.{LAYERS + 1}."
    with pytest.raises(ValueError, match=rf"unexpected \['{extra}"):
        load_target(tmp_path / "t")
    # a plain target (no MTP layers declared) whose config.json counts one layer fewer than its weights hold
    cfg, _ = write_native(tmp_path / "p", "deepseek", n_mtp=0)
    (tmp_path / "p" / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": LAYERS - 1}))
    with pytest.raises(ValueError, match=rf"unexpected \['layers.{LAYERS - 1}."):
        load_target(tmp_path / "p")


def test_a_folder_sglangs_nextn_export_wrote_loads(tmp_path):
    """SGLang's scripts/export_deepseek_nextn.py keeps the MTP layer alone, renumbered model.layers.0.*, with
    num_hidden_layers = num_nextn_predict_layers = 1 (what its NextN loader reads)."""
    cfg, w = write_native(tmp_path / "t", "deepseek", n_mtp=1)
    p = f"model.layers.{LAYERS}."
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "config.json").write_text(json.dumps(
        {**cfg, "architectures": ["DeepseekV3ForCausalLMNextN"], "num_hidden_layers": 1}))
    save_file({"model.layers.0." + k[len(p):]: v.contiguous() for k, v in w.items() if k.startswith(p)},
              str(tmp_path / "x" / "model.safetensors"))
    target = load_target(tmp_path / "t")
    full, alone = load_mtp(tmp_path / "t", target), load_mtp(tmp_path / "x", target)
    assert all(torch.equal(v, alone.state_dict()[k]) for k, v in full.state_dict().items())


def test_a_full_model_with_as_many_mtp_layers_as_body_layers_reads_its_mtp_layers(tmp_path):
    """num_hidden_layers == num_nextn_predict_layers is also what an SGLang NextN export looks like; the MTP
    layers are told by their eh_proj, not by the counts (body layer 0 was read as the MTP layer and refused)."""
    _, w = write_native(tmp_path / "t", "deepseek", n_mtp=LAYERS)
    head = load_mtp(tmp_path / "t", load_target(tmp_path / "t"))
    assert torch.equal(head.eh_proj.weight, w[f"model.layers.{LAYERS}.eh_proj.weight"])
    assert torch.equal(head.block.input_layernorm.weight, w[f"model.layers.{LAYERS}.input_layernorm.weight"])


def test_a_folder_without_mtp_layers_is_refused_clearly(tmp_path):
    write_native(tmp_path / "t", "deepseek", n_mtp=0)
    cfg = json.loads((tmp_path / "t" / "config.json").read_text())
    with pytest.raises(ValueError, match="no MTP weights"):
        load_mtp(tmp_path / "t", load_target(tmp_path / "t"))
    assert cfg["num_nextn_predict_layers"] == 0


def test_a_token_map_past_the_target_vocabulary_is_refused_naming_both(tmp_path):
    from toolkit.tokenmap.maps import save_freq

    write_native(tmp_path / "t", "mimo", n_mtp=1)
    save_freq(tmp_path / "freq.pt", [2, 5, V])
    with pytest.raises(ValueError, match=rf"target id {V} is beyond the target's vocabulary \(config.json "
                                         rf"vocab_size {V}: ids must be in 0..{V - 1}"):
        load_mtp(tmp_path / "t", load_target(tmp_path / "t"), tmp_path / "freq.pt")


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_export_round_trip_in_mimo_layout(tmp_path, family):
    c = ModelConfig.from_hf(hf_config(family))
    head, _ = random_mtp(c)
    torch.manual_seed(0)
    target = Transformer(c)
    head.lm_head.weight = torch.nn.Parameter(target.lm_head.weight.detach().clone(), requires_grad=False)
    # transformers 5's dtype, and an FP8 target's quantization keys, which the bf16 head must not carry
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    save_mtp(head, tmp_path / "d", {**hf_config(family, dtype="float32"), "quantization_config": fp8,
                                    "compression_config": fp8}, "tiny", "fp")
    w = load_file(str(tmp_path / "d" / "model.safetensors"))
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["architectures"] == ["MiMoForCausalLM"] and cfg["toolkit"]["head"] == "mtp"
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"] == 10000.0 and "dtype" not in cfg
    assert not {"quantization_config", "compression_config"} & set(cfg)
    assert {v.dtype for v in w.values()} == {torch.bfloat16}
    assert all(k.startswith("model.mtp_layers.0.") for k in w) and "model.mtp_layers.0.input_proj.weight" in w
    assert "model.mtp_layers.0.self_attn.q_proj.bias" in w  # MiMo's Qwen2 block: zeros for a Llama block
    back = load_draft(str(tmp_path / "d"), target, None)
    emb, hid = torch.randn(1, 5, H), torch.randn(1, 5, H)
    ref = MTPHead(c, target.lm_head.weight.detach())
    ref.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in head.trained_state().items()}, strict=False)
    a, _ = back(emb, hid, torch.arange(5)[None], back.new_cache(8))
    b, _ = ref(emb, hid, torch.arange(5)[None], ref.new_cache(8))
    assert torch.allclose(a, b, atol=1e-5)


def test_an_export_for_a_mimo_target_reads_in_transformers_autoconfig(tmp_path):
    """AutoConfig is SGLang's and vLLM's first read of a draft: MiMo's own config carries model_type "mimo" and an
    auto_map to configuration_mimo.py, which the draft folder lacks; the export is read as Qwen2's config."""
    import transformers

    c = ModelConfig.from_hf(hf_config("qwen2"))
    head, _ = random_mtp(c)
    mimo = {**hf_config("mimo"), "architectures": ["MiMoForCausalLM"], "num_nextn_predict_layers": 1,
            "auto_map": {"AutoConfig": "configuration_mimo.MiMoConfig", "AutoModel": "modeling_mimo.MiMoModel"}}
    save_mtp(head, tmp_path / "d", mimo, "tiny", "fp")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and "auto_map" not in cfg and cfg["toolkit"]["target_model_type"] == "mimo"
    for remote in (False, True):
        read = transformers.AutoConfig.from_pretrained(tmp_path / "d", trust_remote_code=remote)
        assert isinstance(read, transformers.Qwen2Config) and read.num_nextn_predict_layers == 1


def test_a_mimo_folder_whose_first_mtp_layer_is_not_0_loads(tmp_path):
    """The layer index was taken as 0: a folder holding mtp_layers.1 alone was refused as missing every weight."""
    _, w = write_native(tmp_path / "t", "mimo", n_mtp=2)
    w = {k: v for k, v in w.items() if not k.startswith("model.mtp_layers.0.")}
    save_file({k: v.contiguous() for k, v in w.items()}, str(tmp_path / "t" / "model.safetensors"))
    target = load_target(tmp_path / "t")
    head = load_draft(str(tmp_path / "t"), target, None)
    assert torch.equal(head.block.mlp.up_proj.weight, w["model.mtp_layers.1.mlp.up_proj.weight"])


def test_mtp_weights_of_other_shapes_are_named_against_the_targets_config(tmp_path):
    _, w = write_native(tmp_path / "t", "deepseek", n_mtp=1)
    key = f"model.layers.{LAYERS}.mlp.up_proj.weight"
    w[key] = torch.zeros(w[key].shape[0] + 4, w[key].shape[1])
    save_file({k: v.contiguous() for k, v in w.items()}, str(tmp_path / "t" / "model.safetensors"))
    with pytest.raises(ValueError, match="do not have the shapes the target's config.json gives"):
        load_draft(str(tmp_path / "t"), load_target(tmp_path / "t"), None)


@pytest.mark.parametrize("tree", [TreeConfig(1, 1, 2), TreeConfig(2, 1, 3), TreeConfig(4, 1, 5),
                                  TreeConfig(3, 2, 6)], ids=["steps1", "steps2", "steps4", "tree"])
def test_greedy_with_an_mtp_draft_equals_plain_decoding(tmp_path, tree):
    cfg, _ = write_native(tmp_path / "t", "mimo", n_mtp=1)
    target = load_target(tmp_path / "t")
    head = load_draft(str(tmp_path / "t"), target, None)
    prompts = [[5, 17, 33, 8, 61], [9, 4, 70]]
    p = SamplingParams(max_new_tokens=24)
    want = [r.tokens for r in Engine(target, max_len=64, max_batch=2).generate_batch(prompts, p)]
    got = Engine(target, head, tree, max_len=64, max_batch=2).generate_batch(prompts, p)
    assert [r.tokens for r in got] == want
    assert all(r.verify_steps > 0 for r in got)


def test_a_target_that_ships_mtp_layers_drafts_for_itself(tmp_path):
    """`toolkit serve --draft DIR` with no --model: a folder with its own MTP layers is its own target."""
    from toolkit.infer.draft_folder import draft_target

    write_native(tmp_path / "t", "mimo", n_mtp=1)
    assert draft_target(str(tmp_path / "t"), None) == tmp_path / "t"


@pytest.mark.parametrize("arch", ["DeepseekV3ForCausalLMNextN", "LlamaForCausalLM"])
def test_an_mtp_only_folder_needs_model_naming_its_target(tmp_path, arch):
    """An SGLang NextN export (the MTP layer alone, no embed_tokens or body) is no target: without --model it is
    refused clearly (it was taken as its own target and failed on missing embed_tokens); with --model it serves."""
    from toolkit.infer.draft_folder import draft_target

    cfg, w = write_native(tmp_path / "t", "deepseek", n_mtp=1)
    p = f"model.layers.{LAYERS}."
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "config.json").write_text(json.dumps({**cfg, "architectures": [arch], "num_hidden_layers": 1}))
    save_file({"model.layers.0." + k[len(p):]: v.contiguous() for k, v in w.items() if k.startswith(p)},
              str(tmp_path / "x" / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"holds MTP layers only \({arch}\), not a target to draft for .*"
                                         r"pass --model with the target's folder"):
        draft_target(str(tmp_path / "x"), None)
    assert draft_target(str(tmp_path / "x"), str(tmp_path / "t")) == tmp_path / "t"
