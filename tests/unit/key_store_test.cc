#include "server/coordinator/key_store.h"

#include <list>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

StoreOp Op(StoreOpKind kind, std::vector<std::string> keys,
           std::string value = "", std::string expected = "",
           int64_t amount = 0) {
  StoreOp op;
  op.kind = kind;
  op.keys = std::move(keys);
  op.value = std::move(value);
  op.expected = std::move(expected);
  op.amount = amount;
  return op;
}

class KeyStoreTest : public ::testing::Test {
 protected:
  KeyStoreTest() : store_(&clock_, Limits(), nullptr) {}

  static StoreLimits Limits() {
    StoreLimits limits;
    limits.max_key_bytes = 16;
    limits.max_value_bytes = 32;
    limits.max_keys = 4;
    limits.max_bytes = 100;
    limits.max_waits = 2;
    return limits;
  }

  // Runs `op` on `job`'s store and returns what it answered at once
  // (nullopt while it waits).
  // A waiting op is answered later (at the latest when the store shuts
  // down), into answers_.
  std::optional<absl::StatusOr<StoreResult>> Run(StoreOp op,
                                                 const std::string& job = "") {
    std::optional<absl::StatusOr<StoreResult>>& answer =
        answers_.emplace_back();
    store_.Run(job, std::move(op),
               [&answer](absl::StatusOr<StoreResult> r) { answer = r; });
    return answer;
  }

  FakeClock clock_;
  std::list<std::optional<absl::StatusOr<StoreResult>>> answers_;
  KeyStore store_;
};

TEST_F(KeyStoreTest, SetGetAddCheckDelete_TorchSemantics) {
  ASSERT_TRUE(Run(Op(StoreOpKind::kSet, {"k"}, "v"))->ok());
  EXPECT_EQ(Run(Op(StoreOpKind::kGet, {"k"}))->value().value, "v");
  EXPECT_EQ(Run(Op(StoreOpKind::kAdd, {"n"}, "", "", 5))->value().number, 5);
  EXPECT_EQ(Run(Op(StoreOpKind::kAdd, {"n"}, "", "", -7))->value().number, -2);
  EXPECT_EQ(Run(Op(StoreOpKind::kGet, {"n"}))->value().value, "-2");
  EXPECT_EQ(Run(Op(StoreOpKind::kNumKeys, {}))->value().number, 2);
  EXPECT_TRUE(Run(Op(StoreOpKind::kCheck, {"k", "n"}))->value().flag);
  EXPECT_FALSE(Run(Op(StoreOpKind::kCheck, {"k", "x"}))->value().flag);
  EXPECT_TRUE(Run(Op(StoreOpKind::kDeleteKey, {"k"}))->value().flag);
  EXPECT_FALSE(Run(Op(StoreOpKind::kDeleteKey, {"k"}))->value().flag);
  EXPECT_EQ(Run(Op(StoreOpKind::kNumKeys, {}))->value().number, 1);
}

TEST_F(KeyStoreTest, CompareSet_TorchSemantics) {
  // Missing key, expected empty: set.
  EXPECT_EQ(Run(Op(StoreOpKind::kCompareSet, {"c"}, "a", ""))->value().value,
            "a");
  // Holds "a", expected "b": unchanged, answers "a".
  EXPECT_EQ(Run(Op(StoreOpKind::kCompareSet, {"c"}, "z", "b"))->value().value,
            "a");
  // Holds "a", expected "a": set.
  EXPECT_EQ(Run(Op(StoreOpKind::kCompareSet, {"c"}, "z", "a"))->value().value,
            "z");
  // Missing key, expected not empty: unchanged, answers expected.
  EXPECT_EQ(Run(Op(StoreOpKind::kCompareSet, {"d"}, "z", "q"))->value().value,
            "q");
  EXPECT_FALSE(Run(Op(StoreOpKind::kCheck, {"d"}))->value().flag);
}

TEST_F(KeyStoreTest, Wait_KeysSetLater_AnsweredWhenAllExist) {
  std::optional<absl::StatusOr<StoreResult>> waited;
  StoreOp wait = Op(StoreOpKind::kWait, {"a", "b"});
  wait.deadline = clock_.Now() + absl::Seconds(10);
  store_.Run("", wait, [&](absl::StatusOr<StoreResult> r) { waited = r; });
  std::optional<absl::StatusOr<StoreResult>> got;
  StoreOp get = Op(StoreOpKind::kGet, {"b"});
  get.deadline = clock_.Now() + absl::Seconds(10);
  store_.Run("", get, [&](absl::StatusOr<StoreResult> r) { got = r; });
  Run(Op(StoreOpKind::kSet, {"a"}, "1"));
  EXPECT_FALSE(waited.has_value());
  Run(Op(StoreOpKind::kSet, {"b"}, "2"));
  ASSERT_TRUE(waited.has_value());
  EXPECT_TRUE(waited->ok());
  ASSERT_TRUE(got.has_value() && got->ok());
  EXPECT_EQ(got->value().value, "2");
}

TEST_F(KeyStoreTest, Wait_DeadlinePasses_DeadlineExceededNamingMissingKeys) {
  Run(Op(StoreOpKind::kSet, {"a"}, "1"));
  std::optional<absl::StatusOr<StoreResult>> waited;
  StoreOp wait = Op(StoreOpKind::kWait, {"a", "b"});
  wait.deadline = clock_.Now() + absl::Seconds(1);
  store_.Run("", wait, [&](absl::StatusOr<StoreResult> r) { waited = r; });
  EXPECT_EQ(store_.NextDeadline(), wait.deadline);
  clock_.Advance(absl::Seconds(1));
  store_.ExpireWaits();
  ASSERT_TRUE(waited.has_value());
  EXPECT_EQ(waited->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(waited->status().message(), HasSubstr(": b"));
  EXPECT_EQ(store_.NextDeadline(), absl::InfiniteFuture());
}

TEST_F(KeyStoreTest, Jobs_KeysApart) {
  Run(Op(StoreOpKind::kSet, {"k"}, "blue"), "blue");
  EXPECT_FALSE(Run(Op(StoreOpKind::kCheck, {"k"}), "red")->value().flag);
  EXPECT_EQ(Run(Op(StoreOpKind::kNumKeys, {}), "red")->value().number, 0);
  EXPECT_FALSE(Run(Op(StoreOpKind::kGet, {"k"}), "red").has_value());
}

TEST_F(KeyStoreTest, BadInput_ClearStatusAndNothingChanged) {
  Run(Op(StoreOpKind::kSet, {"n"}, "text"));
  const std::vector<std::pair<StoreOp, absl::StatusCode>> bad = {
      {Op(static_cast<StoreOpKind>(42), {"k"}),
       absl::StatusCode::kInvalidArgument},
      {Op(StoreOpKind::kSet, {}), absl::StatusCode::kInvalidArgument},
      {Op(StoreOpKind::kSet, {""}, "v"), absl::StatusCode::kInvalidArgument},
      {Op(StoreOpKind::kSet, {"a", "b"}, "v"),
       absl::StatusCode::kInvalidArgument},
      {Op(StoreOpKind::kAdd, {"n"}, "", "", 1),
       absl::StatusCode::kInvalidArgument},
      {Op(StoreOpKind::kSet, {std::string(17, 'k')}, "v"),
       absl::StatusCode::kResourceExhausted},
      {Op(StoreOpKind::kSet, {"k"}, std::string(33, 'v')),
       absl::StatusCode::kResourceExhausted},
  };
  for (const auto& [op, code] : bad) {
    EXPECT_EQ(Run(op)->status().code(), code) << static_cast<int>(op.kind);
  }
  Run(Op(StoreOpKind::kSet, {"big"}, "1"));
  EXPECT_EQ(
      Run(Op(StoreOpKind::kAdd, {"big"}, "", "", INT64_MAX))->status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Run(Op(StoreOpKind::kGet, {"big"}))->value().value, "1");
  EXPECT_EQ(Run(Op(StoreOpKind::kNumKeys, {}))->value().number, 2);
  EXPECT_EQ(Run(Op(StoreOpKind::kGet, {"n"}))->value().value, "text");
}

TEST_F(KeyStoreTest, Limits_CountsAndBytes_ResourceExhausted) {
  for (const char* key : {"a", "b", "c", "d"}) {
    ASSERT_TRUE(Run(Op(StoreOpKind::kSet, {key}, "v"))->ok());
  }
  EXPECT_EQ(Run(Op(StoreOpKind::kSet, {"e"}, "v"))->status().code(),
            absl::StatusCode::kResourceExhausted);
  // An existing key may change within the byte limit.
  EXPECT_TRUE(Run(Op(StoreOpKind::kSet, {"a"}, std::string(32, 'x')))->ok());
  EXPECT_TRUE(Run(Op(StoreOpKind::kSet, {"b"}, std::string(32, 'x')))->ok());
  EXPECT_EQ(
      Run(Op(StoreOpKind::kSet, {"c"}, std::string(32, 'x')))->status().code(),
      absl::StatusCode::kResourceExhausted);
  // Waits are bounded too.
  Run(Op(StoreOpKind::kWait, {"x"}));
  Run(Op(StoreOpKind::kWait, {"y"}));
  EXPECT_EQ(Run(Op(StoreOpKind::kWait, {"z"}))->status().code(),
            absl::StatusCode::kResourceExhausted);
  store_.Shutdown(absl::UnavailableError("shutting down"));
  EXPECT_EQ(Run(Op(StoreOpKind::kNumKeys, {}))->status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace chorus
