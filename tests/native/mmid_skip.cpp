// The hybrid cache's convention in ggml: a negative expert id in MUL_MAT_ID selects nothing, and its output
// row is zero. Checked on the CPU backend, which is where the hybrid runs such products: every other row must
// be bit-identical to the same product with a valid id there, an all-negative ubatch must give zeros, and two
// complementary halves of a selection must sum to the whole (what the hybrid's two chains do). ADD_ID (expert
// biases) follows the same convention.
// Exit status: 0 when every case holds, 1 otherwise.

#include "ggml.h"
#include "ggml-cpu.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float next_float() {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float) ((rng_state >> 40) & 0xffff) / 32768.0f - 1.0f;
}

struct mmid_case {
    ggml_type type;
    int64_t k, m, n_as, n_used, n_tokens;
    int n_threads;
};

// out = mul_mat_id(as, b, ids) on the CPU, as floats [m, n_used, n_tokens]
static std::vector<float> run_mmid(const mmid_case & c, const std::vector<float> & as_f32, const std::vector<float> & b_f32,
                                   const std::vector<int32_t> & ids) {
    ggml_init_params ip = { 256ull * 1024 * 1024, nullptr, false };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * as = ggml_new_tensor_3d(ctx, c.type, c.k, c.m, c.n_as);
    ggml_tensor * b  = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.k, c.n_used, c.n_tokens);
    ggml_tensor * id = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, c.n_used, c.n_tokens);
    if (c.type == GGML_TYPE_F32) {
        memcpy(as->data, as_f32.data(), ggml_nbytes(as));
    } else {
        ggml_quantize_chunk(c.type, as_f32.data(), as->data, 0, c.m * c.n_as, c.k, nullptr);
    }
    memcpy(b->data, b_f32.data(), ggml_nbytes(b));
    memcpy(id->data, ids.data(), ggml_nbytes(id));
    ggml_tensor * out = ggml_mul_mat_id(ctx, as, b, id);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_graph_compute_with_ctx(ctx, gf, c.n_threads);
    std::vector<float> res(ggml_nelements(out));
    memcpy(res.data(), out->data, ggml_nbytes(out));
    ggml_free(ctx);
    return res;
}

static int check_case(const mmid_case & c) {
    std::vector<float> as(c.k * c.m * c.n_as), b(c.k * c.n_used * c.n_tokens);
    for (auto & x : as) x = next_float();
    for (auto & x : b) x = next_float();

    // a selection of distinct experts per token, and a split of it into two complementary halves
    std::vector<int32_t> full(c.n_used * c.n_tokens), half_a(full.size()), half_b(full.size()), none(full.size(), -1);
    for (int64_t t = 0; t < c.n_tokens; ++t) {
        for (int64_t u = 0; u < c.n_used; ++u) {
            const size_t i = t * c.n_used + u;
            full[i]   = (int32_t) ((t * 5 + u * 3) % c.n_as);
            const bool first = ((t + u) % 3) != 0;
            half_a[i] = first ? full[i] : -1;
            half_b[i] = first ? -1 : full[i];
        }
    }
    const auto out_full = run_mmid(c, as, b, full);
    const auto out_a    = run_mmid(c, as, b, half_a);
    const auto out_b    = run_mmid(c, as, b, half_b);
    const auto out_none = run_mmid(c, as, b, none);

    int bad = 0;
    for (size_t i = 0; i < full.size(); ++i) {
        for (int64_t r = 0; r < c.m; ++r) {
            const size_t j = i * c.m + r;
            const float want_a = half_a[i] >= 0 ? out_full[j] : 0.0f;
            const float want_b = half_b[i] >= 0 ? out_full[j] : 0.0f;
            if (memcmp(&out_a[j], &want_a, sizeof(float)) != 0 || memcmp(&out_b[j], &want_b, sizeof(float)) != 0 ||
                out_none[j] != 0.0f || out_a[j] + out_b[j] != out_full[j]) {
                if (bad++ < 5) {
                    fprintf(stderr, "%s k=%lld tokens=%lld: slot %zu row %lld: full %g, halves %g + %g, none %g\n",
                            ggml_type_name(c.type), (long long) c.k, (long long) c.n_tokens, i, (long long) r,
                            out_full[j], out_a[j], out_b[j], out_none[j]);
                }
            }
        }
    }
    return bad;
}

// add_id(a, b, ids): a row whose id is negative passes unchanged (the hybrid's CPU part adds no bias for the
// experts the cache computes); the others get their bias row added
static int check_add_id(int n_threads) {
    const int64_t n = 40, n_used = 4, n_tokens = 3, n_bias = 6;
    ggml_init_params ip = { 16ull * 1024 * 1024, nullptr, false };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * a  = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, n, n_used, n_tokens);
    ggml_tensor * b  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, n_bias);
    ggml_tensor * id = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_used, n_tokens);
    for (int64_t i = 0; i < ggml_nelements(a); ++i) ((float *) a->data)[i] = next_float();
    for (int64_t i = 0; i < ggml_nelements(b); ++i) ((float *) b->data)[i] = next_float();
    for (int64_t i = 0; i < n_used * n_tokens; ++i) ((int32_t *) id->data)[i] = i % 3 == 0 ? -1 : (int32_t) (i % n_bias);
    ggml_tensor * out = ggml_add_id(ctx, a, b, id);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_graph_compute_with_ctx(ctx, gf, n_threads);
    int bad = 0;
    for (int64_t r = 0; r < n_used * n_tokens; ++r) {
        const int32_t e = ((int32_t *) id->data)[r];
        for (int64_t c = 0; c < n; ++c) {
            const float want = ((float *) a->data)[r * n + c] + (e < 0 ? 0.0f : ((float *) b->data)[e * n + c]);
            if (((float *) out->data)[r * n + c] != want && bad++ < 5) {
                fprintf(stderr, "add_id row %lld col %lld: %g, want %g\n", (long long) r, (long long) c,
                        ((float *) out->data)[r * n + c], want);
            }
        }
    }
    ggml_free(ctx);
    return bad;
}

int main() {
    const mmid_case cases[] = {
        { GGML_TYPE_F32,  64,  32, 8, 4,  1, 1 },
        { GGML_TYPE_F32,  64,  32, 8, 4, 24, 4 },
        { GGML_TYPE_Q4_0, 256, 96, 16, 8, 1, 4 },  // one token: the GGML_MMID_CHUNK path
        { GGML_TYPE_Q4_0, 256, 96, 16, 8, 32, 3 },
        { GGML_TYPE_Q8_0, 128, 64, 8, 2,  5, 2 },
    };
    int n_bad = 0;
    for (const auto & c : cases) {
        n_bad += check_case(c);
    }
    n_bad += check_add_id(1) + check_add_id(3);
    printf("mmid_skip: %zu cases, %d wrong values\n", sizeof(cases) / sizeof(cases[0]) + 2, n_bad);
    return n_bad == 0 ? 0 : 1;
}
