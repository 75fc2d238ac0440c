"""What every kernel family provides, and the pieces they share to write candidates.

A family reads a card into a *problem* (or declines it), lists its *variants* for that problem
(algorithm choices, each with a parameter space), and *renders* one variant at one point of its
space into CUDA source and a launcher. Sources are the shared helpers (``cuda/common.cuh``), the
family's templates (``cuda/<family>.cu``) and a generated tail of ``extern "C"`` wrappers that fix
every template argument; launchers are generated Python in the candidate format.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, ClassVar

from kforge.core.gpu import GpuInfo
from kforge.propose.library.cards import Call, TensorArg
from kforge.propose.library.space import Params, Space

# Where the GPU is unknown (CPU-only sessions, tests), size persistent grids for an H100/H200.
DEFAULT_SM_COUNT = 132

# Floats of static shared memory a block may hold: 48 KB, less room for reduction scratch.
SHARED_FLOATS = 12288 - 256

# Prepended to every launcher: layout checks and the alignment test for vector access.
LAUNCHER_HELPERS = '''\
def _expect(t, what, dtype, shape, stride):
    """Refuse a tensor other than the kind this kernel was generated for."""
    if t.dtype != dtype or tuple(t.shape) != shape or any(
            n != 1 and s != want for n, s, want in zip(shape, t.stride(), stride)):
        raise ValueError(f"{what}: this kernel was generated for {dtype} {shape} strides {stride}, "
                         f"got {t.dtype} {tuple(t.shape)} strides {tuple(t.stride())}")


def _aligned(nbytes, *tensors):
    """Whether every tensor starts on an nbytes boundary, as vector access needs."""
    return all(t.data_ptr() % nbytes == 0 for t in tensors)

'''


@dataclass(frozen=True)
class Variant:
    """One algorithm of a family for one card: its space, or why it does not apply."""

    approach: str
    summary: str
    space: Space | None = None
    why_not: str = ""

    @property
    def available(self) -> bool:
        return self.space is not None


@dataclass(frozen=True)
class Kernel:
    """A rendered variant: the generated CUDA tail and the launcher body."""

    source: str
    launcher: str


class Family(ABC):
    """A group of ops sharing kernels (softmax, norms, elementwise, ...)."""

    name: ClassVar[str]
    ops: ClassVar[tuple[str, ...]]
    cuda_files: ClassVar[tuple[str, ...]]
    reference: ClassVar[str]  # the variant a repair falls back to: simplest, safest

    @abstractmethod
    def analyze(self, call: Call) -> Any:
        """The family's view of the call (sizes, strides, dtypes); raises Declined."""

    @abstractmethod
    def variants(self, problem: Any, gpu: GpuInfo) -> list[Variant]:
        """Every variant, the most promising first; unavailable ones say why."""

    @abstractmethod
    def render(self, problem: Any, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        """CUDA wrappers and launcher body for one variant at one point."""

    def source(self, kernel: Kernel) -> str:
        parts = [cuda_text("common.cuh"), *(cuda_text(f) for f in self.cuda_files), kernel.source]
        return "\n".join(parts)


@cache
def cuda_text(name: str) -> str:
    return resources.files("kforge.propose.library").joinpath("cuda", name).read_text()


def sm_count(gpu: GpuInfo) -> int:
    return gpu.sm_count or DEFAULT_SM_COUNT


def vec_options(itemsize: int, *counts: int) -> tuple[int, ...]:
    """Vector widths (elements) of at most 16 bytes that divide every count, so that each vector
    stays inside a row and starts aligned whenever the tensor itself is aligned."""
    return tuple(v for v in (1, 2, 4, 8) if v * itemsize <= 16 and all(c % v == 0 for c in counts))


def expect_line(var: str, what: str, t: TensorArg) -> str:
    return f"    _expect({var}, {what!r}, {t.torch_dtype}, {t.shape}, {t.stride})\n"


def alloc_line(var: str, t: TensorArg, like: str) -> str:
    return (f"    {var} = torch.empty_strided({t.shape}, {t.stride}, dtype={t.torch_dtype}, "
            f"device={like}.device)\n")


def choose_kernels(vec: int, itemsize: int, tensors: list[str], kernels: dict[str, str]) -> str:
    """Launcher text binding each variable of ``kernels`` ({variable: kernel name}) to the vector
    kernel when every tensor is aligned for ``vec`` elements of ``itemsize`` bytes, else to its
    scalar twin."""
    if vec == 1:
        return "".join(f"    {var} = kernels.{name}\n" for var, name in kernels.items())
    lines = [f"    vector = _aligned({vec * itemsize}, {', '.join(tensors)})\n"]
    lines += [f"    {var} = kernels.{name} if vector else kernels.{name}_scalar\n"
              for var, name in kernels.items()]
    return "".join(lines)


def kernel_names(name: str, vec: int) -> list[tuple[str, int]]:
    """The (name, vector width) of each kernel a candidate defines: the chosen width, and a
    scalar fallback when that width is above one."""
    return [(name, vec)] + ([(f"{name}_scalar", 1)] if vec > 1 else [])


def cuda_bool(flag: bool) -> str:
    return "true" if flag else "false"


def entry_points(family: str, vec: int, block: int, params_c: list[str],
                 call: Callable[[int], str]) -> str:
    """The ``extern "C"`` kernels a launcher calls: one per name ``kernel_names`` gives (the
    vectorized kernel and its scalar twin), each a call of ``call(vector width)``."""
    return "\n".join(
        f'extern "C" __global__ void __launch_bounds__({block}) {name}(\n    '
        + ", ".join(params_c) + ") {\n  " + call(v) + ";\n}\n"
        for name, v in kernel_names(family, vec))
