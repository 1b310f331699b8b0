"""Train a DeepSeek-style multi-token-prediction (MTP) module on a frozen target.

    accelerate launch toolkit/train/mtp.py --config recipes/smollm2-135m-mtp.yaml [key=value ...]
    toolkit train --config recipes/smollm2-135m-mtp.yaml

eh_proj over [enorm(embedding), hnorm(final normed hidden)], one decoder block of the target's own kind
(init_block=target_last starts it from the target's last layer), shared_head norm, the target's lm_head;
trained over ttt_steps steps fed its own output. The draft folder is MiMo's MTP layout (SGLang: MiMoMTP, vLLM: MiMoMTPModel);
serve it as a chain: `toolkit serve --draft DIR --num-steps 3 --topk 1 --num-draft-tokens 4`."""
from __future__ import annotations

import sys

from toolkit.train.launch import add_args, cli
from toolkit.train.trainer import main as train

__all__ = ["add_args", "main"]


def main(args) -> int:
    return train(args, "mtp")


if __name__ == "__main__":
    sys.exit(cli("mtp.py", __doc__, "mtp"))
