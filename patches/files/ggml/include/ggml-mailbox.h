#pragma once

// The mailbox: a hand-over between a device's stream and CPU threads through page-locked host memory that
// both can read and write (with CUDA's unified addressing, the host pointer of cudaMallocHost memory is also
// its device pointer), instead of the scheduler's synchronous copies and stream synchronization.
//
// One slot per user (llama_moe: per MoE layer the cache holds only in part). A step goes:
//   1. GGML_OP_MAILBOX send, on the device: stores x (where the CPU has rows to compute) in the slot and the
//      step's record (ids, rows) in a ring of GGML_MAILBOX_RING records, then, after a system-wide fence,
//      raises stamp_in to the step's number (the previous stamp_in + 1).
//   2. A CPU thread, already polling stamp_in, reads the records of every step up to stamp_in in order (raising
//      stamp_read after each), computes the rows of y the latest one has work for, marks them in y_rows and,
//      after a fence, raises stamp_out to the same number.
//   3. GGML_OP_MAILBOX recv, on the device (after the work it is given as a source): waits until stamp_out
//      equals stamp_in, then reads the rows of y marked in y_rows (added to that work's result, or copied out
//      with zeros for the others). Reading host memory from the device is a round trip over the bus per load:
//      a step whose rows are all zero (the cache held every expert) reads nothing but the stamps.
// With a route (ggml_mailbox_send_routed), the send says which rows the CPU computes (rows_cpu) and which the device
// computes itself from the host copy of the experts (rows_gpu); a step whose rows_cpu is empty only tells the CPU
// what was selected (for its counts) and its recv does not wait. Such steps can follow each other faster than the
// CPU reads them: the ring keeps each one's record until the CPU has read it (a send whose record would overwrite
// one the CPU has not read waits for stamp_read), so the CPU never reads a torn record and never misses a step.
// A stamp is written after its payload and read before it, and a step's x is written only after the previous
// step's recv has returned. A wait longer than the timeout sets error and the shared abort flag, which every
// later wait of the same decode sees at once: a stuck CPU side costs one timeout, never a hang; the host checks
// error after the graph and clears the flag.

#include "ggml.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

    // records of steps the CPU has not read yet that the ring holds: a send waits only when all are unread
#define GGML_MAILBOX_RING 16

    struct ggml_mailbox_record {
        volatile uint64_t step;      // written after the rest: the record of step `step` is in
        uint64_t rows_cpu;           // bit i: the CPU computes row i (all bits without a route)
        uint64_t rows_gpu;           // bit i: the device computes row i from the host copy
        int32_t  routed;             // rows_cpu and rows_gpu come from a route
        int32_t  n_ids;
        int32_t  ids[64];            // the selected experts
    };

    enum ggml_mailbox_error {
        GGML_MAILBOX_OK         = 0,
        GGML_MAILBOX_TIMEOUT    = 1, // a wait of the device outlasted the timeout (the recv's, or the send's on a full ring)
        GGML_MAILBOX_CPU_FAILED = 2, // the CPU could not compute its part (set by the CPU side)
        GGML_MAILBOX_DISAGREE   = 3, // the device's slot map and the CPU's disagree (set by the CPU side)
        GGML_MAILBOX_ABORTED    = 4, // an earlier wait of the same decode timed out: this one gave up at once
    };

    struct ggml_mailbox_slot {
        volatile uint64_t stamp_in;  // the device: x and the record of step stamp_in are in
        volatile uint64_t stamp_out; // the CPU: y of step stamp_out is in
        volatile uint64_t stamp_read;// the CPU: it has read the records of every step up to this one
        volatile uint64_t y_rows;    // the CPU: bit i: row i of y (of n_ids rows) holds values; the others read as zeros
        volatile int32_t  error;     // enum ggml_mailbox_error, set by whichever side failed
        int32_t  send_timeout_ms;    // the send's wait on a full ring
        volatile int32_t * abort;    // shared by the slots of one user (default: abort_own); nonzero after a timeout
        int32_t  abort_own;
        int32_t  pad;
        uint64_t * step_dev;         // [0] the device's count of its steps, [1] the last stamp_read it saw, in memory
                                     // it reads without a bus round trip (set by whoever gives the device such
                                     // memory; else step_host)
        uint64_t   step_host[2];
        int32_t n_x;                 // F32 values of x
        int32_t n_ids;               // I32 values of ids
        int32_t n_y;                 // F32 values of y
        int64_t off_x;               // byte offsets of the payloads from the slot's start
        int64_t off_rec;
        int64_t off_y;
    };

    // bytes of a slot for n_x, n_ids (at most 64) and n_y values (payloads 256-byte aligned)
    GGML_API size_t ggml_mailbox_slot_size(int64_t n_x, int64_t n_ids, int64_t n_y);

    // lays a slot out in memory of ggml_mailbox_slot_size bytes (256-byte aligned), stamps at 0
    GGML_API void   ggml_mailbox_slot_init(struct ggml_mailbox_slot * slot, int64_t n_x, int64_t n_ids, int64_t n_y);

    GGML_API float   * ggml_mailbox_slot_x  (struct ggml_mailbox_slot * slot);
    GGML_API float   * ggml_mailbox_slot_y  (struct ggml_mailbox_slot * slot);
    // the ring's record of a step
    GGML_API struct ggml_mailbox_record * ggml_mailbox_slot_record(struct ggml_mailbox_slot * slot, uint64_t step);

    // how many of a step's n_miss misses the device takes at a share of gpu_share_milli/1000: the nearest
    // integer, at least one where the share is above zero, at most n_miss (for the CPU and CUDA backends alike)
#ifdef __CUDACC__
    __host__ __device__
#endif
    static inline int32_t ggml_mailbox_gpu_rows(int32_t n_miss, int32_t gpu_share_milli) {
        if (n_miss <= 0 || gpu_share_milli <= 0) {
            return 0;
        }
        const int32_t n = (n_miss * gpu_share_milli + 500) / 1000;
        return n < 1 ? 1 : n > n_miss ? n_miss : n;
    }

    // MUL_MAT_ID on dev_exps ([.., .., n] on the device) reads the expert of an id >= first from host_exps (same
    // type and strides, in host memory the device can read) at id - first: ggml_mailbox_send_routed's route. Stored in
    // dev_exps's op_params (a leaf's are unused); host_exps == NULL clears it. CUDA's MMVQ (one token's
    // rows, one expert each) and the CPU read such ids; the route is built only for those
    // a backend registry's proc "ggml_mailbox_host_rows_max": how many rows of one token (one expert each) its
    // MUL_MAT_ID reads host experts for on a device, 0 for none (CUDA: those MMVQ takes)
    typedef int (*ggml_mailbox_host_rows_max_t)(int device, enum ggml_type type);

    GGML_API void         ggml_mailbox_set_host_experts(struct ggml_tensor * dev_exps, const struct ggml_tensor * host_exps, int32_t first);
    GGML_API const void * ggml_mailbox_get_host_experts(const struct ggml_tensor * dev_exps, int32_t * first);

    // send: x (F32, n_x values) and ids (I32, n_ids values) into the slot. The result is x repeated n_rep times,
    // [n_x, n_rep], so that work built on it runs after the send; a device whose next work wants x once per
    // selected expert gets those rows from the send instead of from a repeat of its own
    GGML_API struct ggml_tensor * ggml_mailbox_send(
            struct ggml_context      * ctx,
            struct ggml_tensor       * x,
            struct ggml_tensor       * ids,
            struct ggml_mailbox_slot * slot,
            int64_t                    n_rep);

    // send with a route: first the ids the device's experts are looked up with, written into route ([1, n_ids]
    // I32 in the device's memory, which work after the send reads) from slot_map ([1, n_expert] I32: expert ->
    // slot, miss_slot for the experts the device lacks). Of the step's misses (in selection order) the device
    // takes the first ggml_mailbox_gpu_rows(n_miss, gpu_share_milli) as host_first + expert, read from the host
    // copy (ggml_mailbox_set_host_experts); the CPU computes the others, left at miss_slot. None for the CPU: the
    // step only carries ids (x stays in device memory) and its recv does not wait
    GGML_API struct ggml_tensor * ggml_mailbox_send_routed(
            struct ggml_context      * ctx,
            struct ggml_tensor       * x,
            struct ggml_tensor       * ids,
            struct ggml_tensor       * slot_map,
            struct ggml_tensor       * route,
            struct ggml_mailbox_slot * slot,
            int64_t                    n_rep,
            int32_t                    miss_slot,
            int32_t                    host_first,
            int32_t                    gpu_share_milli);

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

    // recv_sum: the recv's rows (base + the CPU's y where it computed one), each times its weight (weights: F32,
    // n_ids values, row r's at weights->nb[1]*r; NULL: 1) and summed in row order, [n_row, 1]: the MoE layer's
    // output in one kernel instead of a recv, a mul and an add of the rows. Each row is multiplied and added
    // once, in the order a mul then ggml's adds round them
    GGML_API struct ggml_tensor * ggml_mailbox_recv_sum(
            struct ggml_context      * ctx,
            struct ggml_tensor       * send,
            struct ggml_tensor       * base,
            struct ggml_tensor       * weights,
            struct ggml_mailbox_slot * slot,
            int32_t                    timeout_ms);

    enum ggml_mailbox_mode {
        GGML_MAILBOX_SEND = 0,
        GGML_MAILBOX_RECV = 1,
        GGML_MAILBOX_RECV_ADD = 2,
        GGML_MAILBOX_RECV_SUM = 3,
    };

    // for backends: the op's mode, slot and timeout; the route's miss slot, first host id and share (send and
    // recv: the route they write and follow is their src[2], NULL for none; the send's slot map is its src[3],
    // recv_sum's weights its src[3])
    GGML_API enum ggml_mailbox_mode   ggml_mailbox_get_mode   (const struct ggml_tensor * op);
    GGML_API struct ggml_mailbox_slot * ggml_mailbox_get_slot (const struct ggml_tensor * op);
    GGML_API int32_t                  ggml_mailbox_get_timeout(const struct ggml_tensor * op);
    GGML_API int32_t                  ggml_mailbox_get_miss_slot (const struct ggml_tensor * op);
    GGML_API int32_t                  ggml_mailbox_get_host_first(const struct ggml_tensor * op);
    GGML_API int32_t                  ggml_mailbox_get_gpu_share (const struct ggml_tensor * op);

#ifdef __cplusplus
}
#endif
