// Attention over a KV cache's buffers for the compiled pass: softmax(q k^T * scale + bias) v,
// every query row on its own in a fixed order, so a row has the same bits whatever the rows
// beside it (a verify row is the one-token pass's).
//
// The library products it replaces (batched gemm for the scores, again for the values, a copy of
// the values laid out for the second) took ~2 ms of a 7 ms pass at 200 cached tokens: each read
// the float32 keys or values at a few GB/s, and the copy wrote them once more. Here a work item is
// one KV head's block of 64 keys: their scores, a softmax within the block and its values' sum
// for every query row of that head, the block read once into cache and used by all its rows.
// The blocks are then merged in order (the running-max rescaling of flash decoding), so the
// threads' split of the blocks changes no bit.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>

extern "C" __m512 Sleef_expf16_u10(__m512);  // exported by torch_cpu (ATen's vectorized exp)

namespace {

constexpr int64_t BLOCK = 64, LANES = 16, MAX_VECS = 16;  // keys a work item; head_dim <= 256

// 16 vectors' sums in one vector, lane j the sum of v[j] (v is overwritten): pairs added within
// 128-bit blocks, then blocks, in four rounds of shuffles (three instructions a vector where a
// reduction of each would take ten).
inline __m512 sums16(__m512* v) {
  for (int i = 0; i < 8; ++i)
    v[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // element e of each block: a part of vector 4i + e
    const __m512d a = _mm512_castps_pd(v[2 * i]), b = _mm512_castps_pd(v[2 * i + 1]);
    v[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  for (int i = 0; i < 2; ++i)
    v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x88), _mm512_shuffle_f32x4(v[0], v[1], 0xDD));
}

// One query row against one block of keys: the block's max score, its exponentials' sum and
// their values' sum written to part (D values, then max and sum).
void block_row(const float* q, const float* k, const float* v, const float* bias, float scale, int64_t D,
               float* part) {
  const int64_t vecs = D / LANES;
  __m512 qv[MAX_VECS];
  for (int64_t t = 0; t < vecs; ++t) qv[t] = _mm512_loadu_ps(q + t * LANES);
  alignas(64) float s[BLOCK];
  for (int64_t j0 = 0; j0 < BLOCK; j0 += LANES) {
    __m512 dots[LANES];
    for (int64_t j = 0; j < LANES; ++j) {
      const float* kj = k + (j0 + j) * D;
      dots[j] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kj));
      for (int64_t t = 1; t < vecs; ++t) dots[j] = _mm512_fmadd_ps(qv[t], _mm512_loadu_ps(kj + t * LANES), dots[j]);
    }
    _mm512_store_ps(s + j0, _mm512_add_ps(_mm512_mul_ps(sums16(dots), _mm512_set1_ps(scale)), _mm512_loadu_ps(bias + j0)));
  }
  __m512 top = _mm512_load_ps(s);
  for (int64_t j = LANES; j < BLOCK; j += LANES) top = _mm512_max_ps(top, _mm512_load_ps(s + j));
  const float m = _mm512_reduce_max_ps(top);
  float* out = part;
  if (m == -std::numeric_limits<float>::infinity()) {  // every key masked: adds nothing
    for (int64_t t = 0; t < D; ++t) out[t] = 0.f;
    out[D] = m, out[D + 1] = 0.f;
    return;
  }
  __m512 total = _mm512_setzero_ps();
  for (int64_t j = 0; j < BLOCK; j += LANES) {
    const __m512 p = Sleef_expf16_u10(_mm512_sub_ps(_mm512_load_ps(s + j), _mm512_set1_ps(m)));
    _mm512_store_ps(s + j, p);
    total = _mm512_add_ps(total, p);
  }
  __m512 acc[MAX_VECS];
  for (int64_t t = 0; t < vecs; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t j = 0; j < BLOCK; ++j) {
    const __m512 p = _mm512_set1_ps(s[j]);
    for (int64_t t = 0; t < vecs; ++t) acc[t] = _mm512_fmadd_ps(p, _mm512_loadu_ps(v + j * D + t * LANES), acc[t]);
  }
  for (int64_t t = 0; t < vecs; ++t) _mm512_storeu_ps(out + t * LANES, acc[t]);
  out[D] = m, out[D + 1] = _mm512_reduce_add_ps(total);
}

}  // namespace

// q (H, R, D) float32: R query rows per KV head; keys, values (1, H, capacity, D) float32, the
// cache's buffers, the first ``width`` positions attended; bias (>= H, >= R, width) float32, 0
// where attended and -inf where not. width a multiple of 64, D of 16. Returns (H, R, D).
at::Tensor attend(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& bias,
                  double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.is_contiguous(), "q: (H, R, D) contiguous float32");
  const int64_t H = q.size(0), R = q.size(1), D = q.size(2), width = bias.size(2), blocks = width / BLOCK;
  TORCH_CHECK(D % LANES == 0 && D <= LANES * MAX_VECS, "head_dim: a multiple of 16 up to 256");
  for (const at::Tensor* t : {&keys, &values})
    TORCH_CHECK(t->dim() == 4 && t->size(1) == H && t->size(2) >= width && t->size(3) == D && t->is_contiguous() &&
                    t->scalar_type() == at::kFloat, "keys, values: (1, H, capacity, D) contiguous float32");
  TORCH_CHECK(bias.dim() == 3 && bias.size(0) >= H && bias.size(1) >= R && width % BLOCK == 0 && width > 0 &&
                  bias.is_contiguous() && bias.scalar_type() == at::kFloat, "bias: (>= H, >= R, width) float32");
  const int64_t cap = keys.size(2), rows = bias.size(1), P = D + 2;
  at::Tensor parts = at::empty({H, blocks, R, P}, q.options());
  const float *Q = q.data_ptr<float>(), *K = keys.data_ptr<float>(), *V = values.data_ptr<float>(),
              *B = bias.data_ptr<float>();
  float* W = parts.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, H * blocks, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t h = i / blocks, c = i % blocks;
      const float* k = K + (h * cap + c * BLOCK) * D;
      const float* v = V + (h * cap + c * BLOCK) * D;
      for (int64_t r = 0; r < R; ++r)
        block_row(Q + (h * R + r) * D, k, v, B + (h * rows + r) * width + c * BLOCK, sc, D, W + (i * R + r) * P);
    }
  });
  at::Tensor out = at::empty({H, R, D}, q.options());
  float* O = out.data_ptr<float>();
  at::parallel_for(0, H * R, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t h = i / R, r = i % R;
      const float* first = W + (h * blocks * R + r) * P;  // block c of this row: first + c * R * P
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c < blocks; ++c) m = std::max(m, first[c * R * P + D]);
      float total = 0.f;
      __m512 acc[MAX_VECS];
      for (int64_t t = 0; t < D / LANES; ++t) acc[t] = _mm512_setzero_ps();
      for (int64_t c = 0; c < blocks; ++c) {
        const float* part = first + c * R * P;
        if (part[D + 1] == 0.f) continue;
        const float w = std::exp(part[D] - m);
        total += w * part[D + 1];
        for (int64_t t = 0; t < D / LANES; ++t)
          acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(w), _mm512_loadu_ps(part + t * LANES), acc[t]);
      }
      const __m512 inv = _mm512_set1_ps(1.f / total);
      for (int64_t t = 0; t < D / LANES; ++t) _mm512_storeu_ps(O + i * D + t * LANES, _mm512_mul_ps(acc[t], inv));
    }
  });
  return out;
}

TORCH_LIBRARY_FRAGMENT(mlxspec_vnni, m) { m.def("attend(Tensor q, Tensor keys, Tensor values, Tensor bias, float scale) -> Tensor"); }
TORCH_LIBRARY_IMPL(mlxspec_vnni, CPU, m) { m.impl("attend", &attend); }
