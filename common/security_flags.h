// The command-line flags every Chorus binary shares for transport security
// (--tls_dir, --tls_ca, --tls_cert, --tls_key, --tls_refresh, --insecure)
// and the one call that applies them.
//
// Call ApplySecurityFlags once in main, after flags are parsed and before the
// first channel or server is made. Not thread-safe before it returns.
#ifndef CHORUS_COMMON_SECURITY_FLAGS_H_
#define CHORUS_COMMON_SECURITY_FLAGS_H_

#include <optional>

#include "absl/status/statusor.h"
#include "common/transport_security.h"

namespace chorus {

// Turns on mutual TLS when --tls_dir or --tls_cert is given (EnableTls) and
// returns the identity its certificate names; nullopt when neither is given.
// INVALID_ARGUMENT for incomplete or unusable flags or files.
absl::StatusOr<std::optional<Identity>> ApplySecurityFlags();

// Returns --insecure: plaintext on a non-loopback address was asked for.
bool InsecureFlag();

}  // namespace chorus

#endif  // CHORUS_COMMON_SECURITY_FLAGS_H_
