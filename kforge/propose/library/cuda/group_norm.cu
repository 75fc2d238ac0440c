// group_norm (aten.native_group_norm) over a packed [N, C, HW] input: group g of sample n is the
// D = C / G * HW consecutive elements starting at (n * G + g) * D.
//
// Eager keeps mean and rstd in the input's dtype (TS) and normalizes with those rounded values;
// so do these kernels, so that bf16 results match eager's and not a more precise answer.
//
// Variants:
// - group_norm_block_*: one block per group: statistics (Welford, or two passes), then normalize.
// - group_norm_split_*: SPLITS blocks per group, for few large groups (a VAE at high resolution
//   has 32 groups of millions of elements): partial Welford states to a workspace, then each
//   block merges them and normalizes its part. Two reads, one write, no atomics.

template <typename T, int THREADS, int VEC, int UNROLL>
__device__ __forceinline__ kf::Welford welford_range(const T* __restrict__ x, int64_t begin,
                                                     int64_t end) {
  constexpr int STEP = THREADS * VEC;
  kf::Welford acc = {0.f, 0.f, 0.f};
  for (int64_t base = begin + threadIdx.x * VEC; base < end; base += int64_t(STEP) * UNROLL) {
    float v[UNROLL][VEC];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (base + u * STEP < end) kf::load<T, VEC>(x + base + u * STEP, v[u]);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (base + u * STEP < end) acc = kf::welford_vector<VEC>(acc, v[u]);
    }
  }
  return acc;
}

// y = x * a + b per channel with a = rstd * w[c], b = bias[c] - a * mean, as eager computes it
// (and y = (x - mean) * rstd without weight and bias, again as eager does).
template <typename T, typename TW, int C, int HW, int G, int THREADS, int VEC, bool HAS_W, bool HAS_B>
__device__ __forceinline__ void normalize_range(const T* __restrict__ x, const TW* __restrict__ w,
                                                const TW* __restrict__ b, T* __restrict__ y,
                                                int64_t group, int64_t begin, int64_t end,
                                                float mean, float rstd) {
  constexpr int CPG = C / G;
  const int first_channel = int(group % G) * CPG;
  for (int64_t i = begin + threadIdx.x * VEC; i < end; i += THREADS * VEC) {
    const int c = first_channel + int((i % (int64_t(CPG) * HW)) / HW);
    const float a = rstd * (HAS_W ? kf::to_float(w[c]) : 1.f);
    const float shift = (HAS_B ? kf::to_float(b[c]) : 0.f) - a * mean;
    float v[VEC];
    kf::load<T, VEC>(x + i, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = HAS_W || HAS_B ? v[k] * a + shift : (v[k] - mean) * rstd;
    kf::store<T, VEC>(y + i, v);
  }
}

// Statistics of a whole group from its Welford state; mean and rstd rounded through TS.
template <typename TS>
__device__ __forceinline__ void finish_stats(kf::Welford acc, float eps, float& mean, float& rstd) {
  mean = kf::round_through<TS>(acc.mean);
  rstd = kf::round_through<TS>(rsqrtf(fmaxf(acc.m2 / acc.n, 0.f) + eps));
}

template <typename T, typename TW, typename TS, int C, int HW, int G, int THREADS, int VEC, int UNROLL,
          bool HAS_W, bool HAS_B>
__device__ __forceinline__ void group_norm_block_welford(const T* __restrict__ x,
                                                         const TW* __restrict__ w,
                                                         const TW* __restrict__ b, T* __restrict__ y,
                                                         TS* __restrict__ mean_out,
                                                         TS* __restrict__ rstd_out, float eps) {
  constexpr int64_t D = int64_t(C / G) * HW;
  __shared__ kf::Welford scratch[THREADS / 32];
  const int64_t group = blockIdx.x;
  const int64_t begin = group * D;
  kf::Welford acc = welford_range<T, THREADS, VEC, UNROLL>(x, begin, begin + D);
  acc = kf::block_allreduce<THREADS>(acc, scratch, kf::MergeWelford());
  float mean, rstd;
  finish_stats<TS>(acc, eps, mean, rstd);
  if (threadIdx.x == 0) {
    mean_out[group] = kf::from_float<TS>(mean);
    rstd_out[group] = kf::from_float<TS>(rstd);
  }
  normalize_range<T, TW, C, HW, G, THREADS, VEC, HAS_W, HAS_B>(x, w, b, y, group, begin, begin + D,
                                                               mean, rstd);
}

template <typename T, typename TW, typename TS, int C, int HW, int G, int THREADS, int VEC,
          bool HAS_W, bool HAS_B>
__device__ __forceinline__ void group_norm_block_two_pass(const T* __restrict__ x,
                                                          const TW* __restrict__ w,
                                                          const TW* __restrict__ b,
                                                          T* __restrict__ y,
                                                          TS* __restrict__ mean_out,
                                                          TS* __restrict__ rstd_out, float eps) {
  constexpr int64_t D = int64_t(C / G) * HW;
  __shared__ float scratch[THREADS / 32];
  const int64_t group = blockIdx.x;
  const int64_t begin = group * D;
  float s = 0.f;
  for (int64_t i = begin + threadIdx.x * VEC; i < begin + D; i += THREADS * VEC) {
    float v[VEC];
    kf::load<T, VEC>(x + i, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) s += v[k];
  }
  const float exact_mean = kf::block_allreduce<THREADS>(s, scratch, kf::Sum()) / D;
  float sq = 0.f;
  for (int64_t i = begin + threadIdx.x * VEC; i < begin + D; i += THREADS * VEC) {
    float v[VEC];
    kf::load<T, VEC>(x + i, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) sq += (v[k] - exact_mean) * (v[k] - exact_mean);
  }
  sq = kf::block_allreduce<THREADS>(sq, scratch, kf::Sum());
  float mean, rstd;
  finish_stats<TS>(kf::Welford{float(D), exact_mean, sq}, eps, mean, rstd);
  if (threadIdx.x == 0) {
    mean_out[group] = kf::from_float<TS>(mean);
    rstd_out[group] = kf::from_float<TS>(rstd);
  }
  normalize_range<T, TW, C, HW, G, THREADS, VEC, HAS_W, HAS_B>(x, w, b, y, group, begin, begin + D,
                                                               mean, rstd);
}

// The part of a group that block `split` of SPLITS covers: whole vectors, in order.
template <int64_t D, int SPLITS, int VEC>
__device__ __forceinline__ void split_range(int64_t group, int split, int64_t& begin, int64_t& end) {
  constexpr int64_t CHUNK = (D / VEC + SPLITS - 1) / SPLITS * VEC;
  begin = group * D + split * CHUNK;
  end = group * D + (split + 1 == SPLITS ? D : (split + 1) * CHUNK);
  if (end > group * D + D) end = group * D + D;
}

template <typename T, int C, int HW, int G, int SPLITS, int THREADS, int VEC, int UNROLL>
__device__ __forceinline__ void group_norm_split_stats(const T* __restrict__ x,
                                                       kf::Welford* __restrict__ parts) {
  constexpr int64_t D = int64_t(C / G) * HW;
  __shared__ kf::Welford scratch[THREADS / 32];
  const int64_t group = blockIdx.x / SPLITS;
  const int split = blockIdx.x % SPLITS;
  int64_t begin, end;
  split_range<D, SPLITS, VEC>(group, split, begin, end);
  kf::Welford acc = welford_range<T, THREADS, VEC, UNROLL>(x, begin, end);
  acc = kf::block_allreduce<THREADS>(acc, scratch, kf::MergeWelford());
  if (threadIdx.x == 0) parts[blockIdx.x] = acc;
}

template <typename T, typename TW, typename TS, int C, int HW, int G, int SPLITS, int THREADS, int VEC,
          bool HAS_W, bool HAS_B>
__device__ __forceinline__ void group_norm_split_apply(const T* __restrict__ x,
                                                       const TW* __restrict__ w,
                                                       const TW* __restrict__ b,
                                                       const kf::Welford* __restrict__ parts,
                                                       T* __restrict__ y, TS* __restrict__ mean_out,
                                                       TS* __restrict__ rstd_out, float eps) {
  constexpr int64_t D = int64_t(C / G) * HW;
  const int64_t group = blockIdx.x / SPLITS;
  const int split = blockIdx.x % SPLITS;
  // Every block merges the same parts in the same order, so all agree on mean and rstd.
  kf::Welford acc = parts[group * SPLITS];
  for (int s = 1; s < SPLITS; ++s) acc = kf::merge(acc, parts[group * SPLITS + s]);
  float mean, rstd;
  finish_stats<TS>(acc, eps, mean, rstd);
  if (split == 0 && threadIdx.x == 0) {
    mean_out[group] = kf::from_float<TS>(mean);
    rstd_out[group] = kf::from_float<TS>(rstd);
  }
  int64_t begin, end;
  split_range<D, SPLITS, VEC>(group, split, begin, end);
  normalize_range<T, TW, C, HW, G, THREADS, VEC, HAS_W, HAS_B>(x, w, b, y, group, begin, end, mean,
                                                               rstd);
}
