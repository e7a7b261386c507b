"""The on-disk store: one ``<name>.cubin`` + ``<name>.json`` pair per entry.

Publishing (Triton/CuPy/FlashInfer lessons): take a per-entry file lock (in the lock dir, which
can be node-local), re-check, build, write each file to a temp file in the same directory,
fsync, ``os.replace`` — cubin first, the JSON sidecar last as the commit marker. An entry is
valid only if its sidecar parses, names the same key and matches the cubin's size and sha256;
anything else is treated as a miss (logged once) and rebuilt, never loaded. Read-only cache
directories are searched first and never written.

Size limit (``GDNJIT_CACHE_MAX_BYTES``): a hit in the writable dir touches the entry's sidecar
mtime (at most once per ``TOUCH_INTERVAL_S``), so the sidecar mtime is the entry's last use. After
a publish, if the writable dir's entry files add up to more than the limit, the least recently
used entries other than the one just published are deleted, each under its own entry lock taken
without waiting (a locked entry is being built or published: skipped). The sidecar goes first,
then the cubin, so a half-deleted entry is an invalid one (a miss), never a loadable one.
Read-only dirs are never counted or touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from ..atomic import TEMP_PREFIX, write_atomic
from ..config import Config
from ..errors import CacheMissError, LockTimeoutError
from .key import CACHE_FORMAT, cache_key

log = logging.getLogger("gdnjit.cache")
ENTRY_DIR = "entries"
_warned: set[str] = set()


class CacheDirError(OSError):
    """A configured cache directory cannot be used: it is not a directory (or runs through a regular
    file), or it cannot be written. The message names the variable, the path and the OS error, on one
    line. An OSError, so callers that catch OSError around cache work still do."""


class CacheWriteError(CacheDirError):
    """An entry could not be written to the writable cache dir (no space left, a quota, an I/O error): one line
    naming the directory and the OS's reason. Nothing of the entry stays behind."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """A loaded cache entry: the cubin bytes and its sidecar metadata."""

    name: str
    cubin: bytes
    meta: dict[str, Any]
    origin: str  # "built", "disk" or "readonly"


@dataclasses.dataclass(frozen=True)
class EntryUsage:
    """Disk use of one entry of a cache dir (``DiskCache.usage``)."""

    name: str
    bytes: int  # cubin + sidecar (+ saved source), as stored
    last_used: float  # sidecar mtime (publish or last hit); 0.0 without a sidecar (an orphan: evicted first)


@dataclasses.dataclass(frozen=True)
class Eviction:
    """What ``DiskCache.evict`` did."""

    limit: int  # bytes; 0: unlimited (nothing was done)
    before: int  # entry bytes of the writable dir before
    after: int  # ... and after
    removed: tuple[str, ...]  # entry names deleted, least recently used first
    skipped: tuple[str, ...]  # entries that would have gone but were locked (or could not be locked)


@dataclasses.dataclass(frozen=True)
class Built:
    """What a build callback returns: the cubin, resource metadata and (optionally) the source."""

    cubin: bytes
    meta: dict[str, Any]
    source: str | None = None


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        log.warning(msg)


_ENTRY_SUFFIXES = (".json", ".cubin", ".cu")  # deletion order: the sidecar (commit marker) first
TOUCH_INTERVAL_S = 300.0  # a hit refreshes a sidecar's mtime only when it is older than this


def _touch(path: Path) -> None:
    """Record a use: set ``path``'s mtime to now, unless it was set less than TOUCH_INTERVAL_S ago
    (LRU order to within minutes is plenty; this keeps hits from writing metadata each time, which
    matters on shared file systems). Best effort: a read-only or vanished file is fine."""
    try:
        if time.time() - path.stat().st_mtime > TOUCH_INTERVAL_S:
            os.utime(path)
    except OSError:
        pass


def _dir_error(var: str, directory: Path, expected: str, problem: str) -> CacheDirError:
    return CacheDirError(f"{var}: expected {expected}, got {str(directory)!r} ({problem})")


def _check_is_dir(directory: Path, var: str) -> None:
    """CacheDirError unless ``directory`` is a directory or could become one (its nearest existing
    ancestor is a directory)."""
    p = directory
    while True:
        try:
            st = p.stat()
        except (FileNotFoundError, NotADirectoryError):  # not there (yet), or under a file: look higher
            if p.parent == p:
                return
            p = p.parent
            continue
        except OSError as e:  # EACCES (a parent cannot be searched), ELOOP, ...
            raise _dir_error(var, directory, "a directory", f"cannot access {str(p)!r}: {e.strerror}") from None
        if stat.S_ISDIR(st.st_mode):
            return
        what = "is" if p == directory else f"lies under {str(p)!r}, which is"
        raise _dir_error(var, directory, "a directory", f"it {what} not a directory")


def _make_dir(directory: Path, var: str) -> None:
    """``mkdir -p``, an OSError becoming a CacheDirError naming ``var``."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        where = f" {str(e.filename)!r}" if e.filename else ""
        raise _dir_error(var, directory, "a writable directory", f"cannot create{where}: {e.strerror}") from None


def _probe_write(directory: Path, var: str, configured: Path | None = None) -> None:
    """Create and remove a temp file in ``directory`` (``configured`` or an ancestor of it, which
    the error names); CacheDirError if that fails."""
    configured = configured or directory
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-probe-")
    except OSError as e:
        where = "in it" if configured == directory else f"in {str(directory)!r}"
        raise _dir_error(var, configured, "a writable directory",
                         f"cannot create a file {where}: {e.strerror}") from None
    os.close(fd)
    os.unlink(tmp)


def read_entry(directory: Path, name: str, key: str) -> tuple[Entry | None, str | None]:
    """(entry, None) if a valid entry is there; (None, reason) if absent (reason None) or invalid."""
    meta_path = directory / f"{name}.json"
    cubin_path = directory / f"{name}.cubin"
    try:
        meta_text = meta_path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"cannot read {meta_path.name}: {e}"
    try:
        meta = json.loads(meta_text)
        if not isinstance(meta, dict):
            raise ValueError("not an object")
    except ValueError as e:
        return None, f"{meta_path.name}: bad JSON ({e})"
    if meta.get("key") != key or meta.get("format") != CACHE_FORMAT:
        return None, f"{meta_path.name}: key or format mismatch"
    try:
        cubin = cubin_path.read_bytes()
    except OSError as e:
        return None, f"cannot read {cubin_path.name}: {e}"
    if len(cubin) != meta.get("cubin_size") or hashlib.sha256(cubin).hexdigest() != meta.get("cubin_sha256"):
        return None, f"{cubin_path.name}: size or sha256 does not match the sidecar (truncated or corrupt)"
    return Entry(name, cubin, meta, "disk"), None


class DiskCache:
    """The writable cache dir plus read-only dirs, as configured by a :class:`Config`."""

    def __init__(self, config: Config):
        self.config = config
        self.dir = config.cache_dir / ENTRY_DIR
        self.readonly = tuple(d / ENTRY_DIR for d in config.readonly_cache_dirs)

    # ---- usability of the configured dirs ---------------------------------------------------

    def _dirs(self) -> list[tuple[Path, str, bool]]:
        """(directory, the variable that configures it, writable?) for each dir this cache uses."""
        cfg = self.config
        lock_var = "GDNJIT_LOCK_DIR" if cfg.lock_dir is not None else "GDNJIT_CACHE_DIR"
        return [
            (cfg.cache_dir, "GDNJIT_CACHE_DIR", True),
            (self.dir, "GDNJIT_CACHE_DIR", True),
            (cfg.effective_lock_dir, lock_var, True),
            *((d, "GDNJIT_READONLY_CACHE_DIRS", False) for d in (*cfg.readonly_cache_dirs, *self.readonly)),
        ]

    def check(self, write: bool = False, create: bool = False) -> None:
        """Raise :class:`CacheDirError` (one line: variable, path, what is wrong) unless the cache dirs
        are usable, before any work starts (otherwise the failure shows up late: a worker's
        NotADirectoryError, a PermissionError mid-warm, or "0 entries" from a cache dir that is a file).

        Always: each configured dir that exists is a directory, and a missing one could be created
        (its nearest existing ancestor is a directory). With ``write``: the writable cache dir, its
        entry dir and the lock dir, where they exist, accept a new file (one is created and removed,
        so this also holds for root, who ignores permission bits but not a read-only file system);
        with ``create`` too, the missing ones are then made (as a compile would make them), after
        the nearest existing ancestor of each passed the same test, so a failing check writes nothing.
        Read-only dirs are never written, so only their type is checked.
        """
        dirs = self._dirs()
        for directory, var, _ in dirs:
            _check_is_dir(directory, var)
        if not write:
            return
        writable = [(d, var) for d, var, w in dirs if w]
        for directory, var in writable:
            if directory.is_dir():
                _probe_write(directory, var)
            elif create:
                parent = next(p for p in directory.parents if p.is_dir())  # exists: _check_is_dir passed
                _probe_write(parent, var, directory)
        if create:
            for directory, var in writable:
                _make_dir(directory, var)

    def lookup(self, name: str, key: str) -> Entry | None:
        """A valid entry from the read-only dirs, then the writable dir; None on a miss."""
        for directory, origin in [*((d, "readonly") for d in self.readonly), (self.dir, "disk")]:
            entry, problem = read_entry(directory, name, key)
            if entry is not None:
                if origin == "disk":  # read-only dirs are never touched
                    _touch(directory / f"{name}.json")
                return dataclasses.replace(entry, origin=origin)
            if problem:
                _warn_once(f"gdnjit cache: ignoring invalid entry in {directory}: {problem}; it will be rebuilt")
        return None

    def get_or_build(self, name: str, fields: Mapping[str, Any], build: Callable[[], Built]) -> Entry:
        """Return the entry for ``fields``, building and publishing it under the lock on a miss."""
        key = cache_key(fields)
        cfg = self.config
        if not cfg.always_compile:
            hit = self.lookup(name, key)
            if hit is not None:
                return hit
        if cfg.disable_jit:
            raise CacheMissError(
                f"GDNJIT_DISABLE_JIT is set and variant {name} is not in the cache "
                f"(searched {[str(d) for d in (*self.readonly, self.dir)]}); run `gdnjit warm` for its shapes"
            )
        if cfg.disable_disk_cache:
            return self._entry_from(name, key, fields, build(), origin="built")
        with self._locked(name):
            if not cfg.always_compile:
                entry, _ = read_entry(self.dir, name, key)  # re-check: another process may have built it
                if entry is not None:
                    _touch(self.dir / f"{name}.json")
                    return entry
            self._remove_temps(name)  # temps of this entry are only written under this lock: stale
            built = build()
            entry = self._entry_from(name, key, fields, built, origin="built")
            self._write_entry(name, built.cubin, json.dumps(entry.meta, indent=1, sort_keys=True).encode(),
                              built.source.encode() if built.source is not None and cfg.save_source else None)
        if cfg.cache_max_bytes > 0:  # after releasing our lock: eviction only ever tries other entries' locks
            try:
                self.evict(keep=(name,))
            except OSError as e:  # cache maintenance never fails a call
                _warn_once(f"gdnjit cache: size limit not applied in {self.dir}: {e}")
        return entry

    @contextlib.contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        """Hold entry ``name``'s file lock (the writable and lock dirs made first); LockTimeoutError after
        ``GDNJIT_LOCK_TIMEOUT`` seconds."""
        cfg = self.config
        _make_dir(self.dir, "GDNJIT_CACHE_DIR")
        lock_dir = cfg.effective_lock_dir
        _make_dir(lock_dir, "GDNJIT_LOCK_DIR" if cfg.lock_dir is not None else "GDNJIT_CACHE_DIR")
        lock_path = lock_dir / f"{name}.lock"
        import filelock  # only on a miss (and in evict): a warm-cache hit takes no lock, so never imports it

        lock = filelock.FileLock(str(lock_path), timeout=cfg.lock_timeout_s)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise LockTimeoutError(
                f"timed out after {cfg.lock_timeout_s} s waiting for the compile lock {lock_path} "
                f"(another process is compiling {name}; raise GDNJIT_LOCK_TIMEOUT or check for a hung process)"
            ) from None
        try:
            yield
        finally:
            lock.release()

    def add_entry(self, name: str, cubin: bytes, sidecar: bytes, replace: bool = False) -> str:
        """Publish an entry made elsewhere (a verified archive entry: the sidecar's key matches ``name``) under
        its lock. Returns what happened: ``"added"`` (no valid local entry of that name), ``"present"`` (the
        local entry has the same cubin: left as it is), ``"kept"`` (the local entry has another cubin and
        stays, since ``replace`` is false) or ``"replaced"``."""
        key = json.loads(sidecar)["key"]
        with self._locked(name):
            local, _ = read_entry(self.dir, name, key)
            if local is not None:
                if local.cubin == cubin:
                    return "present"
                if not replace:
                    return "kept"
            self._remove_temps(name)
            self._write_entry(name, cubin, sidecar)
            return "added" if local is None else "replaced"

    @staticmethod
    def _entry_from(name: str, key: str, fields: Mapping[str, Any], built: Built, origin: str) -> Entry:
        meta = dict(built.meta)
        meta.update(
            format=CACHE_FORMAT, key=key, fields=dict(fields), cubin_size=len(built.cubin),
            cubin_sha256=hashlib.sha256(built.cubin).hexdigest(), created=time.time(),
        )
        return Entry(name, built.cubin, meta, origin)

    def _write_entry(self, name: str, cubin: bytes, sidecar: bytes, source: bytes | None = None) -> None:
        """Write an entry's files, the sidecar (its commit marker) last. Caller holds the entry lock. On a failed
        write (a full disk, ...) the files written so far are removed, so no half entry stays, and
        :class:`CacheWriteError` names the directory."""
        files = [(".cubin", cubin), *(((".cu", source),) if source is not None else ()), (".json", sidecar)]
        try:
            for suffix, data in files:
                write_atomic(self.dir / f"{name}{suffix}", data)
        except OSError as e:
            self._delete_entry(name)
            raise CacheWriteError(f"GDNJIT_CACHE_DIR: cannot write entry {name} in {str(self.dir)!r}: "
                                  f"{(e.strerror or str(e)).lower()}") from None

    def _remove_temps(self, name: str) -> None:
        for p in self.dir.glob(f"{TEMP_PREFIX}{name}.*"):
            try:
                p.unlink()
            except OSError:
                pass

    # ---- size limit ----------------------------------------------------------------------

    def usage(self, directory: Path | None = None) -> list[EntryUsage]:
        """Bytes and last use of every entry in ``directory`` (default: the writable dir), by name.

        Counts the entry files (``.cubin``, ``.json``, ``.cu``); temp files and lock files are not entries.
        """
        directory = directory or self.dir
        sizes: dict[str, int] = {}
        used: dict[str, float] = {}
        try:
            scan = list(os.scandir(directory))
        except OSError:
            return []
        for f in scan:
            stem, dot, suffix = f.name.rpartition(".")
            if f.name.startswith(".") or not dot or f".{suffix}" not in _ENTRY_SUFFIXES:
                continue
            try:
                st = f.stat(follow_symlinks=False)
            except OSError:  # deleted meanwhile
                continue
            sizes[stem] = sizes.get(stem, 0) + st.st_size
            if suffix == "json":
                used[stem] = st.st_mtime
        return [EntryUsage(n, sizes[n], used.get(n, 0.0)) for n in sorted(sizes)]

    def evict(self, max_bytes: int | None = None, keep: Iterable[str] = ()) -> Eviction:
        """Delete least recently used entries of the writable dir until its entries fit in ``max_bytes``
        (default: ``GDNJIT_CACHE_MAX_BYTES``; 0 = unlimited, nothing happens). Entries in ``keep`` stay.

        Each deletion holds that entry's lock, taken with timeout 0: an entry being built or published
        (its lock held) is skipped, never waited for. Sidecar first, then cubin, then source.
        """
        limit = self.config.cache_max_bytes if max_bytes is None else int(max_bytes)
        entries = self.usage()
        before = total = sum(e.bytes for e in entries)
        if limit <= 0 or total <= limit:
            return Eviction(max(limit, 0), before, total, (), ())
        keep = set(keep)
        lock_dir = self.config.effective_lock_dir
        import filelock

        lock_dir.mkdir(parents=True, exist_ok=True)
        removed: list[str] = []
        skipped: list[str] = []
        for e in sorted(entries, key=lambda e: (e.last_used, e.name)):
            if total <= limit:
                break
            if e.name in keep:
                continue
            lock = filelock.FileLock(str(lock_dir / f"{e.name}.lock"), timeout=0)
            try:
                lock.acquire()
            except (filelock.Timeout, OSError):
                skipped.append(e.name)
                continue
            try:
                self._delete_entry(e.name)
            finally:
                lock.release()
            total -= e.bytes  # gone (by us, or by another evicting process before we got the lock)
            removed.append(e.name)
        if removed:
            log.info("gdnjit cache: evicted %d least recently used entries from %s (%d -> %d bytes, limit %d)",
                     len(removed), self.dir, before, total, limit)
        return Eviction(limit, before, total, tuple(removed), tuple(skipped))

    def _delete_entry(self, name: str) -> None:
        """Remove an entry's files, the sidecar (its commit marker) first (eviction and a failed write hold the
        entry lock; ``verify --repair`` removes an invalid entry without it)."""
        for suffix in _ENTRY_SUFFIXES:
            (self.dir / f"{name}{suffix}").unlink(missing_ok=True)

    # ---- maintenance (CLI) -------------------------------------------------------------

    def list_entries(self, directory: Path | None = None) -> Iterator[tuple[str, dict[str, Any] | None]]:
        """(name, sidecar or None if unreadable) for every entry in ``directory`` (default writable)."""
        directory = directory or self.dir
        if not directory.is_dir():
            return
        names = {p.stem for p in directory.iterdir() if p.suffix in (".json", ".cubin") and not p.name.startswith(".")}
        for name in sorted(names):
            try:
                meta = json.loads((directory / f"{name}.json").read_text())
                yield name, meta if isinstance(meta, dict) else None
            except (OSError, ValueError):
                yield name, None

    def verify(self, repair: bool = False) -> list[tuple[str, str]]:
        """Check every entry of the writable dir; returns [(name, problem)]. ``repair`` deletes bad ones."""
        bad = []
        for name, meta in self.list_entries():
            key = meta.get("key") if meta else None
            if isinstance(key, str) and not name.endswith("-" + key[:32]):
                entry, problem = None, "sidecar key does not match the entry name"
            else:
                entry, problem = read_entry(self.dir, name, key) if key else (None, "missing or unreadable sidecar")
            if entry is None:
                bad.append((name, problem or "missing"))
                if repair:
                    self._delete_entry(name)
        return bad

    def clear(self) -> int:
        """Delete every entry (and stray temp file) of the writable dir; returns the number of files removed."""
        n = 0
        if self.dir.is_dir():
            for p in self.dir.iterdir():
                if p.is_file():
                    p.unlink(missing_ok=True)
                    n += 1
        return n
