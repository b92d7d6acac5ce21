// Flash attention kernels for head sizes padded to 16; TF32 split 1 (`tf32`) and 3 (`fp32`).
// The templates come first (flash_attention.cuh, prepended by the kernel registry).

extern "C" __global__ void flash_forward_d16_s1(FWD_PARAMS) { flash_forward<16, 1>(FWD_ARGS); }
extern "C" __global__ void flash_forward_d16_s3(FWD_PARAMS) { flash_forward<16, 3>(FWD_ARGS); }
extern "C" __global__ void flash_backward_dkdv_d16_s1(BWD_PARAMS) { flash_backward_dkdv<16, 1>(BWD_ARGS); }
extern "C" __global__ void flash_backward_dkdv_d16_s3(BWD_PARAMS) { flash_backward_dkdv<16, 3>(BWD_ARGS); }
extern "C" __global__ void flash_backward_dq_d16_s1(BWD_PARAMS) { flash_backward_dq<16, 1>(BWD_ARGS); }
extern "C" __global__ void flash_backward_dq_d16_s3(BWD_PARAMS) { flash_backward_dq<16, 3>(BWD_ARGS); }
