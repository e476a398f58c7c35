/* The pieces of kernels/grouped/grouped_quantize.cu's cast tiles that know nothing of experts:
 * 16 elements loaded undecoded (Raw16), and the transposed stores of a chunk's codes from the
 * shared tile (16 or 64 rows by CHUNK columns). */
#ifndef LK_GROUPED_CAST_TILES_CUH
#define LK_GROUPED_CAST_TILES_CUH

#include "common/elements.cuh"
#include "common/f32.cuh"

#include <cstdint>

namespace lk_grouped_tiles {

using namespace lkc;

/* a tile's rows come in groups of 16 (the padded layout's unit: no group straddles two experts) */
constexpr int TILE_ROWS = 16;
/* A block covers a tile of 16 or 64 rows in chunks of 128 columns: thread t loads 16 consecutive
 * elements of row t / 8 of each 16-row group (16-byte loads), so no thread divides an index and
 * every warp reads whole rows. */
constexpr int CHUNK = 128;

/* 16 elements as loaded, undecoded: the fast paths (VEC, no activation) issue the next chunk's
 * loads before the current chunk is encoded, so a thread keeps two 16-byte (f32: four) loads in
 * flight instead of waiting on each. */
template <int XD> struct Raw16 {
  static constexpr int N = XD == LUTRA_F32 ? 4 : 2; /* 16-byte words */
  uint4 w[N];
};

template <int XD> LKC_D void decode_raw(const Raw16<XD> &q, float (&v)[16]) {
  LKC_UNROLL
  for (int k = 0; k < Raw16<XD>::N; k++) {
    const uint32_t u[4] = {q.w[k].x, q.w[k].y, q.w[k].z, q.w[k].w};
    LKC_UNROLL
    for (int j = 0; j < 4; j++) {
      if constexpr (XD == LUTRA_F32)
        v[4 * k + j] = bits_f32(u[j]);
      else
        unpack2<XD>(u[j], v[8 * k + 2 * j], v[8 * k + 2 * j + 1]);
    }
  }
}

/* The transpose of a shared 16-row tile's chunk (16 consecutive rows of the expert's transpose
 * per column): thread j gathers column j's 16 codes into one 16-byte store. One byte per thread
 * strided by the expert's padded rows, as a plain transposed store would write, would cost a
 * memory transaction per byte; a 16-byte store still writes half of a 32-byte sector, whose other
 * half comes from the next tile's block, often too late to merge in L2. */
LKC_D void store_transpose16(const uint8_t (&tile)[TILE_ROWS][CHUNK], uint8_t *dst, int64_t col0,
                             int64_t cols, int64_t p) {
  const int64_t cc = col0 + threadIdx.x;
  if (cc >= cols) return;
  uint32_t wd[4];
  LKC_UNROLL
  for (int j = 0; j < 4; j++)
    wd[j] = (uint32_t)tile[4 * j][threadIdx.x] | ((uint32_t)tile[4 * j + 1][threadIdx.x] << 8) |
            ((uint32_t)tile[4 * j + 2][threadIdx.x] << 16) |
            ((uint32_t)tile[4 * j + 3][threadIdx.x] << 24);
  *reinterpret_cast<uint4 *>(dst + cc * p) = make_uint4(wd[0], wd[1], wd[2], wd[3]);
}

/* Where 16-byte word s of row r of a 64-row shared tile lies: rows of group g = r / 16 have
 * their words rotated by 2 g (word q of 4 bytes at q ^ 8 g), so that store_transpose64's warp
 * loads, four row groups at once, hit 32 different banks. */
LKC_D int swizzled16(int r, int s) {
  return s ^ (2 * (r / TILE_ROWS));
}

/* The transpose of a shared 64-row tile's chunk: thread (q, g) takes columns 4q..4q+3 of row
 * group g = threadIdx.x % 4, 16 four-byte loads and four 4x4 byte transposes (byte_perm), and
 * writes them at dst (its group's rows in its expert's transpose, p padded rows a column). Where
 * the four groups belong to one expert, the four threads of a quad write those columns' 64 bytes
 * (two whole sectors each) together. */
LKC_D void store_transpose64(const uint8_t (&tile)[64][CHUNK], uint8_t *dst, int64_t col0,
                             int64_t cols, int64_t p) {
  const int q = threadIdx.x / 4, g = threadIdx.x % 4;
  const int64_t cq = col0 + 4 * q;
  if (cq >= cols) return; /* cols % 16 == 0: a quad is whole or past the end */
  const uint32_t *tw = reinterpret_cast<const uint32_t *>(&tile[0][0]);
  const int wi = q ^ (8 * g); /* swizzled16's rotation, in four-byte words */
  uint32_t col[4][4];         /* [column][four rows] */
  LKC_UNROLL
  for (int k = 0; k < 4; k++) {
    const uint32_t *x = tw + (g * TILE_ROWS + 4 * k) * (CHUNK / 4) + wi;
    const uint32_t x0 = x[0], x1 = x[CHUNK / 4], x2 = x[CHUNK / 2], x3 = x[3 * CHUNK / 4];
    const uint32_t t0 = __byte_perm(x0, x1, 0x5140), t1 = __byte_perm(x0, x1, 0x7362);
    const uint32_t t2 = __byte_perm(x2, x3, 0x5140), t3 = __byte_perm(x2, x3, 0x7362);
    col[0][k] = __byte_perm(t0, t2, 0x5410);
    col[1][k] = __byte_perm(t0, t2, 0x7632);
    col[2][k] = __byte_perm(t1, t3, 0x5410);
    col[3][k] = __byte_perm(t1, t3, 0x7632);
  }
  LKC_UNROLL
  for (int j = 0; j < 4; j++)
    *reinterpret_cast<uint4 *>(dst + (cq + j) * p) =
        make_uint4(col[j][0], col[j][1], col[j][2], col[j][3]);
}

} // namespace lk_grouped_tiles

#endif
