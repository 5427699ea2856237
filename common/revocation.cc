#include "common/revocation.h"

#include <glog/logging.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/wakeup_loop.h"

namespace chorus {
namespace {

using RevokedSet = absl::flat_hash_set<std::string>;

// "ISSUER_HASH:SERIAL" of a serial number under an issuer name.
std::string IdOf(X509_NAME* issuer, const ASN1_INTEGER* serial) {
  std::string hex = "?";
  if (BIGNUM* number = ASN1_INTEGER_to_BN(serial, nullptr)) {
    if (char* text = BN_bn2hex(number)) {
      hex = text;
      OPENSSL_free(text);
    }
    BN_free(number);
  }
  return absl::StrFormat(
      "%08lx:%s", X509_NAME_hash_ex(issuer, nullptr, nullptr, nullptr), hex);
}

// The file's modification time and size, or -1 when it cannot be read.
int64_t Stamp(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) return -1;
  return static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000000 +
         info.st_mtim.tv_nsec + static_cast<int64_t>(info.st_size);
}

// Every PEM object of `path` that `read` parses, in order.
template <typename T>
std::vector<T*> ReadAll(const std::string& path,
                        T* (*read)(BIO*, T**, pem_password_cb*, void*)) {
  std::vector<T*> all;
  BIO* bio = BIO_new_file(path.c_str(), "r");
  if (bio == nullptr) return all;
  while (T* one = read(bio, nullptr, nullptr, nullptr)) all.push_back(one);
  ERR_clear_error();  // the end of the file reads as an error
  BIO_free(bio);
  return all;
}

// Reads and verifies the CRLs of `crl_path` against the CAs of `ca_path`.
absl::StatusOr<RevokedSet> LoadRevoked(const std::string& crl_path,
                                       const std::string& ca_path) {
  std::vector<X509_CRL*> crls = ReadAll(crl_path, PEM_read_bio_X509_CRL);
  std::vector<X509*> cas = ReadAll(ca_path, PEM_read_bio_X509);
  absl::Status status;
  RevokedSet revoked;
  if (crls.empty()) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "--tls_crl ", crl_path, " holds no PEM certificate revocation list"));
  }
  for (X509_CRL* crl : crls) {
    bool signed_by_ca = false;
    for (X509* ca : cas) {
      signed_by_ca |= X509_NAME_cmp(X509_get_subject_name(ca),
                                    X509_CRL_get_issuer(crl)) == 0 &&
                      X509_CRL_verify(crl, X509_get0_pubkey(ca)) == 1;
    }
    ERR_clear_error();
    if (!signed_by_ca && status.ok()) {
      status = absl::InvalidArgumentError(
          absl::StrCat("--tls_crl ", crl_path,
                       ": a list there is not signed by a CA of ", ca_path));
    }
    STACK_OF(X509_REVOKED)* entries = X509_CRL_get_REVOKED(crl);
    for (int i = 0; i < sk_X509_REVOKED_num(entries); ++i) {
      revoked.insert(IdOf(
          X509_CRL_get_issuer(crl),
          X509_REVOKED_get0_serialNumber(sk_X509_REVOKED_value(entries, i))));
    }
  }
  for (X509_CRL* crl : crls) X509_CRL_free(crl);
  for (X509* ca : cas) X509_free(ca);
  if (!status.ok()) return status;
  return revoked;
}

class Revocations {
 public:
  absl::Status Enable(const std::string& crl_path, const std::string& ca_path,
                      absl::Duration refresh) {
    const int64_t stamp = Stamp(crl_path);
    absl::StatusOr<RevokedSet> revoked = LoadRevoked(crl_path, ca_path);
    if (!revoked.ok()) return revoked.status();
    absl::ReleasableMutexLock lock(&mu_);
    if (enabled_.load()) {
      return absl::FailedPreconditionError("revocation is already on");
    }
    crl_path_ = crl_path;
    ca_path_ = ca_path;
    stamp_ = stamp;
    revoked_ = *std::move(revoked);
    generation_.store(1);
    enabled_.store(true);
    LOG(INFO) << "revocation list " << crl_path << ": " << revoked_.size()
              << " certificates revoked";
    // Only this call gets here (enabled_ was false under the lock); the
    // poller takes the lock itself, so it starts after it is released.
    lock.Release();
    poller_ = std::make_unique<WakeupLoop>([this, refresh] {
      Reload();
      return absl::Now() + refresh;
    });
    poller_->Start();
    return absl::OkStatus();
  }

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  uint64_t generation() const { return generation_.load(); }

  bool Revoked(absl::string_view id) const {
    absl::ReaderMutexLock lock(&mu_);
    return revoked_.contains(id);
  }

  bool Reload() {
    std::string crl_path, ca_path;
    {
      absl::MutexLock lock(&mu_);
      if (!enabled_.load() || Stamp(crl_path_) == stamp_) return false;
      crl_path = crl_path_;
      ca_path = ca_path_;
    }
    const int64_t stamp = Stamp(crl_path);
    absl::StatusOr<RevokedSet> revoked = LoadRevoked(crl_path, ca_path);
    absl::MutexLock lock(&mu_);
    stamp_ = stamp;
    if (!revoked.ok()) {
      LOG(WARNING) << "keeping the revocation list in use: "
                   << revoked.status().message();
      return false;
    }
    revoked_ = *std::move(revoked);
    generation_.fetch_add(1);
    LOG(INFO) << "revocation list " << crl_path
              << " changed: " << revoked_.size() << " certificates revoked";
    return true;
  }

 private:
  mutable absl::Mutex mu_;
  std::atomic<bool> enabled_{false};
  std::atomic<uint64_t> generation_{0};
  std::string crl_path_ ABSL_GUARDED_BY(mu_);
  std::string ca_path_ ABSL_GUARDED_BY(mu_);
  int64_t stamp_ ABSL_GUARDED_BY(mu_) = -1;
  RevokedSet revoked_ ABSL_GUARDED_BY(mu_);
  // Made once, by the one Enable that succeeds; never destroyed.
  std::unique_ptr<WakeupLoop> poller_;
};

Revocations& State() {
  static Revocations* state = new Revocations;
  return *state;
}

}  // namespace

absl::Status EnableRevocation(const std::string& crl_path,
                              const std::string& ca_path,
                              absl::Duration refresh) {
  return State().Enable(crl_path, ca_path, refresh);
}

bool RevocationEnabled() { return State().enabled(); }

std::string CertificateId(X509* cert) {
  return IdOf(X509_get_issuer_name(cert), X509_get0_serialNumber(cert));
}

std::string CertificateIdOfPem(absl::string_view pem) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* seen = new absl::flat_hash_map<std::string, std::string>;
  {
    absl::MutexLock lock(&mu);
    auto it = seen->find(pem);
    if (it != seen->end()) return it->second;
  }
  std::string id;
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    id = CertificateId(cert);
    X509_free(cert);
  }
  ERR_clear_error();
  BIO_free(bio);
  absl::MutexLock lock(&mu);
  if (seen->size() >= 4096) seen->clear();  // bounded; refilled as needed
  seen->emplace(std::string(pem), id);
  return id;
}

absl::Status CheckNotRevoked(absl::string_view id) {
  if (!State().enabled() || !State().Revoked(id)) return absl::OkStatus();
  const size_t colon = id.find(':');
  return absl::UnauthenticatedError(absl::StrCat(
      "the certificate (serial ",
      colon == absl::string_view::npos ? id : id.substr(colon + 1),
      ") was revoked: it is on the CA's revocation list (--tls_crl)"));
}

uint64_t RevocationGeneration() { return State().generation(); }

bool ReloadRevocationsNow() { return State().Reload(); }

}  // namespace chorus
