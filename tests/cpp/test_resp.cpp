// The RESP reply parser (redis/resp.h): hiredis's reader plus the conversion into Reply.
#include <gtest/gtest.h>

#include <string>

#include "redcount/common/errors.h"
#include "redcount/redis/resp.h"
#include "test_support.h"

using namespace redcount;

namespace {

TEST(RespParser, RepliesFedInPieces) {
  resp::Parser p;
  const std::string bytes = "+OK\r\n:42\r\n$3\r\nfoo\r\n$-1\r\n*2\r\n:1\r\n-ERR no\r\n";
  std::vector<Reply> got;
  for (char c : bytes) {
    p.feed(&c, 1);
    while (auto r = p.next()) got.push_back(std::move(*r));
  }
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0].type, Reply::Type::Status);
  EXPECT_EQ(got[1].integer, 42);
  EXPECT_EQ(got[2].str, "foo");
  EXPECT_TRUE(got[3].is_nil());
  ASSERT_EQ(got[4].elements.size(), 2u);
  EXPECT_TRUE(got[4].elements[1].is_error());
}

// Found by the RESP fuzzer: hiredis allocates an array's element pointers when it reads
// the header, so "*1700000000" made the client allocate 13.6 GB. Such a header is refused
// before any allocation, with a message that says why.
TEST(RespParser, HugeArrayHeadersAreRefused) {
  for (const std::string header : {"*1700000000\r\n", "*2\r\n:1\r\n*2147483647\r\n"}) {
    resp::Parser p;
    p.feed(header.data(), header.size());
    const std::string message = rctest::error_of<ProtocolError>([&] { p.next(); });
    EXPECT_TRUE(rctest::contains(message, "elements (at most 134217728")) << message;
  }
  // A large array below the limit is accepted: the parser waits for its elements.
  resp::Parser p;
  const std::string header = "*1000000\r\n";
  p.feed(header.data(), header.size());
  EXPECT_FALSE(p.next());
}

}  // namespace
