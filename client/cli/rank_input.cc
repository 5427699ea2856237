#include "client/cli/rank_input.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "client/cli/values.h"

namespace chorus {
namespace {

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

}  // namespace

absl::StatusOr<std::string> ReadElementsFile(const std::string& path,
                                             DType dtype, uint64_t max_bytes) {
  File file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot open --input ", path, ": ", std::strerror(errno)));
  }
  std::string bytes;
  char chunk[1 << 16];
  size_t got;
  while ((got = std::fread(chunk, 1, sizeof(chunk), file.get())) > 0) {
    if (bytes.size() + got > max_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--input ", path, " holds more than ", max_bytes, " bytes"));
    }
    bytes.append(chunk, got);
  }
  if (std::ferror(file.get())) {
    return absl::NotFoundError(
        absl::StrCat("cannot read --input ", path, ": ", std::strerror(errno)));
  }
  const uint64_t element = DTypeSize(dtype);
  if (element == 0 || bytes.size() % element != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--input ", path, " holds ", bytes.size(),
                     " bytes, not a whole number of ", DTypeName(dtype),
                     " elements of ", element, " bytes"));
  }
  return bytes;
}

absl::StatusOr<std::string> FillElements(DType dtype, const std::string& value,
                                         uint64_t count, uint64_t max_bytes) {
  absl::StatusOr<std::string> one = EncodeValues(dtype, {value});
  if (!one.ok()) return one.status();
  if (one->empty() || count > max_bytes / one->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fill: ", count, " ", DTypeName(dtype),
                     " elements are more than ", max_bytes, " bytes"));
  }
  std::string bytes;
  bytes.reserve(count * one->size());
  for (uint64_t i = 0; i < count; ++i) bytes.append(*one);
  return bytes;
}

absl::Status WriteElementsFile(const std::string& path,
                               absl::string_view bytes) {
  File file(std::fopen(path.c_str(), "wb"));
  if (file == nullptr ||
      std::fwrite(bytes.data(), 1, bytes.size(), file.get()) != bytes.size() ||
      std::fclose(file.release()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot write --output ", path,
                                               ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace chorus
