// HttpEndpoint: a daemon's HTTP port (--metrics_listen), which serves
// Prometheus's scrape at /metrics (the process's MetricsRegistry) and any
// pages the daemon adds (the coordinator's status page). It follows the
// daemons' security rules: without TLS it serves plain HTTP, and only on a
// loopback address unless the daemon runs with --insecure; with TLS
// (transport_security.h) it serves HTTPS with the daemon's certificate and
// answers only clients presenting a certificate of the Chorus CA whose role
// the authorization table lets get the path (/metrics: an admin or a
// client; the coordinator's status page: an admin).
//
// It serves one request per connection on one thread with epoll
// (FrameServer with Framing::kHttpRequests): TLS handshakes and request
// heads never hold a thread, a connection has 5 s to send its head, and
// more than 256 still waiting close the oldest, so idle or trickling
// clients cannot keep a scrape waiting. Answers say "Connection: close".
//
// Lifecycle: Start() binds and serves on its own thread; the destructor
// stops serving and joins it.
// Thread safety: page functions run on the serving thread, one at a time,
// beside the daemon's other threads; they must be thread-safe.
#ifndef CHORUS_COMMON_HTTP_ENDPOINT_H_
#define CHORUS_COMMON_HTTP_ENDPOINT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/transport_security.h"

namespace chorus {

class FrameServer;

// A page: GET `path` answers `render(query parameters)` as `content_type`.
// With TLS, the authorization table (authorization.h) says who may get it
// ("GET PATH"; a path not in it answers nobody).
struct HttpPage {
  std::string path;
  std::string content_type;
  std::function<std::string(const std::map<std::string, std::string>&)> render;
};

class HttpEndpoint {
 public:
  // Serves /metrics and `pages` on `listen` ("host:port"; port 0 picks one).
  // Returns INVALID_ARGUMENT for a malformed address, FAILED_PRECONDITION for
  // a non-loopback address without TLS and without `insecure` (saying how
  // to turn TLS on), UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(
      const std::string& listen, bool insecure, std::vector<HttpPage> pages);

  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  // The bound port.
  int port() const { return port_; }
  // "http" or "https".
  const char* scheme() const { return tls_ ? "https" : "http"; }

 private:
  HttpEndpoint(std::vector<HttpPage> pages, int port, bool tls);

  // The whole response to the request `head` from `caller` (null without
  // TLS): 200 with the page, 400 for a malformed request, 403 for a caller
  // the page does not answer, 404 for an unknown path, 405 for other than
  // GET.
  std::string Answer(absl::string_view head, const Identity* caller) const;

  const std::vector<HttpPage> pages_;
  const int port_;
  const bool tls_;
  std::unique_ptr<FrameServer> server_;
};

}  // namespace chorus

#endif  // CHORUS_COMMON_HTTP_ENDPOINT_H_
