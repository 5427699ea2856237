// Startup checks of the PEM files a process is given for mutual TLS, so that
// a wrong file ends the daemon at once with a message naming it instead of
// failing every handshake later.
//
// Pure functions (they read files); thread-safe.
#ifndef CHORUS_COMMON_CERTIFICATE_CHECK_H_
#define CHORUS_COMMON_CERTIFICATE_CHECK_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

typedef struct x509_st X509;

namespace chorus {

// Returns the URI subject alternative names of `cert`.
std::vector<std::string> CertificateUris(X509* cert);

// Checks that `ca_path` holds at least one certificate, `cert_path` a
// certificate chain whose first certificate chains to those CAs and is valid
// now, and `key_path` the private key of that certificate. Returns the URI
// subject alternative names of the certificate; INVALID_ARGUMENT naming the
// file and the problem otherwise.
absl::StatusOr<std::vector<std::string>> CheckCertificateFiles(
    const std::string& ca_path, const std::string& cert_path,
    const std::string& key_path);

}  // namespace chorus

#endif  // CHORUS_COMMON_CERTIFICATE_CHECK_H_
