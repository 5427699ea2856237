#include "server/worker/local/call_ledger.h"

#include <iterator>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/collective.h"
#include "common/device.h"
#include "common/status_detail.h"

namespace chorus {
namespace {

// The status of a call whose rank left meanwhile (CallLedger::Forget).
absl::Status LeftError(const std::string& who) {
  return absl::FailedPreconditionError(
      absl::StrCat(who, " left the group on this worker; join again"));
}

}  // namespace

bool CallIdentity::operator==(const CallIdentity& other) const {
  auto same_device = [](const Device& a, const Device& b) {
    return a.kind == b.kind && a.index == b.index &&
           a.other_kind == b.other_kind;
  };
  return spec.kind == other.spec.kind && spec.dtype == other.spec.dtype &&
         spec.count == other.spec.count && spec.op == other.spec.op &&
         spec.root == other.spec.root && algorithm == other.algorithm &&
         input_bytes == other.input_bytes &&
         device.has_value() == other.device.has_value() &&
         (!device.has_value() || same_device(*device, *other.device));
}

std::string CallIdentity::Describe() const {
  return absl::StrCat(
      DescribeSpec(spec), " (algorithm ", static_cast<int>(algorithm),
      ", device ",
      device.has_value() ? CanonicalName(*device) : std::string("of the rank"),
      ", ", input_bytes, " bytes of input)");
}

bool CallLedger::Used(const Numbers& numbers, uint64_t sequence) {
  return sequence < numbers.lowest_unused ||
         numbers.used_ahead.contains(sequence);
}

absl::Status CallLedger::Use(const std::string& group, int rank, uint64_t epoch,
                             uint64_t sequence, const CallIdentity& call,
                             absl::Time deadline,
                             std::optional<CallOutcome>* retried) {
  retried->reset();
  // Built only for a status: the common call needs no words.
  auto who = [&] {
    return absl::StrCat("rank ", rank, " of group ", group, " (epoch ", epoch,
                        ")");
  };
  if (sequence == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who(), " sent sequence 0; sequences start at 1"));
  }
  absl::MutexLock lock(&mu_);
  const Key key{group, rank};
  Numbers& numbers = ranks_[key];
  if (epoch > numbers.epoch) {
    const int users = numbers.users;
    numbers = Numbers();
    numbers.epoch = epoch;
    numbers.users = users;
  }
  // While this call looks at `numbers`, Forget() leaves the node in place.
  ++numbers.users;
  absl::Cleanup done_with_numbers = [&] {
    mu_.AssertHeld();
    if (--numbers.users == 0 && numbers.forgotten) ranks_.erase(key);
  };
  auto used = [&] { return Used(numbers, sequence); };
  auto settled = [&] {
    mu_.AssertHeld();
    return closed_ || numbers.epoch != epoch || numbers.forgotten ||
           numbers.lowest_unused >= sequence || used();
  };
  if (!settled() && sequence >= numbers.lowest_unused + kMaxNumbersAhead) {
    return absl::InvalidArgumentError(
        absl::StrCat(who(), " sent sequence ", sequence,
                     " from the future: its lowest unused "
                     "number is #",
                     numbers.lowest_unused, " and calls may be at most ",
                     kMaxNumbersAhead, " ahead of it"));
  }
  const uint64_t waited_for = numbers.lowest_unused;
  if (!mu_.AwaitWithDeadline(absl::Condition(&settled), deadline)) {
    return absl::InvalidArgumentError(absl::StrCat(
        who(), " called #", sequence, " but not #", numbers.lowest_unused,
        " by the call's deadline: a rank numbers its calls 1, 2, 3, ... "
        "without gaps in each group epoch (#",
        sequence, " used no number; the lowest unused was #", waited_for,
        " when it came)"));
  }
  if (closed_) {
    return absl::UnavailableError("this worker is shutting down");
  }
  if (numbers.epoch != epoch) {
    return WithErrorDetail(absl::FailedPreconditionError(absl::StrCat(
                               "stale epoch ", epoch, " for group ", group,
                               "; this worker has seen epoch ", numbers.epoch)),
                           MakeErrorDetail("STALE_EPOCH", group, epoch, 0));
  }
  if (numbers.forgotten) return LeftError(who());
  if (used()) {
    return RetryLocked(who(), numbers, epoch, sequence, call, deadline,
                       retried);
  }
  if (sequence == numbers.lowest_unused) {
    ++numbers.lowest_unused;
    while (numbers.used_ahead.erase(numbers.lowest_unused) > 0) {
      ++numbers.lowest_unused;
    }
  } else {
    numbers.used_ahead.insert(sequence);
  }
  // The rank moved on: its finished calls below are no longer its latest.
  for (auto at = numbers.calls.begin();
       at != numbers.calls.end() && at->first < sequence;) {
    at = at->second.finished ? numbers.calls.erase(at) : std::next(at);
  }
  numbers.calls[sequence].call = call;
  return absl::OkStatus();
}

bool CallLedger::MayWait(const std::string& group, int rank, uint64_t epoch,
                         uint64_t sequence) {
  absl::MutexLock lock(&mu_);
  auto it = ranks_.find(Key{group, rank});
  if (closed_) return false;  // Use() refuses at once
  if (it == ranks_.end()) return sequence > 1;
  const Numbers& numbers = it->second;
  if (epoch != numbers.epoch || numbers.forgotten) {
    // A newer epoch starts again from 1; an older one is refused at once.
    return epoch > numbers.epoch && sequence > 1;
  }
  if (!Used(numbers, sequence)) return sequence > numbers.lowest_unused;
  auto call = numbers.calls.find(sequence);
  return call != numbers.calls.end() && !call->second.finished;
}

absl::Status CallLedger::RetryLocked(const std::string& who, Numbers& numbers,
                                     uint64_t epoch, uint64_t sequence,
                                     const CallIdentity& call,
                                     absl::Time deadline,
                                     std::optional<CallOutcome>* retried) {
  auto it = numbers.calls.find(sequence);
  if (it == numbers.calls.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, " already called #", sequence,
        "; each call takes the next number (a retry gets the first "
        "attempt's outcome only for the rank's newest finished call or one "
        "still running)"));
  }
  if (it->second.call != call) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, " already called #", sequence, " as ", it->second.call.Describe(),
        ", not ", call.Describe(), "; each call takes the next number"));
  }
  auto ended = [&] {
    mu_.AssertHeld();
    auto found = numbers.calls.find(sequence);
    return closed_ || numbers.epoch != epoch || numbers.forgotten ||
           found == numbers.calls.end() || found->second.finished;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ended), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat(who, " retried #", sequence,
                     ", whose first attempt was still running at the "
                     "retry's deadline"));
  }
  if (closed_) {
    return absl::UnavailableError("this worker is shutting down");
  }
  if (numbers.forgotten) return LeftError(who);
  it = numbers.calls.find(sequence);
  if (numbers.epoch != epoch || it == numbers.calls.end()) {
    // Its first attempt was still being recorded when the rank called a
    // newer number: the same answer as for an older call.
    return absl::FailedPreconditionError(absl::StrCat(
        who, " already called #", sequence,
        "; its outcome is no longer kept: the rank called a newer number "
        "first (a retry gets the first attempt's outcome only for the "
        "rank's newest finished call or one still running)"));
  }
  *retried = it->second.outcome;
  return absl::OkStatus();
}

void CallLedger::Keep(const std::string& group, int rank, uint64_t epoch,
                      uint64_t sequence, CallOutcome outcome) {
  absl::MutexLock lock(&mu_);
  auto numbers = ranks_.find(Key{group, rank});
  if (numbers == ranks_.end() || numbers->second.epoch != epoch) return;
  std::map<uint64_t, Entry>& calls = numbers->second.calls;
  auto it = calls.find(sequence);
  if (it == calls.end()) return;
  // A later number was taken (this reply may arrive after the next call
  // began): only the rank's latest call is kept.
  if (numbers->second.lowest_unused > sequence + 1 ||
      std::next(it) != calls.end()) {
    calls.erase(it);
    return;
  }
  if (outcome.output.size() > kMaxKeptOutputBytes && outcome.status.ok()) {
    outcome.status = absl::FailedPreconditionError(
        absl::StrCat("collective #", sequence, " of group ", group,
                     " ran, but its output of ", outcome.output.size(),
                     " bytes is over the ", kMaxKeptOutputBytes,
                     " bytes a worker keeps for a retry; join again"));
    std::string().swap(outcome.output);
  }
  it->second.finished = true;
  it->second.outcome = std::move(outcome);
  // Only the newest finished call's outcome is kept.
  uint64_t newest = 0;
  for (const auto& [number, entry] : calls) {
    if (entry.finished) newest = number;
  }
  for (auto at = calls.begin(); at != calls.end();) {
    if (at->second.finished && at->first < newest) {
      at = calls.erase(at);
    } else {
      ++at;
    }
  }
}

void CallLedger::Forget(const std::string& group, int rank, uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  auto it = ranks_.find(Key{group, rank});
  if (it == ranks_.end() || it->second.epoch != epoch) return;
  Numbers& numbers = it->second;
  if (numbers.users == 0) {
    ranks_.erase(it);
    return;
  }
  numbers.forgotten = true;
  numbers.used_ahead.clear();
  numbers.calls.clear();
}

void CallLedger::AwaitCallsForTesting(const std::string& group, int rank,
                                      int count) {
  absl::MutexLock lock(&mu_);
  const Key key{group, rank};
  auto reached = [&] {
    mu_.AssertHeld();
    auto it = ranks_.find(key);
    return it != ranks_.end() && it->second.users >= count;
  };
  mu_.Await(absl::Condition(&reached));
}

void CallLedger::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

}  // namespace chorus
