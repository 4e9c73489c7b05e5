// BF16 GEMM for CPUs with AVX512-BF16, or with AVX2 and FMA: y[M, N] = x[M, K] @ w[N, K].T, FP32 sums,
// BF16 result. Built once per ISA (the Python side picks the flags); both builds read the same packed
// weight, so a graph that calls the op runs on either.
//
// The weight is packed once (bf16_gemm_pack) into panels of 32 output columns, each K/2 pairs deep:
// packed[p][k/2][c][2] = w[32 p + c][k]. A panel is then one sequential stream, and each 64-byte load
// holds one pair of k for 32 columns: VDPBF16PS multiplies it with the pair of x broadcast to every
// lane and adds both products into 32 FP32 sums (two registers), so no horizontal sum is needed. Up to 8
// rows of x share each load of the weight; larger calls walk a panel (in L2) once per 8 rows.
//
// AVX2 has no BF16 arithmetic, but a pair of BF16 in a 32-bit lane is two FP32 numbers cheaply: the
// high one by masking the low 16 bits, the low one by shifting it up. Two FMAs per pair, the odd k
// first: the additions VDPBF16PS makes, in the order Intel's pseudo-code gives (a product of two BF16 is
// exact in FP32, so an FMA rounds as its add does; VDPBF16PS also flushes subnormals). The tests check
// each build against a float64 truth, not against each other. Two rows share each load of the weight.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>
#include <torch/types.h>

#include <array>
#include <cstring>
#include <utility>

namespace {

constexpr int64_t kPanel = 32;  // output columns per panel: two AVX-512 registers of FP32 sums

#if defined(__AVX512BF16__)

// Sums of rows m < M of x against one panel; the last pair of an odd K pairs x[K-1] with a zero.
template <int M>
void panel_rows(const c10::BFloat16* x, int64_t K, const c10::BFloat16* panel, c10::BFloat16* y, int64_t ldy,
                int64_t columns) {
  __m512 sum[M][2];
  for (int m = 0; m < M; ++m) sum[m][0] = sum[m][1] = _mm512_setzero_ps();
  const int64_t pairs = K / 2;
  for (int64_t kp = 0; kp < pairs; ++kp) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + kp * 2 * kPanel);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel + kp * 2 * kPanel + kPanel);
    for (int m = 0; m < M; ++m) {
      int32_t pair;
      std::memcpy(&pair, x + m * K + 2 * kp, sizeof(pair));
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
      sum[m][0] = _mm512_dpbf16_ps(sum[m][0], w0, xb);
      sum[m][1] = _mm512_dpbf16_ps(sum[m][1], w1, xb);
    }
  }
  if (K % 2) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + pairs * 2 * kPanel);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel + pairs * 2 * kPanel + kPanel);
    for (int m = 0; m < M; ++m) {
      uint16_t last;
      std::memcpy(&last, x + m * K + K - 1, sizeof(last));
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(last));
      sum[m][0] = _mm512_dpbf16_ps(sum[m][0], w0, xb);
      sum[m][1] = _mm512_dpbf16_ps(sum[m][1], w1, xb);
    }
  }
  // Round to nearest even, as BF16 conversion does everywhere else; the last panel stores only its columns.
  const __mmask16 lo = columns >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << columns) - 1);
  const __mmask16 hi = columns >= 32 ? 0xFFFF : (columns <= 16 ? 0 : static_cast<__mmask16>((1u << (columns - 16)) - 1));
  for (int m = 0; m < M; ++m) {
    _mm256_mask_storeu_epi16(y + m * ldy, lo, (__m256i)_mm512_cvtneps_pbh(sum[m][0]));
    _mm256_mask_storeu_epi16(y + m * ldy + 16, hi, (__m256i)_mm512_cvtneps_pbh(sum[m][1]));
  }
}

using Rows = c10::BFloat16;
constexpr int64_t kRowBlock = 8;

#else

// Sums of rows m < M of x against one panel, x already FP32: M rows of K + 1 numbers, the last a zero for
// an odd K's last pair. Per pair of k, the 4 M sums, the 2 M broadcasts of x and one vector of weights
// at a time fill the 16 registers at M = 2: more rows go by pairs, each walking the panel (in L2) again.
template <int M>
void panel_rows(const float* x, int64_t K, const c10::BFloat16* panel, c10::BFloat16* y, int64_t ldy,
                int64_t columns) {
  __m256 sum[M][4];
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < 4; ++v) sum[m][v] = _mm256_setzero_ps();
  const __m256i high = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  const int64_t pairs = (K + 1) / 2;
  for (int64_t kp = 0; kp < pairs; ++kp) {
    __m256 x_odd[M], x_even[M];
    for (int m = 0; m < M; ++m) {
      x_odd[m] = _mm256_broadcast_ss(x + m * (K + 1) + 2 * kp + 1);
      x_even[m] = _mm256_broadcast_ss(x + m * (K + 1) + 2 * kp);
    }
    const c10::BFloat16* row = panel + kp * 2 * kPanel;
    for (int v = 0; v < 4; ++v) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + v * 16));
      const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(w, high));
      const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
      for (int m = 0; m < M; ++m) {
        sum[m][v] = _mm256_fmadd_ps(odd, x_odd[m], sum[m][v]);
        sum[m][v] = _mm256_fmadd_ps(even, x_even[m], sum[m][v]);
      }
    }
  }
  float sums[M][kPanel];
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < 4; ++v) _mm256_storeu_ps(sums[m] + v * 8, sum[m][v]);
  // c10's conversion rounds to nearest even, and keeps NaN, as BF16 conversion does everywhere else.
  for (int m = 0; m < M; ++m)
    for (int64_t c = 0; c < columns; ++c) y[m * ldy + c] = c10::BFloat16(sums[m][c]);
}

using Rows = float;
constexpr int64_t kRowBlock = 2;

#endif

using PanelRows = void (*)(const Rows*, int64_t, const c10::BFloat16*, c10::BFloat16*, int64_t, int64_t);

// kPanelRows[m]: panel_rows<m> for a block of m rows, 1 <= m <= kRowBlock.
template <std::size_t... I>
constexpr std::array<PanelRows, sizeof...(I) + 1> panel_rows_table(std::index_sequence<I...>) {
  return {nullptr, panel_rows<static_cast<int>(I) + 1>...};
}
constexpr auto kPanelRows = panel_rows_table(std::make_index_sequence<kRowBlock>{});

at::Tensor bf16_gemm(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16, "bf16_gemm: x must be a CPU bfloat16 tensor, got ",
              x.scalar_type(), " on ", x.device());
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kPanel && packed.size(3) == 2 && packed.is_contiguous() &&
                  packed.scalar_type() == at::kBFloat16,
              "bf16_gemm: packed must come from bf16_gemm_pack, got shape ", packed.sizes());
  const int64_t K = x.size(-1);
  TORCH_CHECK(packed.size(1) == (K + 1) / 2, "bf16_gemm: x has ", K, " columns, the packed weight ", packed.size(1) * 2);
  TORCH_CHECK(n > packed.size(0) * kPanel - kPanel && n <= packed.size(0) * kPanel, "bf16_gemm: n = ", n,
              " does not fit ", packed.size(0), " panels");
#if defined(__AVX512BF16__)
  const at::Tensor rows = x.reshape({-1, K}).contiguous();
  const int64_t row_stride = K;
#else
  // Converted once, not once per panel; the zero column completes an odd K's last pair.
  const at::Tensor rows = at::constant_pad_nd(x.reshape({-1, K}).to(at::kFloat), {0, 1});
  const int64_t row_stride = K + 1;
#endif
  const int64_t M = rows.size(0);
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = n;
  at::Tensor y = at::empty(out_shape, x.options());
  if (M == 0) return y;
  const auto* xp = rows.const_data_ptr<Rows>();
  const auto* wp = packed.const_data_ptr<c10::BFloat16>();
  auto* yp = y.mutable_data_ptr<c10::BFloat16>();
  const int64_t panel_size = packed.size(1) * 2 * kPanel;
  at::parallel_for(0, packed.size(0), 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t columns = std::min(kPanel, n - p * kPanel);
      for (int64_t m = 0; m < M; m += kRowBlock) {
        const int64_t block = std::min<int64_t>(kRowBlock, M - m);
        kPanelRows[block](xp + m * row_stride, K, wp + p * panel_size, yp + m * n + p * kPanel, n, columns);
      }
    }
  });
  return y;
}

at::Tensor bf16_gemm_pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16 && weight.device().is_cpu(),
              "bf16_gemm_pack: expected a 2-D CPU bfloat16 weight, got ", weight.scalar_type(), " ", weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  const int64_t panels = (N + kPanel - 1) / kPanel, pairs = (K + 1) / 2;
  // Zero columns and a zero last k fill the edges, so they add nothing to any sum.
  at::Tensor padded = at::zeros({panels * kPanel, pairs * 2}, weight.options());
  padded.narrow(0, 0, N).narrow(1, 0, K).copy_(weight);
  return padded.view({panels, kPanel, pairs, 2}).permute({0, 2, 1, 3}).contiguous();
}

}  // namespace

TORCH_LIBRARY(trnmodels_cpu, m) {
  m.def("bf16_gemm(Tensor x, Tensor packed, int n) -> Tensor");
  m.def("bf16_gemm_pack(Tensor weight) -> Tensor");
}

TORCH_LIBRARY_IMPL(trnmodels_cpu, CPU, m) {
  m.impl("bf16_gemm", bf16_gemm);
  m.impl("bf16_gemm_pack", bf16_gemm_pack);
}
