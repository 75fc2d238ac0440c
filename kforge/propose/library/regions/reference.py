"""A program (``kforge.propose.library.regions.program``) evaluated with torch, element by element
as the region kernels compute it: inputs read through each leaf's strides, every op in float
rounded to its dtype, stage totals per row. It states what the kernels implement, so that a
program can be checked against its region's operator without a GPU."""

from __future__ import annotations

import torch

from kforge.core.argspec import resolve_op, torch_dtype
from kforge.propose.library.regions.program import (
    Apply,
    Box,
    Const,
    Expr,
    Leaf,
    Load,
    Output,
    Program,
    Total,
)


def evaluate(program: Program, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The program's outputs for ``inputs``, each with eager's shape, strides and dtype."""
    return _Evaluation(program, inputs).outputs()


class _Evaluation:
    def __init__(self, program: Program, inputs: list[torch.Tensor]) -> None:
        self.program = program
        self.inputs = inputs
        self.totals: dict[int, torch.Tensor] = {}

    def outputs(self) -> list[torch.Tensor]:
        return [self.output(o) for o in self.program.outputs]

    def output(self, output: Output) -> torch.Tensor:
        values = torch.full(output.shape, float("nan"))
        written = torch.zeros(output.shape, dtype=torch.bool)
        for piece in output.pieces:
            where = tuple(slice(lo, hi) for lo, hi in piece.box)
            if written[where].any():
                raise AssertionError(f"pieces of output {output.index} overlap")
            values[where] = self.value(piece.expr, piece.box, {})
            written[where] = True
        if not written.all():
            raise AssertionError(f"the pieces of output {output.index} leave elements unwritten")
        eager = output.eager
        memory = torch.empty_strided(eager.shape, eager.stride, dtype=torch_dtype(output.dtype))
        # A statistic is written once per row: its first column.
        once = tuple(0 if stride == 0 else slice(None) for stride in output.stride)
        memory.as_strided(output.shape, output.stride)[once].copy_(values[once])
        return memory

    def value(self, expr: Expr, box: Box, memo: dict) -> torch.Tensor | float:
        if expr in memo:
            return memo[expr]
        if isinstance(expr, Const):
            found: torch.Tensor | float = expr.value
        elif isinstance(expr, Load):
            found = self.load(expr.leaf, box)
        elif isinstance(expr, Total):
            rows = tuple(slice(lo, hi) for lo, hi in box[:-self.program.reduced])
            found = self.total(expr.stage)[rows]
        else:
            found = self.apply(expr, box, memo)
        memo[expr] = found
        return found

    def apply(self, expr: Apply, box: Box, memo: dict) -> torch.Tensor:
        args = [self.value(a, box, memo) for a in expr.args]
        if expr.op == "aten._to_copy.default":
            result = torch.as_tensor(args[0], dtype=torch.float32)
        else:
            kwargs = dict(expr.named)
            if "approximate" in kwargs:
                kwargs["approximate"] = "tanh" if kwargs["approximate"] == "tanh" else "none"
            result = resolve_op(expr.op)(*args, **kwargs)
        return result.to(torch_dtype(expr.dtype)).float()

    def load(self, leaf: Leaf, box: Box) -> torch.Tensor:
        x = self.inputs[leaf.input]
        index = torch.tensor(leaf.offset)
        for d, ((lo, hi), stride) in enumerate(zip(box, leaf.stride)):
            shape = [1] * len(box)
            shape[d] = hi - lo
            index = index + (torch.arange(lo, hi) * stride).reshape(shape)
        index = index.expand(tuple(hi - lo for lo, hi in box))
        flat = x.as_strided((int(index.max()) + 1,), (1,))
        return flat[index].float()

    def total(self, stage: int) -> torch.Tensor:
        if stage not in self.totals:
            found = self.program.stages[stage]
            shape = self.program.shape
            full = tuple((0, n) for n in shape)
            values = torch.as_tensor(self.value(found.expr, full, {})).float().expand(shape)
            reduce = torch.sum if found.kind == "sum" else torch.amax
            dims = tuple(range(-self.program.reduced, 0))
            self.totals[stage] = reduce(values, dim=dims, keepdim=True)
        return self.totals[stage]


