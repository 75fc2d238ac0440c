"""The op card as a launch plan sees it: the operator's schema, every argument under its schema
name with the value plan expressions get, and the tensors eager PyTorch returns for it.

Eager's outputs come from running the op on meta tensors (``kforge.propose.library.cards``), which
follows eager's shape, dtype and stride rules without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge.core.argspec import bind, resolve_op
from kforge.core.launch_plan import ArgValue
from kforge.core.opcard import OpCard
from kforge.propose.library.cards import Declined, TensorArg, read_call
from kforge.runtime.plan import arg_value


@dataclass(frozen=True)
class VariantView:
    """``outputs`` is None when eager's outputs could not be derived; ``outputs_note`` says why."""

    schema: str  # e.g. "aten::_softmax(Tensor self, int dim, bool half_to_float) -> Tensor"
    arguments: dict[str, ArgValue]
    outputs: tuple[TensorArg, ...] | None
    outputs_note: str = ""


def plan_arguments(card: OpCard) -> dict[str, ArgValue]:
    """The card's arguments by schema name, as plan expressions see them. Raises KforgeError
    (``ArgSpecError`` or ``PlanError``) when they do not fit the op or cannot be given to a plan."""
    return {name: arg_value(spec) for name, spec in bind(card.op, card.args, card.kwargs).items()}


def variant_view(card: OpCard) -> VariantView:
    """The card for a plan's author. Raises KforgeError as ``plan_arguments`` does."""
    arguments = plan_arguments(card)
    schema = str(resolve_op(card.op)._schema)
    try:
        return VariantView(schema, arguments, read_call(card).outputs)
    except Declined as exc:
        return VariantView(schema, arguments, None, str(exc))
