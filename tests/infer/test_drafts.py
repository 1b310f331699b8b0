"""EAGLE-3 draft folders in the docs/formats.md layout load; ones that do not fit the target are refused."""
import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from toolkit.infer.config import ModelConfig
from toolkit.infer.drafts import load_eagle3, random_head

TARGET = ModelConfig(model_type="llama", vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=8,
                     num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=4096)


def write_draft(folder, n=100, **overrides):
    """A draft folder exactly as docs/formats.md section 7 describes it."""
    H, D = 64, 16
    ids = torch.arange(0, 300, 3)[:n]
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": D,
           "num_hidden_layers": 1, "vocab_size": 300, "draft_vocab_size": n, "target_hidden_size": H,
           "max_position_embeddings": 4096, "rope_theta": 10000.0, "tie_word_embeddings": False,
           "rms_norm_eps": 1e-6, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]},
           "eagle_aux_hidden_state_layer_ids": [2, 4, 5], **overrides}
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g) * 0.05  # noqa: E731
    w = {"fc.weight": r(H, 3 * H), "norm.weight": torch.ones(H), "lm_head.weight": r(n, H),
         "midlayer.input_layernorm.weight": torch.ones(H), "midlayer.hidden_norm.weight": torch.ones(H),
         "midlayer.post_attention_layernorm.weight": torch.ones(H),
         "midlayer.self_attn.q_proj.weight": r(4 * D, 2 * H), "midlayer.self_attn.k_proj.weight": r(2 * D, 2 * H),
         "midlayer.self_attn.v_proj.weight": r(2 * D, 2 * H), "midlayer.self_attn.o_proj.weight": r(H, 4 * D),
         "midlayer.mlp.gate_proj.weight": r(96, H), "midlayer.mlp.up_proj.weight": r(96, H),
         "midlayer.mlp.down_proj.weight": r(H, 96),
         "d2t": ids - torch.arange(n), "t2d": torch.zeros(300, dtype=torch.bool).index_fill_(0, ids, True)}
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(w, str(folder / "model.safetensors"))
    return w


def test_formats_layout_loads_and_maps_ids(tmp_path):
    w = write_draft(tmp_path)
    head = load_eagle3(tmp_path, TARGET)
    assert head.aux_layers == [1, 3, 4]
    assert torch.equal(head.fc.weight, w["fc.weight"])
    assert head.to_target(torch.tensor([0, 1, 99])).tolist() == [0, 3, 297]
    cache = head.new_cache(32)
    logp, out = head(torch.randn(1, 5, 64), torch.randn(1, 5, 192), torch.arange(5)[None], cache)
    assert logp.shape == (1, 5, 100) and out.shape == (1, 5, 64)
    assert torch.allclose(logp.exp().sum(-1), torch.ones(1, 5))


def test_cached_steps_equal_a_full_forward():
    head = random_head(TARGET, list(range(0, 300, 2)))
    emb, hid = torch.randn(1, 9, 64), torch.randn(1, 9, 192)
    full, _ = head(emb, hid, torch.arange(9)[None], head.new_cache(16))
    cache = head.new_cache(16)
    a, _ = head(emb[:, :6], hid[:, :6], torch.arange(6)[None], cache)
    b, _ = head(emb[:, 6:], hid[:, 6:], torch.arange(6, 9)[None], cache)
    assert (torch.cat([a, b], 1) - full).abs().max() < 1e-5


@pytest.mark.parametrize("override, message", [
    ({"target_hidden_size": 32}, "target_hidden_size 32"),
    # a head narrower than its target (target_hidden_size 64) would be fed the target's 64-wide embedding
    ({"hidden_size": 48}, "hidden_size 48 != target hidden_size 64: this engine feeds the head the target's token"),
    ({"vocab_size": 500}, "vocab_size 500"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 9]}}, "aux layers"),
    # four aux layers named, but fc fuses three: [64, 192] != 4 x 64
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4, 5]}},
     r"fc.weight takes 192 features, but 4 aux layers \[1, 3, 4, 5\] x target hidden 64 = 256"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3]}}, "fc.weight takes 192 features, but 2 aux"),
    # a config.json that does not describe its weights: SGLang and vLLM build their modules from the config
    ({"draft_vocab_size": 50}, "draft_vocab_size 50 != the weights' 100 lm_head rows"),
    ({"intermediate_size": 128}, r"do not have the shapes its config.json gives: size mismatch for midlayer.mlp"),
])
def test_drafts_that_do_not_fit_the_target_are_refused(tmp_path, override, message):
    write_draft(tmp_path, **override)
    with pytest.raises(ValueError, match=message):
        load_eagle3(tmp_path, TARGET)


def test_a_d2t_past_the_target_vocabulary_is_refused_naming_the_id_and_size(tmp_path):
    w = write_draft(tmp_path)
    w["d2t"][-1] += 5  # the last draft id now maps to target id 302 of a 300-id target
    save_file(w, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="d2t maps a draft id to target id 302, beyond the target's vocab_size 300"):
        load_eagle3(tmp_path, TARGET)


@pytest.mark.parametrize("last, message", [
    (3, r"d2t maps draft ids 1 and 99 to the same target id 3; it must map draft ids to target ids one-to-one"),
    (-2, r"d2t maps draft id 99 to target id -2, below 0")])
def test_a_d2t_not_one_to_one_onto_target_ids_is_refused_naming_the_folder_and_id(tmp_path, last, message):
    """A sampled draft's probabilities are read over the target vocabulary by d2t: two draft ids on one target
    id (or one on a negative id) cannot be, so such a map is refused at load."""
    w = write_draft(tmp_path)
    w["d2t"][-1] = last - 99  # the last draft id (99) now maps to target id `last`
    save_file(w, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"draft {re.escape(str(tmp_path))} does not fit the target: {message}"):
        load_eagle3(tmp_path, TARGET)


def test_a_consistent_head_with_other_than_three_aux_layers_is_refused(tmp_path):
    write_draft(tmp_path, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3]})
    w = load_file(str(tmp_path / "model.safetensors"))
    save_file({**w, "fc.weight": w["fc.weight"][:, :128].contiguous()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"2 aux layers \[1, 3\]: this EAGLE-3 head fuses exactly 3"):
        load_eagle3(tmp_path, TARGET)


def test_a_pytorch_model_bin_checkpoint_loads(tmp_path):
    """SafeAILab's EAGLE-3 checkpoints ship pytorch_model.bin instead of model.safetensors."""
    w = write_draft(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(w, tmp_path / "pytorch_model.bin")
    head = load_eagle3(tmp_path, TARGET)
    assert torch.equal(head.fc.weight, w["fc.weight"]) and torch.equal(head.d2t, w["d2t"])
    (tmp_path / "pytorch_model.bin").unlink()
    with pytest.raises(ValueError, match="no model.safetensors, pytorch_model.bin or either.s index"):
        load_eagle3(tmp_path, TARGET)


def test_agreement_probe_lines_up_draft_and_target_positions(tmp_path):
    """A draft that predicts exactly the target's choice for position t + 2 from the pair at t scores 1.0;
    the same draft off by one position scores near 0."""
    import transformers
    from torch import nn

    from toolkit.infer.draft_checks import agreement
    from toolkit.infer.loading import load_target

    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=6,
                                   num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    target = load_target(tmp_path)
    ids = torch.randint(0, 50, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        choice = target(torch.tensor([ids]))[0][0].argmax(-1).tolist()  # choice[t] = target's token t + 1

    class Oracle(nn.Module):
        def __init__(self, shift):
            super().__init__()
            self.shift, self.aux_layers = shift, [1, 2, 3]

        def new_cache(self, *a):
            return None

        def to_target(self, ids):
            return ids

        def forward(self, emb, hidden, positions, cache):
            picks = [choice[min(int(p) + 1 + self.shift, len(choice) - 1)] for p in positions[0]]
            return torch.nn.functional.one_hot(torch.tensor([picks]), 50).float().log(), None

    assert agreement(Oracle(0), target, ids) == 1.0
    assert agreement(Oracle(1), target, ids) < 0.3


def test_a_two_layer_head_saves_and_loads_back(tmp_path):
    from toolkit.infer.drafts import save_eagle3

    head = random_head(TARGET, list(range(0, 300, 3)), seed=1, num_layers=2)
    hf = {"vocab_size": 300, "max_position_embeddings": 512, "rope_theta": 10000.0}
    save_eagle3(head, tmp_path, hf, "tiny", "0" * 16)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2
    names = load_file(str(tmp_path / "model.safetensors"))
    # layer 0 as SGLang's midlayer.*, the second as vLLM's layers.1.* (its loader renames midlayer. to layers.0.)
    assert "midlayer.self_attn.q_proj.weight" in names and "layers.1.self_attn.q_proj.weight" in names
    assert not any(k.startswith("additional_layers.") for k in names)
    back = load_eagle3(tmp_path, TARGET)
    assert len(back.additional_layers) == 1
    x, h = torch.randn(1, 4, 64), torch.randn(1, 4, 192)
    with torch.no_grad():
        a = head.to(torch.bfloat16).float()(x, h, torch.arange(4)[None], head.new_cache(8))[0]
        b = back(x, h, torch.arange(4)[None], back.new_cache(8))[0]
    assert torch.allclose(a, b, atol=1e-5)


def test_speculators_names_and_vllm_aux_ids_load(tmp_path):
    """A speculators / vLLM-style folder: layers.0.* for the first layer and only the top-level aux ids, which
    name the layer whose input is captured (one more than ours)."""
    w = write_draft(tmp_path / "ours")
    write_draft(tmp_path / "theirs", eagle_config=None, eagle_aux_hidden_state_layer_ids=[2, 4, 5])
    save_file({k.replace("midlayer.", "layers.0."): v for k, v in w.items()},
              str(tmp_path / "theirs" / "model.safetensors"))
    a, b = load_eagle3(tmp_path / "ours", TARGET), load_eagle3(tmp_path / "theirs", TARGET)
    assert b.aux_layers == a.aux_layers == [1, 3, 4]
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


@pytest.mark.parametrize("ids, problem", [([1, 3, 4], None), ([4, 3, 1], "strictly increasing"),
                                          ([1, 3, 3], "strictly increasing"), ([1, 3, 7], "must be <= 6"),
                                          ([-1, 2, 3], "aux layer -1 is not a layer id")])
def test_aux_layers_sglang_and_vllm_would_capture_otherwise_are_named(ids, problem):
    from toolkit.infer.draft_checks import aux_layer_problems

    got = aux_layer_problems(ids, TARGET.num_layers)
    assert (got == []) if problem is None else any(problem in p for p in got)


def test_loading_a_head_with_such_aux_layers_warns(tmp_path, capsys):
    write_draft(tmp_path, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 4, 7]})
    load_eagle3(tmp_path, TARGET)
    assert "WARNING" in capsys.readouterr().err


@pytest.mark.parametrize("target, theta, scaling", [
    ({"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}, 100000.0, None),  # transformers 5
    ({"rope_theta": 500000.0, "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
     500000.0, "llama3"),                                                                     # transformers 4
    ({"rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0,
                          "original_max_position_embeddings": 32768}}, 1e6, "yarn")])
def test_a_saved_head_spells_rope_both_ways(tmp_path, target, theta, scaling):
    """SGLang's Llama reads rope_theta (10000 without it) and vLLM under transformers 4 takes the top-level
    theta over rope_parameters': both spellings must be written, with the target's values."""
    from toolkit.infer.drafts import save_eagle3

    hf = {"vocab_size": 300, "max_position_embeddings": 512, **target}
    save_eagle3(random_head(TARGET, list(range(0, 300, 3))), tmp_path, hf, "tiny", "0" * 16)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"] == theta
    assert cfg.get("rope_scaling", {}).get("rope_type") == scaling == (
        None if scaling is None else cfg["rope_parameters"]["rope_type"])
    want = ModelConfig.from_hf({**hf, "model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
                                "num_hidden_layers": 8, "num_attention_heads": 4})
    for spelling in ({k: cfg[k] for k in ("rope_theta", "rope_scaling") if k in cfg},
                     {"rope_parameters": cfg["rope_parameters"]}):
        got = ModelConfig.from_hf({**hf, **{k: None for k in ("rope_parameters", "rope_scaling")}, **spelling,
                                   "model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
                                   "num_hidden_layers": 8, "num_attention_heads": 4})
        assert (got.rope_theta, got.rope_scaling) == (want.rope_theta, want.rope_scaling)


@pytest.mark.parametrize("kind", ["llama", "phi3"])
def test_a_saved_heads_rope_dict_holds_the_original_length_its_target_ran_with(tmp_path, kind):
    """transformers takes a top-level original_max_position_embeddings over the rope dict's (Phi-3's class default
    4096 too): the draft's dict copied the dict's own, and the head was served with another scale than trained."""
    from toolkit.infer.drafts import save_eagle3
    from toolkit.infer.family_keys import text_config

    rope = {"rope_theta": 1e4, "rope_type": "longrope" if kind == "phi3" else "yarn", "factor": 4.0,
            "original_max_position_embeddings": 8192,
            **({"short_factor": [1.0] * 8, "long_factor": [2.0] * 8} if kind == "phi3" else {})}
    hf = {"vocab_size": 300, "max_position_embeddings": 32768, "model_type": kind, "rope_parameters": rope,
          **({} if kind == "phi3" else {"original_max_position_embeddings": 4096})}
    save_eagle3(random_head(TARGET, list(range(0, 300, 3))), tmp_path, text_config(hf), "tiny", "0" * 16)
    cfg = json.loads((tmp_path / "config.json").read_text())
    ran = ModelConfig.from_hf({**hf, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 8,
                               "num_attention_heads": 4})
    assert ran.rope_scaling["original_max_position_embeddings"] == 4096
    assert cfg["rope_parameters"]["original_max_position_embeddings"] == 4096
    assert cfg["rope_scaling"]["original_max_position_embeddings"] == 4096


def test_a_damaged_or_misdescribed_draft_folder_is_named_in_one_line(tmp_path):
    from toolkit.infer.draft_folder import draft_target, recorded_target

    write_draft(tmp_path / "cut")
    raw = (tmp_path / "cut" / "model.safetensors").read_bytes()
    (tmp_path / "cut" / "model.safetensors").write_bytes(raw[:len(raw) // 2])  # a truncated copy
    with pytest.raises(ValueError, match="model.safetensors is unreadable"):
        load_eagle3(tmp_path / "cut", TARGET)
    (tmp_path / "cut" / "config.json").write_text('{"architectures": [')
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        recorded_target(str(tmp_path / "cut"))
    write_draft(tmp_path / "far", toolkit={"target": "llama-9000"})
    with pytest.raises(ValueError, match="records its target as 'llama-9000'.*pass --model"):
        draft_target(str(tmp_path / "far"), None)


def test_heads_for_a_gemma3_multimodal_target_export_with_its_class_vocab_size(tmp_path):
    """gemma-3-4b-it's config.json holds a text_config without vocab_size (transformers fills in 262208, as the
    engine does): the EAGLE-3 and EAGLE-1/2 exports read it the same way instead of failing at the first
    checkpoint with a KeyError."""
    from toolkit.infer.draft_head import draft_config
    from toolkit.infer.drafts import save_eagle3
    from toolkit.infer.eagle2 import Eagle2Head, save_eagle

    hf = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
          "text_config": {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 96,
                          "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}}
    tc = ModelConfig.from_hf(hf)
    assert tc.vocab_size == 262208
    ids = list(range(0, 262208, 4099))
    save_eagle3(random_head(tc, ids), tmp_path / "e3", hf, "g3", "0" * 16)
    save_eagle(Eagle2Head(draft_config(tc), torch.randn(262208, 64), torch.tensor(ids)), tmp_path / "e2", hf, "g3",
               "0" * 16)
    for kind in ("e3", "e2"):
        cfg = json.loads((tmp_path / kind / "config.json").read_text())
        assert cfg["vocab_size"] == cfg["toolkit"]["target_vocab_size"] == 262208, kind
    assert load_file(str(tmp_path / "e3/model.safetensors"))["t2d"].shape == (262208,)


@pytest.mark.parametrize("kind", ["safetensors", "bin"])
def test_a_sharded_draft_folder_loads_as_the_single_file(tmp_path, kind):
    """save_pretrained shards past its max_shard_size (model.safetensors.index.json, or pytorch_model.bin.index.json
    with safe_serialization off): the shards its index lists are read together, and a listed shard that is
    missing is named."""
    w = write_draft(tmp_path / "one")
    whole = load_eagle3(tmp_path / "one", TARGET)
    folder = tmp_path / "sharded"
    shutil.copytree(tmp_path / "one", folder)
    (folder / "model.safetensors").unlink()
    names = sorted(w)
    ext, index = (".safetensors", "model.safetensors.index.json") if kind == "safetensors" else (
        ".bin", "pytorch_model.bin.index.json")
    shards = {f"model-0000{i + 1}-of-00002{ext}": names[i::2] for i in range(2)}
    for shard, keys in shards.items():
        part = {k: w[k] for k in keys}
        save_file(part, str(folder / shard)) if kind == "safetensors" else torch.save(part, folder / shard)
    (folder / index).write_text(json.dumps({"weight_map": {k: s for s, keys in shards.items() for k in keys}}))
    back = load_eagle3(folder, TARGET)
    assert all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(), back.state_dict().values()))
    (folder / f"model-00002-of-00002{ext}").unlink()
    with pytest.raises(ValueError, match=f"{index} lists model-00002-of-00002{ext}, which is not in the folder"):
        load_eagle3(folder, TARGET)


@pytest.mark.parametrize("model_type", ["phi3", "kimi_k2", "qwen3"])
def test_a_head_config_naming_its_targets_model_type_loads_as_the_llama_head(tmp_path, model_type):
    """SpecForge's draft-model configs name their target's model_type (phi4-mini-eagle3.json: phi3, kimi-k2: kimi_k2)
    beside LlamaForCausalLMEagle3; SGLang and vLLM build the class the architecture names, Llama layers, so the
    folder serves as the same head it would be with model_type llama."""
    write_draft(tmp_path / "llama")
    write_draft(tmp_path / model_type, model_type=model_type)
    a, b = load_eagle3(tmp_path / "llama", TARGET), load_eagle3(tmp_path / model_type, TARGET)
    emb, hid = torch.randn(1, 5, 64), torch.randn(1, 5, 192)
    la, _ = a(emb, hid, torch.arange(5)[None], a.new_cache(8))
    lb, _ = b(emb, hid, torch.arange(5)[None], b.new_cache(8))
    assert torch.equal(la, lb)
