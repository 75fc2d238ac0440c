// Shared-memory layouts of the matmul kernels, as plain arithmetic (host and device) so that they
// can be checked against CuTe's definitions on a machine without a GPU.
//
// Tiles are ROWS x COLS with COLS the operand's contiguous dimension in global memory.
// `Padded<PITCH>`: rows PITCH elements apart; a pitch of COLS + 8 (16 bytes more than a row) puts
// the 8 rows an ldmatrix reads in 8 different 16-byte bank groups.
// `Swizzle128`: what wgmma reads with the 128-byte swizzle: rows of 64 16-bit elements (128 bytes)
// packed, each row's 16-byte chunks permuted by XOR with the row's index modulo 8; the pattern
// repeats every 8 rows (1024 bytes), so a tile must start 1024-byte aligned.

namespace kf {
namespace mm {

template <int PITCH>
struct Padded {
  static __host__ __device__ __forceinline__ constexpr int offset(int row, int col) {
    return row * PITCH + col;
  }
};

struct Swizzle128 {
  static __host__ __device__ __forceinline__ constexpr int offset(int row, int col) {
    return row * 64 + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
  }
};

// wgmma's shared-memory matrix descriptor of a K-major tile in the Swizzle128 layout starting at
// shared address `address`: start address and offsets in 16-byte units; the stride between
// groups of 8 rows is 1024 bytes; the leading offset is unused by swizzled layouts (1 by
// convention); layout type 1 is the 128-byte swizzle. Stepping along K inside the 64-element
// row adds the byte offset to the start address (the hardware applies the swizzle).
__host__ __device__ __forceinline__ constexpr uint64_t sw128_descriptor(uint32_t address) {
  return uint64_t((address & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32)
         | (uint64_t(1) << 62);
}

}  // namespace mm
}  // namespace kf
