"""Which safetensors files of an HF model folder hold the model, picked as transformers picks them:
model.safetensors, else the shards model.safetensors.index.json lists. Other *.safetensors beside them are not
the model's: Mistral's repositories ship consolidated.safetensors (the same weights in Mistral's own naming),
and a folder may keep leftovers; reading them too loaded every weight twice or failed on their names.
A draft folder's weights may also be a pytorch_model.bin (SafeAILab's heads) or its shards (read_weights)."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
BIN, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"


def weight_files(folder: str | Path) -> list[Path]:
    """The model's safetensors files in `folder`; a folder in neither HF layout keeps all its *.safetensors."""
    folder = Path(folder)
    if (folder / SINGLE).is_file():
        return [folder / SINGLE]
    if (folder / INDEX).is_file():
        shards = sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise ValueError(f"{folder / INDEX} lists shards that are not in the folder: {missing[:4]}")
        return [folder / s for s in shards]
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise ValueError(f"{folder}: no {SINGLE}, {INDEX} or other *.safetensors file")
    return found


@contextmanager
def read_safetensors(path: str | Path, what: str = ""):
    """safetensors' safe_open (torch tensors, on the CPU), with its errors (a file cut short by an interrupted
    download or copy, not safetensors at all, a tensor it lacks) as a ValueError naming the file and `what` it is."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt", device="cpu") as f:
            yield f
    except SafetensorError as err:
        raise ValueError(f"{what + ' ' if what else ''}{path}: unreadable ({str(err).splitlines()[0][:160]}); a file "
                         "cut short by an interrupted download or copy? fetch or write it again") from None


def read_weights(folder: Path) -> dict:
    """A draft folder's tensors: model.safetensors or the shards its index lists, else pytorch_model.bin or the
    shards its index lists (plain tensors only: weights_only), as transformers picks them; an error names a file
    that is missing or unreadable (a truncated copy, say)."""
    import torch
    from safetensors.torch import load_file

    for single, index in ((SINGLE, INDEX), (BIN, BIN_INDEX)):
        if (folder / single).is_file():
            names = [single]
        elif (folder / index).is_file():
            names = sorted(set(json.loads((folder / index).read_text())["weight_map"].values()))
        else:
            continue
        weights = {}
        for name in names:
            if not (folder / name).is_file():
                raise ValueError(f"draft {folder}: {index} lists {name}, which is not in the folder")
            try:
                weights.update(load_file(str(folder / name)) if name.endswith(".safetensors") else torch.load(
                    folder / name, map_location="cpu", weights_only=True))
            except Exception as e:  # safetensors / pickle errors for a damaged file
                raise ValueError(f"draft {folder}: {name} is unreadable ({str(e).splitlines()[0][:160]}); copy or "
                                 "export it again") from None
        return weights
    raise ValueError(f"draft {folder}: no {SINGLE}, {BIN} or either's index ({INDEX}, {BIN_INDEX}) there")
