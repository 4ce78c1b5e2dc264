#include "mailbox.cuh"

#include "ggml-mailbox.h"

// The slot lives in page-locked host memory: with unified addressing its host pointer is its device pointer.
// Every load from it is a round trip over the bus, so the shapes and the step count's address come as kernel
// arguments (the host reads them when it launches), stamps are read through volatile pointers, the payload through loads that bypass the
// caches, each ordered against the stamps with system-wide fences.

static __device__ __forceinline__ uint64_t ggml_mailbox_now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// two warps (n_ids <= 64), a lane per selected expert: the ids the device's experts are looked up with
// (ggml_mailbox_route); the lookups run side by side, not one after another
static __global__ void k_mailbox_route(const int32_t * ids, const int32_t * slot_map, const int64_t map_stride, const int n_ids,
                                       const int32_t miss_slot, const int32_t host_first, const int32_t gpu_share_milli, int32_t * out) {
    __shared__ int32_t n_miss_warp[2];
    const int k    = threadIdx.x;
    const int lane = k % 32, warp = k / 32;
    const int32_t e = k < n_ids ? ids[k] : 0;
    const int32_t s = k < n_ids ? slot_map[(int64_t) e * map_stride] : 0;
    const bool miss = k < n_ids && s == miss_slot;
    const uint32_t ballot = __ballot_sync(0xffffffff, miss);
    if (lane == 0) {
        n_miss_warp[warp] = __popc(ballot);
    }
    __syncthreads();
    // ggml_mailbox_gpu_rows; the device takes the first n_gpu misses in selection order
    const int32_t n_miss = n_miss_warp[0] + n_miss_warp[1];
    const int32_t n_gpu  = n_miss > 0 && gpu_share_milli > 0 ? min(n_miss, max(1, (n_miss * gpu_share_milli + 500) / 1000)) : 0;
    const int32_t before = (warp ? n_miss_warp[0] : 0) + __popc(ballot & ((1u << lane) - 1));
    if (k < n_ids) {
        out[k] = miss && before < n_gpu ? host_first + e : s;
    }
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

// one block: the payload, a fence, then the stamp; x_out gets n_rep copies of x. A step without rows for the
// CPU carries only the ids and the rows (x stays on the device)
static __global__ void k_mailbox_send(ggml_mailbox_slot * slot, uint64_t * step_dev, float * mx, int32_t * mids, const int n_x, const int n_ids,
                                      const int n_rep, const float * x, const int32_t * ids, const int32_t * route, const int32_t miss_slot,
                                      float * x_out) {
    uint64_t rows_gpu;
    const uint64_t rows_cpu = ggml_mailbox_rows(route, n_ids, miss_slot, &rows_gpu);
    for (int i = threadIdx.x; i < n_x; i += blockDim.x) {
        const float v = x[i];
        if (rows_cpu != 0) {
            mx[i] = v;
        }
        for (int r = 0; r < n_rep; ++r) {
            x_out[(int64_t) r*n_x + i] = v;
        }
    }
    for (int i = threadIdx.x; i < n_ids; i += blockDim.x) {
        mids[i] = ids[i];
    }
    if (threadIdx.x == 0) {
        slot->rows_cpu = rows_cpu;
        slot->rows_gpu = rows_gpu;
        slot->routed   = route != nullptr;
    }
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
        // the step from the device's own count: reading stamp_in would be a round trip over the bus
        const uint64_t step = *step_dev + 1;
        *step_dev = step;
        volatile uint64_t * stamp_in = &slot->stamp_in;
        *stamp_in = step;
        __threadfence_system();
    }
}

// thread 0 of a block: the rows of y the CPU wrote for this step, after waiting for its stamp (at most timeout_ns;
// then the slot's error is set and no row is read); no wait where the route left the CPU nothing
static __device__ uint64_t ggml_mailbox_wait(ggml_mailbox_slot * slot, const uint64_t * step_dev, const int n_ids, const uint64_t timeout_ns,
                                             const int32_t * route, const int32_t miss_slot) {
    uint64_t rows_gpu;
    if (ggml_mailbox_rows(route, n_ids, miss_slot, &rows_gpu) == 0) {
        return 0; // nothing for the CPU in this step: nothing to read over the bus
    }
    volatile uint64_t * stamp_out = &slot->stamp_out;
    const uint64_t step = *step_dev;
    const uint64_t t_end = ggml_mailbox_now_ns() + timeout_ns;
    while (*stamp_out != step) {
        if (ggml_mailbox_now_ns() > t_end) {
            volatile int32_t * error = &slot->error;
            *error = 1;
            return 0;
        }
        __nanosleep(100);
    }
    __threadfence_system();
    const uint64_t rows = *(volatile uint64_t *) &slot->y_rows;
    __threadfence_system();
    return rows;
}

// one block: each row base + the CPU's row where it computed one, else base (add), or the CPU's row, else zeros
template <bool add>
static __global__ void k_mailbox_recv(ggml_mailbox_slot * slot, const uint64_t * step_dev, const float * my, const int n_ids, const int n_row,
                                      const float * base, float * y_out, const uint64_t timeout_ns, const int32_t * route, const int32_t miss_slot) {
    __shared__ uint64_t rows;
    if (threadIdx.x == 0) {
        rows = ggml_mailbox_wait(slot, step_dev, n_ids, timeout_ns, route, miss_slot);
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

// one block: sum over the rows r of (base_r + the CPU's y_r where it computed one) * w_r, rounded as ggml's add,
// mul and chain of adds round them (no fused multiply-add), into one row
static __global__ void k_mailbox_recv_sum(ggml_mailbox_slot * slot, const uint64_t * step_dev, const float * my, const int n_ids, const int n_row,
                                          const float * base, const float * w, const int64_t w_stride, float * out, const uint64_t timeout_ns,
                                          const int32_t * route, const int32_t miss_slot) {
    __shared__ uint64_t rows;
    if (threadIdx.x == 0) {
        rows = ggml_mailbox_wait(slot, step_dev, n_ids, timeout_ns, route, miss_slot);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n_row; i += blockDim.x) {
        float acc = 0.0f;
        for (int r = 0; r < n_ids; ++r) {
            const int64_t off = (int64_t) r*n_row + i;
            float t = base[off];
            if (rows >> r & 1) {
                t = __fadd_rn(t, __ldcv(my + off));
            }
            if (w != nullptr) {
                t = __fmul_rn(t, w[r*w_stride]);
            }
            acc = r == 0 ? t : __fadd_rn(acc, t);
        }
        out[i] = acc;
    }
}

void ggml_cuda_op_mailbox(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    ggml_mailbox_slot * slot = ggml_mailbox_get_slot(dst);
    cudaStream_t stream = ctx.stream();
    const ggml_mailbox_mode mode = ggml_mailbox_get_mode(dst);
    const int32_t   miss_slot = ggml_mailbox_get_miss_slot(dst);
    const int32_t * route     = dst->src[2] ? (const int32_t *) dst->src[2]->data : nullptr;
    if (mode == GGML_MAILBOX_ROUTE) {
        const ggml_tensor * ids = dst->src[0];
        const ggml_tensor * map = dst->src[1];
        GGML_ASSERT(ggml_is_contiguous(ids) && ggml_is_contiguous(dst) && map->nb[1] % sizeof(int32_t) == 0);
        GGML_ASSERT(slot->n_ids <= 64);
        k_mailbox_route<<<1, 64, 0, stream>>>((const int32_t *) ids->data, (const int32_t *) map->data, map->nb[1] / sizeof(int32_t), slot->n_ids,
                                             miss_slot, ggml_mailbox_get_host_first(dst), ggml_mailbox_get_gpu_share(dst), (int32_t *) dst->data);
    } else if (mode == GGML_MAILBOX_SEND) {
        const ggml_tensor * x   = dst->src[0];
        const ggml_tensor * ids = dst->src[1];
        GGML_ASSERT(ggml_is_contiguous(x) && ggml_is_contiguous(ids) && ggml_is_contiguous(dst));
        GGML_ASSERT(dst->ne[0] == slot->n_x);
        k_mailbox_send<<<1, 256, 0, stream>>>(slot, slot->step_dev, ggml_mailbox_slot_x(slot), ggml_mailbox_slot_ids(slot), slot->n_x, slot->n_ids,
                                              (int) ggml_nrows(dst), (const float *) x->data, (const int32_t *) ids->data, route, miss_slot,
                                              (float *) dst->data);
    } else {
        const ggml_tensor * base = dst->src[1];
        GGML_ASSERT(ggml_is_contiguous(dst) && ggml_is_contiguous(base) && ggml_nelements(base) == slot->n_y);
        GGML_ASSERT(slot->n_y % slot->n_ids == 0);
        GGML_ASSERT(ggml_nelements(dst) == (mode == GGML_MAILBOX_RECV_SUM ? slot->n_y / slot->n_ids : slot->n_y));
        const uint64_t timeout_ns = (uint64_t) ggml_mailbox_get_timeout(dst) * 1000000ull;
        // the payload's address is 256-byte aligned (ggml_mailbox_slot_init), so rows of a multiple of 4 floats
        // go as float4 where base and dst are aligned too
        if (mode == GGML_MAILBOX_RECV_SUM) {
            const ggml_tensor * w = dst->src[3];
            k_mailbox_recv_sum<<<1, 512, 0, stream>>>(slot, slot->step_dev, ggml_mailbox_slot_y(slot), slot->n_ids, slot->n_y / slot->n_ids,
                                                      (const float *) base->data, w ? (const float *) w->data : nullptr,
                                                      w ? w->nb[1] / sizeof(float) : 0, (float *) dst->data, timeout_ns, route, miss_slot);
        } else if (mode == GGML_MAILBOX_RECV_ADD) {
            k_mailbox_recv<true><<<1, 512, 0, stream>>>(slot, slot->step_dev, ggml_mailbox_slot_y(slot), slot->n_ids, slot->n_y / slot->n_ids,
                                                        (const float *) base->data, (float *) dst->data, timeout_ns, route, miss_slot);
        } else {
            k_mailbox_recv<false><<<1, 512, 0, stream>>>(slot, slot->step_dev, ggml_mailbox_slot_y(slot), slot->n_ids, slot->n_y / slot->n_ids,
                                                         (const float *) base->data, (float *) dst->data, timeout_ns, route, miss_slot);
        }
    }
    CUDA_CHECK(cudaGetLastError());
}
