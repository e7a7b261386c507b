"""Cache archives: ``gdnjit cache export`` writes a cache's valid entries to a ``.tar.gz``, ``gdnjit cache
import`` adds an archive's entries to a cache.

An archive is code that runs on the GPU: import only archives you trust. The import checks what it can
without trusting the archive: every member is a flat regular file (no paths, links or devices: such a
member refuses the whole archive), sizes are capped before anything is read (:data:`MAX_MEMBER_BYTES`,
:data:`MAX_ARCHIVE_BYTES`, :data:`MAX_MEMBERS`), and each entry's cubin matches its sidecar's size and sha256
and its key matches its name, as for any cache entry. Everything is read and checked before anything is
written. A local entry whose cubin differs from the archive's is kept unless the import is told to replace.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import stat
import tarfile
import zlib
from pathlib import Path

from ..atomic import create_temp, publish
from .key import CACHE_FORMAT
from .store import DiskCache, read_entry

# Limits far above a real cache (a cubin is 10-100 KB, a sidecar 2-5 KB; Qwen3.5 on one arch is ~200 entries,
# about 5 MB): an archive past them is refused before its members are read into memory.
MAX_MEMBER_BYTES = 16 << 20
MAX_ARCHIVE_BYTES = 512 << 20  # the members' sizes added up
MAX_MEMBERS = 100_000

_SUFFIXES = (".cubin", ".json")
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP), errno.EMLINK}


class ArchiveError(ValueError):
    """A cache archive cannot be written or read, is unsafe or too large, or holds no entries. The message
    names the archive path, what was expected and what was found, on one line; nothing was written."""


@dataclasses.dataclass(frozen=True)
class ArchiveContents:
    """What :func:`read_archive` found."""

    entries: dict[str, tuple[bytes, bytes]]  # valid entries: name -> (cubin, sidecar)
    invalid: tuple[str, ...]  # entry names whose pair is incomplete or fails its checks
    other: tuple[str, ...]  # flat regular files that are not entry files (skipped)


@dataclasses.dataclass(frozen=True)
class Imported:
    """What :func:`import_archive` did, entry names by outcome (see :meth:`DiskCache.add_entry`)."""

    added: tuple[str, ...]
    present: tuple[str, ...]
    kept: tuple[str, ...]
    replaced: tuple[str, ...]
    contents: ArchiveContents


def _what(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _check_target(path: Path, force: bool) -> None:
    """ArchiveError unless ``path`` may be written: absent, or (with ``force``) a regular file. A symbolic link
    is refused whatever it points to: the rename would replace the link, not write through it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise ArchiveError(f"archive {str(path)!r}: expected a file path, got one that cannot be examined "
                           f"({e.strerror}); nothing written") from None
    if not stat.S_ISREG(st.st_mode):
        raise ArchiveError(f"archive {str(path)!r}: expected a new file (or, with --force, a regular file to "
                           f"replace), got {_what(st.st_mode)}; nothing written")
    if not force:
        raise ArchiveError(f"archive {str(path)!r}: expected a new file, got an existing file "
                           f"(pass --force to replace it); nothing written")


def export_archive(cache: DiskCache, path: Path, force: bool = False) -> int:
    """Write every valid entry (cubin + sidecar) of ``cache``'s writable dir to a ``.tar.gz`` at ``path``;
    returns the entry count.

    ``path`` must not exist, or, with ``force``, be a regular file (it is then replaced); anything else (a
    directory, a link, a FIFO, a device) raises :class:`ArchiveError` and nothing is written. The archive is
    written to a temp file beside ``path`` (with the umask's mode) and moved into place at the end, so a failed
    export leaves nothing behind. Without ``force`` the move is a hard link, which fails rather than replace a
    file that appeared meanwhile."""
    path = Path(path)
    parent = path.parent
    if not parent.is_dir():
        raise ArchiveError(f"archive {str(path)!r}: expected a file path in an existing directory, "
                           f"got {str(parent)!r}, which is {'not a directory' if parent.exists() else 'missing'}")
    _check_target(path, force)
    try:
        fd, tmp = create_temp(path)
    except OSError as e:
        raise ArchiveError(f"archive {str(path)!r}: expected a writable directory, got {str(parent)!r} "
                           f"({e.strerror})") from None

    def write() -> int:
        n = 0
        with os.fdopen(fd, "wb") as f, tarfile.open(str(path), mode="w:gz", fileobj=f) as tar:
            for name, meta in cache.list_entries():
                key = meta.get("key") if meta else None
                entry, _ = read_entry(cache.dir, name, key) if isinstance(key, str) else (None, None)
                if entry is None or not name.endswith("-" + key[:32]):
                    continue
                for suffix in _SUFFIXES:
                    tar.add(cache.dir / f"{name}{suffix}", arcname=f"{name}{suffix}")
                n += 1
        return n

    def commit() -> None:
        _check_target(path, force)  # again: the path may have changed while the archive was written
        if force:
            os.replace(tmp, path)
            return
        try:
            os.link(tmp, path)  # fails if path exists: never replaces what appeared meanwhile
        except FileExistsError:
            raise ArchiveError(f"archive {str(path)!r}: expected a new file, got one created during the export "
                               f"(pass --force to replace it); nothing written") from None
        except OSError as e:
            if e.errno not in _NO_HARD_LINKS:
                raise
            os.replace(tmp, path)  # a file system without hard links: the check just above is all there is
            return
        os.unlink(tmp)

    try:
        return publish(tmp, write, commit)
    except OSError as e:
        raise ArchiveError(f"archive {str(path)!r}: cannot be written ({e.strerror or e})") from None


def _member_problem(member: tarfile.TarInfo, name: str) -> str | None:
    """Why ``member`` (``name``: its name less leading ``./``) is unsafe, or None for a flat regular file or
    the archive's root directory entry (``tar -C dir .`` writes one)."""
    if member.isdir() and name in ("", "."):
        return None
    if not member.isfile():
        kind = ("a symbolic link" if member.issym() else "a hard link" if member.islnk() else
                "a directory" if member.isdir() else "a device or FIFO" if member.isdev() else "not a regular file")
        return f"{member.name!r} is {kind}"
    if os.path.isabs(member.name) or ".." in Path(name).parts:
        return f"{member.name!r} points outside the archive"
    if "/" in name or "\\" in name:
        return f"{member.name!r} has a directory part"
    return None


def read_archive(path: Path) -> ArchiveContents:
    """The entries of an archive made by :func:`export_archive` (or ``tar -C entries -czf x.tar.gz .``), each
    checked as a cache entry is. Raises :class:`ArchiveError` if ``path`` is not a readable gzipped tar, if any
    member is unsafe (a path, a link, a device: the whole archive is refused), or if a member or the members
    together exceed the limits (checked from the headers, before a member is read)."""
    path = Path(path)
    if not path.is_file():
        found = "a directory" if path.is_dir() else "no such file" if not path.exists() else "not a regular file"
        raise ArchiveError(f"archive {str(path)!r}: expected a .tar.gz file made by `gdnjit cache export`, "
                           f"got {found}")
    files: dict[str, bytes] = {}
    unsafe: list[str] = []
    total = count = 0
    try:
        with tarfile.open(path, "r:gz") as tar:
            for member in tar:  # one header at a time: the limits hold before anything large is read
                count += 1
                if count > MAX_MEMBERS:
                    raise ArchiveError(f"archive {str(path)!r}: expected at most {MAX_MEMBERS} members, got more; "
                                       f"nothing imported")
                name = member.name
                while name.startswith("./"):
                    name = name[2:]
                problem = _member_problem(member, name)
                if problem:
                    unsafe.append(problem)
                    continue
                if not member.isfile():
                    continue
                if member.size > MAX_MEMBER_BYTES:
                    raise ArchiveError(f"archive {str(path)!r}: expected members of at most {MAX_MEMBER_BYTES} bytes, "
                                       f"got {member.name!r} of {member.size} bytes; nothing imported")
                total += member.size
                if total > MAX_ARCHIVE_BYTES:
                    raise ArchiveError(f"archive {str(path)!r}: expected at most {MAX_ARCHIVE_BYTES} bytes of members, "
                                       f"got more; nothing imported")
                if not unsafe:  # an unsafe archive is refused below: no need to read further members
                    files[name] = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:  # OSError: gzip.BadGzipFile, EIO, ...
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
        raise ArchiveError(f"archive {str(path)!r}: expected a .tar.gz file made by `gdnjit cache export`, "
                           f"got one that cannot be read ({why})") from None
    if unsafe:
        raise ArchiveError(f"archive {str(path)!r}: expected flat regular entry files, got {len(unsafe)} unsafe "
                           f"member(s) ({unsafe[0]}{', ...' if len(unsafe) > 1 else ''}); nothing imported")
    other = sorted(f for f in files if f.startswith(".") or not f.endswith(_SUFFIXES))
    entries: dict[str, tuple[bytes, bytes]] = {}
    invalid = []
    for name in sorted({f[: f.rindex(".")] for f in files if f not in other}):
        cubin, sidecar = files.get(f"{name}.cubin"), files.get(f"{name}.json")
        if cubin is not None and sidecar is not None and _valid_pair(name, cubin, sidecar):
            entries[name] = (cubin, sidecar)
        else:
            invalid.append(name)
    return ArchiveContents(entries, tuple(invalid), tuple(other))


def _valid_pair(name: str, cubin: bytes, sidecar: bytes) -> bool:
    try:
        meta = json.loads(sidecar)
    except ValueError:
        return False
    return (isinstance(meta, dict) and isinstance(meta.get("key"), str) and name.endswith("-" + meta["key"][:32])
            and meta.get("format") == CACHE_FORMAT and len(cubin) == meta.get("cubin_size")
            and hashlib.sha256(cubin).hexdigest() == meta.get("cubin_sha256"))


def import_archive(cache: DiskCache, path: Path, replace: bool = False) -> Imported:
    """Add the valid entries of the archive at ``path`` to ``cache``'s writable dir (made if missing), each
    under its lock and published atomically. A local entry with another cubin stays unless ``replace``. Raises
    :class:`ArchiveError` (nothing written) if the archive is unreadable, unsafe, too large, or has no valid
    entry."""
    contents = read_archive(path)
    if not contents.entries:
        raise ArchiveError(f"archive {str(path)!r}: expected cache entries (<name>.cubin + <name>.json pairs, as "
                           f"`gdnjit cache export` writes them), got none that is valid ({len(contents.invalid)} "
                           f"invalid, {len(contents.other)} other files); nothing imported")
    cache.check(write=True, create=True)
    outcome: dict[str, list[str]] = {"added": [], "present": [], "kept": [], "replaced": []}
    for name, (cubin, sidecar) in contents.entries.items():
        outcome[cache.add_entry(name, cubin, sidecar, replace=replace)].append(name)
    return Imported(*(tuple(outcome[k]) for k in ("added", "present", "kept", "replaced")), contents=contents)
