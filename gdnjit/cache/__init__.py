"""On-disk cubin cache: keys (:mod:`.key`) and the locked, atomic store (:mod:`.store`)."""

from .key import CACHE_FORMAT, cache_key, entry_name
from .store import ArchiveError, CacheDirError, DiskCache, Entry

__all__ = ["CACHE_FORMAT", "cache_key", "entry_name", "ArchiveError", "CacheDirError", "DiskCache", "Entry"]
