"""What one call returned, as the checks see it, and the verdicts those checks reach.

A call's results are its returned tensors, then the arguments the op writes in place, each with its
layout and the input buffer it aliases. Two observations are compared layout first, then values
(``kforge.eval.verify.compare``); the first difference ends the evaluation with a ``Verdict``, whose
evidence (``kforge.core.outcome.FailureEvidence``) is what a repair needs: the worst elements at
fault with eager's and the candidate's values, where the faults lie, error norms, and NaN and inf
counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kforge.core.candidate import EvalStatus
from kforge.core.outcome import Element, FailureEvidence, Mismatch, NonFinite
from kforge.eval.verify.compare import (
    Meta,
    ValueReport,
    compare_structure,
    compare_values,
    layout_problem,
)

WORST_SHOWN = 8  # elements at fault listed in a mismatch's details
from kforge.eval.verify.inputs import InputSet
from kforge.eval.verify.ops import flatten_tensors, mutated_values


class Verdict(Exception):
    """An evaluation decided before its end."""

    def __init__(self, status: EvalStatus, summary: str, *, restart: bool = False,
                 evidence: FailureEvidence | None = None) -> None:
        super().__init__(summary)
        self.status = status
        self.summary = summary
        self.restart = restart  # the process is unfit for another evaluation (EvalOutcome.restart)
        self.evidence = evidence


@dataclass
class Observed:
    """One call's results: its return value, and the tensors to compare (returned tensors, then
    the arguments the op writes) with their layouts and the input each one aliases."""

    returned: Any
    tensors: list[torch.Tensor]
    metas: list[Meta]
    aliases: list[int | None]


def aliased_buffer(t: torch.Tensor, inputs: InputSet) -> int | None:
    """Index of the input buffer whose memory ``t`` lies in, if any."""
    if t.numel() == 0:
        return None
    ptr = t.data_ptr()
    for i, buf in enumerate(inputs.buffers):
        start = buf.base.data_ptr()
        if start <= ptr < start + buf.base.numel() * buf.base.element_size():
            return i
    return None


def plain_problem(t: Any) -> str | None:
    """Why a returned value is not a plain tensor with storage (a lazy subclass, a meta tensor)."""
    if type(t) is not torch.Tensor:
        return f"is a {type(t).__name__}, not a plain torch.Tensor"
    if t.device.type == "meta":
        return "is a meta tensor with no data"
    try:
        t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return "has no storage"
    return None


def observe(returned: Any, inputs: InputSet, written: list[int], candidate: bool) -> Observed:
    tensors, metas, aliases = [], [], []
    for i, t in enumerate(flatten_tensors(returned)):
        if candidate and (problem := plain_problem(t)):
            raise Verdict(EvalStatus.CHEAT, f"returned tensor {i} {problem}")
        alias = aliased_buffer(t, inputs)
        tensors.append(t.clone() if alias is not None else t)
        metas.append(Meta.of(t))
        aliases.append(alias)
    for i in written:
        view = inputs.buffers[i].view
        tensors.append(view.clone())
        metas.append(Meta.of(view))
        aliases.append(i)
    return Observed(returned, tensors, metas, aliases)


def compare_observed(out: Observed, ref: Observed, label: str,
                     forgive: Callable[[int], str | None] | None = None,
                     exact: bool = False) -> list[ValueReport]:
    """Check ``out`` against eager's ``ref``; raise a MISMATCH verdict at the first difference.
    Where result i's values are outside eager's tolerances, ``forgive(i)`` may accept them
    (None) or say why not (a reason added to the verdict, or ""); NaN or inf out of place, and
    values that are not eager's bits where ``exact`` (eager computes the op exactly), are never
    forgiven."""
    if problem := compare_structure(out.returned, ref.returned):
        raise Verdict(EvalStatus.MISMATCH, f"{label}: {problem}")
    reports = []
    for i, (o, r) in enumerate(zip(out.tensors, ref.tensors)):
        what = f"{label}, result {i}"
        if out.aliases[i] != ref.aliases[i]:
            theirs = ("a new tensor" if ref.aliases[i] is None
                      else f"tensor argument {ref.aliases[i]} itself")
            raise Verdict(EvalStatus.MISMATCH, f"{what}: eager returns {theirs}, the candidate "
                          + ("a new tensor" if out.aliases[i] is None
                             else f"memory of tensor argument {out.aliases[i]}"))
        if problem := layout_problem(out.metas[i], ref.metas[i]):
            raise Verdict(EvalStatus.MISMATCH, f"{what} {problem}")
        report = compare_values(o, r, exact=exact)
        if not report.ok and (why_not := "" if forgive is None or not report.forgivable
                              else forgive(i)) is not None:
            reason = f"{what}: {report.reason}" + (f"; {why_not}" if why_not else "")
            raise Verdict(EvalStatus.MISMATCH, reason, evidence=FailureEvidence(
                mismatch=mismatch_details(o, r, report, label, i),
                report=report.comparison()))
        reports.append(report)
    return reports


def mismatch_details(out: torch.Tensor, ref: torch.Tensor, report: ValueReport, where: str,
                     result: int) -> Mismatch:
    """The evidence of a failed value comparison of result ``result`` in check ``where``: the
    worst elements at fault (index, eager's value, the candidate's), the span of indices the
    faults cover per dimension, the error norms, and NaN and inf counts where either side has
    any."""
    if ref.dtype.is_complex:
        out, ref = torch.view_as_real(out), torch.view_as_real(ref)
    o, r = out.double(), ref.double()
    found: dict[str, Any] = {"where": where, "result": result, "shape": tuple(ref.shape),
                             "dtype": str(ref.dtype).removeprefix("torch."), "faults": report.bad}
    if report.max_abs or report.rel_norm:  # measured where the comparison got to the values
        found.update(max_abs=_plain(report.max_abs), rel_norm=_plain(report.rel_norm))
    nonfinite = {name: NonFinite(int(test(r).sum().item()), int(test(o).sum().item()))
                 for name, test in (("nan", torch.isnan), ("+inf", torch.isposinf),
                                    ("-inf", torch.isneginf))}
    found["nonfinite"] = {name: c for name, c in nonfinite.items() if c.eager or c.candidate}
    fault = report.at_fault
    if fault is not None and fault.shape == ref.shape and bool(fault.any()):
        if ref.dim():
            found["fault_span"] = tuple(_span(fault, d) for d in range(ref.dim()))
    elif ref.numel():  # too imprecise as a whole: the largest errors anywhere
        fault = torch.ones_like(r, dtype=torch.bool)
    else:
        return Mismatch(**found)
    # Misplaced NaN or inf first, then the largest finite errors.
    error = torch.nan_to_num((o - r).abs(), nan=math.inf, posinf=math.inf)
    error = torch.where(fault, error, -1.0).reshape(-1)
    top = torch.topk(error, min(WORST_SHOWN, int(fault.sum().item()))).indices
    found["worst"] = tuple(
        Element(tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), ref.shape)),
                _plain(float(r.reshape(-1)[flat].item())),
                _plain(float(o.reshape(-1)[flat].item())))
        for flat in top.tolist())
    return Mismatch(**found)


def _span(mask: torch.Tensor, dim: int) -> tuple[int, int]:
    """The first and last index along ``dim`` holding a True of ``mask``."""
    others = [d for d in range(mask.dim()) if d != dim]
    hit = mask.to(torch.uint8).amax(dim=others) if others else mask.to(torch.uint8)
    where = torch.nonzero(hit).reshape(-1)
    return int(where[0].item()), int(where[-1].item())


def _plain(value: float) -> float | str:
    """A float for JSON: NaN and inf as text."""
    return value if math.isfinite(value) else str(value)


def same_bytes(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bitwise equality (NaN equals the same NaN)."""
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    return torch.equal(x.contiguous().reshape(-1).view(torch.uint8),
                       y.contiguous().reshape(-1).view(torch.uint8))


def bitwise_equal(a: Observed, b: Observed) -> bool:
    return len(a.tensors) == len(b.tensors) and all(
        same_bytes(x, y) for x, y in zip(a.tensors, b.tensors))


def written_buffers(op_name: str, inputs: InputSet) -> list[int]:
    """Indices of the input buffers the op writes in place (``self`` of add_, ``out=``)."""
    index = {id(b.view): i for i, b in enumerate(inputs.buffers)}
    values = mutated_values(op_name, inputs.args, inputs.kwargs)
    return [index[id(t)] for t in flatten_tensors(values) if id(t) in index]


