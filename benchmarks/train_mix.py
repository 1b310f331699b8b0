"""Write a training prompt mix from ../shared/data/train: conversations drawn round-robin from every file
(shuffled per file with a fixed seed), so a prefix of any length covers math, code, role-play and tools.

    python benchmarks/train_mix.py --n 6000 --out data/train_mix.jsonl
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from toolkit.data.schemas import read_samples

TRAIN = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "train"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=6000)
    p.add_argument("--out", default="data/train_mix.jsonl")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    pools = []
    for f in sorted(TRAIN.iterdir()):
        convs = [s for s in read_samples(f) if not isinstance(s, str)]
        random.Random(args.seed).shuffle(convs)
        pools.append(convs)
    out, k = [], 0
    while len(out) < args.n and any(k < len(p) for p in pools):
        out += [p[k] for p in pools if k < len(p)]
        k += 1
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as fh:
        for conv in out[:args.n]:
            fh.write(json.dumps({"messages": conv}, ensure_ascii=False) + "\n")
    print(f"wrote {min(len(out), args.n)} conversations to {args.out}")


if __name__ == "__main__":
    main()
