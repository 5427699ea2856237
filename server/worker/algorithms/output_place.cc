#include "server/worker/algorithms/output_place.h"

#include <cstdint>
#include <cstring>

namespace chorus {
namespace {

// Whether `a` and `b` share some bytes without being the same bytes.
bool OverlapPartly(absl::string_view a, absl::string_view b) {
  if (a.empty() || b.empty()) return false;
  if (a.data() == b.data() && a.size() == b.size()) return false;
  return a.data() < b.data() + b.size() && b.data() < a.data() + a.size();
}

}  // namespace

absl::Span<char> HostOutput(const AlgorithmArgs& args, uint64_t bytes,
                            uint64_t alignment, absl::string_view read_later) {
  if (args.output_place != nullptr &&
      reinterpret_cast<uintptr_t>(args.output_place) % alignment == 0 &&
      !OverlapPartly(read_later, absl::string_view(args.output_place, bytes))) {
    return absl::MakeSpan(args.output_place, bytes);
  }
  if (args.output->size() != bytes) args.output->resize(bytes);
  return absl::MakeSpan(*args.output);
}

void MoveUnlessSame(absl::string_view from, char* to) {
  if (!from.empty() && from.data() != to) {
    std::memmove(to, from.data(), from.size());
  }
}

}  // namespace chorus
