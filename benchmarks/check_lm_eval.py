"""lm-evaluation-harness against `toolkit serve`: its `local-completions` model (the client lm-eval users point at
vLLM or SGLang) scores GSM8K reference answers (loglikelihood: batches of token-id prompts with `echo`,
`logprobs: 1`, `max_tokens: 1`) and generates answers (generate_until: `stop`, `max_tokens`), against a server
that speculates with the shipped EAGLE-3 head, lm-eval tokenizing through the server's /tokenize (no tokenizer
files of its own). The reference is transformers on the same SmolLM2 weights:
log-likelihood summed over the continuation's tokens and whether each is the argmax, and greedy text cut at the
stop strings. lm_eval is not a dependency of the toolkit: install it apart (its own dependencies are heavy),

    pip install --no-deps --target /tmp/lmeval lm_eval && pip install --target /tmp/lmeval aiohttp tenacity
    PYTHONPATH=/tmp/lmeval python benchmarks/check_lm_eval.py [--shared ../shared] [--questions 20] [--out f.json]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

HEAD = Path(__file__).resolve().parent / "heads" / "smollm2-135m-eagle3"
SPEED_ENV = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736",
             "MALLOC_TOP_PAD_": "1073741824"}


def start_server(*args: str) -> tuple[subprocess.Popen, str]:
    """`toolkit serve` on a port it picks; returns the process and its /v1 URL once /health answers."""
    cmd = [sys.executable, "-m", "toolkit.cli", "serve", "--port", "0", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, **SPEED_ENV})
    line = proc.stdout.readline()
    if " on http://" not in line:
        proc.kill()
        raise SystemExit(f"server did not start: {line}")
    url = line.rsplit(" on ", 1)[1].strip()
    for _ in range(600):
        try:
            if httpx.get(url.removesuffix("/v1") + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("server did not become healthy")


@torch.no_grad()
def hf_score(model, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    logp = model(torch.tensor([context + continuation])).logits[0].float().log_softmax(-1)
    rows = logp[len(context) - 1:-1]                                                   # [len(continuation), V]
    ids = torch.tensor(continuation)
    return float(rows.gather(-1, ids[:, None]).sum()), bool((rows.argmax(-1) == ids).all())


def main() -> None:
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from transformers import AutoModelForCausalLM

    from toolkit.data.tokenizer import load_tokenizer
    from toolkit.infer.draft_folder import draft_target

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    ap.add_argument("--questions", type=int, default=20)
    ap.add_argument("--max-gen-toks", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [json.loads(line) for line in open(Path(args.shared) / "data" / "eval" / "gsm8k.jsonl")][:args.questions]
    contexts = [f"Question: {r['turns'][0]}\nAnswer:" for r in rows]
    answers = [" " + r["reference"][0].split("\n")[0] for r in rows]
    folder = draft_target(str(HEAD), None)
    local_tok = load_tokenizer(model=str(folder))
    gguf = next(folder.glob("*.gguf"), None)
    model = AutoModelForCausalLM.from_pretrained(folder, **({"gguf_file": gguf.name} if gguf else {}),
                                                 dtype=torch.float32).eval()
    proc, url = start_server("--draft", str(HEAD), "--served-model-name", "smollm2", "--threads", "1")
    try:
        # no tokenizer given: lm-eval finds the server's /tokenizer_info and /tokenize and tokenizes through them
        lm = LocalCompletionsAPI(base_url=f"{url}/completions", model="smollm2", batch_size=4, max_retries=1,
                                 max_gen_toks=args.max_gen_toks)
        assert lm.tokenizer_backend == "remote", lm.tokenizer_backend
        t0 = time.perf_counter()
        scored = lm.loglikelihood([Instance("loglikelihood", {}, (c, a), i)
                                   for i, (c, a) in enumerate(zip(contexts, answers))])
        ll_s = time.perf_counter() - t0
        until = {"until": ["Question:", "\n\n"], "max_gen_toks": args.max_gen_toks}
        t0 = time.perf_counter()
        texts = lm.generate_until([Instance("generate_until", {}, (c, until), i) for i, c in enumerate(contexts)])
        gen_s = time.perf_counter() - t0
        metrics = httpx.get(url.removesuffix("/v1") + "/metrics").text
        # the ids lm-eval scored, through the server's /tokenize: they must be the local tokenizer's
        pairs = [lm._encode_pair(c, a) for c, a in zip(contexts, answers)]
        prompts = [lm.tok_encode(c) for c in contexts]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    diffs, greedy_same, text_same = [], 0, 0
    for c, a, (ll, greedy), text, (ctx, cont), ids in zip(contexts, answers, scored, texts, pairs, prompts):
        assert ctx + cont == local_tok(c + a, add_special_tokens=False).input_ids
        want_ll, want_greedy = hf_score(model, ctx, cont)
        diffs.append(abs(ll - want_ll))
        greedy_same += greedy == want_greedy
        out = model.generate(torch.tensor([ids]), max_new_tokens=args.max_gen_toks, do_sample=False)[0, len(ids):]
        want = local_tok.decode(out, skip_special_tokens=True)
        for stop in until["until"]:
            want = want.split(stop)[0]
        text_same += text == want
    figures = {line.split()[0]: float(line.split()[-1]) for line in metrics.splitlines()
               if line.startswith(("toolkit_request_tau_sum", "toolkit_request_tau_count"))}
    tau = figures["toolkit_request_tau_sum"] / max(figures["toolkit_request_tau_count"], 1)
    summary = {"questions": len(rows), "loglikelihood_max_abs_diff": max(diffs),
               "loglikelihood_mean": sum(ll for ll, _ in scored) / len(scored),
               "is_greedy_agree": f"{greedy_same}/{len(rows)}", "generate_until_text_equal": f"{text_same}/{len(rows)}",
               "loglikelihood_seconds": round(ll_s, 1), "generate_until_seconds": round(gen_s, 1),
               "mean_request_tau": round(tau, 3)}
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
