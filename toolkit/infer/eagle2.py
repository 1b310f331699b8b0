"""EAGLE-1/2 draft heads (SafeAILab layout) served with the same engine, optionally over an FR-Spec vocab.

The head takes the target's final (normed) hidden state: at position t the pair (embedding of token t+1,
hidden t) goes through fc (2H -> H, with or without a bias) and one Llama decoder layer whose input_layernorm is
skipped (EAGLE's layer 0); its output is a predicted hidden state, read out by the target's own lm_head. With an
FR-Spec `freq_N.pt` the lm_head keeps only those N rows (ids sorted, mapped back through d2t).
Checkpoint: config.json (LlamaConfig, 1 layer) + model.safetensors or pytorch_model.bin with fc.weight
[H, 2H], fc.bias, layers.0.{self_attn,mlp,post_attention_layernorm}.* (embed_tokens ignored).
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from toolkit.infer.attention import Attention
from toolkit.infer.config import ModelConfig
from toolkit.infer.config_error import ConfigError
from toolkit.infer.draft_head import (DraftHead, load_weights, our_layer_key, draft_rope_keys,
                                     their_layer_key, vocab_rows, write_draft_folder)
from toolkit.infer.family_keys import text_config
from toolkit.infer.model import MLP, Block
from toolkit.infer.norm import RMSNorm
from toolkit.infer.row_step import few_rows
from toolkit.infer.weight_files import read_weights


class Eagle2Layer(nn.Module):
    """EAGLE's layer 0: attention straight over fc's output (no input_layernorm), then the MLP."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.self_attn, self.mlp = Attention(c), MLP(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Eagle2Head(DraftHead):
    """Reads the target's final normed hidden state (aux layer -1); logits through the target's lm_head rows."""

    def __init__(self, c: ModelConfig, lm_head: torch.Tensor, vocab_ids: torch.Tensor | None = None,
                 fc_bias: bool = True):
        """fc_bias: SafeAILab's config key `bias` (default true); some public heads (EAGLE-LLaMA3.1) have none."""
        super().__init__()
        rows, d2t = vocab_rows(lm_head, vocab_ids)
        self.config, self.aux_layers = c, [-1]
        self.fc = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=fc_bias)
        self.midlayer = Eagle2Layer(c)
        self.additional_layers = nn.ModuleList(Block(c) for _ in range(c.num_layers - 1))
        self.lm_head = nn.Linear(c.hidden_size, len(d2t), bias=False)
        self.lm_head.weight = nn.Parameter(rows, requires_grad=False)  # the target's, frozen
        self.register_buffer("d2t", d2t.long())
        self.register_buffer("inv_freq", c.inv_freq(), persistent=False)

    def layers(self) -> list[nn.Module]:
        return [self.midlayer, *self.additional_layers]

    def fuse(self, emb, hidden):
        x = self.fc(torch.cat([emb, hidden.to(emb.dtype)], dim=-1))                 # [B, T, H]
        return x, x

    def fuse_rows(self, emb, hidden):
        """On row_step's path: fc as one GEMV over the two tensors (gemv "cat2": no concatenation kernel)."""
        from toolkit.infer.kernels.gemv import gemv

        x = gemv(emb, self.fc.weight, "cat2", x2=hidden.to(emb.dtype), bias=self.fc.bias)   # [B, T, H]
        return x, {"x": x}

    def readout(self, h):
        if few_rows(h, self.kernels):  # the tuned GEMV (the target's own lm_head shape) instead of cuBLAS
            from toolkit.infer.kernels.gemv import gemv

            return gemv(h, self.lm_head.weight)
        return self.lm_head(h)


def load_eagle2(folder: str | Path, target, token_map: str | Path | None = None, dtype=torch.float32) -> Eagle2Head:
    """Load an EAGLE-1/2 folder for `target` (a Transformer: its lm_head is shared), with an optional FR-Spec
    freq_N.pt. Misfits are refused with the mismatch named."""
    from toolkit.tokenmap.maps import check_ids_fit, load_freq

    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    try:
        c = ModelConfig.from_hf({**cfg, "model_type": "llama"})
    except ConfigError as e:
        raise ConfigError(f"draft {folder}/config.json: {e}") from None
    if c.hidden_size != target.config.hidden_size:
        raise ValueError(f"draft {folder}: hidden_size {c.hidden_size} != target's {target.config.hidden_size}")
    # the embedding and lm_head are the target's, as SGLang (load_weights skips "lm_head") and vLLM (the proposer
    # takes the target's lm_head) serve an EAGLE-1/2 head: a copy shipped in the folder is not read
    w = {k.removeprefix("model."): v for k, v in read_weights(folder).items()
         if not k.endswith(("embed_tokens.weight", "inv_freq")) and k != "lm_head.weight"}
    w = {our_layer_key(k): v for k, v in w.items() if not k.startswith("layers.0.input_layernorm")}
    if cfg.get("qkv_bias") or any(k.endswith("self_attn.q_proj.bias") for k in w):  # SafeAILab's Qwen2 heads
        c = replace(c, qkv_bias=True)  # (cnets1.py: bias=config.qkv_bias), which the Llama reading above drops
    # SafeAILab's `bias` key (its default true); a folder without the key (vLLM's layout, no fc bias) has it or not
    fc_bias = bool(cfg["bias"]) if "bias" in cfg else "fc.bias" in w
    if fc_bias and "fc.bias" in w and not w["fc.bias"].any():  # a head trained without one is written with zeros
        del w["fc.bias"]
        fc_bias = False
    ids = None
    if token_map is not None:
        ids = load_freq(token_map)
        check_ids_fit(ids, target.config.vocab_size, f"token map {token_map}")
        ids = torch.tensor(ids)
    head = Eagle2Head(c, target.lm_head.weight.detach().float().cpu(), ids, fc_bias=fc_bias)
    load_weights(head, w, folder, ignore=("d2t", "lm_head.weight"))
    return head.to(dtype=dtype, device=target.embed_tokens.weight.device).eval()


def save_eagle(head: Eagle2Head, folder: str | Path, target_hf_config: dict, target: str, target_fingerprint: str,
               extra: dict | None = None) -> None:
    """Write a draft folder in the SafeAILab EAGLE layout (SGLang: LlamaForCausalLMEagle), bf16, atomically
    per file: fc.{weight,bias}, layers.{k}.* (layer 0 has no input_layernorm, as in SafeAILab's model); the
    lm_head and embedding are the target's and are not written. No `bias` key: SafeAILab reads it as fc's bias
    (default true), but SGLang's and vLLM's Llama layers read it as attention biases, which the head has not.
    A head without an fc bias is written with a zero one, since SGLang's fc always has one, and is named for
    vLLM too (its EagleLlamaForCausalLM has none and skips the zeros); one with a bias is not, as vLLM would
    drop it."""
    t = text_config(target_hf_config)  # with the sizes a multimodal one omits
    c, has_bias = head.config, head.fc.bias is not None
    weights = {}
    for k, v in head.state_dict().items():
        if k in ("d2t", "lm_head.weight"):
            continue
        weights[their_layer_key(k)] = v
    if not has_bias:
        weights["fc.bias"] = torch.zeros(c.hidden_size)
    weights = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in weights.items()}
    # SGLang and vLLM each take the first name of the list they register; vLLM prefixes "Eagle" to the names
    # that lack it first (vllm/transformers_utils/configs/eagle.py), so this one reads EagleLlamaForCausalLM
    names = ["LlamaForCausalLMEagle"] + ([] if has_bias else ["EagleLlamaForCausalLM"])
    cfg = {"architectures": names, "model_type": "llama", "hidden_size": c.hidden_size,
           "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_heads,
           "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "hidden_act": "silu",
           "rms_norm_eps": c.rms_norm_eps, "num_hidden_layers": c.num_layers, "vocab_size": t["vocab_size"],
           "max_position_embeddings": t.get("max_position_embeddings", c.max_position_embeddings),
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", **draft_rope_keys(t),
           **{k: t[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in t},
           "toolkit": {"format_version": 1, "head": "eagle", "target": target,
                       "target_fingerprint": target_fingerprint, "target_vocab_size": t["vocab_size"],
                       "fc_bias": has_bias, **(extra or {})}}
    write_draft_folder(folder, weights, cfg)

