"""Typed configuration knobs, read once from the environment.

Every knob lives here (Triton's ``knobs.py`` lesson): modules deeper down receive a
:class:`Config` value explicitly instead of reading ``os.environ`` themselves.

Environment variables:

``GDNJIT_CACHE_DIR``            writable cache directory (default ``~/.cache/gdnjit``)
``GDNJIT_READONLY_CACHE_DIRS``  extra cache dirs searched first, read-only (``os.pathsep``-separated)
``GDNJIT_LOCK_DIR``             directory for lock files (default ``<cache dir>/locks``; put it on
                                node-local storage when the cache dir is on a shared file system)
``GDNJIT_LOCK_TIMEOUT``         seconds to wait for a compile lock (default 600; finite)
``GDNJIT_DISABLE_JIT``          ``1``: never compile; a cache miss raises :class:`CacheMissError`
``GDNJIT_ALWAYS_COMPILE``       ``1``: ignore cache hits, compile and overwrite
``GDNJIT_DISABLE_DISK_CACHE``   ``1``: compile in memory only, write nothing
``GDNJIT_SAVE_SOURCE``          ``1``: store the rendered source next to each cubin
``GDNJIT_CHECK_INDICES``       ``1``: check state indices against the pool size on the host before each
                                launch (a device sync; for debugging). Without it an out-of-range
                                index stops the kernel (``__trap``) instead of corrupting memory.
``GDNJIT_PDL``                   ``0``: launch the GDN kernels without programmatic dependent launch. Default on
                                (sm_90+): each GDN kernel waits (``griddepcontrol.wait``) for the previous grid
                                before its first memory access, so it may be scheduled while that grid finishes
                                (-0.5 to -0.6 us per call at B = 1, no change at large batch; docs/perf.md v7).
                                NVFP4 takes ``enable_pdl`` per call instead, as in FlashInfer.
``GDNJIT_BATCH_INVARIANT``      ``1``: one GDN variant (one arithmetic order) for every batch size, so a
                                request's outputs and states are bit-identical whatever else is batched with it
                                (deterministic serving); the dispatcher then sees B = the spec's
                                ``invariant_batch``. Costs speed at other batch sizes (docs/perf.md).
``GDNJIT_LOG_LEVEL``            logging level name for the ``gdnjit`` logger (default WARNING)
``GDNJIT_CACHE_MAX_BYTES``      size limit of the writable cache dir's entries: bytes, or a number with a
                                binary suffix (``K``, ``M``, ``G``, ``T``; ``KiB``/``KB`` alike: ``500M``,
                                ``2G``). ``0`` or unset: unlimited. After each publish the least recently
                                used entries (by the sidecar's mtime, refreshed by hits) are deleted
                                until the total fits; read-only dirs are never counted or touched.
                                ``gdnjit cache evict`` applies the limit on demand.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from pathlib import Path
from typing import Mapping

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class ConfigError(ValueError):
    """An environment variable has a bad value. The message names the variable, what was expected and
    what came, on one line (``gdnjit`` prints it as ``gdnjit <command>: <message>`` and exits 2)."""


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigError(f"environment variable {name}: expected one of 1/0/true/false, got {raw!r}")


_SIZE_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmgt])(?:i?b)?|b)?", re.IGNORECASE | re.ASCII)
_SIZE_UNITS = {None: 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(name: str, raw: str) -> int:
    """Bytes from ``raw`` (``123``, ``500M``, ``1.5GiB``, ``2 g``; binary units); ``""`` is 0 (unlimited).

    Raises ValueError naming ``name`` (the variable or option) for anything else, negative numbers included.
    """
    text = raw.strip()
    if not text:
        return 0
    m = _SIZE_RE.fullmatch(text) if len(text) <= 64 else None
    if not m:
        raise ValueError(
            f"{name}: expected a size in bytes, optionally with a suffix K, M, G or T "
            f"(e.g. 500M, 2G; 0 = unlimited), got {raw!r}"
        )
    unit = m.group(2).lower() if m.group(2) else None
    whole, _, frac = m.group(1).partition(".")  # exact: no float rounding or overflow
    scale = 10 ** len(frac)
    return (int(whole or "0") * scale + int(frac or "0")) * _SIZE_UNITS[unit] // scale


@dataclasses.dataclass(frozen=True)
class Config:
    """All knobs, as explicit values. Build one with :func:`load_config`."""

    cache_dir: Path
    readonly_cache_dirs: tuple[Path, ...] = ()
    lock_dir: Path | None = None
    lock_timeout_s: float = 600.0
    disable_jit: bool = False
    always_compile: bool = False
    disable_disk_cache: bool = False
    save_source: bool = False
    check_indices: bool = False
    pdl: bool = True
    batch_invariant: bool = False
    log_level: str = "WARNING"
    cache_max_bytes: int = 0  # 0: unlimited

    @property
    def effective_lock_dir(self) -> Path:
        """Where lock files go: the configured lock dir, else ``<cache_dir>/locks``."""
        return self.lock_dir if self.lock_dir is not None else self.cache_dir / "locks"


def load_config(env: Mapping[str, str] | None = None) -> Config:
    """Read the knobs from ``env`` (default ``os.environ``); raises :class:`ConfigError` (a ValueError)
    naming the variable on a bad value. Whether the directories are usable is checked where they are
    used (``gdnjit.cache.DiskCache.check``), not here."""
    env = os.environ if env is None else env
    cache_dir = Path(env.get("GDNJIT_CACHE_DIR") or Path.home() / ".cache" / "gdnjit").expanduser()
    ro = tuple(
        Path(p).expanduser() for p in env.get("GDNJIT_READONLY_CACHE_DIRS", "").split(os.pathsep) if p
    )
    lock_dir = env.get("GDNJIT_LOCK_DIR")
    raw_timeout = env.get("GDNJIT_LOCK_TIMEOUT", "600")
    try:
        timeout = float(raw_timeout)
    except ValueError:
        timeout = math.nan
    if not 0 <= timeout < math.inf:  # also NaN; inf (or 1e400) would wait for ever on a hung compile
        raise ConfigError(
            f"environment variable GDNJIT_LOCK_TIMEOUT: expected seconds (a finite number >= 0), got {raw_timeout!r}")
    raw_level = env.get("GDNJIT_LOG_LEVEL", "WARNING")
    level = raw_level.strip().upper()
    if not isinstance(logging.getLevelName(level), int):
        raise ConfigError(f"environment variable GDNJIT_LOG_LEVEL: expected a logging level name "
                          f"(DEBUG, INFO, WARNING, ERROR, CRITICAL), got {raw_level!r}")
    try:
        max_bytes = parse_size("environment variable GDNJIT_CACHE_MAX_BYTES", env.get("GDNJIT_CACHE_MAX_BYTES", ""))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return Config(
        cache_dir=cache_dir,
        readonly_cache_dirs=ro,
        lock_dir=Path(lock_dir).expanduser() if lock_dir else None,
        lock_timeout_s=timeout,
        disable_jit=_flag(env, "GDNJIT_DISABLE_JIT"),
        always_compile=_flag(env, "GDNJIT_ALWAYS_COMPILE"),
        disable_disk_cache=_flag(env, "GDNJIT_DISABLE_DISK_CACHE"),
        save_source=_flag(env, "GDNJIT_SAVE_SOURCE"),
        check_indices=_flag(env, "GDNJIT_CHECK_INDICES"),
        pdl=_flag(env, "GDNJIT_PDL") if env.get("GDNJIT_PDL", "").strip() else True,
        batch_invariant=_flag(env, "GDNJIT_BATCH_INVARIANT"),
        log_level=level,
        cache_max_bytes=max_bytes,
    )


_current: Config | None = None


def get_config() -> Config:
    """The process-wide configuration, read from the environment on first use."""
    global _current
    if _current is None:
        _current = load_config()
        logging.getLogger("gdnjit").setLevel(_current.log_level)
    return _current


def set_config(config: Config | None) -> None:
    """Replace the process-wide configuration (``None``: re-read the environment on next use).

    The runner notices the new object on its next call and drops the in-process caches filled under
    the old one (:meth:`gdnjit.runner.Runner.sync`); this module knows nothing of them.
    """
    global _current
    _current = config
