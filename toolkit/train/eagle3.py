"""Train an EAGLE-3 draft head on a frozen target with training-time test (TTT).

    accelerate launch toolkit/train/eagle3.py --config recipes/smollm2-135m-eagle3.yaml [key=value ...]
    python toolkit/train/eagle3.py --config recipes/smollm2-135m-eagle3.yaml data=out/prepared max_steps=100
    toolkit train --config recipes/smollm2-135m-eagle3.yaml --data out/prepared --output-dir out/run

fc fuses three aux layers of the target; the head is unrolled for ttt_steps steps and learns the target's
distribution over a reduced draft vocabulary (docs/formats.md section 7 for the draft folder)."""
from __future__ import annotations

import sys

from toolkit.train.launch import add_args, cli
from toolkit.train.trainer import main as train

__all__ = ["add_args", "main"]


def main(args) -> int:
    return train(args, "eagle3")


if __name__ == "__main__":
    sys.exit(cli("eagle3.py", __doc__, "eagle3"))
