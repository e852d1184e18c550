#include <hip/hip_runtime.h>
extern "C" __global__ void add_one(float* x, unsigned n) { unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }
