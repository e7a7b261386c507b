"""A variant: one spec with every compile-time value fixed, for one target arch.

It is the single named structure the cache key is built from: spec, template (the spec's template name
with its placeholders expanded for this variant, + the hash of that file and everything it includes),
params, tunables, arch, NVRTC version, options, package version and cache format.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any, Mapping

from . import compile as _compile
from . import render as _render
from .cache.key import CACHE_FORMAT, cache_key, entry_name
from .cache.store import Built
from .spec import Spec
from .version import __version__


@dataclasses.dataclass(frozen=True)
class Variant:
    spec: Spec
    params: tuple[tuple[str, Any], ...]
    tunables: tuple[tuple[str, Any], ...]
    arch: str

    @staticmethod
    def make(spec: Spec, params: Mapping[str, Any], tunables: Mapping[str, Any], arch: str) -> "Variant":
        """Validated constructor: params/tunables must be allowed and satisfy the constraints."""
        spec.check_params(params)
        _compile.check_arch(arch)
        bad = spec.violations(params, tunables)
        if bad:
            raise ValueError(f"spec {spec.name}: tunables {dict(tunables)} invalid for {dict(params)}: {'; '.join(bad)}")
        return Variant(
            spec,
            tuple((n, params[n]) for n in spec.param_names),
            tuple((n, tunables[n]) for n in spec.tunable_names),
            arch,
        )

    @functools.cached_property
    def values(self) -> dict[str, Any]:
        """params + tunables + derived + arch number: the template context."""
        values = self.spec.variant_values(dict(self.params), dict(self.tunables))
        values["arch"] = _compile.check_arch(self.arch)[0]
        values["kernel_name"] = self.spec.kernel_name
        values["args"] = list(self.spec.args)
        return values

    @functools.cached_property
    def template(self) -> str:
        """This variant's template file: the spec's template name, placeholders (``gdn_{form}.cu.j2``) expanded."""
        return self.spec.template_for({**dict(self.params), **dict(self.tunables)})

    @functools.cached_property
    def key_fields(self) -> dict[str, Any]:
        return {
            "format": CACHE_FORMAT,
            "gdnjit_version": __version__,
            "spec": self.spec.name,
            "template": self.template,
            "template_hash": _render.template_hash(self.template),
            "kernel_name": self.spec.kernel_name,
            "args": [list(a) for a in self.spec.args],
            # every value the template sees (derived ones included: editing a derived expression
            # in the YAML changes the binary, so it must change the key)
            "values": {k: v for k, v in self.values.items() if k != "args"},
            "params": dict(self.params),
            "tunables": dict(self.tunables),
            "arch": self.arch,
            "nvrtc_version": _compile.nvrtc_version(),
            "options": list(_compile.options_for(self.arch)),
        }

    @functools.cached_property
    def key(self) -> str:
        return cache_key(self.key_fields)

    @property
    def slug(self) -> str:
        """Readable prefix of the entry name: spec, arch, param values, true flags, tunable values."""
        vals = [str(v) for _, v in self.params if not isinstance(v, bool)]
        flags = [n for n, v in self.params if v is True]
        tun = [str(v) for _, v in self.tunables]
        return "-".join([self.spec.name, self.arch, ".".join(vals), ".".join(flags), ".".join(tun)])

    @property
    def name(self) -> str:
        """The cache entry name: readable slug + key prefix."""
        return entry_name(self.slug, self.key)

    def describe(self) -> str:
        p = ", ".join(f"{n}={v}" for n, v in self.params)
        t = ", ".join(f"{n}={v}" for n, v in self.tunables)
        return f"{self.spec.name}[{self.arch}]({p}; {t})"

    def source(self) -> str:
        return _render.render(self.template, self.values)

    def build(self) -> Built:
        """Render and compile; the cache's build callback."""
        src = self.source()
        res = _compile.compile_cubin(src, self.arch, self.spec.kernel_name)
        meta = {
            "variant": self.describe(),
            "registers": res.registers,
            "spill_bytes": res.spill_bytes,
            "stack_bytes": res.stack_bytes,
            "smem_bytes": res.smem_bytes,
            "compile_s": round(res.compile_s, 4),
            "source_sha256": hashlib.sha256(src.encode()).hexdigest(),
            "warnings": _compile.warnings_in(res.log),
        }
        return Built(res.cubin, meta, src)
