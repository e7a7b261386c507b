"""On-disk cubin cache: keys (:mod:`.key`), the locked, atomic store (:mod:`.store`) and archives to ship a
cache (:mod:`.archive`)."""

from .archive import ArchiveError
from .key import CACHE_FORMAT, cache_key, entry_name
from .store import CacheDirError, CacheWriteError, DiskCache, Entry

__all__ = ["CACHE_FORMAT", "cache_key", "entry_name", "ArchiveError", "CacheDirError", "CacheWriteError", "DiskCache",
           "Entry"]
