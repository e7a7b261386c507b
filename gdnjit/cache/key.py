"""Cache keys: sha256 of a canonical encoding of one named structure of key fields.

The fields are built in one place (:func:`gdnjit.variant.Variant.key_fields`) and hashed here;
never positional tuples, so no field can silently drop out of the key.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Mapping

CACHE_FORMAT = 1  # bump when the entry layout or key encoding changes

REQUIRED_FIELDS = frozenset(
    {"format", "gdnjit_version", "spec", "template", "template_hash", "kernel_name", "params",
     "tunables", "arch", "nvrtc_version", "options", "args", "values"}
)


def canonical(fields: Mapping[str, Any]) -> str:
    """Deterministic JSON text of the key fields (sorted keys, no whitespace, type-exact)."""
    missing = REQUIRED_FIELDS - set(fields)
    if missing:
        raise ValueError(f"key fields: missing {sorted(missing)}")

    def tag(v: Any) -> Any:
        # bool/int/float/str must not collide (True vs 1 vs 1.0 vs "1"): tag each scalar with its type.
        # the scalars first: a typing.Mapping check costs ~3 us, and a key holds ~250 values
        if v is None or isinstance(v, (bool, int, float, str)):
            return [type(v).__name__, v]
        if isinstance(v, (dict, Mapping)):
            return {str(k): tag(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [tag(x) for x in v]
        raise TypeError(f"key fields: unsupported value {v!r} of type {type(v).__name__}")

    return json.dumps(tag(dict(fields)), sort_keys=True, separators=(",", ":"))


def cache_key(fields: Mapping[str, Any]) -> str:
    """sha256 hex digest of the canonical key fields."""
    return hashlib.sha256(canonical(fields).encode()).hexdigest()


def entry_name(slug: str, key: str) -> str:
    """File stem of an entry: a readable slug, then 32 hex digits of the key."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", slug).strip("-")[:80] or "entry"
    return f"{safe}-{key[:32]}"
