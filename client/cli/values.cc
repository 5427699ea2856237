#include "client/cli/values.h"

#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/half.h"

namespace chorus {
namespace {

template <typename T>
void Append(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <typename T>
T Load(const std::string& bytes, size_t i) {
  T value;
  std::memcpy(&value, bytes.data() + i * sizeof(T), sizeof(T));
  return value;
}

template <typename T>
bool ParseInteger(const std::string& text, T* out) {
  if constexpr (std::is_signed_v<T>) {
    int64_t v;
    if (!absl::SimpleAtoi(text, &v)) return false;
    if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max())
      return false;
    *out = static_cast<T>(v);
  } else {
    uint64_t v;
    if (!absl::SimpleAtoi(text, &v)) return false;
    if (v > std::numeric_limits<T>::max()) return false;
    *out = static_cast<T>(v);
  }
  return true;
}

template <typename T>
bool EncodeInteger(const std::string& text, std::string* out) {
  T value;
  if (!ParseInteger(text, &value)) return false;
  Append(out, value);
  return true;
}

}  // namespace

absl::StatusOr<std::string> EncodeValues(DType dtype,
                                         const std::vector<std::string>& text) {
  std::string out;
  for (const std::string& t : text) {
    bool ok = false;
    double d = 0;
    switch (dtype) {
      case DType::kF16:
        ok = absl::SimpleAtod(t, &d);
        if (ok) Append(&out, ToFloat16(static_cast<float>(d)));
        break;
      case DType::kBF16:
        ok = absl::SimpleAtod(t, &d);
        if (ok) Append(&out, ToBFloat16(static_cast<float>(d)));
        break;
      case DType::kF32:
        ok = absl::SimpleAtod(t, &d);
        if (ok) Append(&out, static_cast<float>(d));
        break;
      case DType::kF64:
        ok = absl::SimpleAtod(t, &d);
        if (ok) Append(&out, d);
        break;
      case DType::kI8:
        ok = EncodeInteger<int8_t>(t, &out);
        break;
      case DType::kU8:
        ok = EncodeInteger<uint8_t>(t, &out);
        break;
      case DType::kI32:
        ok = EncodeInteger<int32_t>(t, &out);
        break;
      case DType::kI64:
        ok = EncodeInteger<int64_t>(t, &out);
        break;
      case DType::kU32:
        ok = EncodeInteger<uint32_t>(t, &out);
        break;
      case DType::kU64:
        ok = EncodeInteger<uint64_t>(t, &out);
        break;
      default:
        return absl::InvalidArgumentError("unknown dtype");
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", t, "\" is not a ", DTypeName(dtype), " value"));
    }
  }
  return out;
}

std::vector<std::string> DecodeValues(DType dtype, const std::string& bytes) {
  std::vector<std::string> out;
  const size_t size = DTypeSize(dtype);
  if (size == 0) return out;
  for (size_t i = 0; i < bytes.size() / size; ++i) {
    switch (dtype) {
      case DType::kF16:
        out.push_back(absl::StrCat(ToFloat(Load<Float16>(bytes, i))));
        break;
      case DType::kBF16:
        out.push_back(absl::StrCat(ToFloat(Load<BFloat16>(bytes, i))));
        break;
      case DType::kF32:
        out.push_back(absl::StrCat(Load<float>(bytes, i)));
        break;
      case DType::kF64:
        out.push_back(absl::StrCat(Load<double>(bytes, i)));
        break;
      case DType::kI8:
        out.push_back(absl::StrCat(Load<int8_t>(bytes, i)));
        break;
      case DType::kU8:
        out.push_back(absl::StrCat(Load<uint8_t>(bytes, i)));
        break;
      case DType::kI32:
        out.push_back(absl::StrCat(Load<int32_t>(bytes, i)));
        break;
      case DType::kI64:
        out.push_back(absl::StrCat(Load<int64_t>(bytes, i)));
        break;
      case DType::kU32:
        out.push_back(absl::StrCat(Load<uint32_t>(bytes, i)));
        break;
      case DType::kU64:
        out.push_back(absl::StrCat(Load<uint64_t>(bytes, i)));
        break;
      default:
        break;
    }
  }
  return out;
}

}  // namespace chorus
