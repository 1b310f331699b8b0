"""Loading a target and its draft: the target's weights from an HF folder (load_target; training uses it too),
and for `toolkit bench` and `toolkit serve` the device and dtype, the target and draft together (the draft
folder's own rules, its kind and its target, are draft_folder.py's), the stop tokens of the chat template, and
the load-time sanity probe."""
from __future__ import annotations

import math

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from toolkit.embedded import DEFAULT_MODEL
from toolkit.gpu_half import gpu_label, has_bf16, refuse_bf16
from toolkit.json_files import read_json
from toolkit.infer import fp8, mxfp4
from toolkit.infer.config import ModelConfig
from toolkit.infer.draft_folder import draft_target, load_draft
from toolkit.infer.model import Transformer
from toolkit.infer.hf_names import not_text, our_tensors, stack_experts
from toolkit.infer.weight_files import read_safetensors, weight_files


def pick_device(device: str = "auto", dtype: str = "auto") -> tuple[str, torch.dtype]:
    """auto: cuda when visible, else cpu; dtype auto: bfloat16 on cuda (float16 before sm_80, which has no bf16
    matrix unit), float32 on cpu."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"--device {device}: give auto, cuda or cpu")
    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ValueError(f"--dtype {dtype}: give auto, float32, bfloat16 or float16")
    if device == "cuda" and dtype == "bfloat16":  # cuBLAS and Triton's tl.dot have no bf16 before Ampere
        refuse_bf16("--dtype bfloat16", "give --dtype float16 (auto picks it there) or float32")
    if device == "cuda" and dtype == "auto" and not has_bf16():
        print(f"--dtype auto: {gpu_label()} has no bfloat16 matrix unit; serving in float16 (a model trained in bf16 "
              "can overflow float16's range, Gemma's known to: give --dtype float32 if its outputs turn to garbage)",
              file=sys.stderr, flush=True)
        return device, torch.float16
    if dtype == "auto":
        return device, torch.bfloat16 if device == "cuda" else torch.float32
    if device == "cpu" and dtype != "float32":  # kept, but a CPU that emulates it decodes ~100x slower
        from toolkit.cpu_speed import emulated_warning

        note = emulated_warning(f"--dtype {dtype}", dtype, torch.get_num_threads(),
                                "decoding will crawl; --dtype auto serves in fp32 on a CPU")
        if note:
            print(note, file=sys.stderr, flush=True)
    return device, getattr(torch, dtype)


ROUTER_FP32 = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias")  # DeepSeek's (moe.GroupedSigmoidRouter)


def load_target(folder: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Transformer:
    """Build the model from config.json and load every weight from its safetensors files (weight_files); a
    missing or unexpected tensor is an error naming it (no weight is ever left random)."""
    folder = Path(folder)
    config = ModelConfig.from_folder(folder)
    check_weights_fit(folder, config, read_json(folder / "config.json"), dtype, device)
    tensors = _read_tensors(folder, config, read_json(folder / "config.json"), dtype, device)
    if config.tie_word_embeddings:
        config.tie_word_embeddings = tie_embeddings(tensors, folder)
    with torch.device("meta"):
        model = Transformer(config)
    expected = {k for k in model.state_dict() if not (config.tie_word_embeddings and k == "lm_head.weight")}
    missing, unexpected = expected - tensors.keys(), tensors.keys() - expected
    if missing or unexpected:
        raise ValueError(f"{folder}: weights do not match the {config.model_type} config: missing "
                         f"{sorted(missing)[:8]}, unexpected {sorted(unexpected)[:8]}")
    model.load_state_dict(tensors, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.inv_freq = config.inv_freq().to(device)
    if config.local_inv_freq() is not None:  # Gemma 3's sliding layers' RoPE
        model.inv_freq_local = config.local_inv_freq().to(device)
    return model.to(device).eval().fuse()


def check_weights_fit(folder: Path, config: ModelConfig, cfg: dict, dtype: torch.dtype, device,
                      slack: float = 1.05) -> None:
    """Refuse a target whose weights, in `dtype`, take more than the device's free memory (x slack), naming both,
    before a CUDA out-of-memory error or the kernel's OOM killer stops the load half-way. Counted from the files'
    headers alone, as _read_tensors will load them: without a vision tower or MTP layers, MXFP4 blocks as the two
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
    that it loads (_not_loaded leaves the others out)."""
    for f in weight_files(folder):
        with read_safetensors(f, "target weights") as sf:
            for name in sf.keys():
                if not _not_loaded(name, config, num_mtp):
                    yield sf, name, name.removeprefix("model.")


def _not_loaded(name: str, config: ModelConfig, num_mtp: int) -> bool:
    """A checkpoint tensor the target leaves out: MTP layers, a vision tower, cached RoPE buffers."""
    short = name.removeprefix("model.")
    return short.endswith("rotary_emb.inv_freq") or _is_mtp_weight(short, config.num_layers, num_mtp) \
        or not_text(name)


def _read_tensors(folder: Path, config: ModelConfig, cfg: dict, dtype: torch.dtype, device: str) -> dict:
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


def stop_ids(tok, folder: Path | None = None) -> set[int]:
    """Token ids that end an assistant turn: the tokenizer's EOS, the known end-of-turn tokens it has (harmony's
    <|return|> and <|call|>, not its message end <|end|>), and with the model `folder` the eos_token_id (one id or
    a list) of its generation_config.json and config.json, on which transformers' generate and vLLM stop too
    (Llama-3.1: <|eom_id|> and <|end_of_text|> beside <|eot_id|>)."""
    from toolkit.data.harmony import is_harmony

    vocab = tok.get_vocab()
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    # OpenAI's harmony format (gpt-oss): <|end|> closes one message of a turn (the analysis channel's), the turn
    # ends at <|return|> (or <|call|>, a tool call)
    turn_ends = ("<|return|>", "<|call|>") if is_harmony(tok) else ("<|eot_id|>", "<|im_end|>", "<|end|>")
    ids |= {vocab[t] for t in turn_ends if t in vocab}
    for name in ("generation_config.json", "config.json") if folder is not None else ():
        path = Path(folder) / name
        cfg = read_json(path) if path.is_file() else {}
        eos = cfg.get("eos_token_id", cfg.get("text_config", {}).get("eos_token_id"))
        ids |= {int(i) for i in (eos if isinstance(eos, list) else [eos]) if isinstance(i, int)}
    return ids


@torch.no_grad()
def probe(head, target, tok, text: str, answer_tokens: int = 24) -> float:
    """The draft's top-1 agreement with the target over the target's own greedy answer to `text` (a
    chat-templated prompt), which is what a draft is trained to predict (a prompt's own tokens are not, and a
    short one gave a false alarm); warns loudly near zero."""
    from toolkit.infer.drafts import agreement
    from toolkit.infer.engine import Engine
    from toolkit.infer.sampling import SamplingParams

    ids = tok(text, add_special_tokens=False).input_ids[-192:]
    plain = Engine(target, None, max_len=len(ids) + answer_tokens, cuda_graphs=False)  # a small cache, no draft
    answer = plain.generate(ids, SamplingParams(max_new_tokens=answer_tokens)).tokens
    agree = agreement(head, target, ids + answer, start=max(len(ids) - 2, 0))
    print(f"draft/target top-1 agreement over the target's answer to a probe prompt: {agree:.1%}", file=sys.stderr)
    if agree < 0.02:
        print("WARNING: the draft almost never agrees with the target: check that it was trained for this "
              "target (aux layers, d2t, lm_head); expect tau close to 1", file=sys.stderr)
    return agree


@dataclass
class Loaded:
    folder: Path    # the target's folder
    tok: object     # its tokenizer (with chat template)
    target: object  # toolkit.infer.model.Transformer
    head: object    # the draft head, or None


DTYPE_NAMES = {"half": "float16", "fp16": "float16", "bf16": "bfloat16", "float": "float32", "fp32": "float32"}


def add_device_args(p, dtype_note: str = "a CPU that emulates bf16 / fp16 gets a warning") -> None:
    """--device and --dtype, as `load` takes them (bench, serve, regenerate)."""
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: cuda if available")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   type=lambda v: DTYPE_NAMES.get(v, v),
                   help=f"auto: bfloat16 on cuda (float16 before sm_80), float32 on cpu ({dtype_note}); vLLM's half, "
                        "float and bf16 / fp16 / fp32 name these too")


def add_args(p) -> None:
    """The flags `toolkit bench` and `toolkit serve` share for loading and running the engine (load, Engine)."""
    add_device_args(p)
    p.add_argument("--fp32-lm-head", action="store_true", help="bf16 / fp16: the target's logits in fp32 "
                   "(SGLang's --enable-fp32-lm-head): no exact ties from rounding the logits, sampled distributions "
                   "nearer the fp32 model's; greedy text still parts from plain decoding where the bf16 hidden states "
                   "move the top two (benchmarks/RESULTS.md); off CUDA it keeps an fp32 copy of the lm_head")
    p.add_argument("--compile", action="store_true", help="CPU: run one sequence's decode / verify step "
                   "torch.compile'd (fuses the small ops between GEMMs; ~2-5 min to compile at start, every step shape "
                   "before the first request)")
    p.add_argument("--eager", "--enforce-eager", "--disable-cuda-graph", action="store_true",
                   help="no CUDA graphs (on a GPU the engine replays its decode, verify and draft steps from graphs "
                        "per batch/token bucket); vLLM's and SGLang's names too")
    p.add_argument("--kernels", default="auto", choices=["auto", "torch", "triton"],
                   help="auto: fused Triton kernels (attention over the cache, RMSNorm + residual, RoPE + cache "
                        "write, SiLU-mul) on a CUDA Llama-family target, torch's elsewhere (and for DeepSeek, Gemma "
                        "and Llama 4 targets)")


def pick_kernels(kernels: str, target) -> str:
    """auto: the fused Triton kernels (model.set_kernels) on a CUDA target of Llama-family layers, where they beat
    torch's (benchmarks/RESULTS.md), torch's elsewhere (DeepSeek's MLA; Gemma's and Llama 4's layers, which triton
    runs when asked but which no GPU has timed yet); triton where it cannot run is refused clearly."""
    if kernels not in ("auto", "torch", "triton"):
        raise ValueError(f"--kernels {kernels}: give auto, torch or triton")
    if kernels == "auto":
        return "triton" if target.embed_tokens.weight.is_cuda and target.config.llama_layers else "torch"
    return kernels


def load(draft: str | None, model: str | None, token_map: str | None, device: str = "auto",
         dtype: str = "auto", kernels: str = "auto", fp32_lm_head: bool = False,
         chat_template: str | None = None) -> Loaded:
    """Target (+ draft when given) on the chosen device, with the chosen kernels; fp32_lm_head: the target's
    logits in fp32 (Transformer.fp32_readout); chat_template: a built-in name or .jinja file over the target's."""
    from toolkit.data.tokenizer import load_tokenizer
    from toolkit.models import resolve_target

    device, torch_dtype = pick_device(device, dtype)
    folder = draft_target(draft, model) if draft else resolve_target(model or DEFAULT_MODEL)
    tok = load_tokenizer(model=str(folder), chat_template=chat_template)
    target = load_target(folder, torch_dtype, device)
    target.set_kernels(pick_kernels(kernels, target)).fp32_readout(fp32_lm_head)
    if fp32_lm_head and torch_dtype == torch.float32:
        print("--fp32-lm-head: the target runs in float32 already (its logits are fp32); it matters with --dtype "
              "bfloat16 / float16", file=sys.stderr)
    head = load_draft(draft, target, token_map) if draft else None
    if head is not None:
        head.set_kernels(target.kernels)
    return Loaded(folder, tok, target, head)
