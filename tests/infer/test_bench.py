"""`toolkit bench` end to end on SmolLM2 with a random EAGLE-3 head written in the checkpoint format."""
import json
import subprocess
import sys

import pytest
import torch

from toolkit.infer.drafts import load_eagle3, random_head, save_eagle3
from toolkit.infer.loading import load_target
from toolkit.models import fingerprint


@pytest.fixture(scope="module")
def draft_dir(smollm2_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("draft")
    target = load_target(smollm2_dir)
    head = random_head(target.config, list(range(0, 49152, 3)), seed=4)
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    save_eagle3(head, folder, cfg, "smollm2-135m-instruct", fingerprint(smollm2_dir))
    return folder, head, target


def test_saved_head_follows_the_format_and_loads_back(draft_dir):
    folder, head, target = draft_dir
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 16384
    assert cfg["max_position_embeddings"] == 8192 and cfg["tie_word_embeddings"] is False
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    loaded = load_eagle3(folder, target.config)
    assert torch.equal(loaded.d2t, head.d2t)
    assert torch.equal(loaded.fc.weight, head.fc.weight.to(torch.bfloat16).float())


def test_bench_runs_everything_in_one_go(draft_dir, shared, tmp_path):
    folder, _, _ = draft_dir
    out = tmp_path / "b.json"
    done = subprocess.run([sys.executable, "-m", "toolkit.cli", "bench", "--draft", str(folder), "--prompts",
                           str(shared / "data/eval/mt_bench.jsonl"), "--limit", "2", "--max-new-tokens", "6",
                           "--num-steps", "3", "--topk", "2", "--num-draft-tokens", "5", "--baseline",
                           "--compare-hf", "--compare-pld", "3", "--sweep", "2,1,3", "--threads", "1",
                           "--prefix-cache-rows", "2",  # turn 2 over turn 1's cached KV: still transformers' text
                           "--out", str(out), "--answers", str(tmp_path / "answers.jsonl")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(out.read_text())
    s = r["speculative"]
    assert r["prompts"] == 2 and s["requests"] == 4  # two MT-bench questions, two turns each
    assert s["tau"] >= 1.0 and s["verify_steps"] > 0
    # a tree of 5 checks 4 draft tokens a step (vLLM's count); the baseline drafts none
    assert s["draft_tokens"] == 4 * s["verify_steps"] and r["baseline"]["draft_tokens"] == 0
    assert s["draft_acceptance_rate"] == pytest.approx((s["tau"] - 1) / 4) and "draft acceptance rate" in done.stdout
    assert r["baseline"]["draft_acceptance_rate"] is None
    # every draft position of the tree (--num-steps 3) is reported, accepted or not; other time is measured
    assert len(s["accept_rate_by_position"]) == 3 and len(s["accepted_length_histogram"]) == 4
    assert s["seconds"]["other"] >= 0 and r["baseline"]["accept_rate_by_position"] == []
    assert set(r["per_category"]) == {"writing"} and r["per_category"]["writing"]["verify_steps"] == s["verify_steps"]
    assert r["shard"] is None and r["dtype"] == "float32" and r["fp32_lm_head"] is False
    assert r["chat_template_kwargs"] == {}
    assert r["hf_generate"]["logits_dtype"] == "float32"  # transformers' readout, beside the engine's
    for run in (r, r["prompt_lookup"]):  # τ per turn: the turns' figures make up the whole run's
        turns = run["per_turn"].values()
        assert set(run["per_turn"]) == {"1", "2"}
        whole = run["speculative"] if run is r else run
        assert sum(t["verify_steps"] for t in turns) == whole["verify_steps"]
        assert sum(t["tokens"] for t in turns) == whole["tokens"]
    assert r["greedy_identical_to_baseline"] is True and r["greedy_identical_to_hf"] is True
    assert r["greedy_answers_differing_from_baseline"] == r["greedy_answers_differing_from_hf"] == 0
    assert r["speedup_vs_baseline"] > 0 and r["speedup_vs_hf"] > 0 and len(r["sweep"]) == 1
    sweep = r["sweep"][0]  # a whole summary with counts, so that shards merge (benchmarks/merge_bench.py)
    assert (sweep["num_steps"], sweep["topk"], sweep["num_draft_tokens"]) == (2, 1, 3)
    assert sweep["sample_draft"] is False and r["sample_draft"] is False
    assert sweep["greedy_identical_to_speculative"] is True  # at T=0 every tree of the sweep gives the same text
    assert sweep["tokens"] == s["tokens"] and sweep["tau"] == pytest.approx(
        (sweep["tokens"] - s["requests"]) / sweep["verify_steps"])  # greedy: same tokens; the first is prefill's
    assert r["greedy_identical_to_prompt_lookup"] is True and r["prompt_lookup"]["tau"] >= 1.0
    assert r["prompt_lookup"]["prompt_lookup_num_tokens"] == 3 and r["hf_generate"]["tau"] == 1.0
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert "tau" in done.stdout and "best of sweep" in done.stdout
    # --answers: FastChat llm_judge's model-answer records, each turn's figures adding up to the run's
    answers = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    questions = [json.loads(line) for line in (shared / "data/eval/mt_bench.jsonl").read_text().splitlines()][:2]
    assert [a["question_id"] for a in answers] == [q["question_id"] for q in questions]
    assert all(a["model_id"] == str(folder) and a["category"] == "writing" for a in answers)
    assert all(len(a["choices"][0]["turns"]) == 2 and all(a["choices"][0]["turns"]) for a in answers)
    turns = [t for a in answers for t in a["speculative"]]
    assert sum(t["tokens"] for t in turns) == s["tokens"] and sum(t["verify_steps"] for t in turns) == s["verify_steps"]
    assert all(t["tau"] == (t["accepted_tokens"] + t["verify_steps"]) / t["verify_steps"] for t in turns)


def test_bench_grafts_a_prompt_lookup_branch_and_keeps_greedy_exact(draft_dir, shared, tmp_path):
    """--lookup N: the speculative runs get the lookup branch, the baseline stays plain; a turn 2 that asks
    for turn 1 again is copied, so even a random head's runs accept lookup tokens."""
    folder, _, _ = draft_dir
    out, prompts = tmp_path / "lookup.json", tmp_path / "copy.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "copy", "turns": [
        "Name the planets of the solar system, one per line.", "Repeat your previous answer word for word."]}))
    bench = [sys.executable, "-m", "toolkit.cli", "bench", "--draft", str(folder), "--prompts", str(prompts),
             "--max-new-tokens", "24", "--num-steps", "3", "--topk", "1", "--threads", "1"]
    # the sweep: the head alone (lookup 0), and a tree with a branch of its own length
    done = subprocess.run(bench + ["--lookup", "5", "--baseline", "--sweep", "3,1,4,0;2,2,5,7", "--out", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["lookup"] == {"num_tokens": 5, "max_ngram": 3, "min_ngram": 1}
    assert r["greedy_identical_to_baseline"] is True and r["baseline"]["accepted_from_lookup"] == 0
    s = r["speculative"]
    assert 0 < s["accepted_from_lookup"] <= s["tokens"] - s["requests"] - s["verify_steps"]
    assert len(s["accept_rate_by_position"]) == 5 and "lookup branch:" in done.stdout  # the branch is deeper
    alone, tree = r["sweep"]
    assert alone["lookup"] == 0 and alone["accepted_from_lookup"] == 0 and len(alone["accept_rate_by_position"]) == 3
    assert alone["tau"] < s["tau"]  # the copying turn is what the branch predicts and the random head does not
    assert tree["lookup"] == 7 and tree["accepted_from_lookup"] > 0 and len(tree["accept_rate_by_position"]) == 7
    assert alone["greedy_identical_to_speculative"] is True and tree["greedy_identical_to_speculative"] is True
    assert " lookup " in next(line for line in done.stdout.splitlines() if line.startswith("best of sweep"))
    refused = subprocess.run(bench + ["--lookup", "5", "--sample-draft"], capture_output=True, text=True)
    assert refused.returncode == 2 and "do not mix" in refused.stderr
    refused = subprocess.run(bench + ["--sample-draft", "--sweep", "2,1,3,4"], capture_output=True, text=True)
    assert refused.returncode == 2 and "do not mix" in refused.stderr and "2,1,3,4" in refused.stderr


def test_bench_sample_draft_applies_to_chains_at_t_above_0(draft_dir, shared, tmp_path):
    """--sample-draft is recorded on the chains it drew (main run or sweep entry) and refused where no run
    would use it: at T=0, or with trees only."""
    folder, _, _ = draft_dir
    out = tmp_path / "s.json"
    bench = [sys.executable, "-m", "toolkit.cli", "bench", "--draft", str(folder), "--prompts",
             str(shared / "data/eval/mt_bench.jsonl"), "--limit", "1", "--max-new-tokens", "4", "--threads", "1",
             "--sample-draft", "--out", str(out)]
    done = subprocess.run(bench + ["--temperature", "1", "--num-steps", "2", "--topk", "2", "--num-draft-tokens",
                                   "4", "--sweep", "2,1,3"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["sample_draft"] is False and r["sweep"][0]["sample_draft"] is True  # the tree proposes its top-k
    out.unlink()
    refused = subprocess.run(bench + ["--num-steps", "2", "--topk", "1"], capture_output=True, text=True)
    assert refused.returncode == 2 and "--temperature 0" in refused.stderr and not out.exists()
    refused = subprocess.run(bench + ["--temperature", "1", "--topk", "2", "--sweep", "3,2,6"],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "no run here is one" in refused.stderr and "--sweep" in refused.stderr


def test_bench_serves_bf16_with_fp32_logits(draft_dir, shared, tmp_path):
    """--dtype bfloat16 --fp32-lm-head: the target's logits in fp32, recorded in the report."""
    folder, _, _ = draft_dir
    out = tmp_path / "bf16.json"
    done = subprocess.run([sys.executable, "-m", "toolkit.cli", "bench", "--draft", str(folder), "--prompts",
                           str(shared / "data/eval/mt_bench.jsonl"), "--limit", "1", "--max-new-tokens", "8",
                           "--num-steps", "3", "--dtype", "bfloat16", "--fp32-lm-head", "--baseline", "--threads", "1",
                           "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["dtype"] == "bfloat16" and r["fp32_lm_head"] is True and r["speculative"]["requests"] == 2
    # counted, per request (bf16 may still part at a near tie)
    assert 0 <= r["greedy_answers_differing_from_baseline"] <= r["speculative"]["requests"]


def test_sweep_entries_take_their_own_lookup_length_or_the_runs():
    from toolkit.infer.bench_sweep import parse_sweep
    from toolkit.infer.lookup import LookupConfig
    from toolkit.infer.tree import TreeConfig

    run = LookupConfig(10)
    got = parse_sweep("3,1,4; 6,10,60,0;5,1,6,4", run, max_ngram=2)
    assert [tree for tree, _ in got] == [TreeConfig(3, 1, 4), TreeConfig(6, 10, 60), TreeConfig(5, 1, 6)]
    assert [own for _, own in got] == [run, None, LookupConfig(4, 2)]
    assert parse_sweep("3,1,4", None) == [(TreeConfig(3, 1, 4), None)]
    for bad, says in (("3,1", "not num_steps,topk"), ("3,1,4,5,6", "not num_steps,topk"), ("a,1,4", "not num_steps"),
                      ("3,1,4,-1", "lookup length must be >= 0"),
                      ("0,1,2", r"--sweep entry '0,1,2': --num-steps and --topk must be >= 1")):  # named the run's
        with pytest.raises(ValueError, match=says):
            parse_sweep(bad)


def test_bench_refuses_a_target_the_draft_was_not_trained_for(draft_dir, tmp_path, shared):
    import transformers

    folder, _, _ = draft_dir
    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=64, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3)
    other = tmp_path / "other"
    transformers.LlamaConfig.save_pretrained(cfg, other)
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(other / "model.safetensors"))
    done = subprocess.run([sys.executable, "-m", "toolkit.cli", "bench", "--draft", str(folder), "--model",
                           str(other), "--prompts", str(shared / "data/eval/mt_bench.jsonl")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "is not the target the draft" in done.stderr and str(other) in done.stderr


def test_prompt_lookup_tau_counts_target_forwards(smollm2_dir, smollm2_tokenizer):
    """On a prompt the model copies from, prompt lookup accepts tokens: τ > 1; plain generate has τ = 1."""
    from toolkit.infer.hf_reference import run_hf
    from toolkit.infer.sampling import SamplingParams

    text = "Repeat this sentence exactly: the quick brown fox jumps over the lazy dog near the river bank."
    prompts = [{"id": 0, "category": "x", "system": None, "turns": [text]}]
    params = SamplingParams(max_new_tokens=20)
    plain_answers, plain = run_hf(smollm2_dir, smollm2_tokenizer, prompts, params, 0)
    pld_answers, pld = run_hf(smollm2_dir, smollm2_tokenizer, prompts, params, 0, prompt_lookup=4)
    assert pld_answers == plain_answers and plain["tau"] == 1.0
    assert pld["tau"] > 1.5 and pld["verify_steps"] < plain["verify_steps"]
    assert pld["tokens"] == plain["tokens"]
    # the first forward is a plain prefill (one token) or, with candidates from the prompt, a verify step
    assert pld["tau"] * pld["verify_steps"] == pytest.approx(pld["tokens"] - 1) or \
        pld["tau"] * pld["verify_steps"] == pytest.approx(pld["tokens"])
    assert pld["per_turn"] == {"1": {k: pld[k] for k in ("tau", "verify_steps", "tokens")}}


def test_the_hf_reference_decodes_by_the_engines_rule_whatever_the_generation_config_adds(tiny_target, tmp_path):
    """A target's generation_config.json may carry rules generate applies on its own (Qwen2.5: repetition_penalty
    1.05); the engine decodes without them, so --compare-hf must too, or its greedy check fails for that reason."""
    from toolkit.data.tokenizer import load_tokenizer
    from toolkit.infer.engine import Engine
    from toolkit.infer.hf_reference import run_hf
    from toolkit.infer.prompts import answer_turns
    from toolkit.infer.sampling import SamplingParams

    folder = tmp_path / "penalised"
    folder.mkdir()
    for f in tiny_target.iterdir():
        (folder / f.name).symlink_to(f)
    cfg = json.loads((tiny_target / "generation_config.json").read_text())
    (folder / "generation_config.json").unlink()
    (folder / "generation_config.json").write_text(json.dumps({**cfg, "repetition_penalty": 3.0,
                                                               "no_repeat_ngram_size": 1}))
    tok = load_tokenizer(model=str(folder))
    prompts = [{"id": 0, "category": "x", "system": None, "turns": ["Count to ten.", "Again."]}]
    params = SamplingParams(max_new_tokens=12)
    engine = Engine(load_target(folder), None, None, 256)
    ours = answer_turns(tok, prompts, lambda ids, p: engine.generate(ids, params, {tok.eos_token_id}).tokens)
    theirs, _ = run_hf(folder, tok, prompts, params, 0, stops={tok.eos_token_id})
    assert theirs == ours and len(set(tok(ours[0][0], add_special_tokens=False).input_ids)) < 12  # it repeats


def test_prompt_lookup_tau_counts_the_tokens_its_first_forward_accepts(smollm2_dir, smollm2_tokenizer):
    """On a turn that repeats the model's own answer, prompt lookup's first forward reads the prompt with
    candidates and keeps several tokens: that forward is a verify step, so no forward yields more than
    prompt_lookup_num_tokens + 1 tokens and the turns' counts add up to the run's."""
    from toolkit.infer.hf_reference import run_hf
    from toolkit.infer.sampling import SamplingParams

    prompts = [{"id": 0, "category": "copy", "system": None,
                "turns": ["Name the planets of the solar system, one per line.",
                          "Repeat your previous answer word for word."]}]
    _, pld = run_hf(smollm2_dir, smollm2_tokenizer, prompts, SamplingParams(max_new_tokens=8), 0, prompt_lookup=10)
    turns = pld["per_turn"]
    assert turns["2"]["verify_steps"] >= 1 and turns["2"]["tau"] <= 11
    assert sum(t["tau"] * t["verify_steps"] for t in turns.values()) == pytest.approx(pld["tau"] * pld["verify_steps"])
    assert turns["2"]["tau"] > 2  # the copy is accepted from the first forward on


def test_the_probe_and_the_warm_up_read_the_first_prompt_as_it_is_benched(thinking_target):
    """bench's load-time probe and warm-up took the first turn without the record's system message and without
    --chat-template-kwargs (Qwen3's enable_thinking): the probe's figure was taken on another prompt."""
    from toolkit.data.tokenizer import load_tokenizer
    from toolkit.infer.prompts import answer_turns, prompt_text, warm_up_ids

    tok = load_tokenizer(model=str(thinking_target))
    prompts = [{"id": 0, "category": "x", "system": "Answer in French.", "turns": ["Hi", "More"],
                "template_kwargs": {"enable_thinking": False}}]
    asked = []
    answer_turns(tok, prompts, lambda ids, p: asked.append(ids) or [])
    first = tok(prompt_text(tok, prompts[0]), add_special_tokens=False).input_ids
    assert warm_up_ids(tok, prompts) == asked[0] == first
    assert "Answer in French." in prompt_text(tok, prompts[0]) and prompt_text(tok, prompts[0]).endswith("</think>\n\n")


def test_turn_two_sees_the_models_own_turn_one_answer(smollm2_tokenizer):
    """MT-bench's second turn is asked after the model's own first answer, inside the chat template."""
    from toolkit.infer.prompts import answer_turns

    tok, seen = smollm2_tokenizer, []
    replies = iter(["Paris is the capital.", "It has about two million people."])

    def generate(ids, prompt):
        seen.append(tok.decode(ids))
        return tok(next(replies), add_special_tokens=False).input_ids

    answers = answer_turns(tok, [{"system": "Be brief.", "turns": ["Capital of France?", "Its population?"]}],
                           generate)
    assert answers == [["Paris is the capital.", "It has about two million people."]]
    first, second = seen
    assert "Be brief." in first and "Capital of France?" in first and "Paris" not in first
    assert second.index("Capital of France?") < second.index("Paris is the capital.") < second.index("Its population?")
    assert first.rstrip().endswith("assistant") and second.rstrip().endswith("assistant")  # generation prompts


def test_every_turn_and_the_warm_up_are_asked_with_the_template_variables(thinking_target, tmp_path):
    """bench --chat-template-kwargs: each turn (and the untimed warm-up) is asked as a client sending
    chat_template_kwargs would ask it, so a Qwen3 target is benchmarked without thinking."""
    from toolkit.data.tokenizer import load_tokenizer
    from toolkit.infer.prompts import answer_turns, read_prompts, warm_up_ids

    tok, seen = load_tokenizer(model=str(thinking_target)), []
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"turns": ["Capital of France?", "Its population?"]}) + "\n")

    def generate(ids, prompt):
        seen.append(tok.decode(ids))
        return tok("Paris.", add_special_tokens=False).input_ids

    for variables, closed in ((None, False), ({"enable_thinking": False}, True)):
        prompts = read_prompts(str(path), None, (0, 1), variables)
        seen.clear()
        answer_turns(tok, prompts, generate)
        seen.append(tok.decode(warm_up_ids(tok, prompts)))
        assert [t.endswith("<think>\n\n</think>\n\n") for t in seen] == [closed] * 3


def test_shards_take_every_nth_prompt_and_bad_shards_are_refused(shared, tmp_path):
    from toolkit.infer.prompts import parse_shard, read_prompts

    path = str(shared / "data/eval/mt_bench.jsonl")
    every = read_prompts(path, None)
    shards = [read_prompts(path, None, parse_shard(f"{i}/10")) for i in range(10)]
    assert sorted(p["id"] for sh in shards for p in sh) == sorted(p["id"] for p in every)
    assert [p["id"] for p in shards[3]] == [p["id"] for p in every[3::10]]
    assert len({p["category"] for p in shards[3]}) == 8  # MT-bench is sorted by category, 10 questions each
    assert [p["id"] for p in read_prompts(path, 2, parse_shard("1/10"))] == [every[1]["id"], every[11]["id"]]
    assert parse_shard(None) == (0, 1)
    for bad in ("10/10", "-1/4", "a/b", "3"):
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(bad)
    two = tmp_path / "two.jsonl"
    two.write_text("\n".join(json.dumps({"turns": [f"q{i}"]}) for i in range(2)) + "\n")
    with pytest.raises(ValueError, match="no prompts read in shard 5/6"):
        read_prompts(str(two), None, (5, 6))


def test_prompt_ids_are_the_records_question_ids_or_places_in_the_file_across_shards(tmp_path):
    """FastChat pairs answers with questions by question_id: the shards of one file must never reuse an id,
    and a chat record's own question_id is kept."""
    from toolkit.infer.prompts import read_prompts

    chat = lambda q, **k: json.dumps({"messages": [{"role": "user", "content": q}], **k})  # noqa: E731
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join([chat("a"), json.dumps({"turns": ["b"]}), chat("c", question_id=81),
                               json.dumps({"turns": ["d"], "question_id": 90}), chat("e")]) + "\n")
    assert [p["id"] for p in read_prompts(str(path), None)] == [0, 1, 81, 90, 4]
    shards = [[p["id"] for p in read_prompts(str(path), None, (i, 2))] for i in (0, 1)]
    assert shards == [[0, 81, 4], [1, 90]]
    assert [p["id"] for p in read_prompts(str(path), 2, (0, 2))] == [0, 81]


def test_prompts_sharing_a_question_id_are_warned_of(tmp_path, capsys):
    from toolkit.infer.prompts import read_prompts

    path = tmp_path / "p.jsonl"
    rows = ((1, "a"), (1, "b"), (2, "c"))
    path.write_text("".join(json.dumps({"question_id": q, "turns": [t]}) + "\n" for q, t in rows))
    assert [p["id"] for p in read_prompts(str(path), None)] == [1, 1, 2]
    assert "question_id 1 and 0 other(s) name more than one prompt" in capsys.readouterr().err
    path.write_text("".join(json.dumps({"question_id": q, "turns": ["a"]}) + "\n" for q in (1, 2)))
    read_prompts(str(path), None)
    assert capsys.readouterr().err == ""


def test_a_prompts_category_is_a_name_or_refused(tmp_path):
    """per_category groups by the name: a null category read as "None" (and --answers wrote null), a list as
    "['l']"."""
    from toolkit.infer.prompts import read_prompts

    path = tmp_path / "p.jsonl"
    rows = [{"turns": ["a"], "category": None}, {"turns": ["b"], "category": 7},
            {"messages": [{"role": "user", "content": "c"}], "category": None}, {"turns": ["d"]}]
    path.write_text("\n".join(map(json.dumps, rows)) + "\n")
    assert [p["category"] for p in read_prompts(str(path), None)] == ["all", "7", "all", "all"]
    for bad in (["l"], {"a": 1}, True):
        path.write_text(json.dumps({"turns": ["a"], "category": bad}) + "\n")
        with pytest.raises(ValueError, match="is not a name; give a string"):
            read_prompts(str(path), None)


@pytest.mark.parametrize("lines, message", [
    (['{"turns": []}'], "non-empty list"), (['{"turns": [123]}'], "non-empty list"),
    (['{"turns": ["a", ""]}'], "non-empty list"),
    (['{"messages": [{"role": "assistant", "content": "no question"}]}'], "non-empty list"),
    (['{broken', '{"turns": ["fine"]}'], "1 unreadable record"), (['{"messages": 5}'], "non-empty list")])
def test_prompts_a_benchmark_cannot_answer_are_refused_by_line(tmp_path, lines, message):
    """An empty or non-text turn once crashed the bench deep in the chat template, and a broken line was
    dropped without a word, so the figures covered fewer prompts than the file held."""
    from toolkit.infer.prompts import read_prompts

    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=message) as e:
        read_prompts(str(path), None)
    assert str(path) in str(e.value)


def test_a_missing_prompts_file_is_named_and_the_shipped_example_reads():
    """README's bench commands read examples/prompts.jsonl (MT-bench `turns` form, two turns each); a path that
    is not there is named with the option, not as a bare errno."""
    from pathlib import Path

    from toolkit.infer.prompts import read_prompts

    ROOT = Path(__file__).resolve().parents[2]  # not conftest's: tests/train has a conftest module of that name too

    with pytest.raises(ValueError, match=r"--prompts nowhere\.jsonl: no such file"):
        read_prompts("nowhere.jsonl", None)
    prompts = read_prompts(str(ROOT / "examples/prompts.jsonl"), None)
    assert len(prompts) == 10 and all(len(p["turns"]) == 2 for p in prompts)
    assert len({p["category"] for p in prompts}) == 8


def test_differing_answers_are_counted_and_explained_outside_fp32(capsys):
    import torch

    from toolkit.infer.bench import differing

    assert differing([["a"], ["b"]], [["a"], ["b"]], torch.bfloat16) == 0 and capsys.readouterr().err == ""
    assert differing([["a"], ["b"], ["c"]], [["a"], ["x"], ["y"]], torch.float32) == 2
    assert capsys.readouterr().err == ""  # in fp32 a difference is a bug: no excuse printed
    assert differing([["a"], ["b"]], [["a"], ["x"]], torch.bfloat16) == 1
    assert "1 of 2 greedy answers differ: in bfloat16" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--num-draft-tokens", "0"], "--num-draft-tokens 0: must be in 2..6"),
    (["--compare-pld", "-1"], "--compare-pld -1"), (["--max-len", "0"], "--max-len 0"),
    (["--prefix-cache-rows", "-1"], "--prefix-cache-rows -1"),
    (["--threads", "-1"], "--threads -1"), (["--temperature", "inf"], "finite"),
    (["--out", "DIR"], "is a folder"), (["--out", "DIR/"], "is a folder"),
    (["--out", "DIR/b.json"], "the PNG written beside it"), (["--answers", "DIR"], "--answers"),
    (["--out", "DIR/a.json", "--answers", "DIR/a.json"], "is --out too"),
    (["--out", "DIR/a.json", "--answers", "DIR/a.png"], "is the PNG written beside --out"),
    (["--sweep", ";"], "names no tree"), (["--sweep", ""], "names no tree"),
    (["--chat-template-kwargs", '{"tokenize": true}'], "tokenize set how the template is applied")])
def test_bad_bench_options_are_refused_before_loading(tmp_path, capsys, extra, message):
    """--num-draft-tokens 0 once ran as the default, --temperature inf sampled uniformly, --out DIR ran the whole
    bench and then failed with a traceback (a folder where the PNG goes, after writing the JSON), --compare-pld -1
    / --max-len 0 / --threads -1 failed after loading with messages that named no option."""
    from toolkit.cli import main

    (tmp_path / "DIR" / "b.png").mkdir(parents=True)
    extra = [str(tmp_path / "DIR") + x[3:] if x.startswith("DIR") else x for x in extra]
    assert main(["bench", "--draft", str(tmp_path / "nowhere"), "--prompts", "p.jsonl", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "no config.json" not in err, err


def test_bench_takes_sglangs_flag_names_and_a_draft_as_a_hub_id(tmp_path, capsys, monkeypatch):
    """--speculative-draft-model-path org/name is fetched as SGLang fetches it; offline and not cached, the error names
    the id (before the target is loaded), and --speculative-num-draft-tokens is read as --num-draft-tokens."""
    import huggingface_hub.constants

    from pathlib import Path

    from toolkit.cli import main

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    prompts = str(Path(__file__).resolve().parents[2] / "examples/prompts.jsonl")
    assert main(["bench", "--speculative-draft-model-path", "org/absent-head", "--prompts", prompts]) == 2
    err = capsys.readouterr().err
    assert "--draft org/absent-head: HF_HUB_OFFLINE is set and it is not in the local HF cache" in err
    assert main(["bench", "--draft", "org/absent-head", "--prompts", prompts,
                 "--speculative-num-draft-tokens", "9"]) == 2
    assert "--num-draft-tokens 9: must be in 2..6" in capsys.readouterr().err


def test_a_cache_too_short_for_the_prompts_names_the_tokens_asked(draft_dir, tmp_path, shared, capsys):
    """--max-len 10: the warm-up's own 4 tokens were named as max_new_tokens; the run's are."""
    from toolkit.cli import main

    folder, _, _ = draft_dir
    assert main(["bench", "--draft", str(folder), "--prompts", str(shared / "data/eval/mt_bench.jsonl"), "--limit",
                 "1", "--max-len", "10", "--max-new-tokens", "8", "--threads", "1",
                 "--out", str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err
    assert "+ max_new_tokens (8) exceeds" in err and not (tmp_path / "b.json").exists()
