"""Write files atomically: into a temp file beside the target, then rename, so no reader ever sees half a file."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path in the target's folder; on success it is renamed onto `path`, on error removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        yield Path(tmp)
        # mkstemp makes 0600 (and a writer may replace the file): give it the mode a plain open() would
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def check_out_path(flag: str, path: str | Path, folder: bool) -> None:
    """Refuse, before any work, an output path that cannot be written: a folder where a file is written (or a file
    where a folder is), or one below a file (`--out notes.txt/maps`), which failed at the end with an OSError."""
    path = Path(path)
    if path.exists() and path.is_dir() != folder:
        raise ValueError(f"{flag} {path} is a {'file' if folder else 'folder'}; give "
                         f"{'a folder (made if absent)' if folder else 'a file name'}")
    # an existing output folder is written in; else the nearest existing folder above gets the new ones
    for parent in [path] if folder and path.is_dir() else path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{flag} {path}: {parent} is a file, not a folder; give a path whose folders can "
                                 "be made")
            try:  # a real write: permissions, a read-only mount, /proc; os.access says yes to root on all of them
                tempfile.TemporaryDirectory(dir=parent, prefix=".toolkit-write-check-").cleanup()
            except OSError as e:
                raise ValueError(f"{flag} {path}: nothing can be written in {parent} ({e.strerror}); give a "
                                 "writable place") from None
            return
