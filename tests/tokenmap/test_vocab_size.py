"""The target's vocabulary (config.json vocab_size, the rows of its logits) is not the tokenizer's: Qwen2.5 pads
151665 tokenizer ids to 151936, and a tokenizer can also hold tokens the embedding lacks. Maps are sized by the
config wherever one is known, and a map or id that does not fit is refused with both sizes named."""
import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from toolkit.cli import main
from toolkit.tokenmap.maps import TokenMapError, load_counts, load_vocab_map, save_vocab_map, vocab_map

QWEN_TOKENIZER = 151665  # ids in ../shared/tokenizers/qwen2/tokenizer.json
QWEN_PADDED = 151936     # Qwen2 / Qwen2.5 config.json vocab_size


def qwen_folder(shared, folder, vocab_size: int = QWEN_PADDED, stop=None):
    """A model folder without weights: a tiny config.json written here and the shared Qwen2 tokenizer."""
    folder.mkdir()
    shutil.copy(shared / "tokenizers/qwen2/tokenizer.json", folder / "tokenizer.json")
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": vocab_size,
                                                    "hidden_size": 8, "eos_token_id": 151645}))
    if stop is not None:
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": stop}))
    return folder


def corpus(tmp_path, answer="It is 4."):
    path = tmp_path / "chats.jsonl"
    chat = {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": answer}]}
    path.write_text(json.dumps(chat) + "\n")
    return path


def build(*args) -> int:
    return main(["build-token-map", "--quiet", "--num-workers", "1", *map(str, args)])


def test_a_tokenizer_folder_with_a_config_sizes_t2d_by_the_config_and_keeps_its_stop_ids(shared, tmp_path):
    folder = qwen_folder(shared, tmp_path / "qwen", stop=[151645, 151650])
    assert build("--tokenizer", folder, "--data", corpus(tmp_path), "--sizes", "16", "--out", tmp_path / "m") == 0
    _, t2d = load_vocab_map(tmp_path / "m/vocab_map_16.safetensors")
    assert t2d.shape == (QWEN_PADDED,)  # was the tokenizer's 151665: shorter than the target's logits
    assert load_counts(tmp_path / "m/token_counts.safetensors")[0].shape == (QWEN_PADDED,)
    assert {151644, 151645, 151650} <= set(torch.load(tmp_path / "m/freq_16.pt", weights_only=True))


def test_counts_of_a_tokenizer_alone_rebuild_the_maps_of_a_padded_target(shared, tmp_path):
    tok = shared / "tokenizers/qwen2/tokenizer.json"
    assert build("--tokenizer", tok, "--data", corpus(tmp_path), "--sizes", "16", "--out", tmp_path / "a") == 0
    counts, _ = load_counts(tmp_path / "a/token_counts.safetensors")
    assert counts.shape == (QWEN_TOKENIZER,)
    _, t2d = load_vocab_map(tmp_path / "a/vocab_map_16.safetensors")
    assert t2d.shape == (QWEN_TOKENIZER,)  # all a tokenizer alone can know; refused for the padded target below
    folder = qwen_folder(shared, tmp_path / "qwen")
    assert build("--model", folder, "--from-counts", tmp_path / "a/token_counts.safetensors", "--sizes", "16",
                 "--out", tmp_path / "b") == 0
    _, t2d = load_vocab_map(tmp_path / "b/vocab_map_16.safetensors")
    again, meta = load_counts(tmp_path / "b/token_counts.safetensors")
    assert t2d.shape == again.shape == (QWEN_PADDED,) and int(json.loads(meta["vocab_size"])) == QWEN_PADDED
    assert np.array_equal(again[:QWEN_TOKENIZER], counts) and not again[QWEN_TOKENIZER:].any()


def test_a_gemma3_multimodal_config_without_vocab_size_sizes_t2d_by_its_class_default(shared, tmp_path):
    """gemma-3-4b-it's text_config leaves vocab_size out and transformers fills in 262208, the rows of its logits
    (and what the engine and training read): the maps take that size, not the tokenizer's, or training refuses
    them."""
    folder = qwen_folder(shared, tmp_path / "g3")
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "eos_token_id": 151645,
        "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "num_hidden_layers": 34}}))
    assert build("--tokenizer", folder, "--data", corpus(tmp_path), "--sizes", "16", "--out", tmp_path / "m") == 0
    _, t2d = load_vocab_map(tmp_path / "m/vocab_map_16.safetensors")
    assert t2d.shape == (262208,)


def test_a_tokenizer_larger_than_the_target_gives_maps_of_the_targets_size(shared, tmp_path):
    folder = qwen_folder(shared, tmp_path / "qwen", vocab_size=151646)  # added tokens past the embedding
    assert build("--model", folder, "--data", corpus(tmp_path), "--sizes", "16", "--out", tmp_path / "m") == 0
    _, t2d = load_vocab_map(tmp_path / "m/vocab_map_16.safetensors")
    assert t2d.shape == (151646,)  # was max(config, tokenizer) = 151665


def test_tokens_the_target_does_not_have_are_refused_naming_both_sizes(shared, tmp_path, capsys):
    folder = qwen_folder(shared, tmp_path / "qwen", vocab_size=151646)
    data = corpus(tmp_path, "A box: <|box_start|>")  # id 151648
    assert build("--model", folder, "--data", data, "--sizes", "16", "--out", tmp_path / "m") == 2
    assert "token id 151648, beyond the target's vocabulary (config.json vocab_size 151646; the tokenizer has " \
           "151665 ids)" in capsys.readouterr().err
    small = qwen_folder(shared, tmp_path / "small", vocab_size=151644)  # <|im_end|> 151645 is past it
    assert build("--model", small, "--data", data, "--sizes", "16", "--out", tmp_path / "m") == 2
    assert "special token id 151645" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_a_lone_tokenizer_keeps_its_end_of_turn_tokens_as_a_model_folder_does(shared, tmp_path):
    """Without a model folder there is no generation config to read; the tokenizer's own EOS and its known
    end-of-turn tokens (stop_ids without a folder) are still kept, as with --model."""
    folder = tmp_path / "llama3"
    folder.mkdir()
    shutil.copy(shared / "tokenizers/llama3/tokenizer.json", folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                              "eos_token": "<|end_of_text|>"}))
    plain = tmp_path / "plain.jinja"  # a template that emits no special token
    plain.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    assert build("--tokenizer", folder, "--chat-template", plain, "--data", corpus(tmp_path), "--sizes", "4",
                 "--out", tmp_path / "m") == 0
    assert {128001, 128009} <= set(torch.load(tmp_path / "m/freq_4.pt", weights_only=True))


@pytest.fixture()
def train_cfg(tmp_path):
    def make(d2t, t2d):
        save_vocab_map(tmp_path / "map.safetensors", d2t, t2d, {})
        return SimpleNamespace(head="eagle3", token_map=str(tmp_path / "map.safetensors"), init_from=None)
    return make


def test_training_refuses_a_token_map_of_another_size_naming_both(train_cfg):
    from toolkit.train.head import pick_vocabulary

    d2t, t2d = vocab_map([5, 151645], QWEN_TOKENIZER)  # built from the tokenizer alone
    with pytest.raises(ValueError, match=f"t2d has {QWEN_TOKENIZER} entries, but the target's vocabulary "
                                         rf"\(config.json vocab_size\) is {QWEN_PADDED}.*--model"):
        pick_vocabulary(train_cfg(d2t, t2d), SimpleNamespace(vocab_size=QWEN_PADDED), None, None, [], None)
    d2t, t2d = vocab_map([5, 151645], QWEN_PADDED)
    ids, _, _ = pick_vocabulary(train_cfg(d2t, t2d), SimpleNamespace(vocab_size=QWEN_PADDED), None, None, [], None)
    assert ids == [5, 151645]


def test_training_refuses_a_t2d_that_is_not_d2ts_ids(train_cfg):
    """Training reads the draft ids' target ids from t2d (losses.py): they must be d2t's, in d2t's order."""
    from toolkit.train.head import pick_vocabulary

    d2t, _ = vocab_map([5, 9, 40], 64)
    _, other = vocab_map([5, 9, 41], 64)
    with pytest.raises(ValueError, match="t2d marks 3 ids, not the 3 target ids of d2t"):
        pick_vocabulary(train_cfg(d2t, other), SimpleNamespace(vocab_size=64), None, None, [], None)
    from toolkit.tokenmap.maps import check_vocab_map

    unsorted = torch.tensor([9, 5, 40]) - torch.arange(3)
    with pytest.raises(ValueError, match="ascending, unique target ids"):
        check_vocab_map(unsorted, vocab_map([5, 9, 40], 64)[1], 64, "map")


def test_a_missing_or_foreign_vocab_map_is_refused_in_a_line(tmp_path):
    with pytest.raises(TokenMapError, match="file not found"):
        load_vocab_map(tmp_path / "absent.safetensors")
    from toolkit.tokenmap.maps import load_counts, load_freq

    for load, file in ((load_vocab_map, "vocab_map_N"), (load_freq, "freq_N.pt"), (load_counts, "token_counts")):
        with pytest.raises(TokenMapError, match=f"is a folder; give the {file}"):  # it said "file not found"
            load(tmp_path)
    (tmp_path / "junk.safetensors").write_text("not safetensors")
    with pytest.raises(TokenMapError, match="not a safetensors file"):
        load_vocab_map(tmp_path / "junk.safetensors")
    from safetensors.torch import save_file

    save_file({"counts": torch.zeros(3)}, str(tmp_path / "counts.safetensors"))
    with pytest.raises(TokenMapError, match=r"holds \['counts'\], not the d2t and t2d"):
        load_vocab_map(tmp_path / "counts.safetensors")


def test_training_data_with_ids_past_the_target_is_refused():
    from toolkit.train.head import draft_vocab

    with pytest.raises(TokenMapError, match=r"target id 70 is beyond the target's vocabulary \(config.json "
                                            r"vocab_size 64"):
        draft_vocab(torch.tensor([1, 70, 70, 70, 2]), 2, 64, [])
