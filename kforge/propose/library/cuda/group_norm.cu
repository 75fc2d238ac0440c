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
  const float var = acc.m2 / acc.n;  // kept NaN where the group holds a NaN or inf, as eager
  rstd = kf::round_through<TS>(rsqrtf((var < 0.f ? 0.f : var) + eps));
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

// ---------------------------------------------------------------------------------------------
// Single pass: a group stays on chip while its statistics are found and is normalized from there
// (one read, one write). Each of the PARTS blocks of a group holds CHUNK consecutive elements of
// it in dynamic shared memory, in the storage type, and finds their exact mean and m2 (two passes
// over shared memory); the parts' states merge in rank order, so every block agrees.
// - group_norm_cluster: the group's blocks form a thread-block cluster (PARTS = 1: one block holds
//   the whole group) and read one another's states from distributed shared memory.
// - group_norm_chained: blocks take tickets in the order they start (group = ticket / PARTS), put
//   their states in `parts` and wait until their group's PARTS states are in. A block waits only
//   for blocks holding its own group's tickets; earlier tickets are running or done, later ones of
//   its group start as soon as blocks of earlier groups finish. So a group's PARTS blocks must fit
//   on the GPU at once: PARTS stays well below the number of resident blocks.

// Copy `count` elements (a multiple of VEC) from src to part, and return their statistics. Whole
// vectors of 4 to 16 bytes go by asynchronous copies (cp.async): every copy of the part is in
// flight at once and none passes through registers; narrower vectors, and the scalar twin for
// misaligned pointers (PACKED false), go through registers, UNROLL loads in flight per thread.
template <typename T, int THREADS, int VEC, int UNROLL, bool PACKED>
__device__ __forceinline__ kf::Welford load_part(const T* __restrict__ src, T* __restrict__ part,
                                                 int count) {
  using P = kf::Pack<T, VEC>;
  constexpr int STEP = THREADS * VEC;
  constexpr int BYTES = int(sizeof(P));
  __shared__ float scratch[THREADS / 32];
  float s = 0.f;
  if constexpr (PACKED && (BYTES == 4 || BYTES == 8 || BYTES == 16)) {
    for (int i = threadIdx.x * VEC; i < count; i += STEP) kf::copy_async<BYTES>(part + i, src + i);
    kf::wait_async();
    // Each thread reads back only the elements it copied.
    for (int i = threadIdx.x * VEC; i < count; i += STEP) {
      const P v = *reinterpret_cast<const P*>(part + i);
#pragma unroll
      for (int k = 0; k < VEC; ++k) s += kf::to_float(v.v[k]);
    }
  } else {
    for (int base = threadIdx.x * VEC; base < count; base += STEP * UNROLL) {
      P v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {  // all loads first
        if (base + u * STEP < count) {
          if constexpr (PACKED) {
            v[u] = *reinterpret_cast<const P*>(src + base + u * STEP);
          } else {
#pragma unroll
            for (int k = 0; k < VEC; ++k) v[u].v[k] = src[base + u * STEP + k];
          }
        }
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        if (base + u * STEP < count) {
          *reinterpret_cast<P*>(part + base + u * STEP) = v[u];
#pragma unroll
          for (int k = 0; k < VEC; ++k) s += kf::to_float(v[u].v[k]);
        }
      }
    }
  }
  // Each thread reads back only the elements it wrote: no barrier needed before the next pass.
  const float mean = kf::block_allreduce<THREADS>(s, scratch, kf::Sum()) / count;
  float m2 = 0.f;
  for (int i = threadIdx.x * VEC; i < count; i += STEP) {
    const P v = *reinterpret_cast<const P*>(part + i);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float d = kf::to_float(v.v[k]) - mean;
      m2 += d * d;
    }
  }
  return {float(count), mean, kf::block_allreduce<THREADS>(m2, scratch, kf::Sum())};
}

// Normalize `count` elements of `part` (element `begin` of group `group` onwards) into dst, as
// normalize_range does.
template <typename T, typename TW, int C, int HW, int G, int THREADS, int VEC, bool HAS_W, bool HAS_B,
          bool PACKED>
__device__ __forceinline__ void normalize_part(const T* __restrict__ part, const TW* __restrict__ w,
                                               const TW* __restrict__ b, T* __restrict__ dst,
                                               int64_t group, int64_t begin, int count, float mean,
                                               float rstd) {
  using P = kf::Pack<T, VEC>;
  const int first_channel = int(group % G) * (C / G);
  for (int i = threadIdx.x * VEC; i < count; i += THREADS * VEC) {
    const int c = first_channel + int((begin + i) / HW);
    const float a = rstd * (HAS_W ? kf::to_float(w[c]) : 1.f);
    const float shift = (HAS_B ? kf::to_float(b[c]) : 0.f) - a * mean;
    const P v = *reinterpret_cast<const P*>(part + i);
    float o[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float e = kf::to_float(v.v[k]);
      o[k] = HAS_W || HAS_B ? e * a + shift : (e - mean) * rstd;
    }
    kf::store<T, VEC, PACKED>(dst + i, o);
  }
}

template <int64_t D, int PARTS, int VEC>
__device__ __forceinline__ int part_count(int rank, int64_t& begin) {
  constexpr int64_t CHUNK = (D / VEC + PARTS - 1) / PARTS * VEC;
  begin = rank * CHUNK;
  return int(D - begin < CHUNK ? D - begin : CHUNK);
}

template <typename T, typename TW, typename TS, int C, int HW, int G, int PARTS, int THREADS, int VEC,
          int UNROLL, bool HAS_W, bool HAS_B, bool PACKED>
__device__ __forceinline__ void group_norm_cluster(const T* __restrict__ x, const TW* __restrict__ w,
                                                   const TW* __restrict__ b, T* __restrict__ y,
                                                   TS* __restrict__ mean_out,
                                                   TS* __restrict__ rstd_out, float eps) {
  constexpr int64_t D = int64_t(C / G) * HW;
  extern __shared__ __align__(16) unsigned char on_chip[];
  T* part = reinterpret_cast<T*>(on_chip);
  __shared__ kf::Welford state;
  __shared__ float stats[2];
  const int rank = PARTS > 1 ? int(kf::cluster_rank()) : 0;
  const int64_t group = blockIdx.x / PARTS;
  int64_t begin;
  const int count = part_count<D, PARTS, VEC>(rank, begin);
  const kf::Welford mine = load_part<T, THREADS, VEC, UNROLL, PACKED>(x + group * D + begin, part, count);
  if (threadIdx.x == 0) state = mine;
  if constexpr (PARTS > 1) {
    kf::cluster_sync();  // every block's state is written
  } else {
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    kf::Welford acc = PARTS > 1 ? kf::cluster_load(&state, 0) : state;
    for (int r = 1; r < PARTS; ++r) acc = kf::merge(acc, kf::cluster_load(&state, r));
    finish_stats<TS>(acc, eps, stats[0], stats[1]);
    if (rank == 0) {
      mean_out[group] = kf::from_float<TS>(stats[0]);
      rstd_out[group] = kf::from_float<TS>(stats[1]);
    }
  }
  __syncthreads();
  if constexpr (PARTS > 1) kf::cluster_arrive();  // done reading the other blocks' states
  normalize_part<T, TW, C, HW, G, THREADS, VEC, HAS_W, HAS_B, PACKED>(part, w, b, y + group * D + begin, group,
                                                              begin, count, stats[0], stats[1]);
  if constexpr (PARTS > 1) kf::cluster_wait();  // no block leaves while another may read its state
}

// `sync`: a ticket counter, then one arrival counter per group, all zero at launch.
template <typename T, typename TW, typename TS, int C, int HW, int G, int PARTS, int THREADS, int VEC,
          int UNROLL, bool HAS_W, bool HAS_B, bool PACKED>
__device__ __forceinline__ void group_norm_chained(const T* __restrict__ x, const TW* __restrict__ w,
                                                   const TW* __restrict__ b, T* __restrict__ y,
                                                   TS* __restrict__ mean_out,
                                                   TS* __restrict__ rstd_out,
                                                   unsigned* __restrict__ sync,
                                                   kf::Welford* __restrict__ parts, float eps) {
  constexpr int64_t D = int64_t(C / G) * HW;
  extern __shared__ __align__(16) unsigned char on_chip[];
  T* part = reinterpret_cast<T*>(on_chip);
  __shared__ unsigned ticket;
  __shared__ float stats[2];
  if (threadIdx.x == 0) ticket = atomicAdd(sync, 1u);
  __syncthreads();
  const int64_t group = ticket / PARTS;
  const int rank = int(ticket % PARTS);
  int64_t begin;
  const int count = part_count<D, PARTS, VEC>(rank, begin);
  const kf::Welford mine = load_part<T, THREADS, VEC, UNROLL, PACKED>(x + group * D + begin, part, count);
  if (threadIdx.x == 0) {
    parts[ticket] = mine;
    unsigned* arrived = sync + 1 + group;
    kf::add_release(arrived, 1u);
    while (kf::load_acquire(arrived) < PARTS) __nanosleep(64);
    const kf::Welford* states = parts + group * PARTS;
    kf::Welford acc = {0.f, 0.f, 0.f};
    for (int r = 0; r < PARTS; ++r) {  // from L2: the states were written by other SMs
      acc = kf::merge(acc, kf::Welford{__ldcg(&states[r].n), __ldcg(&states[r].mean),
                                       __ldcg(&states[r].m2)});
    }
    finish_stats<TS>(acc, eps, stats[0], stats[1]);
    if (rank == 0) {
      mean_out[group] = kf::from_float<TS>(stats[0]);
      rstd_out[group] = kf::from_float<TS>(stats[1]);
    }
  }
  __syncthreads();
  normalize_part<T, TW, C, HW, G, THREADS, VEC, HAS_W, HAS_B, PACKED>(part, w, b, y + group * D + begin, group,
                                                              begin, count, stats[0], stats[1]);
}
