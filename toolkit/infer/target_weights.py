"""The target's tensors from an HF folder's safetensors files, under the engine's names (hf_names.py): which
ones the target loads (not MTP layers, a vision tower or cached RoPE buffers), whether they fit the device's free
memory, FP8 and MXFP4 weights dequantized, and tied embeddings as transformers ties them. loading.load_target
builds the model from them."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

from toolkit.infer import fp8, mxfp4
from toolkit.infer.config import ModelConfig
from toolkit.infer.hf_names import not_text, our_tensors, stack_experts
from toolkit.infer.weight_files import read_safetensors, weight_files


ROUTER_FP32 = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias")  # DeepSeek's (moe.GroupedSigmoidRouter)


def check_weights_fit(folder: Path, config: ModelConfig, cfg: dict, dtype: torch.dtype, device,
                      slack: float = 1.05) -> None:
    """Refuse a target whose weights, in `dtype`, take more than the device's free memory (x slack), naming both,
    before a CUDA out-of-memory error or the kernel's OOM killer stops the load half-way. Counted from the files'
    headers alone, as read_tensors will load them: without a vision tower or MTP layers, MXFP4 blocks as the two
    values each byte packs."""
    from toolkit.infer.kv_cache import free_memory_bytes

    numel = 0
    for sf, name, short in _loaded_entries(folder, config, _declared_mtp_layers(cfg)):
        shape = sf.get_slice(name).get_shape()
        n = math.prod(shape) if shape else 1
        numel += 2 * n if short.endswith("_blocks") and config.model_type == "gpt_oss" else n
    need = numel * torch.empty((), dtype=dtype).element_size()
    try:
        free = free_memory_bytes(device)
    except OSError:  # no /proc/meminfo: unknown, not refused
        return
    if need > free * slack:
        where = "GPU memory" if torch.device(device).type == "cuda" else "available RAM"
        raise ValueError(f"the target {folder} takes {need / 2**30:.1f} GiB in {str(dtype).removeprefix('torch.')} "
                         f"({numel / 1e9:.2f} B parameters) and {device} has {free / 2**30:.1f} GiB of {where} free: "
                         "it is loaded whole on each process; use a device with more memory, a half precision "
                         "(dtype bfloat16), or free the memory other processes hold")


def _loaded_entries(folder: Path, config: ModelConfig, num_mtp: int):
    """(open safetensors file, tensor name, the name without `model.`) for each tensor of the target's weight files
    that it loads: not its MTP layers, a vision tower or cached RoPE buffers."""
    for f in weight_files(folder):
        with read_safetensors(f, "target weights") as sf:
            for name in sf.keys():
                short = name.removeprefix("model.")
                if not (short.endswith("rotary_emb.inv_freq") or _is_mtp_weight(short, config.num_layers, num_mtp)
                        or not_text(name)):
                    yield sf, name, short


def read_tensors(folder: Path, config: ModelConfig, cfg: dict, dtype: torch.dtype, device: str) -> dict:
    """The target's tensors under the engine's names (hf_names.py), in `dtype` (DeepSeek's router in fp32), without
    MTP layers, a multimodal checkpoint's vision tower or cached RoPE buffers; GPT-OSS's MXFP4 experts and FP8
    checkpoints' weights dequantized (mxfp4.py, fp8.py)."""
    num_mtp = _declared_mtp_layers(cfg)
    fp32 = ROUTER_FP32 if config.moe is not None and config.moe.scoring == "sigmoid" else ()
    tensors, packed, pending = {}, {}, fp8.Pending(cfg)

    def add(name: str, t: torch.Tensor) -> None:
        for ours, t in our_tensors(config, name, t):
            # DeepSeek's router stays fp32, as transformers keeps it (infer/fp32.py)
            tensors[ours] = t.float() if fp32 and ours.endswith(fp32) else t.to(dtype)

    for sf, name, short in _loaded_entries(folder, config, num_mtp):
        if config.model_type == "gpt_oss" and short.endswith(mxfp4.SUFFIXES):  # joined below
            packed[short] = sf.get_tensor(name)
        elif not pending.take(sf, name):  # an FP8 weight or scale: dequantized below
            add(name, sf.get_tensor(name))
    for name, t in pending.dequantized(dtype, str(folder)).items():
        add(name, t)
    tensors.update(mxfp4.join_packed(packed, dtype, device))  # GPT-OSS's MXFP4 experts, dequantized where they run
    return stack_experts(config, tensors)  # Llama 4's experts stored one by one


def tie_embeddings(tensors: dict[str, torch.Tensor], folder: Path) -> bool:
    """Whether a tie_word_embeddings checkpoint is tied, as transformers 5 decides (tie_weights): not when it
    holds both matrices and they differ (the config is wrong: each is kept), else to whichever it holds.
    Leaves `tensors` with embed_tokens.weight alone when tied."""
    embed, head = tensors.get("embed_tokens.weight"), tensors.get("lm_head.weight")
    if embed is not None and head is not None and not torch.equal(embed, head):
        print(f"{folder}: tie_word_embeddings is true but lm_head.weight and embed_tokens.weight differ; keeping "
              "both, as transformers does", file=sys.stderr)
        return False
    if embed is None and head is not None:
        tensors["embed_tokens.weight"] = head
    tensors.pop("lm_head.weight", None)
    return True


def _declared_mtp_layers(cfg: dict) -> int:
    """How many MTP layers a config.json declares: num_nextn_predict_layers (DeepSeek-V3's and MiMo's key)."""
    return int(cfg.get("text_config", cfg).get("num_nextn_predict_layers") or 0)


def _is_mtp_weight(name: str, num_layers: int, num_mtp: int) -> bool:
    """The num_mtp MTP layers a target declares and ships (MiMo's mtp_layers.{i}.*, DeepSeek-V3's
    layers.{num_layers + i}.*, i < num_mtp) are a draft's weights, read by toolkit/infer/mtp.py, not the
    target's. Any other layer stays unexpected: a folder with more layers than its config.json says (a truncated
    or wrong config) must not load as a shorter model."""
    parts = name.split(".")
    if len(parts) < 2 or not parts[1].isdigit():
        return False
    i = int(parts[1])
    return (parts[0] == "mtp_layers" and i < num_mtp) or (parts[0] == "layers" and 0 <= i - num_layers < num_mtp)
