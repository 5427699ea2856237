#include "server/coordinator/key_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace chorus {
namespace {

bool OneKey(StoreOpKind kind) {
  return kind == StoreOpKind::kSet || kind == StoreOpKind::kGet ||
         kind == StoreOpKind::kAdd || kind == StoreOpKind::kCompareSet ||
         kind == StoreOpKind::kDeleteKey;
}

bool Waits(StoreOpKind kind) {
  return kind == StoreOpKind::kGet || kind == StoreOpKind::kWait;
}

}  // namespace

KeyStore::KeyStore(Clock* clock, StoreLimits limits, StateLog* log)
    : clock_(clock), limits_(limits), log_(log) {}

KeyStore::~KeyStore() {
  Shutdown(absl::UnavailableError("the coordinator is shutting down"));
}

absl::Status KeyStore::ValidateLocked(const std::string& job,
                                      const StoreOp& op) const {
  if (!shut_down_.ok()) return shut_down_;
  const int kind = static_cast<int>(op.kind);
  if (kind < static_cast<int>(StoreOpKind::kSet) ||
      kind > static_cast<int>(StoreOpKind::kCheck)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown store operation ", kind));
  }
  if (OneKey(op.kind) && op.keys.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this store operation takes one key, not ", op.keys.size()));
  }
  if (op.keys.size() > limits_.max_keys) {
    return absl::ResourceExhaustedError(absl::StrCat(
        op.keys.size(), " keys in one operation; at most ", limits_.max_keys));
  }
  for (const std::string& key : op.keys) {
    if (key.empty()) return absl::InvalidArgumentError("an empty store key");
    if (key.size() > limits_.max_key_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("a store key of ", key.size(), " bytes; at most ",
                       limits_.max_key_bytes));
    }
  }
  if (std::max(op.value.size(), op.expected.size()) > limits_.max_value_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a store value of ", std::max(op.value.size(), op.expected.size()),
        " bytes; at most ", limits_.max_value_bytes));
  }
  if (Waits(op.kind) && waits_.size() >= limits_.max_waits) {
    return absl::ResourceExhaustedError(absl::StrCat(
        limits_.max_waits, " store waits are pending; try again later"));
  }
  (void)job;
  return absl::OkStatus();
}

absl::Status KeyStore::PutLocked(const std::string& job, const std::string& key,
                                 std::string value) {
  Job& keys = jobs_[job];
  auto it = keys.values.find(key);
  const size_t old_bytes =
      it == keys.values.end() ? 0 : key.size() + it->second.size();
  const size_t new_bytes = key.size() + value.size();
  if (it == keys.values.end() && keys.values.size() >= limits_.max_keys) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the job's store holds ", limits_.max_keys, " keys, its limit"));
  }
  if (keys.bytes - old_bytes + new_bytes > limits_.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the job's store would hold more than ", limits_.max_bytes, " bytes"));
  }
  if (log_ != nullptr) log_->SaveKey(StoredKey{job, key, value});
  keys.bytes = keys.bytes - old_bytes + new_bytes;
  keys.values[key] = std::move(value);
  return absl::OkStatus();
}

absl::StatusOr<StoreResult> KeyStore::ApplyLocked(const std::string& job,
                                                  const StoreOp& op) {
  StoreResult result;
  Job& keys = jobs_[job];
  const std::string* key = op.keys.empty() ? nullptr : &op.keys[0];
  auto it = key == nullptr ? keys.values.end() : keys.values.find(*key);
  const bool exists = it != keys.values.end();
  switch (op.kind) {
    case StoreOpKind::kSet: {
      absl::Status put = PutLocked(job, *key, op.value);
      if (!put.ok()) return put;
      return result;
    }
    case StoreOpKind::kAdd: {
      int64_t now = 0;
      if (exists && !absl::SimpleAtoi(it->second, &now)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "store key ", *key, " holds a value that is not a number"));
      }
      if (__builtin_add_overflow(now, op.amount, &result.number)) {
        return absl::InvalidArgumentError(
            absl::StrCat("adding ", op.amount, " to store key ", *key,
                         " overflows a 64-bit integer"));
      }
      absl::Status put = PutLocked(job, *key, absl::StrCat(result.number));
      if (!put.ok()) return put;
      return result;
    }
    case StoreOpKind::kCompareSet: {
      // torch's semantics: a missing key is set only when `expected` is
      // empty; otherwise the answer is what the key holds (or `expected`).
      if ((!exists && op.expected.empty()) ||
          (exists && it->second == op.expected)) {
        absl::Status put = PutLocked(job, *key, op.value);
        if (!put.ok()) return put;
        result.value = op.value;
      } else {
        result.value = exists ? it->second : op.expected;
      }
      return result;
    }
    case StoreOpKind::kDeleteKey:
      result.flag = exists;
      if (exists) {
        if (log_ != nullptr) log_->DropKey(job, *key);
        keys.bytes -= key->size() + it->second.size();
        keys.values.erase(it);
      }
      return result;
    case StoreOpKind::kNumKeys:
      result.number = static_cast<int64_t>(keys.values.size());
      return result;
    case StoreOpKind::kCheck:
      result.flag = std::all_of(
          op.keys.begin(), op.keys.end(),
          [&](const std::string& k) { return keys.values.count(k) > 0; });
      return result;
    default:
      return absl::InternalError("a waiting store operation ran at once");
  }
}

bool KeyStore::ReadyLocked(const std::string& job, const StoreOp& op,
                           StoreResult* result) const {
  auto keys = jobs_.find(job);
  for (const std::string& key : op.keys) {
    if (keys == jobs_.end() || keys->second.values.count(key) == 0) {
      return false;
    }
  }
  if (op.kind == StoreOpKind::kGet) {
    result->value = keys->second.values.at(op.keys[0]);
  }
  return true;
}

void KeyStore::WakeLocked(const std::string& job, Completions* completions) {
  for (auto it = waits_.begin(); it != waits_.end();) {
    StoreResult result;
    if (it->job != job || !ReadyLocked(job, it->op, &result)) {
      ++it;
      continue;
    }
    completions->push_back(
        [done = std::move(it->done), result] { done(result); });
    it = waits_.erase(it);
  }
}

void KeyStore::Run(const std::string& job, StoreOp op, Done done) {
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    absl::Status valid = ValidateLocked(job, op);
    StoreResult result;
    if (!valid.ok()) {
      completions.push_back([done = std::move(done), valid] { done(valid); });
    } else if (Waits(op.kind) && !ReadyLocked(job, op, &result)) {
      waits_.push_back(Wait{job, std::move(op), std::move(done)});
    } else if (Waits(op.kind)) {
      completions.push_back([done = std::move(done), result] { done(result); });
    } else {
      absl::StatusOr<StoreResult> applied = ApplyLocked(job, op);
      completions.push_back(
          [done = std::move(done), applied] { done(applied); });
      if (applied.ok()) WakeLocked(job, &completions);
    }
  }
  for (auto& complete : completions) complete();
}

absl::Time KeyStore::ExpireWaits() {
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    for (auto it = waits_.begin(); it != waits_.end();) {
      if (it->op.deadline > now) {
        ++it;
        continue;
      }
      std::vector<std::string> missing;
      auto keys = jobs_.find(it->job);
      for (const std::string& key : it->op.keys) {
        if (keys == jobs_.end() || keys->second.values.count(key) == 0) {
          missing.push_back(key);
        }
      }
      const absl::Status expired = absl::DeadlineExceededError(
          absl::StrCat("store keys not set within the deadline: ",
                       absl::StrJoin(missing, ", ")));
      completions.push_back(
          [done = std::move(it->done), expired] { done(expired); });
      it = waits_.erase(it);
    }
  }
  for (auto& complete : completions) complete();
  return NextDeadline();
}

absl::Time KeyStore::NextDeadline() const {
  absl::MutexLock lock(&mu_);
  absl::Time next = absl::InfiniteFuture();
  for (const Wait& wait : waits_) next = std::min(next, wait.op.deadline);
  return next;
}

void KeyStore::Restore(const std::vector<StoredKey>& keys) {
  absl::MutexLock lock(&mu_);
  for (const StoredKey& stored : keys) {
    Job& job = jobs_[stored.job];
    job.bytes += stored.key.size() + stored.value.size();
    job.values[stored.key] = stored.value;
  }
}

void KeyStore::Shutdown(const absl::Status& status) {
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = status;
    for (Wait& wait : waits_) {
      completions.push_back(
          [done = std::move(wait.done), status] { done(status); });
    }
    waits_.clear();
  }
  for (auto& complete : completions) complete();
}

}  // namespace chorus
