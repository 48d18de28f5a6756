#!/usr/bin/env python3
"""Makes the sdc_guard wheel: the pure-Python package, the engine library
Bazel built (//client/python:libsdc_engine.so) for each torch version given,
in sdc_guard/engines/torch<major>.<minor>/, and the shared libraries they need
that a machine with torch does not have (Debian's gRPC, protobuf, Abseil,
c-ares, RE2, OpenSSL, zlib, prometheus-cpp's core), in sdc_guard.libs/ with
RPATH $ORIGIN, as auditwheel lays out a wheel. torch's own libraries are not bundled: the
package imports torch first and the engine binds to the copies torch loaded.

The engine libraries hold no CPython code (the build fails, naming the
symbol, if one needs libpython or libtorch_python), so the wheel is tagged
py3-none: one wheel for every CPython 3.10+ and the torch versions it
carries, which its metadata requires.

The wheel leaves glibc and libstdc++ to the machine, so every file in it must
need no newer symbol versions than the oldest target has: Amazon Linux 2023
(glibc 2.34, GCC 11's libstdc++: GLIBCXX_3.4.29, CXXABI_1.3.13); Ubuntu
22.04 and 24.04 have newer ones. The build fails, naming file and symbol,
when one needs more (FLOOR below).

usage: build_wheel.py --engine TORCH=PATH [--engine ...] --package DIR --out DIR [--version V]
(TORCH: the torch version the library was built against, e.g. 2.11.0.)
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


def undefined_symbols(path):
    """[(symbol, version or "")] that `path` imports."""
    out = subprocess.run(["objdump", "-T", path], check=True, capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        if "*UND*" not in line:
            continue
        m = re.search(r"(?:\(?([A-Z]+_[0-9.]+)\)?\s+)?(\S+)\s*$", line)
        if m:
            found.append((m.group(2), m.group(1) or ""))
    return found


def cpython_uses(path):
    """What ties `path` to one CPython: libpython or libtorch_python among its
    NEEDED entries, or Py*/_Py* symbols it imports."""
    out = subprocess.run(["objdump", "-p", path], check=True, capture_output=True, text=True).stdout
    needed = re.findall(r"^\s*NEEDED\s+(\S+)", out, re.M)
    bad = [n for n in needed if n.startswith(("libpython", "libtorch_python"))]
    bad += sorted({s for s, _ in undefined_symbols(path) if re.match(r"_?Py[A-Z_]", s)})
    return bad


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


def minor(version):
    """(major, minor) of "2.11.0"."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        sys.exit(f"build_wheel.py: {version!r} is not a torch version")
    return int(m.group(1)), int(m.group(2))


def torch_requirement(versions):
    """The torch range a wheel with engines for `versions` runs on: from the
    oldest minor version to the newest, without the ones in between it lacks."""
    minors = sorted({minor(v) for v in versions})
    (lo_major, lo), (hi_major, hi) = minors[0], minors[-1]
    spec = [f">={lo_major}.{lo}", f"<{hi_major}.{hi + 1}"]
    if lo_major == hi_major:
        spec += [f"!={lo_major}.{m}.*" for m in range(lo + 1, hi) if (lo_major, m) not in minors]
    return "torch" + ",".join(spec)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", required=True, action="append", metavar="TORCH=PATH",
                        help="a libsdc_engine.so and the torch version it was built against")
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
    engines = {}  # "torch2.11" -> path
    for spec in args.engine:
        torch, _, path = spec.partition("=")
        if not path or not os.path.isfile(path):
            sys.exit(f"build_wheel.py: --engine {spec}: expected TORCH_VERSION=PATH of a file")
        folder = "torch%d.%d" % minor(torch)
        if folder in engines:
            sys.exit(f"build_wheel.py: two engines for {folder}")
        engines[folder] = (torch, path)
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    name = f"sdc_guard-{version}-py3-none-{platform}.whl"
    dist_info = f"sdc_guard-{version}.dist-info"

    with tempfile.TemporaryDirectory() as root:
        package = os.path.join(root, "sdc_guard")
        libs = os.path.join(root, "sdc_guard.libs")
        os.makedirs(package)
        os.makedirs(libs)
        for f in sorted(os.listdir(args.package)):
            if f.endswith(".py"):
                shutil.copy(os.path.join(args.package, f), package)
        bundled = {}  # soname -> the file copied
        copies = []
        for folder, (_, path) in sorted(engines.items()):
            bad = cpython_uses(path)
            if bad:
                sys.exit(f"build_wheel.py: {path} is tied to one CPython ({', '.join(bad[:8])}): "
                         "the engine library must use libtorch's C++ API only")
            copy = os.path.join(package, "engines", folder, "libsdc_engine.so")
            os.makedirs(os.path.dirname(copy))
            shutil.copy(path, copy)
            os.chmod(copy, 0o755)
            copies.append(copy)
            for soname, resolved in sorted(needed_libraries(path).items()):
                if soname in bundled:
                    continue
                target = os.path.join(libs, soname)
                shutil.copy(resolved, target)
                os.chmod(target, 0o755)
                subprocess.run(["patchelf", "--set-rpath", "$ORIGIN", target], check=True)
                bundled[soname] = target
            # Only the bundled libraries: torch's come from the process.
            subprocess.run(["patchelf", "--set-rpath", "$ORIGIN/../../../sdc_guard.libs", copy],
                           check=True)
        for lib in copies + sorted(bundled.values()):
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
                    "Requires-Python: >=3.10\n"
                    f"Requires-Dist: {torch_requirement([t for t, _ in engines.values()])}\n")
        with open(os.path.join(root, dist_info, "WHEEL"), "w") as f:
            f.write("Wheel-Version: 1.0\n"
                    "Generator: sdc-guard build_wheel.py\n"
                    "Root-Is-Purelib: false\n"
                    f"Tag: py3-none-{platform}\n")
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
