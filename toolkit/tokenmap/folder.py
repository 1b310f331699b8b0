"""The maps an output folder of `toolkit build-token-map` already holds, when a later run writes into it: those
made from the same counts are kept and listed beside the new sizes; those made from other counts (another
corpus, tokenizer or mode) are removed, so that no freq_N.pt / vocab_map_N.safetensors of other counts sits beside
the new ones under the same names as if it were theirs."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from toolkit.tokenmap.maps import TokenMapError, load_freq


def earlier_maps(out: Path, counts, new: dict[int, list[int]]) -> dict[int, list[int]]:
    """The freq_N.pt maps `out` held before this run wrote the sizes `new`: {size: ids} of those made from these
    same counts (its coverage.json lists them and was made from counts of the same totals), so that a later run
    with other --sizes (e.g. --from-counts) adds to coverage.json instead of dropping sizes still on disk. The
    maps its coverage.json lists from other counts, and that this run did not rewrite, are removed (named)."""
    from toolkit.tokenmap.report import coverage

    try:
        old = json.loads((out / "coverage.json").read_text())
    except (OSError, ValueError):
        return {}
    sizes = [int(n) for n in old.get("sizes", {}) if str(n).isdigit()] if isinstance(old, dict) else []
    now = coverage(counts, {})
    if any(old.get(k) != now[k] for k in ("total_tokens", "distinct_tokens", "vocab_size")):
        stale = [f for n in sizes if n not in new
                 for f in (out / f"freq_{n}.pt", out / f"vocab_map_{n}.safetensors") if f.is_file()]
        for f in stale:
            f.unlink()
        if stale:
            print(f"[token map] {out}: removed {', '.join(f.name for f in stale)}, which its coverage.json listed "
                  "from other counts than this run's: the folder's maps are this run's", file=sys.stderr)
        return {}
    maps = {}
    for n in sizes:
        try:
            maps[n] = load_freq(out / f"freq_{n}.pt")
        except (ValueError, TokenMapError):
            continue  # listed but gone or damaged: not a size this folder holds
    return maps
