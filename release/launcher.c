// The release bundle's bin/NAME: starts libexec/NAME with the bundle's own
// dynamic loader and libraries, so the binaries run on any x86-64 Linux with
// a kernel >= 3.2 whatever glibc (if any) it has. Statically linked, so it
// needs nothing from the host either (no shell, no loader).
//
// Contract: the launcher lives in DIR/bin; it execs
//   DIR/lib/ld-linux-x86-64.so.2 --argv0 ARGV0 --library-path DIR/lib[:$SDC_TORCH_LIB]
//       DIR/libexec/NAME ARGS...
// with NAME the launcher's own file name (symlinks to it are resolved, so
// /usr/local/bin/sdcd -> /opt/sdc-guard/current/bin/sdcd works). It sets
// SDC_BUNDLE_EXE to its own path, so that a program that re-executes itself
// (sdc-agent's diagnostic child) runs the launcher and not the loader.
// sdc-agent links libtorch, which the bundle does not carry: SDC_TORCH_LIB
// names the directory holding libtorch.so (torch's lib/ in a Python
// environment with the pinned torch); the launcher refuses to start
// sdc-agent without it.
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// Writes A B into out, false when it does not fit.
static int Join(char* out, size_t size, const char* a, const char* b) {
  const int n = snprintf(out, size, "%s%s", a, b);
  return n >= 0 && (size_t)n < size;
}

static int Fail(const char* name, const char* what, const char* path) {
  fprintf(stderr, "%s: release bundle launcher: %s%s%s\n", name, what, path ? ": " : "",
          path ? path : "");
  return 127;
}

int main(int argc, char** argv) {
  // Where the launcher is: /proc/self/exe, else (no /proc) argv[0] made
  // absolute; both resolve symlinks.
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    self[n] = '\0';
  } else if (argc < 1 || strchr(argv[0], '/') == NULL || realpath(argv[0], self) == NULL) {
    return Fail("sdc-guard", "cannot find the bundle: no /proc/self/exe and no path in argv[0]",
                NULL);
  }
  char* slash = strrchr(self, '/');
  if (slash == NULL) return Fail("sdc-guard", "odd executable path", self);
  char name[NAME_MAX + 1];
  snprintf(name, sizeof(name), "%s", slash + 1);
  *slash = '\0';  // self is now DIR/bin
  char* bin = strrchr(self, '/');
  if (bin == NULL || strcmp(bin + 1, "bin") != 0) {
    return Fail(name, "the launcher must live in DIR/bin of the bundle, not", self);
  }
  *bin = '\0';  // self is now DIR
  const char* dir = self[0] == '\0' ? "" : self;

  char loader[PATH_MAX], lib[PATH_MAX], program[PATH_MAX], exe[PATH_MAX];
  char library_path[2 * PATH_MAX + 2];
  char libexec_name[NAME_MAX + 16], bin_name[NAME_MAX + 16];
  snprintf(libexec_name, sizeof(libexec_name), "/libexec/%s", name);
  snprintf(bin_name, sizeof(bin_name), "/bin/%s", name);
  if (!Join(loader, sizeof(loader), dir, "/lib/ld-linux-x86-64.so.2") ||
      !Join(lib, sizeof(lib), dir, "/lib") ||
      !Join(program, sizeof(program), dir, libexec_name) ||
      !Join(exe, sizeof(exe), dir, bin_name)) {
    return Fail(name, "bundle path too long", dir);
  }
  if (access(program, X_OK) != 0) return Fail(name, "no such program in the bundle", program);
  if (access(loader, X_OK) != 0) return Fail(name, "the bundle's loader is missing", loader);

  const char* torch = getenv("SDC_TORCH_LIB");
  if (torch != NULL && torch[0] != '\0') {
    char libtorch[PATH_MAX], with_colon[PATH_MAX + 1];
    if (!Join(libtorch, sizeof(libtorch), torch, "/libtorch.so") || access(libtorch, R_OK) != 0) {
      return Fail(name, "SDC_TORCH_LIB holds no libtorch.so", torch);
    }
    Join(with_colon, sizeof(with_colon), lib, ":");
    if (!Join(library_path, sizeof(library_path), with_colon, torch)) {
      return Fail(name, "SDC_TORCH_LIB too long", torch);
    }
  } else if (strcmp(name, "sdc-agent") == 0) {
    return Fail(name,
                "set SDC_TORCH_LIB to the lib/ directory of a torch install (it holds "
                "libtorch.so); the bundle does not carry torch",
                NULL);
  } else {
    Join(library_path, sizeof(library_path), lib, "");
  }
  setenv("SDC_BUNDLE_EXE", exe, 1);

  char** args = calloc((size_t)argc + 8, sizeof(char*));
  if (args == NULL) return Fail(name, "out of memory", NULL);
  int i = 0;
  args[i++] = loader;
  args[i++] = "--argv0";
  args[i++] = argv[0];
  args[i++] = "--library-path";
  args[i++] = library_path;
  args[i++] = program;
  for (int k = 1; k < argc; ++k) args[i++] = argv[k];
  args[i] = NULL;
  execv(loader, args);
  return Fail(name, strerror(errno), loader);
}
