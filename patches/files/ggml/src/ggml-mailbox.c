// GGML_OP_MAILBOX (ggml-mailbox.h): the slot's layout and the op's constructors; the backends compute it
// (ggml-cpu/mailbox.c, ggml-cuda/mailbox.cu).

#include "ggml-mailbox.h"

#include "ggml-impl.h"

#include <string.h>

size_t ggml_mailbox_slot_size(int64_t n_x, int64_t n_ids, int64_t n_y) {
    GGML_UNUSED(n_ids);
    return GGML_PAD(sizeof(struct ggml_mailbox_slot), 256) + GGML_PAD(n_x*sizeof(float), 256) +
           GGML_PAD(GGML_MAILBOX_RING*sizeof(struct ggml_mailbox_record), 256) + GGML_PAD(n_y*sizeof(float), 256);
}

void ggml_mailbox_slot_init(struct ggml_mailbox_slot * slot, int64_t n_x, int64_t n_ids, int64_t n_y) {
    GGML_ASSERT(((uintptr_t) slot) % 256 == 0 && n_x > 0 && n_ids > 0 && n_ids <= 64 && n_y > 0 && n_y % n_ids == 0 &&
                n_x < INT32_MAX && n_y < INT32_MAX);
    memset(slot, 0, ggml_mailbox_slot_size(n_x, n_ids, n_y));
    slot->n_x     = (int32_t) n_x;
    slot->n_ids   = (int32_t) n_ids;
    slot->n_y     = (int32_t) n_y;
    slot->off_x   = GGML_PAD(sizeof(struct ggml_mailbox_slot), 256);
    slot->off_rec = slot->off_x + GGML_PAD(n_x*sizeof(float), 256);
    slot->off_y   = slot->off_rec + GGML_PAD(GGML_MAILBOX_RING*sizeof(struct ggml_mailbox_record), 256);
    slot->step_dev = slot->step_host;
    slot->abort    = &slot->abort_own;
    slot->send_timeout_ms = 10000;
}

float * ggml_mailbox_slot_x(struct ggml_mailbox_slot * slot) {
    return (float *) ((char *) slot + slot->off_x);
}

struct ggml_mailbox_record * ggml_mailbox_slot_record(struct ggml_mailbox_slot * slot, uint64_t step) {
    return (struct ggml_mailbox_record *) ((char *) slot + slot->off_rec) + step % GGML_MAILBOX_RING;
}

float * ggml_mailbox_slot_y(struct ggml_mailbox_slot * slot) {
    return (float *) ((char *) slot + slot->off_y);
}

// op_params: mode, timeout, the slot's address (two), miss slot, first host id, the device's share (1/1000)
static void ggml_mailbox_set_params(struct ggml_tensor * t, enum ggml_mailbox_mode mode, struct ggml_mailbox_slot * slot, int32_t timeout_ms,
                                    int32_t miss_slot, int32_t host_first, int32_t gpu_share_milli) {
    int32_t params[7] = { (int32_t) mode, timeout_ms, 0, 0, miss_slot, host_first, gpu_share_milli };
    memcpy(params + 2, &slot, sizeof(slot));
    ggml_set_op_params(t, params, sizeof(params));
    t->op = GGML_OP_MAILBOX;
}

int32_t ggml_mailbox_get_miss_slot(const struct ggml_tensor * op) {
    return ggml_get_op_params_i32(op, 4);
}

int32_t ggml_mailbox_get_host_first(const struct ggml_tensor * op) {
    return ggml_get_op_params_i32(op, 5);
}

int32_t ggml_mailbox_get_gpu_share(const struct ggml_tensor * op) {
    return ggml_get_op_params_i32(op, 6);
}

// a leaf's op_params: a tag, first, the host copy's address (two)
#define GGML_MAILBOX_HOST_EXPERTS_TAG 0x4d424858 // "MBHX"

void ggml_mailbox_set_host_experts(struct ggml_tensor * dev_exps, const struct ggml_tensor * host_exps, int32_t first) {
    GGML_ASSERT(dev_exps->op == GGML_OP_NONE);
    int32_t params[4] = { 0, 0, 0, 0 };
    if (host_exps != NULL) {
        GGML_ASSERT(host_exps->type == dev_exps->type && host_exps->ne[0] == dev_exps->ne[0] && host_exps->ne[1] == dev_exps->ne[1]);
        GGML_ASSERT(host_exps->nb[1] == dev_exps->nb[1] && host_exps->nb[2] == dev_exps->nb[2] && host_exps->data != NULL);
        GGML_ASSERT(first >= dev_exps->ne[2] && first < INT32_MAX - host_exps->ne[2]);
        params[0] = GGML_MAILBOX_HOST_EXPERTS_TAG;
        params[1] = first;
        memcpy(params + 2, &host_exps->data, sizeof(void *));
    }
    memcpy(dev_exps->op_params, params, sizeof(params));
}

const void * ggml_mailbox_get_host_experts(const struct ggml_tensor * dev_exps, int32_t * first) {
    if (dev_exps->op != GGML_OP_NONE || dev_exps->op_params[0] != GGML_MAILBOX_HOST_EXPERTS_TAG) {
        return NULL;
    }
    const void * data;
    memcpy(&data, dev_exps->op_params + 2, sizeof(data));
    *first = dev_exps->op_params[1];
    return data;
}

enum ggml_mailbox_mode ggml_mailbox_get_mode(const struct ggml_tensor * op) {
    return (enum ggml_mailbox_mode) ggml_get_op_params_i32(op, 0);
}

int32_t ggml_mailbox_get_timeout(const struct ggml_tensor * op) {
    return ggml_get_op_params_i32(op, 1);
}

struct ggml_mailbox_slot * ggml_mailbox_get_slot(const struct ggml_tensor * op) {
    struct ggml_mailbox_slot * slot;
    memcpy(&slot, (const int32_t *) op->op_params + 2, sizeof(slot));
    return slot;
}

struct ggml_tensor * ggml_mailbox_send(
        struct ggml_context      * ctx,
        struct ggml_tensor       * x,
        struct ggml_tensor       * ids,
        struct ggml_mailbox_slot * slot,
        int64_t                    n_rep) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && ggml_is_contiguous(x) && ggml_nelements(x) == slot->n_x);
    GGML_ASSERT(ids->type == GGML_TYPE_I32 && ggml_is_contiguous(ids) && ggml_nelements(ids) == slot->n_ids);
    GGML_ASSERT(n_rep >= 1);
    struct ggml_tensor * result = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, slot->n_x, n_rep);
    ggml_mailbox_set_params(result, GGML_MAILBOX_SEND, slot, 0, 0, 0, 0);
    result->src[0] = x;
    result->src[1] = ids;
    return result;
}

struct ggml_tensor * ggml_mailbox_send_routed(
        struct ggml_context      * ctx,
        struct ggml_tensor       * x,
        struct ggml_tensor       * ids,
        struct ggml_tensor       * slot_map,
        struct ggml_tensor       * route,
        struct ggml_mailbox_slot * slot,
        int64_t                    n_rep,
        int32_t                    miss_slot,
        int32_t                    host_first,
        int32_t                    gpu_share_milli) {
    GGML_ASSERT(slot_map->type == GGML_TYPE_I32 && ggml_is_contiguous(slot_map) && slot_map->ne[0] == 1);
    GGML_ASSERT(route->type == GGML_TYPE_I32 && ggml_is_contiguous(route) && ggml_nelements(route) == slot->n_ids && route->data != NULL);
    GGML_ASSERT(miss_slot >= 0 && gpu_share_milli >= 0 && gpu_share_milli <= 1000 && (gpu_share_milli == 0 || host_first > miss_slot));
    struct ggml_tensor * result = ggml_mailbox_send(ctx, x, ids, slot, n_rep);
    ggml_mailbox_set_params(result, GGML_MAILBOX_SEND, slot, 0, miss_slot, host_first, gpu_share_milli);
    result->src[2] = route;
    result->src[3] = slot_map;
    return result;
}

struct ggml_tensor * ggml_mailbox_recv(
        struct ggml_context      * ctx,
        struct ggml_tensor       * send,
        struct ggml_tensor       * base,
        struct ggml_mailbox_slot * slot,
        bool                       add,
        int32_t                    timeout_ms) {
    GGML_ASSERT(send->op == GGML_OP_MAILBOX && ggml_mailbox_get_slot(send) == slot);
    GGML_ASSERT(base->type == GGML_TYPE_F32 && ggml_is_contiguous(base) && ggml_nelements(base) == slot->n_y);
    struct ggml_tensor * result = ggml_dup_tensor(ctx, base);
    ggml_mailbox_set_params(result, add ? GGML_MAILBOX_RECV_ADD : GGML_MAILBOX_RECV, slot, timeout_ms, ggml_mailbox_get_miss_slot(send), 0, 0);
    result->src[0] = send;
    result->src[1] = base;
    result->src[2] = send->src[2]; // the route, if any: no wait for a step without rows for the CPU
    return result;
}

struct ggml_tensor * ggml_mailbox_recv_sum(
        struct ggml_context      * ctx,
        struct ggml_tensor       * send,
        struct ggml_tensor       * base,
        struct ggml_tensor       * weights,
        struct ggml_mailbox_slot * slot,
        int32_t                    timeout_ms) {
    GGML_ASSERT(send->op == GGML_OP_MAILBOX && ggml_mailbox_get_slot(send) == slot);
    GGML_ASSERT(base->type == GGML_TYPE_F32 && ggml_is_contiguous(base) && ggml_nelements(base) == slot->n_y);
    GGML_ASSERT(weights == NULL || (weights->type == GGML_TYPE_F32 && ggml_nelements(weights) == slot->n_ids && weights->nb[0] == sizeof(float)));
    struct ggml_tensor * result = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, slot->n_y / slot->n_ids, 1);
    ggml_mailbox_set_params(result, GGML_MAILBOX_RECV_SUM, slot, timeout_ms, ggml_mailbox_get_miss_slot(send), 0, 0);
    result->src[0] = send;
    result->src[1] = base;
    result->src[2] = send->src[2];
    result->src[3] = weights;
    return result;
}
