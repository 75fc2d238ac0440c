// batch_norm in inference (aten.native_batch_norm with training=False, and
// aten._native_batch_norm_legit_no_training): y = (x - running_mean[c]) * invstd[c] * w[c] + b[c]
// with invstd = 1 / sqrt(running_var + eps) per channel, computed in float. As eager does on CUDA,
// it also returns save_mean (running_mean as float) and save_invstd (invstd), one float per channel.
//
// The input is dense (every element once, in any dimension order) and the output has its layout,
// so both are walked as one flat array: element e belongs to channel (e / CS) % C, CS the channel
// dimension's stride. Each thread takes UNROLL groups of VEC consecutive elements.
// - CS == 1 (channels innermost, channels-last): a group covers VEC channels (C % VEC == 0).
// - CS % VEC == 0 (e.g. NCHW with H*W a multiple of VEC): a group lies within one channel.
// - otherwise (7x7 planes): a group may straddle channels; each element finds its own.
//
// Variants:
// - batch_norm_table (TABLE): each block first computes every channel's mean, scale and shift
//   into shared memory; a GPU's worth of resident blocks then loops over the data.
// - batch_norm_direct: one pass of as many blocks as the data needs; each group computes its
//   channels' constants from the (cached) parameter vectors. The reference.
// PACKED false (the scalar twin, for misaligned pointers) moves a group one element at a time.

struct ChannelConst {
  float mean, scale, shift;
};

template <typename TP>
__device__ __forceinline__ float inverse_std(const TP* __restrict__ running_var, int c, float eps) {
  return 1.f / sqrtf(kf::to_float(running_var[c]) + eps);
}

template <typename TP, bool HAS_W, bool HAS_B>
__device__ __forceinline__ ChannelConst channel_const(const TP* __restrict__ w,
                                                      const TP* __restrict__ b,
                                                      const TP* __restrict__ running_mean,
                                                      const TP* __restrict__ running_var, int c,
                                                      float eps) {
  const float invstd = inverse_std(running_var, c, eps);
  return {kf::to_float(running_mean[c]), HAS_W ? kf::to_float(w[c]) * invstd : invstd,
          HAS_B ? kf::to_float(b[c]) : 0.f};
}

// The channel of each element of the group starting at e.
template <int C, long long CS, int VEC, typename Index>
__device__ __forceinline__ void group_channels(Index e, int (&c)[VEC]) {
  if constexpr (CS == 1) {
    const int first = int(e % C);
#pragma unroll
    for (int k = 0; k < VEC; ++k) c[k] = first + k;
  } else if constexpr (CS % VEC == 0) {
    const int only = int((e / CS) % C);
#pragma unroll
    for (int k = 0; k < VEC; ++k) c[k] = only;
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) c[k] = int(((e + k) / CS) % C);
  }
}

template <typename T, typename TP, typename Index, int C, long long CS, Index NUMEL, int VEC,
          int UNROLL, bool TABLE, bool HAS_W, bool HAS_B, bool PACKED>
__device__ __forceinline__ void batch_norm_loop(const T* __restrict__ x, const TP* __restrict__ w,
                                                const TP* __restrict__ b,
                                                const TP* __restrict__ running_mean,
                                                const TP* __restrict__ running_var,
                                                T* __restrict__ y, float* __restrict__ save_mean,
                                                float* __restrict__ save_invstd, float eps) {
  constexpr Index GROUPS = NUMEL / VEC;
  // A group within one channel needs that channel's constants once.
  constexpr bool ONE_CHANNEL = CS != 1 && CS % VEC == 0;
  __shared__ ChannelConst table[TABLE ? C : 1];  // one unused slot without TABLE
  if (TABLE || blockIdx.x == 0) {
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      if constexpr (TABLE) table[c] = channel_const<TP, HAS_W, HAS_B>(w, b, running_mean, running_var, c, eps);
      if (blockIdx.x == 0) {
        save_mean[c] = kf::to_float(running_mean[c]);
        save_invstd[c] = inverse_std(running_var, c, eps);
      }
    }
    if constexpr (TABLE) __syncthreads();
  }
  const Index step = Index(gridDim.x) * blockDim.x * UNROLL;
  for (Index first = Index(blockIdx.x) * blockDim.x * UNROLL + threadIdx.x; first < GROUPS;
       first += step) {
    float v[UNROLL][VEC];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {  // all loads first
      const Index g = first + Index(u) * blockDim.x;
      if (g < GROUPS) kf::load<T, VEC, PACKED>(x + g * VEC, v[u]);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const Index g = first + Index(u) * blockDim.x;
      if (g >= GROUPS) continue;
      int c[VEC];
      group_channels<C, CS, VEC>(g * VEC, c);
      ChannelConst p;
      if constexpr (ONE_CHANNEL) {
        p = TABLE ? table[c[0]] : channel_const<TP, HAS_W, HAS_B>(w, b, running_mean, running_var, c[0], eps);
      }
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        if constexpr (!ONE_CHANNEL) {
          p = TABLE ? table[c[k]] : channel_const<TP, HAS_W, HAS_B>(w, b, running_mean, running_var, c[k], eps);
        }
        v[u][k] = (v[u][k] - p.mean) * p.scale + p.shift;
      }
      kf::store<T, VEC, PACKED>(y + g * VEC, v[u]);
    }
    if constexpr (!TABLE) break;
  }
}
