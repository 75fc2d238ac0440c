"""Precision against a higher-precision reference: is a candidate's arithmetic as precise as
eager's?

Comparing a candidate with eager only bounds their difference, so a kernel that rounds an operand
or its intermediates to a lower precision can stay inside the tolerances. Here the op runs once
more on the same inputs upcast (floating tensors, and dtype arguments naming a floating dtype, to
float64; to float32 for 16-bit inputs where the op has no float64 kernel on the device; integer
and bool tensors unchanged; ``half_to_float`` switched off since the reference is wider anyway),
and the candidate's error against that reference must stay close to eager's own error.

Errors are taken over the elements where both the reference and eager are finite, relative to
the reference's RMS ``s``:

- ``norm``: ``||x - ref|| / ||ref||``;
- ``max``:  ``max |x - ref| / s``.

Rule, for each: ``candidate error <= K * eager error + floor``.

| output dtype        | K    | floor (norm) | floor (max)                                  |
|---------------------|------|--------------|----------------------------------------------|
| float32, complex64  | 64   | eps / 64     | 2 ulp of the dtype at the largest reference  |
| float16, bfloat16   | 1.1  | eps / 64     | 2 ulp of the dtype at the largest reference  |
| float8 formats      | 1.1  | eps / 64     | 2 ulp of the dtype at the largest reference  |

(``eps`` is the output dtype's machine epsilon; floors are in the same units as the errors,
relative to the reference's RMS.)

Why these multiples (measured on CPU against float64, rows of 16 to 4096 elements; an H200
gave the same 1.00 for an honest bf16 softmax against its own eager):

- 16-bit outputs: honest kernels compute in fp32 and round once, as eager does, so their error
  is eager's to within 1% (ratio 1.00 for softmax and layer norm with any reduction order,
  sequential included). Rounding one intermediate to the output type is a ratio of 1.07 to 1.5,
  largest where many elements are alike (softmax, exp stored in bf16: 1.41 on logits of spread
  0.3, 1.37 at 1, 1.20 at 2, 1.07 at 3; the reciprocal of the sum in bf16 1.1-1.5; silu's sigmoid
  in bf16 1.15-1.48; layer norm's rstd or centred values in bf16 1.26-1.46); every step in bf16
  1.2-2.9; bf16 accumulation 30-1000. 1.1 leaves room for fp32 approximations up to about 0.1 ulp
  rms of the output (a tanh approximation with 2^-11 relative error is 1.01 in bf16; it is 1.5
  in fp16, beyond any bound that separates rounded intermediates).
- fp32 outputs: honest kernels differ from eager by their reduction order: 0.4-1.3 for tree and
  strided reductions, up to 14 for a sequential sum over 4096 elements or a sequential Welford
  pass. One operand rounded to bf16, fp16 or tf32 is 3000 to 130000.
- floors: ``eps / 64`` of the norm only matters where eager is exact (relu, copies, max): an
  honest kernel is exact there too. The max floor allows 2 ulp on the largest element.

Judge on captured samples and random sets. Stress sets are ill-conditioned on purpose (zero
variance, a mean 50 to 1000 times the spread): there honest reduction orders differ from eager
by more than these multiples, and ``kforge.eval.verify.compare``'s tolerances are the check.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kforge.errors import KforgeError

HALF_PRECISION_K = 1.1
SINGLE_PRECISION_K = 64.0
NORM_FLOOR_ULPS = 1 / 64
MAX_FLOOR_ULPS = 2.0
# Flags that ask for a wider output than the input; the reference is wider anyway.
WIDENING_FLAGS = ("half_to_float",)


def multiple_for(dtype: torch.dtype) -> float:
    """K of the rule for results of ``dtype``."""
    if dtype.is_floating_point and dtype.itemsize <= 2:
        return HALF_PRECISION_K
    return SINGLE_PRECISION_K


# ----- the reference -----


def wider(dtype: torch.dtype, target: torch.dtype) -> torch.dtype:
    """``dtype`` as upcast to ``target`` (float64 or float32), complex staying complex."""
    if dtype.is_complex:
        return torch.complex128 if target == torch.float64 else torch.complex64
    return target if dtype.is_floating_point else dtype


def precision_of(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def floating_dtypes(value: Any) -> list[torch.dtype]:
    """Floating and complex dtypes of the tensors and dtype arguments in ``value``."""
    if isinstance(value, torch.dtype):
        return [value] if value.is_floating_point or value.is_complex else []
    if isinstance(value, (list, tuple)):
        return [d for item in value for d in floating_dtypes(item)]
    if isinstance(value, dict):
        return [d for item in value.values() for d in floating_dtypes(item)]
    if isinstance(value, torch.Tensor):
        return [value.dtype] if value.is_floating_point() or value.is_complex() else []
    return []


def upcast(value: Any, target: torch.dtype) -> Any:
    """``value`` with floating tensors and dtypes upcast; every tensor copied, so an op that
    writes its arguments leaves the caller's alone."""
    if isinstance(value, torch.Tensor):
        return value.to(wider(value.dtype, target), copy=True)
    if isinstance(value, torch.dtype):
        return wider(value, target)
    if isinstance(value, tuple):
        return tuple(upcast(v, target) for v in value)
    if isinstance(value, list):
        return [upcast(v, target) for v in value]
    return value


def argument_names(op: Callable[..., Any], count: int) -> list[str | None]:
    schema = getattr(op, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    return (names + [None] * count)[:count]


def upcast_call(op: Callable[..., Any], args: tuple | list, kwargs: dict,
                target: torch.dtype) -> Any:
    names = argument_names(op, len(args))
    wide_args = [False if name in WIDENING_FLAGS else upcast(a, target)
                 for a, name in zip(args, names)]
    wide_kwargs = {k: False if k in WIDENING_FLAGS else upcast(v, target)
                   for k, v in kwargs.items()}
    return op(*wide_args, **wide_kwargs)


def precision_reference(op: Callable[..., Any], args: tuple | list, kwargs: dict) -> Any:
    """``op``'s result on ``args`` upcast (float64, or float32 for 16-bit inputs where float64
    fails), shaped like the op's result; None when nothing can be upcast (integer-only ops,
    float64 inputs) or the op runs at no wider precision."""
    found = floating_dtypes([args, kwargs])
    if not found:
        return None
    targets = []
    if any(precision_of(d) > precision_of(torch.float64) for d in found):
        targets.append(torch.float64)
    if all(precision_of(d) > precision_of(torch.float32) for d in found):
        targets.append(torch.float32)  # 16-bit inputs only
    for target in targets:
        try:
            return upcast_call(op, args, kwargs, target)
        except (RuntimeError, TypeError, ValueError):  # no kernel for that dtype here
            continue
    return None


# ----- judging -----


@dataclass(frozen=True)
class PrecisionReport:
    ok: bool
    candidate_error: float = 0.0  # ||x - ref|| / ||ref||
    eager_error: float = 0.0
    bound: float = 0.0
    reason: str = ""
    candidate_max_error: float = 0.0  # max |x - ref| / RMS(ref)
    eager_max_error: float = 0.0
    max_bound: float = 0.0

    def to_dict(self) -> dict:
        return {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v))
                for k, v in self.__dict__.items()}


def ulp(value: float, dtype: torch.dtype) -> float:
    """The spacing of ``dtype`` at ``value`` (its smallest normal's spacing below that)."""
    info = torch.finfo(dtype)
    scale = max(abs(value), info.smallest_normal)
    return info.eps * 2.0 ** math.floor(math.log2(scale))


def relative_errors(x: torch.Tensor, reference: torch.Tensor,
                    judged: torch.Tensor) -> tuple[float, float]:
    """``x``'s (norm, max) errors against ``reference`` over the ``judged`` elements, relative to
    the reference's RMS there (both as float64 real tensors)."""
    ref, x = reference[judged], x[judged]
    count = ref.numel()
    scale = float(torch.linalg.vector_norm(ref).item()) / math.sqrt(count) or 1.0
    diff = (x - ref).abs()
    return (float(torch.linalg.vector_norm(diff).item()) / (scale * math.sqrt(count)),
            float(diff.max().item()) / scale)


def judged_elements(eager_out: torch.Tensor, reference: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Eager's result and the reference as float64 reals, and where both are finite; None where
    the rule judges nothing (an exact dtype, a reference no wider than eager's result)."""
    dtype = eager_out.dtype
    if not (dtype.is_floating_point or dtype.is_complex):
        return None
    if precision_of(reference.dtype) >= precision_of(dtype):
        return None
    eager, ref = (as_real(t).double() for t in (eager_out, reference))
    return eager, ref, torch.isfinite(ref) & torch.isfinite(eager)


def eager_errors(eager_out: torch.Tensor, reference: torch.Tensor) -> tuple[float, float] | None:
    """Eager's own (norm, max) errors against ``reference``, as ``judge_precision`` takes them;
    None where nothing is judged."""
    found = judged_elements(eager_out, reference)
    if found is None or not bool(found[2].any()):
        return None
    eager, ref, judged = found
    return relative_errors(eager, ref, judged)


def judge_precision(candidate_out: torch.Tensor, eager_out: torch.Tensor,
                    reference: torch.Tensor, leeway: float = 1.0,
                    typical: tuple[float, float] | None = None) -> PrecisionReport:
    """Whether the candidate's error against ``reference`` is within the rule's bound of
    eager's (the multiple K times ``leeway``). Exact dtypes (integers, booleans) and references
    no wider than eager's result are not judged (ok).

    ``typical``: eager's (norm, max) errors over other inputs of the same kind, for a result of
    few elements: there eager's error on one call is one draw of a noisy figure, which an equally
    honest summation order exceeds 64-fold about once in a hundred calls. The rule then holds
    the candidate to the larger of eager's error here and its typical error."""
    if not (candidate_out.shape == eager_out.shape == reference.shape):
        raise KforgeError(f"precision needs results of one shape: candidate "
                          f"{list(candidate_out.shape)}, eager {list(eager_out.shape)}, "
                          f"reference {list(reference.shape)}")
    dtype = eager_out.dtype
    found = judged_elements(eager_out, reference)
    if found is None:
        why = (f"{name(dtype)} is exact" if not (dtype.is_floating_point or dtype.is_complex)
               else f"the reference ({name(reference.dtype)}) is no wider than {name(dtype)}")
        return PrecisionReport(True, reason=f"precision not judged: {why}")
    eager, ref, judged = found
    count = int(judged.sum().item())
    if count == 0:
        return PrecisionReport(True, reason="precision not judged: no finite element")
    cand = as_real(candidate_out).double()
    if not bool(torch.isfinite(cand[judged]).all()):
        bad = int((~torch.isfinite(cand[judged])).sum().item())
        return PrecisionReport(False, math.inf, reason=f"precision: the candidate is not finite "
                               f"at {bad} elements where eager and the reference are")
    cand_norm, cand_max = relative_errors(cand, ref, judged)
    eager_norm, eager_max = relative_errors(eager, ref, judged)
    usual_norm, usual_max = typical or (0.0, 0.0)
    held_norm, held_max = max(eager_norm, usual_norm), max(eager_max, usual_max)
    real = real_dtype(dtype)
    k = multiple_for(real) * leeway
    bound = k * held_norm + NORM_FLOOR_ULPS * torch.finfo(real).eps
    ref = ref[judged]
    scale = float(torch.linalg.vector_norm(ref).item()) / math.sqrt(count) or 1.0
    largest = float(ref.abs().max().item())
    max_bound = k * held_max + MAX_FLOOR_ULPS * ulp(largest, real) / scale
    report = {"candidate_error": cand_norm, "eager_error": eager_norm, "bound": bound,
              "candidate_max_error": cand_max, "eager_max_error": eager_max,
              "max_bound": max_bound}

    def eager_figure(own: float, usual: float) -> str:
        return f"{own:.3g}" + (f" (typically {usual:.3g})" if usual > own else "")

    if cand_norm > bound:
        return PrecisionReport(False, reason=(
            f"precision: relative error norm {cand_norm:.3g} against a {name(reference.dtype)} "
            f"reference is above {k:g} x eager's {eager_figure(eager_norm, usual_norm)} + floor "
            f"= {bound:.3g} for {name(dtype)} (arithmetic below eager's precision?)"), **report)
    if cand_max > max_bound:
        return PrecisionReport(False, reason=(
            f"precision: max error {cand_max:.3g} (relative to the reference's RMS) is above "
            f"{k:g} x eager's {eager_figure(eager_max, usual_max)} + 2 ulp = {max_bound:.3g} "
            f"for {name(dtype)}"), **report)
    return PrecisionReport(True, **report)


def name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def real_dtype(dtype: torch.dtype) -> torch.dtype:
    return {torch.complex64: torch.float32, torch.complex128: torch.float64,
            torch.complex32: torch.float16}.get(dtype, dtype)


def as_real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t
