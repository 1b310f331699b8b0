"""The kernel tests' small target: a random 2-layer Llama (vocab 97, hidden 64), written once per test module."""
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """The folder of a random Llama small enough for the interpreted kernels (load it with load_target)."""
    import transformers

    folder = tmp_path_factory.mktemp("tiny-llama")
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    return folder
