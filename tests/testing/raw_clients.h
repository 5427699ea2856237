// Clients that speak to Chorus's own ports (the call port, the data port,
// the HTTPS metrics port) byte by byte, as an attacker would: plaintext,
// TLS without a certificate, or TLS with the files of a --tls_dir, sending
// whatever the test gives.
//
// Thread safety: a RawClient is used by one thread; the functions may be
// called from any thread.
#ifndef CHORUS_TESTS_TESTING_RAW_CLIENTS_H_
#define CHORUS_TESTS_TESTING_RAW_CLIENTS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace chorus::test {

// One blocking connection to 127.0.0.1:`port`: plaintext when `tls_dir` is
// empty, else TLS trusting `tls_dir`'s CA and presenting its certificate
// when `present_certificate`.
class RawClient {
 public:
  RawClient(int port, const std::string& tls_dir,
            bool present_certificate = true);
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  // Whether the TCP connection (and TLS handshake) succeeded.
  bool connected() const { return connected_; }

  // Sends `bytes`; false when the connection is gone.
  bool Send(absl::string_view bytes);

  // Returns what arrives first within `wait`, and sets *closed when the
  // server closed the connection instead (or it never opened).
  std::string ReadFor(absl::Duration wait, bool* closed);

 private:
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  int fd_ = -1;
  bool connected_ = false;
};

// Sends the call port's hello and `request` as one frame (call_frame.h) to
// 127.0.0.1:`port` as RawClient does, and returns the reply; UNAVAILABLE
// saying how the connection ended without one: "handshake failed",
// "closed", "closed after a TLS alert", "closed after bytes that are no
// reply", or "still open after 30 s".
absl::StatusOr<v1::CallPortReply> CallPortExchange(
    int port, const std::string& tls_dir, bool present_certificate,
    const v1::CallPortRequest& request);

// Sends `bytes` to 127.0.0.1:`port` as RawClient does and returns whether
// the server closed the connection within 30 s rather than waiting for more.
bool ClosedAfterSending(int port, const std::string& tls_dir,
                        const std::string& bytes);

}  // namespace chorus::test

#endif  // CHORUS_TESTS_TESTING_RAW_CLIENTS_H_
