"""Compare a candidate's results with eager PyTorch's: layout first, then values.

Values pass when, at once:
- NaN and +-inf sit at exactly the same positions (with the same sign), so NaN is no wildcard;
- every finite element is within ``atol * scale + rtol * |ref|``, where ``scale`` is the RMS of
  the reference, so the absolute slack follows the data's magnitude and an all-zeros output
  cannot pass on an op whose outputs are all small (bf16 softmax over 4096 columns);
- the relative error norm ``||out - ref|| / ||ref||`` is below a per-dtype bound, which catches
  arithmetic done at a lower precision than eager's even where each element looks close enough.

Integers and booleans must be equal, and so must the results of ops eager computes exactly
(bit for bit: -0.0 is not 0.0). The bounds are listed in ``docs/evaluation.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from kforge.core.outcome import Comparison, Tolerance

# A Tolerance's atol is in units of the reference's RMS; its norm bounds ||out - ref|| / ||ref||.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(rtol=1e-7, atol=1e-7, norm=1e-8),
    torch.float32: Tolerance(rtol=1e-4, atol=1e-4, norm=2e-5),
    torch.complex64: Tolerance(rtol=1e-4, atol=1e-4, norm=2e-5),
    torch.complex128: Tolerance(rtol=1e-7, atol=1e-7, norm=1e-8),
    torch.float16: Tolerance(rtol=1e-2, atol=1e-2, norm=2e-3),
    torch.bfloat16: Tolerance(rtol=1e-2, atol=1e-2, norm=8e-3),
}
# fp8 formats carry 2-3 mantissa bits: one rounding step apart is the best two kernels can agree.
LOW_PRECISION = Tolerance(rtol=1.3e-1, atol=1e-1, norm=6e-2)


def tolerance_for(dtype: torch.dtype) -> Tolerance | None:
    """None means exact equality (integers, booleans)."""
    if dtype in TOLERANCES:
        return TOLERANCES[dtype]
    if dtype.is_floating_point:
        return LOW_PRECISION
    return None


@dataclass(frozen=True)
class Meta:
    """What must match about a result tensor besides its values."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, t: torch.Tensor) -> Meta:
        return cls(tuple(t.shape), tuple(t.stride()), t.dtype, t.device)


def layout_problem(out: Meta, ref: Meta) -> str | None:
    """Why ``out`` is not laid out as eager's result, or None. Strides count only along
    dimensions longer than 1, as in PyTorch's own contiguity rules."""
    if out.device != ref.device:
        return f"is on {out.device}, eager's on {ref.device}"
    if out.dtype != ref.dtype:
        return f"has dtype {out.dtype}, eager's {ref.dtype}"
    if out.shape != ref.shape:
        return f"has shape {list(out.shape)}, eager's {list(ref.shape)}"
    if math.prod(out.shape) > 0:
        mine = [s for s, n in zip(out.stride, out.shape) if n > 1]
        theirs = [s for s, n in zip(ref.stride, ref.shape) if n > 1]
        if mine != theirs:
            return f"has strides {list(out.stride)}, eager's {list(ref.stride)}"
    return None


@dataclass(frozen=True)
class ValueReport:
    ok: bool
    reason: str = ""
    max_abs: float = 0.0
    rel_norm: float = 0.0
    bad: int = 0
    numel: int = 0
    # Whether closeness to a wider reference may still accept it: never for NaN or inf out of
    # place, unequal integers or bits where eager is exact.
    forgivable: bool = True
    # Where a failed comparison found fault (elements beyond tolerance, unequal, or with NaN or
    # inf misplaced), for a report of those elements; not part of the stored report.
    at_fault: torch.Tensor | None = field(default=None, compare=False, repr=False)

    def comparison(self) -> Comparison:
        """The report as an outcome keeps it."""
        return Comparison(self.ok, self.reason, _finite(self.max_abs), _finite(self.rel_norm),
                          self.bad, self.numel)


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def _where(mask: torch.Tensor, shape: torch.Size) -> str:
    """The index of the first True in ``mask`` (flat, shaped as ``shape``)."""
    flat = int(torch.nonzero(mask.reshape(-1))[0].item())
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return "[" + ", ".join(str(i) for i in reversed(index)) + "]"


def compare_values(out: torch.Tensor, ref: torch.Tensor,
                   tol: Tolerance | None = None, exact: bool = False) -> ValueReport:
    """Compare two tensors of one shape and dtype, element by element; where ``exact``, bit for
    bit (NaNs only by position: their payloads may differ)."""
    numel = ref.numel()
    if numel == 0:
        return ValueReport(True, numel=0)
    tol = tol if tol is not None else tolerance_for(ref.dtype)
    if exact and tol is not None:
        return compare_bits(out, ref)
    if tol is None:
        unequal = out != ref
        bad = int(unequal.sum().item())
        if bad:
            return ValueReport(False, f"{bad} of {numel} elements differ, first at "
                                      f"{_where(unequal, ref.shape)}", bad=bad, numel=numel,
                               forgivable=False, at_fault=unequal)
        return ValueReport(True, numel=numel)
    if ref.dtype.is_complex:
        out, ref = torch.view_as_real(out), torch.view_as_real(ref)
    o, r = out.double(), ref.double()
    for name, test in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        mismatch = test(o) != test(r)
        if bool(mismatch.any()):
            count = int(mismatch.sum().item())
            return ValueReport(False, f"{name} positions differ from eager's at {count} elements, "
                                      f"first at {_where(mismatch, r.shape)}",
                               bad=count, numel=numel, forgivable=False, at_fault=mismatch)
    finite = torch.isfinite(r)
    o = torch.where(finite, o, 0.0)
    r = torch.where(finite, r, 0.0)
    n_finite = max(int(finite.sum().item()), 1)
    ref_norm = float(torch.linalg.vector_norm(r).item())
    scale = ref_norm / math.sqrt(n_finite) or 1.0
    diff = (o - r).abs()
    max_abs = float(diff.max().item())
    err_norm = float(torch.linalg.vector_norm(diff).item())
    rel_norm = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else math.inf)
    over = diff > tol.atol * scale + tol.rtol * r.abs()
    bad = int(over.sum().item())
    if bad:
        return ValueReport(False, f"{bad} of {numel} elements beyond tolerance (max abs error "
                                  f"{max_abs:.3g}), first at {_where(over, r.shape)}",
                           max_abs, rel_norm, bad, numel, at_fault=over)
    if ref_norm > 0 and rel_norm > tol.norm:  # an all-zero reference has only the atol bound
        return ValueReport(False, f"relative error norm {rel_norm:.3g} is above {tol.norm:g} for "
                                  f"{ref.dtype} (lower precision than eager?)",
                           max_abs, rel_norm, 0, numel)
    return ValueReport(True, max_abs=max_abs, rel_norm=rel_norm, numel=numel)


def compare_bits(out: torch.Tensor, ref: torch.Tensor) -> ValueReport:
    """Floating tensors equal bit for bit (so -0.0 differs from 0.0), NaN payloads aside."""
    numel = ref.numel()
    o, r = (torch.view_as_real(t) if t.is_complex() else t for t in (out, ref))
    nan = torch.isnan(r)
    if bool((torch.isnan(o) != nan).any()):
        mismatch = torch.isnan(o) != nan
        count = int(mismatch.sum().item())
        return ValueReport(False, f"NaN positions differ from eager's at {count} elements, first "
                                  f"at {_where(mismatch, r.shape)}", bad=count, numel=numel,
                           forgivable=False, at_fault=mismatch)
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[r.element_size()]
    differ = (o.contiguous().view(bits) != r.contiguous().view(bits)) & ~nan
    bad = int(differ.sum().item())
    if bad:
        zeros = int((differ & (r == 0)).sum().item())
        diff = (o.double() - r.double()).abs()[differ]
        return ValueReport(False, f"{bad} of {numel} elements are not eager's bits (eager is "
                                  f"exact here; {zeros} of them a zero of the other sign), first "
                                  f"at {_where(differ, r.shape)}",
                           float(diff.max().item()), 0.0, bad, numel, forgivable=False,
                           at_fault=differ)
    return ValueReport(True, numel=numel)


def compare_structure(out: Any, ref: Any, where: str = "result") -> str | None:
    """Why the candidate's non-tensor result structure differs from eager's, or None. Tensors
    are compared elsewhere; here only their places in the structure."""
    if isinstance(ref, torch.Tensor):
        return None if isinstance(out, torch.Tensor) else (
            f"{where} is a {type(out).__name__}, eager returns a tensor")
    if isinstance(ref, (list, tuple)):
        if not isinstance(out, (list, tuple)) or len(out) != len(ref):
            return f"{where} is {_describe(out)}, eager returns {_describe(ref)}"
        for i, (o, r) in enumerate(zip(out, ref)):
            if problem := compare_structure(o, r, f"{where}[{i}]"):
                return problem
        return None
    if out != ref and not (isinstance(ref, float) and math.isnan(ref) and isinstance(out, float)
                           and math.isnan(out)):
        return f"{where} is {out!r}, eager returns {ref!r}"
    return None


def _describe(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"
