// x @ W.T for the model file's affine 4- and 8-bit weights (W = scale * q + bias per group of 32),
// the activations as two bytes a value per group of 32 (``quantize``), the products on AVX-512
// VNNI byte dot products (vpdpbusd: unsigned weight bytes times signed activation bytes).
//
// W is repacked (torchpath/vnni.py) so that one 64-byte load holds 4 weights of 16 output rows:
// lane l of a dot product sums row l's 4 weights against the same 4 activations, broadcast. A
// group's 32 weights of 16 rows take 8 dot products a byte into one integer sum per row, then
// one float multiply-add by the rows' scales; rows never meet, so an output has the same bits
// whatever the number of rows in the pass, the thread count or the rows beside it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace {

constexpr int64_t GROUP = 32, LANES = 16, ROWS = 4;  // ROWS: activation rows sharing a read of W
// The blocks' 4-bit products are short streams (0.3-1.8 MB a call) that the hardware prefetcher
// ramps up on too late: reading 4 KB ahead made 30 layers' products 0.78x as long here (4.4 ->
// 3.4 ms). The head's one long stream it serves better alone (0.76 ms against 1.0 with it).
constexpr int64_t PREFETCH = 4096;

// x rounded to bfloat16 (to nearest, ties to even), kept in float32.
inline __m512 bfloat16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i up = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  return _mm512_castsi512_ps(_mm512_and_si512(up, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// One row's activations in two bytes a value, per group of 32: the scale maps the group's largest
// magnitude to 127, the first byte is the value rounded at that scale and the second the rest,
// rounded at 1/256 of it (so the integer sums make hi * 256 + lo). One byte alone (llama.cpp's
// Q8) moved this model's logits by 10% (rms, against float32): a few channels carry values ~100x
// the rest, and their group's others round to 0 or 1. Two bytes give bfloat16's accuracy at
// twice the integer work, which the memory-bound one-token pass hides. The values are rounded to
// bfloat16 first, as torch's int4 kernel rounds them: a tree node's attention sums its keys at
// other cache slots than its chain's one-token passes do, a last-bit difference bfloat16 absorbs,
// so the node's row keeps the one-token bits. Writes, per group, 32 high bytes then 32 low ones,
// the step of a low one, and the group's sum (the weights' biases multiply it).
void quantize(const float* x, int64_t K, int8_t* q, float* step, float* sum) {
  for (int64_t g = 0; g < K / GROUP; ++g) {
    const __m512 a = bfloat16(_mm512_loadu_ps(x + g * GROUP)), b = bfloat16(_mm512_loadu_ps(x + g * GROUP + 16));
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    step[g] = amax / 127.f / 256.f;
    sum[g] = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
    const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    auto* out = reinterpret_cast<__m128i*>(q + g * 2 * GROUP);
    const __m512 half[2] = {_mm512_mul_ps(a, inv), _mm512_mul_ps(b, inv)};
    for (int i = 0; i < 2; ++i) {
      const __m512i hi = _mm512_cvtps_epi32(half[i]);  // to nearest, ties to even
      const __m512 rest = _mm512_mul_ps(_mm512_sub_ps(half[i], _mm512_cvtepi32_ps(hi)), _mm512_set1_ps(256.f));
      _mm_storeu_si128(out + i, _mm512_cvtsepi32_epi8(hi));
      _mm_storeu_si128(out + 2 + i, _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(rest)));  // 128 saturates to 127
    }
  }
}

// A group's weights for 16 rows as 8 vectors of bytes: for 4 bits, byte j of a lane holds weight
// j in its low nibble and weight j + 16 in its high one (vnni.py's layout).
inline void load_group(const uint8_t* w, int64_t bits, __m512i* v) {
  if (bits == 8) {
    for (int t = 0; t < 8; ++t) v[t] = _mm512_loadu_si512(w + 64 * t);
    return;
  }
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int t = 0; t < 4; ++t) {
    const __m512i packed = _mm512_loadu_si512(w + 64 * t);
    v[t] = _mm512_and_si512(packed, nibble);
    v[t + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
  }
}

// Four partial sums, so consecutive dot products do not wait on each other; integer sums, so
// their order does not change a bit.
inline __m512i group_dot(const __m512i* w, const int8_t* a) {
  __m512i part[4];
  for (int t = 0; t < 4; ++t)
    part[t] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[t], _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(a + 4 * t)));
  for (int t = 4; t < 8; ++t)
    part[t - 4] = _mm512_dpbusd_epi32(part[t - 4], w[t], _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(a + 4 * t)));
  return _mm512_add_epi32(_mm512_add_epi32(part[0], part[1]), _mm512_add_epi32(part[2], part[3]));
}

}  // namespace

// x (M, K) float32; w (N / 16, K / 32, 16 * 32 * bits / 8) uint8; sz (2, N / 16, K / 32, 16)
// float16, the scales then the biases. Returns (M, N) float32.
at::Tensor qmm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& sz, int64_t bits) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x: (M, K) contiguous float32");
  TORCH_CHECK(bits == 4 || bits == 8, "4 or 8 bits");
  const int64_t M = x.size(0), K = x.size(1), G = K / GROUP, blocks = w.size(0), N = blocks * LANES;
  const int64_t group_bytes = LANES * GROUP * bits / 8;
  TORCH_CHECK(K % GROUP == 0 && w.dim() == 3 && w.size(1) == G && w.size(2) == group_bytes && w.is_contiguous() &&
                  w.scalar_type() == at::kByte, "w: the repacked weights of a K-wide layer");
  TORCH_CHECK(sz.dim() == 4 && sz.size(0) == 2 && sz.size(1) == blocks && sz.size(2) == G && sz.size(3) == LANES &&
                  sz.is_contiguous() && sz.scalar_type() == at::kHalf, "sz: the repacked scales and biases");
  // one workspace for the activation bytes, steps and sums: an allocation is ~0.7 us, and a pass
  // makes 121 of these products
  at::Tensor work = at::empty({M * 2 * K + 2 * M * G * 4}, x.options().dtype(at::kByte));
  const float* X = x.data_ptr<float>();
  auto* Q = reinterpret_cast<int8_t*>(work.data_ptr<uint8_t>());  // 2K bytes a row: 64-byte multiples
  float* D = reinterpret_cast<float*>(Q + M * 2 * K);
  float* S = D + M * G;
  for (int64_t m = 0; m < M; ++m) quantize(X + m * K, K, Q + m * 2 * K, D + m * G, S + m * G);

  at::Tensor out = at::empty({M, N}, x.options());
  float* O = out.data_ptr<float>();
  const uint8_t* W = w.data_ptr<uint8_t>();
  const auto* scales = reinterpret_cast<const uint16_t*>(sz.data_ptr<at::Half>());
  const auto* biases = scales + blocks * G * LANES;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t nb = b0; nb < b1; ++nb) {
      for (int64_t m0 = 0; m0 < M; m0 += ROWS) {
        const int rows = static_cast<int>(std::min(ROWS, M - m0));
        __m512 acc[ROWS];
        for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_setzero_ps();
        for (int64_t g = 0; g < G; ++g) {
          const int64_t at = nb * G + g;
          __m512i wv[8];
          if (bits == 4) {
            const char* ahead = reinterpret_cast<const char*>(W + at * group_bytes) + PREFETCH;
            for (int64_t line = 0; line < group_bytes; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
          }
          load_group(W + at * group_bytes, bits, wv);
          const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + at * LANES)));
          const __m512 b = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(biases + at * LANES)));
          for (int r = 0; r < rows; ++r) {
            const int64_t m = m0 + r;
            const int8_t* a = Q + (m * G + g) * 2 * GROUP;
            const __m512i hi = group_dot(wv, a), lo = group_dot(wv, a + GROUP);
            const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo));
            acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(s, _mm512_set1_ps(D[m * G + g])), acc[r]);
            acc[r] = _mm512_fmadd_ps(b, _mm512_set1_ps(S[m * G + g]), acc[r]);
          }
        }
        for (int r = 0; r < rows; ++r) _mm512_storeu_ps(O + (m0 + r) * N + nb * LANES, acc[r]);
      }
    }
  });
  return out;
}

TORCH_LIBRARY(mlxspec_vnni, m) { m.def("qmm(Tensor x, Tensor w, Tensor sz, int bits) -> Tensor"); }
TORCH_LIBRARY_IMPL(mlxspec_vnni, CPU, m) { m.impl("qmm", &qmm); }
