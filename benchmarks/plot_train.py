"""Loss and per-TTT-step accuracy curves of a training run, from its metrics.jsonl.

    python benchmarks/plot_train.py out/eagle3/metrics.jsonl --out benchmarks/smollm2_eagle3_train.png
"""
from __future__ import annotations

import argparse
from pathlib import Path

from toolkit.train.plots import plot_training


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("metrics")
    p.add_argument("--out", default="train.png")
    args = p.parse_args()
    print(f"wrote {plot_training(Path(args.metrics), Path(args.out))}")


if __name__ == "__main__":
    main()
