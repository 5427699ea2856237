#include "server/worker/cuda_arch.h"

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace chorus {
namespace {

// An architecture as major * 10 + minor (86 for 8.6).
std::string Dotted(int arch) { return absl::StrCat(arch / 10, ".", arch % 10); }

}  // namespace

std::string CudaKernelGap(absl::string_view compute_capability,
                          absl::string_view architectures) {
  const std::pair<absl::string_view, absl::string_view> parts =
      absl::StrSplit(compute_capability, absl::MaxSplits('.', 1));
  int major = 0;
  int minor = 0;
  if (!absl::SimpleAtoi(parts.first, &major) ||
      !absl::SimpleAtoi(parts.second, &minor) || minor > 9) {
    return "";
  }
  const int device = major * 10 + minor;
  std::vector<int> machine_code;
  std::vector<int> ptx;
  for (absl::string_view entry : absl::StrSplit(
           architectures, absl::ByAnyChar(";,"), absl::SkipWhitespace())) {
    const bool real_only = absl::ConsumeSuffix(&entry, "-real");
    const bool virtual_only = absl::ConsumeSuffix(&entry, "-virtual");
    int arch = 0;
    if (!absl::SimpleAtoi(entry, &arch)) continue;
    if (!virtual_only) machine_code.push_back(arch);
    if (!real_only) ptx.push_back(arch);
  }
  if (machine_code.empty() && ptx.empty()) return "";
  for (int arch : machine_code) {
    if (arch / 10 == major && arch <= device) return "";
  }
  for (int arch : ptx) {
    if (arch <= device) return "";
  }
  std::vector<std::string> kernels;
  for (int arch : machine_code) kernels.push_back(Dotted(arch));
  std::string reason =
      absl::StrCat("compute capability ", Dotted(device), ", this build has ");
  if (!kernels.empty()) {
    absl::StrAppend(&reason, "kernels for ",
                    kernels.size() == 1
                        ? kernels[0]
                        : absl::StrCat(absl::StrJoin(kernels.begin(),
                                                     kernels.end() - 1, ", "),
                                       " and ", kernels.back()));
  }
  if (!ptx.empty()) {
    std::vector<std::string> jit;
    for (int arch : ptx) jit.push_back(Dotted(arch));
    absl::StrAppend(&reason, kernels.empty() ? "" : " and ", "PTX for ",
                    absl::StrJoin(jit, ", "), " and newer");
  }
  return reason;
}

}  // namespace chorus
