/* What bindgen reads: the HIP runtime API and AMD's extensions (CU masks). */
#include <hip/hip_runtime_api.h>
#include <hip/hip_ext.h>
