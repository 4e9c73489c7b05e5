// Decode attention over a paged KV cache, FP32 or BF16: one query per sequence, q [B, H, D], against
// k_cache / v_cache [blocks, Hkv, block_size, D] through block_tables [B, max_blocks]; out [B, H, Dv].
//
// Why our own: in a captured decode graph the reference is a gather of every block of the bucket, two
// batched matmuls and a softmax over it, and Inductor ran that at about 100 us a layer for some 0.2 M
// multiply-adds (llama3 bench config, batch 1), in every form it was given. This reads the visible rows
// of the cache in place, one task per (sequence, KV head), the group's query heads against each K row
// while it is in the caches.
//
// Arithmetic, as the reference (ops.scaled_dot_product) does it: scores summed in FP32, then times the
// scale in FP32, softcapped, softmax in FP32 (a sink adds one logit to the denominator only), values
// summed in FP32. In BF16 the reference's matmuls round their results: each score is rounded to BF16
// before the scale, each probability before it weights the values, and the output once at the end.
// Positions the reference masks get a weight of exactly 0 there, so they are left out here; only the
// order of the sums differs.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

namespace {

// Both builds (AVX2, AVX512-BF16) run this in AVX2's 8 lanes: at a head size of 64 to 256 a row is 8 to
// 32 vectors, and the sums of a block of positions stay in registers.
constexpr int64_t kLanes = 8;

inline __m256 load8(const float* x) { return _mm256_loadu_ps(x); }
inline __m256 load8(const c10::BFloat16* x) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
inline float load1(float x) { return x; }
inline float load1(c10::BFloat16 x) { return static_cast<float>(x); }

// The sums of the lanes of a[0..7], in one vector: element j is a[j]'s.
inline __m256 lane_sums(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// What the reference's matmul returns for an FP32 sum: itself in FP32, rounded to BF16 in BF16.
template <typename T>
inline float as_matmul_result(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return static_cast<float>(c10::BFloat16(x));
  }
}

struct Cache {
  const void* data;
  int64_t block_stride, head_stride, row_stride;
};

template <typename T>
struct Rows {
  const Cache& cache;
  const int64_t* table;
  int64_t head, block_size;
  const T* operator()(int64_t p) const {
    return static_cast<const T*>(cache.data) + table[p / block_size] * cache.block_stride + head * cache.head_stride +
           (p % block_size) * cache.row_stride;
  }
};

// scores[i] = q . key(first + i) for i < n: eight positions at a time, each row's products summed in a
// vector of its own, then the eight vectors' lanes summed together.
template <typename T>
void dot_rows(const float* q, int64_t D, const Rows<T>& key, int64_t first, int64_t n, float* scores) {
  const int64_t whole = D / kLanes * kLanes;
  for (int64_t i0 = 0; i0 < n; i0 += kLanes) {
    const int64_t count = std::min(kLanes, n - i0);
    const T* rows[kLanes];
    for (int64_t j = 0; j < kLanes; ++j) rows[j] = key(first + i0 + std::min(j, count - 1));
    __m256 acc[kLanes];
    for (int64_t j = 0; j < kLanes; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t d = 0; d < whole; d += kLanes) {
      const __m256 qd = _mm256_loadu_ps(q + d);
      for (int64_t j = 0; j < kLanes; ++j) acc[j] = _mm256_fmadd_ps(qd, load8(rows[j] + d), acc[j]);
    }
    float sums[kLanes];
    _mm256_storeu_ps(sums, lane_sums(acc));
    for (int64_t j = 0; j < count; ++j) {
      for (int64_t d = whole; d < D; ++d) sums[j] += q[d] * load1(rows[j][d]);
      scores[i0 + j] = sums[j];
    }
  }
}

// out[0..Dv) = sum over i < n of weights[i] * value(first + i), Dv in blocks of up to 8 vectors held in
// registers; the columns past the last whole vector one by one.
template <typename T>
void weighted_rows(const float* weights, const Rows<T>& value, int64_t first, int64_t n, int64_t Dv, float* out) {
  constexpr int64_t kBlock = 8 * kLanes;
  const int64_t whole = Dv / kLanes * kLanes;
  for (int64_t d0 = 0; d0 < whole; d0 += kBlock) {
    const int64_t vectors = std::min(kBlock, whole - d0) / kLanes;
    __m256 acc[8];
    for (int64_t c = 0; c < 8; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; ++i) {
      const __m256 w = _mm256_set1_ps(weights[i]);
      const T* row = value(first + i) + d0;
      for (int64_t c = 0; c < vectors; ++c) acc[c] = _mm256_fmadd_ps(w, load8(row + c * kLanes), acc[c]);
    }
    for (int64_t c = 0; c < vectors; ++c) _mm256_storeu_ps(out + d0 + c * kLanes, acc[c]);
  }
  for (int64_t d = whole; d < Dv; ++d) {
    float sum = 0.f;
    for (int64_t i = 0; i < n; ++i) sum += weights[i] * load1(value(first + i)[d]);
    out[d] = sum;
  }
}

// One sequence's KV head: its `group` query heads over positions first..last of the cache.
template <typename T>
void attend(const float* q, int64_t group, int64_t D, int64_t Dv, const Rows<T>& key, const Rows<T>& value,
            int64_t first, int64_t last, float scale, float softcap, const float* sinks, T* out) {
  const int64_t n = last - first + 1;
  std::vector<float> scores(n), sums(Dv);
  for (int64_t g = 0; g < group; ++g) {
    dot_rows<T>(q + g * D, D, key, first, n, scores.data());
    float top = sinks ? sinks[g] : -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) {
      float s = as_matmul_result<T>(scores[i]) * scale;
      if (softcap > 0.f) s = std::tanh(s / softcap) * softcap;
      scores[i] = s;
      top = std::max(top, s);
    }
    float total = sinks ? std::exp(sinks[g] - top) : 0.f;
    for (int64_t i = 0; i < n; ++i) {
      scores[i] = std::exp(scores[i] - top);
      total += scores[i];
    }
    for (int64_t i = 0; i < n; ++i) scores[i] = as_matmul_result<T>(scores[i] / total);
    weighted_rows<T>(scores.data(), value, first, n, Dv, sums.data());
    for (int64_t d = 0; d < Dv; ++d) out[g * Dv + d] = T(sums[d]);
  }
}

Cache cache_of(const at::Tensor& c) { return {c.const_data_ptr(), c.stride(0), c.stride(1), c.stride(2)}; }

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                            int64_t sliding_window, double softcap, const std::optional<at::Tensor>& sinks) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.dim() == 4,
              "decode_attention: expected q [B, H, D] and caches [blocks, Hkv, block_size, D], got q ", q.sizes(),
              ", k_cache ", k_cache.sizes(), ", v_cache ", v_cache.sizes());
  const auto dtype = q.scalar_type();
  TORCH_CHECK((dtype == at::kFloat || dtype == at::kBFloat16) && k_cache.scalar_type() == dtype &&
                  v_cache.scalar_type() == dtype && q.device().is_cpu() && k_cache.device().is_cpu() &&
                  v_cache.device().is_cpu(),
              "decode_attention: expected CPU float32 or bfloat16 q and caches of one dtype, got ", dtype, ", ",
              k_cache.scalar_type(), ", ", v_cache.scalar_type());
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t Hkv = k_cache.size(1), block_size = k_cache.size(2), Dv = v_cache.size(3);
  TORCH_CHECK(k_cache.size(3) == D && v_cache.size(0) == k_cache.size(0) && v_cache.size(1) == Hkv &&
                  v_cache.size(2) == block_size && Hkv > 0 && H % Hkv == 0,
              "decode_attention: q ", q.sizes(), " does not fit k_cache ", k_cache.sizes(), " and v_cache ",
              v_cache.sizes());
  TORCH_CHECK(k_cache.stride(3) == 1 && v_cache.stride(3) == 1, "decode_attention: cache rows must be contiguous");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == B && context_lens.numel() == B,
              "decode_attention: block_tables ", block_tables.sizes(), " and context_lens ", context_lens.sizes(),
              " must have one row per sequence of q ", q.sizes());
  const at::Tensor tables = block_tables.to(at::kLong).contiguous();
  const at::Tensor lens = context_lens.to(at::kLong).contiguous();
  const int64_t max_blocks = tables.size(1), blocks = k_cache.size(0);
  const int64_t* table_data = tables.const_data_ptr<int64_t>();
  const int64_t* len_data = lens.const_data_ptr<int64_t>();
  // Checked before any task runs: a bad table would read outside the cache. Only the blocks a sequence
  // reads are checked (under a sliding window, those of its last positions).
  for (int64_t b = 0; b < B; ++b) {
    const int64_t length = std::max<int64_t>(len_data[b], 1);  // an empty (padding) row sees position 0
    TORCH_CHECK(length <= max_blocks * block_size, "decode_attention: sequence ", b, " has context length ",
                len_data[b], ", more than its block table's ", max_blocks * block_size, " positions");
    const int64_t first = sliding_window > 0 ? std::max<int64_t>(0, length - sliding_window) : 0;
    for (int64_t j = first / block_size; j < (length + block_size - 1) / block_size; ++j) {
      const int64_t block = table_data[b * max_blocks + j];
      TORCH_CHECK(block >= 0 && block < blocks, "decode_attention: sequence ", b, " names block ", block,
                  " of a cache of ", blocks);
    }
  }
  std::optional<at::Tensor> sink_values;
  if (sinks.has_value()) {
    TORCH_CHECK(sinks->numel() == H, "decode_attention: expected one sink per query head (", H, "), got ",
                sinks->numel());
    sink_values = sinks->to(at::kFloat).contiguous();
  }
  const at::Tensor queries = q.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({B, H, Dv}, q.options());
  const int64_t group = H / Hkv;
  const Cache k = cache_of(k_cache), v = cache_of(v_cache);
  const float* qp = queries.const_data_ptr<float>();
  const float* sp = sink_values ? sink_values->const_data_ptr<float>() : nullptr;
  at::parallel_for(0, B * Hkv, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / Hkv, head = t % Hkv;
      const int64_t last = std::max<int64_t>(len_data[b], 1) - 1;
      const int64_t first = sliding_window > 0 ? std::max<int64_t>(0, last - sliding_window + 1) : 0;
      const float* query = qp + (b * H + head * group) * D;
      const int64_t* table = table_data + b * max_blocks;
      const float* sink = sp ? sp + head * group : nullptr;
      const int64_t offset = (b * H + head * group) * Dv;
      if (dtype == at::kFloat) {
        attend<float>(query, group, D, Dv, {k, table, head, block_size}, {v, table, head, block_size}, first, last,
                      scale, softcap, sink, out.mutable_data_ptr<float>() + offset);
      } else {
        attend<c10::BFloat16>(query, group, D, Dv, {k, table, head, block_size}, {v, table, head, block_size}, first,
                              last, scale, softcap, sink, out.mutable_data_ptr<c10::BFloat16>() + offset);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(trnmodels_cpu, m) {
  m.def(
      "decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor context_lens, "
      "float scale, int sliding_window, float softcap, Tensor? sinks) -> Tensor");
}

TORCH_LIBRARY_IMPL(trnmodels_cpu, CPU, m) { m.impl("decode_attention", decode_attention); }
