// specframe's CPU kernels for verification calls: row-invariant, weight-stationary linear and attention.
//
// Registered as torch.library operators (specframe_kernels::linear, specframe_kernels::attention), so eager
// code and compiled graphs call the same kernels. One build holds a portable path and the SIMD variants of
// simd.inc (AVX2+FMA, +AVX-VNNI, AVX-512, +AVX-512 VNNI); the best one the CPU supports is picked at load
// (and can be lowered with set_level for tests). Every path keeps one rule: an output element is reduced in
// an order fixed by the shapes of the weights and keys alone, never by the number of rows in the call.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>
#include <atomic>
#include <thread>

namespace {

constexpr int FORMAT_F32 = 0, FORMAT_BF16 = 1, FORMAT_Q8_0 = 2, FORMAT_Q4_0 = 3, FORMAT_Q4_1 = 4;
constexpr int64_t BLOCK_BYTES[] = {0, 0, 34, 18, 20};
constexpr int64_t MAX_HEAD_DIM = 512;
// Interleaved formats (see simd.inc): the block format's code plus PACKED, in groups of the variant's lanes.
constexpr int PACKED = 8;  // attention keeps a head's output in registers/stack of MAX_HEAD_DIM

inline float scalar(float v) { return v; }
inline float scalar(uint16_t bits) {  // bfloat16 bits to float32 (exact)
  uint32_t wide = uint32_t(bits) << 16;
  float out;
  std::memcpy(&out, &wide, 4);
  return out;
}
inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline float half_to_float(uint16_t bits) { return static_cast<float>(c10::Half(bits, c10::Half::from_bits())); }

// ---- rows shared by the operators and the team path of decode_layers (one code, so one rounding) -----------
// RMSNorm of a float32 row: the sum of squares in index order, then weight * (x / rms).
inline void norm_row(const float* row, const float* w, int64_t H, float eps, float* o) {
  float squares = 0.0f;
  for (int64_t h = 0; h < H; ++h) squares += row[h] * row[h];
  const float inverse = 1.0f / std::sqrt(squares / (float)H + eps);
  for (int64_t h = 0; h < H; ++h) o[h] = w[h] * (row[h] * inverse);
}

// A float rounded to bfloat16 (to nearest even, as torch rounds) and back: what storing it in a bfloat16 tensor
// keeps.
inline float to_bf16(float v) { return float(c10::BFloat16(v)); }

// RMSNorm of a row of bfloat16 values (held as floats), rounded as the bfloat16 operator rounds: the
// normalised row, then its product with the weight.
inline void norm_row_bf16(const float* row, const float* w, int64_t H, float eps, float* o) {
  float squares = 0.0f;
  for (int64_t h = 0; h < H; ++h) squares += row[h] * row[h];
  const float inverse = 1.0f / std::sqrt(squares / (float)H + eps);
  for (int64_t h = 0; h < H; ++h) o[h] = to_bf16(w[h] * to_bf16(row[h] * inverse));
}

// RoPE of one head's row: x cos + rotate_half(x) sin, a multiply, a multiply and an add per element.
inline void rope_row(const float* row, const float* cr, const float* sr, int64_t D, float* o) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < D; ++i) {
    const float turned = i < half ? row[i + half] : row[i - half];
    const float a = row[i] * cr[i], b = turned * sr[i];
    o[i] = a + b;
  }
}

// ---- the portable path: plain C++, the same reduction order at every row count -----------------------------
namespace portable {

template <typename W>
void dense(const float* x, int64_t M, int64_t K, const W* w, int64_t N, float* out, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s += x[m * K + k] * scalar(w[n * K + k]);
      out[m * N + n] = s;
    }
}

void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* s) {
  const int64_t blocks = K / 32;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + m * K + b * 32;
      float top = 0.0f;
      for (int i = 0; i < 32; ++i) top = std::fmax(top, std::fabs(xb[i]));
      const float inverse = top > 0.0f ? 127.0f / top : 0.0f;
      d[m * blocks + b] = top / 127.0f;
      int32_t total = 0;
      for (int i = 0; i < 32; ++i) {
        const int32_t code = (int32_t)std::nearbyint(xb[i] * inverse);
        q[m * K + b * 32 + i] = (int8_t)code;
        total += code;
      }
      s[m * blocks + b] = (top / 127.0f) * (float)total;
    }
}

void quant_linear(int format, const int8_t* qx, const float* dx, const float* dsx, int64_t M, int64_t K,
                  const uint8_t* w, int64_t row_bytes, int64_t N, float* out, int64_t n0, int64_t n1) {
  const int64_t blocks = K / 32;
  std::vector<int8_t> codes(K);
  std::vector<float> scale(blocks), minimum(blocks);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* block = row + b * BLOCK_BYTES[format];
      scale[b] = half_to_float(load_u16(block));
      if (format == FORMAT_Q8_0) {
        std::memcpy(codes.data() + b * 32, block + 2, 32);
        continue;
      }
      const uint8_t* packed = block + (format == FORMAT_Q4_0 ? 2 : 4);
      if (format == FORMAT_Q4_1) minimum[b] = half_to_float(load_u16(block + 2));
      if (format == FORMAT_Q4_0) minimum[b] = -8.0f * scale[b];  // codes - 8 as codes with a minimum
      for (int i = 0; i < 16; ++i) {
        codes[b * 32 + i] = (int8_t)(packed[i] & 0x0f);
        codes[b * 32 + 16 + i] = (int8_t)(packed[i] >> 4);
      }
    }
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.0f, low = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t dot = 0;
        for (int i = 0; i < 32; ++i) dot += int32_t(codes[b * 32 + i]) * int32_t(qx[m * K + b * 32 + i]);
        const float db = dx[m * blocks + b];
        acc += (float)dot * (scale[b] * db);
        if (format != FORMAT_Q8_0) low += minimum[b] * dsx[m * blocks + b];
      }
      out[m * N + n] = acc + low;
    }
  }
}

template <typename T>
void attend(const float* q, int64_t /*R*/, int64_t H, int64_t D, const T* keys, const T* values, int64_t key_stride,
            const int64_t* rows, int64_t kv_heads, const bool* visible, int64_t span, float softmax_scale, float* out,
            int64_t task0, int64_t task1) {
  const int64_t group = H / kv_heads;
  std::vector<float> scores(span), acc(D);
  for (int64_t task = task0; task < task1; ++task) {
    const int64_t r = task / H, h = task % H, g = h / group;
    const float* qv = q + task * D;
    const bool* seen = visible + r * span;
    float top = -INFINITY;
    for (int64_t j = 0; j < span; ++j) {
      if (!seen[j]) continue;
      const T* kj = keys + (rows ? rows[j] : j) * key_stride + g * D;
      float s = 0.0f;
      for (int64_t k = 0; k < D; ++k) s += qv[k] * scalar(kj[k]);
      scores[j] = s * softmax_scale;
      top = scores[j] > top ? scores[j] : top;
    }
    float total = 0.0f;
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t j = 0; j < span; ++j) {
      if (!seen[j]) continue;
      const float p = std::exp(scores[j] - top);
      total += p;
      const T* vj = values + (rows ? rows[j] : j) * key_stride + g * D;
      for (int64_t k = 0; k < D; ++k) acc[k] += p * scalar(vj[k]);
    }
    const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
    for (int64_t k = 0; k < D; ++k) out[task * D + k] = acc[k] * inverse;
  }
}

void silu_mul_rows(const float* g, int64_t R, int64_t I, float* out) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < I; ++i) {
      const float x = g[r * 2 * I + i];
      out[r * I + i] = x / (1.0f + std::exp(-x)) * g[r * 2 * I + I + i];
    }
}

}  // namespace portable

}  // namespace

// ---- the SIMD variants ---------------------------------------------------------------------------------------
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
#define SF_BF16 0
#define SF_WIDE 0
#define SF_VNNI 0
#include "simd.inc"
#undef SF_WIDE
#undef SF_VNNI
#undef SF_BF16
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
namespace avxvnni {
#define SF_BF16 0
#define SF_WIDE 0
#define SF_VNNI 2
#include "simd.inc"
#undef SF_WIDE
#undef SF_VNNI
#undef SF_BF16
}  // namespace avxvnni
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
namespace avx512 {
#define SF_BF16 0
#define SF_WIDE 1
#define SF_VNNI 0
#include "simd.inc"
#undef SF_WIDE
#undef SF_VNNI
#undef SF_BF16
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16")
namespace avx512bf16 {
#define SF_BF16 1
#define SF_WIDE 1
#define SF_VNNI 1
#include "simd.inc"
#undef SF_WIDE
#undef SF_VNNI
#undef SF_BF16
}  // namespace avx512bf16
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
namespace avx512vnni {
#define SF_BF16 0
#define SF_WIDE 1
#define SF_VNNI 1
#include "simd.inc"
#undef SF_WIDE
#undef SF_VNNI
#undef SF_BF16
}  // namespace avx512vnni
#pragma GCC pop_options

namespace {

struct Variant {
  const char* name;
  void (*dense_f32)(const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, int64_t);
  void (*dense_bf16)(const float*, int64_t, int64_t, const uint16_t*, int64_t, float*, int64_t, int64_t);
  void (*quantize_rows)(const float*, int64_t, int64_t, int8_t*, float*, float*);
  void (*quant_linear)(int, const int8_t*, const float*, const float*, int64_t, int64_t, const uint8_t*, int64_t,
                       int64_t, float*, int64_t, int64_t);
  void (*grouped_linear)(int, const int8_t*, const float*, const float*, int64_t, int64_t, const uint8_t*, int64_t,
                         float*, int64_t, int64_t);
  int64_t group_rows;  // weight rows per group of the interleaved formats (0: the variant has none)
  void (*silu_mul_rows)(const float*, int64_t, int64_t, float*);
  void (*attend_f32)(const float*, int64_t, int64_t, int64_t, const float*, const float*, int64_t, const int64_t*, int64_t,
                     const bool*, int64_t, float, float*, int64_t, int64_t);
  void (*attend_bf16)(const float*, int64_t, int64_t, int64_t, const uint16_t*, const uint16_t*, int64_t, const int64_t*,
                      int64_t, const bool*, int64_t, float, float*, int64_t, int64_t);
};

#define SF_VARIANT(ns, label)                                                                                \
  Variant {                                                                                                          \
    label, ns::dense_f32, ns::dense_bf16, ns::quantize_rows, ns::quant_linear, ns::grouped_linear, ns::LANES,      \
        ns::silu_mul_rows, ns::attend_f32, ns::attend_bf16                                                         \
  }

const Variant VARIANTS[] = {
    {"portable", portable::dense<float>, portable::dense<uint16_t>, portable::quantize_rows, portable::quant_linear,
     nullptr, 0, portable::silu_mul_rows, portable::attend<float>, portable::attend<uint16_t>},
    SF_VARIANT(avx2, "avx2"),
    SF_VARIANT(avxvnni, "avx2+avxvnni"),
    SF_VARIANT(avx512, "avx512"),
    SF_VARIANT(avx512vnni, "avx512+vnni"),
    SF_VARIANT(avx512bf16, "avx512+vnni+bf16"),
};

// The variants this CPU (and its OS, which must save the wide registers) can run, best last.
std::vector<int> supported() {
  __builtin_cpu_init();
  std::vector<int> out{0};
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!avx2) return out;
  out.push_back(1);
  if (__builtin_cpu_supports("avxvnni")) out.push_back(2);
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (avx512) {
    out.push_back(3);
    if (__builtin_cpu_supports("avx512vnni")) {
      out.push_back(4);
      if (__builtin_cpu_supports("avx512bf16")) out.push_back(5);
    }
  }
  return out;
}

int g_variant = supported().back();

const Variant& variant() { return VARIANTS[g_variant]; }

int64_t grain(int64_t work_per_item) { return std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, work_per_item)); }

at::Tensor as_f32_rows(const at::Tensor& x) { return x.to(at::kFloat).contiguous(); }

// Activation rows quantized for the block formats: int8 codes per block of 32, each block's scale d, and d x
// (the sum of its codes), each row from its own values alone.
struct QuantizedRows {
  std::vector<int8_t> codes;
  std::vector<float> scale, scaled_sum;
  QuantizedRows(const Variant& v, const float* x, int64_t M, int64_t K)
      : codes(M * K), scale(M * (K / 32)), scaled_sum(M * (K / 32)) {
    v.quantize_rows(x, M, K, codes.data(), scale.data(), scaled_sum.data());
  }
};

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, int64_t format, int64_t out_features) {
  TORCH_CHECK(x.dim() == 2, "specframe_kernels::linear: x must be [rows, in], got ", x.sizes());
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "specframe_kernels::linear runs on the CPU");
  TORCH_CHECK((format >= FORMAT_F32 && format <= FORMAT_Q4_1) ||
                  (format >= PACKED + FORMAT_Q8_0 && format <= PACKED + FORMAT_Q4_1),
              "specframe_kernels::linear: unknown format ", format);
  TORCH_CHECK(weight.is_contiguous(), "specframe_kernels::linear: the weight must be contiguous");
  const int64_t M = x.size(0), K = x.size(1), N = out_features;
  TORCH_CHECK(weight.dim() == 2, "specframe_kernels::linear: the weight must be 2-d, got ", weight.sizes());
  TORCH_CHECK(format > FORMAT_Q4_1 || weight.size(0) == N, "specframe_kernels::linear: weight has ", weight.size(0),
              " rows, expected ", N);
  const at::Tensor xf = as_f32_rows(x);
  at::Tensor out = at::empty({M, N}, x.options().dtype(at::kFloat));
  const float* xp = xf.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const Variant& v = variant();
  if (M == 0) return out.to(x.scalar_type());
  if (format == FORMAT_F32 || format == FORMAT_BF16) {
    TORCH_CHECK(weight.size(1) == K, "specframe_kernels::linear: weight has ", weight.size(1), " columns, x has ", K);
    TORCH_CHECK(weight.scalar_type() == (format == FORMAT_F32 ? at::kFloat : at::kBFloat16),
                "specframe_kernels::linear: weight dtype ", weight.scalar_type(), " does not match its format");
    const int64_t blocks = (N + 3) / 4;
    at::parallel_for(0, blocks, grain(4 * M * K), [&](int64_t b0, int64_t b1) {
      const int64_t n0 = b0 * 4, n1 = std::min(N, b1 * 4);
      if (format == FORMAT_F32)
        v.dense_f32(xp, M, K, weight.data_ptr<float>(), N, op, n0, n1);
      else
        v.dense_bf16(xp, M, K, reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>()), N, op, n0, n1);
    });
  } else if (format > FORMAT_Q4_1) {
    const int block = (int)format - PACKED;
    const int64_t G = v.group_rows;
    TORCH_CHECK(G > 0, "specframe_kernels::linear: weights interleaved for SIMD kernels cannot run on the '", v.name,
                "' kernels; load the model again after select_variant");
    TORCH_CHECK(K % 32 == 0 && weight.scalar_type() == at::kByte, "specframe_kernels::linear: interleaved weights "
                "need in_features % 32 == 0 and uint8 data");
    const int64_t blocks = K / 32, groups = (N + G - 1) / G;
    TORCH_CHECK(weight.size(0) == groups && weight.size(1) == blocks * G * BLOCK_BYTES[block],
                "specframe_kernels::linear: interleaved weight is ", weight.sizes(), ", expected [", groups, ", ",
                blocks * G * BLOCK_BYTES[block], "] for ", N, "x", K, " in groups of ", G, " rows (the '", v.name,
                "' kernels); load the model again after select_variant");
    const QuantizedRows q(v, xp, M, K);
    const uint8_t* wp = weight.data_ptr<uint8_t>();
    at::parallel_for(0, groups, grain(G * M * K / 4), [&](int64_t g0, int64_t g1) {
      v.grouped_linear(block, q.codes.data(), q.scale.data(), q.scaled_sum.data(), M, K, wp, N, op, g0, g1);
    });
  } else {
    TORCH_CHECK(K % 32 == 0, "specframe_kernels::linear: block-quantized weights need in_features % 32 == 0, got ", K);
    TORCH_CHECK(weight.scalar_type() == at::kByte, "specframe_kernels::linear: quantized weights are uint8 blocks");
    const int64_t row_bytes = K / 32 * BLOCK_BYTES[format];
    TORCH_CHECK(weight.size(1) == row_bytes, "specframe_kernels::linear: weight rows hold ", weight.size(1),
                " bytes, expected ", row_bytes, " for ", K, " inputs");
    const QuantizedRows q(v, xp, M, K);
    const int64_t groups = (N + 3) / 4;
    const uint8_t* wp = weight.data_ptr<uint8_t>();
    at::parallel_for(0, groups, grain(4 * M * K / 4), [&](int64_t b0, int64_t b1) {
      v.quant_linear((int)format, q.codes.data(), q.scale.data(), q.scaled_sum.data(), M, K, wp, row_bytes, N, op,
                     b0 * 4, std::min(N, b1 * 4));
    });
  }
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& visible,
                     double softmax_scale, const c10::optional<at::Tensor>& rows) {
  TORCH_CHECK(q.dim() == 3, "specframe_kernels::attention: q must be [rows, heads, dim], got ", q.sizes());
  TORCH_CHECK(keys.dim() == 3 && values.sizes() == keys.sizes(), "specframe_kernels::attention: keys and values must be "
              "[rows, kv_heads, dim] alike, got ", keys.sizes(), " and ", values.sizes());
  TORCH_CHECK(visible.dim() == 2 && visible.size(0) == q.size(0) && visible.scalar_type() == at::kBool,
              "specframe_kernels::attention: visible must be a [rows, span] bool mask");
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2), KV = keys.size(1), span = visible.size(1);
  TORCH_CHECK(D <= MAX_HEAD_DIM, "specframe_kernels::attention: head size ", D, " is over ", MAX_HEAD_DIM);
  TORCH_CHECK((rows.has_value() || keys.size(0) >= span) && keys.size(2) == D && H % KV == 0,
              "specframe_kernels::attention: keys ", keys.sizes(), " do not fit q ", q.sizes(), " and span ", span);
  at::Tensor row_map;  // key j's row in keys/values (a paged cache); absent: row j
  if (rows.has_value()) {
    row_map = rows->contiguous();
    TORCH_CHECK(row_map.dim() == 1 && row_map.size(0) == span && row_map.scalar_type() == at::kLong,
                "specframe_kernels::attention: rows must be an int64 [span] row map, got ", row_map.sizes());
    const int64_t* map = row_map.data_ptr<int64_t>();
    for (int64_t j = 0; j < span; ++j)
      TORCH_CHECK(map[j] >= 0 && map[j] < keys.size(0), "specframe_kernels::attention: rows point outside the ",
                  keys.size(0), " rows of keys");
  }
  const int64_t* row_ptr = rows.has_value() ? row_map.data_ptr<int64_t>() : nullptr;
  TORCH_CHECK(keys.stride(2) == 1 && keys.stride(1) == D && values.stride(2) == 1 && values.stride(1) == D &&
                  values.stride(0) == keys.stride(0),
              "specframe_kernels::attention: keys and values must be row-strided [rows, kv_heads, dim] views");
  TORCH_CHECK(keys.scalar_type() == values.scalar_type() &&
                  (keys.scalar_type() == at::kFloat || keys.scalar_type() == at::kBFloat16),
              "specframe_kernels::attention: keys and values must be float32 or bfloat16");
  const at::Tensor qf = as_f32_rows(q);
  const at::Tensor seen = visible.contiguous();
  at::Tensor out = at::empty({R, H, D}, q.options().dtype(at::kFloat));
  const Variant& v = variant();
  const float scale = (float)softmax_scale;
  at::parallel_for(0, R * H, grain(span * D * 2), [&](int64_t t0, int64_t t1) {
    if (keys.scalar_type() == at::kFloat)
      v.attend_f32(qf.data_ptr<float>(), R, H, D, keys.data_ptr<float>(), values.data_ptr<float>(), keys.stride(0),
                   row_ptr, KV,
                   seen.data_ptr<bool>(), span, scale, out.data_ptr<float>(), t0, t1);
    else
      v.attend_bf16(qf.data_ptr<float>(), R, H, D, reinterpret_cast<const uint16_t*>(keys.data_ptr<at::BFloat16>()),
                    reinterpret_cast<const uint16_t*>(values.data_ptr<at::BFloat16>()), keys.stride(0), row_ptr, KV,
                    seen.data_ptr<bool>(), span, scale, out.data_ptr<float>(), t0, t1);
  });
  out = out.view({R, H * D});
  return q.scalar_type() == at::kFloat ? out : out.to(q.scalar_type());
}

// A proposal-only adapter on a projection: rows marked in `rows` get projected + scale * (x A^T) B^T, the
// others are returned as they are (bit for bit). The two small products run through the dense kernel (each
// row alone), all in one call: an adapter used to cost five small operator calls per layer.
at::Tensor adapt(const at::Tensor& projected, const at::Tensor& x, const at::Tensor& a, const at::Tensor& b,
                 double scale, const at::Tensor& rows) {
  TORCH_CHECK(projected.dim() == 2 && x.dim() == 2 && a.dim() == 2 && b.dim() == 2 && rows.dim() == 1,
              "specframe_kernels::adapt: projected [rows, out], x [rows, in], a [rank, in], b [out, rank] and "
              "rows [rows] expected");
  const int64_t R = x.size(0), K = x.size(1), rank = a.size(0), N = b.size(0);
  TORCH_CHECK(projected.size(0) == R && projected.size(1) == N && a.size(1) == K && b.size(1) == rank &&
                  rows.size(0) == R && rows.scalar_type() == at::kBool,
              "specframe_kernels::adapt: shapes do not fit: projected ", projected.sizes(), ", x ", x.sizes(), ", a ",
              a.sizes(), ", b ", b.sizes(), ", rows ", rows.sizes());
  TORCH_CHECK(a.scalar_type() == b.scalar_type() && (a.scalar_type() == at::kFloat || a.scalar_type() == at::kBFloat16),
              "specframe_kernels::adapt: a and b must both be float32 or both bfloat16");
  TORCH_CHECK(projected.scalar_type() == at::kFloat || projected.scalar_type() == at::kBFloat16,
              "specframe_kernels::adapt: projected must be float32 or bfloat16");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "specframe_kernels::adapt: x must be float32 or bfloat16");
  at::Tensor out = projected.contiguous().clone();
  const at::Tensor marked = rows.contiguous();
  std::vector<int64_t> picked;
  for (int64_t r = 0; r < R; ++r)
    if (marked.data_ptr<bool>()[r]) picked.push_back(r);
  if (picked.empty()) return out;
  // The marked rows' two small products run here, on this thread, by the dense kernels' own per-output code
  // (the same bits as specframe_kernels::linear, which only splits the outputs among threads): a parallel
  // region for a [rows, 64] product costs more to open than to run (about 20 us a layer on a 2-core EPYC).
  const int64_t M = (int64_t)picked.size();
  const at::Tensor xc = x.contiguous();
  std::vector<float> xs(M * K), inner(M * rank), update_rows(M * N);
  for (int64_t i = 0; i < M; ++i) {
    float* row = xs.data() + i * K;
    if (xc.scalar_type() == at::kFloat) {
      std::memcpy(row, xc.data_ptr<float>() + picked[i] * K, K * sizeof(float));
    } else {
      const at::BFloat16* from = xc.data_ptr<at::BFloat16>() + picked[i] * K;
      for (int64_t k = 0; k < K; ++k) row[k] = float(from[k]);
    }
  }
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  const Variant& v = variant();
  if (a.scalar_type() == at::kFloat) {
    v.dense_f32(xs.data(), M, K, ac.data_ptr<float>(), rank, inner.data(), 0, rank);
    v.dense_f32(inner.data(), M, rank, bc.data_ptr<float>(), N, update_rows.data(), 0, N);
  } else {
    v.dense_bf16(xs.data(), M, K, reinterpret_cast<const uint16_t*>(ac.data_ptr<at::BFloat16>()), rank, inner.data(),
                 0, rank);
    v.dense_bf16(inner.data(), M, rank, reinterpret_cast<const uint16_t*>(bc.data_ptr<at::BFloat16>()), N,
                 update_rows.data(), 0, N);
  }
  const float* u = update_rows.data();
  const float s = (float)scale;
  for (int64_t i = 0; i < M; ++i) {
    const int64_t r = picked[i];
    if (out.scalar_type() == at::kFloat) {
      float* o = out.data_ptr<float>() + r * N;
      for (int64_t n = 0; n < N; ++n) {
        const float scaled = u[i * N + n] * s;
        o[n] = o[n] + scaled;
      }
    } else {
      at::BFloat16* o = out.data_ptr<at::BFloat16>() + r * N;
      for (int64_t n = 0; n < N; ++n) {
        const float scaled = u[i * N + n] * s;
        o[n] = at::BFloat16(float(o[n]) + scaled);
      }
    }
  }
  return out;
}

// RMSNorm of each row alone (row r with weight row r % groups of a [groups, size] weight: per-head q/k norms): the sum of squares in index order (float32), then weight * (x / rms); bfloat16
// rows are rounded as torch rounds them (the normalised row, then its product with the weight).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && (weight.dim() == 1 || weight.dim() == 2) && weight.size(-1) == x.size(1),
              "specframe_kernels::rms_norm: x must be [rows, size] and weight [size] or [groups, size], got ",
              x.sizes(), " and ", weight.sizes());
  TORCH_CHECK(x.scalar_type() == weight.scalar_type() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "specframe_kernels::rms_norm: x and weight must both be float32 or both bfloat16");
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t R = xc.size(0), H = xc.size(1), groups = weight.dim() == 2 ? weight.size(0) : 1;
  const bool half = x.scalar_type() == at::kBFloat16;
  at::parallel_for(0, R, grain(4 * H), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t g = r % groups;
      if (half) {
        std::vector<float> row(H), w(H), o(H);
        const at::BFloat16* from = xc.data_ptr<at::BFloat16>() + r * H;
        for (int64_t h = 0; h < H; ++h) row[h] = float(from[h]), w[h] = float(wc.data_ptr<at::BFloat16>()[g * H + h]);
        norm_row_bf16(row.data(), w.data(), H, (float)eps, o.data());
        at::BFloat16* to = out.data_ptr<at::BFloat16>() + r * H;
        for (int64_t h = 0; h < H; ++h) to[h] = at::BFloat16(o[h]);
      } else {
        norm_row(xc.data_ptr<float>() + r * H, wc.data_ptr<float>() + g * H, H, (float)eps,
                 out.data_ptr<float>() + r * H);
      }
    }
  });
  return out;
}

// SiLU(gate) x up for [rows, 2I] rows of gate then up: each element alone (see simd.inc).
at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "specframe_kernels::silu_mul: gate_up must be "
              "[rows, 2 * inner], got ", gate_up.sizes());
  const at::Tensor g = as_f32_rows(gate_up);
  const int64_t R = g.size(0), I = g.size(1) / 2;
  at::Tensor out = at::empty({R, I}, g.options());
  const Variant& v = variant();
  at::parallel_for(0, R, grain(4 * I), [&](int64_t r0, int64_t r1) {
    v.silu_mul_rows(g.data_ptr<float>() + r0 * 2 * I, r1 - r0, I, out.data_ptr<float>() + r0 * I);
  });
  return gate_up.scalar_type() == at::kFloat ? out : out.to(gate_up.scalar_type());
}

// Rotary embedding of [rows, heads, dim] by [rows, dim] cos and signed sin: x cos + rotate_half(x) sin, each
// element by a multiply, a multiply and an add (float32 for bfloat16 rows, rounded once).
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 3 && x.size(2) % 2 == 0, "specframe_kernels::rope: x must be [rows, heads, even dim]");
  const int64_t R = x.size(0), H = x.size(1), D = x.size(2);
  TORCH_CHECK(cos.numel() == R * D && sin.numel() == R * D, "specframe_kernels::rope: cos and sin must hold "
              "[rows, dim] values");
  const at::Tensor xf = as_f32_rows(x), c = as_f32_rows(cos.reshape({R, D})), s = as_f32_rows(sin.reshape({R, D}));
  at::Tensor out = at::empty({R, H, D}, xf.options());
  const float *xp = xf.data_ptr<float>(), *cp = c.data_ptr<float>(), *sp = s.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, R * H, grain(4 * D), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) rope_row(xp + t * D, cp + t / H * D, sp + t / H * D, D, op + t * D);
  });
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

// ---- decode_layers' team path: float32 activations, one parallel region for the whole call ----------------
// A projection of a few hundred kilobytes does not pay for a parallel region of its own (on a 2-core EPYC the
// layers' 120 projections of a 1-row call took as long on one thread as on two), so here the threads enter
// once and stay: each owns a fixed share of every projection's outputs (whole 4-output blocks or interleaved
// groups, as `linear` splits them) and of the attention's (row, head) tasks, and they meet at a barrier where a
// stage needs another's outputs. The small row work (RMSNorm, activation quantization, SiLU x up, an adapter's
// rank vector) is done by every thread for all rows, the same code on the same data, so no barrier waits for
// it. Every element goes through the code the single operators run, so the bits are theirs.

// A barrier for a team that runs concurrently (an OpenMP team of at::parallel_for): spin, then yield.
struct SpinBarrier {
  std::atomic<int64_t> arrived{0}, generation{0};
  void wait(int64_t members) {
    if (members == 1) return;
    const int64_t seen = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) == members - 1) {
      arrived.store(0, std::memory_order_relaxed);
      generation.fetch_add(1, std::memory_order_release);
      return;
    }
    for (int spins = 0; generation.load(std::memory_order_acquire) == seen; ++spins) {
      if (spins < 4096)
        _mm_pause();
      else
        std::this_thread::yield();
    }
  }
};

// One projection's weights as `linear` runs them, split among a team by output blocks.
struct TeamProjection {
  const void* data;
  int64_t format, N, K, units, unit;  // units of `unit` outputs: the split `linear` uses
  bool quantized() const { return format >= FORMAT_Q8_0; }
};

TeamProjection team_projection(const at::Tensor& data, int64_t format, int64_t N, int64_t K, const Variant& v) {
  TORCH_CHECK(data.is_contiguous() && data.device().is_cpu(), "specframe_kernels::decode_layers: weights must be "
              "contiguous CPU tensors");
  TeamProjection p{data.data_ptr(), format, N, K, 0, 4};
  if (format == FORMAT_F32 || format == FORMAT_BF16) {
    TORCH_CHECK(data.dim() == 2 && data.size(0) == N && data.size(1) == K &&
                    data.scalar_type() == (format == FORMAT_F32 ? at::kFloat : at::kBFloat16),
                "specframe_kernels::decode_layers: a dense weight is ", data.sizes(), " ", data.scalar_type(),
                ", expected [", N, ", ", K, "] of its format");
  } else if (format > FORMAT_Q4_1) {
    TORCH_CHECK(v.group_rows > 0 && K % 32 == 0 && data.scalar_type() == at::kByte &&
                    data.size(0) == (N + v.group_rows - 1) / v.group_rows &&
                    data.size(1) == K / 32 * v.group_rows * BLOCK_BYTES[format - PACKED],
                "specframe_kernels::decode_layers: an interleaved weight does not fit [", N, ", ", K, "] on the '",
                v.name, "' kernels; load the model again after select_variant");
    p.unit = v.group_rows;
  } else {
    TORCH_CHECK(format >= FORMAT_Q8_0 && format <= FORMAT_Q4_1 && K % 32 == 0 && data.scalar_type() == at::kByte &&
                    data.size(0) == N && data.size(1) == K / 32 * BLOCK_BYTES[format],
                "specframe_kernels::decode_layers: a block-quantized weight does not fit [", N, ", ", K, "]");
  }
  p.units = (N + p.unit - 1) / p.unit;
  return p;
}

// Rows x (float32, [M, K]) prepared once per thread for the projections that read them.
struct TeamInput {
  const float* x = nullptr;
  int64_t M = 0, K = 0;
  std::vector<int8_t> codes;
  std::vector<float> scale, scaled_sum;
  bool quantized = false;
  void set(const Variant& v, const float* rows, int64_t m, int64_t k, bool quantize) {
    x = rows, M = m, K = k, quantized = quantize;
    if (!quantize) return;
    codes.resize(M * K), scale.resize(M * (K / 32)), scaled_sum.resize(M * (K / 32));
    v.quantize_rows(x, M, K, codes.data(), scale.data(), scaled_sum.data());
  }
};

// Outputs of units u0 .. u1 of a projection for every row, into out [M, N].
void project_units(const Variant& v, const TeamProjection& p, const TeamInput& in, float* out, int64_t u0,
                   int64_t u1) {
  if (u0 >= u1) return;
  if (p.format == FORMAT_F32) {
    v.dense_f32(in.x, in.M, in.K, static_cast<const float*>(p.data), p.N, out, u0 * 4, std::min(p.N, u1 * 4));
  } else if (p.format == FORMAT_BF16) {
    v.dense_bf16(in.x, in.M, in.K, static_cast<const uint16_t*>(p.data), p.N, out, u0 * 4, std::min(p.N, u1 * 4));
  } else if (p.format > FORMAT_Q4_1) {
    v.grouped_linear((int)p.format - PACKED, in.codes.data(), in.scale.data(), in.scaled_sum.data(), in.M, in.K,
                     static_cast<const uint8_t*>(p.data), p.N, out, u0, u1);
  } else {
    v.quant_linear((int)p.format, in.codes.data(), in.scale.data(), in.scaled_sum.data(), in.M, in.K,
                   static_cast<const uint8_t*>(p.data), p.K / 32 * BLOCK_BYTES[p.format], p.N, out, u0 * 4,
                   std::min(p.N, u1 * 4));
  }
}

// A proposal-only adapter (A [rank, K], B [N, rank], float32 or bfloat16) on the marked rows, as `adapt` runs it.
struct TeamAdapter {
  const void* a = nullptr;
  const void* b = nullptr;
  bool bf16 = false;
  int64_t rank = 0;
  float scale = 0.0f;
};

TeamAdapter team_adapter(const c10::optional<at::Tensor>& a, const c10::optional<at::Tensor>& b, double scale,
                         int64_t N, int64_t K) {
  TeamAdapter out;
  if (!a.has_value() || !a->defined()) return out;
  TORCH_CHECK(b.has_value() && b->defined() && a->dim() == 2 && b->dim() == 2 && a->size(1) == K &&
                  b->size(0) == N && b->size(1) == a->size(0) && a->is_contiguous() && b->is_contiguous() &&
                  a->scalar_type() == b->scalar_type() &&
                  (a->scalar_type() == at::kFloat || a->scalar_type() == at::kBFloat16),
              "specframe_kernels::decode_layers: an adapter must be contiguous a [rank, ", K, "] and b [", N,
              ", rank], both float32 or both bfloat16");
  out.a = a->data_ptr(), out.b = b->data_ptr(), out.bf16 = a->scalar_type() == at::kBFloat16;
  out.rank = a->size(0), out.scale = (float)scale;
  return out;
}

void dense_any(const Variant& v, bool bf16, const float* x, int64_t M, int64_t K, const void* w, int64_t N, float* out,
               int64_t n0, int64_t n1) {
  if (bf16)
    v.dense_bf16(x, M, K, static_cast<const uint16_t*>(w), N, out, n0, n1);
  else
    v.dense_f32(x, M, K, static_cast<const float*>(w), N, out, n0, n1);
}

struct TeamLayer {
  const float *input_norm, *post_norm, *bias, *qk_norm;  // qk_norm: [heads + kv_heads, dim], or none
  TeamProjection qkv, o, gate_up, down;
  TeamAdapter o_adapter, down_adapter;
};

struct TeamSegment {
  void *keys, *values;  // this request's cache buffers, [layers, capacity, kv, dim], float32 or bfloat16
  int64_t layer_stride, row_stride, first, rows, start, span;
  const int64_t* slots;  // a paged cache's pool rows of the new rows (else rows start ..)
  const int64_t* row_map;
  const bool* visible;
};

// `half`: a bfloat16 model. The activations are then kept as floats but rounded to bfloat16 wherever the
// single operators store a bfloat16 tensor (each projection's output, RoPE, the query scale, attention, the
// adapter's sum, each residual add, SiLU x up), and the caches hold bfloat16.
at::Tensor decode_layers_team(const at::Tensor& input, const std::vector<TeamLayer>& layers,
                              const std::vector<TeamSegment>& segments, const float* cos, const float* sin,
                              const float* query_scale, const bool* marked, int64_t H, int64_t KV, int64_t D,
                              float eps, float softmax_scale, bool half) {
  const Variant& v = variant();
  const int64_t R = input.size(0), hidden = input.size(1), heads = H + 2 * KV;
  const int64_t inner = layers[0].gate_up.N / 2;
  at::Tensor x = input.to(at::kFloat).contiguous().clone();
  float* xp = x.data_ptr<float>();
  const auto round = [half](float value) { return half ? to_bf16(value) : value; };
  const auto norm = half ? norm_row_bf16 : norm_row;
  std::vector<int64_t> picked;  // the adapter's rows
  for (int64_t r = 0; marked && r < R; ++r)
    if (marked[r]) picked.push_back(r);
  const int64_t P = (int64_t)picked.size();
  int64_t widest = hidden;
  for (const auto& l : layers) widest = std::max({widest, l.qkv.N, l.gate_up.N, l.o.N, l.down.N});
  std::vector<float> qkv(R * heads * D), queries(R * H * D), attended(R * H * D), projected(R * widest);
  std::vector<float> down_out(R * hidden);
  std::vector<float> updates(std::max<int64_t>(1, P * widest));
  SpinBarrier barrier;
  std::atomic<int64_t> joined{0}, units{0};
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), 64));
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    // every callback joins before any starts, so that the team's size is known (an OpenMP team runs at once)
    const int64_t me = joined.fetch_add(1, std::memory_order_acq_rel);
    units.fetch_add(t1 - t0, std::memory_order_acq_rel);
    while (units.load(std::memory_order_acquire) < threads) _mm_pause();
    const int64_t team = joined.load(std::memory_order_acquire);
    const auto share = [&](int64_t count) {
      return std::make_pair(count * me / team, count * (me + 1) / team);
    };
    std::vector<float> normed(R * hidden), rows_inner(R * inner), rank_rows, key(D), normed_head(D);
    TeamInput in;
    const auto adapted = [&](const TeamAdapter& adapter, const TeamProjection& p, const float* from, int64_t K,
                             float* output, int64_t n0, int64_t n1) {
      // projected (own outputs) + scale * (x A^T) B^T on the marked rows, as `adapt` computes them
      if (adapter.a == nullptr || P == 0 || n0 >= n1) return;
      std::vector<float> xs(P * K);
      rank_rows.assign(P * adapter.rank, 0.0f);
      for (int64_t i = 0; i < P; ++i) std::memcpy(xs.data() + i * K, from + picked[i] * K, K * sizeof(float));
      dense_any(v, adapter.bf16, xs.data(), P, K, adapter.a, adapter.rank, rank_rows.data(), 0, adapter.rank);
      dense_any(v, adapter.bf16, rank_rows.data(), P, adapter.rank, adapter.b, p.N, updates.data(), n0, n1);
      for (int64_t i = 0; i < P; ++i) {
        float* o = output + picked[i] * p.N;
        for (int64_t n = n0; n < n1; ++n) {
          const float scaled = updates[i * p.N + n] * adapter.scale;
          o[n] = round(o[n] + scaled);
        }
      }
    };
    const auto residual = [&](const TeamProjection& p, const float* output, int64_t u0, int64_t u1) {
      const int64_t n0 = u0 * p.unit, n1 = std::min(p.N, u1 * p.unit);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t n = n0; n < n1; ++n) xp[r * hidden + n] = round(xp[r * hidden + n] + output[r * p.N + n]);
    };
    const auto project = [&](const TeamProjection& p, float* out, int64_t u0, int64_t u1) {
      project_units(v, p, in, out, u0, u1);  // then each output stored as its operator stores it
      if (!half) return;
      const int64_t n0 = u0 * p.unit, n1 = std::min(p.N, u1 * p.unit);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t n = n0; n < n1; ++n) out[r * p.N + n] = to_bf16(out[r * p.N + n]);
    };
    for (size_t index = 0; index < layers.size(); ++index) {
      const TeamLayer& l = layers[index];
      // attention input: every thread normalises all rows (the same bits), then its share of q/k/v
      for (int64_t r = 0; r < R; ++r) norm(xp + r * hidden, l.input_norm, hidden, eps, normed.data() + r * hidden);
      in.set(v, normed.data(), R, hidden, l.qkv.quantized());
      auto [q0, q1] = share(l.qkv.units);
      project(l.qkv, qkv.data(), q0, q1);
      if (l.bias != nullptr)
        for (int64_t r = 0; r < R; ++r)
          for (int64_t n = q0 * l.qkv.unit; n < std::min(l.qkv.N, q1 * l.qkv.unit); ++n)
            qkv[r * l.qkv.N + n] = round(qkv[r * l.qkv.N + n] + l.bias[n]);
      barrier.wait(team);
      // RoPE on q and k, the query scale, the new keys and values into each request's cache
      auto [h0, h1] = share(R * (H + 2 * KV));
      for (int64_t t = h0; t < h1; ++t) {
        const int64_t r = t / heads, head = t % heads;
        const float* row = qkv.data() + (r * heads + head) * D;
        float* rotated = head < H ? queries.data() + (r * H + head) * D : key.data();
        if (head < H + KV) {
          if (l.qk_norm != nullptr) {  // per-head RMSNorm first, stored as its operator stores it
            norm(row, l.qk_norm + head * D, D, eps, normed_head.data());
            row = normed_head.data();
          }
          rope_row(row, cos + r * D, sin + r * D, D, rotated);
          for (int64_t i = 0; half && i < D; ++i) rotated[i] = to_bf16(rotated[i]);
          if (head < H && query_scale != nullptr)
            for (int64_t i = 0; i < D; ++i) rotated[i] = round(rotated[i] * query_scale[r]);
        }
        if (head < H) continue;
        const float* kept = head < H + KV ? rotated : row;
        for (const TeamSegment& seg : segments) {
          if (r < seg.first || r >= seg.first + seg.rows) continue;
          const int64_t slot = seg.slots ? seg.slots[r - seg.first] : seg.start + (r - seg.first);
          const int64_t at = index * seg.layer_stride + slot * seg.row_stride + (head < H + KV ? head - H : head - H - KV) * D;
          void* cache = head < H + KV ? seg.keys : seg.values;
          if (half)
            for (int64_t i = 0; i < D; ++i) static_cast<at::BFloat16*>(cache)[at + i] = at::BFloat16(kept[i]);
          else
            std::memcpy(static_cast<float*>(cache) + at, kept, D * sizeof(float));
        }
      }
      barrier.wait(team);
      for (const TeamSegment& seg : segments) {  // each request's rows over its own cache
        auto [a0, a1] = share(seg.rows * H);
        if (a0 >= a1) continue;
        float* out = attended.data() + seg.first * H * D;
        if (half) {
          const auto* keys = static_cast<const uint16_t*>(seg.keys) + index * seg.layer_stride;
          const auto* values = static_cast<const uint16_t*>(seg.values) + index * seg.layer_stride;
          v.attend_bf16(queries.data() + seg.first * H * D, seg.rows, H, D, keys, values, seg.row_stride, seg.row_map,
                        KV, seg.visible, seg.span, softmax_scale, out, a0, a1);
          const int64_t group = H / KV;  // the task numbering of attend: key/value head, then row, then head
          for (int64_t task = a0; task < a1; ++task) {
            const int64_t g = task / (seg.rows * group), within = task % (seg.rows * group);
            float* o = out + ((within / group) * H + g * group + within % group) * D;
            for (int64_t i = 0; i < D; ++i) o[i] = to_bf16(o[i]);
          }
        } else {
          v.attend_f32(queries.data() + seg.first * H * D, seg.rows, H, D,
                       static_cast<const float*>(seg.keys) + index * seg.layer_stride,
                       static_cast<const float*>(seg.values) + index * seg.layer_stride, seg.row_stride, seg.row_map,
                       KV, seg.visible, seg.span, softmax_scale, out, a0, a1);
        }
      }
      barrier.wait(team);
      // the output projection, its adapter and the residual, each thread on its own outputs
      in.set(v, attended.data(), R, H * D, l.o.quantized());
      auto [o0, o1] = share(l.o.units);
      project(l.o, projected.data(), o0, o1);
      adapted(l.o_adapter, l.o, attended.data(), H * D, projected.data(), o0 * l.o.unit, std::min(l.o.N, o1 * l.o.unit));
      residual(l.o, projected.data(), o0, o1);
      barrier.wait(team);
      for (int64_t r = 0; r < R; ++r) norm(xp + r * hidden, l.post_norm, hidden, eps, normed.data() + r * hidden);
      in.set(v, normed.data(), R, hidden, l.gate_up.quantized());
      auto [g0, g1] = share(l.gate_up.units);
      project(l.gate_up, projected.data(), g0, g1);
      barrier.wait(team);
      v.silu_mul_rows(projected.data(), R, inner, rows_inner.data());
      for (int64_t i = 0; half && i < R * inner; ++i) rows_inner[i] = to_bf16(rows_inner[i]);
      // the down projection writes a buffer of its own, so no thread waits for the others to read gate_up
      in.set(v, rows_inner.data(), R, inner, l.down.quantized());
      auto [d0, d1] = share(l.down.units);
      project(l.down, down_out.data(), d0, d1);
      adapted(l.down_adapter, l.down, rows_inner.data(), inner, down_out.data(), d0 * l.down.unit,
              std::min(l.down.N, d1 * l.down.unit));
      residual(l.down, down_out.data(), d0, d1);
      barrier.wait(team);
    }
  });
  return half ? x.to(at::kBFloat16) : x;
}

// A run of decoder layers over a call's rows by the team path above: each layer the code of the operators above
// in the order the Python step calls them (so the same bits), without a trip through Python and the dispatcher
// for each of the ~15 operators of a layer, and with one parallel region for the whole call.
// Per layer, `weights` holds 12 entries (input norm, post norm, qkv, o, gate_up, down, the qkv bias, the o
// adapter's a and b, the down adapter's a and b, the per-head q/k norm weights [heads + kv_heads, dim]; the
// optional ones undefined when absent), `codes` 8 (format and
// output features of qkv, o, gate_up and down) and `scales` 2 (the adapters' scales). Each request (segment)
// has its own cache buffers ([layers, capacity, kv, dim]), its rows' cache slots (`starts`, or a slot tensor
// for a paged cache), its [rows, span] visible mask and, for a paged cache, its key row map. `query_scale`
// ([rows], Llama 4's position-dependent query scaling) multiplies the queries after RoPE, as the step does.
constexpr int64_t LAYER_TENSORS = 12, LAYER_CODES = 8, LAYER_SCALES = 2;

at::Tensor decode_layers(const at::Tensor& input, const std::vector<c10::optional<at::Tensor>>& weights,
                         at::IntArrayRef codes, at::ArrayRef<double> scales, const at::Tensor& cos, const at::Tensor& sin,
                         at::TensorList keys, at::TensorList values, at::IntArrayRef starts,
                         const std::vector<c10::optional<at::Tensor>>& slots, at::TensorList visible,
                         const std::vector<c10::optional<at::Tensor>>& row_maps, at::IntArrayRef sizes, double eps,
                         double softmax_scale, const c10::optional<at::Tensor>& adapter_rows,
                         const c10::optional<at::Tensor>& query_scale) {
  const int64_t layers = (int64_t)weights.size() / LAYER_TENSORS, segments = (int64_t)keys.size();
  TORCH_CHECK((int64_t)weights.size() == layers * LAYER_TENSORS && (int64_t)codes.size() == layers * LAYER_CODES &&
                  (int64_t)scales.size() == layers * LAYER_SCALES,
              "specframe_kernels::decode_layers: weights, codes and scales must hold 12, 8 and 2 entries a layer");
  TORCH_CHECK((int64_t)values.size() == segments && (int64_t)starts.size() == segments &&
                  (int64_t)slots.size() == segments && (int64_t)visible.size() == segments &&
                  (int64_t)row_maps.size() == segments && segments > 0,
              "specframe_kernels::decode_layers: keys, values, starts, slots, visible and row_maps need one entry a "
              "request");
  TORCH_CHECK(sizes.size() == 3, "specframe_kernels::decode_layers: sizes must be [heads, kv_heads, head_dim]");
  const int64_t H = sizes[0], KV = sizes[1], D = sizes[2], R = input.size(0);
  std::vector<int64_t> first(segments + 1, 0);
  for (int64_t s = 0; s < segments; ++s) first[s + 1] = first[s] + visible[s].size(0);
  TORCH_CHECK(first[segments] == R, "specframe_kernels::decode_layers: the requests' masks hold ", first[segments],
              " rows, the call ", R);
  const auto tensor = [&](int64_t layer, int64_t item) -> const c10::optional<at::Tensor>& {
    return weights[layer * LAYER_TENSORS + item];
  };
  // float32 or bfloat16 models whose tensors all share the activations' dtype (the step builds the program for
  // no other; where single operators would promote a mixed pair, the step's own loop runs them)
  const at::ScalarType type = input.scalar_type();
  const auto alike = [type](const at::Tensor& t) { return t.scalar_type() == type; };
  bool same = (type == at::kFloat || type == at::kBFloat16) && input.dim() == 2 && layers > 0 && alike(cos) &&
              alike(sin) && (!query_scale.has_value() || !query_scale->defined() || alike(*query_scale));
  for (int64_t s = 0; s < segments; ++s) same = same && alike(keys[s]) && alike(values[s]);
  for (int64_t layer = 0; layer < layers; ++layer)
    for (int64_t item : {0, 1, 6, 11}) {
      const auto& t = tensor(layer, item);
      same = same && (!t.has_value() || !t->defined() || alike(*t));
    }
  TORCH_CHECK(same, "specframe_kernels::decode_layers: x must be [rows, hidden] float32 or bfloat16, and the "
              "norms, biases, rotary tables, query scales and caches of its dtype");
  {  // one parallel region for the whole call
    const Variant& v = variant();
    std::vector<at::Tensor> held;  // contiguous copies the team reads through raw pointers
    // an int64 list of `count` cache rows, each below `capacity`, held for the team
    const auto cache_rows = [&](const at::Tensor& rows, int64_t count, int64_t capacity, const char* what) {
      held.push_back(rows.contiguous());
      const at::Tensor& list = held.back();
      TORCH_CHECK(list.scalar_type() == at::kLong && list.numel() == count, "specframe_kernels::decode_layers: a "
                  "request's ", what, " must be int64 [", count, "]");
      const int64_t* at = list.data_ptr<int64_t>();
      for (int64_t i = 0; i < count; ++i)
        TORCH_CHECK(at[i] >= 0 && at[i] < capacity, "specframe_kernels::decode_layers: a request's ", what,
                    " points outside its cache of ", capacity, " rows");
      return at;
    };
    const auto floats = [&](const at::Tensor& t) {
      held.push_back(t.to(at::kFloat).contiguous());
      return held.back().data_ptr<float>();
    };
    const int64_t hidden = input.size(1);
    std::vector<TeamLayer> plan;
    for (int64_t layer = 0; layer < layers; ++layer) {
      const int64_t* c = codes.data() + layer * LAYER_CODES;
      TeamLayer l;
      l.input_norm = floats(*tensor(layer, 0));
      l.post_norm = floats(*tensor(layer, 1));
      const auto& bias = tensor(layer, 6);
      l.bias = bias.has_value() && bias->defined() ? floats(*bias) : nullptr;
      const auto& qk_norm = tensor(layer, 11);
      l.qk_norm = nullptr;
      if (qk_norm.has_value() && qk_norm->defined()) {
        TORCH_CHECK(qk_norm->numel() == (H + KV) * D, "specframe_kernels::decode_layers: layer ", layer, "'s q/k norm "
                    "weights must be [", H + KV, ", ", D, "]");
        l.qk_norm = floats(*qk_norm);
      }
      l.qkv = team_projection(*tensor(layer, 2), c[0], c[1], hidden, v);
      l.o = team_projection(*tensor(layer, 3), c[2], c[3], H * D, v);
      l.gate_up = team_projection(*tensor(layer, 4), c[4], c[5], hidden, v);
      l.down = team_projection(*tensor(layer, 5), c[6], c[7], c[5] / 2, v);
      TORCH_CHECK(l.qkv.N == (H + 2 * KV) * D && l.o.N == hidden && l.down.N == hidden && c[5] % 2 == 0 &&
                      tensor(layer, 0)->numel() == hidden && tensor(layer, 1)->numel() == hidden &&
                      (l.bias == nullptr || bias->numel() == l.qkv.N),
                  "specframe_kernels::decode_layers: layer ", layer, "'s projections do not fit ", H, " heads, ", KV,
                  " kv heads of ", D, " and hidden size ", hidden);
      l.o_adapter = team_adapter(tensor(layer, 7), tensor(layer, 8),
                                 scales[layer * LAYER_SCALES], l.o.N, l.o.K);
      l.down_adapter = team_adapter(tensor(layer, 9), tensor(layer, 10), scales[layer * LAYER_SCALES + 1], l.down.N,
                                    l.down.K);
      plan.push_back(l);
    }
    std::vector<TeamSegment> parts;
    for (int64_t s = 0; s < segments; ++s) {
      const at::Tensor& k = keys[s];
      TORCH_CHECK(k.dim() == 4 && values[s].sizes() == k.sizes() && values[s].strides() == k.strides() &&
                      k.size(0) >= layers && k.size(2) == KV && k.size(3) == D && k.stride(3) == 1 && k.stride(2) == D,
                  "specframe_kernels::decode_layers: a request's keys and values must be alike [layers, rows, ", KV,
                  ", ", D, "] buffers, got ", k.sizes());
      const at::Tensor seen = visible[s].contiguous();
      held.push_back(seen);
      TORCH_CHECK(seen.dim() == 2 && seen.scalar_type() == at::kBool, "specframe_kernels::decode_layers: visible ",
                  "masks must be [rows, span] bool");
      TeamSegment part{k.data_ptr(), values[s].data_ptr(), k.stride(0), k.stride(1), first[s],
                       seen.size(0), starts[s], seen.size(1), nullptr, nullptr, seen.data_ptr<bool>()};
      if (slots[s].has_value() && slots[s]->defined()) {
        part.slots = cache_rows(*slots[s], part.rows, k.size(1), "slots (one per new row)");
      } else {
        TORCH_CHECK(part.start >= 0 && part.start + part.rows <= k.size(1), "specframe_kernels::decode_layers: the "
                    "new rows do not fit the cache");
      }
      if (row_maps[s].has_value() && row_maps[s]->defined()) {
        part.row_map = cache_rows(*row_maps[s], part.span, k.size(1), "row map (one per key)");
      } else {
        TORCH_CHECK(part.span <= k.size(1), "specframe_kernels::decode_layers: the mask spans more rows than the cache");
      }
      parts.push_back(part);
    }
    const bool* marked = nullptr;
    if (adapter_rows.has_value() && adapter_rows->defined()) {
      held.push_back(adapter_rows->contiguous());
      TORCH_CHECK(held.back().scalar_type() == at::kBool && held.back().numel() == R,
                  "specframe_kernels::decode_layers: adapter_rows must be bool [rows]");
      marked = held.back().data_ptr<bool>();
    }
    const float* scaled = nullptr;
    if (query_scale.has_value() && query_scale->defined()) {
      TORCH_CHECK(query_scale->numel() == R, "specframe_kernels::decode_layers: query_scale must be [rows]");
      scaled = floats(*query_scale);
    }
    TORCH_CHECK(cos.numel() == R * D && sin.numel() == R * D, "specframe_kernels::decode_layers: cos and sin must "
                "hold [rows, dim] values");
    return decode_layers_team(input, plan, parts, floats(cos), floats(sin), scaled, marked, H, KV, D, (float)eps,
                              (float)softmax_scale, type == at::kBFloat16);
  }
}

std::vector<std::string> variant_names() {
  std::vector<std::string> out;
  for (int index : supported()) out.emplace_back(VARIANTS[index].name);
  return out;
}

std::string current_variant() { return variant().name; }

int64_t variant_group_rows() { return variant().group_rows; }

void select_variant(const std::string& name) {
  for (int index : supported())
    if (name == VARIANTS[index].name) {
      g_variant = index;
      return;
    }
  TORCH_CHECK(false, "specframe_kernels: this CPU cannot run the '", name, "' kernels");
}

}  // namespace

TORCH_LIBRARY(specframe_kernels, m) {
  m.def("linear(Tensor x, Tensor weight, int format, int out_features) -> Tensor");
  m.def("attention(Tensor q, Tensor keys, Tensor values, Tensor visible, float scale, Tensor? rows=None) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("rope(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  m.def("adapt(Tensor projected, Tensor x, Tensor a, Tensor b, float scale, Tensor rows) -> Tensor");
  m.def("decode_layers(Tensor x, Tensor?[] weights, int[] codes, float[] scales, Tensor cos, Tensor sin, "
        "Tensor(a!)[] keys, Tensor(b!)[] values, int[] starts, Tensor?[] slots, Tensor[] visible, Tensor?[] row_maps, "
        "int[] sizes, float eps, float softmax_scale, Tensor? adapter_rows, Tensor? query_scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(specframe_kernels, CPU, m) {
  m.impl("linear", &linear);
  m.impl("attention", &attention);
  m.impl("rms_norm", &rms_norm);
  m.impl("silu_mul", &silu_mul);
  m.impl("rope", &rope);
  m.impl("adapt", &adapt);
  m.impl("decode_layers", &decode_layers);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("variants", &variant_names, "The kernel variants this CPU can run, best last.");
  module.def("variant", &current_variant, "The variant in use.");
  module.def("select_variant", &select_variant, "Use another variant this CPU can run (tests compare them).");
  module.def("group_rows", &variant_group_rows,
             "Weight rows per group of the interleaved block formats the variant in use runs (0: none).");
}
