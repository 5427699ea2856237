#include "common/tls_context.h"

#include <glog/logging.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/certificate_check.h"
#include "common/revocation.h"

namespace chorus {
namespace {

// The OpenSSL context of Chorus's own TLS connections, rebuilt when a TLS file
// changes.
class ContextCache {
 public:
  // Returns a new SSL on the current context; null (with `why`) when no
  // context could be built.
  SSL* NewSsl(std::string* why) {
    absl::MutexLock lock(&mu_);
    const TlsFiles& files = ActiveTlsFiles();
    const std::vector<int64_t> stamps = {
        Stamp(files.ca_path), Stamp(files.cert_path), Stamp(files.key_path)};
    if (ctx_ == nullptr || stamps != stamps_) {
      SSL_CTX* fresh = Build(files, why);
      if (fresh != nullptr) {
        if (ctx_ != nullptr) SSL_CTX_free(ctx_);
        ctx_ = fresh;
        stamps_ = stamps;
      } else if (ctx_ != nullptr) {
        LOG(WARNING) << "data plane TLS: keeping the certificates in use: "
                     << *why;
      }
    }
    if (ctx_ == nullptr) return nullptr;
    return SSL_new(ctx_);
  }

 private:
  static int64_t Stamp(const std::string& path) {
    struct stat info;
    if (stat(path.c_str(), &info) != 0) return -1;
    return static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000000 +
           info.st_mtim.tv_nsec + static_cast<int64_t>(info.st_size);
  }

  static SSL_CTX* Build(const TlsFiles& files, std::string* why) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_method());
    if (ctx == nullptr) {
      *why = OpenSslError();
      return nullptr;
    }
    const bool ok =
        SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) == 1 &&
        SSL_CTX_use_certificate_chain_file(ctx, files.cert_path.c_str()) == 1 &&
        SSL_CTX_use_PrivateKey_file(ctx, files.key_path.c_str(),
                                    SSL_FILETYPE_PEM) == 1 &&
        SSL_CTX_check_private_key(ctx) == 1 &&
        SSL_CTX_load_verify_locations(ctx, files.ca_path.c_str(), nullptr) == 1;
    if (!ok) {
      *why = OpenSslError();
      SSL_CTX_free(ctx);
      return nullptr;
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                       nullptr);
    // AES-128-GCM first: as safe for this use and the cheapest on the CPU,
    // which encrypts every byte of the data plane.
    SSL_CTX_set_ciphersuites(ctx,
                             "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                             "TLS_CHACHA20_POLY1305_SHA256");
    // Nothing but the frames travels after the handshake (see the header).
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
                              SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    return ctx;
  }

  absl::Mutex mu_;
  SSL_CTX* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<int64_t> stamps_ ABSL_GUARDED_BY(mu_);
};

ContextCache& Contexts() {
  static ContextCache* cache = new ContextCache;
  return *cache;
}

}  // namespace

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "the connection closed";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

SSL* NewTlsConnection(std::string* why) { return Contexts().NewSsl(why); }

std::string TlsHandshakeError(SSL* ssl) {
  const long verified = SSL_get_verify_result(ssl);
  if (verified != X509_V_OK) {
    ERR_clear_error();
    return absl::StrCat("the peer's certificate: ",
                        X509_verify_cert_error_string(verified));
  }
  return OpenSslError();
}

absl::StatusOr<Identity> PeerIdentity(const SSL* ssl) {
  X509* cert = SSL_get1_peer_certificate(ssl);
  if (cert == nullptr) {
    return absl::UnavailableError("the peer sent no certificate");
  }
  const std::vector<std::string> uris = CertificateUris(cert);
  const std::string id = CertificateId(cert);
  X509_free(cert);
  for (const std::string& uri : uris) {
    absl::StatusOr<Identity> identity = ParseIdentityUri(uri);
    if (identity.ok()) {
      identity->certificate_id = id;
      return identity;
    }
  }
  return absl::UnavailableError(
      "the peer's certificate names no chorus:// identity");
}

}  // namespace chorus
