#pragma once

#include "ggml-backend.h"

#include <cstdint>
#include <map>
#include <string>

// GGML_SCHED_PROFILE=1: where a graph's time goes, each backend's compute and the copies and waits between
// them, by graph shape (a generated token's graph is one shape), printed to stderr at exit.
// One per ggml_backend_sched_compute_splits call; every call does nothing when the profile is off.
struct ggml_sched_profile_graph {
    ggml_sched_profile_graph();

    void split_start();                       // before a split's input copies
    void compute_start(int n_nodes);          // before its compute
    void compute_end(ggml_backend_t backend); // after it: waits for the backend, so that its time is its own
    void end(int n_splits);                   // adds the graph to its shape's totals

    const bool on;

  private:
    int64_t t_graph_start   = 0;
    int64_t t_split_start   = 0;
    int64_t t_compute_start = 0;
    int64_t t_copy_us       = 0;
    int     n_nodes         = 0;
    std::map<std::string, double> t_compute_us;
};
