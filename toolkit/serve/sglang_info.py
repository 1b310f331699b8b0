"""SGLang's native info and cache routes, which its benchmark scripts call around a run: `GET /get_model_info`
(and `/model_info`), `GET /get_server_info` (and `/server_info`: the serving settings in SGLang's names and
`internal_states[0].avg_spec_accept_length`, tokens per verify step since the start, the bonus token included, and
`step_time_dict`, engine step seconds by batch size, which SpecForge's config sweeps read),
and `GET|POST /flush_cache` (the prefix cache emptied at the next step boundary; running requests go on)."""
from __future__ import annotations

import asyncio

from fastapi.responses import PlainTextResponse

ALGORITHMS = {"Eagle3Head": "EAGLE3", "Eagle2Head": "EAGLE", "MTPHead": "NEXTN"}  # SGLang's --speculative-algorithm


def add_sglang_info_routes(app, served, engine, batcher) -> None:
    config = engine.target.config

    def model_info() -> dict:
        return {"model_path": served.name, "tokenizer_path": served.name, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": config.model_type}

    def server_info() -> dict:
        head, tree = engine.head, engine.tree
        algorithm = ALGORITHMS.get(type(head).__name__) if head is not None else (
            "NGRAM" if engine.lookup is not None else None)
        t = batcher.totals
        from toolkit import __version__

        return {"model_path": served.name, "served_model_name": served.name, "context_length": engine.max_len,
                "max_running_requests": engine.max_batch, "speculative_algorithm": algorithm,
                "speculative_num_steps": tree.num_steps if head is not None else None,
                "speculative_eagle_topk": tree.topk if head is not None else None,
                "speculative_num_draft_tokens": tree.num_draft_tokens if head is not None else None,
                "disable_radix_cache": engine.prefix_cache is None,
                "internal_states": [{"avg_spec_accept_length": (t["accepted"] + t["seq_steps"]) / t["seq_steps"]
                                     if t["seq_steps"] else None,
                                     "last_gen_throughput": t["tokens"] / t["busy"] if t["busy"] else 0.0,
                                     "running": len(engine.running), "waiting": len(batcher.waiting),
                                     # engine step seconds by running sequences, the last 1,000 of each
                                     "step_time_dict": {str(n): list(times) for n, times in
                                                        sorted(batcher.step_times.items())}}],
                "version": __version__}

    for path in ("/get_model_info", "/model_info"):
        app.add_api_route(path, model_info, methods=["GET"])
    for path in ("/get_server_info", "/server_info"):
        app.add_api_route(path, server_info, methods=["GET"])

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        batcher.flush()
        for _ in range(3000):  # the engine thread empties it between steps: wait for that, a step at most
            if not batcher.flushing:
                break
            await asyncio.sleep(0.01)
        return PlainTextResponse("Cache flushed.\n")
