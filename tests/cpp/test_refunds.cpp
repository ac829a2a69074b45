// Refunds, reservations and settlements (LimiterStrategy::refund, reserve, settle) of every
// rate strategy on a MemoryStore with a ManualClock. (Lua and twin agree: the parity case
// of limiter_adjust in test_strategies.cpp.)
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "redcount/common/clock.h"
#include "redcount/common/errors.h"
#include "redcount/common/limit_string.h"
#include "redcount/limiters/limiter.h"
#include "redcount/memory/memory_store.h"
#include "test_support.h"

using namespace redcount;
using rctest::kT0;
using Status = Adjustment::Status;

namespace {

class RefundTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>(kT0 + 1'234);
  std::shared_ptr<MemoryStore> store_ = rctest::memory_store(clock_);
  std::unique_ptr<LimiterStrategy> lim_ = make_limiter(store_, GetParam(), "rf");
  std::vector<RateLimit> limits_ = parse_limits("4/minute");

  std::int64_t left() { return lim_->test(limits_, "k", 1).remaining; }
};

TEST_P(RefundTest, GivesBackWhatWasChargedOnce) {
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(lim_->hit(limits_, "k", 1).allowed);
  ASSERT_FALSE(lim_->hit(limits_, "k", 1).allowed);
  const Adjustment a = lim_->refund(limits_, "k", 2, "r1");
  EXPECT_EQ(a.status, Status::Applied);
  EXPECT_EQ(a.units, 2);
  EXPECT_TRUE(a.decision.allowed);
  EXPECT_EQ(a.decision.remaining, 2);
  const Adjustment again = lim_->refund(limits_, "k", 2, "r1");
  EXPECT_EQ(again.status, Status::Duplicate);
  EXPECT_EQ(again.units, 0);
  EXPECT_EQ(left(), 2);
  // The marker outlives the window (and then goes).
  clock_->advance(60'000);
  EXPECT_EQ(lim_->refund(limits_, "k", 1, "r1").status, Status::Duplicate);
  clock_->advance(2'000);
  EXPECT_EQ(lim_->refund(limits_, "k", 1, "r1").status, Status::Applied);
}

TEST_P(RefundTest, NeverMoreThanWasCharged) {
  ASSERT_TRUE(lim_->hit(limits_, "k", 1).allowed);
  EXPECT_EQ(lim_->refund(limits_, "k", 3).units, 1);
  EXPECT_EQ(lim_->refund(limits_, "k", 3).units, 0);
  EXPECT_EQ(left(), 4);
}

TEST_P(RefundTest, ReserveSettleAndTheDeadline) {
  const Adjustment r = lim_->reserve(limits_, "k", 3, "job", 10'000);
  EXPECT_EQ(r.status, Status::Applied);
  EXPECT_TRUE(r.decision.allowed);
  EXPECT_EQ(r.decision.remaining, 1);
  EXPECT_EQ(lim_->reserve(limits_, "k", 3, "job", 10'000).status, Status::Duplicate);
  const Adjustment refused = lim_->reserve(limits_, "k", 2, "other", 10'000);
  EXPECT_EQ(refused.status, Status::Refused);
  EXPECT_FALSE(refused.decision.allowed);
  EXPECT_GT(refused.decision.retry_after_ms, 0);
  const Adjustment s = lim_->settle(limits_, "k", "job", 1);
  EXPECT_EQ(s.status, Status::Applied);
  EXPECT_EQ(s.units, 2);
  EXPECT_EQ(s.estimate, 3);
  EXPECT_EQ(lim_->settle(limits_, "k", "job", 1).status, Status::Duplicate);
  EXPECT_EQ(lim_->settle(limits_, "k", "other", 0).status, Status::Expired);
  EXPECT_EQ(left(), 3);
  // Past its deadline a reservation has settled at the estimate.
  ASSERT_EQ(lim_->reserve(limits_, "k", 2, "late", 5'000).status, Status::Applied);
  clock_->advance(5'001);
  EXPECT_EQ(lim_->settle(limits_, "k", "late", 0).status, Status::Expired);
  EXPECT_EQ(left(), 1);
}

TEST_P(RefundTest, BadInputThrowsBeforeAnythingIsSent) {
  EXPECT_THROW(lim_->refund(limits_, "k", 0), InvalidArgument);
  EXPECT_THROW(lim_->reserve(limits_, "k", 5, "r", 1'000), InvalidArgument);  // above the limit
  EXPECT_THROW(lim_->reserve(limits_, "k", 1, "", 1'000), InvalidArgument);
  EXPECT_THROW(lim_->reserve(limits_, "k", 1, "r", 0), InvalidArgument);
  EXPECT_THROW(lim_->settle(limits_, "k", "r", -1), InvalidArgument);
  EXPECT_TRUE(rctest::keys(*store_).empty());
}

INSTANTIATE_TEST_SUITE_P(Strategies, RefundTest,
                         ::testing::Values("fixed-window", "sliding-window", "sliding-window-approx", "token-bucket",
                                           "gcra"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (char& c : n) c = c == '-' ? '_' : c;
                           return n;
                         });

TEST(RefundConcurrency, IsRefused) {
  auto store = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  auto lim = make_limiter(store, "concurrency", "rf");
  EXPECT_THROW(lim->refund(parse_limits("5/minute"), "k", 1), InvalidArgument);
  EXPECT_THROW(lim->reserve(parse_limits("5/minute"), "k", 1, "r", 1'000), InvalidArgument);
  EXPECT_THROW(lim->settle(parse_limits("5/minute"), "k", "r", 1), InvalidArgument);
}

}  // namespace
