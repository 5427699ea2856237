#include "server/common/security_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

ABSL_FLAG(std::string, tls_dir, "",
          "Directory with ca.pem, cert.pem and key.pem (what "
          "scripts/dev_certs.sh writes per identity): turns on mutual TLS "
          "for every connection this process makes or serves. The "
          "certificate must name one chorus:// identity (URI subject "
          "alternative name). Files are re-read when they change.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA peers' certificates must chain to; overrides "
          "--tls_dir's ca.pem.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) of this process; overrides --tls_dir's "
          "cert.pem.");
ABSL_FLAG(std::string, tls_key, "",
          "PEM private key of --tls_cert; overrides --tls_dir's key.pem.");
ABSL_FLAG(absl::Duration, tls_refresh, absl::Seconds(10),
          "How often the TLS files are checked for changes; a changed "
          "certificate is used for new connections without a restart.");
ABSL_FLAG(bool, insecure, false,
          "Serve a non-loopback address without TLS (logs a warning): anyone "
          "who can reach the ports can then act as any worker or rank. "
          "Without TLS and without this flag, a daemon refuses to listen "
          "anywhere but on loopback.");

namespace chorus {
namespace {

std::string PathFlag(const std::string& given, const std::string& dir,
                     const char* file) {
  if (!given.empty() || dir.empty()) return given;
  return absl::StrCat(dir, "/", file);
}

}  // namespace

absl::StatusOr<std::optional<Identity>> ApplySecurityFlags() {
  const std::string dir = absl::GetFlag(FLAGS_tls_dir);
  TlsFiles files;
  files.ca_path = PathFlag(absl::GetFlag(FLAGS_tls_ca), dir, "ca.pem");
  files.cert_path = PathFlag(absl::GetFlag(FLAGS_tls_cert), dir, "cert.pem");
  files.key_path = PathFlag(absl::GetFlag(FLAGS_tls_key), dir, "key.pem");
  files.refresh_interval = absl::GetFlag(FLAGS_tls_refresh);
  if (files.ca_path.empty() && files.cert_path.empty() &&
      files.key_path.empty()) {
    return std::nullopt;
  }
  if (files.ca_path.empty() || files.cert_path.empty() ||
      files.key_path.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs a CA, a certificate and a key: give --tls_dir, or all of "
        "--tls_ca, --tls_cert and --tls_key");
  }
  absl::StatusOr<Identity> identity = EnableTls(files);
  if (!identity.ok()) return identity.status();
  return *identity;
}

bool InsecureFlag() { return absl::GetFlag(FLAGS_insecure); }

}  // namespace chorus
