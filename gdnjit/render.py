"""Jinja rendering of CUDA C++ templates.

One Environment with a package loader and StrictUndefined: a variable the template uses but
the variant does not define is an error, never an empty string (FlashInfer's plain
``jinja2.Template`` lesson).
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Any, Mapping
from pathlib import Path

TEMPLATE_DIR = Path(__file__).parent / "templates"


@functools.lru_cache(maxsize=1)
def environment():
    """The Jinja environment, created on the first render: a process whose kernels are all cached (the cache
    key reads the template files directly) never imports Jinja."""
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


# Codes of the storage dtypes in the prelude's DT<C> traits, and C spellings of index/arg types.
DTYPE_CODES = {"fp32": 0, "bf16": 1, "fp16": 2}
CTYPES = {"fp32": "float", "bf16": "u16", "fp16": "u16", "int32": "int", "int64": "long long",
          "ptr": "void*", "i64": "long long", "i32": "int", "f32": "float"}


class RenderError(ValueError):
    """A template failed to render (missing variable, syntax error)."""


def _path(name: str) -> Path | None:
    """The file of template ``name`` (a plain name inside the templates folder), or None."""
    p = TEMPLATE_DIR / name
    return p if "/" not in name and "\\" not in name and name not in ("", ".", "..") and p.is_file() else None


def template_exists(name: str) -> bool:
    return _path(name) is not None


def _source(name: str) -> str:
    p = _path(name)
    if p is None:
        raise RenderError(f"template {name}: no such file in {TEMPLATE_DIR}")
    return p.read_text()


# {% include / import / from / extends NAME ... %} outside {# comments #}: a regex, not Jinja's parser (which
# costs ~30 ms for the GDN templates, paid by the first call of a serving process through the cache key).
_COMMENT = re.compile(r"\{#.*?#\}", re.S)
_REFERENCE = re.compile(r"\{%[-+]?\s*(?:include|import|from|extends)\s+(\S+)")
_LITERAL = re.compile(r"""(['"])([^'"]+)\1\Z""")


def referenced_templates(name: str, src: str) -> list[str]:
    """The templates ``src`` includes, imports or extends, by name; RenderError for a name that is not a string
    literal (the cache key must see every file a variant's source comes from)."""
    out = []
    for ref in _REFERENCE.findall(_COMMENT.sub("", src)):
        m = _LITERAL.match(ref.rstrip("%}-").rstrip())
        if m is None:
            raise RenderError(f"template {name}: dynamic includes are not allowed (the cache key must see them): {ref}")
        out.append(m.group(2))
    return out


@functools.lru_cache(maxsize=None)
def template_hash(name: str) -> str:
    """sha256 over the template and every template it includes/imports, recursively."""
    seen: dict[str, str] = {}
    todo = [name]
    while todo:
        cur = todo.pop()
        if cur in seen:
            continue
        src = _source(cur)
        seen[cur] = src
        todo.extend(referenced_templates(cur, src))
    h = hashlib.sha256()
    for n in sorted(seen):
        h.update(n.encode() + b"\0" + seen[n].encode() + b"\0")
    return h.hexdigest()


def render(template: str, values: Mapping[str, Any]) -> str:
    """Render ``template`` with ``values`` (plus the ``ctype`` / ``dtc`` tables and ``template_name``, the file
    rendered, for the source's header); RenderError on failure."""
    import jinja2

    try:
        return environment().get_template(template).render(dict(values), ctype=CTYPES, dtc=DTYPE_CODES, template_name=template)
    except jinja2.UndefinedError as e:
        raise RenderError(f"template {template}: {e.message} (values: {sorted(values)})") from None
    except jinja2.TemplateError as e:
        raise RenderError(f"template {template}: {e}") from None
