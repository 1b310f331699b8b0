"""FP8 checkpoints (quant_method fp8: block-wise `weight_scale_inv` as DeepSeek-V3 and Qwen3-FP8 ship them, per-tensor
or per-row `weight_scale` as AutoFP8 writes them) dequantized on load: the target's logits equal transformers' own
dequantized load, blocks that do not divide the weight are cropped, scales may sit in another shard, a DeepSeek-V3
target and its NextN MTP layer load from FP8 as their dequantized dense copies do, and a weight without its scale
(or the reverse) is refused by name."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_deepseek import BASE as DS_BASE, with_mtp_layer

from toolkit.infer import fp8
from toolkit.infer.draft_folder import load_draft
from toolkit.infer.loading import load_target

LLAMA = dict(vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, bos_token_id=0, eos_token_id=1)


def quantize(w: torch.Tensor, block) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (float8_e4m3fn [N, K], float32 scale [ceil(N / bn), ceil(K / bk)]): each block's max maps to 448,
    as DeepSeek's act_quant / weight quantization does."""
    N, K = w.shape
    bn, bk = block
    s = torch.zeros(-(-N // bn), -(-K // bk))
    q = torch.empty(N, K, dtype=torch.float8_e4m3fn)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            tile = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
            s[i, j] = tile.abs().max().clamp(min=1e-12) / 448.0
            q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = (tile / s[i, j]).to(torch.float8_e4m3fn)
    return q, s


def fp8_folder(dense_folder, out, block, quantized=lambda name: name.endswith("proj.weight"), shards=1):
    """`dense_folder` as an FP8 checkpoint in `out` (the tensors `quantized` picks, with `weight_scale_inv`), and the
    dequantized tensors a reference dense checkpoint holds."""
    out.mkdir()
    cfg = json.loads((dense_folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": list(block), "modules_to_not_convert": ["lm_head"]}
    (out / "config.json").write_text(json.dumps(cfg))
    tensors, dense = {}, {}
    for name, w in load_file(str(dense_folder / "model.safetensors")).items():
        if quantized(name):
            q, s = quantize(w.float(), block)
            tensors[name], tensors[name + "_scale_inv"] = q, s
            dense[name] = fp8.dequantize(q, s, block, torch.float32)
        else:
            tensors[name] = dense[name] = w
    if shards == 1:
        save_file(tensors, str(out / "model.safetensors"))
    else:  # every scale in the shard after its weight's
        names = sorted(tensors)
        parts = [{k: tensors[k] for k in names if k.endswith("_scale_inv") == (i == 1)} for i in range(2)]
        index = {"metadata": {}, "weight_map": {}}
        for i, part in enumerate(parts):
            save_file(part, str(out / f"model-0000{i + 1}-of-00002.safetensors"))
            index["weight_map"].update(dict.fromkeys(part, f"model-0000{i + 1}-of-00002.safetensors"))
        (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return dense


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**LLAMA), dtype=torch.float32).eval()
    folder = tmp_path_factory.mktemp("llama")
    model.save_pretrained(folder)
    return folder


def test_an_fp8_target_equals_transformers_dequantized_load(llama, tmp_path):
    from transformers import AutoModelForCausalLM

    fp8_folder(llama, tmp_path / "fp8", (32, 32))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "fp8", dtype=torch.float32).eval()  # dequantized on CPU
    ours = load_target(tmp_path / "fp8")
    ids = torch.randint(0, 211, (2, 19), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, dense = hf(ids).logits, AutoModelForCausalLM.from_pretrained(llama, dtype=torch.float32)(ids).logits
        got = ours(ids)[0]
    assert (got - want).abs().max() <= 1e-5
    assert (got - dense).abs().max() > 1e-4  # the FP8 rounding is there: not the dense model's logits


def test_blocks_that_do_not_divide_the_weight_and_scales_in_another_shard(llama, tmp_path):
    """Blocks of 48 over 64 / 96 / 211-wide weights (DeepSeek-V3's 576-row kv_a_proj in blocks of 128 is such a
    case), the scales in a second shard: the same tensors as a dense checkpoint of the dequantized weights."""
    dense = fp8_folder(llama, tmp_path / "fp8", (48, 48), shards=2)
    (tmp_path / "dense").mkdir()
    (tmp_path / "dense" / "config.json").write_text((llama / "config.json").read_text())
    save_file(dense, str(tmp_path / "dense" / "model.safetensors"))
    a, b = load_target(tmp_path / "fp8").state_dict(), load_target(tmp_path / "dense").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_dequantize_reads_each_scale_layout():
    g = torch.Generator().manual_seed(0)
    q = (torch.randn(70, 50, generator=g) * 50).to(torch.float8_e4m3fn)
    block = torch.rand(3, 2, generator=g) + 0.5
    want = torch.stack([torch.stack([q[i, j].float() * block[i // 32, j // 32] for j in range(50)])
                        for i in range(70)])
    assert torch.equal(fp8.dequantize(q, block, (32, 32), torch.float32), want)
    assert torch.equal(fp8.dequantize(q, torch.tensor([0.5]), None, torch.float32), q.float() * 0.5)  # per tensor
    rows = torch.rand(70, 1, generator=g)
    assert torch.equal(fp8.dequantize(q, rows, None, torch.float32), q.float() * rows)  # per output row
    e8m0 = torch.full((3, 2), 125, dtype=torch.uint8)  # 2^(125 - 127)
    assert torch.equal(fp8.dequantize(q, e8m0, (32, 32), torch.float32), q.float() * 0.25)
    assert fp8.dequantize(q, block, (32, 32), torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"scale \(4, 2\) fits neither the weight \(70, 50\)"):
        fp8.dequantize(q, torch.ones(4, 2), (32, 32), torch.float32)


@pytest.mark.parametrize("strategy", ["channel", "block"])
def test_a_compressed_tensors_fp8_checkpoint_loads_as_its_dequantized_weights(llama, strategy, tmp_path):
    """llm-compressor's FP8 export (quant_method compressed-tensors, float-quantized: every Linear's weight 8-bit
    float, `weight_scale` per output channel [N, 1] or per [32, 32] block, `input_scale` and an FP8 KV cache's
    `k_scale` / `v_scale` beside them): the same tensors as a dense checkpoint of the dequantized weights."""
    from toolkit.infer.config import ConfigError, ModelConfig

    (tmp_path / "ct").mkdir()
    cfg = json.loads((llama / "config.json").read_text())
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, "dynamic": False}
    if strategy == "block":
        weights["block_structure"] = [32, 32]
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": "float-quantized",
                                  "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
                                  "ignore": ["lm_head"], "kv_cache_scheme": {"num_bits": 8, "type": "float"}}
    (tmp_path / "ct" / "config.json").write_text(json.dumps(cfg))
    tensors, dense = {}, {}
    for name, w in load_file(str(llama / "model.safetensors")).items():
        if name.endswith("proj.weight"):
            if strategy == "block":
                q, s = quantize(w, (32, 32))
            else:
                s = w.abs().amax(1, keepdim=True) / 448.0
                q = (w / s).to(torch.float8_e4m3fn)
            base = name.removesuffix(".weight")
            tensors.update({name: q, base + ".weight_scale": s, base + ".input_scale": torch.ones(1)})
            dense[name] = fp8.dequantize(q, s, (32, 32) if strategy == "block" else None, torch.float32)
            if name.endswith("k_proj.weight"):
                for kv in ("k_scale", "v_scale"):
                    tensors[name.replace("k_proj.weight", kv)] = torch.ones(())
        else:
            tensors[name] = dense[name] = w
    save_file(tensors, str(tmp_path / "ct" / "model.safetensors"))
    (tmp_path / "dense").mkdir()
    (tmp_path / "dense" / "config.json").write_text((llama / "config.json").read_text())
    save_file(dense, str(tmp_path / "dense" / "model.safetensors"))
    a, b = load_target(tmp_path / "ct").state_dict(), load_target(tmp_path / "dense").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    weights.update(num_bits=4, type="int")  # a W4A16 scheme: refused by name
    with pytest.raises(ConfigError, match="quantization_config: compressed-tensors.*not supported"):
        ModelConfig.from_hf(cfg)


def test_a_weight_without_its_scale_or_a_scale_without_its_weight_is_refused(llama, tmp_path):
    fp8_folder(llama, tmp_path / "fp8", (32, 32))
    w = load_file(str(tmp_path / "fp8" / "model.safetensors"))
    scale = w.pop("model.layers.0.mlp.up_proj.weight_scale_inv")
    save_file(w, str(tmp_path / "fp8" / "model.safetensors"))
    with pytest.raises(ValueError, match="FP8 weight model.layers.0.mlp.up_proj.weight has no"):
        load_target(tmp_path / "fp8")
    w["model.layers.0.mlp.up_proj.weight_scale_inv"] = scale
    w["model.layers.0.mlp.up_proj.weight"] = w["model.layers.0.mlp.up_proj.weight"].float()
    save_file(w, str(tmp_path / "fp8" / "model.safetensors"))
    with pytest.raises(ValueError, match="FP8 scales without their weights"):
        load_target(tmp_path / "fp8")


def test_a_deepseek_v3_target_and_its_nextn_layer_load_from_fp8(tmp_path):
    """DeepSeek-V3's release: every projection of the layers and of the MTP layer in FP8 blocks (experts, MLA's
    low-rank projections), routers and norms not; target and MTP head equal their dequantized dense copies."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**DS_BASE, q_lora_rank=24)).eval()
    (tmp_path / "hf").mkdir()
    model.save_pretrained(tmp_path / "hf")
    with_mtp_layer(tmp_path / "hf", tmp_path / "t")
    def picked(name):  # routers, norms and embeddings stay unquantized
        return name.endswith(("proj.weight", "proj_with_mqa.weight"))

    dense = fp8_folder(tmp_path / "t", tmp_path / "fp8", (16, 16), picked)
    assert sum(n.startswith("model.layers.3.") and n in dense and picked(n) for n in dense) > 10  # the MTP layer's
    (tmp_path / "dense").mkdir()
    (tmp_path / "dense" / "config.json").write_text((tmp_path / "t" / "config.json").read_text())
    save_file(dense, str(tmp_path / "dense" / "model.safetensors"))
    targets = [load_target(tmp_path / d) for d in ("fp8", "dense")]
    a, b = (t.state_dict() for t in targets)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    heads = [load_draft(str(tmp_path / d), t, None) for d, t in zip(("fp8", "dense"), targets)]
    a, b = (h.state_dict() for h in heads)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    from toolkit.train.head import target_layer  # MTP training's init_block=target_last

    a, b = (target_layer(tmp_path / d, 2, targets[0].config) for d in ("fp8", "dense"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
