// sum and mean over some dimensions (aten.sum.dim_IntList, aten.mean.dim, and global average
// pooling), after the input is seen as [K1, R, K2] in memory order: R reduced, K1 and K2 kept.
//
// - reduce_rows (K2 == 1): TPR threads per row of R packed elements, RPB rows per block.
// - reduce_rows_tile (K2 == 1, short packed rows, e.g. 7x7 pooling): the block copies RPB whole
//   rows into shared memory with vector loads (one contiguous span), then each row is summed
//   there. Rows too short for vector access of their own still get full-width loads.
// - reduce_columns (K2 > 1, e.g. channels-last pooling): TX threads along K2 with VEC-wide
//   loads, TY threads along R; the TY partial sums meet in shared memory. PACKED false (the
//   scalar twin, for a misaligned input) loads the same VEC columns one at a time.
// The result is sum * scale (scale is 1 for sum, 1/R for mean), accumulated in float.

template <typename TI, typename TO, int COLS, int XSTRIDE, int OSTRIDE, int TPR, int RPB, int VEC,
          int UNROLL>
__device__ __forceinline__ void reduce_rows(const TI* __restrict__ x, TO* __restrict__ y,
                                            int64_t rows, float scale) {
  constexpr int STEP = TPR * VEC;
  __shared__ float scratch[(TPR * RPB + 31) / 32];
  const int lane = threadIdx.x % TPR;
  const int64_t row = int64_t(blockIdx.x) * RPB + threadIdx.x / TPR;
  const TI* xr = x + row * XSTRIDE;
  float s = 0.f;
  if (row < rows) {
    for (int base = lane * VEC; base < COLS; base += STEP * UNROLL) {
      float v[UNROLL][VEC];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        if (base + u * STEP < COLS) kf::load<TI, VEC>(xr + base + u * STEP, v[u]);
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        if (base + u * STEP < COLS) {
#pragma unroll
          for (int k = 0; k < VEC; ++k) s += v[u][k];
        }
      }
    }
  }
  s = kf::row_allreduce<TPR>(s, scratch, kf::Sum());
  if (row < rows && lane == 0) y[row * OSTRIDE] = kf::from_float<TO>(s * scale);
}

template <typename TI, typename TO, int COLS, int OSTRIDE, int TPR, int RPB, int VEC>
__device__ __forceinline__ void reduce_rows_tile(const TI* __restrict__ x, TO* __restrict__ y,
                                                 int64_t rows, float scale) {
  __shared__ float tile[RPB * COLS];
  __shared__ float scratch[(TPR * RPB + 31) / 32];
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
  float s = 0.f;
  if (r * COLS < count) {
    for (int c = lane; c < COLS; c += TPR) s += tile[r * COLS + c];
  }
  s = kf::row_allreduce<TPR>(s, scratch, kf::Sum());
  if (r * COLS < count && lane == 0) y[(first + r) * OSTRIDE] = kf::from_float<TO>(s * scale);
}

template <typename TI, typename TO, int K2, int R, int K1STRIDE, int RSTRIDE, int OS1, int OS2,
          int TX, int TY, int VEC, bool PACKED>
__device__ __forceinline__ void reduce_columns(const TI* __restrict__ x, TO* __restrict__ y,
                                               float scale) {
  __shared__ float partial[TY][TX * VEC];
  const int tx = threadIdx.x % TX;
  const int ty = threadIdx.x / TX;
  const int64_t k1 = blockIdx.y;
  const int k2 = (blockIdx.x * TX + tx) * VEC;
  float acc[VEC] = {};
  if (k2 < K2) {
    const TI* base = x + k1 * K1STRIDE + k2;
    for (int r = ty; r < R; r += TY) {
      float v[VEC];
      kf::load<TI, VEC, PACKED>(base + int64_t(r) * RSTRIDE, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] += v[k];
    }
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) partial[ty][tx * VEC + k] = acc[k];
  __syncthreads();
  // Each thread finishes some of the block's TX * VEC columns.
  for (int col = threadIdx.x; col < TX * VEC; col += TX * TY) {
    const int out = blockIdx.x * TX * VEC + col;
    if (out >= K2) continue;
    float s = 0.f;
#pragma unroll 4
    for (int t = 0; t < TY; ++t) s += partial[t][col];
    y[k1 * OS1 + int64_t(out) * OS2] = kf::from_float<TO>(s * scale);
  }
}
