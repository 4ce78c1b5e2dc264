#pragma once

#include "llama-graph.h"

// the expert tensors llm_graph_context::build_moe_ffn_experts multiplies: the model's, or a llama_moe cache's
struct llm_graph_moe_chain {
    ggml_tensor * gate_up, * gate, * up, * down;
    ggml_tensor * ids;                        // the matmuls' expert ids
    ggml_tensor * gate_up_b, * gate_b, * up_b, * down_b;
    ggml_tensor * bias_ids;                   // the biases' expert ids
    ggml_tensor * up_s, * gate_s, * down_s;
};

// llama_moe's part of llm_graph_context::build_moe_ffn, between its router and its weighted sum of the experts:
// the expert chain (build_moe_ffn_experts) runs once per source of experts (llama-moe-cache.h), the model's, the
// cache's copies indexed by slot, or in hybrid mode both, summed; in one-token decoding the CPU's experts go
// through the mailbox (llama-moe-mailbox.h). model: the model's own chain. Returns the layer's output, as
// build_moe_ffn does.
ggml_tensor * llama_moe_graph_build_ffn(
        const llm_graph_context   & gctx,
        ggml_tensor               * cur,
        const llm_graph_moe_chain & model,
        ggml_tensor               * weights,
        int64_t                     n_expert_used,
        llm_ffn_op_type             type_op,
        int                         il);
