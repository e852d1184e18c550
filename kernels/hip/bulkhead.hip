// The one translation unit kernels/build.rs compiles (per architecture) into
// the code object the HIP backend loads: every kernel of kernels/hip.
#include "embedding.hip"
#include "quantize.hip"
#include "matvec.hip"
#include "matmul.hip"
#include "ops.hip"
#include "attention.hip"
#include "step.hip"
#include "sha256.hip"
