#include "cpu/delta_rule.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace frink::cpu {

namespace {

// c[m][:n] += sum_k a[m][k] * b[k][:n] for m < n_m (row-major, leading dimensions given).
// Four rows of c per pass over b, so each row of b is loaded once for four rows and the
// inner loop is an axpy the compiler vectorizes (no reduction to reorder).
void gemm_acc(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t n_m,
              int64_t n_k, int64_t n_n) {
  int64_t m = 0;
  for (; m + 4 <= n_m; m += 4) {
    float* c0 = c + m * ldc;
    float* c1 = c0 + ldc;
    float* c2 = c1 + ldc;
    float* c3 = c2 + ldc;
    for (int64_t k = 0; k < n_k; ++k) {
      const float* bk = b + k * ldb;
      const float a0 = a[m * lda + k], a1 = a[(m + 1) * lda + k], a2 = a[(m + 2) * lda + k],
                  a3 = a[(m + 3) * lda + k];
      for (int64_t j = 0; j < n_n; ++j) {
        const float bv = bk[j];
        c0[j] += a0 * bv;
        c1[j] += a1 * bv;
        c2[j] += a2 * bv;
        c3[j] += a3 * bv;
      }
    }
  }
  for (; m < n_m; ++m) {
    float* cm = c + m * ldc;
    for (int64_t k = 0; k < n_k; ++k) {
      const float* bk = b + k * ldb;
      const float am = a[m * lda + k];
      for (int64_t j = 0; j < n_n; ++j) cm[j] += am * bk[j];
    }
  }
}

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void delta_rule_recurrent(const DeltaRuleSeq& s, float* state) {
  const int64_t d = s.d;
  std::vector<float> sk(static_cast<size_t>(d)), delta(static_cast<size_t>(d));
  for (int64_t t = 0; t < s.n; ++t) {
    const float* q = s.q + t * s.qk_stride;
    const float* k = s.k + t * s.qk_stride;
    const float* v = s.v + t * s.v_stride;
    const float decay = std::exp(s.g[t * s.gb_stride]);
    const float beta = s.beta[t * s.gb_stride];
    // S *= exp(g); sk = S^T k
    std::fill(sk.begin(), sk.end(), 0.0f);
    for (int64_t i = 0; i < d; ++i) {
      float* row = state + i * d;
      const float ki = k[i];
      for (int64_t j = 0; j < d; ++j) {
        row[j] *= decay;
        sk[j] += ki * row[j];
      }
    }
    // delta = beta (v - sk); S += k delta^T; o = S^T q
    for (int64_t j = 0; j < d; ++j) delta[j] = beta * (v[j] - sk[j]);
    float* o = s.out + t * s.out_stride;
    std::fill(o, o + d, 0.0f);
    for (int64_t i = 0; i < d; ++i) {
      float* row = state + i * d;
      const float ki = k[i], qi = q[i] * s.q_scale;
      for (int64_t j = 0; j < d; ++j) {
        row[j] += ki * delta[j];
        o[j] += qi * row[j];
      }
    }
  }
}

void delta_rule_chunked(const DeltaRuleSeq& s, float* state, int64_t chunk) {
  const int64_t d = s.d, L = std::max<int64_t>(1, chunk);
  auto buf = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };
  std::vector<float> Q = buf(L * d), K = buf(L * d), U = buf(L * d), W = buf(L * d), KDT = buf(d * L);
  std::vector<float> B = buf(L), A = buf(L * L), QK = buf(L * L);
  // The cumulative log decay in double: the chunked form uses differences G_r - G_s of sums
  // that reach -1e3 with strong decays, where f32 would leave 1e-4 of error in each exponent.
  std::vector<double> G(static_cast<size_t>(L));
  auto ex = [](double x) { return std::exp(static_cast<float>(x)); };
  for (int64_t c0 = 0; c0 < s.n; c0 += L) {
    const int64_t n = std::min(L, s.n - c0);
    // Gather the chunk: Q scaled, G the cumulative log decay.
    double acc = 0.0;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t t = c0 + r;
      acc += s.g[t * s.gb_stride];
      G[r] = acc;
      B[r] = s.beta[t * s.gb_stride];
      const float* q = s.q + t * s.qk_stride;
      const float* k = s.k + t * s.qk_stride;
      for (int64_t i = 0; i < d; ++i) {
        Q[r * d + i] = q[i] * s.q_scale;
        K[r * d + i] = k[i];
      }
    }
    // A[r][s] = beta_r (k_r . k_s) exp(G_r - G_s) and QK[r][s] = (q_r . k_s) exp(G_r - G_s).
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c <= r; ++c) {
        const float decay = ex(G[r] - G[c]);
        if (c < r) A[r * L + c] = B[r] * dot(&K[r * d], &K[c * d], d) * decay;
        QK[r * L + c] = dot(&Q[r * d], &K[c * d], d) * decay;
      }
    // Forward substitution, row by row: U_r = beta_r v_r - sum_{c<r} A[r][c] U_c, and W
    // likewise from beta_r exp(G_r) k_r.
    for (int64_t r = 0; r < n; ++r) {
      const float* v = s.v + (c0 + r) * s.v_stride;
      float* u = &U[r * d];
      float* w = &W[r * d];
      const float bg = B[r] * ex(G[r]);
      for (int64_t j = 0; j < d; ++j) {
        u[j] = B[r] * v[j];
        w[j] = bg * K[r * d + j];
      }
      for (int64_t c = 0; c < r; ++c) {
        const float a = A[r * L + c];
        const float* uc = &U[c * d];
        const float* wc = &W[c * d];
        for (int64_t j = 0; j < d; ++j) {
          u[j] -= a * uc[j];
          w[j] -= a * wc[j];
        }
      }
    }
    // V' = U - W S (into U), by accumulating -W S.
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < d; ++i) W[r * d + i] = -W[r * d + i];
    gemm_acc(W.data(), d, state, d, U.data(), d, n, d, d);
    // O = exp(G) (Q S) + tril(QK) V'
    for (int64_t r = 0; r < n; ++r) {
      float* o = s.out + (c0 + r) * s.out_stride;
      std::fill(o, o + d, 0.0f);
    }
    gemm_acc(Q.data(), d, state, d, s.out + c0 * s.out_stride, s.out_stride, n, d, d);
    for (int64_t r = 0; r < n; ++r) {
      float* o = s.out + (c0 + r) * s.out_stride;
      const float eg = ex(G[r]);
      for (int64_t j = 0; j < d; ++j) o[j] *= eg;
      for (int64_t c = 0; c <= r; ++c) {
        const float a = QK[r * L + c];
        const float* vc = &U[c * d];
        for (int64_t j = 0; j < d; ++j) o[j] += a * vc[j];
      }
    }
    // S = exp(G_last) S + (K exp(G_last - G))^T V'
    const double g_last = G[n - 1];
    const float e_last = ex(g_last);
    for (int64_t i = 0; i < d * d; ++i) state[i] *= e_last;
    for (int64_t r = 0; r < n; ++r) {
      const float e = ex(g_last - G[r]);
      for (int64_t i = 0; i < d; ++i) KDT[i * L + r] = K[r * d + i] * e;
    }
    gemm_acc(KDT.data(), L, U.data(), d, state, d, d, n, d);
  }
}

}  // namespace frink::cpu
