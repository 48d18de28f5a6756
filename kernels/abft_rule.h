#ifndef SDC_KERNELS_ABFT_RULE_H_
#define SDC_KERNELS_ABFT_RULE_H_

// The threshold rule of the matrix-product checksums (kernels/abft.h), in
// one place for the CPU check (abft.cc) and the CUDA one (abft_cuda.h):
// the per-product constants, and each column's threshold from its fp64
// statistics. Plain types only, so nvcc compiles it too; the CUDA kernels
// are built with --fmad=false, as the CPU ones with -ffp-contract=off, so a
// column with the same statistics gets the same threshold bits on both.

#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__CUDACC__)
#define SDC_ABFT_HOST_DEVICE __host__ __device__
#else
#define SDC_ABFT_HOST_DEVICE
#endif

namespace sdc::kernels::abft_rule {

inline constexpr double kFp64UnitRoundoff = 0x1p-53;
inline constexpr double kFp32MinNormal = 0x1p-126;
inline constexpr double kEvaluationSlack = 1.0 + 0x1p-40;

// What every column of one product's check shares (abft.h, THE THRESHOLD).
struct Constants {
  double beta = 0.0;              // (1 + u_in)^2 (1 + gamma_K) - 1.
  double beta_first_order = 0.0;  // K u + 2 u_in.
  double g64 = 0.0;               // gamma64_{p + q + 4}: the check's own rounding.
  double lift = 1.0;              // 1 / (1 - g64): computed T, S up to their true values.
  double underflow = 0.0;         // Absolute underflow terms of one column.
  double uo = 0.0;                // u_out / (1 - u_out).
  double lambda = 0.0;            // Probabilistic rule: standard deviations.
  bool probabilistic = false;
  bool c_squares = false;         // The variance has C's rounding term.
};

inline double Gamma(double count, double unit_roundoff) {
  const double nu = count * unit_roundoff;
  return nu < 1.0 ? nu / (1.0 - nu) : std::numeric_limits<double>::infinity();
}

// The constants of the column check of C = [L | lx] [R ; ry] with L p x q,
// `terms` = q (+1 with the extra column), accumulation roundoff u, input
// roundoff u_in, C's unit roundoff u_out and absolute underflow per element
// of rounding to C's dtype `output_underflow`.
inline Constants MakeConstants(int64_t p, int64_t q, int64_t terms, double u, double u_in,
                               double u_out, double output_underflow, bool probabilistic,
                               double lambda) {
  Constants k;
  k.uo = u_out / (1.0 - u_out);
  k.probabilistic = probabilistic;
  k.c_squares = probabilistic && k.uo > 0.0;
  k.lambda = lambda;
  k.beta = (1.0 + u_in) * (1.0 + u_in) * (1.0 + Gamma(static_cast<double>(terms), u)) - 1.0;
  k.beta_first_order = static_cast<double>(terms) * u + 2.0 * u_in;
  k.g64 = Gamma(static_cast<double>(p + q + 4), kFp64UnitRoundoff);
  k.lift = 1.0 / (1.0 - k.g64);
  // An underflow's absolute error is carried through the later roundings of
  // the same dot product: at most (1 + gamma_K) of it reaches c^.
  k.underflow = static_cast<double>(p) *
                (2.0 * static_cast<double>(terms) * kFp32MinNormal *
                     (1.0 + Gamma(static_cast<double>(terms), u)) +
                 output_underflow);
  return k;
}

// Column j's threshold from its fp64 statistics as computed: t = T_j, s =
// S_j, variance = the operand part of sigma^2, c_sq = sum_i C_ij^2 (read
// only when k.c_squares).
SDC_ABFT_HOST_DEVICE inline double Threshold(const Constants& k, double t, double s,
                                             double variance, double c_sq) {
  const double t_j = t * k.lift, s_j = s * k.lift;
  const double check = k.g64 * (t_j + s_j) + k.underflow;
  double threshold = (k.beta * t_j + k.uo * s_j + check) * kEvaluationSlack;
  if (k.probabilistic) {
    const double sigma = sqrt((variance + (k.c_squares ? k.uo * k.uo * c_sq : 0.0)) * k.lift);
    const double second_order = (k.beta - k.beta_first_order) * t_j + k.uo * k.beta * t_j;
    const double bound = (k.lambda * sigma + second_order + check) * kEvaluationSlack;
    // std::min's choice: the bound only when below (a NaN keeps the first).
    threshold = bound < threshold ? bound : threshold;
  }
  return threshold;
}

}  // namespace sdc::kernels::abft_rule

#endif  // SDC_KERNELS_ABFT_RULE_H_
