#include "llama-moe-mailbox.h"
#include "llama-moe-config.h"

#include "llama-impl.h"
#include "llama-moe-cache.h"
#include "llama-cparams.h"
#include "llama-memory.h"
#include "llama-model.h"

#include "ggml-alloc.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <limits>

// the CPU side keeps polling this long after its last hand-over: the next token's first layer comes soon
static constexpr int64_t LLAMA_MOE_MAILBOX_AWAKE_US  = 2000;
// in a decode, after this long without a hand-over it stops spinning and polls every millisecond
static constexpr int64_t LLAMA_MOE_MAILBOX_DROWSY_US = 1000000;

std::unique_ptr<llama_moe_mailbox> llama_moe_mailbox::create(llama_moe_cache & cache, int n_threads, bool all_on_gpu) {
    if (llama_moe_env_flag("LLAMA_MOE_CACHE_NO_MAILBOX", false)) {
        LLAMA_LOG_INFO("llama_moe_cache: mailbox off (LLAMA_MOE_CACHE_NO_MAILBOX): the hybrid hands over through the scheduler\n");
        return nullptr;
    }
    ggml_backend_dev_t dev = cache.get_device();
    if (dev == nullptr) {
        return nullptr;
    }
    const char * reg = ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev));
    const bool cuda = strcmp(reg, "CUDA") == 0;
    const bool cpu_test = ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU && llama_moe_env_flag("LLAMA_MOE_MAILBOX_ON_CPU", false);
    if (!cuda && !cpu_test) {
        return nullptr; // the scheduler's path: the mailbox needs host memory the device can poll
    }

    std::unique_ptr<llama_moe_mailbox> mb(new llama_moe_mailbox());
    mb->cache      = &cache;
    // the thread that drives the device keeps a core; on the H200 host (16 cores) a part with experts to
    // compute took 114 us with 15 threads, 141 with 12 and 168 with 8 (docs/benchmarks.md)
    mb->n_threads  = (int) llama_moe_env_int("LLAMA_MOE_MAILBOX_THREADS", std::max(1, n_threads - 1), 1, 1024);
    mb->all_on_gpu = all_on_gpu;
    mb->n_used     = cache.get_n_expert_used();
    if (mb->n_used > 64) {
        // the slot marks the rows of y the CPU computed in 64 bits
        LLAMA_LOG_WARN("llama_moe_cache: mailbox: %lld experts a token, more than its 64; the hybrid hands over through the scheduler\n",
                       (long long) mb->n_used);
        return nullptr;
    }
    mb->timeout = (int32_t) llama_moe_env_int("LLAMA_MOE_MAILBOX_TIMEOUT_MS", LLAMA_MOE_MAILBOX_TIMEOUT_MS, 1, 3600 * 1000);
    mb->fuse    = llama_moe_env_flag("LLAMA_MOE_MAILBOX_FUSE", true);
    const llama_moe_test_switches & test = cache.get_test_switches();
    if (test.mailbox_empty) {
        mb->test_empty = true;
        LLAMA_LOG_WARN("llama_moe_cache: mailbox: LLAMA_MOE_MAILBOX_TEST_EMPTY: the CPU computes none of its experts; the output is wrong (a timing test)\n");
    }
    mb->test_delay_us = test.mailbox_delay_us;
    if (mb->test_delay_us > 0) {
        LLAMA_LOG_WARN("llama_moe_cache: mailbox: LLAMA_MOE_MAILBOX_TEST_DELAY_US: the CPU side waits %d us before each record (a test)\n",
                       mb->test_delay_us);
    }
    mb->stall_il = test.mailbox_stall_il;
    if (mb->stall_il >= 0) {
        LLAMA_LOG_WARN("llama_moe_cache: mailbox: LLAMA_MOE_MAILBOX_TEST_STALL: layer %d will not be answered until a decode "
                       "has failed on it (a test)\n", mb->stall_il.load());
    }

    // the layers that hand over (those the cache holds in part), each a slot: its input, ids and output
    struct slot_shape { int il; int64_t n_x, n_y; };
    std::vector<slot_shape> shapes;
    size_t total = 256; // room to align the slots
    int max_il = -1;
    for (const auto & l : cache.get_layers()) {
        if (!l.whole && l.cpu_map != nullptr) {
            if (l.n_used != mb->n_used) {
                // a slot holds one count of ids for all its layers
                LLAMA_LOG_INFO("%s: mailbox: the layers select different numbers of experts a token; the hybrid hands over "
                               "through the scheduler\n", __func__);
                return nullptr;
            }
            const ggml_tensor * in = l.src[0] ? l.src[0] : l.src[1]; // the gate, or the up projection of gate-less experts
            shapes.push_back({ l.il, in->ne[0], l.src[2]->ne[1] * mb->n_used });
            total += ggml_mailbox_slot_size(shapes.back().n_x, mb->n_used, shapes.back().n_y);
            max_il = std::max(max_il, l.il);
        }
    }
    if (shapes.empty()) {
        return nullptr; // every layer is held whole: nothing to hand over
    }
    // the CPU parts' ids, then the abort flag the slots share
    const size_t ids_bytes = GGML_PAD(shapes.size() * mb->n_used * sizeof(int32_t) + sizeof(int32_t), 256);
    total += ids_bytes;
    ggml_backend_buffer_type_t buft = cuda ? ggml_backend_dev_host_buffer_type(dev) : ggml_backend_cpu_buffer_type();
    mb->buf = buft ? ggml_backend_buft_alloc_buffer(buft, total) : nullptr;
    // a CUDA host buffer falls back to ordinary memory (GGML_CUDA_NO_PINNED, or no page-locked memory left),
    // which the GPU cannot reach
    if (mb->buf == nullptr || (cuda && strstr(ggml_backend_buffer_name(mb->buf), "Host") == nullptr)) {
        LLAMA_LOG_WARN("llama_moe_cache: no page-locked memory for the mailbox (%zu bytes); the hybrid hands over through the scheduler\n", total);
        return nullptr;
    }
    char * base = (char *) GGML_PAD((uintptr_t) ggml_backend_buffer_get_base(mb->buf), 256);
    mb->buf_slots_cpu = ggml_backend_cpu_buffer_from_ptr(base, total - 256);
    if (mb->buf_slots_cpu == nullptr) {
        return nullptr;
    }
    mb->cpu_ids_data = (int32_t *) (base + total - 256 - ids_bytes);
    mb->abort_flag   = mb->cpu_ids_data + shapes.size() * mb->n_used;
    *mb->abort_flag  = 0;
    mb->part_of_il.assign(max_il + 1, -1);
    for (const auto & s : shapes) {
        layer_part p;
        p.il   = s.il;
        p.slot = (ggml_mailbox_slot *) base;
        ggml_mailbox_slot_init(p.slot, s.n_x, mb->n_used, s.n_y);
        p.slot->abort           = mb->abort_flag;
        p.slot->send_timeout_ms = mb->timeout;
        base += ggml_mailbox_slot_size(s.n_x, mb->n_used, s.n_y);
        mb->part_of_il[s.il] = (int) mb->parts.size();
        mb->parts.push_back(std::move(p));
    }
    GGML_ASSERT((char *) mb->cpu_ids_data >= base);
    mb->done.reset(new std::atomic<uint64_t>[mb->parts.size()]);
    for (const auto & l : cache.get_layers()) {
        if (l.il < (int) mb->part_of_il.size() && mb->part_of_il[l.il] >= 0) {
            layer_part & p = mb->parts[mb->part_of_il[l.il]];
            GGML_ASSERT(l.dst[2]->ne[2] > l.n_slots); // the null slot follows the others
            p.layer      = &l;
            p.slot_map   = l.slot_map;
            p.miss_slot  = l.n_slots;
            p.host_first = (int32_t) l.dst[2]->ne[2];
        }
    }
    for (size_t i = 0; i < mb->parts.size(); ++i) {
        GGML_ASSERT(mb->parts[i].layer != nullptr);
        mb->done[i] = 0;
    }
    if (cuda) {
        // each slot's step count in device memory: the device keeps it without a round trip over the bus
        mb->buf_steps = ggml_backend_buft_alloc_buffer(ggml_backend_dev_buffer_type(dev), mb->parts.size() * 2 * sizeof(uint64_t));
        if (mb->buf_steps == nullptr) {
            LLAMA_LOG_WARN("llama_moe_cache: no device memory for the mailbox's step counts; the hybrid hands over through the scheduler\n");
            return nullptr;
        }
        ggml_backend_buffer_clear(mb->buf_steps, 0);
        uint64_t * steps = (uint64_t *) ggml_backend_buffer_get_base(mb->buf_steps);
        for (size_t i = 0; i < mb->parts.size(); ++i) {
            mb->parts[i].slot->step_dev = steps + 2 * i;
        }
    }

    const char * share_env = llama_moe_env_str("LLAMA_MOE_MAILBOX_GPU_SHARE");
    const float share = llama_moe_env_float("LLAMA_MOE_MAILBOX_GPU_SHARE", LLAMA_MOE_MAILBOX_GPU_SHARE, 0.0f, 1.0f);
    std::string why;
    if (share > 0.0f && !mb->set_host_reads((int32_t) (share * 1000.0f + 0.5f), cuda, why)) {
        // a warning where the share was asked for, a note where it is the default
        llama_log_internal(share_env ? GGML_LOG_LEVEL_WARN : GGML_LOG_LEVEL_INFO,
                           "llama_moe_cache: mailbox: the CPU computes every miss (LLAMA_MOE_MAILBOX_GPU_SHARE=%.2f has no effect): %s\n",
                           share, why.c_str());
    }

    // the routes the sends write and the device's experts read
    ggml_init_params rp = { mb->parts.size() * ggml_tensor_overhead(), nullptr, true };
    mb->ctx_routes = ggml_init(rp);
    GGML_ASSERT(mb->ctx_routes != nullptr);
    for (auto & p : mb->parts) {
        p.route = ggml_new_tensor_2d(mb->ctx_routes, GGML_TYPE_I32, 1, mb->n_used);
        ggml_format_name(p.route, "moe_mailbox_route.%d", p.il);
    }
    mb->buf_routes = ggml_backend_alloc_ctx_tensors_from_buft(mb->ctx_routes, cuda ? ggml_backend_dev_buffer_type(dev) : ggml_backend_cpu_buffer_type());
    if (mb->buf_routes == nullptr) {
        LLAMA_LOG_WARN("llama_moe_cache: no device memory for the mailbox's routes; the hybrid hands over through the scheduler\n");
        return nullptr;
    }
    ggml_backend_buffer_clear(mb->buf_routes, 0);

    ggml_threadpool_params tpp = ggml_threadpool_params_default(1);
    mb->tp_one = ggml_threadpool_new(&tpp);
    if (mb->tp_one == nullptr) {
        LLAMA_LOG_WARN("llama_moe_cache: cannot start the mailbox's CPU threads; the hybrid hands over through the scheduler\n");
        return nullptr;
    }
    // the mailbox's own thread leads the team
    mb->team.reset(new llama_moe_cpu_team(mb->n_threads));
    mb->worker = std::thread(&llama_moe_mailbox::run, mb.get());
    LLAMA_LOG_INFO("llama_moe_cache: mailbox: %zu layers hand over to %d CPU threads through %.2f MiB of %s memory%s\n",
                   mb->parts.size(), mb->n_threads, total / 1024.0 / 1024.0, cuda ? "page-locked" : "host",
                   all_on_gpu ? "; the rest of a one-token graph's CPU work on 1 thread" : "");
    if (mb->gpu_share_milli > 0) {
        LLAMA_LOG_INFO("llama_moe_cache: mailbox: the %s reads %.0f%% of a layer's misses (at least one) from the host copy itself, "
                       "the CPU computes the rest (LLAMA_MOE_MAILBOX_GPU_SHARE=%.2f)\n",
                       cuda ? "GPU" : "device", mb->gpu_share_milli / 10.0, mb->gpu_share_milli / 1000.0);
    }
    return mb;
}

bool llama_moe_mailbox::set_host_reads(int32_t share_milli, bool cuda, std::string & why) {
    if (!fuse) {
        why = "LLAMA_MOE_MAILBOX_FUSE=0 builds no route";
        return false;
    }
    ggml_backend_dev_t dev = cache->get_device();
    // the most rows of one token the device's MUL_MAT_ID reads host experts for (CUDA: those MMVQ takes)
    int rows_max = INT32_MAX;
    if (cuda) {
        auto fn = (ggml_mailbox_host_rows_max_t) ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev), "ggml_mailbox_host_rows_max");
        const char * name = ggml_backend_dev_name(dev);
        rows_max = fn && strncmp(name, "CUDA", 4) == 0 ? fn(atoi(name + 4), cache->get_layers().front().dst[2]->type) : 0;
    }
    if (n_used < 2 || n_used > rows_max) {
        why = "the device's kernel does not read " + std::to_string(n_used) + " experts a token from host memory";
        return false;
    }
    ggml_backend_buffer_type_t host_buft = cuda ? ggml_backend_dev_host_buffer_type(dev) : nullptr;
    int n_layers = 0;
    for (auto & p : parts) {
        const llama_moe_cache_layer * layer = p.layer;
        bool ok = !layer->has_bias;
        if (layer->has_bias) {
            why = "the experts have biases, which the device keeps by slot";
        }
        for (int k = 0; k < 3 && ok; ++k) {
            const ggml_tensor * src = layer->src[k];
            const ggml_tensor * dst = layer->dst[k];
            if (src == nullptr) {
                continue;
            }
            // page-locked memory of the device's host buffer type (a model loaded with use_mmap=False), which the GPU
            // reads at the same address; memory-mapped experts are ordinary pages it cannot reach
            const bool reachable = src->buffer != nullptr && (cuda ? ggml_backend_buffer_get_type(src->buffer) == host_buft
                                                                   : ggml_backend_buffer_is_host(src->buffer));
            if (!reachable) {
                why = std::string("the experts in RAM are not in page-locked memory (") +
                      (src->buffer ? ggml_backend_buffer_name(src->buffer) : "no buffer") + "; load the model with use_mmap=False)";
                ok = false;
            } else if (src->type != dst->type || src->nb[1] != dst->nb[1] || src->nb[2] != dst->nb[2] || src->ne[0] != dst->ne[0] ||
                       src->ne[1] != dst->ne[1] || !ggml_is_quantized(src->type) || src->view_src != nullptr) {
                why = "the cache's copies differ in layout from the experts in RAM";
                ok = false;
            }
        }
        if (!ok) {
            continue;
        }
        for (int k = 0; k < 3; ++k) {
            if (layer->src[k] != nullptr) {
                ggml_mailbox_set_host_experts(layer->dst[k], layer->src[k], p.host_first);
            }
        }
        p.share_milli = share_milli;
        n_layers++;
    }
    if (n_layers == 0) {
        return false;
    }
    gpu_share_milli = share_milli;
    return true;
}

ggml_tensor * llama_moe_mailbox::send_routed(ggml_context * ctx, int il, ggml_tensor * x, ggml_tensor * ids, int64_t n_rep) const {
    const layer_part & p = parts[part_of_il.at(il)];
    return ggml_mailbox_send_routed(ctx, x, ids, p.slot_map, p.route, p.slot, n_rep, p.miss_slot, p.host_first, p.share_milli);
}

llama_moe_mailbox::~llama_moe_mailbox() {
    {
        std::lock_guard<std::mutex> lock(mutex);
        stop = true;
    }
    cv.notify_all();
    if (worker.joinable()) {
        worker.join();
    }
    const uint64_t n = n_handover.load();
    if (n > 0) {
        const uint64_t nw = std::max<uint64_t>(n_wait.load(), 1);
        // the reference's line, then the CPU's own part, which the GPU overlaps with the experts it holds
        LLAMA_LOG_INFO("llama_moe_cache: mailbox: the CPU waited %.1f us on average for each of %" PRIu64 " hand-overs from the GPU; "
                       "its part of a layer took %.1f us on average, %" PRIu64 " of them with no expert to compute\n",
                       (double) t_wait_us.load() / nw, n, (double) t_compute_us.load() / n, n_empty.load());
        const uint64_t n_busy = n - n_empty.load();
        if (n_busy > 0 && t_products_us.load() > 0) {
            // where the others' time goes: the products read the experts from RAM, the rest is serial
            LLAMA_LOG_INFO("llama_moe_cache: mailbox: a part with experts to compute took %.1f us, its expert products %.1f us "
                           "reading %.2f MB (%.1f GB/s) on %d threads; the cache's lookup %.1f us, quantizing and listing rows "
                           "%.1f us, the other nodes %.1f us\n",
                           (double) t_busy_us.load() / n_busy, (double) t_products_us.load() / n_busy,
                           n_products_bytes.load() / 1e6 / n_busy, n_products_bytes.load() / 1e3 / t_products_us.load(), n_threads,
                           (double) t_lookup_us.load() / n_busy, (double) t_prepare_us.load() / n_busy,
                           (double) t_nodes_us.load() / n_busy);
        }
        if (fuse) {
            LLAMA_LOG_INFO("llama_moe_cache: mailbox: %" PRIu64 " hand-overs had nothing for the CPU (the device did not wait); "
                           "the device read %" PRIu64 " missed experts from the host copy itself (LLAMA_MOE_MAILBOX_GPU_SHARE=%.2f); "
                           "%" PRIu64 " records lost after a timeout\n",
                           n_no_wait.load(), n_rows_gpu.load(), gpu_share_milli / 1000.0, n_lost.load());
        }
    }
    for (auto & p : parts) {
        for (int k = 0; k < 3 && p.share_milli > 0; ++k) {
            if (p.layer->dst[k] != nullptr) {
                ggml_mailbox_set_host_experts(p.layer->dst[k], nullptr, 0); // the cache outlives this mailbox
            }
        }
    }
    team.reset();
    if (tp_one) {
        ggml_threadpool_free(tp_one);
    }
    for (auto & p : parts) {
        if (p.galloc) {
            ggml_gallocr_free(p.galloc);
        }
    }
    if (ctx_cpu) {
        ggml_free(ctx_cpu);
    }
    if (buf_slots_cpu) {
        ggml_backend_buffer_free(buf_slots_cpu);
    }
    if (buf_steps) {
        ggml_backend_buffer_free(buf_steps);
    }
    if (buf_routes) {
        ggml_backend_buffer_free(buf_routes);
    }
    if (ctx_routes) {
        ggml_free(ctx_routes);
    }
    if (buf) {
        ggml_backend_buffer_free(buf);
    }
}

ggml_mailbox_slot * llama_moe_mailbox::slot(int il) const {
    if (!building || il < 0 || il >= (int) part_of_il.size() || part_of_il[il] < 0) {
        return nullptr;
    }
    return parts[part_of_il[il]].slot;
}

void llama_moe_mailbox::begin_graph() {
    // the previous graph is done on the device, but the CPU side may still be reading its last records, which
    // it must count, and it must not compute a rebuilt part for an old step
    drain();
    in_decode = false;
    std::lock_guard<std::mutex> lock(graph_mutex);
    graph_hands_over = false;
    if (ctx_cpu) {
        ggml_free(ctx_cpu);
    }
    const size_t n_nodes = 128; // per layer: a MoE FFN's expert chain is a few dozen nodes
    const size_t n_steps = 16;  // llama_moe_cpu_part's graphs of a layer: one between each two expert products
    ggml_init_params ip = { parts.size() * (n_nodes * ggml_tensor_overhead() + (1 + n_steps) * ggml_graph_overhead_custom(n_nodes, false)), nullptr, true };
    ctx_cpu = ggml_init(ip);
    GGML_ASSERT(ctx_cpu != nullptr);
    for (size_t i = 0; i < parts.size(); ++i) {
        layer_part & p = parts[i];
        const int64_t n_out = p.slot->n_y / n_used;
        p.x   = ggml_new_tensor_3d(ctx_cpu, GGML_TYPE_F32, p.slot->n_x, 1, 1);
        p.ids = ggml_new_tensor_2d(ctx_cpu, GGML_TYPE_I32, n_used, 1);
        p.y   = ggml_new_tensor_3d(ctx_cpu, GGML_TYPE_F32, n_out, n_used, 1);
        // in the slot and in our own memory: the graph allocator leaves allocated tensors alone
        ggml_backend_tensor_alloc(buf_slots_cpu, p.x, ggml_mailbox_slot_x(p.slot));
        ggml_backend_tensor_alloc(buf_slots_cpu, p.ids, cpu_ids_data + i * n_used);
        ggml_backend_tensor_alloc(buf_slots_cpu, p.y, ggml_mailbox_slot_y(p.slot));
        p.gf    = ggml_new_graph_custom(ctx_cpu, n_nodes, false);
        p.ready = false;
    }
    building = true;
}

ggml_tensor * llama_moe_mailbox::cpu_x(int il) {
    return parts[part_of_il.at(il)].x;
}

ggml_tensor * llama_moe_mailbox::cpu_ids(int il) {
    return parts[part_of_il.at(il)].ids;
}

void llama_moe_mailbox::set_cpu_part(int il, ggml_tensor * out) {
    layer_part & p = parts[part_of_il.at(il)];
    GGML_ASSERT(ggml_nelements(out) == p.slot->n_y && out->type == GGML_TYPE_F32);
    if (out->view_src == nullptr && out->data == nullptr && ggml_is_contiguous(out) && ggml_are_same_shape(out, p.y)) {
        // the last node writes the result into the slot itself: no copy of every row after it
        ggml_backend_tensor_alloc(buf_slots_cpu, out, ggml_mailbox_slot_y(p.slot));
        ggml_build_forward_expand(p.gf, out);
        return;
    }
    ggml_build_forward_expand(p.gf, ggml_cpy(ctx_cpu, out, p.y));
}

void llama_moe_mailbox::end_graph() {
    std::lock_guard<std::mutex> lock(graph_mutex);
    building = false;
    for (auto & p : parts) {
        if (ggml_graph_n_nodes(p.gf) == 0) {
            continue; // not a one-token layer in this graph
        }
        if (p.galloc == nullptr) {
            p.galloc = ggml_gallocr_new(ggml_backend_cpu_buffer_type());
        }
        if (!ggml_gallocr_alloc_graph(p.galloc, p.gf)) {
            // the part answers with an error: the decode fails rather than computing garbage
            LLAMA_LOG_ERROR("llama_moe_cache: mailbox: cannot allocate the CPU's part of layer %d\n", p.il);
            continue;
        }
        ggml_cplan plan = ggml_graph_plan(p.gf, 1, tp_one);
        size_t work_size = plan.work_size;
        std::string why;
        if (!p.steps) {
            p.steps.reset(new llama_moe_cpu_part());
        }
        if (p.steps->plan(ctx_cpu, p.gf, tp_one, why)) {
            work_size = std::max(work_size, p.steps->work_size());
        } else {
            p.steps.reset();
            if (!warned_slow) {
                LLAMA_LOG_WARN("llama_moe_cache: mailbox: layer %d's CPU part runs on one thread: %s\n", p.il, why.c_str());
                warned_slow = true;
            }
        }
        work.resize(std::max<size_t>({work_size, work.size(), 1}));
        p.ready = true;
        graph_hands_over = true;
    }
    if (!graph_hands_over && !said_scheduler) {
        // mostly a graph of several tokens (a prompt, or several sequences at once): its CPU threads are busy
        // with the other layers, and the mailbox's polling would compete with them for the cores
        LLAMA_LOG_INFO("llama_moe_cache: mailbox: graphs with no one-token layer to hand over (prompts, several sequences "
                       "at once) compute the CPU's experts through the scheduler; one-token graphs hand them over\n");
        said_scheduler = true;
    }
}

void llama_moe_mailbox::wake() {
    {
        std::lock_guard<std::mutex> lock(mutex);
        in_decode = true;
        new_graph = true;
        wake_until_us = llama_moe_now_us() + LLAMA_MOE_MAILBOX_AWAKE_US;
    }
    cv.notify_all();
    team->keep_awake(LLAMA_MOE_MAILBOX_AWAKE_US);
}

void llama_moe_mailbox::drain() {
    // the device does not wait for the steps without rows for the CPU: their records may still be unread
    const int64_t t_end = llama_moe_now_us() + (int64_t) timeout * 1000;
    for (size_t i = 0; i < parts.size(); ++i) {
        while (parts[i].il != stall_il && done[i].load(std::memory_order_acquire) != parts[i].slot->stamp_in) {
            if (llama_moe_now_us() > t_end) {
                LLAMA_LOG_WARN("%s: mailbox: layer %d: the CPU side did not read the last hand-over within "
                               "LLAMA_MOE_MAILBOX_TIMEOUT_MS; its counts may lack it\n", __func__, parts[i].il);
                return;
            }
            llama_moe_cpu_relax();
        }
    }
}

bool llama_moe_mailbox::take_errors() {
    bool ok = !failed.exchange(false);
    int n_aborted = 0;
    for (auto & p : parts) {
        const int32_t err = p.slot->error;
        if (err == GGML_MAILBOX_ABORTED) {
            n_aborted++;
        } else if (err != GGML_MAILBOX_OK) {
            LLAMA_LOG_ERROR("%s: mailbox: layer %d: %s; this decode's output is wrong\n", __func__, p.il,
                            err == GGML_MAILBOX_TIMEOUT  ? "the CPU's part did not come within LLAMA_MOE_MAILBOX_TIMEOUT_MS" :
                            err == GGML_MAILBOX_DISAGREE ? "the device's slot map and the CPU's disagree on which experts the cache holds"
                                                         : "the CPU's part could not be computed");
        }
        ok = ok && err == GGML_MAILBOX_OK;
        p.slot->error = GGML_MAILBOX_OK;
    }
    if (!ok && stall_il >= 0) {
        // the stall switch has done its work: the failed decode's records of the layer are dropped unread, and
        // the layer is answered again
        for (size_t i = 0; i < parts.size(); ++i) {
            if (parts[i].il == stall_il) {
                parts[i].slot->stamp_read = parts[i].slot->stamp_in;
                done[i].store(parts[i].slot->stamp_in, std::memory_order_release);
            }
        }
        stall_il = -1;
    }
    if (n_aborted > 0) {
        LLAMA_LOG_ERROR("%s: mailbox: %d later layers did not wait for the CPU side after that\n", __func__, n_aborted);
    }
    *abort_flag = 0; // the device is idle: the next decode waits again
    return ok;
}

bool llama_moe_mailbox::end_decode() {
    drain();
    in_decode = false;
    return take_errors();
}

void llama_moe_mailbox::idle() {
    drain();
    in_decode = false;
    take_errors(); // a decode that returned early has said why; what the mailbox saw is logged, then cleared
}

void llama_moe_mailbox::answer(size_t i, uint64_t step, bool latest) {
    const int64_t t0 = llama_moe_now_us();
    std::lock_guard<std::mutex> lock(graph_mutex);
    layer_part & p = parts[i];
    if (test_delay_us > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(test_delay_us)); // a slow CPU side (a test)
    }
    std::atomic_thread_fence(std::memory_order_acquire); // the stamp before the record
    const ggml_mailbox_record * rec = ggml_mailbox_slot_record(p.slot, step);
    int32_t selected[64];
    const bool     valid    = rec->step == step;
    std::atomic_thread_fence(std::memory_order_acquire); // the record's step before the record
    memcpy(selected, rec->ids, n_used * sizeof(int32_t));
    const bool     routed   = rec->routed != 0;
    const uint64_t rows_cpu = rec->rows_cpu;
    const uint64_t rows_gpu = rec->rows_gpu;
    std::atomic_thread_fence(std::memory_order_release); // the record read before the device may overwrite it
    p.slot->stamp_read = step;
    done[i].store(step, std::memory_order_release);
    if (!valid) {
        // only after a timeout: the device gave up on the ring and went on (the decode fails)
        n_lost++;
        return;
    }
    int32_t * ids = cpu_ids_data + i * n_used;
    cache->count_selected(p.il, selected, ids);
    uint64_t rows = 0; // the rows of y the CPU computes: the device reads only those
    bool disagree = false;
    for (int64_t k = 0; k < n_used; ++k) {
        const bool miss = ids[k] >= 0;
        disagree |= routed && miss != (((rows_cpu | rows_gpu) >> k & 1) != 0);
        if (rows_gpu >> k & 1) {
            ids[k] = -1; // the device reads it from the host copy
            n_rows_gpu++;
        }
        rows |= (uint64_t) (ids[k] >= 0 && !test_empty) << k;
    }
    const int64_t t_lookup = llama_moe_now_us() - t0;
    if (routed && rows_cpu == 0) {
        n_no_wait++; // the device went on without an answer
    }
    if (disagree) {
        p.slot->error = GGML_MAILBOX_DISAGREE; // fail the decode rather than leave an expert out
        rows = 0;
    } else if (rows == 0) {
        // the cache holds every expert the token chose here: nothing to compute, nothing for the device to
        // read, whatever graph the part now has
        n_empty++;
    } else if (!latest) {
        // the device has moved past a step with rows for the CPU: its wait timed out, its x may be gone
        rows = 0;
    } else if (p.ready) {
        ggml_status st;
        if (p.steps) {
            st = p.steps->compute(*team, tp_one, work.data());
            t_products_us    += p.steps->products_us();
            n_products_bytes += p.steps->products_bytes();
            t_prepare_us     += p.steps->prepare_us();
            t_nodes_us       += p.steps->nodes_us();
        } else {
            ggml_cplan plan = ggml_graph_plan(p.gf, 1, tp_one);
            GGML_ASSERT(plan.work_size <= work.size());
            plan.work_data = work.data();
            st = ggml_graph_compute(p.gf, &plan);
        }
        if (st != GGML_STATUS_SUCCESS) {
            p.slot->error = GGML_MAILBOX_CPU_FAILED;
            rows = 0;
        }
    } else {
        p.slot->error = GGML_MAILBOX_CPU_FAILED; // rows for a graph we do not have: fail loudly rather than answer garbage
        rows = 0;
    }
    p.slot->y_rows = rows;
    std::atomic_thread_fence(std::memory_order_release); // the payload before the stamp
    p.slot->stamp_out = step;
    n_handover++;
    const int64_t dt = llama_moe_now_us() - t0;
    t_compute_us += dt;
    if (rows != 0) {
        t_busy_us   += dt;
        t_lookup_us += t_lookup;
    }
}

void llama_moe_mailbox::run() {
    int64_t t_idle = 0;   // when the last answer went out
    size_t  i_last = 0;   // its layer: a later layer's hand-over is the same token's, so the gap was a wait
    while (!stop) {
        if (new_graph.exchange(false)) {
            t_idle = 0; // the time between two graphs is not a wait for the device
        }
        const int64_t now = llama_moe_now_us();
        if (!in_decode && now > wake_until_us) {
            std::unique_lock<std::mutex> lock(mutex);
            cv.wait(lock, [&] { return stop.load() || in_decode.load(); });
            t_idle = 0;
            continue;
        }
        if (now > wake_until_us + LLAMA_MOE_MAILBOX_DROWSY_US) {
            // a decode with nothing to hand over for a while (a long prompt, or one that ended early): poll
            // gently, the next hand-over waits at most a millisecond
            std::unique_lock<std::mutex> lock(mutex);
            cv.wait_for(lock, std::chrono::milliseconds(1), [&] { return stop.load(); });
        }
        bool any = false;
        for (size_t i = 0; i < parts.size(); ++i) {
            const uint64_t in   = parts[i].slot->stamp_in;
            const uint64_t last = done[i].load(std::memory_order_relaxed);
            if (in != last && parts[i].il != stall_il) {
                if (t_idle > 0 && i > i_last) {
                    t_wait_us += llama_moe_now_us() - t_idle;
                    n_wait++;
                }
                // every step in order: the ring holds the records of those the device did not wait for
                for (uint64_t step = last + 1; step <= in; ++step) {
                    answer(i, step, step == in);
                }
                any = true;
                t_idle = llama_moe_now_us();
                i_last = i;
            }
        }
        if (any) {
            wake_until_us = llama_moe_now_us() + LLAMA_MOE_MAILBOX_AWAKE_US;
            team->keep_awake(LLAMA_MOE_MAILBOX_AWAKE_US);
        } else {
            llama_moe_cpu_relax();
        }
    }
}

bool llama_moe_mailbox::model_on_gpu(const llama_model & model) {
    bool on_gpu = ggml_backend_dev_type(model.dev_output()) != GGML_BACKEND_DEVICE_TYPE_CPU;
    for (uint32_t il = 0; il < model.hparams.n_layer(); ++il) {
        on_gpu = on_gpu && ggml_backend_dev_type(model.dev_layer(il)) != GGML_BACKEND_DEVICE_TYPE_CPU;
    }
    return on_gpu;
}

llama_moe_mailbox_idle_on_return::~llama_moe_mailbox_idle_on_return() {
    if (mailbox) {
        ggml_backend_sched_synchronize(sched);
        mailbox->idle();
    }
}

void llama_moe_mailbox_forget_batch(const llama_batch & batch, llama_memory_i & memory) {
    std::vector<llama_pos> pos_min(LLAMA_MAX_SEQ, std::numeric_limits<llama_pos>::max());
    for (int32_t i = 0; i < batch.n_tokens; ++i) {
        for (int32_t j = 0; j < batch.n_seq_id[i]; ++j) {
            pos_min[batch.seq_id[i][j]] = std::min(pos_min[batch.seq_id[i][j]], batch.pos[i]);
        }
    }
    for (int s = 0; s < LLAMA_MAX_SEQ; ++s) {
        if (pos_min[s] != std::numeric_limits<llama_pos>::max()) {
            memory.seq_rm(s, pos_min[s], -1);
        }
    }
}
