// Hopper (sm_90a) matmul: warpgroup MMA (wgmma) on tiles in shared memory, fed by a producer
// warpgroup through a ring of STAGES buffers guarded by mbarriers.
//
// Launch plans cannot build the tensor maps TMA needs (they are encoded on the host), so the
// producer moves tiles with cp.async, writing them straight into the 128-byte swizzled layout
// wgmma reads (Swizzle128), and signals each buffer's `full` barrier when its copies land
// (cp.async.mbarrier.arrive). Each consumer warpgroup owns 64 rows of the BM x BN tile and the
// full BN width: per 64-wide K step it waits for the buffer, issues four m64nBNk16 wgmmas
// (Mma::mma, generated for the tile width and type), keeps one step in flight and releases the
// previous buffer on its `empty` barrier. Both operands must be K-major (wgmma's transposed
// modes are not used). The output object's store2 finishes each pair of accumulators.
//
// With two consumer warpgroups the producer gives registers to them (setmaxnreg), 40 and 232
// per thread, as 384 threads at 168 would not hold 128 accumulators each.

namespace kf {
namespace mm {

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(smem_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(smem_address(bar)), "r"(parity) : "memory");
  } while (!done);
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(smem_address(bar)) : "memory");
}
// Arrives once this thread's cp.async copies so far have landed (the barrier counts it).
__device__ __forceinline__ void mbarrier_arrive_on_copies(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(smem_address(bar)) : "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(PENDING) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across wgmma's asynchronous use.
template <int N>
__device__ __forceinline__ void fence_registers(float (&acc)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(acc[i]) :: "memory");
}

template <class P, class Mma, int BN, int CONSUMERS, int STAGES, int SPLITS, int VEC_A, int VEC_B,
          bool ASYNC, typename T, class Out>
__device__ __forceinline__ void mm_wgmma(const T* __restrict__ a, const T* __restrict__ b, Out out) {
  static_assert(P::A_K_MAJOR && P::B_K_MAJOR && sizeof(T) == 2, "wgmma reads K-major 16-bit tiles");
  using Index = typename P::Index;
  constexpr int BM = 64 * CONSUMERS, BK = 64, PRODUCERS = 128;
  constexpr int A_STAGE = BM * BK, B_STAGE = BN * BK;
  constexpr int K_TILES = (P::K + BK - 1) / BK;
  // One barrier arrival per producer thread per buffer, after its copies (or, copying element
  // by element, after its stores).
  constexpr bool ALL_ASYNC = copies_async<T, VEC_A, ASYNC>() && copies_async<T, VEC_B, ASYNC>();

  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
  T* sa = reinterpret_cast<T*>(base);
  T* sb = sa + STAGES * A_STAGE;
  uint64_t* full = reinterpret_cast<uint64_t*>(sb + STAGES * B_STAGE);
  uint64_t* empty = full + STAGES;

  const int tid = threadIdx.x, warpgroup = tid / 128;
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbarrier_init(&full[s], PRODUCERS);
      mbarrier_init(&empty[s], 128 * CONSUMERS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  int tile_m, tile_n;
  tile_coords<(P::M + BM - 1) / BM, (P::N + BN - 1) / BN>(blockIdx.x, tile_m, tile_n);
  const int m0 = tile_m * BM, n0 = tile_n * BN, batch = blockIdx.z;
  const int kt0 = int(blockIdx.y) * K_TILES / SPLITS, count = (int(blockIdx.y) + 1) * K_TILES / SPLITS - kt0;

  if (warpgroup == 0) {
    if constexpr (CONSUMERS == 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    const T* a0 = a + Index(batch) * P::A_B + Index(m0) * P::A_M;
    const T* b0 = b + Index(batch) * P::B_B + Index(n0) * P::B_N;
    for (int i = 0; i < count; ++i) {
      const int s = i % STAGES, k0 = (kt0 + i) * BK;
      if (i >= STAGES) mbarrier_wait(&empty[s], (i / STAGES + 1) & 1);
      load_tile<T, Swizzle128, BM, BK, VEC_A, PRODUCERS, ASYNC, Index, P::A_M, 1>(
          sa + s * A_STAGE, a0 + k0, P::M - m0, P::K - k0, tid);
      load_tile<T, Swizzle128, BN, BK, VEC_B, PRODUCERS, ASYNC, Index, P::B_N, 1>(
          sb + s * B_STAGE, b0 + k0, P::N - n0, P::K - k0, tid);
      if constexpr (ALL_ASYNC) {
        mbarrier_arrive_on_copies(&full[s]);
      } else {
        cp_async_wait_all();
        mbarrier_arrive(&full[s]);
      }
    }
    cp_async_wait_all();
  } else {
    if constexpr (CONSUMERS == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int consumer = warpgroup - 1;
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    for (int i = 0; i < count; ++i) {
      const int s = i % STAGES;
      mbarrier_wait(&full[s], (i / STAGES) & 1);
      // cp.async and plain stores wrote the tile through the generic proxy; wgmma reads it
      // through the async proxy.
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      const uint32_t ta = smem_address(sa + s * A_STAGE + consumer * 64 * BK);
      const uint32_t tb = smem_address(sb + s * B_STAGE);
      fence_registers(acc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)
        Mma::mma(acc, sw128_descriptor(ta + kk * 32), sw128_descriptor(tb + kk * 32));
      wgmma_commit();
      wgmma_wait<1>();
      fence_registers(acc);
      if (i > 0) mbarrier_arrive(&empty[(i - 1) % STAGES]);
    }
    wgmma_wait<0>();
    fence_registers(acc);
    const int lane = tid % 32, m = m0 + consumer * 64 + tid % 128 / 32 * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int n = n0 + j * 8 + lane % 4 * 2;
      out.store2(batch, m, n, acc[4 * j], acc[4 * j + 1]);
      out.store2(batch, m + 8, n, acc[4 * j + 2], acc[4 * j + 3]);
    }
  }
}

}  // namespace mm
}  // namespace kf
