// Keeping data on chip across several blocks: asynchronous copies from global to shared memory
// (sm_80 and later), thread-block clusters (sm_90 and later), whose blocks run at the same time and
// read one another's shared memory (distributed shared memory), and grid-wide hand-offs of small
// results through global memory with acquire/release ordering.
//
// The barriers are `.aligned`: every thread of the block calls them, in the same order. Compiled
// for an architecture without clusters, a block is a cluster of one: its rank is 0, the barriers
// are the block's own, and nothing may read another block's shared memory. Compiled as host C++
// (the library's own checks run kernels on the CPU), each helper does the same in plain C++.

namespace kf {

// This block's rank within its cluster.
__device__ __forceinline__ unsigned cluster_rank() {
#if __CUDA_ARCH__ >= 900
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
#else
  return 0;
#endif
}

// Arrive at the cluster barrier: this block's earlier shared-memory writes become visible to the
// cluster's blocks that wait after it.
__device__ __forceinline__ void cluster_arrive() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}

// Wait until every block of the cluster has arrived.
__device__ __forceinline__ void cluster_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __syncthreads();
#endif
}

__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}

// A float of block `rank`'s shared memory, at the place `local` has in this block's.
__device__ __forceinline__ float cluster_load(const float* local, unsigned rank) {
#if __CUDA_ARCH__ >= 900
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(local));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(address), "r"(rank));
  float value;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(value) : "r"(remote) : "memory");
  return value;
#else
  return *local;
#endif
}

__device__ __forceinline__ Welford cluster_load(const Welford* local, unsigned rank) {
  return {cluster_load(&local->n, rank), cluster_load(&local->mean, rank),
          cluster_load(&local->m2, rank)};
}

// A counter in global memory read with acquire ordering: what was written before a release
// increment of it is visible after.
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
#ifdef __CUDA_ARCH__
  unsigned value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(p) : "memory");
  return value;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

__device__ __forceinline__ void add_release(unsigned* p, unsigned value) {
#ifdef __CUDA_ARCH__
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" :: "l"(p), "r"(value) : "memory");
#else
  __atomic_fetch_add(p, value, __ATOMIC_RELEASE);
#endif
}

// Start copying BYTES (4, 8 or 16) from global to shared memory without passing through
// registers; wait_async() waits for every copy this thread started.
template <int BYTES>
__device__ __forceinline__ void copy_async(void* shared, const void* global) {
#ifdef __CUDA_ARCH__
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  if constexpr (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(global) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(to), "l"(global), "n"(BYTES)
                 : "memory");
  }
#else
  memcpy(shared, global, BYTES);
#endif
}

__device__ __forceinline__ void wait_async() {
#ifdef __CUDA_ARCH__
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
#endif
}

}  // namespace kf
