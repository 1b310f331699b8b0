"""Train an EAGLE-1/2 draft head (feature regression) on a frozen target.

    accelerate launch toolkit/train/eagle.py --config recipes/smollm2-135m-eagle.yaml [key=value ...]
    toolkit train --config recipes/smollm2-135m-eagle.yaml

fc over [embedding, the target's final normed hidden state], one decoder layer, read out by the target's
frozen lm_head: smooth-L1 regression on the next hidden state plus token loss (EAGLE paper). The draft folder
is SafeAILab's layout (SGLang: LlamaForCausalLMEagle); serve it with the EAGLE-2 dynamic tree, optionally
with an FR-Spec freq_N.pt (`toolkit serve --draft DIR --token-map freq_32768.pt`)."""
from __future__ import annotations

import sys

from toolkit.train.launch import add_args, cli
from toolkit.train.trainer import main as train

__all__ = ["add_args", "main"]


def main(args) -> int:
    return train(args, "eagle")


if __name__ == "__main__":
    sys.exit(cli("eagle.py", __doc__, "eagle"))
