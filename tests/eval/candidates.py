"""Candidates in the kforge format for tests and benchmarks: naive but correct reference kernels,
and one candidate per known way of cheating (each must be rejected with the status given).

Each builder returns a ``Candidate``; ``REFERENCE`` maps op names to the reference builders and
``CHEATS`` lists ``(name, card builder, candidate, expected status)``.
"""

from __future__ import annotations

from collections.abc import Callable

from kforge.core.candidate import Candidate, EvalStatus
from kforge.core.opcard import OpCard

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

DTYPE_SUFFIX = """
SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
"""


def instantiate(template_call: str, name: str, params: str, args: str) -> str:
    """``extern "C"`` wrappers of a templated kernel body for fp32, fp16 and bf16."""
    out = []
    for suffix, ctype in (("f32", "float"), ("f16", "__half"), ("bf16", "__nv_bfloat16")):
        out.append(f'extern "C" __global__ void {name}_{suffix}({params.replace("T", ctype)}) '
                   f'{{ {template_call}<{ctype}>({args}); }}')
    return "\n".join(out)


# ----- softmax: aten._softmax.default(x, dim, half_to_float) over the last dim -----

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

SOFTMAX_LAUNCHER = DTYPE_SUFFIX + """
def launch(kernels, x, dim, half_to_float):
    if half_to_float or not x.is_contiguous() or dim not in (-1, x.dim() - 1):
        raise NotImplementedError("contiguous rows, softmax over the last dim only")
    cols = x.shape[-1]
    rows = x.numel() // cols
    out = torch.empty_like(x)
    kernels["softmax_" + SUFFIX[x.dtype]](rows, 256, x, out, np.int32(cols))
    return out
"""


def softmax() -> Candidate:
    source = CONVERT + REDUCE + SOFTMAX_BODY + instantiate(
        "softmax_row", "softmax", "const T* x, T* y, int cols", "x, y, cols")
    return Candidate(source, SOFTMAX_LAUNCHER, {"family": "reference", "approach": "block per row"})


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
    launcher = """
def launch(kernels, x, dim, half_to_float):
    cols = x.shape[-1]
    out = torch.empty_like(x)
    kernels.softmax_smem(x.numel() // cols, 512, x, out, np.int32(cols), shared_mem=cols * 4)
    return out
"""
    return Candidate(REDUCE + SOFTMAX_SMEM, launcher, {"family": "reference",
                                                       "approach": "row in shared memory"})


# ----- layer norm: aten.native_layer_norm.default(x, normalized_shape, weight, bias, eps) -----

LAYER_NORM_BODY = r"""
template <typename T>
__device__ void layer_norm_row(const T* __restrict__ x, const T* __restrict__ w,
                               const T* __restrict__ b, T* __restrict__ y, float* __restrict__ mean,
                               float* __restrict__ rstd, int cols, float eps, int affine) {
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
    if (threadIdx.x == 0) { mean[blockIdx.x] = mu; rstd[blockIdx.x] = r; }
}
"""

LAYER_NORM_LAUNCHER = DTYPE_SUFFIX + """
def launch(kernels, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    if not x.is_contiguous() or len(normalized_shape) != 1:
        raise NotImplementedError("contiguous input, one normalized dim")
    cols = x.shape[-1]
    rows = x.numel() // cols
    out = torch.empty_like(x)
    stats_shape = tuple(x.shape[:-1]) + (1,)
    mean = torch.empty(stats_shape, dtype=torch.float32, device=x.device)
    rstd = torch.empty(stats_shape, dtype=torch.float32, device=x.device)
    affine = (1 if weight is not None else 0) | (2 if bias is not None else 0)
    kernels["layer_norm_" + SUFFIX[x.dtype]](
        rows, 256, x, weight if weight is not None else x, bias if bias is not None else x,
        out, mean, rstd, np.int32(cols), np.float32(eps), np.int32(affine))
    return out, mean, rstd
"""


def layer_norm() -> Candidate:
    source = CONVERT + REDUCE + LAYER_NORM_BODY + instantiate(
        "layer_norm_row", "layer_norm",
        "const T* x, const T* w, const T* b, T* y, float* mean, float* rstd, int cols, "
        "float eps, int affine", "x, w, b, y, mean, rstd, cols, eps, affine")
    return Candidate(source, LAYER_NORM_LAUNCHER, {"family": "reference", "approach": "block per row"})


# ----- elementwise: aten.add.Tensor, aten.add_.Tensor, aten.relu.default -----

ELEMENTWISE = r"""
template <typename T>
__device__ void add_body(const T* __restrict__ x, const T* __restrict__ y, T* __restrict__ out,
                         long long n, float alpha) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = from_f<T>(to_f(x[i]) + alpha * to_f(y[i]));
}
template <typename T>
__device__ void relu_body(const T* __restrict__ x, T* __restrict__ out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = to_f(x[i]);
        out[i] = from_f<T>(v != v ? v : fmaxf(v, 0.f));
    }
}
"""

ADD_LAUNCHER = DTYPE_SUFFIX + """
def launch(kernels, x, y, alpha=1):
    if x.shape != y.shape or not (x.is_contiguous() and y.is_contiguous()) or x.dtype != y.dtype:
        raise NotImplementedError("same-shape contiguous operands")
    out = torch.empty_like(x)
    n = x.numel()
    kernels["add_" + SUFFIX[x.dtype]](min((n + 255) // 256, 65536), 256, x, y, out,
                                      np.int64(n), np.float32(alpha))
    return out
"""

ADD_INPLACE_LAUNCHER = DTYPE_SUFFIX + """
def launch(kernels, x, y, alpha=1):
    n = x.numel()
    kernels["add_" + SUFFIX[x.dtype]](min((n + 255) // 256, 65536), 256, x, y, x,
                                      np.int64(n), np.float32(alpha))
    return x
"""

RELU_LAUNCHER = DTYPE_SUFFIX + """
def launch(kernels, x):
    out = torch.empty_like(x)
    n = x.numel()
    kernels["relu_" + SUFFIX[x.dtype]](min((n + 255) // 256, 65536), 256, x, out, np.int64(n))
    return out
"""

ELEMENTWISE_SOURCE = CONVERT + ELEMENTWISE + "\n" + instantiate(
    "add_body", "add", "const T* x, const T* y, T* out, long long n, float alpha",
    "x, y, out, n, alpha") + "\n" + instantiate(
    "relu_body", "relu", "const T* x, T* out, long long n", "x, out, n")


def add() -> Candidate:
    return Candidate(ELEMENTWISE_SOURCE, ADD_LAUNCHER, {"family": "reference", "approach": "grid-stride"})


def add_inplace() -> Candidate:
    return Candidate(ELEMENTWISE_SOURCE, ADD_INPLACE_LAUNCHER,
                     {"family": "reference", "approach": "grid-stride in place"})


def relu() -> Candidate:
    return Candidate(ELEMENTWISE_SOURCE, RELU_LAUNCHER, {"family": "reference", "approach": "grid-stride"})


REFERENCE: dict[str, Callable[[], Candidate]] = {
    "aten._softmax.default": softmax,
    "aten.native_layer_norm.default": layer_norm,
    "aten.add.Tensor": add,
    "aten.add_.Tensor": add_inplace,
    "aten.relu.default": relu,
}


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


def _with_launcher(base: Candidate, launcher: str, approach: str) -> Candidate:
    return Candidate(base.source, launcher, {"family": "cheat", "approach": approach})


NOOP = r"""
extern "C" __global__ void noop(float* out) { }
"""


def _kernel(source: str, launcher: str, approach: str) -> Candidate:
    return Candidate(source, launcher, {"family": "cheat", "approach": approach})


def cheat_stale_output() -> Candidate:
    """Launches a kernel that writes nothing: hopes the output buffer still holds eager's result."""
    return _kernel(NOOP, """
def launch(kernels, x, dim, half_to_float):
    out = torch.empty_like(x)
    kernels.noop(1, 32, out)
    return out
""", "stale output buffer")


def cheat_no_kernel() -> Candidate:
    return _kernel(NOOP, """
def launch(kernels, x, dim, half_to_float):
    return torch.empty_like(x)
""", "launches nothing")


PARTIAL = SOFTMAX_BODY.replace("template <typename T>\n__device__ void softmax_row",
                               "template <typename T>\n__device__ void partial_row")


def cheat_partial_output() -> Candidate:
    """Computes only the first row."""
    source = CONVERT + REDUCE + PARTIAL + r"""
extern "C" __global__ void first_row(const float* x, float* y, int cols) { partial_row<float>(x, y, cols); }
"""
    return _kernel(source, """
def launch(kernels, x, dim, half_to_float):
    out = torch.empty_like(x)
    kernels.first_row(1, 256, x, out, np.int32(x.shape[-1]))
    return out
""", "first row only")


def cheat_zeros() -> Candidate:
    """All zeros: within atol=1e-2 of a bf16 softmax over 4096 columns, elementwise."""
    source = r"""
extern "C" __global__ void zeros(__nv_bfloat16* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16(0.f);
}
"""
    return _kernel(source, """
def launch(kernels, x, dim, half_to_float):
    out = torch.empty_like(x)
    kernels.zeros(1024, 256, out, np.int64(out.numel()))
    return out
""", "all zeros")


def cheat_nan() -> Candidate:
    """NaN everywhere, hoping NaN compares as a wildcard."""
    source = r"""
extern "C" __global__ void nans(float* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = NAN;
}
"""
    return _kernel(source, """
def launch(kernels, x, dim, half_to_float):
    out = torch.empty_like(x)
    kernels.nans(1024, 256, out, np.int64(out.numel()))
    return out
""", "NaN wildcard")


def cheat_low_precision() -> Candidate:
    """fp32 softmax whose input is rounded to bf16 first: each element looks close, the error
    norm does not."""
    source = CONVERT + REDUCE + SOFTMAX_BODY.replace(
        "template <typename T>\n__device__ void softmax_row",
        "template <typename T>\n__device__ void exact_row") + r"""
extern "C" __global__ void low_precision(const float* x, float* y, int cols) {
    __shared__ float red[32];
    const float* row = x + (long long)blockIdx.x * cols;
    float* out = y + (long long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, __bfloat162float(__float2bfloat16(row[c])));
    m = block_max(m, red);
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(__bfloat162float(__float2bfloat16(row[c])) - m);
    s = block_sum(s, red);
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        out[c] = expf(__bfloat162float(__float2bfloat16(row[c])) - m) / s;
}
"""
    return _kernel(source, """
def launch(kernels, x, dim, half_to_float):
    out = torch.empty_like(x)
    kernels.low_precision(x.numel() // x.shape[-1], 256, x, out, np.int32(x.shape[-1]))
    return out
""", "silently lowered precision")


def cheat_modify_inputs() -> Candidate:
    """Correct output, but uses the input as scratch space."""
    source = CONVERT + REDUCE + SOFTMAX_BODY + r"""
extern "C" __global__ void scribble(float* x, float* y, int cols) {
    softmax_row<float>(x, y, cols);
    __syncthreads();
    if (threadIdx.x == 0) x[(long long)blockIdx.x * cols] = 0.f;
}
"""
    return _kernel(source, """
def launch(kernels, x, dim, half_to_float):
    out = torch.empty_like(x)
    kernels.scribble(x.numel() // x.shape[-1], 256, x, out, np.int32(x.shape[-1]))
    return out
""", "modifies its inputs")


def cheat_read_out_of_bounds() -> Candidate:
    """relu that also reads one element past the end of its input."""
    source = r"""
extern "C" __global__ void relu_oob(const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f) + 0.f * x[i + 1];
}
"""
    return _kernel(source, """
def launch(kernels, x):
    out = torch.empty_like(x)
    n = x.numel()
    kernels.relu_oob((n + 255) // 256, 256, x, out, np.int64(n))
    return out
""", "reads out of bounds")


def cheat_write_out_of_bounds() -> Candidate:
    """Correct relu that also writes just before its input."""
    source = r"""
extern "C" __global__ void relu_oob_write(float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
    if (i == 0) x[-1] = 1.f;
}
"""
    return _kernel(source, """
def launch(kernels, x):
    out = torch.empty_like(x)
    n = x.numel()
    kernels.relu_oob_write((n + 255) // 256, 256, x, out, np.int64(n))
    return out
""", "writes out of bounds")


def cheat_cache_by_address(capacity: int = 1 << 20) -> Candidate:
    """Keeps its last result in device memory and replays it when called with the same input
    address again."""
    source = CONVERT + REDUCE + SOFTMAX_BODY + rf"""
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
    return _kernel(source, """
def launch(kernels, x, dim, half_to_float):
    out = torch.empty_like(x)
    hit = torch.empty((1,), dtype=torch.int32, device=x.device)
    kernels.check_address(1, 1, x, hit)
    kernels.replay(x.numel() // x.shape[-1], 256, x, out, np.int32(x.shape[-1]), hit)
    return out
""", "caches results by address")


def cheat_skip_when_timed(honest_calls: int) -> Candidate:
    """Computes for the first ``honest_calls`` calls (the verification runs), then skips the work."""
    source = CONVERT + REDUCE + SOFTMAX_BODY + r"""
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
    return _kernel(source, f"""
def launch(kernels, x, dim, half_to_float):
    out = torch.empty_like(x)
    kernels.count_call(1, 1, np.uint32({honest_calls}))
    kernels.maybe_softmax(x.numel() // x.shape[-1], 256, x, out, np.int32(x.shape[-1]))
    return out
""", "skips work when timed")


def _launcher_cheat(launcher: str, approach: str) -> Candidate:
    return _with_launcher(softmax(), launcher, approach)


def cheat_torch_function() -> Candidate:
    return _launcher_cheat("""
def launch(kernels, x, dim, half_to_float):
    out = torch.empty_like(x)
    kernels["softmax_f32"](1, 256, x, out, np.int32(x.shape[-1]))
    return torch.softmax(x, dim)
""", "calls torch.softmax")


def cheat_tensor_method() -> Candidate:
    return _launcher_cheat("""
def launch(kernels, x, dim, half_to_float):
    out = torch.empty_like(x)
    kernels["softmax_f32"](1, 256, x, out, np.int32(x.shape[-1]))
    try:
        return x.softmax(dim)
    except Exception:
        return out
""", "calls Tensor.softmax (and swallows the refusal)")


def cheat_vendor_library() -> Candidate:
    return _launcher_cheat("""
def launch(kernels, x, dim, half_to_float):
    out = torch.empty_like(x)
    kernels["softmax_f32"](x.numel() // x.shape[-1], 256, x, out, np.int32(x.shape[-1]))
    scores = x @ x.t()
    return out
""", "calls cuBLAS through matmul")


def cheat_side_stream() -> Candidate:
    return _launcher_cheat("""
def launch(kernels, x, dim, half_to_float):
    out = torch.empty_like(x)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        kernels["softmax_f32"](x.numel() // x.shape[-1], 256, x, out, np.int32(x.shape[-1]))
    return out
""", "works on a side stream")


def cheat_lazy_output() -> Candidate:
    return _launcher_cheat("""
def launch(kernels, x, dim, half_to_float):
    out = torch.empty_like(x)
    kernels["softmax_f32"](x.numel() // x.shape[-1], 256, x, out, np.int32(x.shape[-1]))
    return torch.empty(tuple(x.shape), dtype=x.dtype, device="meta")
""", "returns a tensor without data")


def cheat_thread() -> Candidate:
    return _launcher_cheat("""
import threading
def launch(kernels, x, dim, half_to_float):
    out = torch.empty_like(x)
    threading.Thread(target=lambda: None).start()
    kernels["softmax_f32"](x.numel() // x.shape[-1], 256, x, out, np.int32(x.shape[-1]))
    return out
""", "starts a thread")


def cheat_patch_timer() -> Candidate:
    return _launcher_cheat("""
def launch(kernels, x, dim, half_to_float):
    out = torch.empty_like(x)
    torch.cuda.synchronize = lambda *a: None
    kernels["softmax_f32"](x.numel() // x.shape[-1], 256, x, out, np.int32(x.shape[-1]))
    return out
""", "patches synchronize")


def cheat_gc_scan() -> Candidate:
    return _launcher_cheat("""
def launch(kernels, x, dim, half_to_float):
    import gc
    out = torch.empty_like(x)
    kernels["softmax_f32"](x.numel() // x.shape[-1], 256, x, out, np.int32(x.shape[-1]))
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.shape == x.shape and obj is not x:
            return obj
    return out
""", "scans gc for the expected output")


def cheat_dunder_escape() -> Candidate:
    return _launcher_cheat("""
def launch(kernels, x, dim, half_to_float):
    real_torch = x.__class__.__module__
    out = torch.empty_like(x)
    kernels["softmax_f32"](x.numel() // x.shape[-1], 256, x, out, np.int32(x.shape[-1]))
    return out
""", "reaches for dunder attributes")


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

CRASH_LAUNCHER = """
def launch(kernels, x, dim, half_to_float):
    out = torch.empty_like(x)
    kernels.wild(1, 32, out)
    return out
"""


def crasher(kind: str) -> Candidate:
    source, approach = CRASHERS[kind]
    return _kernel(source, CRASH_LAUNCHER, approach)


# (name, card, candidate, expected status). Cards are small so the suite runs in seconds.
CHEATS: list[tuple[str, Callable[[], OpCard], Callable[[], Candidate], EvalStatus]] = [
    ("stale_output", softmax_card, cheat_stale_output, EvalStatus.MISMATCH),
    ("no_kernel", softmax_card, cheat_no_kernel, EvalStatus.CHEAT),
    ("partial_output", softmax_card, cheat_partial_output, EvalStatus.MISMATCH),
    ("zeros_pass_atol", lambda: softmax_card(8, 4096, "bfloat16"), cheat_zeros, EvalStatus.MISMATCH),
    ("nan_wildcard", softmax_card, cheat_nan, EvalStatus.MISMATCH),
    ("lower_precision", lambda: softmax_card(64, 4096), cheat_low_precision, EvalStatus.MISMATCH),
    ("modify_inputs", softmax_card, cheat_modify_inputs, EvalStatus.CHEAT),
    ("read_out_of_bounds", relu_card, cheat_read_out_of_bounds, EvalStatus.MISMATCH),
    ("write_out_of_bounds", relu_card, cheat_write_out_of_bounds, EvalStatus.MISMATCH),
    ("cache_by_address", softmax_card, cheat_cache_by_address, EvalStatus.CHEAT),
    ("torch_function", softmax_card, cheat_torch_function, EvalStatus.CHEAT),
    ("tensor_method", softmax_card, cheat_tensor_method, EvalStatus.CHEAT),
    ("vendor_library", softmax_card, cheat_vendor_library, EvalStatus.CHEAT),
    ("side_stream", softmax_card, cheat_side_stream, EvalStatus.CHEAT),
    ("lazy_output", softmax_card, cheat_lazy_output, EvalStatus.CHEAT),
    ("background_thread", softmax_card, cheat_thread, EvalStatus.CHEAT),
    ("patch_timer", softmax_card, cheat_patch_timer, EvalStatus.CHEAT),
    ("gc_scan", softmax_card, cheat_gc_scan, EvalStatus.CHEAT),
    ("dunder_escape", softmax_card, cheat_dunder_escape, EvalStatus.CHEAT),
]
