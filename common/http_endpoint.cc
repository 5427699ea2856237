#include "common/http_endpoint.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "common/tcp_socket.h"
#include "common/tls_stream.h"
#include "common/transport_security.h"
#include "glog/logging.h"
#include "httplib.h"

namespace chorus {
namespace {

// A few threads are plenty for scrapes and a status page, and the machines
// Chorus runs on may have few cores.
constexpr size_t kHttpThreads = 2;

// OK for a caller without TLS or whose certificate names an admin or a
// client; otherwise why it is refused.
absl::Status CheckHttpCaller(const httplib::Request& request) {
  if (request.ssl == nullptr) return absl::OkStatus();
  absl::StatusOr<Identity> identity = PeerIdentity(request.ssl);
  if (!identity.ok()) {
    return absl::UnauthenticatedError(identity.status().message());
  }
  if (identity->role == Role::kAdmin || identity->role == Role::kClient) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "this port answers an admin or a client, not ", identity->Uri()));
}

// OK for a caller without TLS or with an admin certificate: what a page
// with admin_only needs. PERMISSION_DENIED otherwise.
absl::Status CheckAdminCaller(const httplib::Request& request) {
  if (request.ssl == nullptr) return absl::OkStatus();
  absl::StatusOr<Identity> identity = PeerIdentity(request.ssl);
  if (identity.ok() && identity->role == Role::kAdmin) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "this page answers an admin certificate only, not ",
      identity.ok() ? identity->Uri() : std::string("this caller")));
}

std::unique_ptr<httplib::Server> MakeServer() {
  if (!TlsEnabled()) return std::make_unique<httplib::Server>();
  const TlsFiles& files = ActiveTlsFiles();
  return std::make_unique<httplib::SSLServer>(
      files.cert_path.c_str(), files.key_path.c_str(), files.ca_path.c_str());
}

}  // namespace

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
  std::unique_ptr<httplib::Server> server = MakeServer();
  if (!server->is_valid()) {
    return absl::InvalidArgumentError(
        "--metrics_listen: the TLS certificate, key or CA could not be "
        "loaded");
  }
  server->new_task_queue = [] { return new httplib::ThreadPool(kHttpThreads); };
  server->set_pre_routing_handler([](const httplib::Request& request,
                                     httplib::Response& response) {
    absl::Status allowed = CheckHttpCaller(request);
    if (allowed.ok()) return httplib::Server::HandlerResponse::Unhandled;
    response.status = 403;
    response.set_content(std::string(allowed.message()) + "\n", "text/plain");
    return httplib::Server::HandlerResponse::Handled;
  });
  server->Get(
      "/metrics", [](const httplib::Request&, httplib::Response& response) {
        response.set_content(DefaultMetrics().Render(),
                             "text/plain; version=0.0.4; charset=utf-8");
      });
  for (HttpPage& page : pages) {
    const std::string path = page.path;
    server->Get(path, [page = std::move(page)](const httplib::Request& request,
                                               httplib::Response& response) {
      if (page.admin_only) {
        if (absl::Status allowed = CheckAdminCaller(request); !allowed.ok()) {
          response.status = 403;
          response.set_content(std::string(allowed.message()) + "\n",
                               "text/plain");
          return;
        }
      }
      std::map<std::string, std::string> params;
      for (const auto& [key, value] : request.params) params[key] = value;
      response.set_content(page.render(params), page.content_type.c_str());
    });
  }
  int port = address->port;
  if (port == 0) {
    port = server->bind_to_any_port(address->host);
  } else if (!server->bind_to_port(address->host, port)) {
    port = -1;
  }
  if (port <= 0) {
    return absl::UnavailableError(
        absl::StrCat("--metrics_listen: cannot listen on ", listen));
  }
  const bool tls = TlsEnabled();
  auto endpoint = std::unique_ptr<HttpEndpoint>(
      new HttpEndpoint(std::move(server), port, tls));
  LOG(INFO) << "metrics at " << endpoint->scheme() << "://" << address->host
            << ":" << port << "/metrics";
  return endpoint;
}

HttpEndpoint::HttpEndpoint(std::unique_ptr<httplib::Server> server, int port,
                           bool tls)
    : server_(std::move(server)), port_(port), tls_(tls) {
  thread_ = std::thread([this] {
    server_->listen_after_bind();
    stopped_.Notify();
  });
}

HttpEndpoint::~HttpEndpoint() {
  // stop() does nothing before the server thread is running: ask again
  // until it has ended.
  do {
    server_->stop();
  } while (!stopped_.WaitForNotificationWithTimeout(absl::Milliseconds(20)));
  thread_.join();
}

}  // namespace chorus
