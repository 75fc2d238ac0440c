"""The op card as a launch plan sees it: the operator's schema, every argument under its schema
name with the value plan expressions get, and the tensors eager PyTorch returns for it. A region
card's operator is its chain of aten calls, shown as a function of its inputs.

Eager's outputs come from running the op on meta tensors (``kforge.propose.library.cards``; a
region's chain for a region card), which follows eager's shape, dtype and stride rules without a
GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge.core.argspec import bind, resolve_op
from kforge.core.launch_plan import ArgValue
from kforge.core.opcard import OpCard
from kforge.core.region import Region
from kforge.propose.library.cards import Declined, TensorArg, read_call
from kforge.propose.library.regions.match import region_outputs
from kforge.runtime.plan import arg_value
from kforge.runtime.regions import register


@dataclass(frozen=True)
class VariantView:
    """``outputs`` is None when eager's outputs could not be derived; ``outputs_note`` says why."""

    schema: str  # e.g. "aten::_softmax(Tensor self, int dim, bool half_to_float) -> Tensor"
    arguments: dict[str, ArgValue]
    outputs: tuple[TensorArg, ...] | None
    outputs_note: str = ""
    region_source: str | None = None  # a region card's chain as a Python function


def plan_arguments(card: OpCard) -> dict[str, ArgValue]:
    """The card's arguments by schema name, as plan expressions see them. Raises KforgeError
    (``ArgSpecError`` or ``PlanError``) when they do not fit the op or cannot be given to a plan."""
    return {name: arg_value(spec) for name, spec in bind(card.op, card.args, card.kwargs).items()}


def variant_view(card: OpCard) -> VariantView:
    """The card for a plan's author. Raises KforgeError as ``plan_arguments`` does."""
    if card.region is not None:
        return region_view(card)
    arguments = plan_arguments(card)
    schema = str(resolve_op(card.op)._schema)
    try:
        return VariantView(schema, arguments, read_call(card).outputs)
    except Declined as exc:
        return VariantView(schema, arguments, None, str(exc))


def region_view(card: OpCard) -> VariantView:
    """A region card: its operator (defined here if it is not yet), its inputs ``x0``, ``x1``...,
    its chain as a function, and what the chain returns."""
    region = Region.from_dict(card.region)
    schema = str(register(region)._schema)
    arguments = plan_arguments(card)
    try:
        return VariantView(schema, arguments, region_outputs(region, card.args),
                           region_source=region.source())
    except Declined as exc:
        return VariantView(schema, arguments, None, str(exc), region.source())
