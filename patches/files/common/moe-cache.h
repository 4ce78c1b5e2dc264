#pragma once

// llama_moe: what the MoE expert cache reports to operators, for every tool built on common: the Prometheus
// series of llama-server's /metrics, the per-request log line, and the JSONL audit log (--moe-cache-audit).

#include "arg.h"
#include "llama.h"

#include <cstdint>
#include <functional>
#include <string>

struct common_params;

// llama_moe's options (--moe-cache-*), for common_params_parser_init to add where --help lists them
void common_moe_cache_add_args(const std::function<void(common_arg)> & add_opt);

// the llamacpp:moe_cache_* series, or "" when ctx has no MoE cache
std::string common_moe_cache_metrics(const llama_context * ctx);

// a request's counters are the context's counters at its end minus at its start (req_*, every request's
// lookups while it ran); its own are its sequence's share at its end minus at its start (own_*,
// llama_moe_cache_get_seq_stats: each lookup charged to one sequence, so the requests' own add up to the context's)
struct common_moe_cache_request {
    bool                      valid = false;
    llama_moe_cache_stats     start = {};
    llama_seq_id              seq   = -1;
    llama_moe_cache_seq_stats own_start = {};
};

common_moe_cache_request common_moe_cache_request_begin(const llama_context * ctx, llama_seq_id seq = -1);

// logs "MoE cache hits = R % (...)" and appends the request record to the audit log, if there is one
void common_moe_cache_request_end(const llama_context * ctx, const common_moe_cache_request & req, int slot, int task,
                                  int n_prompt, int n_gen, double t_prompt_ms, double t_gen_ms);

// The audit log: one JSON object per line, each written with one open-append-close, so that it survives a
// crash up to the last record and several processes can share a file. "load" right after the context is
// created (before any warmup), "ready" once a server has loaded, "exit" when the context is freed.
// Also logs, at default verbosity, one line on the cache (on or off, size, slots, mode, device, the profile used or
// refused and why), and warns when there is an audit log but no cache to audit.
void common_moe_audit_load (const llama_context * ctx, const common_params & params, double load_ms);
void common_moe_audit_ready(const llama_context * ctx);
void common_moe_audit_exit (const llama_context * ctx);
