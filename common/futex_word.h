// A 64-bit word that threads of several processes wait on, in memory they
// share (a MAP_SHARED mapping, e.g. a same_host segment's header), without
// a lock: the kernel's futex on the word's low 32 bits.
//
// The owner of the word stores a larger value and calls WakeWordWaiters();
// a waiter loads the value, decides it must wait, and calls WaitWordChange()
// with what it saw: that returns at once if the low 32 bits changed
// meanwhile (so a store between the load and the wait is never missed, as
// long as values advance by less than 2^32 at a time), when woken, or at the
// timeout. Spurious returns are allowed: callers load the word again.
//
// Thread safety: thread-safe; the functions hold no state.
#ifndef CHORUS_COMMON_FUTEX_WORD_H_
#define CHORUS_COMMON_FUTEX_WORD_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace chorus {

// Blocks while the word's low 32 bits equal those of `seen`, for at most
// `timeout` (none when it is zero or less).
void WaitWordChange(const std::atomic<uint64_t>& word, uint64_t seen,
                    absl::Duration timeout);

// Wakes every thread, in any process, blocked in WaitWordChange() on the
// word (at `word`'s address in its own mapping of the same memory).
void WakeWordWaiters(const std::atomic<uint64_t>& word);

}  // namespace chorus

#endif  // CHORUS_COMMON_FUTEX_WORD_H_
