"""transformers `generate` as the reference `toolkit bench` compares with: plain greedy / sampled decoding,
or prompt-lookup decoding (`prompt_lookup_num_tokens`), the speculative peer that needs no draft model.

τ of a transformers run is measured the way the engine measures it: tokens after the first, per target
forward after the prefill (a forward hook counts the target's forwards and the tokens each one reads). Prompt
lookup's first forward is no plain prefill: it reads the prompt with the first candidates and keeps every token
it accepts, so there that forward counts as a verify step and all the request's tokens as its numerator."""
from __future__ import annotations

import time

import torch

from toolkit.infer.prompts import answer_turns, warm_up_ids


def run_hf(folder, tok, prompts, params, seed, device="cpu", dtype=torch.float32,
           prompt_lookup: int = 0, stops: set[int] | None = None) -> tuple[list[list[str]], dict]:
    """Answer every prompt turn by turn; returns the answers and {tokens, wall_seconds, tokens_per_second,
    verify_steps, tau, per_turn: {turn: {tau, verify_steps, tokens}}, logits_dtype} (+ prompt_lookup_num_tokens)."""
    from transformers import AutoModelForCausalLM

    from transformers import GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    # the engine decodes by --temperature / --top-p / --top-k alone: the target's generation_config.json may add
    # rules generate would apply on its own (Qwen2.5: repetition_penalty 1.05), which would make the comparison
    # one of two decoding rules and its greedy-identity check fail for that reason; only its token ids are kept
    ids = model.generation_config
    model.generation_config = GenerationConfig(bos_token_id=ids.bos_token_id, eos_token_id=ids.eos_token_id,
                                               pad_token_id=ids.pad_token_id)
    widths = []  # tokens each target forward reads

    def hook(module, args, kwargs, output):
        ids = kwargs.get("input_ids", args[0] if args else None)
        widths.append(0 if ids is None else int(ids.shape[-1]))

    model.register_forward_hook(hook, with_kwargs=True)
    torch.manual_seed(seed)
    kw = dict(do_sample=False) if params.greedy else dict(do_sample=True, temperature=params.temperature,
                                                           top_p=params.top_p, top_k=params.top_k)
    if prompt_lookup:
        kw["prompt_lookup_num_tokens"] = prompt_lookup
    counted = []  # (turn, tokens generated, τ numerator, verify steps) per request

    def generate(ids, p):
        before = len(widths)
        out = model.generate(torch.tensor([ids], device=device), max_new_tokens=params.max_new_tokens,
                             eos_token_id=sorted(stops) if stops else tok.eos_token_id,
                             pad_token_id=tok.eos_token_id, **kw)[0, len(ids):]
        mine = widths[before:]
        prefill = int(bool(mine) and mine[0] <= len(ids))  # a forward over the prompt alone gives one token
        counted.append((p["turn"], len(out), len(out) - prefill, len(mine) - prefill))
        return out.tolist()  # ids, as the engine gives them (a tensor's elements hash by identity)

    def stats_of(rows):  # τ: tokens after each request's prefill token, per forward after the prefill
        steps = sum(r[3] for r in rows)
        return {"tau": (sum(r[2] for r in rows) / steps) if steps else 1.0, "verify_steps": steps,
                "tokens": sum(r[1] for r in rows)}

    model.generate(torch.tensor([warm_up_ids(tok, prompts)], device=device), max_new_tokens=4,
                   pad_token_id=tok.eos_token_id, **kw)  # lazy initialisation stays out of the timing
    counted.clear()
    widths.clear()
    start = time.perf_counter()
    answers = answer_turns(tok, prompts, generate)
    wall = time.perf_counter() - start
    stats = stats_of(counted)
    turns = sorted({r[0] for r in counted})
    stats.update(wall_seconds=wall, tokens_per_second=stats["tokens"] / wall,
                 per_turn={str(t): stats_of([r for r in counted if r[0] == t]) for t in turns},
                 logits_dtype=str(dtype).removeprefix("torch."))  # transformers' logits: no fp32 readout there
    if prompt_lookup:
        stats["prompt_lookup_num_tokens"] = prompt_lookup
    return answers, stats
