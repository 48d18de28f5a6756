// Tests only: the kernels of abft_cuda_kernels.h run on the host, one
// block and one thread after another, with the same operations in the same
// order as abft_cuda_kernels.cu (explicitly rounded adds and multiplies
// there, -ffp-contract=off here), so abft_cuda.cc's plan (its passes,
// offsets, weights and strides) is tested on machines without a GPU.
// "Device memory" is host memory; streams are ignored.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/abft_cuda_kernels.h"
#include "kernels/half_float.h"

namespace sdc::kernels::abft_cuda_impl {
namespace {

constexpr int kTile = 32;
constexpr int kRowThreads = 8;
constexpr int kFinishThreads = 256;

double Load(const void* base, int64_t at, uint32_t dtype) {
  if (dtype == 2 || dtype == 3) {  // fp16, bf16
    uint16_t h;
    std::memcpy(&h, static_cast<const unsigned char*>(base) + 2 * at, 2);
    return dtype == 2 ? HalfToFloat(h) : BitsToFloat(static_cast<uint32_t>(h) << 16);
  }
  float f;
  std::memcpy(&f, static_cast<const unsigned char*>(base) + 4 * at, 4);
  return f;
}

double LineValue(const ExtraLine& e, int64_t b, int64_t i) {
  if (e.kind == ExtraLine::kOnes) return 1.0;
  return Load(e.data, b * e.batch_stride + i * e.stride, e.dtype);
}

double Element(const Matrix& m, int64_t b, int64_t r, int64_t c) {
  if (r < m.rows && c < m.cols) {
    return Load(m.data, b * m.batch_stride + r * m.row_stride + c * m.col_stride, m.dtype);
  }
  if (c == m.cols && r < m.rows && m.extra_col.kind != ExtraLine::kNone) {
    return LineValue(m.extra_col, b, r);
  }
  if (r == m.rows && c < m.cols && m.extra_row.kind != ExtraLine::kNone) {
    return LineValue(m.extra_row, b, c);
  }
  return 0.0;
}

double Weight(const Weights& w, int a, int64_t b, int64_t r) {
  return w.w[a] == nullptr ? 1.0 : w.w[a][b * w.batch_stride + r];
}

struct Worst {
  double ratio;
  double discrepancy;
  double threshold;
  double reference;
  int64_t index;
};

bool Worse(const Worst& x, const Worst& y) {
  if (y.index < 0) return x.index >= 0;
  if (x.index < 0) return false;
  if (x.ratio > y.ratio) return true;
  if (x.ratio < y.ratio || x.ratio != x.ratio) return false;
  if (y.ratio != y.ratio) return true;
  return x.index < y.index;
}

// BlockWorst's tree over kFinishThreads candidates.
Worst TreeWorst(std::vector<Worst> v) {
  for (int half = kFinishThreads / 2; half > 0; half /= 2) {
    for (int t = 0; t < half; ++t) {
      if (Worse(v[t + half], v[t])) v[t] = v[t + half];
    }
  }
  return v[0];
}

}  // namespace

int LaunchColumnStats(const Matrix& m, int64_t batch, const Weights& w, uint32_t slots,
                      int64_t chunk_rows, int64_t chunks, double* out, void*) {
  const int64_t rows = m.rows + (m.extra_row.kind != ExtraLine::kNone ? 1 : 0);
  const int64_t cols = m.cols + (m.extra_col.kind != ExtraLine::kNone ? 1 : 0);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t first = chunk * chunk_rows;
      const int64_t last = first + chunk_rows < rows ? first + chunk_rows : rows;
      for (int64_t col = 0; col < cols; ++col) {
        double acc[kRowThreads][kSlots] = {};
        for (int64_t r0 = first; r0 < last; r0 += kTile) {
          for (int ty = 0; ty < kRowThreads; ++ty) {
            for (int k = ty; k < kTile; k += kRowThreads) {
              const int64_t r = r0 + k;
              if (r >= last) break;
              const double x = Element(m, b, r, col);
              const double ax = std::fabs(x);
              double* a = acc[ty];
              if (slots & 1u) a[0] = a[0] + (w.w[0] ? Weight(w, 0, b, r) * x : x);
              if (slots & 2u) a[1] = a[1] + (w.w[1] ? Weight(w, 1, b, r) * ax : ax);
              if (slots & 4u) {
                const double sq = x * x;
                a[2] = a[2] + (w.w[2] ? Weight(w, 2, b, r) * sq : sq);
              }
              if (slots & 8u) a[3] = a[3] + (w.w[3] ? Weight(w, 3, b, r) * ax : ax);
            }
          }
        }
        for (int a = 0; a < kSlots; ++a) {
          double total = 0.0;
          for (int t = 0; t < kRowThreads; ++t) total = total + acc[t][a];
          out[((b * chunks + chunk) * kSlots + a) * cols + col] = total;
        }
      }
    }
  }
  return 0;
}

int LaunchFoldChunks(const double* partials, int64_t batch, int64_t chunks, int64_t columns,
                     double* out, void*) {
  const int64_t per_batch = kSlots * columns;
  for (int64_t i = 0; i < batch * per_batch; ++i) {
    const int64_t b = i / per_batch, within = i % per_batch;
    double total = 0.0;
    for (int64_t r = 0; r < chunks; ++r) total = total + partials[(b * chunks + r) * per_batch + within];
    out[i] = total;
  }
  return 0;
}

int LaunchSquareWeights(double* l, int64_t batch, int64_t terms, int64_t q, double site_weight,
                        double input_factor, bool input_rounding, void*) {
  for (int64_t i = 0; i < batch * terms; ++i) {
    const int64_t b = i / terms, k = i % terms;
    double* lb = l + b * kSlots * terms;
    const double input = k < q && input_rounding ? input_factor * lb[2 * terms + k] : 0.0;
    lb[2 * terms + k] = site_weight * lb[3 * terms + k] + input;
  }
  return 0;
}

int LaunchFinish(const double* r, const double* c, int64_t batch, int64_t s,
                 const abft_rule::Constants& rule, double op_id, double* blocks,
                 Record* record, const Matrix& product, bool poison, void*) {
  const int64_t n = (batch * s + kFinishThreads - 1) / kFinishThreads;
  for (int64_t block = 0; block < n; ++block) {
    std::vector<Worst> v(kFinishThreads, Worst{-1.0, 0.0, 0.0, 0.0, -1});
    int count = 0;
    for (int t = 0; t < kFinishThreads; ++t) {
      const int64_t g = block * kFinishThreads + t;
      if (g >= batch * s) continue;
      const int64_t b = g / s, j = g % s;
      const double* rb = r + b * kSlots * s;
      const double* cb = c + b * kSlots * s;
      const double threshold =
          abft_rule::Threshold(rule, rb[s + j], cb[s + j], rule.probabilistic ? rb[2 * s + j] : 0.0,
                               rule.c_squares ? cb[2 * s + j] : 0.0);
      const double discrepancy = cb[j] - rb[j];
      const double magnitude = std::fabs(discrepancy);
      const bool finite = std::isfinite(discrepancy);
      if (!(finite && magnitude <= threshold)) ++count;
      const double inf = std::numeric_limits<double>::infinity();
      const double ratio = !finite            ? inf
                           : threshold > 0.0  ? magnitude / threshold
                           : magnitude > 0.0  ? inf
                                              : 0.0;
      v[t] = Worst{ratio, discrepancy, threshold, rb[j], g};
    }
    const Worst w = TreeWorst(v);
    double* o = blocks + 8 * block;
    o[0] = count;
    o[1] = w.ratio;
    o[2] = w.discrepancy;
    o[3] = w.threshold;
    o[4] = w.reference;
    o[5] = static_cast<double>(w.index);
  }
  // ReduceBlocksKernel: thread t takes blocks t, t + 256, ... in order.
  std::vector<Worst> v(kFinishThreads, Worst{-1.0, 0.0, 0.0, 0.0, -1});
  std::vector<double> fails(kFinishThreads, 0.0);
  for (int t = 0; t < kFinishThreads; ++t) {
    for (int64_t i = t; i < n; i += kFinishThreads) {
      const double* in = blocks + 8 * i;
      fails[t] += in[0];
      const Worst w{in[1], in[2], in[3], in[4], static_cast<int64_t>(in[5])};
      if (Worse(w, v[t])) v[t] = w;
    }
  }
  const Worst worst = TreeWorst(v);
  double total = 0.0;
  for (double f : fails) total += f;
  const int64_t columns = s > 0 ? s : 1;
  Record out;
  out.failed = total;
  out.ratio = worst.ratio;
  out.discrepancy = worst.discrepancy;
  out.threshold = worst.threshold;
  out.reference = worst.reference;
  out.column = worst.index < 0 ? -1.0 : static_cast<double>(worst.index % columns);
  out.batch = worst.index < 0 ? 0.0 : static_cast<double>(worst.index / columns);
  out.op_id = op_id;
  *record = out;
  if (poison && total > 0 && worst.index >= 0) {
    const int64_t at = (worst.index / columns) * product.batch_stride +
                       (worst.index % columns) * product.col_stride;
    unsigned char* base = static_cast<unsigned char*>(const_cast<void*>(product.data));
    if (product.dtype == 0) {
      const uint32_t nan = 0x7fc00000u;
      std::memcpy(base + 4 * at, &nan, 4);
    } else {
      const uint16_t nan = product.dtype == 2 ? 0x7e00u : 0x7fc0u;
      std::memcpy(base + 2 * at, &nan, 2);
    }
  }
  return 0;
}

const char* ErrorString(int) { return "emulated"; }

}  // namespace sdc::kernels::abft_cuda_impl
