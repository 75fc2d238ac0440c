"""Turn a candidate into launchable kernels on a GPU: NVRTC to a cubin, cuda.core to load it."""

from __future__ import annotations

from pathlib import Path

from kforge.core.candidate import Candidate
from kforge.runtime.cubin import KernelModule
from kforge.runtime.nvrtc import Compiler, CompileResult, check_options


def default_cache_dir() -> Path:
    from kforge.runtime.cache import cache_dir

    return cache_dir() / "nvrtc"


class NvrtcLoader:
    """Compiles for one architecture and loads on one device."""

    def __init__(self, device_index: int, arch: str, compiler: Compiler | None = None) -> None:
        self.device_index = device_index
        self.arch = arch
        self.compiler = compiler or Compiler(default_cache_dir())

    def compile(self, candidate: Candidate) -> CompileResult:
        options = candidate.meta.get("nvrtc_options") or []
        try:
            if not isinstance(options, list):
                raise ValueError(f"nvrtc_options must be a list, got {options!r}")
            options = check_options([str(o) for o in options])
        except ValueError as exc:
            return CompileResult(ok=False, arch=self.arch, log=str(exc))
        return self.compiler.compile(candidate.source, self.arch, options)

    def load(self, compiled: CompileResult) -> KernelModule:
        return KernelModule(compiled.cubin, self.device_index)
