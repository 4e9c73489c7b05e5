// FP32 GEMM on a weight packed into panels of 32 output columns: y[M, N] = x[M, K] @ w[N, K].T.
//
// The weight is packed once (fp32_gemm_pack): packed[p][k][c] = w[32 p + c][k], zero columns filling the
// last panel. Each panel is then one sequential stream of K rows of 32 weights, and a row of x multiplies
// one of them with one broadcast and four FMAs, the sums of 32 outputs in four registers: no horizontal
// sum. Measured on an AVX2 Zen 3 (SmolLM2-135M's weights, docs/runner-and-compile.md), one row read the
// weights at 27 GB/s where Inductor's one-row reductions read 23-26 and MKL's SGEMV 13.
//
// Up to kStreamRows rows walk each panel whole, two rows at a time: the first pair streams it from memory,
// the others find it in L2 (a panel is K x 128 bytes; walking it in chunks that stay in L1 was slower at
// one and two rows, and no faster at four and eight). With more than one pair, memory would idle while the
// later pairs compute, so every walk also prefetches its share of the next panel into L2: 4-17% faster
// at 3 to 8 rows. Prefetching it all in one walk, or half panels of 4 or 6 rows, was slower.
//
// More rows are a GEMM: tiles of 6 rows by half a panel (12 sums in registers, the classic AVX2 shape),
// the panel in blocks of kDepth rows (16 KB of a half panel) that stay in L1 while every tile of rows reads
// them, partial sums kept in y between blocks. That kept up with MKL's SGEMM (0.94-1.1x from 64 to 256
// rows) on the same weights.
//
// Each output is one FMA chain over k in order (per 32 outputs at decode sizes), so its error is that of
// a sequential FP32 sum; the tests check it against a float64 truth. The loops over rows and vectors are
// unrolled by hand (`#pragma GCC unroll`): left to GCC, the arrays of sums went through the stack on
// every FMA and the GEMM ran at 40% of SGEMM's rate.
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>
#include <torch/types.h>

#include <algorithm>
#include <array>
#include <utility>

namespace {

constexpr int64_t kPanel = 32;       // output columns per panel: four AVX2 registers of sums
constexpr int64_t kStreamRows = 8;   // up to this many rows: pairs of rows walk each panel whole
constexpr int64_t kTileRows = 6;     // rows per GEMM tile
constexpr int64_t kDepth = 256;      // panel rows per GEMM block: 16 KB of a half panel

// Lanes of vector v (8 columns) inside `columns` valid columns, as a maskload/maskstore mask.
inline __m256i lane_mask(int64_t columns, int v) {
  const int64_t valid = std::clamp<int64_t>(columns - 8 * v, 0, 8);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(valid)), lanes);
}

inline __m256 load_sums(const float* y, int64_t columns, int v, bool first) {
  if (first) return _mm256_setzero_ps();
  return columns >= 8 * (v + 1) ? _mm256_loadu_ps(y + 8 * v) : _mm256_maskload_ps(y + 8 * v, lane_mask(columns, v));
}

inline void store_sums(float* y, int64_t columns, int v, __m256 sums) {
  if (columns >= 8 * (v + 1))
    _mm256_storeu_ps(y + 8 * v, sums);
  else if (columns > 8 * v)
    _mm256_maskstore_ps(y + 8 * v, lane_mask(columns, v), sums);
}

// M rows of x (row stride ldx) against panel rows [0, depth) of V vectors (8 columns each) of a panel: the
// whole panel (V = 4) or half of it (V = 2). The sums of the `columns` valid outputs are added to y (row
// stride ldy), or written when `first`. Unless `fetch` is null, the rows of the panel at `fetch` are
// prefetched into L2 in order, one every `fetch_every` k (a countdown: no division in the loop).
template <int M, int V>
void panel_rows(const float* x, int64_t ldx, const float* panel, int64_t depth, float* y, int64_t ldy,
                int64_t columns, bool first, const float* fetch, int64_t fetch_every) {
  __m256 sum[M][V];
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) sum[m][v] = load_sums(y + m * ldy, columns, v, first);
  int64_t fetch_in = 0;
  for (int64_t k = 0; k < depth; ++k) {
    if (fetch != nullptr && fetch_in-- == 0) {
      _mm_prefetch(reinterpret_cast<const char*>(fetch), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(fetch) + 64, _MM_HINT_T1);
      fetch += kPanel;
      fetch_in = fetch_every - 1;
    }
    __m256 w[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) w[v] = _mm256_loadu_ps(panel + k * kPanel + 8 * v);
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const __m256 xk = _mm256_broadcast_ss(x + m * ldx + k);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) sum[m][v] = _mm256_fmadd_ps(xk, w[v], sum[m][v]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) store_sums(y + m * ldy, columns, v, sum[m][v]);
}

using Rows = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t, bool, const float*,
                     int64_t);

// rows_table<V>[m]: panel_rows<m, V> for a block of m rows, 1 <= m <= sizeof...(I).
template <int V, std::size_t... I>
constexpr std::array<Rows, sizeof...(I) + 1> rows_table(std::index_sequence<I...>) {
  return {nullptr, panel_rows<static_cast<int>(I) + 1, V>...};
}
constexpr auto kPanelRows = rows_table<4>(std::make_index_sequence<2>{});
constexpr auto kTileRowsOf = rows_table<2>(std::make_index_sequence<kTileRows>{});

at::Tensor fp32_gemm(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, "fp32_gemm: x must be a CPU float32 tensor, got ",
              x.scalar_type(), " on ", x.device());
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kPanel && packed.is_contiguous() && packed.scalar_type() == at::kFloat,
              "fp32_gemm: packed must come from fp32_gemm_pack, got shape ", packed.sizes());
  const int64_t K = x.size(-1);
  TORCH_CHECK(packed.size(1) == K, "fp32_gemm: x has ", K, " columns, the packed weight ", packed.size(1));
  TORCH_CHECK(n > packed.size(0) * kPanel - kPanel && n <= packed.size(0) * kPanel, "fp32_gemm: n = ", n,
              " does not fit ", packed.size(0), " panels");
  const at::Tensor rows = x.reshape({-1, K}).contiguous();
  const int64_t M = rows.size(0);
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = n;
  at::Tensor y = at::empty(out_shape, x.options());
  if (M == 0) return y;
  if (K == 0) return y.zero_();
  const float* xp = rows.const_data_ptr<float>();
  const float* wp = packed.const_data_ptr<float>();
  float* yp = y.mutable_data_ptr<float>();
  const int64_t panels = packed.size(0);
  if (M <= kStreamRows) {
    const int64_t walks = (M + 1) / 2;
    at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t columns = std::min(kPanel, n - p * kPanel);
        const float* next = walks > 1 && p + 1 < p1 ? wp + (p + 1) * K * kPanel : nullptr;
        for (int64_t m = 0, walk = 0; m < M; m += 2, ++walk) {
          const float* fetch = next == nullptr ? nullptr : next + walk * K / walks * kPanel;
          kPanelRows[std::min<int64_t>(2, M - m)](xp + m * K, K, wp + p * K * kPanel, K, yp + m * n + p * kPanel, n,
                                                   columns, true, fetch, walks);
        }
      }
    });
    return y;
  }
  at::parallel_for(0, panels * 2, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t p = h / 2, offset = (h % 2) * (kPanel / 2);
      const int64_t columns = std::min(kPanel / 2, n - p * kPanel - offset);
      if (columns <= 0) continue;
      const float* half = wp + p * K * kPanel + offset;
      for (int64_t k0 = 0; k0 < K; k0 += kDepth) {
        const int64_t depth = std::min(kDepth, K - k0);
        for (int64_t m = 0; m < M; m += kTileRows) {
          kTileRowsOf[std::min(kTileRows, M - m)](xp + m * K + k0, K, half + k0 * kPanel, depth,
                                                   yp + m * n + p * kPanel + offset, n, columns, k0 == 0, nullptr, 1);
        }
      }
    }
  });
  return y;
}

at::Tensor fp32_gemm_pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.device().is_cpu(),
              "fp32_gemm_pack: expected a 2-D CPU float32 weight, got ", weight.scalar_type(), " ", weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  const int64_t panels = (N + kPanel - 1) / kPanel;
  at::Tensor padded = at::zeros({panels * kPanel, K}, weight.options());
  padded.narrow(0, 0, N).copy_(weight);
  return padded.view({panels, kPanel, K}).transpose(1, 2).contiguous();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(trnmodels_cpu, m) {
  m.def("fp32_gemm(Tensor x, Tensor packed, int n) -> Tensor");
  m.def("fp32_gemm_pack(Tensor weight) -> Tensor");
}

TORCH_LIBRARY_IMPL(trnmodels_cpu, CPU, m) {
  m.impl("fp32_gemm", fp32_gemm);
  m.impl("fp32_gemm_pack", fp32_gemm_pack);
}
