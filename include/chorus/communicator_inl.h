// Template definitions for communicator.h; include that header instead.
#ifndef CHORUS_INCLUDE_CHORUS_COMMUNICATOR_INL_H_
#define CHORUS_INCLUDE_CHORUS_COMMUNICATOR_INL_H_

#include <cstring>
#include <type_traits>

namespace chorus {

template <typename T>
constexpr DType DTypeOf() {
  if constexpr (std::is_same_v<T, float>) return DType::kF32;
  if constexpr (std::is_same_v<T, double>) return DType::kF64;
  if constexpr (std::is_same_v<T, int8_t>) return DType::kI8;
  if constexpr (std::is_same_v<T, uint8_t>) return DType::kU8;
  if constexpr (std::is_same_v<T, int32_t>) return DType::kI32;
  if constexpr (std::is_same_v<T, int64_t>) return DType::kI64;
  if constexpr (std::is_same_v<T, uint32_t>) return DType::kU32;
  if constexpr (std::is_same_v<T, uint64_t>) return DType::kU64;
  return DType::kUnspecified;
}

template <typename T>
absl::Status Communicator::AllReduce(const std::vector<T>& input,
                                     std::vector<T>* output, ReduceOp op,
                                     const CallOptions& options) {
  static_assert(DTypeOf<T>() != DType::kUnspecified, "unsupported type");
  CollectiveSpec spec;
  spec.kind = CollectiveKind::kAllReduce;
  spec.dtype = DTypeOf<T>();
  spec.count = input.size();
  spec.op = op;
  std::string out;
  absl::StatusOr<CallResult> result =
      Run(spec,
          absl::string_view(reinterpret_cast<const char*>(input.data()),
                            input.size() * sizeof(T)),
          &out, options);
  if (!result.ok()) return result.status();
  output->resize(out.size() / sizeof(T));
  std::memcpy(output->data(), out.data(), out.size());
  return absl::OkStatus();
}

}  // namespace chorus

#endif  // CHORUS_INCLUDE_CHORUS_COMMUNICATOR_INL_H_
