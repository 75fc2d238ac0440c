"""Run a candidate's launch plan for one exact op variant: allocate its outputs and scratch, launch
its kernels with parameters packed once, return what the op returns.

This is the only host code a candidate ever gets: the evaluator, ``kforge.patch`` and exported
packages all call kernels through it. The plan was resolved to constants for the variant
(``kforge.core.launch_plan``); per call only pointers change, and the one per-call decision is the
aligned or unaligned kernel of a launch that declares ``align``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from kforge.core.argspec import bind, decode, resolve_op
from kforge.core.launch_plan import (
    ArgValue,
    DeviceLimits,
    PlanError,
    Pointer,
    ResolvedLaunch,
    ResolvedPlan,
    Scalar,
    TensorMeta,
    parse_plan,
    resolve,
)

_NUMPY = {"i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64,
          "f32": np.float32, "f64": np.float64, "bool": np.bool_}
# A null pointer: an optional tensor argument that is None.
NULL = np.uint64(0)


class KernelLauncher(Protocol):
    """Compiled kernels on one device: a cubin loaded with cuda.core (``KernelModule``), or a
    stand-in in tests. ``params`` holds tensors (passed as their data pointers) and numpy
    scalars of the kernel's parameter widths."""

    def launch(self, name: str, grid: tuple[int, ...], block: tuple[int, ...], shared_mem: int,
               params: Sequence[Any]) -> None: ...

    def has_kernel(self, name: str) -> bool: ...

    def param_widths(self, name: str) -> list[int] | None: ...


def arg_value(spec: Any) -> ArgValue:
    """A bound argument's arg spec as the plan interpreter sees it: tensors as ``TensorMeta``,
    lists as tuples, dtypes, devices, layouts and memory formats by name."""

    def tensor(spec: dict) -> TensorMeta:
        if "stride" not in spec:
            raise PlanError("", f"a tensor of layout {spec.get('layout')} cannot be described "
                                "to a launch plan")
        return TensorMeta(tuple(spec["shape"]), tuple(spec["stride"]), spec["dtype"],
                          int(spec.get("offset", 0)))

    def named(kind: str, name: Any) -> str:
        if kind not in ("dtype", "device", "layout", "memory_format"):
            raise PlanError("", f"an argument of kind {kind!r} cannot be described to a launch plan")
        return str(name)

    return decode(spec, tensor, make_named=named)


def resolve_for(plan: Mapping[str, Any] | None, op: str, args_spec: list, kwargs_spec: dict,
                limits: DeviceLimits = DeviceLimits()) -> ResolvedPlan:
    """The candidate ``plan`` resolved for one exact variant of ``op``. PlanError (with the field
    at fault) when it is malformed, PlanNotApplicable when it does not cover the variant."""
    if plan is None:
        raise PlanError("plan", "the candidate has no launch plan (a kernel searched by a kforge "
                                "that still ran Python launchers: search its op again)")
    bound = {name: arg_value(spec) for name, spec in bind(op, args_spec, kwargs_spec).items()}
    return resolve(parse_plan(plan), bound, limits)


@dataclass(frozen=True)
class _Slot:
    """Where a tensor argument is in a call: by position, else by keyword."""

    position: int
    name: str
    index: int | None

    def get(self, args: tuple, kwargs: dict) -> Any:
        value = args[self.position] if self.position < len(args) else kwargs.get(self.name)
        if self.index is not None and value is not None:
            value = value[self.index]
        return value


@dataclass(slots=True)
class Allocation:
    """One call's fresh memory: the plan's new outputs (None where the op returns an argument)
    and its scratch buffers."""

    outputs: list[torch.Tensor | None]
    scratch: list[torch.Tensor]


@dataclass
class _Step:
    """One launch of the plan: a getter per parameter (the generic path), and, where the backend
    can pack parameters once (``prepare``), its prepared launches by kernel name with the getters
    of the pointers alone."""

    launch: ResolvedLaunch
    getters: list[Callable[..., Any]]
    pointers: list[Callable[..., Any]]
    prepared: dict[str, Any] | None


class PlanRunner:
    """A resolved plan bound to an op's schema and a backend on one device."""

    def __init__(self, plan: ResolvedPlan, op: str, backend: KernelLauncher,
                 device: torch.device) -> None:
        self.plan = plan
        self.backend = backend
        self.device = device
        schema = resolve_op(op)._schema
        positions = {a.name: i for i, a in enumerate(schema.arguments)}
        outputs = {o.name: i for i, o in enumerate(plan.outputs)}
        scratch = {s.name: i for i, s in enumerate(plan.scratch)}

        def slot(name: str, index: int | None = None) -> _Slot:
            if name not in positions:
                raise PlanError("plan", f"{op} has no argument named {name!r}")
            return _Slot(positions[name], name, index)

        self._returned_args = {i: slot(o.arg) for i, o in enumerate(plan.outputs)
                               if o.kind == "arg"}
        self._new_outputs = [(i, o.shape, o.stride, getattr(torch, o.dtype))
                             for i, o in enumerate(plan.outputs) if o.kind == "new"]
        self._steps: list[_Step] = []
        prepare = getattr(backend, "prepare", None)
        for launch in plan.launches:
            getters: list[Callable[..., Any]] = []
            template: list[Any] = []  # the scalars, packed once; None where a pointer goes
            for param in launch.params:
                if isinstance(param, Scalar):
                    value = _NUMPY[param.ctype](param.value)
                    getters.append(_constant(value))
                    template.append(value)
                    continue
                if param.source == "output":
                    output = plan.outputs[outputs[param.name]]
                    getters.append(_argument(slot(output.arg)) if output.kind == "arg"
                                   else _output(outputs[param.name]))
                elif param.source == "scratch":
                    getters.append(_scratch(scratch[param.name]))
                else:
                    getters.append(_argument(slot(param.name, param.index)))
                template.append(None)
            pointers = [g for g, t in zip(getters, template) if t is None]
            prepared = None
            if prepare is not None:
                names = filter(None, (launch.kernel, launch.unaligned_kernel))
                prepared = {name: prepare(name, launch.grid, launch.block, launch.shared_mem,
                                          template) for name in names}
                if None in prepared.values():
                    prepared = None
            self._steps.append(_Step(launch, getters, pointers, prepared))

    @property
    def direct(self) -> bool:
        """Whether every launch goes straight to the driver with parameters packed once."""
        return all(step.prepared is not None for step in self._steps)

    def allocate(self, empty: Callable[..., torch.Tensor] = torch.empty_strided) -> Allocation:
        """One call's fresh outputs, then scratch, each made by ``empty(shape, stride, dtype=,
        device=)`` (the evaluator's puts fences around them)."""
        outputs: list[torch.Tensor | None] = [None] * len(self.plan.outputs)
        device = self.device
        for i, shape, stride, dtype in self._new_outputs:
            outputs[i] = empty(shape, stride, dtype=dtype, device=device)
        if not self.plan.scratch:
            return Allocation(outputs, [])
        scratch = []
        for spec in self.plan.scratch:
            buffer = empty((max(spec.nbytes, 1),), (1,), dtype=torch.uint8, device=device)
            if spec.zero:
                buffer.zero_()
            scratch.append(buffer)
        return Allocation(outputs, scratch)

    def launch(self, args: tuple, kwargs: dict, memory: Allocation) -> Any:
        """Run every launch of the plan on ``memory``; return what the op returns."""
        for step in self._steps:
            launch = step.launch
            if step.prepared is not None:
                values = []
                for get in step.pointers:
                    p = get(args, kwargs, memory)
                    values.append(0 if p is NULL else p.data_ptr())
                name = launch.kernel
                if launch.align and any(v % launch.align for v in values):
                    name = launch.unaligned_kernel or name
                try:
                    step.prepared[name](values)
                    continue
                except RuntimeError:  # refused before it ran: the generic path says why
                    step.prepared = None
            params = [get(args, kwargs, memory) for get in step.getters]
            name = launch.kernel
            if launch.align and not _aligned(params, launch.align):
                name = launch.unaligned_kernel or name
            self.backend.launch(name, launch.grid, launch.block, launch.shared_mem, params)
        results = [self._returned_args[i].get(args, kwargs) if out is None else out
                   for i, out in enumerate(memory.outputs)]
        if self.plan.returns == "single":
            return results[0]
        return results if self.plan.returns == "list" else tuple(results)

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        return self.launch(args, kwargs, self.allocate())


def _aligned(params: list[Any], align: int) -> bool:
    return all(p.data_ptr() % align == 0 for p in params if isinstance(p, torch.Tensor))


def _constant(value: Any) -> Callable[..., Any]:
    return lambda args, kwargs, memory: value


def _output(index: int) -> Callable[..., Any]:
    return lambda args, kwargs, memory: memory.outputs[index]


def _scratch(index: int) -> Callable[..., Any]:
    return lambda args, kwargs, memory: memory.scratch[index]


def _argument(slot: _Slot) -> Callable[..., Any]:
    def get(args: tuple, kwargs: dict, memory: Allocation) -> Any:
        value = slot.get(args, kwargs)
        return NULL if value is None else value

    return get


def check_kernels(plan: ResolvedPlan, has_kernel: Callable[[str], bool],
                  known: Sequence[str]) -> None:
    """PlanError when the plan launches a kernel the compiled source does not define (``known``:
    the kernels the compiler reported, for the message)."""
    missing = [k for k in plan.kernel_names() if not has_kernel(k)]
    if missing:
        raise PlanError("launches", f"no kernel named {missing[0]!r} in the source (declare it "
                                    f"extern \"C\" __global__); kernels found: "
                                    f"{', '.join(known) or 'none'}")


def check_widths(plan: ResolvedPlan, widths: Callable[[str], list[int] | None]) -> None:
    """PlanError when a launch passes more or fewer parameters, or other widths, than its
    kernel declares (``widths(name)`` gives a kernel's parameter widths in bytes, or None
    where the driver cannot list them)."""
    for i, launch in enumerate(plan.launches):
        mine = [8 if isinstance(p, Pointer) else np.dtype(_NUMPY[p.ctype]).itemsize
                for p in launch.params]
        for name in filter(None, (launch.kernel, launch.unaligned_kernel)):
            theirs = widths(name)
            if theirs is None:
                continue
            if len(theirs) != len(mine):
                raise PlanError(f"launches[{i}].params", f"{name} takes {len(theirs)} "
                                f"parameters, the plan passes {len(mine)}")
            for j, (want, have) in enumerate(zip(theirs, mine)):
                if want != have:
                    raise PlanError(f"launches[{i}].params[{j}]", f"parameter {j} of {name} is "
                                    f"{want} bytes wide in the kernel, the plan passes {have}")
