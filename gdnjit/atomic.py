"""Whole-file writes: a reader sees the old file or the complete new one, never a part.

The data goes to a temp file beside the target, is flushed and fsynced, and is renamed over the
target. The temp file is created with mode 0666 less the umask, as any file the user creates:
``tempfile.mkstemp`` would make it 0600, and a cache warmed into a shared directory could then be
read by its owner alone (docs/deploy.md: serving processes of another user read it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

TEMP_PREFIX = ".tmp-"  # temp files are dot files: the cache's listings skip them


def create_temp(path: Path) -> tuple[int, Path]:
    """(fd, temp path) of a new, empty file beside ``path`` (same directory, so the rename is atomic),
    opened for writing with the umask's mode. OSError if the directory cannot take it."""
    while True:
        tmp = path.parent / f"{TEMP_PREFIX}{path.name}-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
        except FileExistsError:  # 32 random bits taken: draw again
            continue


def publish(tmp: Path, write: Callable[[], Any], commit: Callable[[], None]) -> Any:
    """``write()`` (which fills ``tmp``), then ``commit()`` (which moves ``tmp`` into place); on any failure
    ``tmp`` is removed and the error re-raised, so the target is either untouched or complete."""
    try:
        result = write()
        commit()
        return result
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole (temp file, fsync, rename); OSError (ENOSPC, EACCES, ...) leaves
    ``path`` as it was and no temp file behind."""
    path = Path(path)
    fd, tmp = create_temp(path)

    def write() -> None:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    publish(tmp, write, lambda: os.replace(tmp, path))
