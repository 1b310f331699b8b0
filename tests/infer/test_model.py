"""Our target model equals transformers: logits and aux hidden states, with and without the KV cache."""
import pytest
import torch

from toolkit.infer.config import ConfigError, ModelConfig
from toolkit.infer.kv_cache import KVCache
from toolkit.infer.loading import load_target

TINY = dict(vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)


def tiny_hf(kind, tmp_path, **extra):
    import transformers

    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[kind]
    cfg = cls(**{**TINY, **extra})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():  # random norms and biases, so a swapped or skipped weight shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_(1.0 if "norm" in name else 0.0, 0.2)
    model.save_pretrained(tmp_path)
    return model


CASES = [("llama", {}), ("llama", {"tie_word_embeddings": True}),
         ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
         ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
         ("mistral", {"sliding_window": None}), ("qwen2", {}), ("qwen3", {"head_dim": 24})]


@pytest.mark.parametrize("kind, extra", CASES)
def test_logits_and_aux_hidden_states_match_transformers(kind, extra, tmp_path):
    ref = tiny_hf(kind, tmp_path, **extra)
    ours = load_target(tmp_path)
    ids = torch.randint(0, TINY["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(1))
    aux = ours.config.default_aux_layers()
    with torch.no_grad():
        out = ref(ids, output_hidden_states=True)
        logits, hidden = ours(ids, aux_layers=aux)
    assert (logits - out.logits).abs().max() <= 1e-4
    for layer, h in zip(aux, hidden):
        assert (h - out.hidden_states[layer + 1]).abs().max() <= 1e-4, layer


def test_prefill_then_decode_with_cache_equals_full_forward(tmp_path):
    tiny_hf("qwen2", tmp_path)
    model = load_target(tmp_path)
    ids = torch.randint(0, TINY["vocab_size"], (3, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full, _ = model(ids)
        cache = KVCache(model.config, batch=3, max_len=64)
        first, _ = model(ids[:, :20], cache=cache)
        steps = [model(ids[:, t:t + 1], positions=torch.full((3, 1), t), cache=cache)[0] for t in range(20, 30)]
    got = torch.cat([first] + steps, dim=1)
    assert (got - full).abs().max() <= 1e-4


def test_smollm2_logits_match_transformers(smollm2_dir):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    ours = load_target(smollm2_dir)
    assert ours.config.default_aux_layers() == [1, 14, 26]
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 2, 198, 1, 4093, 198, 504, 3575, 282,
                         4649, 314]])
    with torch.no_grad():
        out = ref(ids, output_hidden_states=True)
        logits, hidden = ours(ids, aux_layers=[1, 14, 26])
    assert (logits - out.logits).abs().max() <= 1e-4
    for layer, h in zip([1, 14, 26], hidden):
        assert (h - out.hidden_states[layer + 1]).abs().max() <= 1e-4


def test_bad_configs_and_weights_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="gpt2"):
        ModelConfig.from_hf({"model_type": "gpt2"})
    with pytest.raises(ConfigError, match="yarn"):  # transformers refuses it too (a null factor it derives)
        ModelConfig.from_hf({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
                             "num_hidden_layers": 1, "num_attention_heads": 2,
                             "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 4}})
    tiny_hf("llama", tmp_path)
    from safetensors.torch import load_file, save_file

    weights = load_file(str(tmp_path / "model.safetensors"))
    weights.pop("model.layers.3.mlp.up_proj.weight")
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="layers.3.mlp.up_proj.weight"):
        load_target(tmp_path)


@pytest.mark.parametrize("kind, extra, window", [
    ("mistral", {}, 4096),  # transformers' default window (save_pretrained leaves a default out)
    ("mistral", {"sliding_window": 1024}, 1024), ("mistral", {"sliding_window": None}, None),
    ("qwen2", {"sliding_window": 512}, None),  # use_sliding_window off: full attention
    ("qwen2", {"use_sliding_window": True, "sliding_window": 512, "max_window_layers": 2}, 512),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 512, "max_window_layers": 6}, None),  # no layer
    ("qwen3", {"use_sliding_window": True, "sliding_window": 512, "max_window_layers": 0}, 512),
    ("llama", {}, None)])
def test_sliding_window_is_recorded_and_a_longer_context_accepted(kind, extra, window, tmp_path):
    import transformers

    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[kind]
    cls(**{**TINY, **extra}).save_pretrained(tmp_path)  # config.json as a checkpoint ships it
    c = ModelConfig.from_folder(tmp_path)
    assert c.sliding_window == window
    c.check_max_len(100_000)  # the engine attends within the window (test_sliding_window.py)


def test_cache_sized_from_memory(tmp_path):
    from toolkit.infer.engine import Engine
    from toolkit.infer.kv_cache import max_len_for_memory

    tiny_hf("llama", tmp_path)
    model = load_target(tmp_path)
    c = model.config  # 6 layers x 2 kv heads x 16 dims x k+v x 4 bytes = 1536 bytes per slot
    assert max_len_for_memory(c, 1536 * 1000, batch=2) == 500
    eng = Engine(model, max_len=None, max_batch=2)
    assert eng.max_len == c.max_position_embeddings  # plenty of RAM: capped by the model
    assert eng.cache.k.shape[3] >= eng.max_len


def test_one_sequence_fast_paths_equal_the_masked_scatter(tmp_path):
    """Batch 1 takes shortcuts: the prefill runs SDPA's causal kernel, a one-token decode no mask, and
    contiguous slots are written with a plain copy. Each must give what the full forward gives."""
    tiny_hf("llama", tmp_path)
    model = load_target(tmp_path)
    ids = torch.randint(0, TINY["vocab_size"], (1, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full, _ = model(ids)
        cache = KVCache(model.config, batch=1, max_len=64)
        first, _ = model(ids[:, :20], cache=cache)                                # causal kernel, copy at 0
        steps = [model(ids[:, t:t + 1], positions=torch.full((1, 1), t), cache=cache)[0] for t in range(20, 25)]
        chunk, _ = model(ids[:, 25:], positions=torch.arange(25, 30)[None], cache=cache)  # copy at 25, masked
    got = torch.cat([first, *steps, chunk], dim=1)
    assert (got - full).abs().max() <= 1e-4
    assert KVCache.slot_range(torch.tensor([[7, 8, 9]])) == 7
    for scattered in (torch.tensor([[7, 9, 8]]), torch.tensor([[7, 8], [3, 4]])):  # out of order; 2 rows
        assert torch.equal(KVCache.slot_range(scattered), scattered)
