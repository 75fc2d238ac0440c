// aten.embedding: out[i, :] = weight[indices[i], :], rows copied bit for bit. An index outside
// the table stops the kernel (__trap), as eager's device-side assert does, instead of reading
// out of bounds.
//
// - embedding_rows: TPR threads copy one row with VEC-wide accesses, RPB rows per block.
// - embedding_flat: the output as one list of VEC-wide groups, UNROLL per thread; each group
//   reads its row's index (neighbouring groups share it through the cache). For short rows.
//   PACKED false (the scalar twin, for misaligned pointers) copies a group element by element.

template <typename TI>
__device__ __forceinline__ int64_t checked_index(const TI* __restrict__ indices, int64_t row,
                                                 int64_t vocab) {
  const int64_t i = int64_t(indices[row]);
  if (i < 0 || i >= vocab) __trap();
  return i;
}

template <typename T, typename TI, int D, int WSTRIDE, int TPR, int RPB, int VEC>
__device__ __forceinline__ void embedding_rows(const T* __restrict__ weight,
                                               const TI* __restrict__ indices, T* __restrict__ y,
                                               int64_t rows, int64_t vocab) {
  using P = kf::Pack<T, VEC>;
  const int lane = threadIdx.x % TPR;
  const int64_t row = int64_t(blockIdx.x) * RPB + threadIdx.x / TPR;
  if (row >= rows) return;
  const T* src = weight + checked_index(indices, row, vocab) * WSTRIDE;
  T* dst = y + row * D;
  for (int c = lane * VEC; c < D; c += TPR * VEC) {
    *reinterpret_cast<P*>(dst + c) = *reinterpret_cast<const P*>(src + c);
  }
}

template <typename T, typename TI, int D, int WSTRIDE, int VEC, int UNROLL, bool PACKED>
__device__ __forceinline__ void embedding_flat(const T* __restrict__ weight,
                                               const TI* __restrict__ indices, T* __restrict__ y,
                                               int64_t rows, int64_t vocab) {
  using P = kf::Pack<T, VEC>;
  constexpr int GROUPS_PER_ROW = D / VEC;
  const int64_t groups = rows * GROUPS_PER_ROW;
  P v[UNROLL];
  int64_t where[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {  // all loads first
    const int64_t g = (int64_t(blockIdx.x) * UNROLL + u) * blockDim.x + threadIdx.x;
    where[u] = -1;
    if (g < groups) {
      const int64_t row = g / GROUPS_PER_ROW;
      const int c = int(g % GROUPS_PER_ROW) * VEC;
      const T* src = weight + checked_index(indices, row, vocab) * WSTRIDE + c;
      if constexpr (PACKED) {
        v[u] = *reinterpret_cast<const P*>(src);
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[u].v[k] = src[k];
      }
      where[u] = row * D + c;
    }
  }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    if (where[u] < 0) continue;
    if constexpr (PACKED) {
      *reinterpret_cast<P*>(y + where[u]) = v[u];
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) y[where[u] + k] = v[u].v[k];
    }
  }
}
