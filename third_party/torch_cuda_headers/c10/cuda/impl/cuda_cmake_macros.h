#ifndef C10_CUDA_IMPL_CUDA_CMAKE_MACROS_H_
#define C10_CUDA_IMPL_CUDA_CMAKE_MACROS_H_

// libtorch generates this header when it builds c10_cuda; Debian's CPU-only
// libtorch ships the c10/cuda headers without it. A CUDA-enabled libtorch
// (shared libraries) has this one definition. Used only to compile
// //client:device_cuda_compiles.
#define C10_CUDA_BUILD_SHARED_LIBS

#endif  // C10_CUDA_IMPL_CUDA_CMAKE_MACROS_H_
