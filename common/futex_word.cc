#include "common/futex_word.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace chorus {
namespace {

static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t) &&
                  std::atomic<uint64_t>::is_always_lock_free,
              "a shared word must be a plain lock-free 64-bit word");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the futex is the word's low half, at its address");

// The word's low 32 bits, where the futex is. Not a shared-private futex:
// waiters and wakers may be in different processes.
uint32_t* LowHalf(const std::atomic<uint64_t>& word) {
  return reinterpret_cast<uint32_t*>(const_cast<std::atomic<uint64_t>*>(&word));
}

}  // namespace

void WaitWordChange(const std::atomic<uint64_t>& word, uint64_t seen,
                    absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) return;
  const timespec relative = absl::ToTimespec(timeout);
  syscall(SYS_futex, LowHalf(word), FUTEX_WAIT, static_cast<uint32_t>(seen),
          &relative, nullptr, 0);
}

void WakeWordWaiters(const std::atomic<uint64_t>& word) {
  syscall(SYS_futex, LowHalf(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace chorus
