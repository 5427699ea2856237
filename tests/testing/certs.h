// Test certificates for mutual TLS, made with the same script users run
// (scripts/dev_certs.sh), plus an expired certificate, which that script
// does not make.
//
// Thread safety: call from the test's main thread.
#ifndef CHORUS_TESTS_TESTING_CERTS_H_
#define CHORUS_TESTS_TESTING_CERTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace chorus::test {

// Runs scripts/dev_certs.sh --out=DIR with `args` (e.g. "--workers=w0,w1")
// for a new directory DIR under `parent` and returns DIR. Returns INTERNAL
// with the script's output when it fails.
absl::StatusOr<std::string> MakeDevCerts(const std::string& parent,
                                         const std::vector<std::string>& args);

// Runs scripts/dev_certs.sh --out=`dir` with `args` on a directory it made
// before (its CA is kept), e.g. to add a job's certificates with
// "--job=blue". Returns INTERNAL with the script's output when it fails.
absl::Status AddDevCerts(const std::string& dir,
                         const std::vector<std::string>& args);

// Writes DIR/expired-worker-NAME/{ca.pem,cert.pem,key.pem}: a worker
// certificate for NAME signed by DIR's CA that expired in 2021. Returns
// INTERNAL with openssl's output when it fails.
absl::StatusOr<std::string> MakeExpiredWorkerCert(const std::string& dir,
                                                  const std::string& name);

// A test suite whose process runs TLS as the coordinator
// (chorus://coordinator), with certificates MakeDevCerts makes in a new
// folder under the test's temporary directory, so both ends of a
// connection the test makes present that certificate. The folder is
// removed after the suite. TLS stays on in the process: one such suite per
// test binary.
class CoordinatorTlsSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();
};

// As CoordinatorTlsSuite, with the process running TLS as worker "w0"
// (chorus://worker/w0), what a data-plane listener accepts.
class WorkerTlsSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();
};

// The three PEM files of a --tls_dir, read into memory.
struct PemFiles {
  std::string ca;
  std::string cert;
  std::string key;
};

// Reads `tls_dir`/ca.pem, cert.pem and key.pem (absent files read as empty).
PemFiles ReadPemFiles(const std::string& tls_dir);

}  // namespace chorus::test

#endif  // CHORUS_TESTS_TESTING_CERTS_H_
