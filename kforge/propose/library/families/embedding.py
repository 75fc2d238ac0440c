"""Embedding lookup (``aten.embedding``): rows of a 2-d table gathered by integer indices into a
packed output, copied bit for bit. ``padding_idx`` and ``scale_grad_by_freq`` only matter for
the backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge.core.gpu import GpuInfo
from kforge.propose.library.cards import INDEX_CTYPES, Call, Declined, TensorArg
from kforge.propose.library.families.base import (
    Family,
    Kernel,
    Variant,
    cuda_bool,
    entry_points,
    i64,
    launch,
    new_output,
    ptr,
    vec_options,
)
from kforge.propose.library.families.elementwise import MAX_THREAD_OUTPUTS
from kforge.propose.library.families.rows import launch_geometry, row_space
from kforge.propose.library.layout import Rows
from kforge.propose.library.space import (
    Axis,
    Params,
    Space,
    ceil_div,
    pow2_ceil,
    powers_of_two,
)


@dataclass(frozen=True)
class EmbeddingProblem:
    call: Call
    weight: TensorArg
    indices: TensorArg
    out: TensorArg
    rows: Rows  # the output: one row per index, rows of the table are `weight.stride[0]` apart

    @property
    def table_rows(self) -> Rows:
        return Rows(self.rows.rows, self.rows.cols, self.weight.stride[0])


class Embedding(Family):
    name = "embedding"
    ops = ("aten.embedding.default",)
    cuda_files = ("embedding.cu",)
    reference = "rows"

    def analyze(self, call: Call) -> EmbeddingProblem:
        weight, indices = call.float_tensor(0, "the weight"), call.tensor(1, "the indices")
        if indices.dtype not in INDEX_CTYPES:
            raise Declined(f"indices of dtype {indices.dtype} are not supported (int64, int32 are)")
        if weight.ndim != 2 or weight.stride[1] != 1 or weight.stride[0] < weight.shape[1]:
            raise Declined("the weight is not a 2-d table of packed rows")
        if not indices.is_contiguous or indices.numel == 0:
            raise Declined("the indices are empty or not contiguous")
        out = call.outputs[0]
        if not out.is_contiguous:
            raise Declined("eager's output is not contiguous here")
        return EmbeddingProblem(call, weight, indices, out, Rows(indices.numel, weight.shape[1],
                                                                 weight.shape[1]))

    def variants(self, problem: EmbeddingProblem, gpu: GpuInfo) -> list[Variant]:
        width = problem.rows.cols
        vecs = vec_options(problem.weight.itemsize, width, problem.weight.stride[0])
        rows = row_space(problem.table_rows, vecs, gpu, resident=False, unrolled=False)
        groups = problem.rows.rows * width

        def flat_valid(p: Params) -> bool:
            return (p["vec"] * p["unroll"] <= MAX_THREAD_OUTPUTS
                    and (p["block"] == 64 or p["block"] <= pow2_ceil(groups // p["vec"])))

        flat = Space.build((Axis("block", powers_of_two(64, 1024)), Axis("vec", vecs),
                            Axis("unroll", (1, 2, 4))), flat_valid,
                           {"block": 256, "vec": max(vecs), "unroll": 2}, {"block": 256, "vec": 1, "unroll": 1})
        variants = [Variant("rows", "threads of a row copy it with vector accesses (reference)", rows),
                    Variant("flat", "the output as one list of vector groups, several per thread", flat)]
        return variants if width >= 256 else variants[::-1]

    def render(self, problem: EmbeddingProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        weight, indices, out = problem.weight, problem.indices, problem.out
        t, ti = weight.ctype, INDEX_CTYPES[indices.dtype]
        d, stride = problem.rows.cols, weight.stride[0]
        if approach == "rows":
            grid, block = launch_geometry(problem.rows, params)
        else:
            block = params["block"]
            grid = ceil_div(problem.rows.rows * d // params["vec"], block * params["unroll"])

        def body(vec: int) -> str:
            if approach == "rows":
                return (f"embedding_rows<{t}, {ti}, {d}, {stride}, {params['threads_per_row']}, "
                        f"{params['rows_per_block']}, {vec}>")
            return (f"embedding_flat<{t}, {ti}, {d}, {stride}, {params['vec']}, {params['unroll']}, "
                    f"{cuda_bool(vec > 1)}>")

        source = entry_points(
            "embedding", params["vec"], block,
            [f"const {t}* __restrict__ weight", f"const {ti}* __restrict__ indices",
             f"{t}* __restrict__ y", "int64_t rows", "int64_t vocab"],
            lambda vec: f"{body(vec)}(weight, indices, y, rows, vocab)")
        call = problem.call
        plan = {"outputs": [new_output("out", out)],
                "launches": [launch("embedding", grid, block,
                                    [ptr(call.arg_name(0)), ptr(call.arg_name(1)), ptr("out"),
                                     i64(problem.rows.rows), i64(weight.shape[0])],
                                    params["vec"], weight.itemsize)]}
        return Kernel(source, plan)
