// One core's rate of the expert-row products the CPU part runs (vec_dot of MXFP4, Q4_0 and Q8_0 rows against a
// Q8_0 row), in L2 and from RAM, beside a plain read; the best of several passes, so a busy machine shows its floor.
//   B=~/.cache/llama_moe/work/cpu; gcc -O2 -mavx2 -mfma -o /tmp/vd benchmarks/vec_dot_rates.c -I$B/llama.cpp/ggml/include \
//       -L$B/build/bin -lggml-cpu -lggml-base -Wl,-rpath,$B/build/bin && taskset -c 1 /tmp/vd
#include "ggml.h"
#include "ggml-cpu.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static double bench(enum ggml_type t, int n, size_t nrows, int reps, int prefetch) {
    const struct ggml_type_traits_cpu * tr = ggml_get_type_traits_cpu(t);
    const struct ggml_type_traits_cpu * ty = ggml_get_type_traits_cpu(tr->vec_dot_type);
    size_t rb = ggml_row_size(t, n);
    char * w = aligned_alloc(64, (rb*nrows+63)/64*64);
    float * f = malloc(n*sizeof(float)); for (int i=0;i<n;i++) f[i]= (float)rand()/RAND_MAX-0.5f;
    // random weights: quantize random floats row by row
    for (size_t r=0;r<nrows;r++) ggml_quantize_chunk(t, f, w + r*rb, 0, 1, n, NULL);
    char * y = aligned_alloc(64, (ggml_row_size(tr->vec_dot_type,n)+63)/64*64);
    ty->from_float(f, y, n);
    float s=0, acc=0; double best=1e9;
    // prefetch: the rows 4 KiB ahead of the one computed, through ggml-cpu's own calls (as one token's MUL_MAT_ID)
    for (int k=0;k<reps;k++){ double t0=now();
        const int64_t ahead = ggml_cpu_mmid_prefetch_begin(w, w + rb*nrows, rb, prefetch ? 4096 : 0);
        for(size_t r=0;r<nrows;r++){
        ggml_cpu_mmid_prefetch(w + (r+ahead)*rb, w + rb*nrows, rb, ahead);
        tr->vec_dot(n,&s,0,w+r*rb,0,y,0,1); acc+=s;} double dt=now()-t0; if(dt<best)best=dt; }
    if (acc==12345) printf("x");
    free(w); free(f); free(y);
    return rb*nrows/best/1e9;
}
static double plain(size_t bytes, int reps){ long long *p=aligned_alloc(64,bytes); memset(p,1,bytes); double best=1e9; long long s=0;
  for(int k=0;k<reps;k++){double t0=now(); for(size_t i=0;i<bytes/8;i+=4){s+=p[i]+p[i+1]+p[i+2]+p[i+3];} double dt=now()-t0; if(dt<best)best=dt;}
  if(s==1)printf("x"); free(p); return bytes/best/1e9;}
int main(void){
  ggml_cpu_init();
  int n = 2880; // gpt-oss-120b's rows; Qwen3-30B-A3B's are 2048 and 768
  size_t small = 64, big = 40000;   // ~100 KB (L2) and ~60 MB (RAM) of rows
  printf("plain read: %.1f GB/s (L2) %.1f GB/s (RAM)\n", plain(128*1024, 2000), plain(256u<<20, 5));
  enum ggml_type ts[] = {GGML_TYPE_MXFP4, GGML_TYPE_Q4_0, GGML_TYPE_Q8_0};
  for (int i=0;i<3;i++) printf("%-6s n=%d: %.1f GB/s in L2, %.1f GB/s from RAM, %.1f GB/s from RAM with the rows ahead prefetched\n",
      ggml_type_name(ts[i]), n, bench(ts[i], n, small, 3000, 0), bench(ts[i], n, big, 5, 0), bench(ts[i], n, big, 5, 1));
  return 0;
}
