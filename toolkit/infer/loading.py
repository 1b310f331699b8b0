"""Loading a target and its draft: the target from an HF folder (load_target, over target_weights.py's tensors;
training uses it too), and for `toolkit bench` and `toolkit serve` the device and dtype, the target and draft
together (the draft folder's own rules, its kind and its target, are draft_folder.py's), the stop tokens of the
chat template, and the load-time sanity probe."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from toolkit.embedded import DEFAULT_MODEL
from toolkit.gpu_half import gpu_label, has_bf16, refuse_bf16
from toolkit.json_files import read_json
from toolkit.infer.config import ModelConfig
from toolkit.infer.draft_folder import draft_target, load_draft
from toolkit.infer.model import Transformer
from toolkit.infer.target_weights import check_weights_fit, read_tensors, tie_embeddings


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


def load_target(folder: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Transformer:
    """Build the model from config.json and load every weight from its safetensors files (weight_files); a
    missing or unexpected tensor is an error naming it (no weight is ever left random)."""
    folder = Path(folder)
    cfg = read_json(folder / "config.json")
    config = ModelConfig.from_folder(folder, cfg)
    check_weights_fit(folder, config, cfg, dtype, device)
    tensors = read_tensors(folder, config, cfg, dtype, device)
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
    from toolkit.infer.draft_checks import agreement
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
