#include "client/python/embedded/tls_admission.h"

#include <filesystem>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/certificate_check.h"
#include "common/transport_security.h"

namespace chorus {
namespace {

// The workers of this process (tls_admission.h says why TLS needs them
// counted).
struct LiveWorkers {
  absl::Mutex mu;
  // Workers started and not closed.
  int count ABSL_GUARDED_BY(mu) = 0;
};

LiveWorkers& Live() {
  static LiveWorkers* const live = new LiveWorkers();
  return *live;
}

// The tls_dir TLS is on with in this process; "" while it is off. (TLS
// goes on here only, with TlsFilesInDir().)
std::string ActiveTlsDir() {
  if (!TlsEnabled()) return "";
  return std::filesystem::path(ActiveTlsFiles().cert_path)
      .parent_path()
      .string();
}

// Checks that the certificate of `files` is a worker's, before TLS goes on
// with it (which cannot be undone). Leaves other problems of the files to
// EnableTls, which names them.
absl::Status CheckWorkerCertificate(const TlsFiles& files) {
  absl::StatusOr<std::vector<std::string>> uris =
      CheckCertificateFiles(files.ca_path, files.cert_path, files.key_path);
  if (!uris.ok()) return absl::OkStatus();
  std::vector<Identity> identities;
  for (const std::string& uri : *uris) {
    absl::StatusOr<Identity> identity = ParseIdentityUri(uri);
    if (identity.ok()) identities.push_back(*identity);
  }
  if (identities.size() == 1 && identities[0].role != Role::kWorker) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the TLS certificate ", files.cert_path, " names ", identities[0].Uri(),
        "; a worker needs chorus://worker/NAME"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AdmitWorker(const std::string& tls_dir, std::string* name) {
  LiveWorkers& live = Live();
  absl::MutexLock lock(&live.mu);
  const std::string active = ActiveTlsDir();
  if (tls_dir.empty() && !active.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "TLS is on in this process (an embedded worker started with "
        "tls_dir=",
        active, "); every embedded worker of a process passes that tls_dir"));
  }
  if (!tls_dir.empty()) {
    if (active.empty()) {
      if (live.count > 0) {
        return absl::FailedPreconditionError(
            "an embedded worker without TLS runs in this process; TLS goes "
            "on for the whole process, so close it first");
      }
      const TlsFiles files = TlsFilesInDir(tls_dir);
      absl::Status checked = CheckWorkerCertificate(files);
      if (!checked.ok()) return checked;
      absl::StatusOr<Identity> enabled = EnableTls(files);
      if (!enabled.ok()) return enabled.status();
    } else if (active != tls_dir) {
      return absl::FailedPreconditionError(absl::StrCat(
          "TLS is on in this process with tls_dir=", active,
          "; every embedded worker of a process passes that tls_dir, not ",
          tls_dir));
    }
    // A worker's: CheckWorkerCertificate let no other identity in.
    const Identity& identity = OwnIdentity();
    if (name->empty()) *name = identity.name;
    if (*name != identity.name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "name ", *name, " but the TLS certificate names ", identity.Uri(),
          "; the coordinator would refuse the registration"));
    }
  }
  ++live.count;
  return absl::OkStatus();
}

void WorkerGone() {
  LiveWorkers& live = Live();
  absl::MutexLock lock(&live.mu);
  --live.count;
}

}  // namespace chorus
