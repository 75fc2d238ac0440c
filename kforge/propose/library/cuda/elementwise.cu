// Elementwise ops with up to three tensor operands, broadcasting and any strides.
//
// The candidate's generated tail defines `Geometry`: the output's loop nest (dimensions merged
// wherever memory allows) and, per operand, its stride along the innermost dimension and an
// `offsets` function from a linear index to element offsets. `Op` computes one output value in
// float from the operands' values (unused operands are 0).
//
// Each thread takes UNROLL groups of VEC consecutive outputs, a block's threads interleaved so
// that accesses coalesce; all loads are issued before any store. Along the innermost dimension an
// operand with stride 1 is read with one vector access, one with stride 0 (broadcast) with one
// scalar load, any other with VEC scalar loads. The innermost size is a multiple of VEC, so a
// group never wraps a row. GRID_STRIDE kernels loop over the data with a grid sized to the GPU.
// PACKED false (the scalar twin, for misaligned pointers) moves a group one element at a time.

namespace kf {

__device__ __forceinline__ float relu(float a) { return a <= 0.f ? 0.f : a; }  // NaN passes
__device__ __forceinline__ float sigmoid(float a) { return 1.f / (1.f + expf(-a)); }
__device__ __forceinline__ float silu(float a) { return a / (1.f + expf(-a)); }
__device__ __forceinline__ float gelu_erf(float a) {
  return 0.5f * a * (1.f + erff(a * 0.70710678118654752f));
}
__device__ __forceinline__ float gelu_tanh(float a) {
  const float inner = 0.79788456080286536f * (a + 0.044715f * a * a * a);
  return 0.5f * a * (1.f + tanhf(inner));
}

}  // namespace kf

template <int INNER, int VEC, bool PACKED, typename T, typename Index>
__device__ __forceinline__ void gather(const T* p, Index off, float (&v)[VEC]) {
  if constexpr (INNER == 1) {
    kf::load<T, VEC, PACKED>(p + off, v);
  } else if constexpr (INNER == 0) {
    const float s = kf::to_float(p[off]);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = s;
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = kf::to_float(p[off + k * INNER]);
  }
}

template <int INNER, int VEC, bool PACKED, typename T, typename Index>
__device__ __forceinline__ void scatter(T* p, Index off, const float (&v)[VEC]) {
  if constexpr (INNER == 1) {
    kf::store<T, VEC, PACKED>(p + off, v);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) p[off + k * INNER] = kf::from_float<T>(v[k]);
  }
}

// Pointers are not __restrict__: an in-place op's output is its first operand.
template <class G, class Op, int VEC, int UNROLL, bool GRID_STRIDE, bool PACKED, typename TO,
          typename TA, typename TB, typename TC>
__device__ __forceinline__ void elementwise_loop(TO* out, const TA* a, const TB* b, const TC* c,
                                            const Op op) {
  using Index = typename G::Index;
  constexpr Index GROUPS = G::NUMEL / VEC;
  const Index step = Index(gridDim.x) * blockDim.x * UNROLL;
  for (Index first = Index(blockIdx.x) * blockDim.x * UNROLL + threadIdx.x; first < GROUPS;
       first += step) {
    float va[UNROLL][VEC], vb[UNROLL][VEC] = {}, vc[UNROLL][VEC] = {};
    Index where[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const Index g = first + Index(u) * blockDim.x;
      if (g < GROUPS) {
        Index oa, ob, oc;
        G::offsets(g * VEC, where[u], oa, ob, oc);
        gather<G::A_INNER, VEC, PACKED>(a, oa, va[u]);
        if constexpr (Op::ARITY > 1) gather<G::B_INNER, VEC, PACKED>(b, ob, vb[u]);
        if constexpr (Op::ARITY > 2) gather<G::C_INNER, VEC, PACKED>(c, oc, vc[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (first + Index(u) * blockDim.x < GROUPS) {
        float r[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) r[k] = op(va[u][k], vb[u][k], vc[u][k]);
        scatter<G::OUT_INNER, VEC, PACKED>(out, where[u], r);
      }
    }
    if constexpr (!GRID_STRIDE) break;
  }
}
