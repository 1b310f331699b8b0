"""Where greedy speculative text parts from plain greedy decoding, and how close the target's top two were there.

In fp32 the engine's speculative greedy text is bit-identical to its plain decoding (tests). In bf16 / fp16 a verify
step rounds otherwise than a decode step, so an argmax whose top two are within the rounding may go either way. For
each prompt's first turn this runs the engine plainly and with the draft, finds the first token where the two
answers differ, and re-reads the target's logits over the common prefix there (one forward in the served dtype):
the top-2 gap, in logits and in steps of the served dtype at the top logit (a bf16 logit of 16-32 moves in steps of
0.125). With --fp32-lm-head the logits are fp32, so a gap of 0 is no longer an exact tie of the rounded logits, and
what is left is the hidden states' rounding.
It also reports how far the served next-token distribution (T = 1) is from the fp32 model's over each plain answer:
the mean total-variation distance over its positions, which is what sampling draws from.

    python benchmarks/greedy_divergence.py --draft benchmarks/heads/smollm2-135m-eagle3-topics \
        --prompts ../shared/data/eval/mt_bench.jsonl --limit 10 --max-new-tokens 128 --dtype bfloat16 \
        [--fp32-lm-head] --num-steps 5 --topk 1 --threads 1 --out div.json
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from toolkit.atomic import write_text  # noqa: E402
from toolkit.infer.engine import Engine  # noqa: E402
from toolkit.infer.loading import load, load_target, stop_ids  # noqa: E402
from toolkit.infer.prompts import read_prompts  # noqa: E402
from toolkit.infer.sampling import SamplingParams  # noqa: E402
from toolkit.infer.tree import TreeConfig  # noqa: E402

BITS = {torch.float32: 24, torch.bfloat16: 8, torch.float16: 11}  # significant bits of each dtype


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where the two answers differ (one ending early counts), or None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def step_at(value: float, dtype: torch.dtype) -> float:
    """The spacing of `dtype`'s values at `value` (one ulp): 2^(exponent - significant bits + 1)."""
    return 2.0 ** (math.floor(math.log2(abs(value) or 1.0)) - BITS[dtype] + 1)


@torch.no_grad()
def tv_to_fp32(target, reference, ids: list[int], start: int) -> float:
    """Mean total-variation distance between the served and the fp32 model's next-token distributions at
    positions start-1 .. end-1 of `ids` (one forward each)."""
    x = torch.tensor([ids], device=target.embed_tokens.weight.device)
    p = target(x)[0][0, start - 1:-1].float().softmax(-1)
    q = reference(x)[0][0, start - 1:-1].float().softmax(-1)
    return float(0.5 * (p - q).abs().sum(-1).mean())


@torch.no_grad()
def top_two(target, ids: list[int]) -> tuple[list[int], list[float]]:
    """The target's two likeliest next tokens after `ids` and their logits, from one forward in its dtype."""
    logits = target(torch.tensor([ids], device=target.embed_tokens.weight.device))[0][0, -1].float()
    top = logits.topk(2)
    return top.indices.tolist(), top.values.tolist()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--draft", required=True)
    p.add_argument("--model", default=None)
    p.add_argument("--prompts", required=True)
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--fp32-lm-head", action="store_true")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--num-steps", type=int, default=5)
    p.add_argument("--topk", type=int, default=1)
    p.add_argument("--num-draft-tokens", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="divergence.json")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load(args.draft, args.model, None, args.device, args.dtype, "auto", args.fp32_lm_head)
    tok, target, head = loaded.tok, loaded.target, loaded.head
    dtype = target.embed_tokens.weight.dtype
    stops, params = stop_ids(tok, loaded.folder), SamplingParams(max_new_tokens=args.max_new_tokens)
    tree = TreeConfig(args.num_steps, args.topk, args.num_draft_tokens or args.num_steps + 1)
    max_len = 4096
    plain, spec = Engine(target, None, None, max_len), Engine(target, head, tree, max_len)
    reference = load_target(loaded.folder, torch.float32, str(target.embed_tokens.weight.device))
    rows = []
    for prompt in read_prompts(args.prompts, args.limit):
        messages = [{"role": "system", "content": prompt["system"]}] if prompt["system"] else []
        text = tok.apply_chat_template(messages + [{"role": "user", "content": prompt["turns"][0]}], tokenize=False,
                                       add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False).input_ids
        a, b = plain.generate(ids, params, stops).tokens, spec.generate(ids, params, stops).tokens
        i = first_difference(a, b)
        row = {"id": prompt.get("id"), "tokens": len(a), "first_difference": i,
               "tv_to_fp32": tv_to_fp32(target, reference, ids + a, len(ids))}
        if i is not None and i < min(len(a), len(b)):
            (t1, t2), (l1, l2) = top_two(target, ids + a[:i])
            row.update(plain_token=a[i], speculative_token=b[i], top2=[t1, t2], top2_logits=[l1, l2],
                       gap=l1 - l2, gap_in_steps=(l1 - l2) / step_at(l1, dtype),
                       picks_are_the_top2=sorted([a[i], b[i]]) == sorted([t1, t2]))
        rows.append(row)
        print(json.dumps(row), flush=True)
    parted = [r for r in rows if r["first_difference"] is not None]
    report = {"draft": args.draft, "dtype": str(dtype).removeprefix("torch."), "fp32_lm_head": target.logits_fp32,
              "tree": vars(tree), "max_new_tokens": args.max_new_tokens, "prompts": len(rows),
              "answers_differing": len(parted),
              "median_first_difference": statistics.median([r["first_difference"] for r in parted]) if parted else None,
              "mean_tv_to_fp32": statistics.mean(r["tv_to_fp32"] for r in rows),
              "rows": rows}
    write_text(Path(args.out), json.dumps(report, indent=2) + "\n")
    print(f"{len(parted)} of {len(rows)} answers part from plain decoding ({report['dtype']}, fp32 logits: "
          f"{report['fp32_lm_head']}); median first differing token {report['median_first_difference']}; "
          f"next-token distributions {report['mean_tv_to_fp32']:.4f} from fp32's (mean TV)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
