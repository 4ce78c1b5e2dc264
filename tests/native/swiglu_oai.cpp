// gpt-oss's activation (GGML_GLU_OP_SWIGLU_OAI) on the CPU backend, which the patch series vectorizes: against
// the scalar formula it replaces, y = min(x, limit) / (1 + exp(-alpha * min(x, limit))) * (clamp(g, -limit,
// limit) + 1), on rows whose lengths leave a scalar tail, with values past the limit and far into exp's
// underflow, split and fused (gate and up in one tensor), on 1 and 3 threads.
// Exit status: 0 when every value is within 4 ulp-sized relative steps of the formula, 1 otherwise.

#include "ggml.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float next_float(float scale) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return scale * ((float) ((rng_state >> 40) & 0xffff) / 32768.0f - 1.0f);
}

static float reference(float x, float g, float alpha, float limit) {
    const float xi = std::min(x, limit);
    const float gi = std::clamp(g, -limit, limit);
    return xi / (1.0f + expf(alpha * (-xi))) * (gi + 1.0f);
}

// returns the number of wrong values
static int check(int64_t n, int64_t rows, bool fused, int n_threads, float alpha, float limit) {
    ggml_init_params ip = { 64ull * 1024 * 1024, nullptr, false };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, fused ? 2 * n : n, rows);
    ggml_tensor * b = fused ? nullptr : ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, rows);
    std::vector<float> x(n * rows), g(n * rows);
    for (int64_t i = 0; i < n * rows; ++i) {
        // mostly ordinary values; some past the limit, some deep in exp's underflow and overflow
        const int64_t kind = i % 11;
        x[i] = kind == 3 ? 2.5f * limit : kind == 7 ? -150.0f : kind == 9 ? 120.0f : next_float(12.0f);
        g[i] = kind == 5 ? -3.0f * limit : next_float(12.0f);
    }
    for (int64_t r = 0; r < rows; ++r) {
        float * pa = (float *) ((char *) a->data + r * a->nb[1]);
        memcpy(pa, x.data() + r * n, n * sizeof(float));
        if (fused) {
            memcpy(pa + n, g.data() + r * n, n * sizeof(float));
        } else {
            memcpy((char *) b->data + r * b->nb[1], g.data() + r * n, n * sizeof(float));
        }
    }
    ggml_tensor * out = fused ? ggml_swiglu_oai(ctx, a, nullptr, alpha, limit) : ggml_swiglu_oai(ctx, a, b, alpha, limit);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_graph_compute_with_ctx(ctx, gf, n_threads);
    int wrong = 0;
    for (int64_t r = 0; r < rows; ++r) {
        const float * y = (const float *) ((const char *) out->data + r * out->nb[1]);
        for (int64_t i = 0; i < n; ++i) {
            const float want = reference(x[r * n + i], g[r * n + i], alpha, limit);
            const float tol  = 4.0f * 1.2e-7f * std::max(1.0f, std::fabs(want));
            if (!std::isfinite(y[i]) || std::fabs(y[i] - want) > tol) {
                if (wrong < 5) {
                    printf("n %lld row %lld col %lld: x %g g %g -> %.9g, the formula %.9g\n", (long long) n, (long long) r,
                           (long long) i, x[r * n + i], g[r * n + i], y[i], want);
                }
                wrong++;
            }
        }
    }
    ggml_free(ctx);
    return wrong;
}

int main() {
    int cases = 0, wrong = 0;
    for (int64_t n : { 1, 7, 16, 37, 2880 }) {
        for (bool fused : { false, true }) {
            for (int n_threads : { 1, 3 }) {
                wrong += check(n, 5, fused, n_threads, 1.702f, 7.0f);
                cases++;
            }
        }
    }
    printf("%d cases, %d wrong values\n", cases, wrong);
    return wrong == 0 ? 0 : 1;
}
