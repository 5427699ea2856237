#include "common/http_endpoint.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/authorization.h"
#include "common/frame_server.h"
#include "common/http_message.h"
#include "common/metrics.h"
#include "common/tcp_socket.h"
#include "common/transport_security.h"
#include "glog/logging.h"

namespace chorus {
namespace {

constexpr char kTextPlain[] = "text/plain; charset=utf-8";

// OK for a caller without TLS or one the authorization table lets GET
// `path`; PERMISSION_DENIED otherwise.
absl::Status CheckHttpCaller(absl::string_view path, const Identity* caller) {
  if (caller == nullptr) return absl::OkStatus();
  return Authorize(absl::StrCat("GET ", path), *caller);
}

std::string Refusal(int code, absl::string_view why) {
  return FormatHttpResponse(code, kTextPlain, absl::StrCat(why, "\n"));
}

}  // namespace

std::string HttpEndpoint::Answer(absl::string_view head,
                                 const Identity* caller) const {
  absl::StatusOr<HttpRequest> request = ParseHttpRequestHead(head);
  if (!request.ok()) return Refusal(400, request.status().message());
  if (request->method != "GET") {
    return Refusal(405, "only GET is served here");
  }
  const HttpPage* page = nullptr;
  for (const HttpPage& p : pages_) {
    if (p.path == request->path) page = &p;
  }
  if (request->path != "/metrics" && page == nullptr) {
    return Refusal(404, absl::StrCat("no page at ", request->path));
  }
  if (absl::Status allowed = CheckHttpCaller(request->path, caller);
      !allowed.ok()) {
    return Refusal(403, allowed.message());
  }
  if (page != nullptr) {
    return FormatHttpResponse(200, page->content_type,
                              page->render(request->params));
  }
  return FormatHttpResponse(200, "text/plain; version=0.0.4; charset=utf-8",
                            DefaultMetrics().Render());
}

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(
    const std::string& listen, bool insecure, std::vector<HttpPage> pages) {
  absl::StatusOr<HostPort> address = SplitHostPort(listen);
  if (!address.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen: ", address.status().message()));
  }
  if (absl::Status allowed =
          CheckPlaintextListen("--metrics_listen", address->host, insecure);
      !allowed.ok()) {
    return allowed;
  }
  absl::StatusOr<Listener> listener = ListenTcp(address->host, address->port);
  if (!listener.ok()) {
    return absl::UnavailableError(
        absl::StrCat("--metrics_listen: cannot listen on ", listen));
  }
  auto endpoint = std::unique_ptr<HttpEndpoint>(
      new HttpEndpoint(std::move(pages), listener->port, TlsEnabled()));
  FrameServer::Options options;
  options.name = "metrics port";
  options.framing = FrameServer::Framing::kHttpRequests;
  options.tls = endpoint->tls_;
  absl::StatusOr<std::unique_ptr<FrameServer>> server = FrameServer::Start(
      listener->fd, std::move(options),
      [raw = endpoint.get()](std::string head, FrameServer::Replier reply,
                             const Identity* caller) {
        reply.Send(raw->Answer(head, caller));
        return false;
      });
  if (!server.ok()) return server.status();
  endpoint->server_ = *std::move(server);
  LOG(INFO) << "metrics at " << endpoint->scheme() << "://" << address->host
            << ":" << endpoint->port_ << "/metrics";
  return endpoint;
}

HttpEndpoint::HttpEndpoint(std::vector<HttpPage> pages, int port, bool tls)
    : pages_(std::move(pages)), port_(port), tls_(tls) {}

HttpEndpoint::~HttpEndpoint() {
  if (server_ != nullptr) server_->Shutdown();
}

}  // namespace chorus
