"""on_main: the main process computes, every rank gets its result (two gloo processes on the CPU)."""
from __future__ import annotations

import json
import socket

import pytest
import torch.multiprocessing as mp

from toolkit.train.ranks import on_main


def _rank(rank: int, port: int, folder: str) -> None:
    import os
    from pathlib import Path

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    calls = Path(folder) / "calls"

    def count():
        with open(calls, "a") as fh:
            fh.write(f"{rank}\n")
        return {"computed_by": rank, "ids": [3, 1, 2]}

    got = on_main(count)
    try:
        on_main(lambda: (_ for _ in ()).throw(ValueError("data x: the dataset is empty")))
        error = None
    except Exception as err:  # noqa: BLE001
        error = f"{type(err).__name__}: {err}"
    (Path(folder) / f"rank{rank}.json").write_text(json.dumps({"got": got, "error": error}))
    dist.destroy_process_group()


def test_the_main_process_computes_once_and_every_rank_gets_its_result(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, str(tmp_path)), nprocs=2)
    assert (tmp_path / "calls").read_text() == "0\n"  # rank 1 never counted
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert res[0]["got"] == res[1]["got"] == {"computed_by": 0, "ids": [3, 1, 2]}
    # an error on the main process reaches the other rank instead of leaving it in the broadcast
    assert res[0]["error"] == "ValueError: data x: the dataset is empty"
    assert res[1]["error"] == "RuntimeError: on the main process: ValueError: data x: the dataset is empty"


def test_one_process_just_calls():
    assert on_main(lambda: [1, 2]) == [1, 2]
    with pytest.raises(ValueError, match="empty"):
        on_main(lambda: (_ for _ in ()).throw(ValueError("empty")))
