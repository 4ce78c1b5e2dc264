#include "mailbox.cuh"

#include "ggml-mailbox.h"

// The slot lives in page-locked host memory: with unified addressing its host pointer is its device pointer.
// Stamps are read and written through volatile pointers, so that each access goes to memory, and ordered
// against the payloads with system-wide fences.

static __device__ __forceinline__ uint64_t ggml_mailbox_now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// one block: the payload, a fence, then the stamp
static __global__ void k_mailbox_send(ggml_mailbox_slot * slot, const float * x, const int32_t * ids, float * x_out) {
    float   * mx   = (float   *) ((char *) slot + slot->off_x);
    int32_t * mids = (int32_t *) ((char *) slot + slot->off_ids);
    for (int i = threadIdx.x; i < slot->n_x; i += blockDim.x) {
        const float v = x[i];
        mx[i]    = v;
        x_out[i] = v;
    }
    for (int i = threadIdx.x; i < slot->n_ids; i += blockDim.x) {
        mids[i] = ids[i];
    }
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile uint64_t * stamp_in = &slot->stamp_in;
        *stamp_in = *stamp_in + 1;
        __threadfence_system();
    }
}

// one block: thread 0 polls the CPU's stamp (at most timeout_ns), then all copy the result
static __global__ void k_mailbox_recv(ggml_mailbox_slot * slot, float * y_out, const uint64_t timeout_ns) {
    __shared__ int ok;
    if (threadIdx.x == 0) {
        volatile uint64_t * stamp_in  = &slot->stamp_in;
        volatile uint64_t * stamp_out = &slot->stamp_out;
        const uint64_t step = *stamp_in;
        const uint64_t t_end = ggml_mailbox_now_ns() + timeout_ns;
        ok = 1;
        while (*stamp_out != step) {
            if (ggml_mailbox_now_ns() > t_end) {
                volatile int32_t * error = &slot->error;
                *error = 1;
                ok = 0;
                break;
            }
            __nanosleep(100);
        }
        __threadfence_system();
    }
    __syncthreads();
    const volatile float * my = (const volatile float *) ((const char *) slot + slot->off_y);
    for (int i = threadIdx.x; i < slot->n_y; i += blockDim.x) {
        y_out[i] = ok ? my[i] : 0.0f;
    }
}

void ggml_cuda_op_mailbox(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    ggml_mailbox_slot * slot = ggml_mailbox_get_slot(dst);
    cudaStream_t stream = ctx.stream();
    if (ggml_mailbox_get_mode(dst) == GGML_MAILBOX_SEND) {
        const ggml_tensor * x   = dst->src[0];
        const ggml_tensor * ids = dst->src[1];
        GGML_ASSERT(ggml_is_contiguous(x) && ggml_is_contiguous(ids));
        k_mailbox_send<<<1, 256, 0, stream>>>(slot, (const float *) x->data, (const int32_t *) ids->data, (float *) dst->data);
    } else {
        GGML_ASSERT(ggml_is_contiguous(dst));
        const uint64_t timeout_ns = (uint64_t) ggml_mailbox_get_timeout(dst) * 1000000ull;
        k_mailbox_recv<<<1, 512, 0, stream>>>(slot, (float *) dst->data, timeout_ns);
    }
    CUDA_CHECK(cudaGetLastError());
}
