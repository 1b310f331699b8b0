"""A MoE target (Qwen3-MoE, as SpecForge trains heads for Qwen3-30B-A3B) through the whole pipeline: EAGLE-3
training online lowers the loss and its evaluation runs the engine on the MoE target; `toolkit bench` serves the
exported head over it with greedy text identical to plain decoding."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from toolkit.cli import main
from toolkit.train.tracking import read_metrics


@pytest.fixture(scope="module")
def moe_target(tiny_target, tmp_path_factory, peaked):
    """A random 6-layer Qwen3-MoE (8 experts, 2 per token, layer 0 dense) with tiny_target's tokenizer."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    folder = tmp_path_factory.mktemp("moe-target")
    cfg = Qwen3MoeConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, moe_intermediate_size=48,
                         num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[0],
                         num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for layer in model.model.layers[1:]:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    return peaked(model, folder, tiny_target)


def train_eagle3(target, prepared, out, *extra: str) -> dict:
    """12 online EAGLE-3 steps via the CLI: the loss falls, the evaluation runs the engine on the target and its
    replay agrees; the exported head's config.json."""
    assert main(["train", "--model", str(target), "--data", str(prepared), "--output-dir", str(out),
                 "batch_size=2", "max_len=96", "log_every=1", "eval_samples=2", "eval_max_new_tokens=6", "threads=1",
                 "lr=3e-3", "warmup_ratio=0", "mixed_precision=no", "max_steps=12", "save_every=12", *extra]) == 0
    recs = read_metrics(out / "metrics.jsonl")
    loss = {r["step"]: r["loss"] for r in recs if "loss" in r}
    assert sorted(loss) == list(range(1, 13)) and loss[12] < 0.8 * loss[1]
    ev = [r for r in recs if "eval_engine_tau" in r][-1]
    assert ev["eval_engine_tau"] >= 1 and ev["eval_replay_differing_rows"] == 0
    cfg = json.loads((out / "draft" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 2]
    return cfg


def bench_command(draft, tmp_path, new: int) -> list[str]:
    """`toolkit bench` of `draft` on one prompt, a tree (3, 2, 5), one thread."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["Tell me about rivers."]}) + "\n")
    return [sys.executable, "-m", "toolkit.cli", "bench", "--draft", str(draft), "--prompts", str(prompts),
            "--max-new-tokens", str(new), "--num-steps", "3", "--topk", "2", "--num-draft-tokens", "5",
            "--threads", "1"]


def assert_bench_lossless(command: list[str], tmp_path) -> None:
    """The bench with --baseline succeeds, its greedy texts identical to plain decoding's."""
    result = tmp_path / "bench.json"
    done = subprocess.run(command + ["--baseline", "--out", str(result)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(result.read_text())
    assert r["greedy_identical_to_baseline"] is True and r["speculative"]["tau"] >= 1


def test_eagle3_trains_on_a_moe_target_and_bench_serves_it_losslessly(moe_target, prepared, tmp_path):
    out = tmp_path / "run"
    cfg = train_eagle3(moe_target, prepared, out, "draft_intermediate_size=80")  # not the target's 128
    assert cfg["intermediate_size"] == 80  # draft_intermediate_size, read back by bench below
    assert_bench_lossless(bench_command(out / "draft", tmp_path, 16), tmp_path)


def train_mtp(target, prepared, out) -> list[float]:
    """8 steps of an MTP head started from the target's last layer, via the CLI; its losses."""
    assert main(["train", "--model", str(target), "--data", str(prepared), "--output-dir", str(out),
                 "head=mtp", "init_block=target_last", "ttt_steps=2", "batch_size=2", "max_len=96", "log_every=1",
                 "eval_samples=0", "threads=1", "lr=1e-3", "warmup_ratio=0", "mixed_precision=no", "max_steps=8",
                 "save_every=8"]) == 0
    return [r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r]


def assert_chain_lossless(target_folder, draft_folder, new: int) -> None:
    """The exported head drafting a chain of 3 gives plain decoding's greedy tokens (batch 2)."""
    from toolkit.infer.draft_folder import load_draft
    from toolkit.infer.engine import Engine
    from toolkit.infer.loading import load_target
    from toolkit.infer.sampling import SamplingParams
    from toolkit.infer.tree import TreeConfig

    target = load_target(target_folder)
    head = load_draft(str(draft_folder), target, None)
    prompts, p = [[1, 520, 3300, 28, 991], [1, 44, 9000]], SamplingParams(max_new_tokens=new)
    want = [r.tokens for r in Engine(target, max_len=64, max_batch=2).generate_batch(prompts, p)]
    got = Engine(target, head, TreeConfig(3, 1, 4), max_len=64, max_batch=2).generate_batch(prompts, p)
    assert [r.tokens for r in got] == want


@pytest.fixture(scope="module")
def mixtral_target(tiny_target, tmp_path_factory, peaked):
    """A random 4-layer Mixtral (4 experts, 2 per token; block_sparse_moe.experts.{e}.w1/w2/w3 on disk)."""
    from transformers import AutoModelForCausalLM, MixtralConfig

    folder = tmp_path_factory.mktemp("mixtral-target")
    cfg = MixtralConfig(vocab_size=49152, hidden_size=64, intermediate_size=64, num_local_experts=4,
                        num_experts_per_tok=2, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return peaked(AutoModelForCausalLM.from_config(cfg), folder, tiny_target)


def test_an_mtp_head_starts_from_a_mixtral_last_layer_trains_and_serves_losslessly(mixtral_target, prepared,
                                                                                     tmp_path, capsys):
    from safetensors.torch import load_file

    out = tmp_path / "mtp"
    loss = train_mtp(mixtral_target, prepared, out)
    assert "mixture of experts" in capsys.readouterr().err  # SGLang's MiMoMTP block is dense
    assert len(loss) == 8 and loss[-1] < loss[0]
    saved = load_file(str(out / "draft" / "model.safetensors"))
    assert {f"model.mtp_layers.0.mlp.experts.{e}.{p}_proj.weight" for e in range(4) for p in ("gate", "up", "down")} \
        | {"model.mtp_layers.0.mlp.gate.weight"} <= set(saved)
    # init_block=target_last: every expert of the target's last layer becomes the block's (Mixtral's w1 ->
    # gate_proj, w3 -> up_proj, w2 -> down_proj), and its router
    from types import SimpleNamespace

    from toolkit.infer.config import ModelConfig
    from toolkit.train.objectives import OBJECTIVES

    w = load_file(str(mixtral_target / "model.safetensors"))
    built = OBJECTIVES["mtp"].build(SimpleNamespace(seed=0, init_block="target_last"),
                                    ModelConfig.from_folder(mixtral_target), None, None,
                                    {"lm_head.weight": w["lm_head.weight"]}, mixtral_target)
    last = "model.layers.3.block_sparse_moe."
    for e in range(4):
        for ours, theirs in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
            assert torch.equal(getattr(built.block.mlp.experts[e], f"{ours}_proj").weight,
                               w[f"{last}experts.{e}.{theirs}.weight"])
    assert torch.equal(built.block.mlp.gate.weight, w[last + "gate.weight"])
    assert_chain_lossless(mixtral_target, out / "draft", 16)


@pytest.fixture(scope="module")
def gpt_oss_target(tiny_target, tmp_path_factory, peaked):
    """A random 4-layer GPT-OSS (4 experts, 2 per token, sinks, a window of 16 on layers 0 and 2)."""
    from transformers import AutoModelForCausalLM, GptOssConfig

    folder = tmp_path_factory.mktemp("gpt-oss-target")
    cfg = GptOssConfig(vocab_size=49152, hidden_size=64, intermediate_size=64, num_local_experts=4,
                       num_experts_per_tok=2, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, sliding_window=16, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)
    return peaked(model, folder, tiny_target)


def test_an_mtp_head_over_gpt_oss_trains_its_sinks_and_serves_losslessly(gpt_oss_target, prepared, tmp_path):
    """The MTP block of a GPT-OSS target is a GPT-OSS layer (sinks, biased router, clamped experts) started from
    the target's last one; training-time test attends with its sinks (tests/train/test_ttt.py), which train."""
    from safetensors.torch import load_file

    out = tmp_path / "mtp"
    loss = train_mtp(gpt_oss_target, prepared, out)
    assert len(loss) == 8 and loss[-1] < loss[0]
    saved, w = load_file(str(out / "draft" / "model.safetensors")), load_file(str(gpt_oss_target / "model.safetensors"))
    start = w["model.layers.3.self_attn.sinks"]
    assert not torch.equal(saved["model.mtp_layers.0.self_attn.sinks"], start)  # trained from the target's
    assert (saved["model.mtp_layers.0.self_attn.sinks"] - start).abs().max() < 0.1
    assert {"model.mtp_layers.0.mlp.router.bias", "model.mtp_layers.0.mlp.experts.gate_up_proj"} <= set(saved)
    assert_chain_lossless(gpt_oss_target, out / "draft", 24)
