#include "common/http_message.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace chorus {
namespace {

std::optional<int> HexDigit(char c) {
  if (absl::ascii_isdigit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return std::nullopt;
}

// Percent-decodes `text`; '+' becomes a space when `plus_is_space`.
absl::StatusOr<std::string> Decode(absl::string_view text, bool plus_is_space) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '+' && plus_is_space) {
      out.push_back(' ');
    } else if (c != '%') {
      out.push_back(c);
    } else {
      if (i + 2 >= text.size()) {
        return absl::InvalidArgumentError("a malformed percent escape");
      }
      const std::optional<int> high = HexDigit(text[i + 1]);
      const std::optional<int> low = HexDigit(text[i + 2]);
      if (!high.has_value() || !low.has_value()) {
        return absl::InvalidArgumentError("a malformed percent escape");
      }
      out.push_back(static_cast<char>(*high * 16 + *low));
      i += 2;
    }
  }
  return out;
}

absl::string_view ReasonPhrase(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    default:
      return "Error";
  }
}

}  // namespace

size_t HttpHeadEnd(absl::string_view bytes) {
  const size_t blank = bytes.find("\r\n\r\n");
  return blank == absl::string_view::npos ? 0 : blank + 4;
}

absl::StatusOr<HttpRequest> ParseHttpRequestHead(absl::string_view head) {
  const absl::string_view line = head.substr(0, head.find("\r\n"));
  const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || parts[0].empty() ||
      !absl::StartsWith(parts[1], "/") ||
      !absl::StartsWith(parts[2], "HTTP/1.")) {
    return absl::InvalidArgumentError("not an HTTP/1.x request line");
  }
  HttpRequest request;
  request.method = std::string(parts[0]);
  const std::pair<absl::string_view, absl::string_view> target =
      absl::StrSplit(parts[1], absl::MaxSplits('?', 1));
  absl::StatusOr<std::string> path = Decode(target.first, false);
  if (!path.ok()) return path.status();
  request.path = *std::move(path);
  for (absl::string_view pair :
       absl::StrSplit(target.second, '&', absl::SkipEmpty())) {
    const std::pair<absl::string_view, absl::string_view> name_value =
        absl::StrSplit(pair, absl::MaxSplits('=', 1));
    absl::StatusOr<std::string> name = Decode(name_value.first, true);
    absl::StatusOr<std::string> value = Decode(name_value.second, true);
    if (!name.ok()) return name.status();
    if (!value.ok()) return value.status();
    request.params.emplace(*std::move(name), *std::move(value));
  }
  return request;
}

std::string FormatHttpResponse(int code, absl::string_view content_type,
                               absl::string_view body) {
  return absl::StrCat("HTTP/1.1 ", code, " ", ReasonPhrase(code),
                      "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace chorus
