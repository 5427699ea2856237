// FUZZ_CHECK(condition, detail): the fuzzers' invariant check. When the
// condition does not hold it prints where, the condition and `detail`
// (a std::string, evaluated only then) and aborts, which libFuzzer reports
// as a crash with the input that caused it.
//
// Header-only.
#ifndef CHORUS_TESTS_FUZZ_FUZZ_CHECK_H_
#define CHORUS_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

namespace chorus {
namespace fuzz {

[[noreturn]] inline void Fail(const char* file, int line, const char* condition,
                              const std::string& detail) {
  std::fprintf(stderr, "%s:%d: invariant failed: %s\n  %s\n", file, line,
               condition, detail.c_str());
  std::abort();
}

}  // namespace fuzz
}  // namespace chorus

#define FUZZ_CHECK(condition, detail)                                 \
  do {                                                                \
    if (!(condition)) {                                               \
      ::chorus::fuzz::Fail(__FILE__, __LINE__, #condition, (detail)); \
    }                                                                 \
  } while (false)

#endif  // CHORUS_TESTS_FUZZ_FUZZ_CHECK_H_
