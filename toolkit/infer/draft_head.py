"""What every draft head shares (EAGLE-3, EAGLE-1/2, MTP): the engine and the training-time-test unroll drive
them through this one interface.

A head reads the pair (embedding of token t+1, hidden state of position t) and predicts token t+2:
    residual, x = fuse(emb, hidden)            # the head's own input rule (fc / eh_proj / norms)
    h = residual + layers[0].self_attn(x)      # the first layer's attention over the draft's KV cache
    h = h + layers[0].mlp(post_attention_layernorm(h))
    h = layers[k](h) for k >= 1                # plain decoder blocks
    h = finish(h)                              # identity, or MTP's shared_head.norm
    logits = readout(h)                        # over the draft vocabulary (target ids via d2t)
`hidden` is the target's feature at step 0 (aux layers `aux_layers` of the target, concatenated) and the
head's own output `h` afterwards. Shapes: B batch, T tokens, H hidden, N draft vocab.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from toolkit.infer.attention import attention_masks, rope_cos_sin
from toolkit.infer.config import ModelConfig
from toolkit.infer.fp32 import KeepsFp32
from toolkit.infer.kv_cache import KVCache
from toolkit.infer.row_step import row_step, row_step_ok


class DraftHead(KeepsFp32):
    keep_fp32 = ("inv_freq",)
    config: ModelConfig
    aux_layers: list[int]   # target layers whose outputs feed step 0 (-1 = the final normed hidden state)
    d2t: torch.Tensor       # draft id -> target id offset [N]

    def fuse(self, emb: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (residual [B, T, H], input of the first layer's attention [B, T, *])."""
        raise NotImplementedError

    @property
    def graphable(self) -> bool:
        """False for a head with a MoE block (a DeepSeek / GLM NextN layer): its routing reads the experts hit
        on the host, so it runs eagerly."""
        from toolkit.infer.gpt_oss import GptOssMoE
        from toolkit.infer.moe import MoE

        return not any(isinstance(m, (MoE, GptOssMoE)) for m in self.modules())

    def fuse_rows(self, emb: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """fuse for row_step: (residual, the first q/k/v GEMV's input as kernels/gemv.gemv keywords), so that a
        head may fold its input rule into that GEMV's prologue (EAGLE-3's two norms)."""
        h, x = self.fuse(emb, hidden)
        return h, {"x": x}

    def finish(self, h: torch.Tensor) -> torch.Tensor:
        """The output hidden state after the last layer (fed to the next step and read out); MTP norms it."""
        return h

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        """[B, T, H] -> draft-vocabulary logits [B, T, N]."""
        raise NotImplementedError

    def layers(self) -> list[nn.Module]:
        """The first layer (attention + MLP after fuse), then plain decoder blocks."""
        raise NotImplementedError

    kernels = "torch"
    # MTP: the token embedding paired with position 0 enters as zeros (MiMo's and DeepSeek's MTP in vLLM, MiMo's in
    # SGLang: "not needed by MTP"); training (train/ttt.py) and the engine's prefill (Runner.extend, where
    # the host knows which rows start at 0: no kernel in draft steps) both follow it
    blank_position0 = False

    def set_kernels(self, kernels: str) -> "DraftHead":
        """Inference only (the Triton kernels have no backward): "torch", or "triton" for the fused kernels
        of model.Transformer.set_kernels; their RoPE + cache write needs fused projections (fuse_projections)."""
        from toolkit.infer.prepare import apply_kernels

        return apply_kernels(self, kernels)

    def new_cache(self, max_len: int, dtype=torch.float32, device="cpu", batch: int = 1) -> KVCache:
        return KVCache(replace(self.config, num_layers=len(self.layers())), batch, max_len, dtype, device)

    def step_inputs(self, positions: torch.Tensor, mask: torch.Tensor, dtype) -> tuple:
        """What a step derives from its positions [B, T] and mask [B, T, S] alone: (cos, sin, attention bias),
        each with B leading rows. A chain makes every step's at once (tree.grow_chain), not one set per step."""
        cos, sin = rope_cos_sin(positions, self.inv_freq, dtype, self.config.rope_attention_factor(), self.kernels)
        return cos, sin, attention_masks(mask, dtype, self.kernels)

    def forward(self, emb, hidden, positions, cache: KVCache, slots=None, mask=None, kv_len: int | None = None,
                log_probs: bool = True, pre: tuple | None = None):
        """emb [B, T, H]; hidden [B, T, *]; positions/slots [B, T]; mask bool [B, T, S] (default causal).
        Returns (log-probs over the draft vocab [B, T, N], output hidden [B, T, H]). kv_len (= S, with a
        mask): the cache slots attended, given by CUDA-graph callers (no host sync on the slots).
        log_probs False: the logits instead (same order per row: enough for a greedy chain's argmax, and one
        kernel less, the log-softmax over N). pre: step_inputs(positions, mask) made by the caller."""
        slots = positions if slots is None else slots
        if kv_len is None:  # a mask says how many slots it covers; else the slots written reach
            kv_len = mask.shape[-1] if mask is not None else int(slots.max()) + 1
        if kv_len > cache.max_len:
            raise ValueError(f"draft needs {kv_len} cache slots but its KV cache holds {cache.max_len}")
        if mask is None:
            mask = torch.arange(kv_len, device=emb.device)[None, None, :] <= positions[:, :, None]
        cos, sin, bias = pre if pre is not None else self.step_inputs(positions, mask, emb.dtype)
        first, *rest = self.layers()
        if row_step_ok(first.self_attn, first.mlp, emb, cache, slots):  # <= 16 rows on Triton: norms etc. in GEMVs
            h, qkv_in = self.fuse_rows(emb, hidden)
            h = row_step(first.self_attn, first.mlp, first.post_attention_layernorm, qkv_in, h, cos, sin, bias,
                         cache, 0, slots, kv_len)
        else:
            h, x = self.fuse(emb, hidden)
            a = first.self_attn(x, cos, sin, bias, cache, 0, slots, kv_len)
            h, x = first.post_attention_layernorm(a, residual=h)  # h + a, and its norm
            h = h + first.mlp(x)
        for k, layer in enumerate(rest):
            h = layer(h, cos, sin, bias, cache, k + 1, slots, kv_len)
        h = self.finish(h)
        logits = self.readout(h)
        return (torch.log_softmax(logits, -1, dtype=torch.float32) if log_probs else logits), h  # upcast inside

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def greedy_next(self, logits: torch.Tensor, embed: nn.Embedding | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A greedy chain's next token: logits (or log-probs) [B, N] -> (target ids [B], their embeddings [B, H],
        the next step's input; None without `embed`). On Triton one kernel (kernels/greedy_pick.py) instead of
        argmax, d2t lookup, add and embedding."""
        if self.kernels == "triton" and (embed is None or embed.weight.stride(-1) == 1):
            from toolkit.infer.kernels import greedy_pick as kernel

            return kernel.greedy_pick(logits, self.d2t, None if embed is None else embed.weight)
        tok = self.to_target(logits.argmax(-1))
        return tok, None if embed is None else embed(tok)


    def sampled_next(self, logits: torch.Tensor, gumbel: torch.Tensor, inv_temp: torch.Tensor,
                     embed: nn.Embedding | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """A sampled chain's next token: logits (or log-probs) [B, N], Gumbel noise [B, N], 1 / T [B] -> (the law
        drawn from, log-probs [B, N] float32; target ids [B] of argmax(logp / T + noise); their embeddings [B, H]
        or None without `embed`). On Triton one kernel (kernels/sampled_pick.py)."""
        if self.kernels == "triton" and (embed is None or embed.weight.stride(-1) == 1):
            from toolkit.infer.kernels import sampled_pick as kernel

            return kernel.sampled_pick(logits, gumbel, inv_temp, self.d2t, None if embed is None else embed.weight)
        logp = torch.log_softmax(logits, -1, dtype=torch.float32)
        tok = self.to_target((logp * inv_temp.float()[:, None] + gumbel.float()).argmax(-1))
        return logp, tok, None if embed is None else embed(tok)


def draft_config(target: ModelConfig, num_layers: int = 1, intermediate_size: int | None = None) -> ModelConfig:
    """EAGLE heads are plain Llama layers of the target's sizes (full attention, no biases or sinks) whatever the
    target's family; over a target that rotates part of each head (GLM-4.5, Phi-4-mini) they rotate whole heads
    with unscaled RoPE of the target's theta, as SpecForge's Phi-4-mini config and SGLang's Llama draft layer do
    (draft_rope_keys). intermediate_size: the head's MLP width (None: the target's)."""
    partial = {"rotary_dim": None, "rope_scaling": {}} if target.rotary_dim is not None else {}
    if intermediate_size is not None:
        partial["intermediate_size"] = intermediate_size
    return replace(target, model_type="llama", num_layers=num_layers, qkv_bias=False, qk_norm=False,
                   attention_bias=False, tie_word_embeddings=False, mla=None, moe=None, sliding_window=None,
                   full_layers=(), attention_sinks=False, gemma=None, llama4=None, **partial,
                   head_dim=target.hidden_size // target.num_heads if target.mla else target.head_dim)


def vocab_rows(lm_head: torch.Tensor, vocab_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A readout over the target's lm_head [V, H], optionally truncated to FR-Spec's `vocab_ids`:
    (weight rows [N, H], d2t [N])."""
    ids = torch.arange(lm_head.shape[0]) if vocab_ids is None else vocab_ids.sort().values
    return lm_head[ids].clone(), ids - torch.arange(len(ids))


def write_draft_folder(folder: str | Path, weights: dict[str, torch.Tensor], config: dict) -> None:
    """A draft folder: model.safetensors (the tensors as given) and config.json, each written atomically."""
    from safetensors.torch import save_file

    from toolkit.atomic import atomic_path, write_text

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / "model.safetensors") as tmp:
        save_file({k: v.contiguous().cpu() for k, v in weights.items()}, str(tmp), metadata={"format": "pt"})
    write_text(folder / "config.json", json.dumps(config, indent=2) + "\n")


def rope_keys(target_hf_config: dict) -> dict:
    """The target's RoPE settings for a draft's config.json in both spellings, whichever the target used:
    transformers 5's `rope_parameters` and 4.x's `rope_theta` / `rope_scaling`. Both are needed: SGLang's Llama
    reads `rope_theta` (10000 when absent), and vLLM under transformers 4 overwrites `rope_parameters`' theta
    with the top-level one, so a draft written with `rope_parameters` alone is served with the wrong base."""
    from toolkit.infer.gemma_config import gemma_rope

    t = target_hf_config.get("text_config", target_hf_config)
    t = gemma_rope(t.get("model_type"), t)[0]  # Gemma 3: its full-attention layers' RoPE
    scaling = dict(t.get("rope_parameters") or t.get("rope_scaling") or {})
    theta = float(scaling.pop("rope_theta", t.get("rope_theta", 10000.0)))
    kind = scaling.pop("rope_type", scaling.pop("type", "default"))
    if kind in ("llama3", "yarn", "longrope") and t.get("original_max_position_embeddings") is not None:
        # the top-level value wins over the dict's in transformers (rope.resolve; Phi-3's class default 4096 among
        # them): the draft's dict says the one its target was run with, which is the one it trained with
        scaling["original_max_position_embeddings"] = t["original_max_position_embeddings"]
    keys = {"rope_theta": theta, "rope_parameters": {"rope_theta": theta, "rope_type": kind, **scaling}}
    if kind != "default":
        keys["rope_scaling"] = {"rope_type": kind, **scaling}
    return keys


def draft_rope_keys(target_hf_config: dict) -> dict:
    """rope_keys for an EAGLE draft's config.json: the target's, or, when the target rotates part of each head,
    unscaled RoPE of its theta over whole heads (draft_config)."""
    from toolkit.infer.families import PARTIAL_ROPE
    from toolkit.infer.rope import rotary_fraction

    keys, t = rope_keys(target_hf_config), target_hf_config.get("text_config", target_hf_config)
    kind = t.get("model_type")
    if kind not in PARTIAL_ROPE or rotary_fraction(t, PARTIAL_ROPE[kind]) == 1:
        return keys
    theta = keys["rope_theta"]
    return {"rope_theta": theta, "rope_parameters": {"rope_theta": theta, "rope_type": "default"}}


def our_layer_key(name: str) -> str:
    """A checkpoint's layer names -> ours: layers.0.* -> midlayer.*, layers.k.* -> additional_layers.{k-1}.*
    (SafeAILab's EAGLE, speculators and vLLM spell the draft's decoder layers layers.{k})."""
    if not name.startswith("layers."):
        return name
    _, k, rest = name.split(".", 2)
    return f"midlayer.{rest}" if k == "0" else f"additional_layers.{int(k) - 1}.{rest}"


def their_layer_key(name: str, first: str = "layers.0.") -> str:
    """Ours -> a checkpoint's: midlayer.* -> `first`*, additional_layers.{k}.* -> layers.{k+1}.*."""
    if name.startswith("midlayer."):
        return first + name.removeprefix("midlayer.")
    if name.startswith("additional_layers."):
        _, k, rest = name.split(".", 2)
        return f"layers.{int(k) + 1}.{rest}"
    return name


def load_weights(head: nn.Module, weights: dict[str, torch.Tensor], folder, ignore=(),
                 shapes_from: str = "its config.json") -> None:
    """Load a draft's weights into `head`, built from `shapes_from` (its config.json; an MTP module's block is the
    target's): every weight must be there (but those in `ignore`), none unknown, and each of the shape that config
    gives (else the mismatches are named)."""
    try:
        missing, unexpected = head.load_state_dict(weights, strict=False)
    except RuntimeError as e:
        sizes = [line.strip() for line in str(e).splitlines() if "size mismatch" in line]
        raise ValueError(f"draft {folder}: its weights do not have the shapes {shapes_from} gives: "
                         + "; ".join(sizes[:3])) from None
    missing = [k for k in missing if k not in ignore]
    if missing or unexpected:
        raise ValueError(f"draft {folder}: weights left unmapped: missing {missing[:8]}, unexpected "
                         f"{unexpected[:8]}")
