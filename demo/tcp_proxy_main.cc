// tcp-proxy: demo/tcp_proxy.h as a process, for tests in other languages
// (tests/python). Prints "listening PORT" once it listens, then reads one
// command a line from standard input:
//   target PORT   forward new connections to 127.0.0.1:PORT (open ones close)
//   cut           close every connection and refuse new ones
//   restore       forward again
// and answers each with "ok" (or "error: ..."). Exits at end of input.

#include <cstdio>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "demo/tcp_proxy.h"

int main(int argc, char** argv) {
  int target = 0;
  if (argc != 2 || !absl::SimpleAtoi(argv[1], &target) || target < 0 || target > 65535) {
    std::fprintf(stderr, "usage: tcp-proxy TARGET_PORT (0: none yet)\n");
    return 2;
  }
  auto proxy = sdc::demo::TcpProxy::Start(target);
  if (!proxy.ok()) {
    std::fprintf(stderr, "tcp-proxy: %s\n", std::string(proxy.status().message()).c_str());
    return 1;
  }
  std::printf("listening %d\n", (*proxy)->port());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    int port = 0;
    if (line.rfind("target ", 0) == 0 && absl::SimpleAtoi(line.substr(7), &port) && port > 0 &&
        port <= 65535) {
      (*proxy)->Retarget(port);
    } else if (line == "cut") {
      (*proxy)->Cut();
    } else if (line == "restore") {
      (*proxy)->Restore();
    } else {
      std::printf("error: unknown command '%s'\n", line.c_str());
      std::fflush(stdout);
      continue;
    }
    std::printf("ok\n");
    std::fflush(stdout);
  }
  return 0;
}
