"""Target transformer (Llama family: Llama 2/3/3.1, Mistral, Qwen2/2.5, Qwen3, Phi-3/4, SmolLM2; with MoE MLPs
Mixtral, Qwen2-MoE, Qwen3-MoE, GLM-4.5, GPT-OSS; DeepSeek-V3 / Kimi-K2; Gemma 2 / 3 with gemma.py's layer),
gpt-fast style.

One forward serves prefill, decode and tree verification: each token has a rope position and a cache slot
it is written to, and attends to the cache slots its mask allows. It returns logits and the hidden states
of chosen layers (EAGLE-3 takes three): the OUTPUT of layer l, i.e. the residual stream before any final
norm, which is transformers' `hidden_states[l + 1]` (index 0 is the embedding) and the tensor SGLang
captures as the input of layer l + 1.
The layer's attention, with the rope tables and masks a forward builds for it, is in attention.py; RMSNorm in
norm.py; this module holds the MLP, the decoder layer (Block) and the Transformer.
Shapes: B batch, T new tokens, S cache slots, H hidden, D head dim, Hq/Hkv query/key-value heads, V vocab.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.infer.attention import Attention, attention_masks, rope_cos_sin
from toolkit.infer.config import ModelConfig
from toolkit.infer.fp32 import Fp32Readout
from toolkit.infer.gemma import GemmaBlock, embed_scale, soft_cap
from toolkit.infer.llama4 import same_chunk, temperature
from toolkit.infer.kv_cache import KVCache
from toolkit.infer.norm import RMSNorm
from toolkit.infer.row_step import few_rows, row_step, row_step_ok


def refuse_unlike_llama(c: ModelConfig, what: str) -> None:
    """A path that runs the Llama layer's pieces directly (the compiled CPU step, MTP's block) refuses the families
    whose layers differ, by name: they run eagerly or in CUDA graphs, with the torch or the Triton kernels."""
    why = ("(1 + w) sandwich norms, scaled and soft-capped attention, GELU" if c.gemma is not None else
           "NoPE and chunked layers, L2 q/k norms, tuned query temperature" if c.llama4 is not None else None)
    if why:
        raise ValueError(f"{what} does not cover {c.model_type} targets ({why}); they run eagerly or in CUDA "
                         "graphs, with --kernels torch or triton")


class MLP(nn.Module):
    kernels = "torch"  # per instance: Transformer.set_kernels

    def __init__(self, c: ModelConfig, intermediate: int | None = None):  # a MoE expert has its own size
        super().__init__()
        inner = intermediate or c.intermediate_size
        self.gate_proj = nn.Linear(c.hidden_size, inner, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, inner, bias=False)
        self.down_proj = nn.Linear(inner, c.hidden_size, bias=False)
        self.register_buffer("gate_up", None, persistent=False)   # fused [gate; up] weight: Transformer.fuse
        self.gelu = None if c.gemma is None else c.gemma.gelu_approximate  # Gemma's GELU, else SiLU

    def forward(self, x):
        if self.gelu is not None:
            gate, up = (self.gate_proj(x), self.up_proj(x)) if self.gate_up is None else \
                F.linear(x, self.gate_up).chunk(2, dim=-1)
            return self.down_proj(F.gelu(gate, approximate=self.gelu) * up)
        if self.gate_up is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        if self.kernels == "triton":
            from toolkit.infer.kernels.layer_ops import silu_mul

            return self.down_proj(silu_mul(F.linear(x, self.gate_up)))
        gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, c: ModelConfig, layer: int = 0):
        """Layer `layer` of a model of config c: DeepSeek's MLA, Llama 4's (llama4.py), else Llama's attention; a MoE
        MLP where the config's moe makes the layer sparse (moe.py; GPT-OSS's: gpt_oss.py; Llama 4's), else Llama's."""
        super().__init__()
        from toolkit.infer.deepseek import MLAAttention
        from toolkit.infer.gpt_oss import GptOssMoE
        from toolkit.infer.llama4 import Llama4Attention, Llama4MoE
        from toolkit.infer.moe import MoE

        self.self_attn = MLAAttention(c) if c.mla is not None else Llama4Attention(c, layer) if c.llama4 else \
            Attention(c)
        if c.moe is not None and c.moe.sparse(layer):
            self.mlp = {"topk_softmax": GptOssMoE, "llama4": Llama4MoE}.get(c.moe.scoring, MoE)(c)
        else:
            self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.norm_fp32_product)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.norm_fp32_product)

    def forward(self, h, cos, sin, mask, cache, layer, slots, kv_len):
        if row_step_ok(self.self_attn, self.mlp, h, cache, slots):
            norm = self.input_layernorm
            return row_step(self.self_attn, self.mlp, self.post_attention_layernorm,
                            {"x": h, "prologue": "norm", "norm_w": norm.weight, "eps": norm.eps}, h,
                            cos, sin, mask, cache, layer, slots, kv_len)
        a = self.self_attn(self.input_layernorm(h), cos, sin, mask, cache, layer, slots, kv_len)
        h, x = self.post_attention_layernorm(a, residual=h)  # h + a, and its norm (one kernel with Triton)
        return h + self.mlp(x)


class Transformer(Fp32Readout):
    keep_fp32 = ("inv_freq", "inv_freq_local")

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList((Block if c.gemma is None else GemmaBlock)(c, i) for i in range(c.num_layers))
        self.norm = RMSNorm.of(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", c.inv_freq(), persistent=False)
        self.register_buffer("inv_freq_local", c.local_inv_freq(), persistent=False)  # Gemma 3's sliding layers

    kernels = "torch"

    def set_kernels(self, kernels: str) -> "Transformer":
        """"torch", or "triton": masked attention over the cache (kernels/tree_attention.py), RMSNorm with the
        residual add, SiLU-mul and RoPE + cache write (kernels/layer_ops.py) as fused Triton kernels, and for
        steps of at most 16 tokens the projections as GEMVs with the norms, SiLU-mul and residual adds folded in
        (kernels/gemv.py, row_step). Triton needs a CUDA model, or TRITON_INTERPRET=1 on CPU (tests); DeepSeek
        MLA targets keep torch's."""
        from toolkit.infer.prepare import apply_kernels

        return apply_kernels(self, kernels)

    def fuse(self) -> "Transformer":
        """For inference: fused q/k/v and gate/up weights (fuse_projections), the readout in readout_layout."""
        from toolkit.infer.prepare import fuse_projections, readout_layout

        fuse_projections(self)
        readout_layout(self.lm_head)
        if self.config.tie_word_embeddings:
            self.embed_tokens.weight = self.lm_head.weight
        return self

    @property
    def graphable(self) -> bool:
        """False for MoE targets: their routing reads which experts were hit on the host."""
        return self.config.moe is None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                cache: KVCache | None = None, slots: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, aux_layers: list[int] = (), kv_len: int | None = None,
                logits_at: torch.Tensor | None = None):
        """input_ids/positions/slots [B, T]; mask bool [B, T, S] over cache slots (or over the T new tokens
        without a cache), default causal by position. Returns logits [B, T, V] and [aux hidden [B, T, H]]
        for each id in aux_layers (a layer's output; -1 = after the final norm). kv_len (= S, with a mask):
        the cache slots attended, given by CUDA-graph callers so no shape depends on the slots' values.
        logits_at [B] (a prefill): the one position per row whose logits are wanted; logits are then [B, 1, V]
        (the vocabulary projection is a fifth of a SmolLM2 prefill's FLOPs, and only the last token's is read)."""
        B, T = input_ids.shape
        c = self.config
        if cache is None and c.context_limit()[0] is not None:  # the engine checks its cache's length
            c.check_sequence(T if positions is None else int(positions.max()) + 1)
        in_order = positions is None and slots is None  # token t at position t in slot t
        if positions is None:
            positions = torch.arange(T, device=input_ids.device).expand(B, T)
        slots = positions if slots is None else slots
        if kv_len is None:  # with a cache: the slots a mask covers, else the slots written reach
            kv_len = T if cache is None else mask.shape[-1] if mask is not None else int(slots.max()) + 1
        if cache is not None and kv_len > cache.max_len:
            raise ValueError(f"sequence needs {kv_len} cache slots but the KV cache holds {cache.max_len}; "
                             f"raise --max-seq-len or shorten the prompt")
        # no mask at all: T > 1 tokens without a cache or written in order from slot 0 (a prefill): SDPA's
        # causal kernel; or one sequence's one token, which sees every slot up to its own (plain decoding)
        unmasked = mask is None and ((T > 1 and (cache is None or in_order)) or (B == 1 and T == 1))
        # the masks go by slot, RoPE by position: without a cache token t is in slot t whatever its position (as
        # transformers masks by cache_position and rotates by position_ids), so the window and chunks count tokens
        at = positions if cache is not None else torch.arange(T, device=input_ids.device).expand(B, T)
        if mask is None:  # causal by position over the slots that hold them (slot == position here)
            mask = torch.arange(kv_len, device=input_ids.device)[None, None, :] <= at[:, :, None]
        h = self.embed_tokens(input_ids)                                   # [B, T, H]
        if c.gemma is not None:
            h = embed_scale(c, h)
        # Llama 4 rotates in float32 and rounds once, as transformers' complex multiply does (llama4.py)
        rope_dtype = torch.float32 if c.llama4 is not None else h.dtype
        cos, sin = rope_cos_sin(positions, self.inv_freq, rope_dtype, c.rope_attention_factor(), self.kernels)
        rope = {}  # Gemma 3's sliding layers: their own base (the full layers' cos / sin are the defaults above)
        if self.inv_freq_local is not None:
            local = rope_cos_sin(positions, self.inv_freq_local, h.dtype, 1.0, self.kernels)
            rope = dict.fromkeys(c.gemma.local_layers, local)
        if c.llama4 is not None:  # Llama 4's NoPE layers: no RoPE; (None, their queries' scales)
            rope = dict.fromkeys(c.llama4.nope_layers, (None, temperature(positions, c.llama4)))
        tensor_slots = None if cache is None else slots  # (before a host range replaces them, below)
        bias = None if unmasked else attention_masks(mask, h.dtype, self.kernels)
        # a sliding layer's mask: the last sliding_window positions only. A slot holds its position (a draft node
        # sits at or past its own, nearer, and its ancestors are within the tree's depth anyway)
        near = bias
        if c.sliding_window is not None and kv_len > c.sliding_window:  # (no extra op for a full-attention step)
            slot = torch.arange(kv_len, device=input_ids.device)[None, None, :]
            near = attention_masks(mask & (at[:, :, None] - slot < c.sliding_window), h.dtype, self.kernels)
        elif c.llama4 is not None and c.llama4.chunk is not None and kv_len > c.llama4.chunk:  # Llama 4's chunks
            near = attention_masks(mask & same_chunk(at, tensor_slots, kv_len, c.llama4.chunk), h.dtype,
                                   self.kernels)
        if cache is not None and self.kernels == "torch":
            slots = cache.slot_range(slots)  # one sequence's contiguous host slots -> int start (a plain copy)
        kept = {}
        for i, layer in enumerate(self.layers):
            h = layer(h, *rope.get(i, (cos, sin)), near if c.attends_locally(i) else bias, cache, i, slots, kv_len)
            if i in aux_layers:
                kept[i] = h
        if logits_at is None and -1 not in aux_layers and few_rows(h, self.kernels) and not self.logits_fp32 \
                and not self.norm.fp32_product and c.gemma is None:
            from toolkit.infer.kernels.gemv import gemv  # the norm in the GEMV (rounded as Llama's)

            return gemv(h, self.lm_head.weight, "norm", self.norm.weight, self.norm.eps), [kept[i] for i in aux_layers]
        kept[-1] = self.norm(h)  # id -1: the final normed hidden state (EAGLE-1/2 heads take it)
        out = kept[-1] if logits_at is None else kept[-1][torch.arange(B, device=h.device), logits_at][:, None]
        return self.readout(out), [kept[i] for i in aux_layers]

    def readout(self, normed: torch.Tensor) -> torch.Tensor:
        """normed [..., H] -> logits [..., V] (Fp32Readout's), soft-capped as Gemma 2 caps them."""
        logits = super().readout(normed)
        return logits if self.config.gemma is None else soft_cap(logits, self.config.gemma.final_softcap)
