"""The PyTorch that ./sdc installs into the project's virtual environment.

A repository rule, because where that environment lives depends on the
machine: $SDC_VENV (./sdc passes it with --repo_env), else
$HOME/.cache/sdc-guard/venv. ./sdc compat points it at environments with
other torch versions (one Bazel output base each). The rule asks the
environment's Python where torch is, and makes a repository of symlinks:

  include/         every folder of torch's include/ except google/ (torch's
                   copy of protobuf's headers, older than Debian's: on the
                   include path it would shadow the ones gRPC is built with)
  lib/             torch's shared libraries
  cuda_include/    the CUDA runtime's headers, from torch's nvidia-* wheels

Nothing here is CPython's: sdc_guard's engine library is libtorch C++ only
(client/python/BUILD).
"""

def _run(ctx, python, code):
    result = ctx.execute([python, "-c", code])
    if result.return_code != 0:
        fail("%s could not run (%s). Run ./sdc setup, which installs the pinned torch." %
             (python, result.stderr.strip()))
    return result.stdout.strip()

def _local_torch_impl(ctx):
    venv = ctx.os.environ.get("SDC_VENV", "")
    if not venv:
        venv = ctx.os.environ.get("HOME", "") + "/.cache/sdc-guard/venv"
    python = venv + "/bin/python3"
    if not ctx.path(python).exists:
        fail("no Python environment at %s. Run ./sdc setup, which makes it and installs torch." % venv)
    lines = _run(ctx, python, "\n".join([
        "import os, sysconfig, torch",
        "print(os.path.dirname(torch.__file__))",
        "print(sysconfig.get_paths()['purelib'])",
        "print(torch.__version__)",
    ])).split("\n")
    torch_dir, site, version = lines[0], lines[1], lines[2]
    for entry in ctx.path(torch_dir + "/include").readdir():
        if entry.basename != "google":
            ctx.symlink(entry, "include/" + entry.basename)
    ctx.symlink(torch_dir + "/lib", "lib")

    # libtorch_cuda needs the CUDA libraries of the nvidia-* wheels; its own
    # RPATH finds them at run time, the linker needs to be told. The CUDA
    # runtime's headers and library come from the same wheels, so a process
    # holds one CUDA runtime, torch's.
    nvidia = ctx.path(site + "/nvidia")
    rpath_link = []
    cuda_dir = None
    if nvidia.exists:
        for package in nvidia.readdir():
            if package.get_child("lib").exists:
                rpath_link.append("-Wl,-rpath-link,%s/lib" % package)
            if package.get_child("include").get_child("cuda_runtime_api.h").exists:
                cuda_dir = package
    if cuda_dir == None:
        fail("torch %s in %s has no CUDA runtime (nvidia-cuda-runtime): the pinned wheel is the CUDA one" %
             (version, venv))
    ctx.symlink(cuda_dir.get_child("include"), "cuda_include")

    # libcudart.so.13 beside torch 2.11's default wheel, .so.12 beside 2.9's.
    cudart = [f.basename for f in cuda_dir.get_child("lib").readdir()
              if f.basename.startswith("libcudart.so.")]
    if len(cudart) != 1:
        fail("expected one libcudart.so.N in %s/lib, found %s" % (cuda_dir, cudart))
    ctx.template("BUILD", ctx.attr.build_template, {
        "%{TORCH_LIB}": torch_dir + "/lib",
        "%{TORCH_VERSION}": version,
        "%{CUDA_LIB}": str(cuda_dir) + "/lib",
        "%{CUDART}": cudart[0],
        "%{CUDA_RPATH_LINK}": ",\n        ".join(['"%s"' % f for f in sorted(rpath_link)]),
    })

local_torch = repository_rule(
    implementation = _local_torch_impl,
    attrs = {"build_template": attr.label(allow_single_file = True)},
    environ = ["SDC_VENV", "HOME"],
    local = True,
)
