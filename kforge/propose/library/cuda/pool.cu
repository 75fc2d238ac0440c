// Pooling windows over the last two dimensions, one thread per output (UNROLL outputs per thread,
// interleaved across the block so that writes coalesce). The candidate's `Geometry` splits an
// output index, taken in the output's memory order, into the input plane's offset, the output
// row and column, and the output offset; it also fixes sizes, strides and window constants.

// aten._adaptive_avg_pool2d: window [floor(i * H / OH), ceil((i + 1) * H / OH)) per axis.
template <class G, typename T, int UNROLL>
__device__ __forceinline__ void adaptive_avg_pool_window(const T* __restrict__ x, T* __restrict__ y) {
  using Index = typename G::Index;
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const Index e = (Index(blockIdx.x) * UNROLL + u) * blockDim.x + threadIdx.x;
    if (e >= G::NUMEL) return;
    Index plane, oh, ow, out;
    G::split(e, plane, oh, ow, out);
    const int h0 = int(oh * G::H / G::OH), h1 = int(((oh + 1) * G::H + G::OH - 1) / G::OH);
    const int w0 = int(ow * G::W / G::OW), w1 = int(((ow + 1) * G::W + G::OW - 1) / G::OW);
    float s = 0.f;
    for (int h = h0; h < h1; ++h) {
      for (int w = w0; w < w1; ++w) s += kf::to_float(x[plane + h * G::XH + w * G::XW]);
    }
    y[out] = kf::from_float<T>(s / (h1 - h0) / (w1 - w0));  // divided as eager divides
  }
}

// aten.max_pool2d_with_indices: the maximum and its flat index h * W + w in the input plane.
// NaN wins (the last one seen), and the start index is the first in-bounds tap, as in eager.
template <class G, typename T, int UNROLL>
__device__ __forceinline__ void max_pool_window(const T* __restrict__ x, T* __restrict__ y,
                                                int64_t* __restrict__ indices) {
  using Index = typename G::Index;
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const Index e = (Index(blockIdx.x) * UNROLL + u) * blockDim.x + threadIdx.x;
    if (e >= G::NUMEL) return;
    Index plane, oh, ow, out;
    G::split(e, plane, oh, ow, out);
    int h0 = int(oh) * G::SH - G::PH;
    int w0 = int(ow) * G::SW - G::PW;
    const int h1 = min(h0 + (G::KH - 1) * G::DH + 1, G::H);
    const int w1 = min(w0 + (G::KW - 1) * G::DW + 1, G::W);
    while (h0 < 0) h0 += G::DH;
    while (w0 < 0) w0 += G::DW;
    float best = -INFINITY;
    int64_t where = int64_t(h0) * G::W + w0;
    for (int h = h0; h < h1; h += G::DH) {
      for (int w = w0; w < w1; w += G::DW) {
        const float v = kf::to_float(x[plane + h * G::XH + w * G::XW]);
        if (v > best || isnan(v)) {
          best = v;
          where = int64_t(h) * G::W + w;
        }
      }
    }
    y[out] = kf::from_float<T>(best);
    indices[out] = where;
  }
}
