#include "common/certificate_check.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace chorus {
namespace {

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct StoreDeleter {
  void operator()(X509_STORE* s) const { X509_STORE_free(s); }
};
struct StoreContextDeleter {
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
};
struct ChainDeleter {
  void operator()(STACK_OF(X509) * s) const { sk_X509_pop_free(s, X509_free); }
};
struct NamesDeleter {
  void operator()(GENERAL_NAMES* n) const { GENERAL_NAMES_free(n); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;

absl::StatusOr<std::unique_ptr<FILE, FileCloser>> Open(const std::string& path,
                                                       const char* what) {
  std::unique_ptr<FILE, FileCloser> file(std::fopen(path.c_str(), "r"));
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", what, " file '", path, "'"));
  }
  return file;
}

// Reads every certificate of a PEM file; INVALID_ARGUMENT when it has none.
absl::StatusOr<std::vector<X509Ptr>> ReadCertificates(const std::string& path,
                                                      const char* what) {
  absl::StatusOr<std::unique_ptr<FILE, FileCloser>> file = Open(path, what);
  if (!file.ok()) return file.status();
  std::vector<X509Ptr> certs;
  while (X509* cert = PEM_read_X509(file->get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(cert);
  }
  ERR_clear_error();
  if (certs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " file '", path, "' holds no PEM certificate"));
  }
  return certs;
}

}  // namespace

std::vector<std::string> CertificateUris(X509* cert) {
  std::vector<std::string> uris;
  std::unique_ptr<GENERAL_NAMES, NamesDeleter> names(
      static_cast<GENERAL_NAMES*>(
          X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr)));
  if (names == nullptr) return uris;
  for (int i = 0; i < sk_GENERAL_NAME_num(names.get()); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names.get(), i);
    if (name->type != GEN_URI) continue;
    const ASN1_IA5STRING* uri = name->d.uniformResourceIdentifier;
    uris.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(uri)),
                      ASN1_STRING_length(uri));
  }
  return uris;
}

absl::StatusOr<std::vector<std::string>> CheckCertificateFiles(
    const std::string& ca_path, const std::string& cert_path,
    const std::string& key_path) {
  absl::StatusOr<std::vector<X509Ptr>> cas = ReadCertificates(ca_path, "CA");
  if (!cas.ok()) return cas.status();
  absl::StatusOr<std::vector<X509Ptr>> chain =
      ReadCertificates(cert_path, "certificate");
  if (!chain.ok()) return chain.status();
  absl::StatusOr<std::unique_ptr<FILE, FileCloser>> key_file =
      Open(key_path, "key");
  if (!key_file.ok()) return key_file.status();
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(
      PEM_read_PrivateKey(key_file->get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key file '", key_path, "' holds no unencrypted PEM private key"));
  }
  X509* leaf = chain->front().get();
  if (X509_check_private_key(leaf, key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(
        "key file '", key_path, "' is not the key of '", cert_path, "'"));
  }

  std::unique_ptr<X509_STORE, StoreDeleter> store(X509_STORE_new());
  for (const X509Ptr& ca : *cas) X509_STORE_add_cert(store.get(), ca.get());
  std::unique_ptr<STACK_OF(X509), ChainDeleter> intermediates(
      sk_X509_new_null());
  for (size_t i = 1; i < chain->size(); ++i) {
    X509_up_ref((*chain)[i].get());
    sk_X509_push(intermediates.get(), (*chain)[i].get());
  }
  std::unique_ptr<X509_STORE_CTX, StoreContextDeleter> context(
      X509_STORE_CTX_new());
  X509_STORE_CTX_init(context.get(), store.get(), leaf, intermediates.get());
  if (X509_verify_cert(context.get()) != 1) {
    const int error = X509_STORE_CTX_get_error(context.get());
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("certificate '", cert_path, "' does not verify against '",
                     ca_path, "': ", X509_verify_cert_error_string(error)));
  }
  return CertificateUris(leaf);
}

}  // namespace chorus
