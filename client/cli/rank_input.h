// chorusctl's tensors beyond the command line: one rank's input read from
// a file of raw elements (--input=FILE) or made of one value repeated
// (--fill=VALUE), and its output written to a file of raw elements
// (--output=FILE). A tensor of megabytes does not fit the kernel's limit on
// a command line's arguments. Raw elements are little-endian values of the
// dtype back to back, as numpy's tofile() writes them.
//
// Pure functions but for the files they read and write; thread-safe.
#ifndef CHORUS_CLIENT_CLI_RANK_INPUT_H_
#define CHORUS_CLIENT_CLI_RANK_INPUT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"

namespace chorus {

// Returns the bytes of the file at `path`, raw elements of `dtype`.
// NOT_FOUND when it cannot be opened; INVALID_ARGUMENT when its size is not
// a whole number of elements (the message says both sizes) or over
// `max_bytes`.
absl::StatusOr<std::string> ReadElementsFile(const std::string& path,
                                             DType dtype, uint64_t max_bytes);

// Returns `count` elements of `dtype`, each `value` as EncodeValues
// (values.h) parses it. INVALID_ARGUMENT when it is not a value of the dtype
// or the elements would exceed `max_bytes`.
absl::StatusOr<std::string> FillElements(DType dtype, const std::string& value,
                                         uint64_t count, uint64_t max_bytes);

// Writes `bytes` to the file at `path`, replacing it. UNAVAILABLE naming
// the path and the error when it cannot be written whole.
absl::Status WriteElementsFile(const std::string& path,
                               absl::string_view bytes);

}  // namespace chorus

#endif  // CHORUS_CLIENT_CLI_RANK_INPUT_H_
