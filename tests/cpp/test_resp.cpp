// The RESP reply parser (redis/io/resp.h): hiredis's reader plus the conversion into Reply.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "redcount/common/errors.h"
#include "redcount/redis/io/resp.h"
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

// Replies complete in the bytes at hand are parsed in place; a reply in pieces, and
// anything that is not plain RESP2, goes through hiredis. Both must give the same replies
// and the same errors, however the bytes are cut.
std::string random_reply(std::mt19937& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  switch (pick(depth < 3 ? 7 : 6)) {
    case 0: return "+" + std::string(static_cast<std::size_t>(pick(12)), 'Q') + "\r\n";
    case 1: return "-ERR bad " + std::to_string(pick(1000)) + "\r\n";
    case 2: return ":" + std::to_string(static_cast<long long>(rng()) - (1LL << 31)) + "\r\n";
    case 3: {
      std::string body(static_cast<std::size_t>(pick(40)), 'x');
      if (!body.empty()) body[0] = '\r';  // bulk strings carry any byte, CR and LF too
      if (body.size() > 1) body[1] = '\n';
      return "$" + std::to_string(body.size()) + "\r\n" + body + "\r\n";
    }
    case 4: return "$-1\r\n";
    case 5: return pick(2) ? "*-1\r\n" : ":0\r\n";
    default: {
      const int n = pick(5);
      std::string out = "*" + std::to_string(n) + "\r\n";
      for (int i = 0; i < n; ++i) out += random_reply(rng, depth + 1);
      return out;
    }
  }
}

std::string describe(const Reply& r) {
  std::string out = std::to_string(static_cast<int>(r.type)) + ":" + std::to_string(r.integer) + ":" + r.str;
  if (r.type == Reply::Type::Array) {
    out += "[";
    for (const Reply& e : r.elements) out += describe(e) + ",";
    out += "]";
  }
  return out;
}

// Every reply of `bytes` fed in chunks of the sizes `cut` picks, or the error it ends in.
std::vector<std::string> parse_all(const std::string& bytes, const std::function<std::size_t()>& cut) {
  resp::Parser p;
  std::vector<std::string> out;
  try {
    for (std::size_t at = 0; at < bytes.size();) {
      const std::size_t n = std::min(bytes.size() - at, std::max<std::size_t>(1, cut()));
      p.feed(bytes.data() + at, n);
      at += n;
      while (auto r = p.next()) out.push_back(describe(*r));
    }
  } catch (const ProtocolError& e) {
    out.push_back(std::string("error: ") + e.what());
  }
  return out;
}

TEST(RespParser, SameRepliesWhetherCompleteOrInPieces) {
  std::mt19937 rng(20261125);
  for (int round = 0; round < 300; ++round) {
    std::string bytes;
    const int replies = 1 + static_cast<int>(rng() % 20);
    for (int i = 0; i < replies; ++i) bytes += random_reply(rng, 0);
    if (round % 10 == 9) bytes += (round % 20 == 9) ? ":12x\r\n:1\r\n" : "?junk\r\n";  // bad bytes at the end
    const auto whole = parse_all(bytes, [&] { return bytes.size(); });
    EXPECT_EQ(whole, parse_all(bytes, [] { return std::size_t{1}; })) << bytes;
    EXPECT_EQ(whole, parse_all(bytes, [&] { return std::size_t{1} + rng() % 17; })) << bytes;
    if (round % 10 == 9) {
      EXPECT_TRUE(whole.back().starts_with("error: ")) << bytes;
    }
  }
}

// Forms hiredis accepts or refuses by its own rules (a '+' sign, leading zeros, RESP3
// types, a bulk string without its CRLF) reach hiredis whole, so its verdict stands.
TEST(RespParser, UnusualFormsGetHiredisVerdict) {
  for (const std::string bytes : {":+5\r\n", ":007\r\n", ":-0\r\n", "$3\r\nfooXY", "_\r\n", ",1.5\r\n",
                                  "*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n", "$-2\r\n"}) {
    EXPECT_EQ(parse_all(bytes, [&] { return bytes.size(); }), parse_all(bytes, [] { return std::size_t{1}; }))
        << bytes;
  }
}

}  // namespace
