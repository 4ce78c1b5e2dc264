#include "llama-moe-graph.h"

#include "llama-cparams.h"
#include "llama-moe-cache.h"
#include "llama-moe-mailbox.h"

// chain ic of a route, in build_moe_ffn_experts' terms; the scales stay the model's
static llm_graph_moe_chain llama_moe_graph_chain(const llama_moe_cache_route & route, int ic, const llm_graph_moe_chain & model) {
    const bool merged_gate_up = model.gate_up != nullptr;
    llm_graph_moe_chain chain = model;
    chain.gate_up   = merged_gate_up ? route.gate[ic] : nullptr;
    chain.gate      = merged_gate_up ? nullptr : route.gate[ic];
    chain.up        = merged_gate_up ? nullptr : route.up[ic];
    chain.down      = route.down[ic];
    chain.ids       = route.ids[ic];
    chain.gate_up_b = merged_gate_up ? route.gate_b[ic] : nullptr;
    chain.gate_b    = merged_gate_up ? nullptr : route.gate_b[ic];
    chain.up_b      = route.up_b[ic];
    chain.down_b    = route.down_b[ic];
    chain.bias_ids  = route.bias_ids[ic];
    return chain;
}

// chain ic of the route on in ([n_embd, 1 or n_expert_used, n_tokens]), built by gctx into its ctx0; a chain with
// one selected expert per row gets each token's activations once per expert, and gives back
// [n_embd, n_expert_used, n_tokens] like the others
static ggml_tensor * llama_moe_graph_chain_out(const llm_graph_context & gctx, const llama_moe_cache_route & route, int ic,
                                               const llm_graph_moe_chain & model, ggml_tensor * in, int64_t n_expert_used,
                                               llm_ffn_op_type type_op, int il) {
    ggml_context * ctx = gctx.ctx0;
    const int64_t n_embd = in->ne[0], n_tokens = in->ne[2];
    ggml_tensor * rows = in;
    if (route.one_id_per_row[ic]) {
        rows = in->ne[1] == 1          ? ggml_repeat_4d(ctx, in, n_embd, n_expert_used, n_tokens, 1)
             : ggml_is_contiguous(in) ? in : ggml_cont(ctx, in);
        rows = ggml_reshape_3d(ctx, rows, n_embd, 1, n_expert_used * n_tokens);
    }
    ggml_tensor * experts = gctx.build_moe_ffn_experts(rows, llama_moe_graph_chain(route, ic, model), type_op, il);
    if (route.cpu_only[ic]) {
        // its ids are -1 for the experts the cache holds, which only the CPU's mul_mat_id skips
        llama_moe_cache_pin_mul_mat_id(gctx.sched, gctx.backend_cpu, experts, rows);
    }
    return route.one_id_per_row[ic] ? ggml_reshape_3d(ctx, experts, n_embd, n_expert_used, n_tokens) : experts;
}

// one token of a layer the cache holds in part: the CPU's experts go through the mailbox (llama-moe-mailbox.h),
// computed by CPU threads while the device computes its own, not in a split (in a graph of one token only: in a
// longer one the CPU computes the other layers, and the mailbox's polling threads would compete with it for the
// cores)
static ggml_tensor * llama_moe_graph_mailbox(const llm_graph_context & gctx, llama_moe_cache_route route, ggml_mailbox_slot * slot,
                                             ggml_tensor * cur, const llm_graph_moe_chain & model, ggml_tensor * weights,
                                             int64_t n_expert_used, llm_ffn_op_type type_op, int il) {
    llama_moe_mailbox & mailbox = *gctx.moe_mailbox;
    ggml_context * ctx0 = gctx.ctx0;
    // with one selected expert per row (fused), the send writes the device's rows (the token's input once per
    // expert), and the recv adds the CPU's rows to the device's, weights and sums them: two kernels a layer
    const bool fused = mailbox.fused() && route.one_id_per_row[0];
    ggml_tensor * ids = ggml_is_contiguous(model.ids) ? model.ids : ggml_cont(ctx0, model.ids);
    // fused, the send also looks the device's experts up (its route, in place of the cache's lookup) and says
    // which misses the CPU computes and which the device reads from the host copy itself
    ggml_tensor * sent = fused ? mailbox.send_routed(ctx0, il, cur, ids, n_expert_used) : ggml_mailbox_send(ctx0, cur, ids, slot, 1);
    gctx.cb(sent, "ffn_moe_mailbox_send", il);
    if (fused) {
        route.ids[0] = route.bias_ids[0] = mailbox.route(il);
    }
    ggml_tensor * dev = llama_moe_graph_chain_out(gctx, route, 0, model, sent, n_expert_used, type_op, il);

    // the CPU part is built by the same code, into the mailbox's own graph: its context, its input and ids
    llm_graph_context cpu_gctx(gctx);
    cpu_gctx.ctx0 = mailbox.cpu_ctx();
    route.ids[1] = route.bias_ids[1] = mailbox.cpu_ids(il);
    route.cpu_only[1] = false;
    mailbox.set_cpu_part(il, llama_moe_graph_chain_out(cpu_gctx, route, 1, model, mailbox.cpu_x(il), n_expert_used, type_op, il));

    const bool weight_before_ffn = gctx.arch == LLM_ARCH_LLAMA4;
    if (fused && gctx.hparams.n_expert_used(il) == (uint32_t) n_expert_used) {
        // the recv also weights and sums the rows: the layer's output in one kernel, not a recv, a mul and an add
        ggml_tensor * moe_out = ggml_mailbox_recv_sum(ctx0, sent, dev, weight_before_ffn ? nullptr : weights, slot, mailbox.timeout_ms());
        gctx.cb(moe_out, "ffn_moe_out", il);
        return moe_out;
    }
    ggml_tensor * experts = nullptr;
    if (fused) {
        experts = ggml_mailbox_recv(ctx0, sent, dev, slot, true, mailbox.timeout_ms());
    } else {
        ggml_tensor * recv = ggml_mailbox_recv(ctx0, sent, dev, slot, false, mailbox.timeout_ms());
        gctx.cb(recv, "ffn_moe_mailbox_recv", il);
        experts = ggml_add(ctx0, dev, recv);
    }
    gctx.cb(experts, "ffn_moe_hybrid_sum", il);
    return gctx.build_moe_ffn_out(experts, weights, n_expert_used, il);
}

ggml_tensor * llama_moe_graph_build_ffn(
        const llm_graph_context   & gctx,
        ggml_tensor               * cur,
        const llm_graph_moe_chain & model,
        ggml_tensor               * weights,
        int64_t                     n_expert_used,
        llm_ffn_op_type             type_op,
        int                         il) {
    GGML_ASSERT(gctx.moe_cache != nullptr);
    ggml_context * ctx0 = gctx.ctx0;
    const int64_t n_tokens = cur->ne[2];

    // the model's own route: its tensors, biases and the selected experts as ids; the router weights keep the ids
    llama_moe_cache_route route;
    route.gate[0]     = model.gate_up ? model.gate_up : model.gate;
    route.up  [0]     = model.up;
    route.down[0]     = model.down;
    route.ids [0]     = model.ids;
    route.gate_b[0]   = model.gate_up ? model.gate_up_b : model.gate_b;
    route.up_b  [0]   = model.up_b;
    route.down_b[0]   = model.down_b;
    route.bias_ids[0] = model.bias_ids;
    route = gctx.moe_cache->build(ctx0, n_tokens, n_expert_used, gctx.cparams.warmup, route);

    ggml_mailbox_slot * slot = gctx.moe_mailbox && route.n == 2 && !route.mask[0] && gctx.ubatch.n_tokens == 1 && n_tokens == 1 &&
                               cur->ne[1] == 1 && ggml_is_contiguous(cur) ? gctx.moe_mailbox->slot(il) : nullptr;
    if (slot) {
        return llama_moe_graph_mailbox(gctx, route, slot, cur, model, weights, n_expert_used, type_op, il);
    }
    ggml_tensor * experts = llama_moe_graph_chain_out(gctx, route, 0, model, cur, n_expert_used, type_op, il);
    if (route.mask[0]) {
        // the rows the other chain computes read some slot here: zeroed before the sum
        experts = ggml_mul(ctx0, experts, route.mask[0]);
    }
    if (route.n == 2) {
        experts = ggml_add(ctx0, experts, llama_moe_graph_chain_out(gctx, route, 1, model, cur, n_expert_used, type_op, il));
        gctx.cb(experts, "ffn_moe_hybrid_sum", il);
    }
    return gctx.build_moe_ffn_out(experts, weights, n_expert_used, il);
}
