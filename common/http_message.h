// The small part of HTTP/1.1 a daemon's metrics port speaks: the head of a
// GET request (request line and headers, up to the blank line), parsed into
// a path and query parameters, and a whole response with a body, sent with
// "Connection: close". No request bodies, no chunked encoding, no
// keep-alive: a scrape or a status page is one request per connection.
//
// Stateless functions; thread-safe.
#ifndef CHORUS_COMMON_HTTP_MESSAGE_H_
#define CHORUS_COMMON_HTTP_MESSAGE_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace chorus {

// The longest request head accepted, in bytes.
inline constexpr size_t kMaxHttpHeadBytes = 16 << 10;

// Where the head in `bytes` ends (the index just past its blank line), or
// 0 while it has not ended.
size_t HttpHeadEnd(absl::string_view bytes);

struct HttpRequest {
  std::string method;
  // The target's path, percent-decoded ("/metrics").
  std::string path;
  // The query's parameters, percent-decoded ('+' is a space); a name given
  // twice keeps its first value.
  std::map<std::string, std::string> params;
};

// Parses a request head (as HttpHeadEnd delimits it). Returns
// INVALID_ARGUMENT when the request line is not "METHOD TARGET HTTP/1.x"
// with a target starting with '/', or a percent escape is malformed.
absl::StatusOr<HttpRequest> ParseHttpRequestHead(absl::string_view head);

// A whole response: status line for `code` (200, 400, 403, 404, 405),
// Content-Type, Content-Length, Connection: close, then `body`.
std::string FormatHttpResponse(int code, absl::string_view content_type,
                               absl::string_view body);

}  // namespace chorus

#endif  // CHORUS_COMMON_HTTP_MESSAGE_H_
