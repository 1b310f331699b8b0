"""Multi-token-prediction (MTP) draft modules, DeepSeek-V3 "NextN" style, served as a chain draft.

One module predicts token t+2 from (token t+1, the target's final normed hidden state at t):
    x = eh_proj(cat[enorm(embed(t+1)), hnorm(h_t)])        # 2H -> H
    h = x + attn(input_layernorm(x)); h = h + mlp(post_attention_layernorm(h))   # one block of the target's kind
    out = shared_head.norm(h)                               # fed to the next step (as SGLang feeds it back)
    logits = lm_head(out)                                   # the target's lm_head and embedding, shared, frozen
Applied k times for a k-token chain, as SGLang's NEXTN does with one layer. The embedding paired with position 0
(token 1 with h_0) enters as zeros, as vLLM's DeepSeek / MiMo MTP and SGLang's MiMoMTP feed it.

Weight layouts read (docs/formats.md section 14):
- MiMo: `model.mtp_layers.{i}.{token_layernorm, hidden_layernorm, input_proj, final_layernorm, <block>}`;
  MiMo concatenates [hidden, embedding] (the reverse of DeepSeek), so input_proj's two column halves swap.
  Our exported draft folders use this layout (SGLang loads it as `MiMoMTP`, vLLM as `MiMoMTPModel`).
- DeepSeek-V3: `model.layers.{num_hidden_layers + i}.{enorm, hnorm, eh_proj, shared_head.norm, <block>}`
  (embed_tokens and shared_head.head are the target's and are not read).
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from toolkit.infer import fp8
from toolkit.infer.config import ModelConfig
from toolkit.infer.draft_head import DraftHead, load_weights, rope_keys, vocab_rows, write_draft_folder
from toolkit.infer.family_keys import text_config
from toolkit.infer.model import Block, refuse_unlike_llama
from toolkit.infer.norm import RMSNorm
from toolkit.infer.row_step import few_rows
from toolkit.infer.weight_files import read_safetensors, weight_files

MIMO = {"token_layernorm": "enorm", "hidden_layernorm": "hnorm", "input_proj": "eh_proj",
        "final_layernorm": "shared_head.norm"}
DEEPSEEK = {"enorm": "enorm", "hnorm": "hnorm", "eh_proj": "eh_proj", "shared_head.norm": "shared_head.norm"}


class MTPHead(DraftHead):
    blank_position0 = True

    def __init__(self, c: ModelConfig, lm_head: torch.Tensor, vocab_ids: torch.Tensor | None = None):
        """c: the target's config (the block is of its kind); lm_head: the target's [V, H]."""
        super().__init__()
        refuse_unlike_llama(c, "an MTP head (a block of the target's kind, run as Llama's layer pieces)")
        rows, d2t = vocab_rows(lm_head, vocab_ids)
        self.config, self.aux_layers = replace(c, num_layers=1), [-1]
        H = c.hidden_size
        self.enorm, self.hnorm = RMSNorm(H, c.rms_norm_eps), RMSNorm(H, c.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.block = Block(self.config, c.num_layers - 1)  # of the kind of the target's last layer (MoE on DeepSeek)
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(H, c.rms_norm_eps)
        self.lm_head = nn.Linear(H, len(d2t), bias=False)
        self.lm_head.weight = nn.Parameter(rows, requires_grad=False)  # the target's, frozen
        self.register_buffer("d2t", d2t.long())
        self.register_buffer("inv_freq", c.inv_freq(), persistent=False)

    def layers(self) -> list[nn.Module]:
        return [self.block]

    def fuse(self, emb, hidden):
        x = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(hidden.to(emb.dtype))], -1))   # [B, T, H]
        return x, self.block.input_layernorm(x)

    def fuse_rows(self, emb, hidden):
        """On row_step's path: eh_proj as a GEMV whose prologue is both norms (gemv "norm2"), the block's input
        norm folded into the q/k/v GEMV: one kernel where fuse runs five."""
        from toolkit.infer.kernels.gemv import gemv

        if self.enorm.eps != self.hnorm.eps:
            return super().fuse_rows(emb, hidden)
        x = gemv(emb, self.eh_proj.weight, "norm2", self.enorm.weight, self.enorm.eps, x2=hidden.to(emb.dtype),
                 norm_w2=self.hnorm.weight)                                               # [B, T, H]
        n = self.block.input_layernorm
        return x, {"x": x, "prologue": "norm", "norm_w": n.weight, "eps": n.eps}

    def finish(self, h):
        return self.shared_head.norm(h)

    def readout(self, h):
        if few_rows(h, self.kernels):  # the tuned GEMV (the target's own lm_head shape) instead of cuBLAS
            from toolkit.infer.kernels.gemv import gemv

            return gemv(h, self.lm_head.weight)
        return self.lm_head(h)

    def trained_state(self) -> dict[str, torch.Tensor]:
        """The weights a checkpoint holds (not the target's lm_head)."""
        return {k: v for k, v in self.state_dict().items() if k not in ("lm_head.weight", "d2t")}


def _swap_halves(w: torch.Tensor) -> torch.Tensor:
    """[H, 2H] with columns [a | b] -> [b | a] (MiMo's [hidden, emb] order <-> DeepSeek's [emb, hidden])."""
    a, b = w.chunk(2, dim=1)
    return torch.cat([b, a], 1)


def find_layout(folder: Path, cfg: dict) -> tuple[str, str, int]:
    """(layout, weight prefix, number of MTP layers) of the MTP weights in `folder`, or a clear error."""
    names = set()
    for f in weight_files(folder):
        with read_safetensors(f, "weights") as sf:
            names |= set(sf.keys())
    text = cfg.get("text_config", cfg)
    n_layers = text.get("num_hidden_layers", 0)
    mimo = sorted({int(m.group(1)) for k in names if (m := re.match(r"model\.mtp_layers\.(\d+)\.", k))})
    if mimo:
        return "mimo", f"model.mtp_layers.{mimo[0]}.", len(mimo)
    # the MTP layers are the ones with an eh_proj: model.layers.{num_hidden_layers + i} in a DeepSeek-V3 folder,
    # model.layers.{i} in one SGLang's export_deepseek_nextn.py wrote (the MTP layers alone, renumbered from 0,
    # num_hidden_layers == num_nextn_predict_layers, which a full model may have too); without any eh_proj the
    # layers past the body are taken, so that loading names the tensors they lack
    eh_proj = re.compile(r"model\.layers\.(\d+)\.eh_proj\.weight")
    nextn = sorted({int(m.group(1)) for k in names if (m := eh_proj.fullmatch(k))})
    if not nextn:
        nextn = sorted({int(m.group(1)) for k in names if (m := re.match(r"model\.layers\.(\d+)\.", k))
                        and int(m.group(1)) >= n_layers})
    if nextn and text.get("num_nextn_predict_layers"):
        return "deepseek", f"model.layers.{nextn[0]}.", len(nextn)
    raise ValueError(f"{folder}: no MTP weights found (looked for model.mtp_layers.{{i}}.* (MiMo) and "
                     f"model.layers.{{num_hidden_layers + i}}.* with num_nextn_predict_layers (DeepSeek-V3))")


def load_mtp(folder: str | Path, target, token_map: str | Path | None = None, dtype=torch.float32) -> MTPHead:
    """The first MTP module in `folder` (our draft folder, or a target that ships MTP layers) for `target`
    (a Transformer whose lm_head is shared). Every weight of the module must be found: none is left random."""
    from toolkit.tokenmap.maps import check_ids_fit, load_freq

    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    layout, prefix, count = find_layout(folder, cfg)
    if count > 1:
        print(f"{folder}: {count} MTP layers; drafting with the first, applied once per draft step",
              file=sys.stderr)
    names = MIMO if layout == "mimo" else DEEPSEEK
    w, pending = {}, fp8.Pending(cfg)  # an FP8 checkpoint's (DeepSeek-V3's) weights and scales, joined below
    for f in weight_files(folder):
        with read_safetensors(f, "weights") as sf:
            for key in sf.keys():
                if not key.startswith(prefix):
                    continue
                rest = key[len(prefix):]
                if rest.startswith(("embed_tokens.", "shared_head.head.")):
                    continue  # the target's embedding and lm_head are used
                if rest.endswith("rotary_emb.inv_freq"):
                    continue  # a cached buffer older transformers saved; computed from the config, as load_target does
                special = next((ours + rest[len(theirs):] for theirs, ours in names.items()
                                if rest.startswith(theirs + ".")), None)
                ours = special or f"block.{rest}"
                if not pending.take(sf, key, ours):  # an FP8 weight or scale: dequantized below
                    w[ours] = sf.get_tensor(key).float()
    w.update(pending.dequantized(torch.float32, f"MTP draft {folder}"))
    if layout == "mimo" and "eh_proj.weight" in w:
        w["eh_proj.weight"] = _swap_halves(w["eh_proj.weight"])
    tc = target.config
    if w.get("eh_proj.weight") is not None and tuple(w["eh_proj.weight"].shape) != (tc.hidden_size, 2 * tc.hidden_size):
        raise ValueError(f"MTP draft {folder}: eh_proj {tuple(w['eh_proj.weight'].shape)} does not fit the "
                         f"target's hidden size {tc.hidden_size}")
    if not tc.qkv_bias:  # a Llama-kind block written in MiMo's (Qwen2) layout carries zero q/k/v biases
        for k in [k for k in w if re.fullmatch(r"block\.self_attn\.[qkv]_proj\.bias", k)]:
            if w[k].abs().max() > 0:
                raise ValueError(f"MTP draft {folder}: {k} is non-zero but the target's attention has no bias")
            del w[k]
    ids = None
    if token_map is not None:
        ids = load_freq(token_map)
        check_ids_fit(ids, tc.vocab_size, f"token map {token_map}")
        ids = torch.tensor(ids)
    head = MTPHead(tc, target.lm_head.weight.detach().float().cpu(), ids)
    load_weights(head, w, f"{folder} (MTP, {layout} layout)", ignore=("d2t", "lm_head.weight"),
                 shapes_from="the target's config.json")
    return head.to(dtype=dtype, device=target.embed_tokens.weight.device).eval()


def save_mtp(head: MTPHead, folder: str | Path, target_hf_config: dict, target: str, target_fingerprint: str,
             extra: dict | None = None) -> None:
    """Write a draft folder in MiMo's MTP layout (bf16), which SGLang loads as `MiMoMTP` and vLLM as
    `MiMoMTPModel`, atomically per file."""
    t = text_config(target_hf_config)  # with the sizes a multimodal one omits (a copy)
    ours_to_mimo = {v: k for k, v in MIMO.items()}
    weights = {}
    for k, v in head.trained_state().items():
        special = next((ours_to_mimo[o] + k[len(o):] for o in ours_to_mimo if k.startswith(o + ".")), None)
        name = special or k.removeprefix("block.")
        weights[f"model.mtp_layers.0.{name}"] = v
    weights["model.mtp_layers.0.input_proj.weight"] = _swap_halves(weights["model.mtp_layers.0.input_proj.weight"])
    c = head.config
    if not c.qkv_bias:  # MiMo's block is Qwen2's (q/k/v with bias): zeros keep a Llama block exact
        for p, n in (("q", c.num_heads), ("k", c.num_kv_heads), ("v", c.num_kv_heads)):
            weights[f"model.mtp_layers.0.self_attn.{p}_proj.bias"] = torch.zeros(n * c.head_dim)
    weights = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in weights.items()}
    t.pop("dtype", None)  # transformers 5's spelling of torch_dtype wins over it in 4.x and 5.x alike
    for key in ("quantization_config", "compression_config"):  # an FP8 target's: these tensors are bf16, and
        t.pop(key, None)  # SGLang and vLLM would build quantized layers for them from the key
    # the target architecture both servers turn into their MiMo MTP class when it names a draft: SGLang's
    # ModelConfig into MiMoMTP, vLLM's SpeculativeConfig.hf_config_override into MiMoMTPModel (which has no
    # entry named MiMoMTP)
    # no remote code travels with the draft: a target's auto_map (MiMo's configuration_mimo.MiMoConfig, Phi-3's)
    # would make transformers' AutoConfig, both servers' first read, look for files the folder lacks; MiMo's
    # config class is Qwen2's (MiMoConfig(Qwen2Config)), which transformers itself knows
    t.pop("auto_map", None)
    kind = t.get("model_type")
    if kind == "mimo":
        t["model_type"] = "qwen2"
    cfg = {**t, **rope_keys(t), "architectures": ["MiMoForCausalLM"], "num_nextn_predict_layers": 1,
           "torch_dtype": "bfloat16",
           "toolkit": {"format_version": 1, "head": "mtp", "layout": "mimo", "target": target,
                       "target_fingerprint": target_fingerprint, "target_vocab_size": t["vocab_size"],
                       "target_model_type": kind, **(extra or {})}}
    write_draft_folder(folder, weights, cfg)
