"""EAGLE-3 draft head in the docs/formats.md checkpoint layout (SGLang's LlamaForCausalLMEagle3 names).

Step 0 fuses the target's three aux hidden states with `fc`; later steps feed the head its own output.
The draft input at position t is the pair (embedding of token t+1, hidden state of position t): the head
predicts token t+2. Layer: residual = h; x = cat[input_layernorm(emb), hidden_norm(h)] (2H) -> attention ->
+ residual -> post_attention_layernorm -> MLP -> + ; out = that sum (fed to the next step, pre-norm);
logits = lm_head(norm(out)) over the draft vocabulary, mapped to target ids by d2t. Released heads' variants
(infer/eagle3_config.py): residual = hidden_norm(h) (norm_before_residual); fc over an RMSNorm of the aux states
(norm_before_fc).
Shapes: B batch, T tokens, H draft hidden, Ht target hidden, N draft vocab.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn

from toolkit.infer.attention import Attention
from toolkit.infer.config import ModelConfig
from toolkit.infer.config_error import ConfigError
from toolkit.infer.draft_checks import aux_layer_problems, d2t_problems
from toolkit.infer.draft_head import (DraftHead, draft_config, load_weights, our_layer_key, draft_rope_keys,
                                     their_layer_key, write_draft_folder)
from toolkit.infer.eagle3_config import VARIANTS, read_eagle3_config
from toolkit.infer.family_keys import text_config
from toolkit.infer.model import MLP, Block
from toolkit.infer.norm import RMSNorm
from toolkit.infer.row_step import few_rows
from toolkit.infer.weight_files import read_weights


class Eagle3Layer(nn.Module):
    """The first layer: its attention reads cat[input_layernorm(emb), hidden_norm(h)] (2H)."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.self_attn = Attention(c, in_features=2 * c.hidden_size)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Eagle3Head(DraftHead):
    def __init__(self, c: ModelConfig, target_hidden: int, d2t: torch.Tensor, aux_layers: list[int],
                 norm_before_residual: bool = False, norm_before_fc: bool = False):
        super().__init__()
        self.config, self.aux_layers = c, list(aux_layers)
        # two variants of released heads (infer/eagle3_config.py): the residual taken after hidden_norm, and an
        # RMSNorm over the 3 aux states before fc
        self.norm_before_residual = norm_before_residual
        self.input_norm = RMSNorm(3 * target_hidden, c.rms_norm_eps) if norm_before_fc else None
        self.fc = nn.Linear(3 * target_hidden, c.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(c)
        # layers 2..n: plain Llama decoder layers over the hidden state (cache layers 1..n-1)
        self.additional_layers = nn.ModuleList(Block(c) for _ in range(c.num_layers - 1))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, len(d2t), bias=False)
        self.register_buffer("d2t", d2t.long())
        self.register_buffer("inv_freq", c.inv_freq(), persistent=False)

    def layers(self) -> list[nn.Module]:
        return [self.midlayer, *self.additional_layers]

    @property
    def norm_before_fc(self) -> bool:
        return self.input_norm is not None

    def take_variant(self, other: Eagle3Head) -> Eagle3Head:
        """`other`'s norm_before_residual / norm_before_fc on this head (training on from a released one)."""
        self.norm_before_residual = other.norm_before_residual
        if other.norm_before_fc and not self.norm_before_fc:
            self.input_norm = RMSNorm(other.input_norm.weight.shape[0], other.input_norm.eps)
        return self

    def variant_notes(self) -> list[str]:
        """Where a server would draft otherwise with this head's variant, if it has one."""
        flags = [f for f in VARIANTS if getattr(self, f)]
        return [(f"the head has {' and '.join(flags)} (a released head's variant): vLLM serves it as trained, "
                 "SGLang's LlamaForCausalLMEagle3 reads neither and would draft with another forward")] if flags else []

    def fused(self, hidden):
        """hidden: [B, T, 3Ht] aux features (step 0: fused by fc) or [B, T, H] the head's own output (as is)."""
        if hidden.shape[-1] == self.config.hidden_size:
            return hidden
        return self.fc(self.input_norm(hidden) if self.input_norm is not None else hidden)

    def fuse(self, emb, hidden):
        hidden = self.fused(hidden)
        n1, n2 = self.midlayer.input_layernorm, self.midlayer.hidden_norm
        if self.kernels == "triton":  # both norms and the concatenation as one kernel
            from toolkit.infer.kernels.layer_ops import rms_norm_pair

            x = rms_norm_pair(emb, n1.weight, hidden, n2.weight, n1.eps, n2.eps)
        else:
            x = torch.cat([n1(emb), n2(hidden)], -1)
        # norm_before_residual: the residual is the normed hidden state, x's second half (a copy: x stays intact)
        return (x[..., -hidden.shape[-1]:].contiguous() if self.norm_before_residual else hidden), x

    def fuse_rows(self, emb, hidden):
        """The two norms and their concatenation become the q/k/v GEMV's prologue (gemv "norm2")."""
        n1, n2 = self.midlayer.input_layernorm, self.midlayer.hidden_norm
        # the kernel takes one eps, and leaves the normed hidden state (a norm_before_residual residual) unwritten
        if n1.eps != n2.eps or self.norm_before_residual:
            return super().fuse_rows(emb, hidden)
        hidden = self.fused(hidden)
        return hidden, {"x": emb, "prologue": "norm2", "norm_w": n1.weight, "eps": n1.eps, "x2": hidden,
                        "norm_w2": n2.weight}

    def readout(self, h):
        if few_rows(h, self.kernels):  # the norm folded into the GEMV
            from toolkit.infer.kernels.gemv import gemv

            return gemv(h, self.lm_head.weight, "norm", self.norm.weight, self.norm.eps)
        return self.lm_head(self.norm(h))


def random_head(target: ModelConfig, vocab_ids: list[int] | None = None, seed: int = 0,
                num_layers: int = 1, **variant) -> Eagle3Head:
    """A randomly initialised head over `vocab_ids` (default: the whole target vocabulary), for tests; `variant`:
    norm_before_residual / norm_before_fc (their norms' weights drawn around 1)."""
    ids = torch.tensor(sorted(vocab_ids) if vocab_ids is not None else range(target.vocab_size))
    torch.manual_seed(seed)
    head = Eagle3Head(draft_config(target, num_layers), target.hidden_size, ids - torch.arange(len(ids)),
                      target.default_aux_layers(), **variant)
    for m in head.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
    if head.input_norm is not None:
        nn.init.normal_(head.input_norm.weight, 1.0, 0.2)
    return head.eval()


def load_eagle3(folder: str | Path, target: ModelConfig, dtype=torch.float32, device="cpu",
                lm_head: torch.Tensor | None = None) -> Eagle3Head:
    """Load a draft folder (config.json + model.safetensors, docs/formats.md section 7; or pytorch_model.bin,
    as SafeAILab's EAGLE-3 checkpoints ship) for `target`; a head that does not fit the target is refused with
    the mismatch named. lm_head: the target's [V, H], taken by a head that ships none (as SGLang and vLLM do)."""
    folder = Path(folder)
    layout = read_eagle3_config(json.loads((folder / "config.json").read_text()), folder)
    cfg, target_hidden = layout.config, layout.target_hidden  # the flat Llama config of the draft's layers
    try:
        c = ModelConfig.from_hf(cfg)
    except ConfigError as e:
        raise ConfigError(f"draft {folder}/config.json: {e}") from None
    aux = layout.aux_layers or target.default_aux_layers()
    problems = []
    if target_hidden != target.hidden_size:
        problems.append(f"target_hidden_size {target_hidden} != target hidden_size {target.hidden_size}")
    elif c.hidden_size != target.hidden_size:  # its input is cat[the target's embedding, fc's output]
        problems.append(f"hidden_size {c.hidden_size} != target hidden_size {target.hidden_size}: this engine feeds "
                        "the head the target's token embedding, so the head must be as wide as the target")
    if cfg.get("vocab_size", target.vocab_size) != target.vocab_size:
        problems.append(f"vocab_size {cfg['vocab_size']} != target vocab_size {target.vocab_size}")
    if max(aux) >= target.num_layers or min(aux) < 0:
        problems.append(f"aux layers {aux} outside the target's 0..{target.num_layers - 1}")
    w = {our_layer_key(k): v for k, v in read_weights(folder).items()}  # speculators / vLLM: layers.{k}
    fc_in = w["fc.weight"].shape[1] if "fc.weight" in w else None  # fc: [H, len(aux) * Ht]
    if fc_in is not None and fc_in != len(aux) * target_hidden:
        problems.append(f"fc.weight takes {fc_in} features, but {len(aux)} aux layers {aux} x target hidden "
                        f"{target_hidden} = {len(aux) * target_hidden} (eagle_aux_hidden_state_layer_ids does not "
                        "match the weights)")
    elif len(aux) != 3:
        problems.append(f"{len(aux)} aux layers {aux}: this EAGLE-3 head fuses exactly 3")
    n = cfg.get("draft_vocab_size") or target.vocab_size
    if "lm_head.weight" not in w:  # SGLang (draft_vocab_size null) and vLLM then read out through the target's
        if n != target.vocab_size:
            problems.append(f"no lm_head.weight, and a draft vocabulary of {n} of the target's {target.vocab_size}: "
                            "the target's lm_head stands in only for the whole vocabulary")
        elif lm_head is None:
            problems.append("no lm_head.weight, and no target lm_head given to stand in for it")
        else:
            w["lm_head.weight"] = lm_head
    rows = w["lm_head.weight"].shape[0] if "lm_head.weight" in w else n
    entries = len(w["d2t"]) if "d2t" in w else n
    if (rows, entries) != (n, n):  # SGLang and vLLM size the lm_head from the config
        problems.append(f"config.json draft_vocab_size {cfg.get('draft_vocab_size')} != the weights' {rows} "
                        f"lm_head rows / {entries} d2t entries")
    d2t = w.pop("d2t", torch.zeros(n, dtype=torch.long))  # absent d2t = identity (zeros), never arange
    w.pop("t2d", None)
    for k in ("embed_tokens.weight", "verifier_norm.weight", "verifier_lm_head.weight"):
        w.pop(k, None)  # the target's embedding (and norm, lm_head: speculators' training copies) are used
    ids = torch.arange(len(d2t)) + d2t
    top = int(ids.max())
    if top >= target.vocab_size:
        problems.append(f"d2t maps a draft id to target id {top}, beyond the target's vocab_size {target.vocab_size}")
    problems += d2t_problems(ids)
    if problems:
        raise ValueError(f"draft {folder} does not fit the target: " + "; ".join(problems))
    for note in aux_layer_problems(aux, target.num_layers):  # served right here; elsewhere it would not be
        print(f"WARNING: draft {folder}: {note}", file=sys.stderr)
    head = Eagle3Head(c, target_hidden, d2t, aux, layout.norm_before_residual, layout.norm_before_fc)
    load_weights(head, w, folder, ignore=("d2t",))
    return head.to(device=device, dtype=dtype).eval()


def save_eagle3(head: Eagle3Head, folder: str | Path, target_hf_config: dict, target: str,
                target_fingerprint: str, extra: dict | None = None) -> None:
    """Write a draft folder in the docs/formats.md section 7 layout (bf16 weights), atomically per file."""
    t = text_config(target_hf_config)  # with the sizes a multimodal one omits
    c, n = head.config, len(head.d2t)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": c.hidden_size,
           "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_heads,
           "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "hidden_act": "silu",
           "rms_norm_eps": c.rms_norm_eps, "num_hidden_layers": c.num_layers, "vocab_size": t["vocab_size"],
           "draft_vocab_size": n, "target_hidden_size": head.fc.in_features // 3,
           "max_position_embeddings": t.get("max_position_embeddings", c.max_position_embeddings),
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", **draft_rope_keys(t),
           **{k: t[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in t},
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": head.aux_layers, "use_aux_hidden_state": True},
           "eagle_aux_hidden_state_layer_ids": [i + 1 for i in head.aux_layers],
           "toolkit": {"format_version": 1, "head": "eagle3", "target": target,
                       "target_fingerprint": target_fingerprint, "target_vocab_size": t["vocab_size"],
                       "aux_layer_ids": head.aux_layers, **(extra or {})}}
    if head.variant_notes():  # a released head's variant (trained on from it), or a recipe's
        cfg.update({f: getattr(head, f) for f in VARIANTS})
        cfg["eagle_config"]["norm_before_fc"] = head.norm_before_fc
    # layer 0 as SGLang's `midlayer.`; more layers as vLLM's `layers.{k}` (SGLang does not serve them as written)
    weights = {their_layer_key(k, "midlayer."): v.detach().to(torch.bfloat16).contiguous()
               for k, v in head.state_dict().items() if k != "d2t"}
    ids = torch.arange(n) + head.d2t.cpu()
    weights["d2t"] = head.d2t.cpu().long().contiguous()
    weights["t2d"] = torch.zeros(t["vocab_size"], dtype=torch.bool).index_fill_(0, ids, True)
    write_draft_folder(folder, weights, cfg)
