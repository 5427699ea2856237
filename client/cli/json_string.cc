#include "client/cli/json_string.h"

#include "absl/strings/str_cat.h"

namespace chorus {

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppend(&out, "\\u00", absl::Hex(c, absl::kZeroPad2));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace chorus
