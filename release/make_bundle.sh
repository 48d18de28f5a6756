#!/usr/bin/env bash
# Lays out a relocatable release bundle and packs it as a .tar.gz:
#   sdc-guard-VERSION-linux-x86_64/
#     bin/NAME       the static launcher (release/launcher.c), one per program
#     libexec/NAME   the program itself, RUNPATH $ORIGIN/../lib
#     lib/           every shared library the programs need, glibc and its
#                    loader included, except torch's (sdc-agent: SDC_TORCH_LIB)
#     share/sdc-guard/VERSION, share/doc/sdc-guard/{LIBRARIES,licenses/}
# usage: make_bundle.sh --version_file F --launcher F --out F.tar.gz NAME=PATH...
# Fails, saying which, when a file a program needs is neither bundled nor one
# of torch's libraries.
set -euo pipefail

die() { printf 'make_bundle: error: %s\n' "$*" >&2; exit 1; }

version_file="" launcher="" out=""
programs=()
while (($#)); do
  case "$1" in
    --version_file) version_file=$2; shift 2 ;;
    --launcher) launcher=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *=*) programs+=("$1"); shift ;;
    *) die "unknown argument '$1'" ;;
  esac
done
[[ -f "$version_file" && -f "$launcher" && -n "$out" && ${#programs[@]} -gt 0 ]] ||
  die "usage: make_bundle.sh --version_file F --launcher F --out F.tar.gz NAME=PATH..."
command -v patchelf >/dev/null || die "patchelf is not installed (Debian package patchelf)"
version=$(tr -d '[:space:]' <"$version_file")
top="sdc-guard-$version-linux-x86_64"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dir="$work/$top"
mkdir -p "$dir/bin" "$dir/libexec" "$dir/lib" "$dir/share/sdc-guard" "$dir/share/doc/sdc-guard/licenses"
printf '%s\n' "$version" >"$dir/share/sdc-guard/VERSION"

# Libraries of torch's Python wheel (torch/lib and the nvidia-* packages):
# sdc-agent finds them through SDC_TORCH_LIB, the bundle never carries them.
is_torch() { [[ "$1" == */site-packages/torch/* || "$1" == */site-packages/nvidia/* ]]; }

declare -A bundled=()
for spec in "${programs[@]}"; do
  name=${spec%%=*}
  path=${spec#*=}
  [[ -x "$path" ]] || die "$name: no executable at $path"
  install -m 0755 "$path" "$dir/libexec/$name"
  # shellcheck disable=SC2016  # $ORIGIN is for the loader, not the shell.
  patchelf --set-rpath '$ORIGIN/../lib' "$dir/libexec/$name"
  install -m 0755 "$launcher" "$dir/bin/$name"
  # ldd resolves the whole closure from the program's own RUNPATH.
  while read -r soname arrow lib _; do
    if [[ "$soname" == /* && "$soname" == */ld-linux-x86-64.so.2 ]]; then
      lib=$soname
      soname=ld-linux-x86-64.so.2
    elif [[ "$arrow" != "=>" || "$lib" != /* ]]; then
      [[ "$arrow" == "=>" && "$lib" == "not" ]] && die "$name: $soname not found on this machine"
      continue
    fi
    is_torch "$lib" && continue
    [[ -n "${bundled[$soname]:-}" ]] && continue
    bundled[$soname]=$(readlink -f "$lib")
  done < <(ldd "$path")
done

for soname in "${!bundled[@]}"; do
  install -m 0755 "${bundled[$soname]}" "$dir/lib/$soname"
done

# Which Debian package each library came from, and that package's licence.
{
  printf '# Shared libraries in lib/, with the Debian package each was taken from.\n'
  for soname in $(printf '%s\n' "${!bundled[@]}" | sort); do
    src=${bundled[$soname]}
    pkg=$(dpkg -S "$src" 2>/dev/null | head -1 | cut -d: -f1) ||
      pkg=$(dpkg -S "${src#/usr}" 2>/dev/null | head -1 | cut -d: -f1) || pkg=""
    [[ -n "$pkg" ]] || pkg="(not from a Debian package)"
    printf '%s\t%s\n' "$soname" "$pkg"
    if [[ -f "/usr/share/doc/$pkg/copyright" ]]; then
      cp "/usr/share/doc/$pkg/copyright" "$dir/share/doc/sdc-guard/licenses/$pkg"
    fi
  done
} >"$dir/share/doc/sdc-guard/LIBRARIES"

# Every DT_NEEDED of every ELF file must be bundled or be torch's.
torch_allowed=" libtorch.so libtorch_cpu.so libtorch_cuda.so libc10.so libc10_cuda.so "
for f in "$dir"/libexec/* "$dir"/lib/*; do
  while read -r needed; do
    [[ -e "$dir/lib/$needed" ]] && continue
    [[ "$torch_allowed" == *" $needed "* ]] && continue
    die "$(basename "$f") needs $needed, which is neither in lib/ nor one of torch's"
  done < <(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
done

mkdir -p "$(dirname "$out")"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work" -cf - "$top" |
  gzip -n -6 >"$out"
