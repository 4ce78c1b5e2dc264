#pragma once

// Per-sequence shares of the MoE cache's lookups (llama-server: per slot, so per request).
//
// The rule: every distinct expert a ubatch selects in a layer counts once in the cache's totals (a hit, a miss
// or a refused selection, with the bytes its miss uploaded or the CPU read), and that one count goes whole to
// the sequence of the first token of the ubatch, in ubatch order, that selected it (a token's first sequence
// id). Nothing is split or counted twice, so the sequences' counts add up exactly to the totals. A sequence that
// shares a ubatch with others pays for what it selected first and rides free on what they did: over many ubatches
// the order of the tokens in a ubatch, not the rule, decides who pays for a shared expert.
//
// Not a sequence's: the uploads between decodes (the hybrid's admissions, the adaptive cache's swaps), which are
// the cache's own upkeep, and the copies of large batches, which are not lookups.

#include "llama.h"

#include <cstdint>
#include <vector>

struct llama_ubatch;

struct llama_moe_accounting {
    enum kind { HIT, MISS, REFUSED };

    // the owners of the tokens of the ubatch about to be computed
    void set_owners(const llama_ubatch & ubatch);

    // one distinct expert's count, first selected by token i of the current ubatch
    void charge(int64_t i, kind k, uint64_t bytes_upload, uint64_t bytes_cpu);

    // the sequence's counters since the context was created (zeros for one that never looked anything up)
    llama_moe_cache_seq_stats get(llama_seq_id seq) const;

    std::vector<llama_seq_id>              owner;  // token of the current ubatch -> its first sequence, -1 none
    std::vector<llama_moe_cache_seq_stats> by_seq; // sequence -> counters
    llama_moe_cache_seq_stats              none = {}; // tokens with no sequence (not through llama_decode)
};
