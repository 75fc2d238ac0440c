// aten.cat: each input (a "piece") is copied bit for bit into its slice of the output, any
// strides on either side. One launch covers every piece: the candidate's generated `cat_body`
// gives each piece a range of blocks and calls cat_piece with the piece's `Geometry`: its loop
// nest (dimensions merged wherever both sides allow, in the output's memory order) and an
// `offsets` function from a linear index to the output and input element offsets.
//
// Each thread takes UNROLL groups of VEC elements, consecutive on both sides (a piece's VEC is 1
// unless both innermost strides are 1 and everything divides); all loads come before any store.
// PACKED false (the scalar twin, for misaligned pointers) moves a group one element at a time.

template <class G, typename T, int VEC, int UNROLL, bool PACKED>
__device__ __forceinline__ void cat_piece(T* __restrict__ out, const T* __restrict__ in,
                                          int64_t block) {
  using Index = typename G::Index;
  using P = kf::Pack<T, VEC>;
  constexpr Index GROUPS = G::NUMEL / VEC;
  P v[UNROLL];
  Index where[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const Index g = (Index(block) * UNROLL + u) * blockDim.x + threadIdx.x;
    where[u] = -1;
    if (g < GROUPS) {
      Index o, i;
      G::offsets(g * VEC, o, i);
      if constexpr (PACKED) {
        v[u] = *reinterpret_cast<const P*>(in + i);
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[u].v[k] = in[i + k];
      }
      where[u] = o;
    }
  }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    if (where[u] < 0) continue;
    if constexpr (PACKED) {
      *reinterpret_cast<P*>(out + where[u]) = v[u];
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) out[where[u] + k] = v[u].v[k];
    }
  }
}
