"""Candidates in the kforge format (CUDA source + launch plan) for tests and benchmarks: naive but
correct reference kernels, and device-side cheats that must be rejected with the status given.

A plan names one kernel per launch, so a candidate covers one dtype: the builders take its name
(``"float32"``, ``"bfloat16"``, ``"float16"``). ``REFERENCE`` maps op names to reference builders,
``reference(card)`` builds the one for a card, and ``CHEATS`` lists ``(name, card builder,
candidate builder, expected status)``. ``tests.eval.redteam`` builds on the device code and plans
here; ``tests.eval.fakes`` holds a Python stand-in for every kernel.
"""

from __future__ import annotations

from collections.abc import Callable

from kforge.core.candidate import Candidate, EvalStatus
from kforge.core.opcard import OpCard

SUFFIX = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
CTYPE = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}

# ----- shared device code -----

CONVERT = r"""
template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
"""

REDUCE = r"""
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// Block-wide reductions; blockDim.x is a multiple of 32, at most 1024.
__device__ float block_max(float v, float* red) {
    v = warp_max(v);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : -INFINITY;
    if (threadIdx.x < 32) v = warp_max(v);
    if (threadIdx.x == 0) red[0] = v;
    __syncthreads();
    v = red[0];
    __syncthreads();
    return v;
}
__device__ float block_sum(float v, float* red) {
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
    if (threadIdx.x < 32) v = warp_sum(v);
    if (threadIdx.x == 0) red[0] = v;
    __syncthreads();
    v = red[0];
    __syncthreads();
    return v;
}
"""

GRID_STRIDE = "for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; " \
              "i += (long long)gridDim.x * blockDim.x)"


def instantiate(template_call: str, name: str, params: str, args: str,
                dtypes: tuple[str, ...] = tuple(SUFFIX)) -> str:
    """``extern "C"`` wrappers ``NAME_f32`` ... of a templated kernel body, one per dtype
    (``T`` in ``params`` becomes the dtype's C type)."""
    return "\n".join(
        f'extern "C" __global__ void {name}_{SUFFIX[d]}({params.replace("T", CTYPE[d])}) '
        f'{{ {template_call}<{CTYPE[d]}>({args}); }}' for d in dtypes)


def kernel_name(base: str, dtype: str) -> str:
    return f"{base}_{SUFFIX[dtype]}"


# ----- plans -----


def softmax_plan(kernel: str, dtype: str = "float32", *, block: int = 256,
                 shared_mem: int | str = 0, params: list | None = None,
                 grid: str = "rows") -> dict:
    """``aten._softmax.default`` over the last dim of a contiguous input: one block per row."""
    return {
        "let": {"cols": "self.shape[-1]", "rows": "self.numel // cols"},
        "requires": ["self.is_contiguous", "dim == -1 or dim == self.dim - 1",
                     "not half_to_float", f"self.dtype == {dtype!r}"],
        "outputs": [{"name": "out", "like": "self"}],
        "launches": [{"kernel": kernel, "grid": [grid], "block": [block],
                      "shared_mem": shared_mem,
                      "params": params or [{"ptr": "self"}, {"ptr": "out"}, {"i32": "cols"}]}],
    }


AFFINE_FLAGS = "(1 if defined(weight) else 0) + (2 if defined(bias) else 0)"


def layer_norm_plan(kernel: str, dtype: str = "float32", *, rank: int = 2,
                    stats: str = "float32") -> dict:
    """``aten.native_layer_norm.default`` over one normalized dim of a contiguous input of
    ``rank`` dims; mean and rstd of dtype ``stats``, shaped as eager's (size 1 in the last dim)."""
    stats_shape = [f"input.shape[{d}]" for d in range(rank - 1)] + [1]
    return {
        "let": {"cols": "normalized_shape[0]", "rows": "input.numel // cols"},
        "requires": ["len(normalized_shape) == 1", f"input.dim == {rank}", "input.is_contiguous",
                     "input.shape[-1] == cols", f"input.dtype == {dtype!r}",
                     "weight is None or weight.is_contiguous",
                     "bias is None or bias.is_contiguous"],
        "outputs": [{"name": "out", "like": "input"},
                    {"name": "mean", "shape": stats_shape, "dtype": stats},
                    {"name": "rstd", "shape": stats_shape, "dtype": stats}],
        "launches": [{"kernel": kernel, "grid": ["rows"], "block": [256],
                      "params": [{"ptr": "input"}, {"ptr": "weight"}, {"ptr": "bias"},
                                 {"ptr": "out"}, {"ptr": "mean"}, {"ptr": "rstd"},
                                 {"i32": "cols"}, {"f32": "eps"}, {"i32": AFFINE_FLAGS}]}],
    }


def elementwise_plan(kernel: str, dtype: str, params: list, *, outputs: list | None = None,
                     requires: tuple[str, ...] = ()) -> dict:
    """A grid-stride launch over the ``self.numel`` elements of contiguous tensors."""
    return {
        "let": {"n": "self.numel"},
        "requires": ["self.is_contiguous", f"self.dtype == {dtype!r}", *requires],
        "outputs": outputs if outputs is not None else [{"name": "out", "like": "self"}],
        "launches": [{"kernel": kernel, "grid": ["min(ceil_div(n, 256), 65536)"],
                      "block": [256], "params": params}],
    }


SAME_AS_SELF = ("other.is_contiguous", "other.shape == self.shape", "other.dtype == self.dtype")


def add_plan(kernel: str, dtype: str = "float32", *, into: str = "out") -> dict:
    """``aten.add.Tensor`` (``into="out"``, a new tensor) or ``aten.add_.Tensor``
    (``into="self"``) of two same-shape contiguous tensors."""
    outputs = ([{"name": "out", "like": "self"}] if into == "out"
               else [{"name": "result", "arg": "self"}])
    return elementwise_plan(kernel, dtype, [{"ptr": "self"}, {"ptr": "other"}, {"ptr": into},
                                            {"i64": "n"}, {"f32": "alpha"}],
                            outputs=outputs, requires=SAME_AS_SELF)


def unary_plan(kernel: str, dtype: str = "float32") -> dict:
    """An elementwise op of one tensor (``aten.relu.default``) into a new tensor."""
    return elementwise_plan(kernel, dtype, [{"ptr": "self"}, {"ptr": "out"}, {"i64": "n"}])


# ----- softmax: aten._softmax.default(self, dim, half_to_float) over the last dim -----

SOFTMAX_BODY = r"""
template <typename T>
__device__ void softmax_row(const T* __restrict__ x, T* __restrict__ y, int cols) {
    __shared__ float red[32];
    const T* row = x + (long long)blockIdx.x * cols;
    T* out = y + (long long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, to_f(row[c]));
    m = block_max(m, red);
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(to_f(row[c]) - m);
    s = block_sum(s, red);
    const float inv = 1.f / s;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) out[c] = from_f<T>(expf(to_f(row[c]) - m) * inv);
}
"""

SOFTMAX_SOURCE = CONVERT + REDUCE + SOFTMAX_BODY + instantiate(
    "softmax_row", "softmax", "const T* x, T* y, int cols", "x, y, cols")


def softmax(dtype: str = "float32") -> Candidate:
    return Candidate(SOFTMAX_SOURCE, plan=softmax_plan(kernel_name("softmax", dtype), dtype),
                     meta={"family": "reference", "approach": "block per row"})



# Softmax whose blocks take their rows from a ticket counter in zeroed scratch, in the order they
# start (as the library's chained group norm takes its groups): the plan promises the counter is
# zero at every call, and a counter left from an earlier call sends blocks past the last row.
SOFTMAX_TICKETED = SOFTMAX_BODY.replace("softmax_row(const T* __restrict__ x, T* __restrict__ y, int cols) {",
                                        "softmax_row(const T* __restrict__ x, T* __restrict__ y, int cols, long long r) {") \
    .replace("(long long)blockIdx.x * cols", "r * cols") + r"""
extern "C" __global__ void softmax_ticketed(const float* x, float* y, unsigned* tickets, int cols) {
    __shared__ unsigned ticket;
    if (threadIdx.x == 0) ticket = atomicAdd(tickets, 1u);
    __syncthreads();
    softmax_row<float>(x, y, cols, ticket);
}
"""


def softmax_ticketed() -> Candidate:
    """An honest softmax relying on its plan's zeroed scratch at every call."""
    plan = softmax_plan("softmax_ticketed", params=[{"ptr": "self"}, {"ptr": "out"},
                                                    {"ptr": "tickets"}, {"i32": "cols"}])
    plan["scratch"] = [{"name": "tickets", "bytes": 4, "zero": True}]
    return Candidate(CONVERT + REDUCE + SOFTMAX_TICKETED, plan=plan,
                     meta={"family": "reference", "approach": "rows by ticket"})

# Softmax with the row staged in dynamic shared memory: large rows need more than 48 KiB.
SOFTMAX_SMEM = r"""
extern "C" __global__ void softmax_smem(const float* __restrict__ x, float* __restrict__ y, int cols) {
    extern __shared__ float row[];
    __shared__ float red[32];
    const float* src = x + (long long)blockIdx.x * cols;
    float* out = y + (long long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) { row[c] = src[c]; m = fmaxf(m, row[c]); }
    m = block_max(m, red);
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) { row[c] = expf(row[c] - m); s += row[c]; }
    s = block_sum(s, red);
    const float inv = 1.f / s;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) out[c] = row[c] * inv;
}
"""


def softmax_shared_memory() -> Candidate:
    return Candidate(REDUCE + SOFTMAX_SMEM,
                     plan=softmax_plan("softmax_smem", block=512, shared_mem="cols * 4"),
                     meta={"family": "reference", "approach": "row in shared memory"})


# ----- layer norm: aten.native_layer_norm.default(input, normalized_shape, weight, bias, eps) -----

LAYER_NORM_BODY = r"""
template <typename T, typename S>
__device__ void layer_norm_row(const T* __restrict__ x, const T* __restrict__ w,
                               const T* __restrict__ b, T* __restrict__ y, S* __restrict__ mean,
                               S* __restrict__ rstd, int cols, float eps, int affine) {
    __shared__ float red[32];
    const T* row = x + (long long)blockIdx.x * cols;
    T* out = y + (long long)blockIdx.x * cols;
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += to_f(row[c]);
    const float mu = block_sum(s, red) / cols;
    float v = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) { float d = to_f(row[c]) - mu; v += d * d; }
    const float r = rsqrtf(block_sum(v, red) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float o = (to_f(row[c]) - mu) * r;
        if (affine & 1) o *= to_f(w[c]);
        if (affine & 2) o += to_f(b[c]);
        out[c] = from_f<T>(o);
    }
    if (threadIdx.x == 0) { mean[blockIdx.x] = from_f<S>(mu); rstd[blockIdx.x] = from_f<S>(r); }
}
"""

LAYER_NORM_PARAMS = ("const T* x, const T* w, const T* b, T* y, S* mean, S* rstd, int cols, "
                     "float eps, int affine")


def layer_norm_kernel(dtype: str, stats: str = "float32") -> str:
    """``layer_norm_bf16`` (float32 statistics, as eager on a GPU), or
    ``layer_norm_bf16_stats_bf16`` (statistics in the input's dtype, as eager on the CPU)."""
    name = kernel_name("layer_norm", dtype)
    return name if stats == "float32" else f"{name}_stats_{SUFFIX[stats]}"


def _layer_norm_entry(dtype: str, stats: str) -> str:
    t, s = CTYPE[dtype], CTYPE[stats]
    params = LAYER_NORM_PARAMS.replace("T*", f"{t}*").replace("S*", f"{s}*")
    return (f'extern "C" __global__ void {layer_norm_kernel(dtype, stats)}({params}) '
            f'{{ layer_norm_row<{t}, {s}>(x, w, b, y, mean, rstd, cols, eps, affine); }}')


LAYER_NORM_SOURCE = CONVERT + REDUCE + LAYER_NORM_BODY + "\n".join(
    [_layer_norm_entry(d, "float32") for d in SUFFIX]
    + [_layer_norm_entry(d, d) for d in ("float16", "bfloat16")])


def eager_stats_dtype(dtype: str, device_type: str) -> str:
    """The dtype of eager's mean and rstd: float32 on a GPU; the input's own on the CPU."""
    return "float32" if device_type == "cuda" else dtype


def layer_norm(dtype: str = "float32", rank: int = 2, stats: str = "float32") -> Candidate:
    return Candidate(LAYER_NORM_SOURCE,
                     plan=layer_norm_plan(layer_norm_kernel(dtype, stats), dtype, rank=rank,
                                          stats=stats),
                     meta={"family": "reference", "approach": "block per row"})


# ----- elementwise: aten.add.Tensor, aten.add_.Tensor, aten.relu.default -----

ELEMENTWISE = rf"""
template <typename T>
__device__ void add_body(const T* __restrict__ x, const T* __restrict__ y, T* __restrict__ out,
                         long long n, float alpha) {{
    {GRID_STRIDE}
        out[i] = from_f<T>(to_f(x[i]) + alpha * to_f(y[i]));
}}
template <typename T>
__device__ void relu_body(const T* __restrict__ x, T* __restrict__ out, long long n) {{
    {GRID_STRIDE} {{
        float v = to_f(x[i]);
        out[i] = from_f<T>(v != v ? v : fmaxf(v, 0.f));
    }}
}}
"""

ELEMENTWISE_SOURCE = CONVERT + ELEMENTWISE + "\n" + instantiate(
    "add_body", "add", "const T* x, const T* y, T* out, long long n, float alpha",
    "x, y, out, n, alpha") + "\n" + instantiate(
    "relu_body", "relu", "const T* x, T* out, long long n", "x, out, n")


def add(dtype: str = "float32") -> Candidate:
    return Candidate(ELEMENTWISE_SOURCE, plan=add_plan(kernel_name("add", dtype), dtype),
                     meta={"family": "reference", "approach": "grid-stride"})


def add_inplace(dtype: str = "float32") -> Candidate:
    return Candidate(ELEMENTWISE_SOURCE,
                     plan=add_plan(kernel_name("add", dtype), dtype, into="self"),
                     meta={"family": "reference", "approach": "grid-stride in place"})


def relu(dtype: str = "float32") -> Candidate:
    return Candidate(ELEMENTWISE_SOURCE, plan=unary_plan(kernel_name("relu", dtype), dtype),
                     meta={"family": "reference", "approach": "grid-stride"})


REFERENCE: dict[str, Callable[..., Candidate]] = {
    "aten._softmax.default": softmax,
    "aten.native_layer_norm.default": layer_norm,
    "aten.add.Tensor": add,
    "aten.add_.Tensor": add_inplace,
    "aten.relu.default": relu,
}


def reference(card: OpCard, device_type: str = "cuda") -> Candidate:
    """The reference candidate for ``card``'s op, dtype (and, for layer norm, rank) on a device
    of ``device_type``."""
    first = card.args[0]
    dtype = first["dtype"]
    if card.op == "aten.native_layer_norm.default":
        return layer_norm(dtype, len(first["shape"]), eager_stats_dtype(dtype, device_type))
    return REFERENCE[card.op](dtype)


# ----- cards -----


def tensor(shape: list[int], dtype: str = "float32", stride: list[int] | None = None,
           offset: int = 0) -> dict:
    if stride is None:
        stride, step = [], 1
        for size in reversed(shape):
            stride.insert(0, step)
            step *= size
    return {"t": "tensor", "shape": shape, "stride": stride, "dtype": dtype, "offset": offset}


def softmax_card(rows: int = 64, cols: int = 1000, dtype: str = "float32") -> OpCard:
    return OpCard("aten._softmax.default", [tensor([rows, cols], dtype), -1, False])


def layer_norm_card(rows: int = 64, cols: int = 1536, dtype: str = "float32",
                    affine: bool = True) -> OpCard:
    w = tensor([cols], dtype) if affine else None
    b = tensor([cols], dtype) if affine else None
    return OpCard("aten.native_layer_norm.default", [tensor([rows, cols], dtype), [cols], w, b, 1e-6])


def add_card(shape: list[int] | None = None, dtype: str = "float32") -> OpCard:
    shape = shape or [32, 1000]
    return OpCard("aten.add.Tensor", [tensor(shape, dtype), tensor(shape, dtype)])


def add_inplace_card(shape: list[int] | None = None, dtype: str = "float32") -> OpCard:
    shape = shape or [32, 1000]
    return OpCard("aten.add_.Tensor", [tensor(shape, dtype), tensor(shape, dtype)], {"alpha": 0.5})


def relu_card(shape: list[int] | None = None, dtype: str = "float32") -> OpCard:
    return OpCard("aten.relu.default", [tensor(shape or [32, 1000], dtype)])


# ----- cheats: each must be rejected -----


def cheat(source: str, plan: dict, approach: str) -> Candidate:
    return Candidate(source, plan=plan, meta={"family": "cheat", "approach": approach})


NOOP = r"""
extern "C" __global__ void noop(float* out) { }
"""


def cheat_stale_output() -> Candidate:
    """Launches a kernel that writes nothing: hopes the output buffer still holds eager's result."""
    return cheat(NOOP, softmax_plan("noop", grid="1", params=[{"ptr": "out"}]),
                 "stale output buffer")


def cheat_partial_output() -> Candidate:
    """Computes only the first row."""
    return cheat(SOFTMAX_SOURCE, softmax_plan("softmax_f32", grid="1"), "first row only")


ZEROS = rf"""
extern "C" __global__ void zeros(__nv_bfloat16* y, long long n) {{
    {GRID_STRIDE} y[i] = __float2bfloat16(0.f);
}}
"""


def cheat_zeros() -> Candidate:
    """All zeros: within atol=1e-2 of a bf16 softmax over 4096 columns, elementwise."""
    plan = softmax_plan("zeros", "bfloat16", grid="min(ceil_div(self.numel, 256), 65536)",
                        params=[{"ptr": "out"}, {"i64": "self.numel"}])
    return cheat(ZEROS, plan, "all zeros")


NANS = rf"""
extern "C" __global__ void nans(float* y, long long n) {{
    {GRID_STRIDE} y[i] = NAN;
}}
"""


def cheat_nan() -> Candidate:
    """NaN everywhere, hoping NaN compares as a wildcard."""
    plan = softmax_plan("nans", grid="min(ceil_div(self.numel, 256), 65536)",
                        params=[{"ptr": "out"}, {"i64": "self.numel"}])
    return cheat(NANS, plan, "NaN wildcard")


LOW_PRECISION = r"""
__device__ __forceinline__ float bf16_rounded(float v) { return __bfloat162float(__float2bfloat16(v)); }
extern "C" __global__ void low_precision(const float* x, float* y, int cols) {
    __shared__ float red[32];
    const float* row = x + (long long)blockIdx.x * cols;
    float* out = y + (long long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, bf16_rounded(row[c]));
    m = block_max(m, red);
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(bf16_rounded(row[c]) - m);
    s = block_sum(s, red);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) out[c] = expf(bf16_rounded(row[c]) - m) / s;
}
"""


def cheat_low_precision() -> Candidate:
    """fp32 softmax whose input is rounded to bf16 first: each element looks close, the error
    norm does not."""
    return cheat(REDUCE + LOW_PRECISION, softmax_plan("low_precision"),
                 "silently lowered precision")


SCRIBBLE = r"""
extern "C" __global__ void scribble(float* x, float* y, int cols) {
    softmax_row<float>(x, y, cols);
    __syncthreads();
    if (threadIdx.x == 0) x[(long long)blockIdx.x * cols] = 0.f;
}
"""


def cheat_modify_inputs() -> Candidate:
    """Correct output, but uses the input as scratch space."""
    return cheat(CONVERT + REDUCE + SOFTMAX_BODY + SCRIBBLE, softmax_plan("scribble"),
                 "modifies its inputs")


RELU_OOB_READ = r"""
extern "C" __global__ void relu_oob(const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f) + 0.f * x[i + 1];
}
"""


def cheat_read_out_of_bounds() -> Candidate:
    """relu that also reads one element past the end of its input (and lets it reach the result)."""
    return cheat(RELU_OOB_READ, unary_plan("relu_oob"), "reads out of bounds")


RELU_OOB_WRITE = r"""
extern "C" __global__ void relu_oob_write(float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
    if (i == 0) x[-1] = 1.f;
}
"""


def cheat_write_out_of_bounds() -> Candidate:
    """Correct relu that also writes just before its input."""
    return cheat(RELU_OOB_WRITE, unary_plan("relu_oob_write"), "writes out of bounds")


def cache_by_address_source(capacity: int = 1 << 20) -> str:
    return CONVERT + REDUCE + SOFTMAX_BODY + rf"""
__device__ const float* g_last_input;
__device__ float g_cache[{capacity}];
extern "C" __global__ void check_address(const float* x, int* hit) {{
    *hit = (g_last_input == x);
    g_last_input = x;
}}
extern "C" __global__ void replay(const float* x, float* y, int cols, const int* hit) {{
    long long base = (long long)blockIdx.x * cols;
    if (*hit) {{
        for (int c = threadIdx.x; c < cols; c += blockDim.x) y[base + c] = g_cache[base + c];
        return;
    }}
    softmax_row<float>(x, y, cols);
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += blockDim.x) g_cache[base + c] = y[base + c];
}}
"""


def cache_by_address_plan() -> dict:
    plan = softmax_plan("replay", params=[{"ptr": "self"}, {"ptr": "out"}, {"i32": "cols"},
                                          {"ptr": "hit"}])
    plan["scratch"] = [{"name": "hit", "bytes": 4}]
    plan["launches"].insert(0, {"kernel": "check_address", "grid": [1], "block": [1],
                                "params": [{"ptr": "self"}, {"ptr": "hit"}]})
    return plan


def cheat_cache_by_address() -> Candidate:
    """Keeps its last result in device memory and replays it when called with the same input
    address again."""
    return cheat(cache_by_address_source(), cache_by_address_plan(), "caches results by address")


SKIP_WHEN_TIMED = r"""
__device__ unsigned int g_calls;
__device__ unsigned int g_skip;
extern "C" __global__ void count_call(unsigned int honest) {
    g_skip = g_calls >= honest;
    g_calls += 1;
}
extern "C" __global__ void maybe_softmax(const float* x, float* y, int cols) {
    if (g_skip) return;
    softmax_row<float>(x, y, cols);
}
"""


def cheat_skip_when_timed(honest_calls: int) -> Candidate:
    """Computes for the first ``honest_calls`` calls (the verification runs), then skips the work."""
    plan = softmax_plan("maybe_softmax")
    plan["launches"].insert(0, {"kernel": "count_call", "grid": [1], "block": [1],
                                "params": [{"u32": honest_calls}]})
    return cheat(CONVERT + REDUCE + SOFTMAX_BODY + SKIP_WHEN_TIMED, plan, "skips work when timed")


# Crashes and hangs: only through worker processes (they poison or block the process).
CRASHERS = {
    "illegal_address": (r"""
extern "C" __global__ void wild(float* y) { float* p = (float*)0x10; p[threadIdx.x] = 1.f; y[0] = 0.f; }
""", "illegal address"),
    "trap": (r"""
extern "C" __global__ void wild(float* y) { if (threadIdx.x == 0) __trap(); y[0] = 0.f; }
""", "trap"),
    "hang": (r"""
__device__ int g_release;  // zero, and nothing ever sets it
extern "C" __global__ void wild(float* y) {
    while (atomicAdd(&g_release, 0) == 0) __nanosleep(1000);
    y[0] = 0.f;
}
""", "never returns"),
}


def crasher(kind: str) -> Candidate:
    source, approach = CRASHERS[kind]
    return cheat(source, softmax_plan("wild", grid="1", block=32, params=[{"ptr": "out"}]),
                 approach)


# (name, card, candidate, expected status). Cards are small so the suite runs in seconds.
CHEATS: list[tuple[str, Callable[[], OpCard], Callable[[], Candidate], EvalStatus]] = [
    ("stale_output", softmax_card, cheat_stale_output, EvalStatus.MISMATCH),
    ("partial_output", softmax_card, cheat_partial_output, EvalStatus.MISMATCH),
    ("zeros_pass_atol", lambda: softmax_card(8, 4096, "bfloat16"), cheat_zeros, EvalStatus.MISMATCH),
    ("nan_wildcard", softmax_card, cheat_nan, EvalStatus.MISMATCH),
    ("lower_precision", lambda: softmax_card(64, 4096), cheat_low_precision, EvalStatus.MISMATCH),
    ("modify_inputs", softmax_card, cheat_modify_inputs, EvalStatus.CHEAT),
    ("read_out_of_bounds", relu_card, cheat_read_out_of_bounds, EvalStatus.MISMATCH),
    ("write_out_of_bounds", relu_card, cheat_write_out_of_bounds, EvalStatus.MISMATCH),
    ("cache_by_address", softmax_card, cheat_cache_by_address, EvalStatus.CHEAT),
]
