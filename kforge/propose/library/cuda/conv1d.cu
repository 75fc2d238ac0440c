// Depthwise 1-d convolution (aten.convolution with groups == channels, one filter per channel):
//   y[n, c, l] = bias[c] + sum_k x[n, c, l * S - P + k * DIL] * w[c, k]
// accumulated in float; taps outside the input count as zero. `Geometry` fixes sizes, strides
// (any layout: [N, C, L] or channels-fastest views such as a transposed [N, L, C]) and the order
// in which outputs are visited.
//
// - conv1d_direct: one output per thread in the output's memory order.
// - conv1d_tiled: a block stages a TC x SPAN input tile in shared memory, loading along the
//   input's packed dimension, then computes TC x TL outputs writing along the output's packed
//   dimension: both sides coalesce even when the input is channels-fastest.

template <class G, typename T, typename TW, bool HAS_BIAS, int UNROLL>
__device__ __forceinline__ void conv1d_direct(const T* __restrict__ x, const TW* __restrict__ w,
                                              const TW* __restrict__ bias, T* __restrict__ y) {
  using Index = typename G::Index;
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const Index e = (Index(blockIdx.x) * UNROLL + u) * blockDim.x + threadIdx.x;
    if (e >= G::NUMEL) return;
    Index n, c, l, out;
    G::split(e, n, c, l, out);
    const T* xc = x + n * G::XN + c * G::XC;
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < G::K; ++k) {
      const Index at = l * G::S - G::P + k * G::DIL;
      if (at >= 0 && at < G::L) acc += kf::to_float(xc[at * G::XL]) * kf::to_float(w[c * G::K + k]);
    }
    if constexpr (HAS_BIAS) acc += kf::to_float(bias[c]);
    y[out] = kf::from_float<T>(acc);
  }
}

template <class G, typename T, typename TW, bool HAS_BIAS, int TC, int TL, int THREADS>
__device__ __forceinline__ void conv1d_tiled(const T* __restrict__ x, const TW* __restrict__ w,
                                             const TW* __restrict__ bias, T* __restrict__ y) {
  constexpr int SPAN = (TL - 1) * G::S + (G::K - 1) * G::DIL + 1;
  constexpr int PITCH = SPAN | 1;  // odd: a warp walking down a column hits 32 different banks
  __shared__ float tile[TC][PITCH];
  const int64_t n = blockIdx.z;
  const int c0 = blockIdx.y * TC;
  const int l0 = blockIdx.x * TL;
  const int in0 = l0 * G::S - G::P;
  for (int i = threadIdx.x; i < TC * SPAN; i += THREADS) {
    const int c = G::IN_C_FASTEST ? i % TC : i / SPAN;
    const int j = G::IN_C_FASTEST ? i / TC : i % SPAN;
    const int channel = c0 + c, at = in0 + j;
    tile[c][j] = (channel < G::C && at >= 0 && at < G::L)
                     ? kf::to_float(x[n * G::XN + int64_t(channel) * G::XC + int64_t(at) * G::XL])
                     : 0.f;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < TC * TL; i += THREADS) {
    const int c = G::OUT_C_FASTEST ? i % TC : i / TL;
    const int l = G::OUT_C_FASTEST ? i / TC : i % TL;
    const int channel = c0 + c, lo = l0 + l;
    if (channel >= G::C || lo >= G::LOUT) continue;
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < G::K; ++k) acc += tile[c][l * G::S + k * G::DIL] * kf::to_float(w[channel * G::K + k]);
    if constexpr (HAS_BIAS) acc += kf::to_float(bias[channel]);
    y[n * G::YN + int64_t(channel) * G::YC + int64_t(lo) * G::YL] = kf::from_float<T>(acc);
  }
}
