#include "mailbox.cuh"

#include "ggml-mailbox.h"

// The slot lives in page-locked host memory: with unified addressing its host pointer is its device pointer.
// Every load from it is a round trip over the bus, so the shapes and the step count's address come as kernel
// arguments (the host reads them when it launches), stamps are read through volatile pointers, the payload through loads that bypass the
// caches, each ordered against the stamps with system-wide fences.

// a short pause in a wait on host memory: fewer loads over the bus (__nanosleep exists from sm_70 on)
static __device__ __forceinline__ void ggml_mailbox_pause() {
#if __CUDA_ARCH__ >= 700
    __nanosleep(100);
#endif
}

static __device__ __forceinline__ uint64_t ggml_mailbox_now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// threads 0..63 (n_ids <= 64), a lane per selected expert, the lookups side by side: the route's ids (the slot,
// the miss slot for the CPU, or host_first + expert for the device's own read of the host copy: the first n_gpu
// misses in selection order), written to route; the rows for the CPU and the device's host reads as bit masks.
// Every thread of the block calls it (it synchronizes)
static __device__ void ggml_mailbox_route(const int32_t * ids, const int32_t * slot_map, const int64_t map_stride, const int n_ids,
                                          const int32_t miss_slot, const int32_t host_first, const int32_t gpu_share_milli,
                                          int32_t * route, uint64_t * rows_cpu, uint64_t * rows_gpu) {
    __shared__ uint32_t miss_mask[2], gpu_mask[2];
    const int k = threadIdx.x, lane = k % 32, warp = k / 32;
    const bool active = k < 64;
    const bool used   = k < n_ids;
    const int32_t e = used ? ids[k] : 0;
    const int32_t s = used ? slot_map[(int64_t) e * map_stride] : 0;
    const bool miss = used && s == miss_slot;
    if (active) {
        const uint32_t ballot = __ballot_sync(0xffffffff, miss);
        if (lane == 0) {
            miss_mask[warp] = ballot;
        }
    }
    __syncthreads();
    if (active) {
        const int32_t n_miss = __popc(miss_mask[0]) + __popc(miss_mask[1]);
        const int32_t n_gpu  = ggml_mailbox_gpu_rows(n_miss, gpu_share_milli);
        const int32_t before = (warp ? __popc(miss_mask[0]) : 0) + __popc(miss_mask[warp] & ((1u << lane) - 1));
        const bool gpu = miss && before < n_gpu;
        const uint32_t ballot = __ballot_sync(0xffffffff, gpu);
        if (lane == 0) {
            gpu_mask[warp] = ballot;
        }
        if (used) {
            route[k] = gpu ? host_first + e : s;
        }
    }
    __syncthreads();
    const uint64_t g = (uint64_t) gpu_mask[0] | (uint64_t) gpu_mask[1] << 32;
    *rows_gpu = g;
    *rows_cpu = ((uint64_t) miss_mask[0] | (uint64_t) miss_mask[1] << 32) & ~g;
}

// the rows a route leaves to the CPU (bit k: route[k] is the miss slot) and to the device's host reads; without
// a route the CPU decides: every bit
static __device__ __forceinline__ uint64_t ggml_mailbox_rows(const int32_t * route, const int n_ids, const int32_t miss_slot, uint64_t * rows_gpu) {
    if (route == nullptr) {
        *rows_gpu = 0;
        return ~(uint64_t) 0;
    }
    uint64_t cpu = 0, gpu = 0;
    for (int k = 0; k < n_ids; ++k) {
        cpu |= (uint64_t) (route[k] == miss_slot) << k;
        gpu |= (uint64_t) (route[k] >  miss_slot) << k;
    }
    *rows_gpu = gpu;
    return cpu;
}

// one block: the route (if any); where the ring is full as far as the device knows, a wait for the CPU side to
// have read the record this step overwrites; the payload and the record, a fence, then the stamp; x_out gets n_rep
// copies of x. A step without rows for the CPU carries only its record (x stays on the device)
static __global__ void k_mailbox_send(ggml_mailbox_slot * slot, uint64_t * step_dev, float * mx, ggml_mailbox_record * ring,
                                      volatile int32_t * abort, const uint64_t timeout_ns, const int n_x, const int n_ids,
                                      const int n_rep, const float * x, const int32_t * ids, int32_t * route, const int32_t * slot_map,
                                      const int64_t map_stride, const int32_t miss_slot, const int32_t host_first, const int32_t gpu_share_milli,
                                      float * x_out) {
    __shared__ uint64_t s_step;
    __shared__ int      s_skip;
    uint64_t rows_cpu = ~(uint64_t) 0, rows_gpu = 0;
    if (route != nullptr) {
        ggml_mailbox_route(ids, slot_map, map_stride, n_ids, miss_slot, host_first, gpu_share_milli, route, &rows_cpu, &rows_gpu);
    }
    if (threadIdx.x == 0) {
        // the step from the device's own count: reading stamp_in would be a round trip over the bus
        const uint64_t step = step_dev[0] + 1;
        step_dev[0] = step;
        int skip = 0;
        if (step > GGML_MAILBOX_RING && step_dev[1] < step - GGML_MAILBOX_RING) {
            const uint64_t t_end = ggml_mailbox_now_ns() + timeout_ns;
            volatile uint64_t * stamp_read = &slot->stamp_read;
            uint64_t read;
            while ((read = *stamp_read) < step - GGML_MAILBOX_RING) {
                if (*abort || ggml_mailbox_now_ns() > t_end) {
                    // no record, no stamp: the recv gives up too, and the host fails the decode
                    volatile int32_t * error = &slot->error;
                    *error = *abort ? GGML_MAILBOX_ABORTED : GGML_MAILBOX_TIMEOUT;
                    *abort = 1;
                    skip = 1;
                    break;
                }
                ggml_mailbox_pause();
            }
            if (!skip) {
                step_dev[1] = read;
            }
        }
        s_step = step;
        s_skip = skip;
    }
    __syncthreads();
    const bool vec = n_x % 4 == 0 && (((uintptr_t) x | (uintptr_t) x_out | (uintptr_t) mx) & 15) == 0;
    const bool to_cpu = rows_cpu != 0 && !s_skip;
    if (vec) {
        for (int i = threadIdx.x; i < n_x/4; i += blockDim.x) {
            const float4 v = ((const float4 *) x)[i];
            if (to_cpu) {
                ((float4 *) mx)[i] = v;
            }
            for (int r = 0; r < n_rep; ++r) {
                ((float4 *) (x_out + (int64_t) r*n_x))[i] = v;
            }
        }
    } else {
        for (int i = threadIdx.x; i < n_x; i += blockDim.x) {
            const float v = x[i];
            if (to_cpu) {
                mx[i] = v;
            }
            for (int r = 0; r < n_rep; ++r) {
                x_out[(int64_t) r*n_x + i] = v;
            }
        }
    }
    if (s_skip) {
        return;
    }
    ggml_mailbox_record * rec = ring + s_step % GGML_MAILBOX_RING;
    for (int i = threadIdx.x; i < n_ids; i += blockDim.x) {
        rec->ids[i] = ids[i];
    }
    if (threadIdx.x == 0) {
        rec->n_ids    = n_ids;
        rec->rows_cpu = rows_cpu;
        rec->rows_gpu = rows_gpu;
        rec->routed   = route != nullptr;
    }
    __threadfence_system(); // each thread's payload before the record's step
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile uint64_t * rec_step = &rec->step;
        *rec_step = s_step;
        __threadfence_system(); // the record before the stamp
        // the kernel's end makes the stamp visible: no fence after it
        volatile uint64_t * stamp_in = &slot->stamp_in;
        *stamp_in = s_step;
    }
}

// thread 0 of a block: the rows of y the CPU wrote for this step, after waiting for its stamp (at most timeout_ns;
// then the slot's error is set and no row is read); no wait where the route left the CPU nothing
static __device__ uint64_t ggml_mailbox_wait(ggml_mailbox_slot * slot, const uint64_t * step_dev, volatile int32_t * abort, const int n_ids,
                                             const uint64_t timeout_ns, const int32_t * route, const int32_t miss_slot) {
    uint64_t rows_gpu;
    if (ggml_mailbox_rows(route, n_ids, miss_slot, &rows_gpu) == 0) {
        return 0; // nothing for the CPU in this step: nothing to read over the bus
    }
    volatile uint64_t * stamp_out = &slot->stamp_out;
    volatile int32_t  * error     = &slot->error;
    const uint64_t step = *step_dev;
    const uint64_t t_end = ggml_mailbox_now_ns() + timeout_ns;
    for (uint32_t n = 0; *stamp_out != step; ++n) {
        // the shared flag now and then: each look is another round trip over the bus
        if (n % 16 == 15 && *abort) {
            if (*error == GGML_MAILBOX_OK) {
                *error = GGML_MAILBOX_ABORTED; // an earlier wait of this decode timed out: the CPU side is stuck
            }
            return 0;
        }
        if (ggml_mailbox_now_ns() > t_end) {
            *error = GGML_MAILBOX_TIMEOUT;
            *abort = 1;
            return 0;
        }
        ggml_mailbox_pause();
    }
    __threadfence_system();
    return *(volatile uint64_t *) &slot->y_rows;
}

// one block: each row base + the CPU's row where it computed one, else base (add), or the CPU's row, else zeros
template <bool add>
static __global__ void k_mailbox_recv(ggml_mailbox_slot * slot, const uint64_t * step_dev, volatile int32_t * abort, const float * my, const int n_ids, const int n_row,
                                      const float * base, float * y_out, const uint64_t timeout_ns, const int32_t * route, const int32_t miss_slot) {
    __shared__ uint64_t rows;
    if (threadIdx.x == 0) {
        rows = ggml_mailbox_wait(slot, step_dev, abort, n_ids, timeout_ns, route, miss_slot);
    }
    __syncthreads();
    const bool vec = n_row % 4 == 0 && (((uintptr_t) base | (uintptr_t) y_out) & 15) == 0;
    for (int r = 0; r < n_ids; ++r) {
        const int64_t off = (int64_t) r*n_row;
        const bool has = rows >> r & 1;
        if (vec) {
            const float4 * in4 = (const float4 *) (my + off);
            const float4 * b4  = (const float4 *) (base + off);
            float4 * out4 = (float4 *) (y_out + off);
            for (int i = threadIdx.x; i < n_row/4; i += blockDim.x) {
                if (add) {
                    float4 v = b4[i];
                    if (has) {
                        const float4 y = __ldcv(in4 + i);
                        v.x += y.x; v.y += y.y; v.z += y.z; v.w += y.w;
                    }
                    out4[i] = v;
                } else {
                    out4[i] = has ? __ldcv(in4 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
            }
        } else {
            for (int i = threadIdx.x; i < n_row; i += blockDim.x) {
                const float y = has ? __ldcv(my + off + i) : 0.0f;
                y_out[off + i] = add ? (has ? base[off + i] + y : base[off + i]) : y;
            }
        }
    }
}

// one block, a float4 of the output per thread and pass: sum over the rows r of (base_r + the CPU's y_r where it
// computed one) * w_r, rounded as ggml's add, mul and chain of adds round them (no fused multiply-add). The CPU's
// rows are loaded first, all at once: each load is a round trip over the bus
static __global__ void k_mailbox_recv_sum(ggml_mailbox_slot * slot, const uint64_t * step_dev, volatile int32_t * abort, const float * my, const int n_ids, const int n_row,
                                          const float * base, const float * w, const int64_t w_stride, float * out, const uint64_t timeout_ns,
                                          const int32_t * route, const int32_t miss_slot) {
    __shared__ uint64_t rows;
    if (threadIdx.x == 0) {
        rows = ggml_mailbox_wait(slot, step_dev, abort, n_ids, timeout_ns, route, miss_slot);
    }
    __syncthreads();
    constexpr int max_rows = 8; // the CPU's rows held in registers; more go row by row
    for (int i = threadIdx.x; i < n_row/4; i += blockDim.x) {
        float4 y[max_rows];
#pragma unroll
        for (int r = 0; r < max_rows; ++r) {
            if (r < n_ids && (rows >> r & 1)) {
                y[r] = __ldcv((const float4 *) (my + (int64_t) r*n_row) + i);
            }
        }
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int r = 0; r < n_ids; ++r) {
            float4 t = ((const float4 *) (base + (int64_t) r*n_row))[i];
            if (rows >> r & 1) {
                const float4 v = r < max_rows ? y[r] : __ldcv((const float4 *) (my + (int64_t) r*n_row) + i);
                t.x = __fadd_rn(t.x, v.x); t.y = __fadd_rn(t.y, v.y); t.z = __fadd_rn(t.z, v.z); t.w = __fadd_rn(t.w, v.w);
            }
            if (w != nullptr) {
                const float wr = w[r*w_stride];
                t.x = __fmul_rn(t.x, wr); t.y = __fmul_rn(t.y, wr); t.z = __fmul_rn(t.z, wr); t.w = __fmul_rn(t.w, wr);
            }
            if (r == 0) {
                acc = t;
            } else {
                acc.x = __fadd_rn(acc.x, t.x); acc.y = __fadd_rn(acc.y, t.y); acc.z = __fadd_rn(acc.z, t.z); acc.w = __fadd_rn(acc.w, t.w);
            }
        }
        ((float4 *) out)[i] = acc;
    }
}

void ggml_cuda_op_mailbox(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    ggml_mailbox_slot * slot = ggml_mailbox_get_slot(dst);
    cudaStream_t stream = ctx.stream();
    const ggml_mailbox_mode mode = ggml_mailbox_get_mode(dst);
    const int32_t   miss_slot = ggml_mailbox_get_miss_slot(dst);
    int32_t       * route     = dst->src[2] ? (int32_t *) dst->src[2]->data : nullptr;
    if (mode == GGML_MAILBOX_SEND) {
        const ggml_tensor * x   = dst->src[0];
        const ggml_tensor * ids = dst->src[1];
        const ggml_tensor * map = dst->src[3];
        GGML_ASSERT(ggml_is_contiguous(x) && ggml_is_contiguous(ids) && ggml_is_contiguous(dst));
        GGML_ASSERT(dst->ne[0] == slot->n_x && slot->n_ids <= 64 && (route == nullptr || map != nullptr));
        k_mailbox_send<<<1, 256, 0, stream>>>(slot, slot->step_dev, ggml_mailbox_slot_x(slot), ggml_mailbox_slot_record(slot, 0), slot->abort,
                                              (uint64_t) slot->send_timeout_ms * 1000000ull, slot->n_x, slot->n_ids,
                                              (int) ggml_nrows(dst), (const float *) x->data, (const int32_t *) ids->data, route,
                                              map ? (const int32_t *) map->data : nullptr, map ? map->nb[1] / sizeof(int32_t) : 0, miss_slot,
                                              ggml_mailbox_get_host_first(dst), ggml_mailbox_get_gpu_share(dst), (float *) dst->data);
    } else {
        const ggml_tensor * base = dst->src[1];
        GGML_ASSERT(ggml_is_contiguous(dst) && ggml_is_contiguous(base) && ggml_nelements(base) == slot->n_y);
        GGML_ASSERT(slot->n_y % slot->n_ids == 0);
        GGML_ASSERT(ggml_nelements(dst) == (mode == GGML_MAILBOX_RECV_SUM ? slot->n_y / slot->n_ids : slot->n_y));
        const uint64_t timeout_ns = (uint64_t) ggml_mailbox_get_timeout(dst) * 1000000ull;
        const int n_row = slot->n_y / slot->n_ids;
        // the payload's address is 256-byte aligned (ggml_mailbox_slot_init), so rows of a multiple of 4 floats
        // go as float4 where base and dst are aligned too
        if (mode == GGML_MAILBOX_RECV_SUM) {
            const ggml_tensor * w = dst->src[3];
            GGML_ASSERT(n_row % 4 == 0 && (((uintptr_t) base->data | (uintptr_t) dst->data) & 15) == 0);
            k_mailbox_recv_sum<<<1, 512, 0, stream>>>(slot, slot->step_dev, slot->abort, ggml_mailbox_slot_y(slot), slot->n_ids, n_row,
                                                      (const float *) base->data, w ? (const float *) w->data : nullptr,
                                                      w ? w->nb[1] / sizeof(float) : 0, (float *) dst->data, timeout_ns, route, miss_slot);
        } else if (mode == GGML_MAILBOX_RECV_ADD) {
            k_mailbox_recv<true><<<1, 512, 0, stream>>>(slot, slot->step_dev, slot->abort, ggml_mailbox_slot_y(slot), slot->n_ids, n_row,
                                                        (const float *) base->data, (float *) dst->data, timeout_ns, route, miss_slot);
        } else {
            k_mailbox_recv<false><<<1, 512, 0, stream>>>(slot, slot->step_dev, slot->abort, ggml_mailbox_slot_y(slot), slot->n_ids, n_row,
                                                         (const float *) base->data, (float *) dst->data, timeout_ns, route, miss_slot);
        }
    }
    CUDA_CHECK(cudaGetLastError());
}
