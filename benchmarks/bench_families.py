"""Plain greedy decoding of a target family on CPU: our engine against transformers `generate`, on a random-weight
model of a real model's shape (speed does not depend on trained weights), the same random prompts, identical
tokens checked. One target step of 8 tree tokens (a verify round) is timed against a plain decode step too.

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 \\
        python benchmarks/bench_families.py --shape gemma-3-270m [--prompts 3] [--prompt-tokens 128] \\
            [--max-new-tokens 64] [--threads 1] [--out result.json]

Shapes are the hub configs' sizes (config.json keys); `tiny-gemma3` / `tiny-llama4` are for the script's test.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

SHAPES = {
    # google/gemma-3-270m: 18 layers, five of six sliding over 512 positions, a 262k vocabulary (tied)
    "gemma-3-270m": ("gemma3_text", dict(vocab_size=262144, hidden_size=640, intermediate_size=2048,
                                         num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1,
                                         head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
                                         max_position_embeddings=32768, rope_theta=1_000_000.0,
                                         rope_local_base_freq=10_000.0)),
    # google/gemma-2-2b: 26 layers, every other one sliding over 4096, soft-capped scores and logits
    "gemma-2-2b": ("gemma2", dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                                  num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                                  query_pre_attn_scalar=256, sliding_window=4096)),
    "tiny-gemma3": ("gemma3_text", dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                                        num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                        query_pre_attn_scalar=16, sliding_window=16)),
    "tiny-llama4": ("llama4_text", dict(vocab_size=512, hidden_size=64, intermediate_size=48,
                                        intermediate_size_mlp=96, num_hidden_layers=4, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                        interleave_moe_layer_step=2, attention_chunk_size=16)),
}


def build(shape: str, folder: Path):
    """A random transformers model of `shape` saved to `folder` (fp32), and the model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kind, sizes = SHAPES[shape]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, bos_token_id=2, eos_token_id=1,
                                                                  pad_token_id=0, **sizes), dtype=torch.float32)
    model.save_pretrained(folder)
    return model.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="gemma-3-270m")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="also write the result JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from toolkit.infer.drafts import random_head
    from toolkit.infer.engine import Engine
    from toolkit.infer.loading import load_target
    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.tree import TreeConfig

    with tempfile.TemporaryDirectory() as tmp:
        hf = build(args.shape, Path(tmp))
        ours = load_target(tmp)
    V, n = ours.config.vocab_size, args.max_new_tokens
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, V, (args.prompt_tokens,), generator=g).tolist() for _ in range(args.prompts)]
    engine = Engine(ours, max_len=args.prompt_tokens + n + 64)
    params = SamplingParams(max_new_tokens=n)
    engine.generate(prompts[0], SamplingParams(max_new_tokens=2))  # warm-up: allocations, first-call costs
    t_hf = t_ours = 0.0
    same = True
    with torch.no_grad():
        for x in prompts:
            t = time.perf_counter()
            ref = hf.generate(torch.tensor([x]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              pad_token_id=0)[0, len(x):].tolist()
            t_hf += time.perf_counter() - t
            t = time.perf_counter()
            got = engine.generate(x, params, stop_ids=set()).tokens
            t_ours += time.perf_counter() - t
            same &= got == ref
    spec = Engine(ours, random_head(ours.config, seed=0), TreeConfig(3, 3, 8), max_len=args.prompt_tokens + n + 64)
    rounds = [spec.generate(x, SamplingParams(max_new_tokens=16), stop_ids=set()) for x in prompts]
    verify = statistics.median(r.seconds["verify"] / r.verify_steps for r in rounds)
    plain = engine.generate(prompts[0], SamplingParams(max_new_tokens=16), stop_ids=set())
    step = plain.seconds["verify"] / plain.verify_steps
    total = n * len(prompts)
    out = {"shape": args.shape, "model_type": ours.config.model_type, "threads": args.threads,
           "prompts": len(prompts), "prompt_tokens": args.prompt_tokens, "new_tokens_each": n,
           "hf_tok_s": round(total / t_hf, 2), "ours_tok_s": round(total / t_ours, 2),
           "ours_vs_hf": round(t_hf / t_ours, 2), "identical_greedy_tokens": same,
           "plain_step_ms": round(step * 1e3, 1), "verify8_step_ms": round(verify * 1e3, 1),
           "verify8_vs_plain_step": round(verify / step, 2)}
    print(json.dumps(out, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
