#!/usr/bin/env python3
"""Makes the sdc_guard wheel: the Python package, the extension module that
Bazel built (//client/python:_C.so) and the shared libraries it needs that a
machine with torch does not have (Debian's gRPC, protobuf, Abseil, c-ares,
RE2, OpenSSL, zlib, prometheus-cpp's core), in sdc_guard.libs/ with RPATH
$ORIGIN, as auditwheel lays out a wheel. torch's own libraries are not bundled: the package imports
torch first and the extension binds to the copies torch loaded.

The wheel leaves glibc and libstdc++ to the machine, so every file in it must
need no newer symbol versions than the oldest target has: Amazon Linux 2023
(glibc 2.34, GCC 11's libstdc++: GLIBCXX_3.4.29, CXXABI_1.3.13); Ubuntu
22.04 and 24.04 have newer ones. The build fails, naming file and symbol,
when one needs more (FLOOR below).

usage: build_wheel.py --extension PATH --package DIR --out DIR [--version V]
Prints the wheel's path. Needs patchelf, ldd and objdump.
"""

import argparse
import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

# Libraries every Linux machine with a C++ toolchain's runtime has; never
# bundled (bundling glibc breaks, libstdc++ must be the process's one).
SYSTEM = re.compile(
    r"^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libutil|libgcc_s|libstdc\+\+)\.so")


# The newest symbol version each target-provided library may be asked for.
FLOOR = {"GLIBC": (2, 34), "GLIBCXX": (3, 4, 29), "CXXABI": (1, 3, 13)}


def too_new_symbols(path):
    """["symbol@VERSION", ...] that `path` imports from glibc or libstdc++
    with a version above FLOOR."""
    out = subprocess.run(["objdump", "-T", path], check=True, capture_output=True, text=True).stdout
    bad = []
    for line in out.splitlines():
        if "*UND*" not in line:
            continue
        m = re.search(r"\b(GLIBC|GLIBCXX|CXXABI)_([0-9.]+)\b\)?\s+(\S+)\s*$", line)
        if not m:
            continue
        family, version, symbol = m.groups()
        if tuple(int(x) for x in version.split(".")) > FLOOR[family]:
            bad.append(f"{symbol}@{family}_{version}")
    return sorted(set(bad))


def needed_libraries(path):
    """{soname: resolved path} of what ldd resolves for `path`, minus the
    system libraries and anything inside a Python environment (torch's)."""
    out = subprocess.run(["ldd", path], check=True, capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+)\s+=>\s+(/\S+)", line)
        if not m:
            continue
        soname, resolved = m.groups()
        if SYSTEM.match(soname) or "site-packages" in resolved:
            continue
        found[soname] = resolved
    return found


def record_line(root, relative):
    data = open(os.path.join(root, relative), "rb").read()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{relative},sha256={digest},{len(data)}"


def torch_version():
    import importlib.metadata

    return importlib.metadata.version("torch").split("+")[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extension", required=True, help="the _C.so Bazel built")
    parser.add_argument("--package", required=True, help="the sdc_guard/ source folder")
    parser.add_argument("--out", required=True, help="where the wheel goes (dist/)")
    parser.add_argument("--version", default=None, help="default: sdc_guard.__version__")
    args = parser.parse_args()
    for tool in ("patchelf", "ldd", "objdump"):
        if shutil.which(tool) is None:
            sys.exit(f"build_wheel.py: {tool} is not installed")

    version = args.version
    if version is None:
        text = open(os.path.join(args.package, "__init__.py")).read()
        version = re.search(r'__version__ = "([^"]+)"', text).group(1)
    python_tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    name = f"sdc_guard-{version}-{python_tag}-{python_tag}-{platform}.whl"
    dist_info = f"sdc_guard-{version}.dist-info"

    with tempfile.TemporaryDirectory() as root:
        package = os.path.join(root, "sdc_guard")
        libs = os.path.join(root, "sdc_guard.libs")
        os.makedirs(package)
        os.makedirs(libs)
        for f in sorted(os.listdir(args.package)):
            if f.endswith(".py"):
                shutil.copy(os.path.join(args.package, f), package)
        extension = os.path.join(package, "_C.so")
        shutil.copy(args.extension, extension)
        os.chmod(extension, 0o755)
        for soname, resolved in sorted(needed_libraries(args.extension).items()):
            target = os.path.join(libs, soname)
            shutil.copy(resolved, target)
            os.chmod(target, 0o755)
            subprocess.run(["patchelf", "--set-rpath", "$ORIGIN", target], check=True)
        # Only the bundled libraries: torch's come from the process.
        subprocess.run(["patchelf", "--set-rpath", "$ORIGIN/../sdc_guard.libs", extension],
                       check=True)
        for lib in [extension] + sorted(os.path.join(libs, f) for f in os.listdir(libs)):
            bad = too_new_symbols(lib)
            if bad:
                sys.exit(f"build_wheel.py: {os.path.basename(lib)} needs symbols newer than the "
                         f"oldest target (Amazon Linux 2023: {FLOOR}): {', '.join(bad[:8])}")

        os.makedirs(os.path.join(root, dist_info))
        with open(os.path.join(root, dist_info, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\n"
                    "Name: sdc-guard\n"
                    f"Version: {version}\n"
                    "Summary: Catches silent data corruption inside PyTorch DDP training\n"
                    f"Requires-Python: =={sys.version_info.major}.{sys.version_info.minor}.*\n"
                    f"Requires-Dist: torch=={torch_version()}\n")
        with open(os.path.join(root, dist_info, "WHEEL"), "w") as f:
            f.write("Wheel-Version: 1.0\n"
                    "Generator: sdc-guard build_wheel.py\n"
                    "Root-Is-Purelib: false\n"
                    f"Tag: {python_tag}-{python_tag}-{platform}\n")
        with open(os.path.join(root, dist_info, "top_level.txt"), "w") as f:
            f.write("sdc_guard\n")
        files = []
        for top, _, names in os.walk(root):
            for n in names:
                files.append(os.path.relpath(os.path.join(top, n), root))
        files.sort()
        record = os.path.join(dist_info, "RECORD")
        lines = [record_line(root, f) for f in files] + [f"{record},,"]
        with open(os.path.join(root, record), "w") as f:
            f.write("\n".join(lines) + "\n")
        os.makedirs(args.out, exist_ok=True)
        wheel = os.path.join(args.out, name)
        tmp = wheel + ".tmp"
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for f in files + [record]:
                z.write(os.path.join(root, f), f)
        os.replace(tmp, wheel)
    print(wheel)


if __name__ == "__main__":
    main()
