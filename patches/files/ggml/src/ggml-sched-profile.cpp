// GGML_SCHED_PROFILE (ggml-sched-profile.h)

#include "ggml-sched-profile.h"

#include "ggml-impl.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <mutex>

struct ggml_sched_profile_shape {
    uint64_t n_graphs   = 0;
    double   t_wall_us  = 0.0;
    double   t_copy_us  = 0.0; // input copies, and the synchronizations they wait on
    std::map<std::string, double> t_compute_us;
};

static std::mutex g_sched_profile_mutex;
static std::map<std::pair<int, int>, ggml_sched_profile_shape> g_sched_profile; // (splits, nodes) -> totals

static void ggml_sched_profile_print(void) {
    std::lock_guard<std::mutex> lock(g_sched_profile_mutex);
    fprintf(stderr, "ggml_sched_profile: per graph, by shape (splits, nodes); the backends' compute, then the copies and waits between them\n");
    for (const auto & [shape, p] : g_sched_profile) {
        const double n = (double) p.n_graphs;
        fprintf(stderr, "ggml_sched_profile: %4d splits %6d nodes: %8" PRIu64 " graphs, %9.3f ms each:", shape.first, shape.second,
                p.n_graphs, p.t_wall_us / n / 1e3);
        for (const auto & [name, t] : p.t_compute_us) {
            fprintf(stderr, " %s compute %.3f ms,", name.c_str(), t / n / 1e3);
        }
        fprintf(stderr, " copies and waits %.3f ms (%.1f us per split)\n", p.t_copy_us / n / 1e3, p.t_copy_us / n / std::max(shape.first, 1));
    }
}

static bool ggml_sched_profile_on(void) {
    static const bool on = [] {
        const char * env = getenv("GGML_SCHED_PROFILE");
        const bool v = env != nullptr && atoi(env) != 0;
        if (v) {
            atexit(ggml_sched_profile_print);
        }
        return v;
    }();
    return on;
}

ggml_sched_profile_graph::ggml_sched_profile_graph() : on(ggml_sched_profile_on()) {
    t_graph_start = on ? ggml_time_us() : 0;
}

void ggml_sched_profile_graph::split_start() {
    t_split_start = on ? ggml_time_us() : 0;
}

void ggml_sched_profile_graph::compute_start(int n_split_nodes) {
    t_compute_start = on ? ggml_time_us() : 0;
    if (on) {
        t_copy_us += t_compute_start - t_split_start;
        n_nodes   += n_split_nodes;
    }
}

void ggml_sched_profile_graph::compute_end(ggml_backend_t backend) {
    if (on) {
        ggml_backend_synchronize(backend);
        t_compute_us[ggml_backend_name(backend)] += (double) (ggml_time_us() - t_compute_start);
    }
}

void ggml_sched_profile_graph::end(int n_splits) {
    if (!on) {
        return;
    }
    std::lock_guard<std::mutex> lock(g_sched_profile_mutex);
    auto & p = g_sched_profile[{ n_splits, n_nodes }];
    p.n_graphs++;
    p.t_wall_us += (double) (ggml_time_us() - t_graph_start);
    p.t_copy_us += (double) t_copy_us;
    for (const auto & [name, t] : t_compute_us) {
        p.t_compute_us[name] += t;
    }
}
