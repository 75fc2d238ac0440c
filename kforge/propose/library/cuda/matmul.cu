// Matrix products out[b, m, n] = sum_k A[b, m, k] * B[b, k, n] with float accumulation, and
// whatever elementwise work the candidate fuses after it.
//
// The generated tail defines `Problem` (sizes, element strides and layouts, all compile-time:
// BATCH, M, N, K, A_B/A_M/A_K, B_B/B_K/B_N, the Index type, A_K_MAJOR, B_K_MAJOR) and an output
// object whose store(b, m, n, v) and store2(b, m, n, v0, v1) (n even, n + 1 possibly past the
// edge) finish a float result: the fused epilogue, rounding to the output type, the store, all
// bounds-checked since tiles may overhang the matrix. Split-K kernels store float partials
// through `Partials` instead, and `mm_reduce` sums them in split order (deterministic) before the
// epilogue.
//
// Kernels: `mm_simt` (CUDA cores, any dtype and strides: the reference), `mm_gemv` (a few rows
// times a weight read once with vector loads: decode), `mm_mma` (tensor cores through mma.sync
// m16n8k16 with ldmatrix and a cp.async multistage pipeline: sm_80 and later) and, in
// matmul_sm90.cu, `mm_wgmma` (Hopper's warpgroup MMA fed by a producer warpgroup).
//
// Operand tiles move from global to shared memory in chunks of VEC elements along the operand's
// contiguous dimension: with cp.async where a chunk is 4, 8 or 16 bytes and ASYNC is set, else
// element by element (ASYNC false: the twin kernel for misaligned pointers). Chunks past the
// matrix edge are zero-filled, so edge tiles need no special case in the math.

namespace kf {
namespace mm {

// Tiles of a grid walked in groups of GROUP tile rows, so that blocks running together share
// operand tiles in L2.
constexpr int RASTER_GROUP = 8;

template <int TILES_M, int TILES_N>
__device__ __forceinline__ void tile_coords(int pid, int& tile_m, int& tile_n) {
  constexpr int WIDTH = RASTER_GROUP * TILES_N;
  const int first = pid / WIDTH * RASTER_GROUP;
  const int rows = min(TILES_M - first, RASTER_GROUP);
  tile_m = first + pid % WIDTH % rows;
  tile_n = pid % WIDTH / rows;
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <int BYTES>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem, int src_bytes) {
  if constexpr (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_address(smem)), "l"(gmem), "r"(src_bytes) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n"
                 :: "r"(smem_address(smem)), "l"(gmem), "n"(BYTES), "r"(src_bytes) : "memory");
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(PENDING) : "memory");
}
// Every cp.async of this thread so far, committed to a group or not.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

template <typename T, int VEC, bool ASYNC>
__host__ __device__ constexpr bool copies_async() {
  constexpr int BYTES = VEC * int(sizeof(T));
  return ASYNC && (BYTES == 4 || BYTES == 8 || BYTES == 16);
}

// VEC elements to shared `dst` from `src`, of which `valid` are real and the rest zero.
template <typename T, int VEC, bool ASYNC>
__device__ __forceinline__ void copy_chunk(T* dst, const T* src, int valid) {
  if constexpr (copies_async<T, VEC, ASYNC>()) {
    cp_async<VEC * int(sizeof(T))>(dst, src, valid > 0 ? valid * int(sizeof(T)) : 0);
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) dst[i] = i < valid ? src[i] : from_float<T>(0.f);
  }
}

// A ROWS x COLS tile whose columns are contiguous in memory and whose rows are ROW_STRIDE
// elements apart, from `src` (its first element) to shared memory at LAYOUT's offsets, shared
// among THREADS threads. Rows from `rows_left` on and columns from `cols_left` on are zero.
// UNROLL: copies unrolled per thread (a producer short of registers keeps its loop rolled).
template <typename T, class Layout, int ROWS, int COLS, int VEC, int THREADS, bool ASYNC,
          typename Index, Index ROW_STRIDE, int UNROLL = ROWS * COLS>
__device__ __forceinline__ void load_tile(T* smem, const T* src, int rows_left, int cols_left,
                                          int thread) {
  constexpr int PER_ROW = COLS / VEC, CHUNKS = ROWS * PER_ROW;
#pragma unroll UNROLL
  for (int i = 0; i < (CHUNKS + THREADS - 1) / THREADS; ++i) {
    const int chunk = thread + i * THREADS;
    if (CHUNKS % THREADS == 0 || chunk < CHUNKS) {
      const int row = chunk / PER_ROW, col = chunk % PER_ROW * VEC;
      const int valid = row < rows_left ? min(VEC, cols_left - col) : 0;
      copy_chunk<T, VEC, ASYNC>(smem + Layout::offset(row, col),
                                valid > 0 ? src + Index(row) * ROW_STRIDE + col : src, valid);
    }
  }
}

// Float partial results of one split of a split-K product, packed [BATCH, M, N].
template <class P>
struct Partials {
  float* __restrict__ ws;
  __device__ __forceinline__ void store(int b, int m, int n, float v) const {
    if (m < P::M && n < P::N) ws[(typename P::Index(b) * P::M + m) * P::N + n] = v;
  }
  __device__ __forceinline__ void store2(int b, int m, int n, float v0, float v1) const {
    store(b, m, n, v0);
    store(b, m, n + 1, v1);
  }
};

// One thread per output: the splits' partials summed in order, then the epilogue.
template <class P, int SPLITS, class Out>
__device__ __forceinline__ void mm_reduce(const float* __restrict__ ws, Out out) {
  using Index = typename P::Index;
  constexpr Index TOTAL = Index(P::BATCH) * P::M * P::N;
  const Index e = Index(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= TOTAL) return;
  float sum = 0.f;
#pragma unroll
  for (int s = 0; s < SPLITS; ++s) sum += ws[s * TOTAL + e];
  const Index row = e / P::N;
  out.store(int(row / P::M), int(row % P::M), int(e % P::N), sum);
}

// ----- CUDA cores -----

// BM x BN outputs per block, TM x TN per thread, K in steps of 16 through shared memory (as
// float). Loads walk each operand along its contiguous dimension.
template <class P, int BM, int BN, int TM, int TN, typename T, class Out>
__device__ __forceinline__ void mm_simt(const T* __restrict__ a, const T* __restrict__ b, Out out) {
  using Index = typename P::Index;
  constexpr int BK = 16, THREADS = (BM / TM) * (BN / TN);
  __shared__ float sa[BK][BM + 4];
  __shared__ float sb[BK][BN + 4];
  int tile_m, tile_n;
  tile_coords<(P::M + BM - 1) / BM, (P::N + BN - 1) / BN>(blockIdx.x, tile_m, tile_n);
  const int m0 = tile_m * BM, n0 = tile_n * BN, batch = blockIdx.z, tid = threadIdx.x;
  const T* a0 = a + Index(batch) * P::A_B;
  const T* b0 = b + Index(batch) * P::B_B;
  const int tx = tid % (BN / TN), ty = tid / (BN / TN);
  float acc[TM][TN] = {};
  for (int k0 = 0; k0 < P::K; k0 += BK) {
    for (int e = tid; e < BM * BK; e += THREADS) {
      const int m = P::A_K_MAJOR ? e / BK : e % BM, k = P::A_K_MAJOR ? e % BK : e / BM;
      const int gm = m0 + m, gk = k0 + k;
      sa[k][m] = gm < P::M && gk < P::K ? to_float(a0[Index(gm) * P::A_M + Index(gk) * P::A_K]) : 0.f;
    }
    for (int e = tid; e < BN * BK; e += THREADS) {
      const int n = P::B_K_MAJOR ? e / BK : e % BN, k = P::B_K_MAJOR ? e % BK : e / BN;
      const int gn = n0 + n, gk = k0 + k;
      sb[k][n] = gn < P::N && gk < P::K ? to_float(b0[Index(gk) * P::B_K + Index(gn) * P::B_N]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      float ra[TM], rb[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) ra[i] = sa[k][ty * TM + i];
#pragma unroll
      for (int j = 0; j < TN; ++j) rb[j] = sb[k][tx * TN + j];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(ra[i], rb[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; j += 2)
      out.store2(batch, m0 + ty * TM + i, n0 + tx * TN + j, acc[i][j], acc[i][j + 1]);
}

// All M rows (a few) against COLS columns of a K-major B per block: B is read once, VEC elements
// per access, UNROLL accesses per column in flight; each thread sums its share of K, then the
// block adds the shares up (in a fixed order). PACKED false: element-by-element loads.
template <class P, int COLS, int THREADS, int VEC, int UNROLL, bool PACKED, typename T, class Out>
__device__ __forceinline__ void mm_gemv(const T* __restrict__ a, const T* __restrict__ b, Out out) {
  static_assert(P::A_K_MAJOR && P::B_K_MAJOR && P::K % VEC == 0, "gemv reads both operands along K");
  using Index = typename P::Index;
  constexpr int M = P::M, CHUNKS = P::K / VEC, WARPS = THREADS / 32;
  __shared__ float shares[WARPS][M * COLS];
  const int n0 = blockIdx.x * COLS, batch = blockIdx.z, tid = threadIdx.x;
  const T* x = a + Index(batch) * P::A_B;
  const T* w[COLS];
#pragma unroll
  for (int j = 0; j < COLS; ++j) w[j] = b + Index(batch) * P::B_B + Index(min(n0 + j, P::N - 1)) * P::B_N;
  float acc[M][COLS] = {};
  for (int first = tid; first < CHUNKS; first += THREADS * UNROLL) {
    Pack<T, VEC> wv[UNROLL][COLS];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int chunk = min(first + u * THREADS, CHUNKS - 1);
#pragma unroll
      for (int j = 0; j < COLS; ++j) {
        if constexpr (PACKED) {
          wv[u][j] = *reinterpret_cast<const Pack<T, VEC>*>(w[j] + Index(chunk) * VEC);
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) wv[u][j].v[e] = w[j][Index(chunk) * VEC + e];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int chunk = first + u * THREADS;
      if (chunk < CHUNKS) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float xv[VEC];
          load<T, VEC, PACKED>(x + Index(m) * P::A_M + Index(chunk) * VEC, xv);
#pragma unroll
          for (int j = 0; j < COLS; ++j)
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[m][j] = fmaf(xv[e], to_float(wv[u][j].v[e]), acc[m][j]);
        }
      }
    }
  }
  const int warp = tid / 32, lane = tid % 32;
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int j = 0; j < COLS; ++j) {
      const float v = group_allreduce<32>(acc[m][j], Sum{});
      if (lane == 0) shares[warp][m * COLS + j] = v;
    }
  __syncthreads();
  if (tid < M * COLS) {
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < WARPS; ++i) sum += shares[i][tid];
    out.store(batch, tid / COLS, n0 + tid % COLS, sum);
  }
}

// ----- tensor cores: mma.sync -----

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_address(p)));
}

__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1, __nv_bfloat16) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1, __half) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// BM x BN outputs per block of WARPS_M x WARPS_N warps, K in BK steps through a STAGES-deep
// cp.async pipeline, SPLITS blocks along K (blockIdx.y: which split). Shared tiles keep each
// operand's global layout (K-major tiles are [rows][BK], M- or N-major ones [BK][rows]) with
// padded rows; ldmatrix (.trans for the second kind) turns either into mma fragments.
template <class P, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int SPLITS,
          int VEC_A, int VEC_B, bool ASYNC, typename T, class Out>
__device__ __forceinline__ void mm_mma(const T* __restrict__ a, const T* __restrict__ b, Out out) {
  using Index = typename P::Index;
  constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N, FM = WM / 16, FN = WN / 8;
  static_assert(WM % 16 == 0 && WN % 16 == 0 && BK % 16 == 0, "warp tiles of whole fragments");
  constexpr int A_PITCH = P::A_K_MAJOR ? BK + 8 : BM + 8;
  constexpr int B_PITCH = P::B_K_MAJOR ? BK + 8 : BN + 8;
  constexpr int A_STAGE = (P::A_K_MAJOR ? BM : BK) * A_PITCH;
  constexpr int B_STAGE = (P::B_K_MAJOR ? BN : BK) * B_PITCH;
  constexpr int K_TILES = (P::K + BK - 1) / BK;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sa = reinterpret_cast<T*>(smem_raw);
  T* sb = sa + STAGES * A_STAGE;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm0 = warp / WARPS_N * WM, wn0 = warp % WARPS_N * WN;
  int tile_m, tile_n;
  tile_coords<(P::M + BM - 1) / BM, (P::N + BN - 1) / BN>(blockIdx.x, tile_m, tile_n);
  const int m0 = tile_m * BM, n0 = tile_n * BN, batch = blockIdx.z;
  const int kt0 = int(blockIdx.y) * K_TILES / SPLITS, count = (int(blockIdx.y) + 1) * K_TILES / SPLITS - kt0;
  const T* a0 = a + Index(batch) * P::A_B;
  const T* b0 = b + Index(batch) * P::B_B;

  auto load_stage = [&](int stage, int kt) {
    const int k0 = kt * BK;
    if constexpr (P::A_K_MAJOR) {
      load_tile<T, Padded<A_PITCH>, BM, BK, VEC_A, THREADS, ASYNC, Index, P::A_M>(
          sa + stage * A_STAGE, a0 + Index(m0) * P::A_M + k0, P::M - m0, P::K - k0, tid);
    } else {
      load_tile<T, Padded<A_PITCH>, BK, BM, VEC_A, THREADS, ASYNC, Index, P::A_K>(
          sa + stage * A_STAGE, a0 + Index(k0) * P::A_K + m0, P::K - k0, P::M - m0, tid);
    }
    if constexpr (P::B_K_MAJOR) {
      load_tile<T, Padded<B_PITCH>, BN, BK, VEC_B, THREADS, ASYNC, Index, P::B_N>(
          sb + stage * B_STAGE, b0 + Index(n0) * P::B_N + k0, P::N - n0, P::K - k0, tid);
    } else {
      load_tile<T, Padded<B_PITCH>, BK, BN, VEC_B, THREADS, ASYNC, Index, P::B_K>(
          sb + stage * B_STAGE, b0 + Index(k0) * P::B_K + n0, P::K - k0, P::N - n0, tid);
    }
  };

  float acc[FM][FN][4] = {};
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < count) load_stage(s, kt0 + s);
    cp_async_commit();
  }
  for (int i = 0; i < count; ++i) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage i has landed, and every warp is done with stage i - 1
    if (i + STAGES - 1 < count) load_stage((i + STAGES - 1) % STAGES, kt0 + i + STAGES - 1);
    cp_async_commit();
    const T* ta = sa + i % STAGES * A_STAGE;
    const T* tb = sb + i % STAGES * B_STAGE;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t af[FM][4], bf[FN][2];
#pragma unroll
      for (int mi = 0; mi < FM; ++mi) {
        if constexpr (P::A_K_MAJOR) {
          ldmatrix_x4(af[mi], ta + (wm0 + mi * 16 + lane % 16) * A_PITCH + kk + lane / 16 * 8);
        } else {
          ldmatrix_x4_trans(af[mi], ta + (kk + lane % 8 + lane / 16 * 8) * A_PITCH + wm0 + mi * 16
                                        + lane / 8 % 2 * 8);
        }
      }
#pragma unroll
      for (int nj = 0; nj < FN; nj += 2) {
        uint32_t r[4];
        if constexpr (P::B_K_MAJOR) {
          ldmatrix_x4(r, tb + (wn0 + nj * 8 + lane % 8 + lane / 16 * 8) * B_PITCH + kk + lane / 8 % 2 * 8);
        } else {
          ldmatrix_x4_trans(r, tb + (kk + lane % 8 + lane / 8 % 2 * 8) * B_PITCH + wn0 + nj * 8
                                   + lane / 16 * 8);
        }
        bf[nj][0] = r[0];
        bf[nj][1] = r[1];
        bf[nj + 1][0] = r[2];
        bf[nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < FM; ++mi)
#pragma unroll
        for (int nj = 0; nj < FN; ++nj) mma_16816(acc[mi][nj], af[mi], bf[nj][0], bf[nj][1], T{});
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int mi = 0; mi < FM; ++mi)
#pragma unroll
    for (int nj = 0; nj < FN; ++nj) {
      const int m = m0 + wm0 + mi * 16 + lane / 4, n = n0 + wn0 + nj * 8 + lane % 4 * 2;
      out.store2(batch, m, n, acc[mi][nj][0], acc[mi][nj][1]);
      out.store2(batch, m + 8, n, acc[mi][nj][2], acc[mi][nj][3]);
    }
}

}  // namespace mm
}  // namespace kf
