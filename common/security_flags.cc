#include "common/security_flags.h"

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
ABSL_FLAG(std::string, tls_crl, "",
          "PEM certificate revocation list of the CA (scripts/dev_certs.sh "
          "writes DIR/crl.pem; --revoke adds to it): certificates it lists "
          "are refused, also on connections already open (at their next "
          "call). Re-read every --tls_refresh when it changes.");
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

// Replaces `path` with `given` unless that is empty.
void Override(const std::string& given, std::string* path) {
  if (!given.empty()) *path = given;
}

}  // namespace

absl::StatusOr<std::optional<Identity>> ApplySecurityFlags() {
  const std::string dir = absl::GetFlag(FLAGS_tls_dir);
  TlsFiles files = dir.empty() ? TlsFiles() : TlsFilesInDir(dir);
  Override(absl::GetFlag(FLAGS_tls_ca), &files.ca_path);
  Override(absl::GetFlag(FLAGS_tls_cert), &files.cert_path);
  Override(absl::GetFlag(FLAGS_tls_key), &files.key_path);
  files.refresh_interval = absl::GetFlag(FLAGS_tls_refresh);
  files.crl_path = absl::GetFlag(FLAGS_tls_crl);
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
