#include "llama-moe-cpu-part.h"
#include "llama-moe-config.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

//
// llama_moe_cpu_team
//

llama_moe_cpu_team::llama_moe_cpu_team(int n_threads) {
    for (int i = 1; i < n_threads; ++i) {
        workers.emplace_back(&llama_moe_cpu_team::work, this, i);
    }
}

llama_moe_cpu_team::~llama_moe_cpu_team() {
    {
        std::lock_guard<std::mutex> lock(mutex);
        stop = true;
    }
    cv.notify_all();
    for (auto & t : workers) {
        t.join();
    }
}

void llama_moe_cpu_team::keep_awake(int64_t us) {
    const int64_t until = llama_moe_now_us() + us;
    if (awake_until_us.load(std::memory_order_relaxed) < until) {
        awake_until_us = until;
    }
    if (n_sleeping.load() > 0) {
        std::lock_guard<std::mutex> lock(mutex);
        cv.notify_all();
    }
}

void llama_moe_cpu_team::run(void (*fn)(void *, int, int), void * arg) {
    const int nth = size();
    if (nth > 1) {
        job_fn  = fn;
        job_arg = arg;
        n_running.store(nth - 1);
        generation.fetch_add(1); // seq_cst: against n_sleeping below, see work()
        if (n_sleeping.load() > 0) {
            std::lock_guard<std::mutex> lock(mutex);
            cv.notify_all();
        }
    }
    fn(arg, 0, nth);
    while (n_running.load(std::memory_order_acquire) > 0) {
        llama_moe_cpu_relax();
    }
}

void llama_moe_cpu_team::work(int ith) {
    uint64_t seen = 0;
    while (true) {
        int spins = 0;
        while (generation.load(std::memory_order_acquire) == seen && !stop.load(std::memory_order_relaxed)) {
            if (++spins < 256) {
                llama_moe_cpu_relax();
                continue;
            }
            spins = 0;
            if (llama_moe_now_us() < awake_until_us.load(std::memory_order_relaxed)) {
                continue;
            }
            // idle: sleep until a job or keep_awake. n_sleeping is raised before generation is read again
            // (both seq_cst), so run() either sees a sleeper and notifies, or this thread sees the job
            std::unique_lock<std::mutex> lock(mutex);
            n_sleeping++;
            cv.wait(lock, [&] {
                return stop.load() || generation.load() != seen || llama_moe_now_us() < awake_until_us.load();
            });
            n_sleeping--;
        }
        if (stop) {
            return;
        }
        seen = generation.load(std::memory_order_acquire);
        job_fn(job_arg, ith, size());
        n_running.fetch_sub(1, std::memory_order_release);
    }
}

//
// llama_moe_cpu_part
//

// bytes of expert rows a thread prefetches ahead of its products (LLAMA_MOE_MAILBOX_PREFETCH overrides, 0: none)
static constexpr int64_t LLAMA_MOE_CPU_PART_PREFETCH = 4096;

static bool llama_moe_cpu_part_is_in(const std::vector<ggml_tensor *> & group, const ggml_tensor * t) {
    for (; t != nullptr; t = t->view_src) {
        if (std::find(group.begin(), group.end(), t) != group.end()) {
            return true;
        }
    }
    return false;
}

bool llama_moe_cpu_part::plan(ggml_context * ctx, ggml_cgraph * gf, ggml_threadpool * tp_one, std::string & why) {
    steps.clear();
    inputs.clear();
    work_bytes = 0;
    // GGML_MMID_CHUNK as ggml-cpu reads it (its own reader: ggml does not link llama), by the same rule
    chunk_rows = (int) llama_moe_env_int("GGML_MMID_CHUNK", 0, 0, 1 << 16);
    prefetch_bytes = (int) llama_moe_env_int("LLAMA_MOE_MAILBOX_PREFETCH", LLAMA_MOE_CPU_PART_PREFETCH, 0, 1 << 30);

    const int n_nodes = ggml_graph_n_nodes(gf);
    std::vector<ggml_tensor *> group; // the MUL_MAT_IDs of the step being built
    for (int i = 0; i < n_nodes; ++i) {
        ggml_tensor * node = ggml_graph_node(gf, i);
        if (node->op != GGML_OP_MUL_MAT_ID) {
            if (steps.empty() || steps.back().gf == nullptr) {
                if (ggml_get_mem_size(ctx) - ggml_used_mem(ctx) < ggml_graph_overhead_custom(n_nodes, false)) {
                    why = "its graph has more steps than the mailbox made room for";
                    return false;
                }
                steps.emplace_back();
                steps.back().gf = ggml_new_graph_custom(ctx, n_nodes, false);
            }
            ggml_graph_add_node(steps.back().gf, node);
            group.clear();
            continue;
        }
        const ggml_tensor * src0 = node->src[0];
        const ggml_tensor * src1 = node->src[1];
        const ggml_tensor * ids  = node->src[2];
        const auto * traits = ggml_get_type_traits_cpu(src0->type);
        // one token: src1 [ne10, ne11 (1 or n_ids), 1], ids [n_ids, 1], dst [ne01, n_ids, 1], all in plain memory
        if (src1->type != GGML_TYPE_F32 || !ggml_is_contiguous(src1) || src1->ne[2] != 1 || src1->ne[3] != 1 ||
            ids->type != GGML_TYPE_I32 || ids->ne[1] != 1 || !ggml_is_contiguous(ids) || !ggml_is_contiguous(node) ||
            node->ne[2] != 1 || src0->nb[0] != ggml_type_size(src0->type) || traits->vec_dot == nullptr ||
            src0->ne[3] != 1 || src1->ne[0] != src0->ne[0] || node->ne[0] != src0->ne[1] || node->ne[1] != ids->ne[0]) {
            why = std::string("its ") + ggml_op_desc(node) + " " + node->name + " is not one token's product of plain expert rows";
            return false;
        }
        const bool depends = llama_moe_cpu_part_is_in(group, src1) || llama_moe_cpu_part_is_in(group, ids);
        if (steps.empty() || steps.back().gf != nullptr || depends) {
            steps.emplace_back();
            group.clear();
        }
        mmid m;
        m.node = node;
        if (traits->vec_dot_type != GGML_TYPE_F32) {
            // an input two products share (gate and up read the same x) is quantized once
            for (size_t j = 0; j < inputs.size(); ++j) {
                if (inputs[j].src == src1 && inputs[j].type == traits->vec_dot_type) {
                    m.src1_q = (int) j;
                }
            }
            if (m.src1_q < 0) {
                if (ggml_get_type_traits_cpu(traits->vec_dot_type)->from_float == nullptr) {
                    why = std::string("no conversion of its input to ") + ggml_type_name(traits->vec_dot_type);
                    return false;
                }
                input in;
                in.src       = const_cast<ggml_tensor *>(src1);
                in.type      = traits->vec_dot_type;
                in.row_bytes = ggml_row_size(in.type, src1->ne[0]);
                in.offset    = inputs.empty() ? 0 : GGML_PAD(inputs.back().offset + inputs.back().row_bytes * inputs.back().src->ne[1], 64);
                in.ready.assign(src1->ne[1], 0);
                m.src1_q = (int) inputs.size();
                inputs.push_back(in);
            }
        }
        steps.back().mmids.push_back(m);
        group.push_back(node);
    }
    qbuf.resize(inputs.empty() ? 1 : inputs.back().offset + inputs.back().row_bytes * inputs.back().src->ne[1]);
    // the products' rows start as zeros: a row no expert writes must hold finite values
    for (const auto & s : steps) {
        for (const mmid & m : s.mmids) {
            memset(m.node->data, 0, ggml_nbytes(m.node));
        }
    }
    for (const auto & s : steps) {
        if (s.gf) {
            work_bytes = std::max(work_bytes, ggml_graph_plan(s.gf, 1, tp_one).work_size);
        }
    }
    return true;
}

// the leader: the inputs of the experts the CPU computes quantized, their rows listed in chunks; false for an
// expert id past the layer's experts
bool llama_moe_cpu_part::prepare(const step & s) {
    chunks.clear();
    for (auto & in : inputs) {
        std::fill(in.ready.begin(), in.ready.end(), 0);
    }
    for (const mmid & m : s.mmids) {
        const ggml_tensor * dst  = m.node;
        const ggml_tensor * src1 = dst->src[1];
        const int32_t * ids = (const int32_t *) dst->src[2]->data;
        const int64_t n_ids = dst->src[2]->ne[0];
        const int64_t n_as  = dst->src[0]->ne[2];
        const int64_t nr0   = dst->ne[0];
        const int64_t rows  = chunk_rows > 0 ? chunk_rows : std::max<int64_t>(1, (nr0 + team_size - 1) / team_size);
        for (int64_t k = 0; k < n_ids; ++k) {
            const int32_t e = ids[k];
            if (e < 0) {
                // a negative id selects nothing. ggml's mul_mat_id zeroes the row; here it keeps what it held (zeros
                // from plan, or an earlier step's values), which only rows of the same k read, down to the
                // result, whose row the device does not read (y_rows)
                continue;
            }
            if (e >= n_as) {
                return false;
            }
            const int64_t i11 = k % src1->ne[1];
            if (m.src1_q >= 0 && !inputs[m.src1_q].ready[i11]) {
                input & in = inputs[m.src1_q];
                ggml_get_type_traits_cpu(in.type)->from_float((const float *) ((const char *) src1->data + i11 * src1->nb[1]),
                                                              qbuf.data() + in.offset + i11 * in.row_bytes, src1->ne[0]);
                in.ready[i11] = 1;
            }
            for (int64_t r0 = 0; r0 < nr0; r0 += rows) {
                chunks.push_back({ &m, (int32_t) k, e, r0, std::min(nr0, r0 + rows) });
            }
            n_products_bytes += nr0 * dst->src[0]->nb[1];
        }
    }
    next_chunk = 0;
    return true;
}

void llama_moe_cpu_part::run_chunks(void * arg, int /*ith*/, int /*nth*/) {
    auto * self = (llama_moe_cpu_part *) arg;
    for (size_t i = self->next_chunk.fetch_add(1, std::memory_order_relaxed); i < self->chunks.size();
         i = self->next_chunk.fetch_add(1, std::memory_order_relaxed)) {
        const chunk & c = self->chunks[i];
        const ggml_tensor * dst  = c.m->node;
        const ggml_tensor * src0 = dst->src[0];
        const ggml_tensor * src1 = dst->src[1];
        const int64_t i11 = c.k % src1->ne[1];
        const char * y = c.m->src1_q >= 0
            ? (const char *) self->qbuf.data() + self->inputs[c.m->src1_q].offset + i11 * self->inputs[c.m->src1_q].row_bytes
            : (const char *) src1->data + i11 * src1->nb[1];
        const char * w = (const char *) src0->data + c.expert * src0->nb[2] + c.r0 * src0->nb[1];
        float * out = (float *) ((char *) dst->data + c.k * dst->nb[1]);
        const ggml_vec_dot_t vec_dot = ggml_get_type_traits_cpu(src0->type)->vec_dot;
        // rows ahead of the one being computed are prefetched: the cores' own prefetchers stop at each 4 KiB
        // page, and a chunk spans several, so a lone thread would wait on memory at every page
        const size_t  row   = src0->nb[1];
        const int64_t ahead = self->prefetch_bytes > 0 ? std::max<int64_t>(1, self->prefetch_bytes / (int64_t) row) : 0;
        const char * end = ahead > 0 ? w + (c.r1 - c.r0) * row : w;
        for (const char * p = w; p < std::min(end, w + ahead * row); p += 64) {
            __builtin_prefetch(p);
        }
        for (int64_t r = c.r0; r < c.r1; ++r, w += row) {
            const char * next = w + ahead * row;
            if (next < end) {
                for (size_t o = 0; o < row; o += 64) {
                    __builtin_prefetch(next + o);
                }
            }
            vec_dot((int) src0->ne[0], out + r, 0, w, 0, y, 0, 1);
        }
    }
}

ggml_status llama_moe_cpu_part::compute(llama_moe_cpu_team & team, ggml_threadpool * tp_one, uint8_t * work) {
    team_size = team.size();
    t_products_us    = 0;
    n_products_bytes = 0;
    t_prepare_us     = 0;
    t_nodes_us       = 0;
    for (const step & s : steps) {
        const int64_t t0 = llama_moe_now_us();
        if (s.gf) {
            ggml_cplan plan = ggml_graph_plan(s.gf, 1, tp_one);
            plan.work_data = work;
            const ggml_status st = ggml_graph_compute(s.gf, &plan);
            t_nodes_us += llama_moe_now_us() - t0;
            if (st != GGML_STATUS_SUCCESS) {
                return st;
            }
            continue;
        }
        if (!prepare(s)) {
            return GGML_STATUS_FAILED; // an expert id past the layer's experts: no answer rather than garbage
        }
        const int64_t t1 = llama_moe_now_us();
        t_prepare_us += t1 - t0;
        if (!chunks.empty()) {
            team.run(run_chunks, this);
            t_products_us += llama_moe_now_us() - t1;
        }
    }
    return GGML_STATUS_SUCCESS;
}
