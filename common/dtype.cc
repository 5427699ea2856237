#include "common/dtype.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace chorus {
namespace {

constexpr DType kAllDTypes[] = {
    DType::kF16, DType::kBF16, DType::kF32, DType::kF64, DType::kI8,
    DType::kU8,  DType::kI32,  DType::kI64, DType::kU32, DType::kU64,
};

constexpr ReduceOp kAllReduceOps[] = {
    ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
    ReduceOp::kMax, ReduceOp::kAvg,
};

}  // namespace

bool IsValidDType(DType dtype) {
  const int value = static_cast<int>(dtype);
  return value >= static_cast<int>(DType::kF16) &&
         value <= static_cast<int>(DType::kU64);
}

bool IsValidReduceOp(ReduceOp op) {
  const int value = static_cast<int>(op);
  return value >= static_cast<int>(ReduceOp::kSum) &&
         value <= static_cast<int>(ReduceOp::kAvg);
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kF32:
    case DType::kI32:
    case DType::kU32:
      return 4;
    case DType::kF64:
    case DType::kI64:
    case DType::kU64:
      return 8;
    case DType::kI8:
    case DType::kU8:
      return 1;
    case DType::kUnspecified:
      break;
  }
  return 0;
}

DType AccumulatorDType(DType dtype, ReduceOp op) {
  if (!IsValidDType(dtype) || !IsValidReduceOp(op)) return DType::kUnspecified;
  if (op == ReduceOp::kMin || op == ReduceOp::kMax) return dtype;
  switch (dtype) {
    case DType::kF16:
    case DType::kBF16:
      return DType::kF32;
    case DType::kI8:
    case DType::kI32:
      return op == ReduceOp::kAvg ? DType::kI64 : dtype;
    case DType::kU8:
    case DType::kU32:
      return op == ReduceOp::kAvg ? DType::kU64 : dtype;
    default:
      return dtype;
  }
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUnspecified:
      return "unspecified";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kI8:
      return "i8";
    case DType::kU8:
      return "u8";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU32:
      return "u32";
    case DType::kU64:
      return "u64";
  }
  return "unknown";
}

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kUnspecified:
      return "unspecified";
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kProd:
      return "prod";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kAvg:
      return "avg";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (DType dtype : kAllDTypes) {
    if (DTypeName(dtype) == lower) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", name,
                   "\"; expected one of f16, bf16, f32, f64, i8, u8, i32, "
                   "i64, u32, u64"));
}

absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (ReduceOp op : kAllReduceOps) {
    if (ReduceOpName(op) == lower) return op;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown reduce op \"", name,
                   "\"; expected one of sum, prod, min, max, avg"));
}

absl::Status ValidateDType(DType dtype) {
  if (IsValidDType(dtype)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid dtype ", static_cast<int>(dtype), " (", DTypeName(dtype), ")"));
}

absl::Status ValidateReduceOp(ReduceOp op) {
  if (IsValidReduceOp(op)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid reduce op ", static_cast<int>(op), " (", ReduceOpName(op), ")"));
}

}  // namespace chorus
