"""Work the main process does for every rank: the draft vocabulary is counted over every assistant token of the
training rows (a pass over the whole dataset, hundreds of millions of ids on a real corpus); each of 8 or 16 ranks
reading it all for the same answer multiplied the start-up time and the load on a shared disk by as many."""
from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")


def on_main(compute: Callable[[], T]) -> T:
    """compute() on the main process (global rank 0), its result pickled to every other process; a plain call when
    not distributed. An error there is raised on every process (the others' say it came from the main one), so
    no rank is left waiting in the broadcast until the collective's timeout."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return compute()
    box: list = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = (True, compute())
        except Exception as err:
            dist.broadcast_object_list([(False, f"{type(err).__name__}: {err}")], src=0)
            raise
    dist.broadcast_object_list(box, src=0)
    ok, value = box[0]
    if not ok:
        raise RuntimeError(f"on the main process: {value}")
    return value
