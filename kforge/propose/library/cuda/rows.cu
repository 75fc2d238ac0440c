// Row kernels: softmax, layer_norm and rms_norm over the last dimension(s).
//
// A row of COLS elements is handled by TPR consecutive threads (a part of a warp, a warp, or
// several warps); a block holds RPB rows. Row r of the input starts at r * XSTRIDE elements (rows
// of a slice need not be packed); outputs are packed. Rows past `rows` still take part in the
// reductions (all threads of a block must), but never load or store.
//
// Variants:
// - *_registers: the row is loaded once into registers (ITEMS vectors per thread): one read, one
//   write. For rows up to a few thousand elements.
// - softmax_online / layer_norm_welford / rms_norm_loop: running statistics in one pass, then a
//   second read to write the output. For rows of any length.
// - softmax_two_pass / layer_norm_two_pass: the textbook passes (three reads): the reference.

template <int COLS, int TPR, int RPB>
struct RowIndex {
  int lane;  // this thread's place in its row
  int64_t row;
  bool live;
  __device__ __forceinline__ RowIndex(int64_t rows)
      : lane(threadIdx.x % TPR), row(int64_t(blockIdx.x) * RPB + threadIdx.x / TPR), live(row < rows) {}
};

// Slots for row_allreduce: one per warp of the block.
#define ROW_SCRATCH(type, name) __shared__ type name[(TPR * RPB + 31) / 32]

// ---------------------------------------------------------------------------------------------
// softmax

template <typename TI, typename TO, int COLS, int XSTRIDE, int TPR, int RPB, int VEC>
__device__ __forceinline__ void softmax_registers(const TI* __restrict__ x, TO* __restrict__ y,
                                                  int64_t rows) {
  constexpr int ITEMS = (COLS + TPR * VEC - 1) / (TPR * VEC);
  ROW_SCRATCH(float, scratch);
  const RowIndex<COLS, TPR, RPB> at(rows);
  const TI* xr = x + at.row * XSTRIDE;
  float v[ITEMS][VEC];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = (i * TPR + at.lane) * VEC;
    if (at.live && c < COLS) {
      kf::load<TI, VEC>(xr + c, v[i]);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[i][k] = -INFINITY;
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k) m = fmaxf(m, v[i][k]);
  }
  m = kf::row_allreduce<TPR>(m, scratch, kf::Max());
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      v[i][k] = __expf(v[i][k] - m);  // padding is -inf: exp gives 0
      s += v[i][k];
    }
  }
  s = kf::row_allreduce<TPR>(s, scratch, kf::Sum());
  const float inv = 1.f / s;
  TO* yr = y + at.row * COLS;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = (i * TPR + at.lane) * VEC;
    if (at.live && c < COLS) {
      float o[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] = v[i][k] * inv;
      kf::store<TO, VEC>(yr + c, o);
    }
  }
}

template <typename TI, typename TO, int COLS, int XSTRIDE, int TPR, int RPB, int VEC, int UNROLL>
__device__ __forceinline__ void softmax_online(const TI* __restrict__ x, TO* __restrict__ y,
                                               int64_t rows) {
  constexpr int STEP = TPR * VEC;
  ROW_SCRATCH(kf::MaxSum, scratch);
  const RowIndex<COLS, TPR, RPB> at(rows);
  const TI* xr = x + at.row * XSTRIDE;
  kf::MaxSum acc = {-INFINITY, 0.f};
  if (at.live) {
    for (int base = at.lane * VEC; base < COLS; base += STEP * UNROLL) {
      float v[UNROLL][VEC];
      float local = -INFINITY;
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {  // all loads first: UNROLL accesses in flight
        const int c = base + u * STEP;
        if (c < COLS) {
          kf::load<TI, VEC>(xr + c, v[u]);
        } else {
#pragma unroll
          for (int k = 0; k < VEC; ++k) v[u][k] = -INFINITY;
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) local = fmaxf(local, v[u][k]);
      }
      const float m = fmaxf(acc.m, local);
      if (m != -INFINITY) {
        float s = acc.s * __expf(acc.m - m);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
          for (int k = 0; k < VEC; ++k) s += __expf(v[u][k] - m);
        }
        acc = {m, s};
      }
    }
  }
  acc = kf::row_allreduce<TPR>(acc, scratch, kf::MergeMaxSum());
  if (!at.live) return;
  const float inv = 1.f / acc.s;
  TO* yr = y + at.row * COLS;
  for (int c = at.lane * VEC; c < COLS; c += STEP) {
    float v[VEC];
    kf::load<TI, VEC>(xr + c, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = __expf(v[k] - acc.m) * inv;
    kf::store<TO, VEC>(yr + c, v);
  }
}

template <typename TI, typename TO, int COLS, int XSTRIDE, int TPR, int RPB, int VEC>
__device__ __forceinline__ void softmax_two_pass(const TI* __restrict__ x, TO* __restrict__ y,
                                                 int64_t rows) {
  ROW_SCRATCH(float, scratch);
  const RowIndex<COLS, TPR, RPB> at(rows);
  const TI* xr = x + at.row * XSTRIDE;
  float m = -INFINITY;
  if (at.live) {
    for (int c = at.lane * VEC; c < COLS; c += TPR * VEC) {
      float v[VEC];
      kf::load<TI, VEC>(xr + c, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) m = fmaxf(m, v[k]);
    }
  }
  m = kf::row_allreduce<TPR>(m, scratch, kf::Max());
  float s = 0.f;
  if (at.live) {
    for (int c = at.lane * VEC; c < COLS; c += TPR * VEC) {
      float v[VEC];
      kf::load<TI, VEC>(xr + c, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) s += expf(v[k] - m);
    }
  }
  s = kf::row_allreduce<TPR>(s, scratch, kf::Sum());
  if (!at.live) return;
  TO* yr = y + at.row * COLS;
  for (int c = at.lane * VEC; c < COLS; c += TPR * VEC) {
    float v[VEC];
    kf::load<TI, VEC>(xr + c, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = expf(v[k] - m) / s;
    kf::store<TO, VEC>(yr + c, v);
  }
}

// ---------------------------------------------------------------------------------------------
// layer_norm: y = (x - mean) * rstd * w + b, with mean and rstd (float) per row as eager returns.

template <typename TW, int VEC, bool HAS>
__device__ __forceinline__ void load_affine(const TW* __restrict__ p, int c, float fallback,
                                            float (&out)[VEC]) {
  if constexpr (HAS) {
    kf::load<TW, VEC>(p + c, out);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = fallback;
  }
}

template <typename T, typename TW, int VEC, bool HAS_W, bool HAS_B>
__device__ __forceinline__ void store_normalized(const float (&v)[VEC], float mean, float rstd,
                                                 const TW* __restrict__ w, const TW* __restrict__ b,
                                                 T* __restrict__ yr, int c) {
  float wv[VEC], bv[VEC], o[VEC];
  load_affine<TW, VEC, HAS_W>(w, c, 1.f, wv);
  load_affine<TW, VEC, HAS_B>(b, c, 0.f, bv);
#pragma unroll
  for (int k = 0; k < VEC; ++k) o[k] = (v[k] - mean) * rstd * wv[k] + bv[k];
  kf::store<T, VEC>(yr + c, o);
}

template <typename T, typename TW, int COLS, int XSTRIDE, int TPR, int RPB, int VEC, bool HAS_W,
          bool HAS_B>
__device__ __forceinline__ void layer_norm_registers(const T* __restrict__ x, const TW* __restrict__ w,
                                                     const TW* __restrict__ b, T* __restrict__ y,
                                                     float* __restrict__ mean_out,
                                                     float* __restrict__ rstd_out, int64_t rows,
                                                     float eps) {
  constexpr int ITEMS = (COLS + TPR * VEC - 1) / (TPR * VEC);
  ROW_SCRATCH(float, scratch);
  const RowIndex<COLS, TPR, RPB> at(rows);
  const T* xr = x + at.row * XSTRIDE;
  float v[ITEMS][VEC];
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = (i * TPR + at.lane) * VEC;
    if (at.live && c < COLS) {
      kf::load<T, VEC>(xr + c, v[i]);
#pragma unroll
      for (int k = 0; k < VEC; ++k) s += v[i][k];
    }
  }
  const float mean = kf::row_allreduce<TPR>(s, scratch, kf::Sum()) / COLS;
  float sq = 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = (i * TPR + at.lane) * VEC;
    if (at.live && c < COLS) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float d = v[i][k] - mean;
        sq += d * d;
      }
    }
  }
  const float var = kf::row_allreduce<TPR>(sq, scratch, kf::Sum()) / COLS;
  const float rstd = rsqrtf(var + eps);
  if (!at.live) return;
  T* yr = y + at.row * COLS;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = (i * TPR + at.lane) * VEC;
    if (c < COLS) store_normalized<T, TW, VEC, HAS_W, HAS_B>(v[i], mean, rstd, w, b, yr, c);
  }
  if (at.lane == 0) {
    mean_out[at.row] = mean;
    rstd_out[at.row] = rstd;
  }
}

template <typename T, typename TW, int COLS, int XSTRIDE, int TPR, int RPB, int VEC, int UNROLL,
          bool HAS_W, bool HAS_B>
__device__ __forceinline__ void layer_norm_welford(const T* __restrict__ x, const TW* __restrict__ w,
                                                   const TW* __restrict__ b, T* __restrict__ y,
                                                   float* __restrict__ mean_out,
                                                   float* __restrict__ rstd_out, int64_t rows,
                                                   float eps) {
  constexpr int STEP = TPR * VEC;
  ROW_SCRATCH(kf::Welford, scratch);
  const RowIndex<COLS, TPR, RPB> at(rows);
  const T* xr = x + at.row * XSTRIDE;
  kf::Welford acc = {0.f, 0.f, 0.f};
  if (at.live) {
    for (int base = at.lane * VEC; base < COLS; base += STEP * UNROLL) {
      float v[UNROLL][VEC];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        if (base + u * STEP < COLS) kf::load<T, VEC>(xr + base + u * STEP, v[u]);
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        if (base + u * STEP < COLS) acc = kf::welford_vector<VEC>(acc, v[u]);
      }
    }
  }
  acc = kf::row_allreduce<TPR>(acc, scratch, kf::MergeWelford());
  if (!at.live) return;
  const float mean = acc.mean;
  const float var = acc.m2 / COLS;  // kept NaN where the row holds a NaN or inf, as eager
  const float rstd = rsqrtf((var < 0.f ? 0.f : var) + eps);
  T* yr = y + at.row * COLS;
  for (int c = at.lane * VEC; c < COLS; c += STEP) {
    float v[VEC];
    kf::load<T, VEC>(xr + c, v);
    store_normalized<T, TW, VEC, HAS_W, HAS_B>(v, mean, rstd, w, b, yr, c);
  }
  if (at.lane == 0) {
    mean_out[at.row] = mean;
    rstd_out[at.row] = rstd;
  }
}

template <typename T, typename TW, int COLS, int XSTRIDE, int TPR, int RPB, int VEC, bool HAS_W,
          bool HAS_B>
__device__ __forceinline__ void layer_norm_two_pass(const T* __restrict__ x, const TW* __restrict__ w,
                                                    const TW* __restrict__ b, T* __restrict__ y,
                                                    float* __restrict__ mean_out,
                                                    float* __restrict__ rstd_out, int64_t rows,
                                                    float eps) {
  ROW_SCRATCH(float, scratch);
  const RowIndex<COLS, TPR, RPB> at(rows);
  const T* xr = x + at.row * XSTRIDE;
  float s = 0.f;
  if (at.live) {
    for (int c = at.lane * VEC; c < COLS; c += TPR * VEC) {
      float v[VEC];
      kf::load<T, VEC>(xr + c, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) s += v[k];
    }
  }
  const float mean = kf::row_allreduce<TPR>(s, scratch, kf::Sum()) / COLS;
  float sq = 0.f;
  if (at.live) {
    for (int c = at.lane * VEC; c < COLS; c += TPR * VEC) {
      float v[VEC];
      kf::load<T, VEC>(xr + c, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) sq += (v[k] - mean) * (v[k] - mean);
    }
  }
  const float rstd = rsqrtf(kf::row_allreduce<TPR>(sq, scratch, kf::Sum()) / COLS + eps);
  if (!at.live) return;
  T* yr = y + at.row * COLS;
  for (int c = at.lane * VEC; c < COLS; c += TPR * VEC) {
    float v[VEC];
    kf::load<T, VEC>(xr + c, v);
    store_normalized<T, TW, VEC, HAS_W, HAS_B>(v, mean, rstd, w, b, yr, c);
  }
  if (at.lane == 0) {
    mean_out[at.row] = mean;
    rstd_out[at.row] = rstd;
  }
}

// ---------------------------------------------------------------------------------------------
// rms_norm (aten._fused_rms_norm): y = x * rstd * w, rstd = rsqrt(mean(x^2) + eps) per row.

template <typename T, typename TW, int VEC, bool HAS_W>
__device__ __forceinline__ void store_rms(const float (&v)[VEC], float rstd, const TW* __restrict__ w,
                                          T* __restrict__ yr, int c) {
  float wv[VEC], o[VEC];
  load_affine<TW, VEC, HAS_W>(w, c, 1.f, wv);
#pragma unroll
  for (int k = 0; k < VEC; ++k) o[k] = v[k] * rstd * wv[k];
  kf::store<T, VEC>(yr + c, o);
}

template <typename T, typename TW, int COLS, int XSTRIDE, int TPR, int RPB, int VEC, bool HAS_W>
__device__ __forceinline__ void rms_norm_registers(const T* __restrict__ x, const TW* __restrict__ w,
                                                   T* __restrict__ y, float* __restrict__ rstd_out,
                                                   int64_t rows, float eps) {
  constexpr int ITEMS = (COLS + TPR * VEC - 1) / (TPR * VEC);
  ROW_SCRATCH(float, scratch);
  const RowIndex<COLS, TPR, RPB> at(rows);
  const T* xr = x + at.row * XSTRIDE;
  float v[ITEMS][VEC];
  float sq = 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = (i * TPR + at.lane) * VEC;
    if (at.live && c < COLS) {
      kf::load<T, VEC>(xr + c, v[i]);
#pragma unroll
      for (int k = 0; k < VEC; ++k) sq += v[i][k] * v[i][k];
    }
  }
  const float rstd = rsqrtf(kf::row_allreduce<TPR>(sq, scratch, kf::Sum()) / COLS + eps);
  if (!at.live) return;
  T* yr = y + at.row * COLS;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = (i * TPR + at.lane) * VEC;
    if (c < COLS) store_rms<T, TW, VEC, HAS_W>(v[i], rstd, w, yr, c);
  }
  if (at.lane == 0) rstd_out[at.row] = rstd;
}

template <typename T, typename TW, int COLS, int XSTRIDE, int TPR, int RPB, int VEC, int UNROLL,
          bool HAS_W>
__device__ __forceinline__ void rms_norm_loop(const T* __restrict__ x, const TW* __restrict__ w,
                                              T* __restrict__ y, float* __restrict__ rstd_out,
                                              int64_t rows, float eps) {
  constexpr int STEP = TPR * VEC;
  ROW_SCRATCH(float, scratch);
  const RowIndex<COLS, TPR, RPB> at(rows);
  const T* xr = x + at.row * XSTRIDE;
  float sq = 0.f;
  if (at.live) {
    for (int base = at.lane * VEC; base < COLS; base += STEP * UNROLL) {
      float v[UNROLL][VEC];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        if (base + u * STEP < COLS) kf::load<T, VEC>(xr + base + u * STEP, v[u]);
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        if (base + u * STEP < COLS) {
#pragma unroll
          for (int k = 0; k < VEC; ++k) sq += v[u][k] * v[u][k];
        }
      }
    }
  }
  const float rstd = rsqrtf(kf::row_allreduce<TPR>(sq, scratch, kf::Sum()) / COLS + eps);
  if (!at.live) return;
  T* yr = y + at.row * COLS;
  for (int c = at.lane * VEC; c < COLS; c += STEP) {
    float v[VEC];
    kf::load<T, VEC>(xr + c, v);
    store_rms<T, TW, VEC, HAS_W>(v, rstd, w, yr, c);
  }
  if (at.lane == 0) rstd_out[at.row] = rstd;
}

// ---------------------------------------------------------------------------------------------
// Columns: the normalized dimension R is not the innermost. The input is seen as [K1, R, K2] with
// K2 packed (a transposed view such as a [B, C, H*W] tensor read as [B, H*W, C]), and a row to
// normalize is one column k2 of one k1: R elements XSR apart. A block takes COLS consecutive
// columns of one k1, all R elements of each, into shared memory with VEC-wide loads along K2 (so
// that reads coalesce), finds each column's statistics there (TPC = THREADS / COLS threads per
// column), and writes the outputs in their own layout: along R with OVEC-wide stores where the
// output packs R innermost (the norms' outputs), else along K2 like the reads (softmax's).
// Statistics go to k1 * SS1 + k2 * SS2.

// What a columns kernel computes.
constexpr int KIND_LAYER_NORM = 0, KIND_RMS_NORM = 1, KIND_SOFTMAX = 2;

template <int KIND, typename TI, typename TO, typename TW, int R, int K2, long long XS1,
          long long XSR, long long YS1, long long YS2, long long YSR, long long SS1, long long SS2,
          int COLS, int PITCH, int VEC, int OVEC, int THREADS, bool HAS_W, bool HAS_B, bool PACKED>
__device__ __forceinline__ void norm_columns(const TI* __restrict__ x, const TW* __restrict__ w,
                                             const TW* __restrict__ b, TO* __restrict__ y,
                                             float* __restrict__ stat0, float* __restrict__ stat1,
                                             float eps) {
  constexpr int TPC = THREADS / COLS;
  constexpr int SLOTS = COLS / VEC;  // vectors of a tile row
  __shared__ TI tile[R * PITCH];
  __shared__ float first_stat[COLS], second_stat[COLS];
  const int64_t k1 = blockIdx.y;
  const int k2_first = blockIdx.x * COLS;
  const TI* xb = x + k1 * XS1 + k2_first;

  for (int i = threadIdx.x; i < R * SLOTS; i += THREADS) {
    const int r = i / SLOTS, slot = i % SLOTS;
    if (k2_first + slot * VEC < K2) {
      const TI* src = xb + r * XSR + slot * VEC;
      kf::Pack<TI, VEC> v;
      if constexpr (PACKED) {
        v = *reinterpret_cast<const kf::Pack<TI, VEC>*>(src);
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) v.v[k] = src[k];
      }
#pragma unroll
      for (int k = 0; k < VEC; ++k) tile[r * PITCH + slot * VEC + k] = v.v[k];
    }
  }
  __syncthreads();

  const int col = threadIdx.x / TPC, lane = threadIdx.x % TPC;
  const TI* column = tile + col;
  float a, c;  // layer_norm: mean, rstd; rms_norm: unused, rstd; softmax: max, 1 / sum
  if constexpr (KIND == KIND_SOFTMAX) {
    float m = -INFINITY;
    for (int r = lane; r < R; r += TPC) m = fmaxf(m, kf::to_float(column[r * PITCH]));
    m = kf::group_allreduce<TPC>(m, kf::Max());
    float s = 0.f;
    for (int r = lane; r < R; r += TPC) s += __expf(kf::to_float(column[r * PITCH]) - m);
    a = m;
    c = 1.f / kf::group_allreduce<TPC>(s, kf::Sum());
  } else if constexpr (KIND == KIND_RMS_NORM) {
    float sq = 0.f;
    for (int r = lane; r < R; r += TPC) {
      const float v = kf::to_float(column[r * PITCH]);
      sq += v * v;
    }
    a = 0.f;
    c = rsqrtf(kf::group_allreduce<TPC>(sq, kf::Sum()) / R + eps);
  } else {
    float s = 0.f;
    for (int r = lane; r < R; r += TPC) s += kf::to_float(column[r * PITCH]);
    a = kf::group_allreduce<TPC>(s, kf::Sum()) / R;
    float sq = 0.f;
    for (int r = lane; r < R; r += TPC) {
      const float d = kf::to_float(column[r * PITCH]) - a;
      sq += d * d;
    }
    c = rsqrtf(kf::group_allreduce<TPC>(sq, kf::Sum()) / R + eps);
  }
  if (lane == 0) {
    first_stat[col] = a;
    second_stat[col] = c;
    if (k2_first + col < K2) {
      const int64_t at = k1 * SS1 + int64_t(k2_first + col) * SS2;
      if constexpr (KIND == KIND_LAYER_NORM) {
        stat0[at] = a;
        stat1[at] = c;
      } else if constexpr (KIND == KIND_RMS_NORM) {
        stat0[at] = c;
      }
    }
  }
  __syncthreads();

  const auto finish = [&](float v, int r, int column_index) -> float {
    const float sa = first_stat[column_index], sc = second_stat[column_index];
    if constexpr (KIND == KIND_SOFTMAX) {
      return __expf(v - sa) * sc;
    } else {
      const float wv = HAS_W ? kf::to_float(w[r]) : 1.f;
      const float bv = HAS_B ? kf::to_float(b[r]) : 0.f;
      return (KIND == KIND_RMS_NORM ? v : v - sa) * sc * wv + bv;
    }
  };
  TO* yb = y + k1 * YS1;
  if constexpr (YSR == 1) {  // along R, OVEC outputs per store
    constexpr int RSLOTS = R / OVEC;
    for (int i = threadIdx.x; i < COLS * RSLOTS; i += THREADS) {
      const int out_col = i / RSLOTS, r0 = (i % RSLOTS) * OVEC;
      if (k2_first + out_col >= K2) continue;
      float o[OVEC];
#pragma unroll
      for (int k = 0; k < OVEC; ++k) {
        o[k] = finish(kf::to_float(tile[(r0 + k) * PITCH + out_col]), r0 + k, out_col);
      }
      kf::store<TO, OVEC, PACKED>(yb + int64_t(k2_first + out_col) * YS2 + r0, o);
    }
  } else {  // along K2 (YS2 == 1), as the reads
    for (int i = threadIdx.x; i < R * SLOTS; i += THREADS) {
      const int r = i / SLOTS, slot = i % SLOTS;
      if (k2_first + slot * VEC >= K2) continue;
      float o[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        o[k] = finish(kf::to_float(tile[r * PITCH + slot * VEC + k]), r, slot * VEC + k);
      }
      kf::store<TO, VEC, PACKED>(yb + r * YSR + k2_first + slot * VEC, o);
    }
  }
}
