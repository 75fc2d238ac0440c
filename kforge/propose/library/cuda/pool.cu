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

// max_pool_unrolled: the window's taps unrolled at compile time (all loads issued together, out-
// of-bounds taps predicated off), and OV consecutive outputs per thread, stored as one vector of
// values and one of indices. The group's outputs are neighbours along the output's innermost
// dimension: along W (contiguous layouts: each output has its own window) or, with C_INNER,
// along the channels (channels-last: one window, the channels' values loaded as a vector where
// the input packs them, XC == 1). Same NaN and index rules as max_pool_window. PACKED false (the
// scalar twin, for misaligned pointers) loads and stores element by element.
template <class G, typename T, int OV, int UNROLL, bool PACKED>
__device__ __forceinline__ void max_pool_unrolled(const T* __restrict__ x, T* __restrict__ y,
                                                  int64_t* __restrict__ indices) {
  using Index = typename G::Index;
  constexpr Index GROUPS = G::NUMEL / OV;
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const Index g = (Index(blockIdx.x) * UNROLL + u) * blockDim.x + threadIdx.x;
    if (g >= GROUPS) return;
    Index plane, oh, ow, out;
    G::split(g * OV, plane, oh, ow, out);
    float best[OV];
    int64_t where[OV];
#pragma unroll
    for (int k = 0; k < OV; ++k) {
      const int hs = int(oh) * G::SH - G::PH;
      const int ws = (int(ow) + (G::C_INNER ? 0 : k)) * G::SW - G::PW;
      // eager starts from the first in-bounds tap
      const int h_first = hs < 0 ? hs + (-hs + G::DH - 1) / G::DH * G::DH : hs;
      const int w_first = ws < 0 ? ws + (-ws + G::DW - 1) / G::DW * G::DW : ws;
      best[k] = -INFINITY;
      where[k] = int64_t(h_first) * G::W + w_first;
    }
    if constexpr (G::C_INNER && G::XC == 1 && OV > 1) {
      const int hs = int(oh) * G::SH - G::PH, ws = int(ow) * G::SW - G::PW;
      float v[G::KH][G::KW][OV];
#pragma unroll
      for (int kh = 0; kh < G::KH; ++kh) {
#pragma unroll
        for (int kw = 0; kw < G::KW; ++kw) {
          const int h = hs + kh * G::DH, w = ws + kw * G::DW;
          if (h >= 0 && h < G::H && w >= 0 && w < G::W) {
            kf::load<T, OV, PACKED>(x + plane + h * G::XH + w * G::XW, v[kh][kw]);
          }
        }
      }
#pragma unroll
      for (int kh = 0; kh < G::KH; ++kh) {
#pragma unroll
        for (int kw = 0; kw < G::KW; ++kw) {
          const int h = hs + kh * G::DH, w = ws + kw * G::DW;
          if (h >= 0 && h < G::H && w >= 0 && w < G::W) {
#pragma unroll
            for (int k = 0; k < OV; ++k) {
              if (v[kh][kw][k] > best[k] || isnan(v[kh][kw][k])) {
                best[k] = v[kh][kw][k];
                where[k] = int64_t(h) * G::W + w;
              }
            }
          }
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < OV; ++k) {
        const Index base = plane + (G::C_INNER ? Index(k) * G::XC : 0);
        const int hs = int(oh) * G::SH - G::PH;
        const int ws = (int(ow) + (G::C_INNER ? 0 : k)) * G::SW - G::PW;
        float v[G::KH][G::KW];
#pragma unroll
        for (int kh = 0; kh < G::KH; ++kh) {
#pragma unroll
          for (int kw = 0; kw < G::KW; ++kw) {
            const int h = hs + kh * G::DH, w = ws + kw * G::DW;
            if (h >= 0 && h < G::H && w >= 0 && w < G::W) {
              v[kh][kw] = kf::to_float(x[base + h * G::XH + w * G::XW]);
            }
          }
        }
#pragma unroll
        for (int kh = 0; kh < G::KH; ++kh) {
#pragma unroll
          for (int kw = 0; kw < G::KW; ++kw) {
            const int h = hs + kh * G::DH, w = ws + kw * G::DW;
            if (h >= 0 && h < G::H && w >= 0 && w < G::W && (v[kh][kw] > best[k] || isnan(v[kh][kw]))) {
              best[k] = v[kh][kw];
              where[k] = int64_t(h) * G::W + w;
            }
          }
        }
      }
    }
    kf::store<T, OV, PACKED>(y + out, best);
    if constexpr (PACKED) {
      kf::Pack<int64_t, OV> packed;
#pragma unroll
      for (int k = 0; k < OV; ++k) packed.v[k] = where[k];
      *reinterpret_cast<kf::Pack<int64_t, OV>*>(indices + out) = packed;
    } else {
#pragma unroll
      for (int k = 0; k < OV; ++k) indices[out + k] = where[k];
    }
  }
}
