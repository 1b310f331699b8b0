"""The heap gauge counts live C allocations: it rises by a held tensor's bytes and falls back when it is freed
(RSS would not fall under the never-trim settings), so test_load can use it as the leak signal."""
import gc
import re

import pytest
import torch

from toolkit.serve.metrics import ServerMetrics, heap_reader


def gauge_mb(metrics: ServerMetrics) -> float:
    text = metrics.render().decode()
    return float(re.search(r"^toolkit_heap_in_use_bytes (\S+)$", text, re.M).group(1)) / 2 ** 20


def test_heap_gauge_follows_live_tensors():
    if heap_reader() is None:
        pytest.skip("no glibc mallinfo2 here: the gauge is not registered")
    metrics = ServerMetrics()
    tries = []
    for _ in range(5):  # the gauge is process-wide: a thread an earlier test left may free memory meanwhile
        gc.collect()
        before = gauge_mb(metrics)
        held = torch.ones(16 * 2 ** 20 // 4)  # 16 MB, written so it is really allocated
        during = gauge_mb(metrics)
        del held
        after = gauge_mb(metrics)
        tries.append((before, during, after))
        if 15.5 < during - before < 17 and abs(after - before) < 0.5:
            break
    assert 15.5 < during - before < 17, tries
    assert abs(after - before) < 0.5, tries
