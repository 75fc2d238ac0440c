// Fusion regions: one kernel for a chain of ops. The candidate's generated tail defines the
// region's structs (kforge/propose/library/regions/render.py); these drivers run them.
//
// region_flat: a region without row reductions, one output. Each thread takes UNROLL groups of
// VEC consecutive outputs along the last dimension (a block's threads interleaved so that
// accesses coalesce), loads every group's inputs before it computes and stores any
// (P::load, P::store). GRID_STRIDE kernels loop over the data with a grid sized to the GPU.
//
// region_rows_*: a region that reduces over the last dimension (norms, softmax). A row of COLS
// elements is handled by TPR consecutive threads, a block holds RPB rows (RowIndex, rows.cu).
// The values the reductions read are loaded per vector (R::load); stage S reduces R::partial
// over the row (a sum, or a maximum), R::finish turns its total into the row's statistics,
// later stages and the outputs (R::store) use them.
// - registers: the row's loaded values stay in registers: one read of the row.
// - loop: each stage reads the row again: rows of any length.
//
// PACKED false (the scalar twin, for misaligned pointers) moves every vector one element at a
// time.

namespace kf {

__device__ __forceinline__ float softplus(float a, float beta, float threshold) {
  return a * beta > threshold ? a : log1pf(expf(a * beta)) / beta;
}

}  // namespace kf

template <class P, int UNROLL, bool GRID_STRIDE, bool PACKED>
__device__ __forceinline__ void region_flat(const typename P::Args& a) {
  using Index = typename P::Index;
  const Index step = Index(gridDim.x) * blockDim.x * UNROLL;
  for (Index first = Index(blockIdx.x) * blockDim.x * UNROLL + threadIdx.x; first < P::GROUPS;
       first += step) {
    typename P::Regs r[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const Index g = first + Index(u) * blockDim.x;
      if (g < P::GROUPS) P::template load<PACKED>(a, g, r[u]);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (first + Index(u) * blockDim.x < P::GROUPS) P::template store<PACKED>(a, r[u]);
    }
    if constexpr (!GRID_STRIDE) break;
  }
}

template <bool IS_MAX>
__device__ __forceinline__ float stage_identity() {
  return IS_MAX ? -INFINITY : 0.f;
}

template <bool IS_MAX>
__device__ __forceinline__ float stage_combine(float a, float b) {
  return IS_MAX ? fmaxf(a, b) : a + b;
}

// Stage S over values held in registers: reduce the partials of every vector of the row.
template <class R, int S, int TPR, int ITEMS>
__device__ __forceinline__ void rows_stage(const float (&v)[ITEMS][R::CACHED][R::VEC], int lane,
                                           bool live, float* scratch, float (&st)[R::STATS]) {
  if constexpr (S < R::STAGES) {
    constexpr bool IS_MAX = R::IS_MAX[S];
    float p = stage_identity<IS_MAX>();
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int c = (i * TPR + lane) * R::VEC;
      if (live && c < R::COLS) p = stage_combine<IS_MAX>(p, R::template partial<S>(v[i], st));
    }
    R::template finish<S>(R::template allreduce<S, TPR>(p, scratch), st);
    rows_stage<R, S + 1, TPR, ITEMS>(v, lane, live, scratch, st);
  }
}

template <class R, int TPR, int RPB, bool PACKED>
__device__ __forceinline__ void region_rows_registers(const typename R::Args& a) {
  constexpr int VEC = R::VEC;
  constexpr int ITEMS = (R::COLS + TPR * VEC - 1) / (TPR * VEC);
  ROW_SCRATCH(float, scratch);
  const RowIndex<R::COLS, TPR, RPB> at(R::ROWS);
  typename R::Row b;
  if (at.live) R::row(typename R::Index(at.row), b);
  float v[ITEMS][R::CACHED][VEC];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = (i * TPR + at.lane) * VEC;
    if (at.live && c < R::COLS) R::template load<PACKED>(a, b, c, v[i]);
  }
  float st[R::STATS];
  rows_stage<R, 0, TPR, ITEMS>(v, at.lane, at.live, scratch, st);
  if (!at.live) return;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = (i * TPR + at.lane) * VEC;
    if (c < R::COLS) R::template store<PACKED>(a, b, c, v[i], st);
  }
}

// Stage S read from memory: one more pass over the row.
template <class R, int S, int TPR, bool PACKED>
__device__ __forceinline__ void rows_stage_loop(const typename R::Args& a, const typename R::Row& b,
                                                int lane, bool live, float* scratch,
                                                float (&st)[R::STATS]) {
  if constexpr (S < R::STAGES) {
    constexpr bool IS_MAX = R::IS_MAX[S];
    float p = stage_identity<IS_MAX>();
    if (live) {
      for (int c = lane * R::VEC; c < R::COLS; c += TPR * R::VEC) {
        float v[R::CACHED][R::VEC];
        R::template load<PACKED>(a, b, c, v);
        p = stage_combine<IS_MAX>(p, R::template partial<S>(v, st));
      }
    }
    R::template finish<S>(R::template allreduce<S, TPR>(p, scratch), st);
    rows_stage_loop<R, S + 1, TPR, PACKED>(a, b, lane, live, scratch, st);
  }
}

template <class R, int TPR, int RPB, bool PACKED>
__device__ __forceinline__ void region_rows_loop(const typename R::Args& a) {
  ROW_SCRATCH(float, scratch);
  const RowIndex<R::COLS, TPR, RPB> at(R::ROWS);
  typename R::Row b;
  if (at.live) R::row(typename R::Index(at.row), b);
  float st[R::STATS];
  rows_stage_loop<R, 0, TPR, PACKED>(a, b, at.lane, at.live, scratch, st);
  if (!at.live) return;
  for (int c = at.lane * R::VEC; c < R::COLS; c += TPR * R::VEC) {
    float v[R::CACHED][R::VEC];
    R::template load<PACKED>(a, b, c, v);
    R::template store<PACKED>(a, b, c, v, st);
  }
}
