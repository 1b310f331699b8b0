"""What a seed may be: what torch.Generator.manual_seed takes (-2^63 .. 2^64 - 1; a larger one failed with
"Overflow when unpacking long long" after the model loaded). The CLI's --seed flags and the recipe's `seed`."""
from __future__ import annotations

import argparse

LOW, HIGH = -2 ** 63, 2 ** 64 - 1


def seed_problem(seed: int, setting: str = "--seed") -> str | None:
    if not LOW <= seed <= HIGH:
        return f"{setting} {seed}: give an integer from {LOW} to {HIGH} (what torch's generator takes)"
    return None


def seed_arg(text: str) -> int:
    """argparse type for --seed."""
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give an integer") from None
    if problem := seed_problem(seed, ""):
        raise argparse.ArgumentTypeError(problem.strip())
    return seed
