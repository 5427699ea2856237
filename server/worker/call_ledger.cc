#include "server/worker/call_ledger.h"

#include "absl/strings/str_cat.h"

namespace chorus {

absl::Status CallLedger::Use(const std::string& group, int rank, uint64_t epoch,
                             uint64_t sequence, absl::Time deadline) {
  const std::string who =
      absl::StrCat("rank ", rank, " of group ", group, " (epoch ", epoch, ")");
  if (sequence == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " sent sequence 0; sequences start at 1"));
  }
  absl::MutexLock lock(&mu_);
  // Node-stable: the reference survives other ranks' insertions.
  Numbers& numbers = ranks_[Key{group, rank}];
  if (epoch > numbers.epoch) {
    numbers = Numbers();
    numbers.epoch = epoch;
  }
  auto settled = [&] {
    return closed_ || numbers.epoch != epoch ||
           numbers.lowest_unused >= sequence ||
           numbers.used_ahead.contains(sequence);
  };
  if (!settled() && sequence >= numbers.lowest_unused + kMaxNumbersAhead) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " sent sequence ", sequence,
                     " from the future: its lowest unused "
                     "number is #",
                     numbers.lowest_unused, " and calls may be at most ",
                     kMaxNumbersAhead, " ahead of it"));
  }
  const uint64_t waited_for = numbers.lowest_unused;
  if (!mu_.AwaitWithDeadline(absl::Condition(&settled), deadline)) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, " called #", sequence, " but not #", numbers.lowest_unused,
        " by the call's deadline: a rank numbers its calls 1, 2, 3, ... "
        "without gaps in each group epoch (#",
        sequence, " used no number; the lowest unused was #", waited_for,
        " when it came)"));
  }
  if (closed_) {
    return absl::UnavailableError("this worker is shutting down");
  }
  if (numbers.epoch != epoch) {
    return absl::FailedPreconditionError(
        absl::StrCat("stale epoch ", epoch, " for group ", group,
                     "; this worker has seen epoch ", numbers.epoch));
  }
  if (sequence < numbers.lowest_unused ||
      numbers.used_ahead.contains(sequence)) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, " already called #", sequence,
                     "; each call takes the next number"));
  }
  if (sequence == numbers.lowest_unused) {
    ++numbers.lowest_unused;
    while (numbers.used_ahead.erase(numbers.lowest_unused) > 0) {
      ++numbers.lowest_unused;
    }
  } else {
    numbers.used_ahead.insert(sequence);
  }
  return absl::OkStatus();
}

void CallLedger::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

}  // namespace chorus
