// Reductions over some dimensions: sum and mean (aten.sum, aten.mean, and global average pooling),
// amax and amin. `Op` combines two partial results (kf::ReduceSum, kf::ReduceMax, kf::ReduceMin)
// and gives its identity; the result is the combination times `scale` (1, or 1/R for mean),
// accumulated in float.
//
// Where the input is seen as [K1, R, K2] in memory order (R reduced, K1 and K2 kept):
// - reduce_rows (K2 == 1): TPR threads per row of R packed elements, RPB rows per block.
// - reduce_rows_tile (K2 == 1, short packed rows, e.g. 7x7 pooling): the block copies RPB whole
//   rows into shared memory with vector loads (one contiguous span), then each row is reduced
//   there. Rows too short for vector access of their own still get full-width loads.
// - reduce_rows_split (K2 == 1, few long rows): SPLITS blocks per row each reduce a slice to a
//   float in `parts`; reduce_rows over the [rows, SPLITS] parts then finishes.
// - reduce_columns (K2 > 1, e.g. channels-last pooling): TX threads along K2 with VEC-wide
//   loads, TY threads along R; the TY partial results meet in shared memory. PACKED false (the
//   scalar twin, for a misaligned input) loads the same VEC columns one at a time.
// Any other layout (reduced dimensions between kept ones in memory, outputs in another order):
// - reduce_general: TPR threads per output; the candidate's `Geometry` maps an output index
//   (kept dimensions in the input's memory order) to the input and output offsets and a reduced
//   index to its input offset.

namespace kf {

struct ReduceSum {
  static __device__ __forceinline__ float identity() { return 0.f; }
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
// amax and amin propagate NaN, as eager does.
struct ReduceMax {
  static __device__ __forceinline__ float identity() { return -INFINITY; }
  __device__ __forceinline__ float operator()(float a, float b) const {
    return (a > b || isnan(a)) ? a : b;
  }
};
struct ReduceMin {
  static __device__ __forceinline__ float identity() { return INFINITY; }
  __device__ __forceinline__ float operator()(float a, float b) const {
    return (a < b || isnan(a)) ? a : b;
  }
};

}  // namespace kf

// The elements [begin, end) of one packed row, VEC at a time, UNROLL accesses in flight; `lane`
// of LANES threads.
template <class Op, typename TI, int LANES, int VEC, int UNROLL>
__device__ __forceinline__ float reduce_span(const TI* __restrict__ xr, int64_t begin, int64_t end,
                                             int lane, Op op) {
  constexpr int STEP = LANES * VEC;
  float acc = Op::identity();
  for (int64_t base = begin + lane * VEC; base < end; base += int64_t(STEP) * UNROLL) {
    float v[UNROLL][VEC];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (base + u * STEP < end) kf::load<TI, VEC>(xr + base + u * STEP, v[u]);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (base + u * STEP < end) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc = op(acc, v[u][k]);
      }
    }
  }
  return acc;
}

template <class Op, typename TI, typename TO, int COLS, int XSTRIDE, int OSTRIDE, int TPR, int RPB,
          int VEC, int UNROLL>
__device__ __forceinline__ void reduce_rows(const TI* __restrict__ x, TO* __restrict__ y,
                                            int64_t rows, float scale) {
  __shared__ float scratch[(TPR * RPB + 31) / 32];
  const int lane = threadIdx.x % TPR;
  const int64_t row = int64_t(blockIdx.x) * RPB + threadIdx.x / TPR;
  float acc = Op::identity();
  if (row < rows) acc = reduce_span<Op, TI, TPR, VEC, UNROLL>(x + row * XSTRIDE, 0, COLS, lane, Op());
  acc = kf::row_allreduce<TPR>(acc, scratch, Op());
  if (row < rows && lane == 0) y[row * OSTRIDE] = kf::from_float<TO>(acc * scale);
}

template <class Op, typename TI, typename TO, int COLS, int OSTRIDE, int TPR, int RPB, int VEC>
__device__ __forceinline__ void reduce_rows_tile(const TI* __restrict__ x, TO* __restrict__ y,
                                                 int64_t rows, float scale) {
  __shared__ float tile[RPB * COLS];
  __shared__ float scratch[(TPR * RPB + 31) / 32];
  const Op op;
  const int64_t first = int64_t(blockIdx.x) * RPB;
  const int count = int(rows - first < RPB ? rows - first : RPB) * COLS;
  const TI* src = x + first * COLS;
  const int vectors = count / VEC;
  for (int i = threadIdx.x; i < vectors; i += blockDim.x) {
    float v[VEC];
    kf::load<TI, VEC>(src + i * VEC, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) tile[i * VEC + k] = v[k];
  }
  for (int i = vectors * VEC + threadIdx.x; i < count; i += blockDim.x) tile[i] = kf::to_float(src[i]);
  __syncthreads();
  const int r = threadIdx.x / TPR;
  const int lane = threadIdx.x % TPR;
  float acc = Op::identity();
  if (r * COLS < count) {
    for (int c = lane; c < COLS; c += TPR) acc = op(acc, tile[r * COLS + c]);
  }
  acc = kf::row_allreduce<TPR>(acc, scratch, op);
  if (r * COLS < count && lane == 0) y[(first + r) * OSTRIDE] = kf::from_float<TO>(acc * scale);
}

// Block b reduces slice b % SPLITS of row b / SPLITS (whole vectors, in order) into parts[b].
template <class Op, typename TI, int64_t COLS, int64_t XSTRIDE, int SPLITS, int THREADS, int VEC,
          int UNROLL>
__device__ __forceinline__ void reduce_rows_split(const TI* __restrict__ x,
                                                  float* __restrict__ parts) {
  constexpr int64_t CHUNK = (COLS / VEC + SPLITS - 1) / SPLITS * VEC;
  __shared__ float scratch[THREADS / 32];
  const int64_t row = blockIdx.x / SPLITS;
  const int64_t begin = (blockIdx.x % SPLITS) * CHUNK;
  const int64_t end = begin + CHUNK < COLS ? begin + CHUNK : COLS;
  float acc = reduce_span<Op, TI, THREADS, VEC, UNROLL>(x + row * XSTRIDE, begin, end,
                                                        threadIdx.x, Op());
  acc = kf::block_allreduce<THREADS>(acc, scratch, Op());
  if (threadIdx.x == 0) parts[blockIdx.x] = acc;
}

template <class Op, typename TI, typename TO, int K2, int R, int K1STRIDE, int RSTRIDE, int OS1,
          int OS2, int TX, int TY, int VEC, bool PACKED>
__device__ __forceinline__ void reduce_columns(const TI* __restrict__ x, TO* __restrict__ y,
                                               float scale) {
  __shared__ float partial[TY][TX * VEC];
  const Op op;
  const int tx = threadIdx.x % TX;
  const int ty = threadIdx.x / TX;
  const int64_t k1 = blockIdx.y;
  const int k2 = (blockIdx.x * TX + tx) * VEC;
  float acc[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc[k] = Op::identity();
  if (k2 < K2) {
    const TI* base = x + k1 * K1STRIDE + k2;
    for (int r = ty; r < R; r += TY) {
      float v[VEC];
      kf::load<TI, VEC, PACKED>(base + int64_t(r) * RSTRIDE, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] = op(acc[k], v[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) partial[ty][tx * VEC + k] = acc[k];
  __syncthreads();
  // Each thread finishes some of the block's TX * VEC columns.
  for (int col = threadIdx.x; col < TX * VEC; col += TX * TY) {
    const int out = blockIdx.x * TX * VEC + col;
    if (out >= K2) continue;
    float s = Op::identity();
#pragma unroll 4
    for (int t = 0; t < TY; ++t) s = op(s, partial[t][col]);
    y[k1 * OS1 + int64_t(out) * OS2] = kf::from_float<TO>(s * scale);
  }
}

template <class Op, class G, typename TI, typename TO, int TPR, int RPB, int UNROLL>
__device__ __forceinline__ void reduce_general(const TI* __restrict__ x, TO* __restrict__ y,
                                               float scale) {
  using Index = typename G::Index;
  __shared__ float scratch[(TPR * RPB + 31) / 32];
  const Op op;
  const int lane = threadIdx.x % TPR;
  const Index output = Index(blockIdx.x) * RPB + threadIdx.x / TPR;
  const bool live = output < G::OUTPUTS;
  Index x_base = 0, y_off = 0;
  if (live) G::kept(output, x_base, y_off);
  float acc = Op::identity();
  if (live) {
    for (Index base = lane; base < G::R; base += Index(TPR) * UNROLL) {
      float v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {  // all loads first
        const Index r = base + Index(u) * TPR;
        v[u] = r < G::R ? kf::to_float(x[x_base + G::reduced(r)]) : Op::identity();
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) acc = op(acc, v[u]);
    }
  }
  acc = kf::row_allreduce<TPR>(acc, scratch, op);
  if (live && lane == 0) y[y_off] = kf::from_float<TO>(acc * scale);
}
