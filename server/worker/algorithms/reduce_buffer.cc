#include "server/worker/algorithms/reduce_buffer.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/collective_metrics.h"
#include "server/reduce/cpu/cpu_reduce.h"

namespace chorus {

absl::Status CheckRange(const Range& range, uint64_t size, uint64_t data_size) {
  if (range.offset > size || range.size > size - range.offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("range [", range.offset, ", +", range.size,
                     ") lies outside a buffer of ", size, " bytes"));
  }
  if (data_size != kAnySize && data_size != range.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("got ", data_size, " bytes for a range of ", range.size));
  }
  return absl::OkStatus();
}

absl::Status ConvertBytes(DType from, DType to, absl::string_view in,
                          std::string* out) {
  const uint64_t count = in.size() / DTypeSize(from);
  if (from == to) {
    out->assign(in.data(), in.size());
    return absl::OkStatus();
  }
  out->resize(count * DTypeSize(to));
  return cpu_reduce::Convert(from, to, out->data(), in.data(), count);
}

absl::StatusOr<absl::string_view> HostReduceBuffer::Read(const Range& range) {
  absl::Status valid = CheckRange(range, size());
  if (!valid.ok()) return valid;
  return absl::string_view(bytes_.data() + range.offset, range.size);
}

absl::Status HostReduceBuffer::CombineWith(const Range& range,
                                           absl::string_view base,
                                           absl::string_view data) {
  absl::Status valid = CheckRange(range, size(), data.size());
  if (valid.ok()) valid = CheckRange(range, size(), base.size());
  if (!valid.ok()) return valid;
  const absl::Time start = absl::Now();
  absl::Status reduced =
      cpu_reduce::Reduce(op_, dtype_, bytes_.data() + range.offset, base.data(),
                         data.data(), range.size / DTypeSize(dtype_));
  RecordReduce("cpu", range.size, absl::Now() - start);
  return reduced;
}

absl::Status HostReduceBuffer::Combine(const Range& range,
                                       absl::string_view data,
                                       bool data_first) {
  absl::Status valid = CheckRange(range, size(), data.size());
  if (!valid.ok()) return valid;
  char* dst = bytes_.data() + range.offset;
  const uint64_t count = range.size / DTypeSize(dtype_);
  const absl::Time start = absl::Now();
  absl::Status reduced =
      data_first ? cpu_reduce::Reduce(op_, dtype_, dst, data.data(), dst, count)
                 : cpu_reduce::ReduceInto(op_, dtype_, dst, data.data(), count);
  RecordReduce("cpu", range.size, absl::Now() - start);
  return reduced;
}

absl::Status HostReduceBuffer::Store(const Range& range,
                                     absl::string_view data) {
  absl::Status valid = CheckRange(range, size(), data.size());
  if (!valid.ok()) return valid;
  std::memcpy(bytes_.data() + range.offset, data.data(), data.size());
  return absl::OkStatus();
}

absl::Status HostReduceBuffer::FinalizeAvg(const Range& range, int world_size) {
  absl::Status valid = CheckRange(range, size());
  if (!valid.ok()) return valid;
  return cpu_reduce::FinalizeAvg(dtype_, bytes_.data() + range.offset,
                                 range.size / DTypeSize(dtype_), world_size);
}

}  // namespace chorus
