"""Corpus files read record by record: JSONL, a JSON array (streamed element by element), .txt (one text sample
per non-empty line), parquet (by row batch) and a `datasets` folder saved with save_to_disk (memory-mapped). A
broken line (bad JSON, not UTF-8) is counted in ReadStats and skipped; a file of a kind not read stops the run
with what is accepted (schemas.FILE_KINDS). What a record means is schemas.to_samples'."""
from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any, Iterator

from toolkit.data.schemas import FILE_KINDS, ReadStats, SchemaError


def _json_lines(path: Path, stats: ReadStats) -> Iterator[tuple[str, Any]]:
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                yield f"{path}:{n}", json.loads(raw.decode("utf-8-sig" if n == 1 else "utf-8"))
            except UnicodeDecodeError:
                stats.add_bad(f"{path}:{n}", "not UTF-8")
            except json.JSONDecodeError as e:
                stats.add_bad(f"{path}:{n}", f"broken JSON ({e.msg} at column {e.colno})")
            except RecursionError:  # nested past Python's stack (a fuzzed or runaway line): one broken line
                stats.add_bad(f"{path}:{n}", "JSON nested too deep to read")


def _json_array(path: Path, stats: ReadStats, chunk: int = 1 << 20) -> Iterator[tuple[str, Any]]:
    """Stream the elements of a top-level JSON array without holding the whole file."""
    dec = json.JSONDecoder()
    with open(path, encoding="utf-8-sig") as f:  # -sig: a byte-order mark some editors write is skipped
        buf, pos, eof, k, started = "", 0, False, 0, False

        def refill() -> None:  # keep the unread part, append the next chunk
            nonlocal buf, pos, eof
            more = f.read(chunk)
            buf, pos, eof = buf[pos:] + more, 0, not more

        try:
            while True:
                while True:  # skip whitespace and commas between elements
                    while pos < len(buf) and buf[pos] in " \t\r\n,":
                        pos += 1
                    if pos < len(buf) or eof:
                        break
                    refill()
                if pos >= len(buf):
                    if started:
                        stats.add_bad(f"{path}[item {k}]", "the array is not closed with ]")
                    return
                if not started:
                    if buf[pos] != "[":
                        raise SchemaError(f"{path}: a .json file should hold one array of records or JSON lines")
                    started, pos = True, pos + 1
                    continue
                if buf[pos] == "]":
                    return
                while True:  # decode one element, reading more while it may be cut by the chunk end
                    try:
                        item, end = dec.raw_decode(buf, pos)
                        if end < len(buf) or eof:
                            break
                    except json.JSONDecodeError as e:
                        if eof or len(buf) - pos > 64 * chunk:
                            stats.add_bad(f"{path}[item {k}]", f"broken JSON ({e.msg} at line {e.lineno} column "
                                                               f"{e.colno}); the rest is skipped")
                            return
                    refill()
                yield f"{path}[item {k}]", item
                pos, k = end, k + 1
        except UnicodeDecodeError:
            stats.add_bad(f"{path}[item {k}]", "not UTF-8; the rest of the file is skipped")


def raw_records(path: Path, stats: ReadStats) -> Iterator[tuple[str, Any]]:
    if path.is_dir():
        import datasets

        try:
            ds = datasets.load_from_disk(str(path))
        except FileNotFoundError:  # no dataset_info.json / state.json / dataset_dict.json
            raise SchemaError(f"{path}: a folder, but not a `datasets` folder saved with save_to_disk; accepted: "
                              f"{FILE_KINDS}") from None
        splits = ds.values() if isinstance(ds, datasets.DatasetDict) else [ds]
        for split in splits:
            for i, row in enumerate(split):
                yield f"{path} row {i}", row
        return
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        i = 0
        try:
            table = pq.ParquetFile(path)
        except (OSError, ValueError) as e:  # pyarrow's message names no file
            raise SchemaError(f"{path}: not a readable parquet file ({str(e).splitlines()[0][:120]}); accepted: "
                              f"{FILE_KINDS}") from None
        for batch in table.iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                yield f"{path} row {i}", row
                i += 1
    elif suffix == ".txt":
        for where, line in _text_lines(path, stats):
            yield where, {"text": line}
    elif suffix in (".json", ".jsonl"):
        with open(path, "rb") as f:
            head = f.read(4096).removeprefix(codecs.BOM_UTF8).lstrip()
        yield from (_json_array if head.startswith(b"[") else _json_lines)(path, stats)
    else:
        raise SchemaError(f"{path}: unsupported file type {suffix!r}; accepted: {FILE_KINDS}")


def _text_lines(path: Path, stats: ReadStats) -> Iterator[tuple[str, str]]:
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                stats.add_bad(f"{path}:{n}", "not UTF-8")
                continue
            if line.strip():
                yield f"{path}:{n}", line
