"""Recorded warm plans: a ``gdnjit warm`` whose variants are all cached, without planning them again.

Planning qwen35.yaml asks the dispatcher ~31,000 times (about a second of CPU); a warm that finds every
variant in the cache has nothing else to do. After a warm with no failure, ``gdnjit warm`` records the
plan's variants (entry name, key, description) in ``<cache dir>/plans/<digest>.json``, the digest taken over
everything a plan and its keys depend on: the gdnjit package's files (code, specs, templates, shipped tuned
tables), the NVRTC version (part of every key), the shapes files' bytes, the archs, the SM counts, the
tuned table documents and batch-invariant mode. A later warm with the same digest reports the recorded
variants when every one of them is a valid cache entry; an entry missing or invalid, or a record that does
not parse, and it plans as before. A record only ever shortens the check that nothing needs compiling.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

from .atomic import write_atomic

PLAN_DIR = "plans"
FORMAT = 1
KEEP = 32  # records kept per cache dir (the newest): one per shapes file, arch and tuned state in use


@dataclasses.dataclass(frozen=True)
class Recorded:
    """One variant of a recorded plan: its cache entry name and key, and :meth:`Variant.describe`."""

    name: str
    key: str
    description: str


@functools.lru_cache(maxsize=4)
def package_digest(root: Path = Path(__file__).parent) -> bytes:
    """sha256 over the files of the gdnjit package (or of ``root``): paths and bytes, bytecode caches aside."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.digest()


def digest(shapes: Sequence[bytes], archs: Sequence[str], num_sms: Sequence[int] | None, tuned: Sequence[dict],
           batch_invariant: bool) -> str:
    """The record key of a warm: what its plan and the plan's cache keys depend on."""
    from .compile import nvrtc_version

    inputs = {"format": FORMAT, "nvrtc": nvrtc_version(), "archs": list(archs),
              "num_sms": list(num_sms) if num_sms else None, "tuned": list(tuned), "batch_invariant": batch_invariant,
              "shapes": [hashlib.sha256(b).hexdigest() for b in shapes]}
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(package_digest() + text.encode()).hexdigest()


def _path(cache_dir: Path, key: str) -> Path:
    return cache_dir / PLAN_DIR / f"{key}.json"


def load(cache_dir: Path, key: str) -> tuple[list[Recorded], int] | None:
    """(the recorded variants, the number of problems planned) under ``key``, or None (no record, or one that
    does not parse as :func:`save` writes it)."""
    try:
        doc = json.loads(_path(cache_dir, key).read_text())
        if doc.get("format") != FORMAT or doc.get("digest") != key:
            return None
        variants = [Recorded(str(v["name"]), str(v["key"]), str(v["description"])) for v in doc["variants"]]
        return variants, int(doc["problems"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def save(cache_dir: Path, key: str, variants: Sequence[Any], problems: int) -> None:
    """Record ``variants`` (:class:`~gdnjit.variant.Variant`) under ``key``, written whole (a temp file
    replaced into place), then keep only the :data:`KEEP` newest records."""
    directory = cache_dir / PLAN_DIR
    directory.mkdir(parents=True, exist_ok=True)
    doc = {"format": FORMAT, "digest": key, "problems": problems,
           "variants": [{"name": v.name, "key": v.key, "description": v.describe()} for v in variants]}
    write_atomic(_path(cache_dir, key), json.dumps(doc, separators=(",", ":")).encode())
    for old in sorted(directory.glob("*.json"), key=_mtime, reverse=True)[KEEP:]:
        old.unlink(missing_ok=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile by another warm's cleanup
        return 0.0


def clear(cache_dir: Path) -> int:
    """Delete every plan record (and stray temp file) of ``cache_dir``; returns the number of files removed."""
    directory = cache_dir / PLAN_DIR
    n = 0
    if directory.is_dir():
        for p in directory.iterdir():
            if p.is_file():
                p.unlink(missing_ok=True)
                n += 1
    return n
