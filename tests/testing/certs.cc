#include "tests/testing/certs.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/transport_security.h"
#include "tests/testing/daemons.h"

namespace chorus::test {
namespace {

absl::Status RunShell(const std::string& script) {
  absl::StatusOr<CommandResult> result =
      RunCommand("/bin/bash", {"-c", script}, absl::Seconds(60));
  if (!result.ok()) return result.status();
  if (result->exit_code != 0) {
    return absl::InternalError(
        absl::StrCat("`", script, "` failed: ", result->out, result->err));
  }
  return absl::OkStatus();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

}  // namespace

absl::StatusOr<std::string> MakeDevCerts(const std::string& parent,
                                         const std::vector<std::string>& args) {
  std::string dir = absl::StrCat(parent, "/certs-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp in ", parent));
  }
  absl::Status made = AddDevCerts(dir, args);
  if (!made.ok()) return made;
  return dir;
}

absl::Status AddDevCerts(const std::string& dir,
                         const std::vector<std::string>& args) {
  return RunShell(absl::StrCat(CHORUS_DEV_CERTS_SCRIPT, " --out=", dir, " ",
                               absl::StrJoin(args, " ")));
}

absl::StatusOr<std::string> MakeExpiredWorkerCert(const std::string& dir,
                                                  const std::string& name) {
  const std::string out = absl::StrCat(dir, "/expired-worker-", name);
  // `openssl ca` is the one openssl command that sets both validity dates.
  const std::string& d = out;
  const std::string script = absl::StrCat(
      "set -e; mkdir -p ", d, "/db; touch ", d, "/db/index; echo 01 > ", d,
      "/db/serial; printf '[ca]\\ndefault_ca=c\\n[c]\\ndatabase=", d,
      "/db/index\\nnew_certs_dir=", d, "/db\\nserial=", d,
      "/db/serial\\ndefault_md=sha256\\npolicy=p\\nunique_subject=no\\n",
      "copy_extensions=none\\n[p]\\ncommonName=supplied\\n[x]\\n",
      "subjectAltName=URI:chorus://worker/", name,
      "\\nextendedKeyUsage=serverAuth,clientAuth\\n' > ", d, "/ca.cnf; ",
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ",
      "-keyout ", d, "/key.pem -out ", d, "/req.csr -subj /CN=", name,
      " 2>/dev/null; openssl ca -batch -config ", d, "/ca.cnf -extensions x ",
      "-notext -cert ", dir, "/ca.pem -keyfile ", dir, "/ca.key ",
      "-startdate 20200101000000Z -enddate 20210101000000Z -in ", d,
      "/req.csr -out ", d, "/cert.pem 2>&1; cp ", dir, "/ca.pem ", d,
      "/ca.pem");
  absl::Status made = RunShell(script);
  if (!made.ok()) return made;
  return out;
}

namespace {

// The folder of the process's certificates, while a suite runs.
std::string* tls_folder = nullptr;

// Makes certificates with `args` and turns TLS on in this process with
// those of `identity` (a folder of the script's output).
void EnableTestTls(const std::vector<std::string>& args,
                   const std::string& identity) {
  std::string parent = ::testing::TempDir() + "/chorus-tls-XXXXXX";
  ASSERT_NE(mkdtemp(parent.data()), nullptr) << "mkdtemp in " << parent;
  tls_folder = new std::string(parent);
  absl::StatusOr<std::string> dir = MakeDevCerts(parent, args);
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<Identity> own =
      EnableTls(TlsFilesInDir(absl::StrCat(*dir, "/", identity)));
  ASSERT_TRUE(own.ok()) << own.status();
}

// Removes the folder EnableTestTls made (TLS stays on in the process).
void RemoveTestTlsFolder() {
  if (tls_folder == nullptr) return;
  std::error_code ignored;
  std::filesystem::remove_all(*tls_folder, ignored);
  delete tls_folder;
  tls_folder = nullptr;
}

}  // namespace

void CoordinatorTlsSuite::SetUpTestSuite() { EnableTestTls({}, "coordinator"); }

void WorkerTlsSuite::SetUpTestSuite() {
  EnableTestTls({"--workers=w0"}, "worker-w0");
}

void CoordinatorTlsSuite::TearDownTestSuite() { RemoveTestTlsFolder(); }

void WorkerTlsSuite::TearDownTestSuite() { RemoveTestTlsFolder(); }

PemFiles ReadPemFiles(const std::string& tls_dir) {
  return PemFiles{ReadFile(tls_dir + "/ca.pem"),
                  ReadFile(tls_dir + "/cert.pem"),
                  ReadFile(tls_dir + "/key.pem")};
}

}  // namespace chorus::test
