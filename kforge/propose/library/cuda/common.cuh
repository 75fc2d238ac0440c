// Helpers every library kernel uses: float conversion of the three storage types, aligned vector
// packs (one 128-bit load for 8 halves or 4 floats), and reductions across the threads of a row.
// Arithmetic is always done in float; storage types only appear at loads and stores.

namespace kf {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Round a float through a storage type, as eager does where it keeps statistics in T.
template <typename T> __device__ __forceinline__ float round_through(float v) {
  return to_float(from_float<T>(v));
}

// N consecutive elements moved as one access: alignas makes the compiler emit a single
// ld/st.global.v2/v4 when sizeof(T) * N is 8 or 16 bytes. With PACKED false the same elements
// move one at a time: the scalar twin of a vector kernel, for pointers not aligned for a pack.
template <typename T, int N> struct alignas(sizeof(T) * N) Pack { T v[N]; };

template <typename T, int N, bool PACKED = true>
__device__ __forceinline__ void load(const T* __restrict__ p, float (&out)[N]) {
  if constexpr (PACKED) {
    const Pack<T, N> pack = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(pack.v[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(p[i]);
  }
}

template <typename T, int N, bool PACKED = true>
__device__ __forceinline__ void store(T* __restrict__ p, const float (&in)[N]) {
  if constexpr (PACKED) {
    Pack<T, N> pack;
#pragma unroll
    for (int i = 0; i < N; ++i) pack.v[i] = from_float<T>(in[i]);
    *reinterpret_cast<Pack<T, N>*>(p) = pack;
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = from_float<T>(in[i]);
  }
}

// ----- reductions -----

struct Sum {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Running (max, sum of exp(x - max)) of online softmax. A part that saw only -inf has max -inf
// and sum 0 and must not turn the merge into NaN.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}
struct MergeMaxSum {
  __device__ __forceinline__ MaxSum operator()(MaxSum a, MaxSum b) const { return merge(a, b); }
};

// Welford state: count, mean and sum of squared deviations; parts merge exactly (Chan et al.).
struct Welford {
  float n, mean, m2;
};
__device__ __forceinline__ Welford welford_add(Welford w, float x) {
  w.n += 1.f;
  const float d = x - w.mean;
  w.mean += d / w.n;
  w.m2 += d * (x - w.mean);
  return w;
}
__device__ __forceinline__ Welford merge(Welford a, Welford b) {
  const float n = a.n + b.n;
  if (n == 0.f) return a;
  const float d = b.mean - a.mean;
  const float fb = b.n / n;
  return {n, a.mean + d * fb, a.m2 + b.m2 + d * d * a.n * fb};
}
// Welford over one vector: its own mean and m2 first (no division per element), then one merge.
template <int VEC>
__device__ __forceinline__ Welford welford_vector(Welford w, const float (&v)[VEC]) {
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < VEC; ++k) s += v[k];
  const float mean = s / VEC;
  float m2 = 0.f;
#pragma unroll
  for (int k = 0; k < VEC; ++k) m2 += (v[k] - mean) * (v[k] - mean);
  return merge(w, Welford{float(VEC), mean, m2});
}

struct MergeWelford {
  __device__ __forceinline__ Welford operator()(Welford a, Welford b) const { return merge(a, b); }
};

__device__ __forceinline__ float shfl_xor(float v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}
__device__ __forceinline__ MaxSum shfl_xor(MaxSum v, int lane_mask) {
  return {shfl_xor(v.m, lane_mask), shfl_xor(v.s, lane_mask)};
}
__device__ __forceinline__ Welford shfl_xor(Welford v, int lane_mask) {
  return {shfl_xor(v.n, lane_mask), shfl_xor(v.mean, lane_mask), shfl_xor(v.m2, lane_mask)};
}

// Reduce over groups of WIDTH consecutive lanes (WIDTH a power of two <= 32); every lane of the
// group gets the result. All 32 lanes of the warp must call it.
template <int WIDTH, typename V, typename Op>
__device__ __forceinline__ V group_allreduce(V v, Op op) {
#pragma unroll
  for (int mask = WIDTH / 2; mask > 0; mask >>= 1) v = op(v, shfl_xor(v, mask));
  return v;
}

// Reduce over the TPR consecutive threads that share a row (TPR a power of two); every thread of
// the row gets the result. Rows wider than a warp meet in `scratch`, which holds one slot per warp
// of the block. Every thread of the block must call it (it synchronizes when TPR > 32).
template <int TPR, typename V, typename Op>
__device__ __forceinline__ V row_allreduce(V v, V* scratch, Op op) {
  v = group_allreduce<(TPR < 32 ? TPR : 32)>(v, op);
  if constexpr (TPR > 32) {
    constexpr int WARPS = TPR / 32;
    const int warp = threadIdx.x / 32;
    const int first = warp - warp % WARPS;  // first warp of this row
    __syncthreads();  // the previous call's readers are done with scratch
    if (threadIdx.x % 32 == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[first];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) v = op(v, scratch[first + w]);
  }
  return v;
}

// Reduce over the whole block (blockDim.x == THREADS, a multiple of 32); every thread gets it.
template <int THREADS, typename V, typename Op>
__device__ __forceinline__ V block_allreduce(V v, V* scratch, Op op) {
  return row_allreduce<THREADS>(v, scratch, op);
}

}  // namespace kf
