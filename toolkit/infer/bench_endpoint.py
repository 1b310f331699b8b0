"""`toolkit bench --compare-endpoint URL`: the bench's prompts, turn by turn, with the same prompt token ids, stop
ids and sampling, answered by a running server that serves the same target and head: SGLang (`POST /generate` with
`input_ids`; τ and the accepted-length histogram from its `meta_info`), vLLM (`POST /v1/completions` with token
ids; its spec-decode counters read from `/metrics` before and after each request, sent one at a time, give the
accepted lengths by position) or another `toolkit serve` (it answers either way). The server's τ, acceptance by
position and tokens/s go in the report beside the engine's, and greedy texts are checked identical: how a head
accepts in SGLang or vLLM against how it accepts here, on the same prompts.
"""
from __future__ import annotations

import time

from toolkit.infer.sequence import Result

SPEC = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens_per_pos")


def detect(client, root: str) -> str:
    """sglang when the server answers SGLang's /server_info (or the older /get_server_info), vllm when its
    /metrics has vLLM's counters."""
    if any(client.get(f"{root}/{path}").status_code == 200 for path in ("server_info", "get_server_info")):
        return "sglang"
    metrics = client.get(f"{root}/metrics")
    if metrics.status_code == 200 and "vllm:" in metrics.text:
        return "vllm"
    raise ValueError(f"--compare-endpoint {root}: neither SGLang's /get_server_info nor vLLM's /metrics answers "
                     "there; give the URL of an SGLang or vLLM server (or --endpoint-kind)")


def vllm_counters(client, root: str) -> tuple[float, float, dict[int, float]]:
    """(drafts, accepted tokens, accepted at each 0-based draft position) summed over label sets (engines)."""
    from prometheus_client.parser import text_string_to_metric_families

    drafts = accepted = 0.0
    at: dict[int, float] = {}
    for family in text_string_to_metric_families(client.get(f"{root}/metrics").text):
        if family.name not in SPEC:
            continue
        for s in family.samples:
            if not s.name.endswith("_total"):
                continue  # _created timestamps
            if family.name == SPEC[0]:
                drafts += s.value
            elif family.name == SPEC[1]:
                accepted += s.value
            else:
                at[int(s.labels["position"])] = at.get(int(s.labels["position"]), 0.0) + s.value
    return drafts, accepted, at


def from_histogram(hist: list[int]) -> list[int]:
    """Verify steps' accepted lengths from a histogram (index = draft tokens a step accepted), in no order."""
    return [a for a, n in enumerate(hist) for _ in range(int(n))]


def sglang_accepted(meta: dict, tokens: int) -> list[int]:
    """The verify steps' accepted lengths SGLang's meta_info gives: its histogram (spec_correct_drafts_histogram,
    or the older spec_accept_histogram), else its counts spread over its verify steps (τ exact, positions not);
    no spec keys (SGLang writes none when no verify step ran): none."""
    hist = meta.get("spec_correct_drafts_histogram") or meta.get("spec_accept_histogram")
    if hist:
        return from_histogram(hist)
    steps = int(meta.get("spec_verify_ct") or 0)
    if not steps:
        return []
    total = next((int(meta[k]) for k in ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
                  if meta.get(k) is not None), max(tokens - 1 - steps, 0))
    each, extra = divmod(total, steps)
    return [each + 1] * extra + [each] * (steps - extra)


def vllm_accepted(drafts: int, at: dict[int, int], tokens: int) -> list[int]:
    """The verify steps' accepted lengths from vLLM's counters over one request: `drafts` steps that drafted, `at`
    {position k: steps that accepted it}, `tokens` generated. vLLM counts a step's accepted tokens before it cuts
    the output at a stop (EOS, max_tokens); those past it are taken back from the longest steps, as the engine
    counts only what it emits. Steps that drafted nothing (the prefill's token aside) accepted 0."""
    depth = max((k + 1 for k, n in at.items() if n), default=0)
    reached = [at.get(k, 0) for k in range(depth)] + [0]  # steps that accepted at least k + 1 tokens
    accepted = [0] * (drafts - reached[0]) + [k + 1 for k in range(depth) for _ in range(reached[k] - reached[k + 1])]
    accepted += [0] * max(tokens - 1 - sum(accepted) - len(accepted), 0)  # steps with nothing drafted
    excess = sum(accepted) + len(accepted) - (tokens - 1)
    for i in sorted(range(len(accepted)), key=lambda i: -accepted[i]):
        if excess <= 0:
            break
        take = min(excess, accepted[i])
        accepted[i] -= take
        excess -= take
    return accepted


class Endpoint:
    def __init__(self, url: str, kind: str, params, stops: set[int], seed: int, timeout: float = 600.0):
        import httpx

        self.root = url.rstrip("/").removesuffix("/v1")
        self.client = httpx.Client(timeout=timeout)
        try:
            self.kind = detect(self.client, self.root) if kind == "auto" else kind
            models = self.client.get(f"{self.root}/v1/models")
        except httpx.HTTPError as err:
            raise ValueError(f"--compare-endpoint {url}: cannot reach it ({type(err).__name__}: {err})") from None
        self.model = models.json()["data"][0]["id"] if models.status_code == 200 else None
        self.params, self.stops, self.seed, self.asked = params, sorted(stops), seed, 0
        self.counter_seconds = 0.0  # spent reading vLLM's /metrics around requests: the bench's, not the server's

    def _post(self, path: str, body: dict) -> dict:
        r = self.client.post(f"{self.root}{path}", json=body)
        if r.status_code != 200:
            raise ValueError(f"--compare-endpoint: {path} answered {r.status_code}: {r.text[:300]}")
        return r.json()

    def _counters(self) -> tuple[float, float, dict[int, float]]:
        """vllm_counters, its time added to counter_seconds (the bench's, not the server's)."""
        start = time.perf_counter()
        try:
            return vllm_counters(self.client, self.root)
        finally:
            self.counter_seconds += time.perf_counter() - start

    def generate(self, ids: list[int], max_new_tokens: int | None = None) -> Result:
        """One turn's generated ids and the server's accepted lengths. Its seconds stay 0: the server's split is
        not known, so a run's time is all `other`; the counters read around a vLLM request are not in it
        (self.counter_seconds, which run_endpoint takes off the wall time)."""
        from dataclasses import replace

        p, seed = self.params, self.seed + self.asked
        p = p if max_new_tokens is None else replace(p, max_new_tokens=max_new_tokens)
        self.asked += 1
        if self.kind == "sglang":
            # every sampling value given: a server that fills the unset ones from the model's generation_config
            # (SGLang's and vLLM's default) would otherwise sample otherwise than the engine
            sampling = {"max_new_tokens": p.max_new_tokens, "temperature": p.temperature, "top_p": p.top_p,
                        "top_k": p.top_k or -1, "min_p": 0.0, "repetition_penalty": 1.0,
                        "stop_token_ids": self.stops, "sampling_seed": seed}
            out = self._post("/generate", {"input_ids": ids, "sampling_params": sampling})
            tokens = out["output_ids"]
            accepted = sglang_accepted(out["meta_info"], len(tokens))
        else:
            before = self._counters()
            body = {"model": self.model, "prompt": ids, "max_tokens": p.max_new_tokens, "temperature": p.temperature,
                    "top_p": p.top_p, "top_k": p.top_k or -1, "min_p": 0.0, "repetition_penalty": 1.0,
                    "stop_token_ids": self.stops, "seed": seed, "return_token_ids": True}
            tokens = self._post("/v1/completions", body)["choices"][0]["token_ids"]
            after = self._counters()
            drafts, at = int(after[0] - before[0]), {k: int(v - before[2].get(k, 0)) for k, v in after[2].items()}
            accepted = vllm_accepted(drafts, at, len(tokens))
        return Result(tokens=list(tokens), verify_steps=len(accepted), accepted=accepted)


def run_endpoint(url: str, kind: str, tok, prompts, params, seed: int, stops: set[int]):
    """-> (results one per turn, answers per prompt, wall seconds, the Endpoint) of the server, as bench.run_engine
    gives the engine's."""
    from toolkit.infer.prompts import answer_turns, warm_up_ids

    endpoint = Endpoint(url, kind, params, stops, seed)
    endpoint.generate(warm_up_ids(tok, prompts), max_new_tokens=4)  # a first request's start-up is not the run's
    endpoint.asked, endpoint.counter_seconds, results, start = 0, 0.0, [], time.perf_counter()

    def generate(ids, p):
        res = endpoint.generate(ids)
        res.category, res.turn = str(p["category"]), p["turn"]
        results.append(res)
        return res.tokens

    answers = answer_turns(tok, prompts, generate)
    return results, answers, time.perf_counter() - start - endpoint.counter_seconds, endpoint


def compare_endpoint(report: dict, args, tok, prompts, params, stops, spec_answers, dtype, positions: int,
                     differing) -> None:
    """report["endpoint"]: the server's run over the same prompts, and how it compares with the engine's;
    differing: bench.differing (counts the greedy answers that differ, explained outside fp32)."""
    from toolkit.infer.metrics import summarize

    results, answers, wall, server = run_endpoint(args.compare_endpoint, args.endpoint_kind, tok, prompts, params,
                                                  args.seed, stops)
    report["endpoint"] = {"url": args.compare_endpoint, "kind": server.kind, "model": server.model,
                          **summarize(results, wall, positions), "per_turn": {
                              str(t): {k: v for k, v in summarize([r for r in results if r.turn == t]).items()
                                       if k in ("tau", "verify_steps", "tokens")}
                              for t in sorted({r.turn for r in results})}}
    if report["endpoint"]["tau"]:
        report["tau_vs_endpoint"] = report["speculative"]["tau"] / report["endpoint"]["tau"]
    if params.greedy:
        report["greedy_identical_to_endpoint"] = answers == spec_answers
        report["greedy_answers_differing_from_endpoint"] = differing(answers, spec_answers, dtype)
