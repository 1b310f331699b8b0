"""EAGLE-1/2 heads (SafeAILab layout), alone and over an FR-Spec vocabulary, in the same engine."""
import json

import pytest
import torch

from toolkit.infer.draft_folder import load_draft
from toolkit.infer.eagle2 import load_eagle2
from toolkit.infer.engine import Engine
from toolkit.infer.loading import load_target
from toolkit.infer.sampling import SamplingParams
from toolkit.infer.tree import TreeConfig
from toolkit.tokenmap.maps import save_freq


def write_eagle1(folder, H=576, I=1536, heads=9, kv=3, bin_file=True, drop=None, bias=True, qkv_bias=False):
    """qkv_bias: a Qwen2 head as SafeAILab writes them (EAGLE-Qwen2-7B-Instruct: `qkv_bias: true`)."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": I,
           "num_attention_heads": heads, "num_key_value_heads": kv, "num_hidden_layers": 1, "vocab_size": 49152,
           "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192, "bias": bias,
           **({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "qkv_bias": True} if qkv_bias else {})}
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g) * 0.02  # noqa: E731
    D = H // heads
    w = {"fc.weight": r(H, 2 * H), "fc.bias": r(H), "embed_tokens.weight": r(10, H),
         "layers.0.input_layernorm.weight": torch.ones(H), "layers.0.post_attention_layernorm.weight": torch.ones(H),
         "layers.0.self_attn.q_proj.weight": r(heads * D, H), "layers.0.self_attn.k_proj.weight": r(kv * D, H),
         "layers.0.self_attn.v_proj.weight": r(kv * D, H), "layers.0.self_attn.o_proj.weight": r(H, heads * D),
         "layers.0.mlp.gate_proj.weight": r(I, H), "layers.0.mlp.up_proj.weight": r(I, H),
         "layers.0.mlp.down_proj.weight": r(H, I)}
    if not bias:
        w.pop("fc.bias")
    if qkv_bias:
        w.update({f"layers.0.self_attn.{p}_proj.bias": r(n * D) for p, n in (("q", heads), ("k", kv), ("v", kv))})
    if drop:
        w.pop(drop)
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    if bin_file:
        torch.save(w, folder / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file(w, str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def target(smollm2_dir):
    return load_target(smollm2_dir)


def test_fr_spec_vocab_truncates_the_lm_head_and_maps_ids_back(target, tmp_path):
    write_eagle1(tmp_path / "d")
    ids = [9, 2, 1, 40000, 7, 123, 5000]
    save_freq(tmp_path / "freq_7.pt", ids)
    full = load_eagle2(tmp_path / "d", target)
    small = load_eagle2(tmp_path / "d", target, tmp_path / "freq_7.pt")
    assert small.lm_head.weight.shape == (7, 576) and small.aux_layers == [-1]
    assert small.to_target(torch.arange(7)).tolist() == sorted(ids)
    emb, hid = torch.randn(1, 4, 576), torch.randn(1, 4, 576)
    a, ha = full(emb, hid, torch.arange(4)[None], full.new_cache(8))
    b, hb = small(emb, hid, torch.arange(4)[None], small.new_cache(8))
    assert torch.allclose(ha, hb, atol=1e-6)
    raw_full, raw_small = full.lm_head(ha), small.lm_head(hb)
    assert torch.allclose(raw_small, raw_full[..., sorted(ids)], atol=1e-5)  # same rows, other GEMM blocking


def test_both_file_kinds_load_and_misfits_are_refused(target, tmp_path):
    write_eagle1(tmp_path / "st", bin_file=False)
    load_eagle2(tmp_path / "st", target)
    write_eagle1(tmp_path / "missing", drop="layers.0.mlp.up_proj.weight")
    with pytest.raises(ValueError, match="up_proj"):
        load_eagle2(tmp_path / "missing", target)
    # a public head trained without fc's bias ("bias": false, as yuhuili's EAGLE-LLaMA3.1 heads) was refused
    write_eagle1(tmp_path / "nobias", bias=False)
    assert load_eagle2(tmp_path / "nobias", target).fc.bias is None
    write_eagle1(tmp_path / "wide", H=640, heads=10, kv=5)
    with pytest.raises(ValueError, match="hidden_size 640"):
        load_eagle2(tmp_path / "wide", target)


def test_a_folder_without_the_bias_key_has_an_fc_bias_or_not(target, tmp_path):
    """vLLM's layout writes no `bias` key; a head without fc.bias there was refused as 'missing fc.bias'."""
    write_eagle1(tmp_path / "d", bias=False)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    del cfg["bias"]
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    assert load_eagle2(tmp_path / "d", target).fc.bias is None
    write_eagle1(tmp_path / "b", bias=True)
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    del cfg["bias"]
    (tmp_path / "b" / "config.json").write_text(json.dumps(cfg))
    assert load_eagle2(tmp_path / "b", target).fc.bias is not None


def test_an_lm_head_shipped_in_the_folder_is_not_read(target, tmp_path):
    """SGLang and vLLM serve an EAGLE-1/2 head with the target's lm_head, whatever its folder holds: a shipped copy
    replaced the target's rows, and under a token map failed as a shape mismatch."""
    write_eagle1(tmp_path / "d", bin_file=False)
    from safetensors.torch import load_file, save_file

    w = load_file(str(tmp_path / "d" / "model.safetensors"))
    w["lm_head.weight"] = torch.randn(49152, 576)
    save_file(w, str(tmp_path / "d" / "model.safetensors"))
    head = load_eagle2(tmp_path / "d", target)
    assert torch.equal(head.lm_head.weight, target.lm_head.weight.detach().float())
    save_freq(tmp_path / "freq_7.pt", [9, 2, 1, 40000, 7, 123, 5000])
    small = load_eagle2(tmp_path / "d", target, tmp_path / "freq_7.pt")
    assert torch.equal(small.lm_head.weight, target.lm_head.weight.detach().float()[[1, 2, 7, 9, 123, 5000, 40000]])


def test_a_qwen2_head_keeps_its_qkv_biases(target, tmp_path):
    """SafeAILab's Qwen2 heads have q/k/v biases (`qkv_bias: true`; SGLang builds them from Qwen2DecoderLayer):
    they load into the attention and change its output, instead of being refused as unknown tensors."""
    from safetensors.torch import load_file

    write_eagle1(tmp_path / "q", qkv_bias=True, bin_file=False)
    head = load_eagle2(tmp_path / "q", target)
    want = load_file(str(tmp_path / "q/model.safetensors"))["layers.0.self_attn.v_proj.bias"]
    assert torch.equal(head.midlayer.self_attn.v_proj.bias, want)
    emb, hid = torch.randn(1, 4, 576), torch.randn(1, 4, 576)
    a, _ = head(emb, hid, torch.arange(4)[None], head.new_cache(8))
    served = load_draft(str(tmp_path / "q"), target, None)  # as bench / serve load it (projections fused)
    s, _ = served(emb, hid, torch.arange(4)[None], served.new_cache(8))
    assert torch.allclose(a, s, atol=1e-5)
    with torch.no_grad():
        head.midlayer.self_attn.v_proj.bias.zero_()
    b, _ = head(emb, hid, torch.arange(4)[None], head.new_cache(8))
    assert not torch.allclose(a, b)


def test_a_token_map_past_the_target_vocabulary_is_refused_naming_both(target, tmp_path):
    """A freq_N.pt from a tokenizer larger than the target's embedding: both the id and vocab_size named."""
    write_eagle1(tmp_path / "d")
    save_freq(tmp_path / "freq.pt", [1, 2, 49152])
    with pytest.raises(ValueError, match=r"target id 49152 is beyond the target's vocabulary \(config.json "
                                         r"vocab_size 49152: ids must be in 0..49151"):
        load_eagle2(tmp_path / "d", target, tmp_path / "freq.pt")


@pytest.mark.parametrize("tree", [TreeConfig(4, 1, 5), TreeConfig(3, 3, 8)], ids=["chain", "tree"])
def test_greedy_with_an_eagle2_head_and_fr_spec_equals_plain(target, smollm2_tokenizer, tmp_path, tree):
    write_eagle1(tmp_path / "d")
    save_freq(tmp_path / "freq.pt", list(range(0, 49152, 4)))
    head = load_eagle2(tmp_path / "d", target, tmp_path / "freq.pt")
    ids = smollm2_tokenizer("The three primary colors are", add_special_tokens=False).input_ids
    want = Engine(target, max_len=128).generate(ids, SamplingParams(max_new_tokens=10)).tokens
    got = Engine(target, head, tree, max_len=128).generate(ids, SamplingParams(max_new_tokens=10)).tokens
    assert got == want


def test_bench_serves_an_eagle2_head_with_a_token_map(smollm2_dir, shared, tmp_path):
    import subprocess
    import sys

    write_eagle1(tmp_path / "d")
    save_freq(tmp_path / "freq.pt", list(range(0, 49152, 2)))
    out = tmp_path / "b.json"
    done = subprocess.run([sys.executable, "-m", "toolkit.cli", "bench", "--draft", str(tmp_path / "d"),
                           "--token-map", str(tmp_path / "freq.pt"), "--prompts",
                           str(shared / "data/eval/gsm8k.jsonl"), "--limit", "1", "--max-new-tokens", "5",
                           "--baseline", "--threads", "1", "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(out.read_text())["greedy_identical_to_baseline"] is True
