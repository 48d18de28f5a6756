// ParseListenAddress: the spellings sdcd, sdc-agent and trainers accept,
// and a message naming the address for each it refuses.

#include "common/metrics/listen_address.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::metrics {
namespace {

using ::testing::HasSubstr;

TEST(ListenAddressTest, AcceptedSpellings) {
  const struct {
    const char* address;
    const char* host;
    uint16_t port;
  } cases[] = {
      {"127.0.0.1:9464", "127.0.0.1", 9464},
      {"localhost:0", "127.0.0.1", 0},
      {":9465", "0.0.0.0", 9465},
      {"10.1.2.3:65535", "10.1.2.3", 65535},
  };
  for (const auto& c : cases) {
    absl::StatusOr<ListenAddress> parsed = ParseListenAddress(c.address);
    ASSERT_TRUE(parsed.ok()) << c.address << ": " << parsed.status();
    EXPECT_EQ(parsed->host, c.host) << c.address;
    EXPECT_EQ(parsed->port, c.port) << c.address;
  }
}

TEST(ListenAddressTest, RefusedSpellingsAreInvalidArgumentNamingTheAddress) {
  const struct {
    const char* address;
    const char* why;
  } cases[] = {
      {"nonsense", "no port"},
      {"127.0.0.1", "no port"},
      {"127.0.0.1:", "is not a number in 0..65535"},
      {"127.0.0.1:99999", "is not a number in 0..65535"},
      {"127.0.0.1:-1", "is not a number in 0..65535"},
      {"127.0.0.1:80x", "is not a number in 0..65535"},
      {"example.com:80", "is not an IPv4 literal or localhost"},
      {"[::1]:80", "IPv6 is not supported"},
      {"[::1:80", "IPv6 is not supported"},
      {"1.2.3:80", "is not an IPv4 literal or localhost"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<ListenAddress> parsed = ParseListenAddress(c.address);
    ASSERT_FALSE(parsed.ok()) << c.address;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.address;
    const std::string message(parsed.status().message());
    EXPECT_THAT(message, HasSubstr(absl::StrCat("\"", c.address, "\"")));
    EXPECT_THAT(message, HasSubstr(c.why)) << c.address;
  }
}

}  // namespace
}  // namespace sdc::metrics
