// ggml_vec_swiglu_oai_f32 (vec.h): gpt-oss's gated activation, vectorized

#include "vec.h"

#include <algorithm>

// gpt-oss's gated activation: y = min(x, limit) * sigmoid(alpha * min(x, limit)) * (clamp(g, -limit, limit) + 1)
void ggml_vec_swiglu_oai_f32(const int n, float * y, const float * x, const float * g, const float alpha, const float limit) {
    int i = 0;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
    const __m512 one = _mm512_set1_ps(1.0f), lim = _mm512_set1_ps(limit), nlim = _mm512_set1_ps(-limit), nalpha = _mm512_set1_ps(-alpha);
    for (; i + 15 < n; i += 16) {
        const __m512 xi = _mm512_min_ps(_mm512_loadu_ps(x + i), lim);
        const __m512 gi = _mm512_min_ps(_mm512_max_ps(_mm512_loadu_ps(g + i), nlim), lim);
        const __m512 glu = _mm512_div_ps(xi, _mm512_add_ps(one, ggml_v_expf(_mm512_mul_ps(xi, nalpha))));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(glu, _mm512_add_ps(gi, one)));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256 one = _mm256_set1_ps(1.0f), lim = _mm256_set1_ps(limit), nlim = _mm256_set1_ps(-limit), nalpha = _mm256_set1_ps(-alpha);
    for (; i + 7 < n; i += 8) {
        const __m256 xi = _mm256_min_ps(_mm256_loadu_ps(x + i), lim);
        const __m256 gi = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(g + i), nlim), lim);
        const __m256 glu = _mm256_div_ps(xi, _mm256_add_ps(one, ggml_v_expf(_mm256_mul_ps(xi, nalpha))));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(glu, _mm256_add_ps(gi, one)));
    }
#elif defined(__ARM_NEON) && defined(__aarch64__)
    const float32x4_t one = vdupq_n_f32(1.0f), lim = vdupq_n_f32(limit), nlim = vdupq_n_f32(-limit), nalpha = vdupq_n_f32(-alpha);
    for (; i + 3 < n; i += 4) {
        const float32x4_t xi = vminq_f32(vld1q_f32(x + i), lim);
        const float32x4_t gi = vminq_f32(vmaxq_f32(vld1q_f32(g + i), nlim), lim);
        const float32x4_t glu = vdivq_f32(xi, vaddq_f32(one, ggml_v_expf(vmulq_f32(xi, nalpha))));
        vst1q_f32(y + i, vmulq_f32(glu, vaddq_f32(gi, one)));
    }
#endif
    for (; i < n; ++i) {
        const float xi = std::min(x[i], limit);
        const float gi = std::clamp(g[i], -limit, limit);
        y[i] = xi / (1.0f + expf(alpha * (-xi))) * (gi + 1.0f);
    }
}
