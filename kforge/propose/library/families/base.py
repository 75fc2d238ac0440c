"""What every kernel family provides, and the pieces they share to write candidates.

A family reads a card into a *problem* (or declines it), lists its *variants* for that problem
(algorithm choices, each with a parameter space), and *renders* one variant at one point of its
space into CUDA source and a launch plan. Sources are the shared helpers (``cuda/common.cuh``), the
family's templates (``cuda/<family>.cu``) and a generated tail of ``extern "C"`` wrappers that fix
every template argument; plans (``docs/launch-plan.md``) name the op's arguments by their schema
names and hold every size as a constant, since a candidate serves one exact op variant.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, ClassVar

from kforge.core.gpu import GpuInfo
from kforge.propose.library.cards import Call, Declined, TensorArg, require_float
from kforge.propose.library.space import Params, Space

# Where the GPU is unknown (CPU-only sessions, tests), size persistent grids for an H100/H200.
DEFAULT_SM_COUNT = 132

# Floats of static shared memory a block may hold: 48 KB, less room for reduction scratch.
SHARED_FLOATS = 12288 - 256


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
    """A rendered variant: the generated CUDA tail, the launch plan, and the NVRTC options it
    needs (``kforge.runtime.nvrtc``'s allow-list)."""

    source: str
    plan: dict
    nvrtc_options: tuple[str, ...] = ()


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
        """CUDA wrappers and launch plan for one variant at one point."""

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


def scalar_twin(name: str) -> str:
    """The kernel that does ``name``'s work one element per access, for misaligned pointers."""
    return f"{name}_scalar"


def kernel_names(name: str, vec: int) -> list[tuple[str, int]]:
    """The (name, vector width) of each kernel a candidate defines: the chosen width, and a
    scalar twin when that width is above one."""
    return [(name, vec)] + ([(scalar_twin(name), 1)] if vec > 1 else [])


@dataclass(frozen=True)
class Affine:
    """A norm's optional weight and bias (packed float tensors of one dtype) and their schema
    names (``bias_name`` None: the op takes no bias). The kernels take a pointer for each one
    present; the templates get a null pointer for each one absent."""

    weight: TensorArg | None
    bias: TensorArg | None
    weight_name: str
    bias_name: str | None

    @classmethod
    def read(cls, call: Call, weight_index: int, bias_index: int | None = None) -> Affine:
        """The weight and bias at these schema positions; Declined unless each is absent or a
        packed float tensor, both of one dtype."""
        weight = affine_tensor(call.value(weight_index), "weight")
        bias = None if bias_index is None else affine_tensor(call.value(bias_index), "bias")
        if weight is not None and bias is not None and weight.dtype != bias.dtype:
            raise Declined("weight and bias have different dtypes")
        return cls(weight, bias, call.arg_name(weight_index),
                   None if bias_index is None else call.arg_name(bias_index))

    @property
    def present(self) -> list[TensorArg]:
        return [t for t in (self.weight, self.bias) if t is not None]

    def ctype(self, x: TensorArg) -> str:
        """The C type of the weight and bias; ``x``'s where there are none."""
        return self.present[0].ctype if self.present else x.ctype

    def slots(self) -> list[tuple[str, str, TensorArg | None]]:
        """(kernel parameter, schema name, tensor or None) of the weight, and of the bias where
        the op takes one."""
        slots = [("w", self.weight_name, self.weight)]
        return slots + ([("b", self.bias_name, self.bias)] if self.bias_name else [])

    def c_params(self, ctype: str) -> list[str]:
        """Kernel parameters ``w`` and ``b``, for those present."""
        return [f"const {ctype}* __restrict__ {c}" for c, _, t in self.slots() if t is not None]

    def c_args(self) -> str:
        """Template call arguments: ``w`` and ``b``, or ``nullptr`` where absent."""
        return ", ".join(c if t is not None else "nullptr" for c, _, t in self.slots())

    def flags(self) -> str:
        """Template flags: whether each of weight and bias is present."""
        return ", ".join(cuda_bool(t is not None) for _, _, t in self.slots())

    def pointers(self) -> list[dict]:
        """Plan pointer parameters matching ``c_params``."""
        return [ptr(name) for _, name, t in self.slots() if t is not None]


def affine_tensor(value: Any, what: str) -> TensorArg | None:
    """An optional weight or bias argument; Declined unless absent or a packed float tensor."""
    if value is None:
        return None
    if not isinstance(value, TensorArg):
        raise Declined(f"{what} is not a tensor")
    require_float(value)
    if not value.is_contiguous:
        raise Declined(f"{what} is not contiguous")
    return value


def cuda_bool(flag: bool) -> str:
    return "true" if flag else "false"


def entry_points(name: str, vec: int, block: int, params_c: list[str],
                 call: Callable[[int], str], cluster: int = 1) -> str:
    """The ``extern "C"`` kernels a plan launches: one per name ``kernel_names`` gives (the
    vectorized kernel and its scalar twin), each a call of ``call(vector width)``; ``cluster``
    blocks along x per thread-block cluster, compiled in (``__cluster_dims__``).

    A plan launches the twin with its vector kernel's grid and block, so the twin must cover the
    same outputs: where the grid depends on the width, ``call`` keeps ``vec`` for the twin and
    only turns its packed accesses off (``PACKED`` false in the templates)."""
    clusters = f"__cluster_dims__({cluster}, 1, 1) " if cluster > 1 else ""
    return "\n".join(
        f'extern "C" __global__ void {clusters}__launch_bounds__({block}) {kernel}(\n    '
        + ", ".join(params_c) + ") {\n  " + call(v) + ";\n}\n"
        for kernel, v in kernel_names(name, vec))


# ----- launch plan pieces -----


def new_output(name: str, t: TensorArg) -> dict:
    """A plan output allocated with exactly the shape, strides and dtype of eager's ``t``."""
    return {"name": name, "shape": list(t.shape), "stride": list(t.stride), "dtype": t.dtype}


def ptr(name: str) -> dict:
    """A pointer parameter: an argument (by schema name), output or scratch buffer."""
    return {"ptr": name}


def i64(value: int | str) -> dict:
    return {"i64": value}


def f32(value: float | str) -> dict:
    """A float parameter: a constant, or an expression such as an argument's schema name."""
    return {"f32": value}


def launch(kernel: str, grid: int | tuple[int, ...], block: int, params: list[dict],
           vec: int = 1, itemsize: int = 0, *, shared_mem: int = 0, cluster: int = 1) -> dict:
    """A plan launch of ``kernel`` (as ``entry_points`` names it), with ``shared_mem`` bytes of
    dynamic shared memory and ``cluster`` blocks along x per cluster. A kernel reading ``vec``
    elements of ``itemsize`` bytes per access needs its pointers aligned for that; where one is
    not, its scalar twin runs instead."""
    entry = {"kernel": kernel, "grid": list(grid) if isinstance(grid, tuple) else [grid],
             "block": [block], "params": params}
    if cluster > 1:
        entry["cluster"] = [cluster]
    if shared_mem:
        entry["shared_mem"] = shared_mem
    if vec > 1:
        entry |= {"align": vec * itemsize, "unaligned_kernel": scalar_twin(kernel)}
    return entry
