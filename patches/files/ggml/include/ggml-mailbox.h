#pragma once

// The mailbox: a hand-over between a device's stream and CPU threads through page-locked host memory that
// both can read and write (with CUDA's unified addressing, the host pointer of cudaMallocHost memory is also
// its device pointer), instead of the scheduler's synchronous copies and stream synchronization.
//
// One slot per user (llama_moe: per MoE layer the cache holds only in part). A step goes:
//   1. GGML_OP_MAILBOX send, on the device: stores x and ids in the slot, then, after a system-wide fence,
//      raises stamp_in to the step's number (the previous stamp_in + 1).
//   2. A CPU thread, already polling stamp_in, reads x and ids, computes the rows of y it has work for, marks
//      them in y_rows and, after a fence, raises stamp_out to the same number.
//   3. GGML_OP_MAILBOX recv, on the device (after the work it is given as a source): waits until stamp_out
//      equals stamp_in, then reads the rows of y marked in y_rows (added to that work's result, or copied out
//      with zeros for the others). Reading host memory from the device is a round trip over the bus per load:
//      a step whose rows are all zero (the cache held every expert) reads nothing but the stamps.
// A stamp is written after its payload and read before it, and a step's send cannot start before the previous
// step's recv has returned, so neither side reads a stale or torn payload. A recv that waits longer than its
// timeout sets error, returns without y and lets the stream go on: the host checks error after the graph, so a
// stuck CPU side ends in an error, never in a hang.

#include "ggml.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

    struct ggml_mailbox_slot {
        volatile uint64_t stamp_in;  // the device: x and ids of step stamp_in are in
        volatile uint64_t stamp_out; // the CPU: y of step stamp_out is in
        volatile uint64_t y_rows;    // the CPU: bit i: row i of y (of n_ids rows) holds values; the others read as zeros
        volatile int32_t  error;     // the device: a recv timed out (its output lacks y)
        uint64_t * step_dev;         // the device's count of its steps, in memory it reads without a bus round
                                     // trip (set by whoever gives the device such memory; else step_host)
        uint64_t   step_host;
        int32_t n_x;                 // F32 values of x
        int32_t n_ids;               // I32 values of ids
        int32_t n_y;                 // F32 values of y
        int64_t off_x;               // byte offsets of the payloads from the slot's start
        int64_t off_ids;
        int64_t off_y;
    };

    // bytes of a slot for n_x, n_ids (at most 64) and n_y values (payloads 256-byte aligned)
    GGML_API size_t ggml_mailbox_slot_size(int64_t n_x, int64_t n_ids, int64_t n_y);

    // lays a slot out in memory of ggml_mailbox_slot_size bytes (256-byte aligned), stamps at 0
    GGML_API void   ggml_mailbox_slot_init(struct ggml_mailbox_slot * slot, int64_t n_x, int64_t n_ids, int64_t n_y);

    GGML_API float   * ggml_mailbox_slot_x  (struct ggml_mailbox_slot * slot);
    GGML_API int32_t * ggml_mailbox_slot_ids(struct ggml_mailbox_slot * slot);
    GGML_API float   * ggml_mailbox_slot_y  (struct ggml_mailbox_slot * slot);

    // send: x (F32, n_x values) and ids (I32, n_ids values) into the slot. The result is x repeated n_rep times,
    // [n_x, n_rep], so that work built on it runs after the send; a device whose next work wants x once per
    // selected expert gets those rows from the send instead of from a repeat of its own
    GGML_API struct ggml_tensor * ggml_mailbox_send(
            struct ggml_context      * ctx,
            struct ggml_tensor       * x,
            struct ggml_tensor       * ids,
            struct ggml_mailbox_slot * slot,
            int64_t                    n_rep);

    // recv: the CPU's y of the step send made, shaped like base (F32, n_y values, contiguous), which the device
    // computes before it waits. add: the rows the CPU computed are base + y, the others base itself (the sum
    // without an add of its own); else y's rows and zeros for the others
    GGML_API struct ggml_tensor * ggml_mailbox_recv(
            struct ggml_context      * ctx,
            struct ggml_tensor       * send,
            struct ggml_tensor       * base,
            struct ggml_mailbox_slot * slot,
            bool                       add,
            int32_t                    timeout_ms);

    enum ggml_mailbox_mode {
        GGML_MAILBOX_SEND = 0,
        GGML_MAILBOX_RECV = 1,
        GGML_MAILBOX_RECV_ADD = 2,
    };

    // for backends: the op's mode, slot and timeout
    GGML_API enum ggml_mailbox_mode   ggml_mailbox_get_mode   (const struct ggml_tensor * op);
    GGML_API struct ggml_mailbox_slot * ggml_mailbox_get_slot (const struct ggml_tensor * op);
    GGML_API int32_t                  ggml_mailbox_get_timeout(const struct ggml_tensor * op);

#ifdef __cplusplus
}
#endif
