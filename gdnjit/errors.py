"""Exception types raised by gdnjit (all subclasses of the built-in type a caller would expect)."""

from __future__ import annotations


class SpecError(ValueError):
    """A kernel spec or shapes file is invalid. The message names the file, line, key and reason."""

    def __init__(self, file: str, key: str, reason: str, line: int | None = None):
        self.file, self.key, self.reason, self.line = file, key, reason, line
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {key}: {reason}")


class DtypeError(TypeError, ValueError):
    """A tensor argument has the wrong dtype. A TypeError, and a ValueError too: FlashInfer reports the same mistakes
    with assertion or value errors, and callers written against it catch ValueError."""


class ContractError(ValueError, AssertionError):
    """A call breaks a contract FlashInfer checks with an assertion (a cursor out of its legal range, a cursor
    tensor an in-place commit cannot update). A ValueError, and an AssertionError too, so that callers written
    against FlashInfer catch it as they do there."""


class CompileError(RuntimeError):
    """NVRTC rejected a rendered source. Carries the log, options, variant and numbered source."""

    def __init__(self, variant: str, options: list[str], log: str, source: str):
        self.variant, self.options, self.log, self.source = variant, options, log, source
        super().__init__(
            f"NVRTC failed to compile variant {variant}\noptions: {' '.join(options)}\nlog:\n{log}\n"
            f"(the numbered source is in .dump())"
        )

    def dump(self) -> str:
        """The rendered source with line numbers, the options and the NVRTC log."""
        lines = "\n".join(f"{i + 1:5d}  {line}" for i, line in enumerate(self.source.splitlines()))
        return f"// variant: {self.variant}\n// options: {' '.join(self.options)}\n{lines}\n// log:\n{self.log}"


class CacheMissError(RuntimeError):
    """JIT is disabled (``GDNJIT_DISABLE_JIT=1``) and the requested variant is not in any cache."""


class LockTimeoutError(TimeoutError):
    """Waiting for a compile lock took longer than the configured timeout."""


class CudaError(RuntimeError):
    """A CUDA driver call failed."""
