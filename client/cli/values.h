// Text <-> bytes for chorusctl: parses numbers given on the command line
// into little-endian elements of a dtype, and prints elements back.
//
// Pure functions; thread-safe.
#ifndef CHORUS_CLIENT_CLI_VALUES_H_
#define CHORUS_CLIENT_CLI_VALUES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace chorus {

// Returns the elements' bytes. INVALID_ARGUMENT names the first value that
// is not a number or does not fit the dtype (integers must be exact and in
// range; f16/bf16 round to nearest even).
absl::StatusOr<std::string> EncodeValues(DType dtype,
                                         const std::vector<std::string>& text);

// Returns one string per element; `bytes` must hold whole elements.
std::vector<std::string> DecodeValues(DType dtype, const std::string& bytes);

}  // namespace chorus

#endif  // CHORUS_CLIENT_CLI_VALUES_H_
