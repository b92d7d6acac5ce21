// Flash attention kernels for head sizes padded to 32; TF32 split 1 (`tf32`) and 3 (`fp32`).
// The templates come first (flash_attention.cuh, prepended by the kernel registry).

extern "C" __global__ void flash_forward_d32_s1(FWD_PARAMS) { flash_forward<32, 1>(FWD_ARGS); }
extern "C" __global__ void flash_forward_d32_s3(FWD_PARAMS) { flash_forward<32, 3>(FWD_ARGS); }
extern "C" __global__ void flash_backward_dkdv_d32_s1(BWD_PARAMS) { flash_backward_dkdv<32, 1>(BWD_ARGS); }
extern "C" __global__ void flash_backward_dkdv_d32_s3(BWD_PARAMS) { flash_backward_dkdv<32, 3>(BWD_ARGS); }
extern "C" __global__ void flash_backward_dq_d32_s1(BWD_PARAMS) { flash_backward_dq<32, 1>(BWD_ARGS); }
extern "C" __global__ void flash_backward_dq_d32_s3(BWD_PARAMS) { flash_backward_dq<32, 3>(BWD_ARGS); }
