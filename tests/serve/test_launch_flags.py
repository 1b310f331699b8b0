"""SGLang's and vLLM's speculative launch flags (toolkit/serve/launch_flags.py, vllm_config.py): each read as our
own flags, the kind of draft they name checked against the folder, what neither engine here serves refused by name,
and a launch line of each server run end to end (a draft given as a hub id from the HF cache) with the answers of
our own flags."""
from __future__ import annotations

import json

import pytest

from toolkit.cli import build_parser, main
from toolkit.serve.engine_args import check


def parsed(*argv: str):
    args = build_parser().parse_args(["serve", *argv])
    tree, branch = check(args, "serve")
    return args, tree, branch


def test_sglang_names_are_our_flags():
    args, tree, branch = parsed("--model-path", "m", "--speculative-draft-model-path", "d", "--speculative-num-steps",
                                "3", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8",
                                "--speculative-token-map", "maps/freq_8192.pt", "--max-running-requests", "4",
                                "--context-length", "1024", "--speculative-accept-threshold-single", "1.0")
    assert (args.model, args.draft, args.token_map) == ("m", "d", "maps/freq_8192.pt")
    assert vars(tree) == {"num_steps": 3, "topk": 4, "num_draft_tokens": 8} and branch is None
    assert (args.max_batch_size, args.max_seq_len) == (4, 1024)


def test_vllm_names_and_its_positional_model_are_our_flags():
    args, tree, _ = parsed("m", "--speculative-config", json.dumps(
        {"model": "d", "num_speculative_tokens": 3, "disable_by_batch_size": 8,  # no method: any kind of draft
         "draft_tensor_parallel_size": 1, "quantization": None}), "--max-num-seqs", "2", "--max-model-len", "512")
    assert (args.model, args.draft, args.speculative_disable_by_batch_size) == ("m", "d", 8)
    assert vars(tree) == {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}  # vLLM drafts a chain of k
    assert (args.max_batch_size, args.max_seq_len) == (2, 512)


@pytest.mark.parametrize("argv, lookup", [
    (["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8"], (7, 12, 1)),  # SGLang's window
    (["--speculative-algorithm", "NGRAM", "--speculative-ngram-max-match-window-size", "5",
      "--speculative-ngram-min-match-window-size", "2"], (4, 5, 2)),  # no draft tokens given: the window's, as SGLang
    (["--speculative-algorithm", "NGRAM"], (11, 12, 1)),  # neither: SGLang's window of 12, so 12 draft tokens
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}'], (4, 5, 5)),  # vLLM's defaults
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}'], (4, 3, 3)),
    (["--speculative-config", '{"model": "[ngram]", "num_speculative_tokens": 2, "prompt_lookup_min": 1, '
                              '"prompt_lookup_max": 4}'], (2, 4, 1)),
])
def test_ngram_is_prompt_lookup_alone(argv, lookup):
    args, _, branch = parsed("--model", "m", *argv)
    assert args.no_speculation and args.draft is None
    assert (branch.num_tokens, branch.max_ngram, branch.min_ngram) == lookup


@pytest.mark.parametrize("argv, message", [
    (["--speculative-algorithm", "STANDALONE", "--draft", "d"], "STANDALONE's separate draft language model is not "
                                                                "served"),
    (["--speculative-algorithm", "EAGLE3"], "--speculative-algorithm EAGLE3 needs the draft: give "
                                            "--speculative-draft-model-path"),
    (["--speculative-algorithm", "EAGLE", "--draft", "d", "--speculative-config", "{}"], "give one"),
    (["--draft", "d", "--speculative-accept-threshold-acc", "0.7"], "(lossy); toolkit verifies losslessly only"),
    (["--speculative-config", "{bad"], "not JSON"),
    (["--speculative-config", "[1]"], "a JSON object is expected"),
    (["--speculative-config", '{"model": "d", "num_speculative_tokens": 0}'],
     "num_speculative_tokens must be an integer >= 1"),
    (["--speculative-config", '{"model": "d"}'], "num_speculative_tokens is needed, as vLLM needs it, when the "
                                                 "draft's config.json (d/config.json) gives no n_predict"),
    (["--speculative-config", '{"method": "ngram"}'], "method ngram needs num_speculative_tokens"),
    (["--speculative-config", '{"method": "medusa", "model": "d", "num_speculative_tokens": 2}'],
     "method 'medusa' is not served here"),
    (["--speculative-config", '{"model": "d", "num_speculative_tokens": 2, "speculative_token_tree": "[(0,)]"}'],
     "speculative_token_tree not served here (for a static speculative_token_tree give --topk"),
    (["--speculative-config", '{"model": "d", "num_speculative_tokens": 2, "quantization": "fp8"}'],
     "quantization 'fp8' is not served"),
    (["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}'], "method 'eagle' needs \"model\""),
    (["--speculative-config", '{"method": "eagle3", "model": "d", "num_speculative_tokens": 3}', "--num-steps", "4"],
     "--speculative-config sets --num-steps 3, and --num-steps 4 is given too"),
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, '
                              '"prompt_lookup_max": 2}'], "1 <= min <= max"),
    # served without speculation, the algorithm silently dropped
    (["--draft", "d", "--no-speculation", "--speculative-algorithm", "EAGLE3"],
     "--speculative-algorithm asks for speculation and --no-speculation serves the target alone: give one"),
    (["--no-speculation", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'],
     "--speculative-config asks for speculation"),
])
def test_what_is_not_served_is_refused_by_name(argv, message):
    with pytest.raises(ValueError) as err:
        parsed("--model", "m", *argv)
    assert message in str(err.value)


def test_a_model_given_positionally_and_as_a_flag_must_agree():
    with pytest.raises(ValueError, match="the model is given twice, as a and --model b"):
        parsed("a", "--model", "b", "--draft", "d")
    assert parsed("a", "--model", "a", "--draft", "d")[0].model == "a"


def test_the_algorithm_must_name_the_kind_of_draft_the_folder_holds(tmp_path):
    eagle3, mtp = tmp_path / "e3", tmp_path / "mtp"
    for folder, cfg in ((eagle3, {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1}),
                        (mtp, {"architectures": ["MiMoMTP"], "num_nextn_predict_layers": 1,
                               "toolkit": {"head": "mtp"}})):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
    parsed("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(eagle3))
    parsed("--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", str(mtp))  # SGLang serves MTP so
    parsed("--speculative-config", json.dumps({"method": "deepseek_mtp", "model": str(mtp),
                                               "num_speculative_tokens": 2}))
    with pytest.raises(ValueError) as err:
        parsed("--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", str(eagle3))
    assert str(err.value) == (f"--speculative-algorithm EAGLE asks for an EAGLE-1/2 head or MTP layers, and the draft "
                              f"{eagle3} holds an EAGLE-3 head: ask for EAGLE3, or give a draft of that kind")
    with pytest.raises(ValueError, match="--speculative-config's method asks for an EAGLE-3 head, and the draft .* "
                                         "holds MTP layers: ask for mtp"):
        parsed("--speculative-config", json.dumps({"method": "eagle3", "model": str(mtp), "num_speculative_tokens": 2}))


def test_nextn_without_a_draft_path_drafts_with_the_targets_own_layers(tmp_path):
    target = tmp_path / "t"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 4,
                                                    "num_nextn_predict_layers": 1}))
    assert parsed("--model-path", str(target), "--speculative-algorithm", "NEXTN")[0].draft == str(target)
    args = parsed(str(target), "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}')[0]
    assert args.draft == str(target) and args.num_steps == 1
    with pytest.raises(ValueError, match="drafts with the target's own MTP layers: give the target"):
        check(build_parser().parse_args(["serve", "--speculative-algorithm", "NEXTN"]), "serve")


def test_launch_lines_of_both_servers_answer_as_our_flags_do(tiny_target, random_draft, tmp_path, monkeypatch):
    """`run-batch` (which takes serve's engine flags) with an SGLang line whose draft is a hub id in the HF cache, a
    vLLM line, and our own flags: the same greedy answers, drafted with the same tree (the same verify steps)."""
    import huggingface_hub.constants

    from test_hub import cached_repo

    cache = tmp_path / "hf-cache"
    draft = random_draft(tiny_target, tmp_path / "draft", str(tiny_target))
    snap = cached_repo(cache, "org/tiny-eagle3", {f.name: f.read_bytes() for f in draft.iterdir() if f.is_file()})
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rows = [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"messages": [{"role": "user", "content": text}], "max_tokens": 12, "temperature": 0}}
            for i, text in enumerate(["Write a poem", "What is 2+2?", "Name three colors"])]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["run-batch", "-i", str(src), "--threads", "1", "--log-every", "0"]
    lines = {
        "ours": ["--model", str(tiny_target), "--draft", str(draft), "--num-steps", "3", "--topk", "1",
                 "--num-draft-tokens", "4", "--max-batch-size", "2", "--max-seq-len", "256"],
        "sglang": ["--model-path", str(tiny_target), "--speculative-algorithm", "EAGLE3",
                   "--speculative-draft-model-path", "org/tiny-eagle3", "--speculative-num-steps", "3",
                   "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
                   "--max-running-requests", "2", "--context-length", "256"],
        "vllm": ["--model", str(tiny_target), "--speculative-config", json.dumps(
            {"method": "eagle3", "model": str(snap), "num_speculative_tokens": 3}), "--max-num-seqs", "2",
            "--max-model-len", "256"],
        "plain": ["--model", str(tiny_target), "--no-speculation", "--max-seq-len", "256"]}
    got = {}
    for name, argv in lines.items():
        assert main([*common, *argv, "-o", str(tmp_path / f"{name}.jsonl")]) == 0, name
        got[name] = [json.loads(s)["response"]["body"] for s in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    text = {name: [b["choices"][0]["message"]["content"] for b in bodies] for name, bodies in got.items()}
    assert text["ours"] == text["sglang"] == text["vllm"] == text["plain"]
    steps = {name: [b["usage"]["speculative"]["verify_steps"] for b in got[name]]
             for name in ("ours", "sglang", "vllm")}
    assert steps["ours"] == steps["sglang"] == steps["vllm"] and all(s > 0 for s in steps["ours"])


def test_a_draft_revision_is_read_from_either_servers_flag():
    with pytest.raises(ValueError, match="the draft d is no hub id: drop the revision"):
        parsed("--draft", "d", "--speculative-draft-model-revision", "v2")
    with pytest.raises(ValueError, match="the draft d is no hub id: drop the revision"):
        parsed("--speculative-config", '{"model": "d", "num_speculative_tokens": 2, "revision": "v2"}')


def test_sglang_picks_the_tree_for_the_target_when_no_step_count_is_given(tmp_path, capsys):
    """As SGLang's auto_choose_speculative_params: (5, 4, 8) for a Llama target, (3, 1, 4) for others; a chain's
    draft tokens are steps + 1 whatever was given (SGLang adjusts them, warning)."""
    head = tmp_path / "e3"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1}))
    trees = {}
    for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM"):
        (tmp_path / arch).mkdir()
        (tmp_path / arch / "config.json").write_text(json.dumps({"architectures": [arch], "num_hidden_layers": 4}))
        _, tree, _ = parsed("--model-path", str(tmp_path / arch), "--speculative-algorithm", "EAGLE3",
                            "--speculative-draft-model-path", str(head))
        trees[arch] = vars(tree)
    assert trees == {"LlamaForCausalLM": {"num_steps": 5, "topk": 4, "num_draft_tokens": 8},
                     "Qwen2ForCausalLM": {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}}
    assert "as SGLang picks them for Qwen2ForCausalLM" in capsys.readouterr().err
    _, tree, _ = parsed("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(head),
                        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                        "--speculative-num-draft-tokens", "8")
    assert vars(tree) == {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}
    assert "--speculative-num-draft-tokens 8 is adjusted to --speculative-num-steps + 1 = 4" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--num-draft-tokens 8: must be in 2..4"):  # our own flags: no
        parsed("--draft", str(head), "--num-steps", "3", "--topk", "1", "--num-draft-tokens", "8")  # silent change
    with pytest.raises(ValueError, match="give --speculative-num-steps too, or none of the three"):
        parsed("--speculative-algorithm", "EAGLE3", "--draft", str(head), "--speculative-eagle-topk", "4")


def test_the_rest_of_a_launch_line_is_taken_as_each_server_means_it():
    """Copied lines carry flags beside the speculative ones: those that mean something here do it, the no-ops are
    taken, and what one device cannot do is refused."""
    args, _, _ = parsed("m", "--draft", "d", "--tensor-parallel-size", "1", "--trust-remote-code", "--enforce-eager",
                        "--dtype", "half", "--disable-log-stats", "--disable-log-requests", "--enable-prefix-caching")
    assert args.eager and args.dtype == "float16" and args.log_every == 0 and args.prefix_cache_rows == 4
    args, _, _ = parsed("--model-path", "m", "--draft", "d", "--tp", "1", "--disable-cuda-graph", "--dtype", "bfloat16",
                        "--disable-radix-cache")
    assert args.eager and args.dtype == "bfloat16" and args.prefix_cache_rows == 0
    assert parsed("m", "--draft", "d", "--dtype", "float")[0].dtype == "float32"
    with pytest.raises(ValueError, match="--tensor-parallel-size 2: one device serves here"):
        parsed("m", "--draft", "d", "--tp-size", "2")
    with pytest.raises(ValueError, match="--enable-prefix-caching and a switch that turns prefix caching off"):
        parsed("m", "--draft", "d", "--enable-prefix-caching", "--no-enable-prefix-caching")
    with pytest.raises(SystemExit):  # argparse names the value and the choices
        build_parser().parse_args(["serve", "--dtype", "float8"])


def test_several_served_model_names_are_each_accepted_and_replies_name_the_first(tiny_target, in_process_app):
    """vLLM's `--served-model-name a b`: a request may send either; /v1/models lists both; replies name the first."""
    from fastapi.testclient import TestClient

    args, _, _ = parsed("m", "--draft", "d", "--served-model-name", "tiny", "tiny-latest")
    assert args.served_model_name == ["tiny", "tiny-latest"]
    with in_process_app(tiny_target, aliases=("tiny-latest",)) as (app, _), TestClient(app) as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["tiny", "tiny-latest"]
        assert client.get("/v1/models/tiny-latest").json()["root"] == "tiny"
        r = client.post("/v1/completions", json={"model": "tiny-latest", "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["model"] == "tiny"
        r = client.post("/v1/completions", json={"model": "other", "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 404 and "this server serves 'tiny' or 'tiny-latest'" in r.json()["error"]["message"]


def test_gpu_memory_utilization_sizes_each_sequences_cache(monkeypatch, capsys):
    """vLLM's --gpu-memory-utilization / SGLang's --mem-fraction-static: the KV cache gets what keeps memory in use
    within that share once the model is loaded; each sequence's length follows, capped by --max-seq-len."""
    import torch

    from toolkit.infer import kv_cache
    from toolkit.infer.config import ModelConfig
    from toolkit.serve.launch_flags import utilization_len

    c = ModelConfig(model_type="llama", vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=2,
                    num_heads=2, num_kv_heads=1, head_dim=8, max_position_embeddings=100_000)
    per_token = kv_cache.cache_bytes(c, 1, 1, torch.float32)  # 2 layers x 1 KV head x (8 + 8) x 4 bytes = 128
    real, asked = kv_cache.utilization_budget, []
    monkeypatch.setattr(kv_cache, "utilization_budget", lambda device, u: asked.append(u) or 128 * 3 * 500)
    args = parsed("m", "--draft", "d", "--gpu-memory-utilization", "0.9")[0]
    assert utilization_len(args, c, 4096, 3, torch.float32, "cpu") == 500 and asked == [0.9] and per_token == 128
    assert utilization_len(args, c, 200, 3, torch.float32, "cpu") == 200  # --max-seq-len caps it
    assert "--gpu-memory-utilization 0.9: 0.00 GB for the KV cache of 3 rows: 200 tokens each" in \
        capsys.readouterr().err
    assert parsed("m", "--draft", "d", "--mem-fraction-static", "0.8")[0].gpu_memory_utilization == 0.8
    assert utilization_len(parsed("m", "--draft", "d")[0], c, 4096, 3, torch.float32, "cpu") == 4096  # not given
    monkeypatch.setattr(kv_cache, "utilization_budget", lambda device, u: -5)  # the model takes more than that
    with pytest.raises(ValueError, match="--gpu-memory-utilization 0.9: with the model loaded, -0.00 GB is left"):
        utilization_len(args, c, 4096, 3, torch.float32, "cpu")
    for bad in ("0", "1.5"):
        with pytest.raises(ValueError, match=f"--gpu-memory-utilization {float(bad)}: give the share"):
            parsed("m", "--draft", "d", "--gpu-memory-utilization", bad)
    budget = real("cpu", 1.0)  # this machine: all of RAM less what is in use = free RAM
    assert abs(budget - kv_cache.free_memory_bytes("cpu")) < 2**30


def test_what_an_audit_of_copied_lines_found_is_read_as_there(tmp_path):
    """-tp, --max-model-len 32k / auto, SGLang's --speculative-draft-model, an NGRAM line with steps and top-k
    (SGLang derives them), vLLM's newer *_mtp names and keys at their defaults, SGLang's default revision main."""
    assert parsed("m", "--draft", "d", "-tp", "1")[0].tensor_parallel_size == 1
    assert [parsed("m", "--draft", "d", "--max-model-len", v)[0].max_seq_len for v in ("32k", "32K", "auto", "-1")] \
        == [32000, 32768, 1 << 40, 1 << 40]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--max-model-len", "lots"])
    assert parsed("--model-path", "m", "--speculative-draft-model", "d")[0].draft == "d"
    args, _, branch = parsed("--model-path", "m", "--speculative-algorithm", "NGRAM", "--speculative-num-steps", "7",
                             "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "8")
    assert args.no_speculation and (branch.num_tokens, branch.max_ngram) == (7, 12)  # SGLang's match window: 12
    mtp = tmp_path / "mtp"
    mtp.mkdir()
    (mtp / "config.json").write_text(json.dumps({"architectures": ["MiMoMTP"], "num_nextn_predict_layers": 1,
                                                 "toolkit": {"head": "mtp"}}))
    args = parsed("--speculative-config", json.dumps({"method": "qwen3_5_mtp", "model": str(mtp),
                                                      "num_speculative_tokens": 2, "rejection_sample_method": "strict",
                                                      "disable_padded_drafter_batch": False}))[0]
    assert args.draft == str(mtp) and args.draft_kinds == ("mtp",)
    args = parsed("--speculative-config", json.dumps({"model": str(mtp), "num_speculative_tokens": 2,
                                                      "enforce_eager": True}))[0]
    assert args.eager_draft and not args.eager  # vLLM's: the drafter eager, the target's steps still graphed
    with pytest.raises(ValueError, match="rejection_sample_method not served here"):
        parsed("--speculative-config", json.dumps({"model": str(mtp), "num_speculative_tokens": 2,
                                                   "rejection_sample_method": "probabilistic"}))
    assert parsed("--draft", str(mtp), "--speculative-draft-model-revision", "main")[0].draft == str(mtp)


def as_speculators(draft, folder, verifier: str, tokens: int = 3):
    """Our EAGLE-3 export rewritten as speculators saves one (the layer config nested, layers.0.*), naming its
    verifier and its proposal's speculative_tokens."""
    from safetensors.torch import load_file, save_file

    cfg = json.loads((draft / "config.json").read_text())
    layer = {k: cfg[k] for k in ("model_type", "hidden_size", "intermediate_size", "num_attention_heads",
                                 "num_key_value_heads", "head_dim", "num_hidden_layers", "vocab_size",
                                 "rms_norm_eps", "max_position_embeddings", "rope_theta")}
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "norm_before_residual": False,
        "draft_vocab_size": cfg["draft_vocab_size"], "transformer_layer_config": layer,
        "eagle_aux_hidden_state_layer_ids": cfg["eagle_aux_hidden_state_layer_ids"],
        "speculators_config": {"algorithm": "eagle3", "proposal_methods": [{"proposal_type": "greedy",
                                                                            "speculative_tokens": tokens}],
                               "default_proposal_method": "greedy", "verifier": {"name_or_path": verifier}}}))
    w = load_file(str(draft / "model.safetensors"))
    save_file({k.replace("midlayer.", "layers.0."): v for k, v in w.items()}, str(folder / "model.safetensors"))
    return folder


def test_without_num_speculative_tokens_the_chain_is_the_drafts_as_vllm_takes_it(tmp_path, capsys):
    """vLLM's default for num_speculative_tokens: a speculators proposal's speculative_tokens, n_predict, or the MTP
    layers a target declares; a draft whose config.json gives none is refused as vLLM refuses it."""
    spec = tmp_path / "spec"
    spec.mkdir()
    (spec / "config.json").write_text(json.dumps({
        "speculators_model_type": "eagle3", "speculators_config": {"proposal_methods": [{"speculative_tokens": 4}],
                                                                   "verifier": {"name_or_path": "org/t"}}}))
    _, tree, _ = parsed("m", "--speculative-config", json.dumps({"method": "eagle3", "model": str(spec)}))
    assert vars(tree) == {"num_steps": 4, "topk": 1, "num_draft_tokens": 5}
    assert f"num_speculative_tokens 4, from {spec / 'config.json'} (as vLLM takes it)" in capsys.readouterr().err
    target = tmp_path / "t"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 4,
                                                    "num_nextn_predict_layers": 2}))
    _, tree, _ = parsed(str(target), "--speculative-config", '{"method": "deepseek_mtp"}')
    assert vars(tree) == {"num_steps": 2, "topk": 1, "num_draft_tokens": 3}
    head = tmp_path / "e3"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "n_predict": 3}))
    assert parsed("m", "--speculative-config", json.dumps({"model": str(head)}))[1].num_steps == 3
    with pytest.raises(ValueError, match="--speculative-config sets --num-steps 3, and --num-steps 2 is given too"):
        parsed("m", "--speculative-config", json.dumps({"model": str(head)}), "--num-steps", "2")
    (head / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "n_predict": 0}))
    with pytest.raises(ValueError, match="num_speculative_tokens is needed, as vLLM needs it"):
        parsed("m", "--speculative-config", json.dumps({"method": "eagle3", "model": str(head)}))


def test_a_speculators_folder_given_as_the_model_drafts_for_its_verifier(tiny_target, random_draft, tmp_path, capsys):
    """vLLM's `vllm serve SPECULATOR`: the folder drafts for the verifier it names, with its speculative_tokens as
    the chain: the same answers and verify steps as our flags with that draft and chain, the replies naming the
    verifier; with a draft flag too it is refused, as it names its draft itself."""
    draft = random_draft(tiny_target, tmp_path / "draft", str(tiny_target))
    spec = as_speculators(draft, tmp_path / "spec", str(tiny_target), tokens=3)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "messages": [{"role": "user", "content": text}], "max_tokens": 12, "temperature": 0}}) + "\n"
        for i, text in enumerate(["Write a poem", "What is 2+2?"])))
    common = ["run-batch", "-i", str(src), "--threads", "1", "--log-every", "0", "--max-seq-len", "256"]
    lines = {"ours": ["--model", str(tiny_target), "--draft", str(draft), "--num-steps", "3", "--topk", "1"],
             "speculators": ["--model", str(spec)]}
    got = {}
    for name, argv in lines.items():
        assert main([*common, *argv, "-o", str(tmp_path / f"{name}.jsonl")]) == 0, name
        got[name] = [json.loads(s)["response"]["body"] for s in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    assert f"is a speculators eagle3 folder: it drafts for its verifier {tiny_target}" in capsys.readouterr().err
    for key in (lambda b: b["choices"][0]["message"]["content"], lambda b: b["usage"]["speculative"]["verify_steps"],
                lambda b: b["model"]):
        assert [key(b) for b in got["ours"]] == [key(b) for b in got["speculators"]]
    assert got["ours"][0]["model"] == str(tiny_target)
    with pytest.raises(ValueError, match="is a speculators folder, which names its draft .* drop --draft"):
        parsed(str(spec), "--draft", str(draft))
    args, tree, _ = parsed(str(spec), "--no-speculation")  # the verifier alone
    assert args.draft == str(spec) and args.model is None and tree is None
