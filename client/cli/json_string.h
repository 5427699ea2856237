// JsonString: a string as a JSON string literal, for the JSON that chorusctl
// prints (`trace --json`, `watch --json`).
//
// A pure function; thread-safe.
#ifndef CHORUS_CLIENT_CLI_JSON_STRING_H_
#define CHORUS_CLIENT_CLI_JSON_STRING_H_

#include <string>

#include "absl/strings/string_view.h"

namespace chorus {

// Returns `s` in double quotes, with quotes, backslashes and control
// characters escaped.
std::string JsonString(absl::string_view s);

}  // namespace chorus

#endif  // CHORUS_CLIENT_CLI_JSON_STRING_H_
