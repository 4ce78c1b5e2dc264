// The CPU backend's side of GGML_OP_MAILBOX (ggml-mailbox.h), with the CPU as the device: the llama_moe
// cache's test mode.

#include "mailbox.h"

#include "ggml-cpu.h"
#include "ggml-impl.h"
#include "ggml-mailbox.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

void ggml_compute_forward_mailbox(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    if (params->ith != 0) {
        return;
    }
    struct ggml_mailbox_slot * slot = ggml_mailbox_get_slot(dst);
    const enum ggml_mailbox_mode mode = ggml_mailbox_get_mode(dst);
    const int32_t miss_slot = ggml_mailbox_get_miss_slot(dst);
    if (mode == GGML_MAILBOX_SEND && dst->src[3] != NULL) {
        // the route first (ggml_mailbox_send_routed): the device's lookups, its share of the misses
        const int32_t * ids = (const int32_t *) dst->src[1]->data;
        const struct ggml_tensor * map = dst->src[3];
        int32_t * out = (int32_t *) dst->src[2]->data;
        int32_t n_miss = 0;
        for (int k = 0; k < slot->n_ids; ++k) {
            GGML_ASSERT(ids[k] >= 0 && ids[k] < map->ne[1]);
            out[k] = *(const int32_t *) ((const char *) map->data + ids[k]*map->nb[1]);
            n_miss += out[k] == miss_slot;
        }
        int32_t n_gpu = ggml_mailbox_gpu_rows(n_miss, ggml_mailbox_get_gpu_share(dst));
        for (int k = 0; k < slot->n_ids && n_gpu > 0; ++k) {
            if (out[k] == miss_slot) {
                out[k] = ggml_mailbox_get_host_first(dst) + ids[k];
                n_gpu--;
            }
        }
    }
    // the rows the CPU computes: those the route left to the miss slot, or all (it decides) without a route
    const int32_t * route = dst->src[2] ? (const int32_t *) dst->src[2]->data : NULL;
    uint64_t rows_cpu = route ? 0 : ~(uint64_t) 0;
    uint64_t rows_gpu = 0;
    for (int k = 0; route && k < slot->n_ids; ++k) {
        rows_cpu |= (uint64_t) (route[k] == miss_slot) << k;
        rows_gpu |= (uint64_t) (route[k] >  miss_slot) << k;
    }
    if (mode == GGML_MAILBOX_SEND) {
        const struct ggml_tensor * x   = dst->src[0];
        const struct ggml_tensor * ids = dst->src[1];
        for (int64_t r = 0; r < ggml_nrows(dst); ++r) {
            memcpy((char *) dst->data + r*dst->nb[1], x->data, ggml_nbytes(x));
        }
        const uint64_t step = slot->step_dev[0] + 1;
        slot->step_dev[0] = step;
        if (step > GGML_MAILBOX_RING && slot->step_dev[1] < step - GGML_MAILBOX_RING) {
            // the record this step overwrites may be unread: wait for the CPU side to read it
            const int64_t t_end = ggml_time_ms() + slot->send_timeout_ms;
            uint64_t read;
            while ((read = slot->stamp_read) < step - GGML_MAILBOX_RING) {
                if (*slot->abort || ggml_time_ms() > t_end) {
                    // no record, no stamp: the recv gives up too, and the host fails the decode
                    slot->error  = *slot->abort ? GGML_MAILBOX_ABORTED : GGML_MAILBOX_TIMEOUT;
                    *slot->abort = 1;
                    return;
                }
                sched_yield();
            }
            atomic_thread_fence(memory_order_seq_cst); // the CPU side's reads of the old record before our writes
            slot->step_dev[1] = read;
        }
        if (rows_cpu != 0) {
            memcpy(ggml_mailbox_slot_x(slot), x->data, ggml_nbytes(x));
        }
        struct ggml_mailbox_record * rec = ggml_mailbox_slot_record(slot, step);
        memcpy(rec->ids, ids->data, ggml_nbytes(ids));
        rec->n_ids    = slot->n_ids;
        rec->rows_cpu = rows_cpu;
        rec->rows_gpu = rows_gpu;
        rec->routed   = route != NULL;
        atomic_thread_fence(memory_order_seq_cst); // the record before its step
        rec->step = step;
        atomic_thread_fence(memory_order_seq_cst); // the payload before the stamp
        slot->stamp_in = step;
        return;
    }
    const bool     add   = mode == GGML_MAILBOX_RECV_ADD;
    const float  * base  = (const float *) dst->src[1]->data;
    const uint64_t step  = *slot->step_dev;
    const int64_t  t_end = ggml_time_ms() + ggml_mailbox_get_timeout(dst);
    uint64_t rows = 0;
    bool     ok   = rows_cpu != 0; // nothing for the CPU: no wait, nothing to read
    while (ok && slot->stamp_out != step) {
        if (*slot->abort) {
            // an earlier wait of this decode timed out: the CPU side is stuck, do not wait for it again
            if (slot->error == GGML_MAILBOX_OK) {
                slot->error = GGML_MAILBOX_ABORTED;
            }
            ok = false;
            break;
        }
        if (ggml_time_ms() > t_end) {
            slot->error  = GGML_MAILBOX_TIMEOUT;
            *slot->abort = 1;
            ok = false;
            break;
        }
        sched_yield(); // the CPU side may need this core
    }
    if (ok) {
        atomic_thread_fence(memory_order_seq_cst); // the stamp before the payload
        rows = slot->y_rows;
    }
    const int64_t n_row = slot->n_y / slot->n_ids;
    if (mode == GGML_MAILBOX_RECV_SUM) {
        // as a recv, a mul and ggml's adds round it: each step its own loop, so that none fuses into a multiply-add
        const struct ggml_tensor * w = dst->src[3];
        float * out = (float *) dst->data;
        float * t   = (float *) malloc(n_row*sizeof(float));
        GGML_ASSERT(t != NULL);
        for (int i = 0; i < slot->n_ids; ++i) {
            const float * y = ggml_mailbox_slot_y(slot) + i*n_row;
            const float * b = base + i*n_row;
            for (int64_t j = 0; j < n_row; ++j) {
                t[j] = rows >> i & 1 ? b[j] + y[j] : b[j];
            }
            if (w != NULL) {
                const float wi = *(const float *) ((const char *) w->data + i*w->nb[1]);
                for (int64_t j = 0; j < n_row; ++j) {
                    t[j] = t[j] * wi;
                }
            }
            for (int64_t j = 0; j < n_row; ++j) {
                out[j] = i == 0 ? t[j] : out[j] + t[j];
            }
        }
        free(t);
        return;
    }
    for (int i = 0; i < slot->n_ids; ++i) {
        float       * out = (float *) dst->data + i*n_row;
        const float * y   = ggml_mailbox_slot_y(slot) + i*n_row;
        const float * b   = base + i*n_row;
        if (add) {
            if (rows >> i & 1) {
                for (int64_t j = 0; j < n_row; ++j) {
                    out[j] = b[j] + y[j];
                }
            } else {
                memcpy(out, b, n_row*sizeof(float));
            }
        } else if (rows >> i & 1) {
            memcpy(out, y, n_row*sizeof(float));
        } else {
            memset(out, 0, n_row*sizeof(float));
        }
    }
}

void ggml_compute_forward_mul_mat_id_host(const struct ggml_compute_params * params, struct ggml_tensor * dst,
                                          const char * host_exps, int32_t host_first) {
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];
    const struct ggml_tensor * ids  = dst->src[2];

    GGML_TENSOR_BINARY_OP_LOCALS

    const int ith = params->ith;
    const int nth = params->nth;
    const int n_ids = ids->ne[0];
    const enum ggml_type vec_dot_type = ggml_get_type_traits_cpu(src0->type)->vec_dot_type;
    const bool src1_cont = ggml_is_contiguous(src1);

    // one vec_dot per row as MUL_MAT_ID's chunks compute it (bit for bit the same)
    ggml_vec_dot_t const vec_dot = ggml_get_type_traits_cpu(src0->type)->vec_dot;
    const void * wdata = (src1->type == vec_dot_type) ? src1->data : params->wdata;
    const size_t row_size = ggml_row_size(vec_dot_type, ne10);
    const int64_t ir0_start = (ne01 * ith) / nth;
    const int64_t ir0_end   = (ne01 * (ith + 1)) / nth;
    for (int64_t iid1 = 0; iid1 < ids->ne[1]; ++iid1) {
        for (int id = 0; id < n_ids; ++id) {
            const int32_t i02 = *(const int32_t *) ((const char *) ids->data + iid1*ids->nb[1] + id*ids->nb[0]);
            if (i02 < host_first) {
                continue;
            }
            const char * src0_cur = host_exps + (int64_t) (i02 - host_first) * nb02;
            const int64_t i11 = id % ne11;
            const char * src1_col = (const char *) wdata +
                (src1_cont || src1->type != vec_dot_type ? (i11 + iid1*ne11)*row_size : (i11*nb11 + iid1*nb12));
            float * dst_col = (float *) ((char *) dst->data + id*nb1 + iid1*nb2);
            for (int64_t ir0 = ir0_start; ir0 < ir0_end; ++ir0) {
                vec_dot(ne00, &dst_col[ir0], 0, src0_cur + ir0*nb01, 0, src1_col, 0, 1);
            }
        }
    }
}
