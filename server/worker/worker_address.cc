#include "server/worker/worker_address.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "common/tcp_socket.h"

namespace chorus {
namespace {

// "host:port", with brackets around an IPv6 host.
std::string JoinHostPort(const std::string& host, int port) {
  return host.find(':') == std::string::npos
             ? absl::StrCat(host, ":", port)
             : absl::StrCat("[", host, "]:", port);
}

// The address peers use when --advertise_address is not given, and why it
// was chosen (for the log):
// - the listen host, when the worker listens on one address;
// - listening on every interface with the coordinator on this machine
//   (a loopback address or a name for one): this machine's hostname, as
//   every peer on this machine resolves it alike;
// - listening on every interface with the coordinator elsewhere: the local
//   address of this host's route to the coordinator, the address the
//   coordinator and the peers on its network see this worker at. The
//   hostname is not used: it often resolves to a loopback address (Debian's
//   /etc/hosts maps it to 127.0.1.1), or to the same address on cloned
//   machines, and peers would then connect to themselves.
std::string AdvertisedAddress(const std::string& listen,
                              const std::string& coordinator, int port,
                              std::string* why) {
  const std::string host = listen.substr(0, listen.rfind(':'));
  if (!(host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::")) {
    *why = "the --listen host";
    return absl::StrCat(host, ":", port);
  }
  absl::StatusOr<HostPort> where = SplitHostPort(coordinator);
  if (!where.ok() || IsLoopbackHost(where->host)) {
    *why = "this machine's hostname; the coordinator is on this machine";
    return JoinHostPort(Hostname(), port);
  }
  absl::StatusOr<std::string> local =
      LocalAddressTowards(where->host, where->port);
  if (!local.ok()) {
    *why = absl::StrCat(
        "this machine's hostname: no local address towards the coordinator (",
        local.status().message(), "); set --advertise_address");
    return JoinHostPort(Hostname(), port);
  }
  *why = absl::StrCat("the local address of the route to the coordinator at ",
                      coordinator);
  return JoinHostPort(*local, port);
}

// The address peers use: `advertise` as given when it has a port, else its
// host with the bound port. INVALID_ARGUMENT for anything else.
absl::StatusOr<std::string> AdvertiseWithPort(const std::string& advertise,
                                              int port) {
  if (SplitHostPort(advertise).ok()) return advertise;
  const absl::Status bad = absl::InvalidArgumentError(absl::StrCat(
      "advertise address \"", advertise,
      "\" is neither host nor host:port with a port in [0, 65535]"));
  const size_t colons = std::count(advertise.begin(), advertise.end(), ':');
  // One colon is a host:port whose port is wrong; an unclosed bracket is
  // not an address.
  if (advertise.empty() || colons == 1 ||
      (advertise.front() == '[' && advertise.back() != ']')) {
    return bad;
  }
  // A bare IPv6 address takes brackets before its port.
  const std::string host = colons >= 2 && advertise.front() != '['
                               ? absl::StrCat("[", advertise, "]")
                               : advertise;
  const std::string with_port = absl::StrCat(host, ":", port);
  if (!SplitHostPort(with_port).ok()) return bad;
  return with_port;
}

// Refuses an advertised address peers could not use: a host that does not
// resolve or that this host has no route to; a loopback address while the
// coordinator (and so, presumably, the peers) is elsewhere; a non-loopback
// address while the worker listens on a loopback address only. An address
// that is not this host's own (a NAT's, a port mapping's) is allowed.
// `coordinator_remote`: the coordinator is not on a loopback address.
absl::Status CheckAdvertised(const std::string& advertised,
                             const std::string& listen_host,
                             const std::string& coordinator,
                             bool coordinator_remote) {
  absl::StatusOr<HostPort> where = SplitHostPort(advertised);
  if (!where.ok()) return where.status();
  const std::string prefix =
      absl::StrCat("advertise address \"", advertised, "\": ");
  absl::StatusOr<std::string> route =
      LocalAddressTowards(where->host, where->port);
  if (!route.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "peers could not reach it (", route.status().message(), ")"));
  }
  const bool loopback = IsLoopbackHost(where->host);
  if (loopback && coordinator_remote) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "a loopback address, while the coordinator at ", coordinator,
        " is on another host: peers there could not reach this worker"));
  }
  if (!loopback && IsLoopbackHost(listen_host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "not a loopback address, but this worker listens on ",
        listen_host, " only; set --listen to an address peers reach"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string Hostname() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof(buffer) - 1) != 0) return "localhost";
  return buffer;
}

std::string MachineIdentity() {
  std::string id;
  for (const char* path : {"/etc/machine-id", "/var/lib/dbus/machine-id"}) {
    std::ifstream file(path);
    if (file && std::getline(file, id) && !id.empty()) break;
    id.clear();
  }
  char netns[64] = {};
  const ssize_t n = readlink("/proc/self/ns/net", netns, sizeof(netns) - 1);
  if (id.empty() || n <= 0) return "";
  return absl::StrCat(id, "/", absl::string_view(netns, n));
}

absl::StatusOr<std::string> ChoosePeerAddress(const std::string& listen,
                                              const std::string& advertise,
                                              const std::string& coordinator,
                                              int port, std::string* why) {
  absl::StatusOr<HostPort> listen_at = SplitHostPort(listen);
  if (!listen_at.ok()) return listen_at.status();
  absl::StatusOr<HostPort> coordinator_at = SplitHostPort(coordinator);
  const bool coordinator_remote =
      coordinator_at.ok() && !IsLoopbackHost(coordinator_at->host);
  if (advertise.empty()) {
    if (coordinator_remote && IsLoopbackHost(listen_at->host)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "this worker listens on ", listen,
          ", a loopback address, but the coordinator at ", coordinator,
          " is on another host: peers there could not reach it. Listen on an "
          "address they reach (e.g. 0.0.0.0:0; without TLS that needs "
          "--insecure)"));
    }
    return AdvertisedAddress(listen, coordinator, port, why);
  }
  *why = "--advertise_address";
  absl::StatusOr<std::string> advertised = AdvertiseWithPort(advertise, port);
  if (!advertised.ok()) return advertised.status();
  absl::Status usable = CheckAdvertised(*advertised, listen_at->host,
                                        coordinator, coordinator_remote);
  if (!usable.ok()) return usable;
  return advertised;
}

}  // namespace chorus
