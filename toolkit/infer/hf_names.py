"""What a target checkpoint's tensors are to the engine's modules (model.py names them as transformers' Llama
does): most map one to one (without the `model.` prefix); two families store them otherwise.

    mixtral  layers.{l}.block_sparse_moe.gate.weight            -> layers.{l}.mlp.gate.weight
             layers.{l}.block_sparse_moe.experts.{e}.w1/w3/w2   -> ...mlp.experts.{e}.gate_proj/up_proj/down_proj
    phi3     layers.{l}.self_attn.qkv_proj.weight [(Hq + 2 Hkv) D, H] -> q_proj, k_proj, v_proj (rows in that order)
             layers.{l}.mlp.gate_up_proj.weight [2 I, H]          -> gate_proj, up_proj (halves in that order)
    llama4_text  layers.{l}.feed_forward.*                      -> layers.{l}.mlp.*
             layers.{l}.feed_forward.experts.{e}.{gate,up,down}_proj.weight (experts one by one, as llm-compressor's
                 exports store them) -> the stacked experts.gate_up_proj [E, H, 2I], experts.down_proj [E, I, H]
             layers.{l}.self_attn.{q,k}_proj.{weight,bias}      -> each head's rows de-interleaved (rows 0, 2, ...,
                                                                   then 1, 3, ...): Llama 4 rotates pairs (x0, x1),
                                                                   (x2, x3), ...; the engine's RoPE pairs x_i with
                                                                   x_{i + D/2}, and q . k is the same under one
                                                                   permutation of both

as the hub's checkpoints and transformers 5's save_pretrained write them. Multimodal checkpoints (Gemma 3, Mistral 3,
Llama 4) hold the text model under `language_model.model.` (the hub's) or `model.language_model.` (transformers 5's),
its lm_head as `language_model.lm_head.` or `lm_head.`, beside a vision tower the engine does not load (not_text).
"""
from __future__ import annotations

import re

import torch

from toolkit.infer.config import ModelConfig

_MIXTRAL = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def our_name(model_type: str, name: str) -> str:
    """A checkpoint tensor's name (with or without `model.`) as the engine's modules name it, for the tensors
    that keep their shape."""
    name = name.removeprefix("model.")
    name = name.removeprefix("language_model.").removeprefix("model.")  # a multimodal checkpoint's text model
    if model_type == "llama4_text":
        name = name.replace(".feed_forward.", ".mlp.")
    if model_type == "mixtral" and ".block_sparse_moe." in name:
        name = name.replace(".block_sparse_moe.", ".mlp.")
        return re.sub(r"(\.experts\.\d+)\.(w[123])\.", lambda m: f"{m[1]}.{_MIXTRAL[m[2]]}.", name)
    return name


def not_text(name: str) -> bool:
    """A multimodal checkpoint's tensors that are not the text model's (Gemma 3's and Mistral 3's vision_tower,
    Llama 4's vision_model, their projectors)."""
    return name.removeprefix("model.").startswith(("vision_tower.", "vision_model.", "multi_modal_projector."))


def our_tensors(c: ModelConfig, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The engine's (name, tensor) pairs for one checkpoint tensor: Phi-3's fused projections split, every other
    tensor renamed (our_name). A fused tensor of the wrong size is refused by name."""
    name = our_name(c.model_type, name)
    if c.model_type == "llama4_text" and name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                                        "self_attn.q_proj.bias", "self_attn.k_proj.bias")):
        return [(name, deinterleave(tensor, c.head_dim))]
    if c.model_type != "phi3" or not name.endswith(("self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight")):
        return [(name, tensor)]
    prefix = name.rsplit(".", 2)[0]
    if name.endswith("qkv_proj.weight"):
        parts = {"q_proj": c.num_heads * c.head_dim, "k_proj": c.num_kv_heads * c.head_dim,
                 "v_proj": c.num_kv_heads * c.head_dim}
    else:
        parts = {"gate_proj": c.intermediate_size, "up_proj": c.intermediate_size}
    if tensor.shape[0] != sum(parts.values()):
        raise ValueError(f"{name}: {tensor.shape[0]} rows, but the config's sizes need {sum(parts.values())} "
                         f"({' + '.join(f'{k} {v}' for k, v in parts.items())})")
    return [(f"{prefix}.{k}.weight", t) for k, t in zip(parts, tensor.split(list(parts.values())))]


def deinterleave(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """A q / k projection's weight [h D, H] (or bias [h D]) with each head's rows reordered 0, 2, 4, ..., 1, 3, ...:
    interleaved RoPE pairs become the half-split pairs the engine rotates."""
    heads = w.shape[0] // head_dim
    order = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])
    return w.reshape(heads, head_dim, *w.shape[1:])[:, order].reshape(w.shape)


_EXPERT = re.compile(r"(layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight")


def stack_experts(c: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Llama 4's experts stored one by one (Linear weights [I, H] / [H, I]) stacked as transformers stores them:
    gate_up_proj [E, H, 2I] (gate columns, then up) and down_proj [E, I, H]; an expert missing is refused by name.
    Other families' tensors pass unchanged."""
    if c.model_type != "llama4_text":
        return tensors
    groups: dict[str, dict] = {}
    for name in [n for n in tensors if _EXPERT.fullmatch(n)]:
        m = _EXPERT.fullmatch(name)
        groups.setdefault(m[1], {})[int(m[2]), m[3]] = tensors.pop(name)
    for prefix, parts in groups.items():
        E = c.moe.num_experts
        missing = [f"{prefix}.{e}.{k}_proj.weight" for e in range(E) for k in ("gate", "up", "down")
                   if (e, k) not in parts]
        if missing:
            raise ValueError(f"experts stored one by one, but missing {missing[:4]}")
        tensors[prefix + ".gate_up_proj"] = torch.stack([torch.cat([parts[e, "gate"].t(), parts[e, "up"].t()], 1)
                                                         for e in range(E)])
        tensors[prefix + ".down_proj"] = torch.stack([parts[e, "down"].t() for e in range(E)])
    return tensors
