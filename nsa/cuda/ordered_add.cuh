// fp32 adds into global memory in a fixed order across blocks (the own dense kernel's dq in the
// key side: attention_tc.cuh, key_kernel's kDq form; measured by bench/l2_add_gpu.cu).
//
// A block adds its tile only after a turn counter says that every earlier contributor's adds
// are done (load_acquire), and passes the turn on after its own (a fence, then store_release),
// so each element's sum has one order whatever the blocks' timing: the same bits every run.
// The adds themselves are reductions performed in the L2 (red: no value returned, nothing to
// wait for); on sm_90 four consecutive floats in one instruction.
#pragma once
#include <cuda_runtime.h>

namespace nsatron::nsa::cuda {

// *p += v, element-wise, p 16-byte aligned.
__device__ __forceinline__ void red_add_v4(float* p, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
#else
  atomicAdd(p, v.x);  // (the results unused: compiled as reductions)
  atomicAdd(p + 1, v.y);
  atomicAdd(p + 2, v.z);
  atomicAdd(p + 3, v.w);
#endif
}
// A turn counter's value, ordered before this thread's later memory operations (gpu scope).
__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Sets a turn counter after this thread's earlier memory operations (gpu scope).
__device__ __forceinline__ void store_release(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

}  // namespace nsatron::nsa::cuda
