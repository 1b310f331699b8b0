"""`quant_method: fbgemm_fp8` checkpoints (Meta's Llama 4 Maverick FP8; transformers' FbgemmFp8Linear and
FbgemmFp8Llama4TextExperts layouts) dequantized on load: per-row `weight_scale` [N, 1] on Linear weights, the
stacked experts' `gate_up_proj_scale` [E, 1, 2I] / `down_proj_scale` [E, H, 1], `input_scale_ub` skipped, the
modules_to_not_convert left as stored; the same tensors and logits as a dense checkpoint of the dequantized weights."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_llama4 import tiny_llama4

from toolkit.infer import fp8
from toolkit.infer.loading import load_target


def per_row(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., N, K] -> (float8_e4m3fn, float32 scale [..., N, 1]): each row's max maps to 448 (fbgemm's
    quantize_fp8_per_row)."""
    s = w.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 448.0
    return (w / s).to(torch.float8_e4m3fn), s


def fbgemm_folder(dense_folder, out):
    """`dense_folder` (a Llama 4 text model) written as fbgemm_fp8 does, and the dense tensors of its dequantized
    weights. Linear weights per row; the stacked experts per column of their [E, K, N] layout."""
    out.mkdir()
    cfg = json.loads((dense_folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                                  "modules_to_not_convert": ["lm_head", "router", "shared_expert"]}
    (out / "config.json").write_text(json.dumps(cfg))
    tensors, dense = {}, {}
    for name, w in load_file(str(dense_folder / "model.safetensors")).items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):  # [E, K, N]: scale per (expert, column)
            q, s = per_row(w.transpose(1, 2))  # [E, N, K], [E, N, 1]
            q = q.transpose(1, 2).contiguous()
            s = s.transpose(1, 2).contiguous() if name.endswith("gate_up_proj") else s  # [E, 1, 2I] / [E, H, 1]
            tensors.update({name: q, name + "_scale": s})
            dense[name] = fp8.dequantize(q, s, None, torch.float32, name)
        elif name.endswith("proj.weight") and "shared_expert" not in name:
            q, s = per_row(w)
            base = name.removesuffix(".weight")
            tensors.update({name: q, base + ".weight_scale": s, base + ".input_scale_ub": torch.tensor([1200.0])})
            dense[name] = fp8.dequantize(q, s, None, torch.float32, name)
        else:
            tensors[name] = dense[name] = w
    save_file(tensors, str(out / "model.safetensors"))
    return dense


def test_a_llama4_fbgemm_fp8_checkpoint_loads_as_its_dequantized_weights(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny_llama4("scout")
    model.save_pretrained(tmp_path / "bf")
    dense = fbgemm_folder(tmp_path / "bf", tmp_path / "fp8")
    assert any(k.endswith("experts.gate_up_proj") for k in dense)  # the stacked layout was exercised
    (tmp_path / "dense").mkdir()
    (tmp_path / "dense" / "config.json").write_text((tmp_path / "bf" / "config.json").read_text())
    save_file(dense, str(tmp_path / "dense" / "model.safetensors"))
    ours, ref = load_target(tmp_path / "fp8"), load_target(tmp_path / "dense")
    a, b = ours.state_dict(), ref.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "dense", dtype=torch.float32).eval()
    ids = torch.randint(0, 181, (2, 21), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, want, unquantized = ours(ids)[0], hf(ids).logits, model(ids).logits
    assert (got - want).abs().max() <= 1e-4
    assert (got - unquantized).abs().max() > 1e-4  # the FP8 rounding is there


def test_the_stacked_experts_scales_dequantize_per_column_and_a_missing_one_is_named(tmp_path):
    g = torch.Generator().manual_seed(0)
    q = (torch.randn(3, 8, 6, generator=g) * 50).to(torch.float8_e4m3fn)
    cols, rows = torch.rand(3, 1, 6, generator=g), torch.rand(3, 6, 1, generator=g)
    assert torch.equal(fp8.dequantize(q, cols, None, torch.float32), q.float() * cols)
    assert torch.equal(fp8.dequantize(q, rows, None, torch.float32), q.float() * rows.transpose(1, 2))
    with pytest.raises(ValueError, match=r"layers.0.feed_forward.experts.down_proj has no "
                                         r"layers.0.feed_forward.experts.down_proj_scale beside it"):
        fp8.join({"layers.0.feed_forward.experts.down_proj": q}, {}, None, torch.float32, "here")
