# PyTorch %{TORCH_VERSION} from the project's virtual environment (see
# //third_party/torch:torch.bzl).
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "torch",
    hdrs = glob(["include/**"]),
    includes = [
        "include",
        "include/torch/csrc/api/include",
    ],
    # libstdc++ before torch: the wheel's libraries export copies of some
    # libstdc++ functions (built with a newer GCC), and a process must bind
    # to the system's own. With torch first, our calls to
    # std::filesystem::remove_all went to libtorch.so's copy and crashed
    # (tests/torch_grpc_test.cc holds this).
    linkopts = [
        "-Wl,--push-state,--no-as-needed",
        "-lstdc++",
        "-Wl,--pop-state",
        "-L%{TORCH_LIB}",
        "-Wl,-rpath,%{TORCH_LIB}",
        "-ltorch",
        "-ltorch_cpu",
        "-lc10",
    ],
)

# The CUDA runtime torch uses (its nvidia-* wheel), for code nvcc compiled.
cc_library(
    name = "cuda_runtime",
    hdrs = glob(["cuda_include/**"]),
    includes = ["cuda_include"],
    linkopts = [
        "-L%{CUDA_LIB}",
        "-Wl,-rpath,%{CUDA_LIB}",
        "-l:%{CUDART}",
    ],
)

# torch's CUDA libraries. They load on a machine without a GPU (the CUDA
# driver is only opened when a GPU is first used).
cc_library(
    name = "torch_cuda",
    linkopts = [
        "-ltorch_cuda",
        "-lc10_cuda",
        %{CUDA_RPATH_LINK},
    ],
    deps = [
        ":cuda_runtime",
        ":torch",
    ],
)
