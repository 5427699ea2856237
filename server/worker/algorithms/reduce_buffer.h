// ReduceBuffer: the buffer a reducing algorithm works in, wherever it lives.
// The ring and recursive doubling read byte ranges of it to send, combine
// received chunks into it and store received chunks in it. HostReduceBuffer
// does that in host memory with the CPU engine; the CUDA one
// (server/worker/gpu/device_buffers.h) in GPU memory with the CUDA kernels,
// so a Cuda(n) rank's data leaves the GPU only to cross to a peer.
//
// Ranges are byte ranges of whole elements. Data handed in is host memory
// holding exactly range.size bytes.
//
// Lifecycle: one per collective call. Thread safety: thread-compatible; one
// algorithm uses a buffer at a time.
#ifndef CHORUS_SERVER_WORKER_ALGORITHMS_REDUCE_BUFFER_H_
#define CHORUS_SERVER_WORKER_ALGORITHMS_REDUCE_BUFFER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/collective.h"
#include "server/worker/algorithms/chunked.h"

namespace chorus {

class ReduceBuffer {
 public:
  virtual ~ReduceBuffer() = default;

  // Bytes held.
  virtual uint64_t size() const = 0;

  // Returns bytes [range] readable on the host; the view stays valid until
  // the next call on this buffer. Errors are the device's (see the
  // implementation).
  virtual absl::StatusOr<absl::string_view> Read(const Range& range) = 0;

  // buffer[range] = op(buffer[range], data), or op(data, buffer[range]) when
  // `data_first` (the order matters for results that must be bit-identical
  // on every rank). Returns INVALID_ARGUMENT for a range outside the buffer
  // or data of another size, or the device's errors.
  virtual absl::Status Combine(const Range& range, absl::string_view data,
                               bool data_first) = 0;

  // buffer[range] = data. Codes as Combine().
  virtual absl::Status Store(const Range& range, absl::string_view data) = 0;

  // Divides every element of [range] by `world_size` (avg's last step).
  // Codes as Combine().
  virtual absl::Status FinalizeAvg(const Range& range, int world_size) = 0;
};

// A ReduceBuffer over host bytes, reduced on the CPU. The bytes are not
// owned and must outlive the buffer; the buffer works in place. A string
// given is taken at its size then and must not be resized while in use.
class HostReduceBuffer : public ReduceBuffer {
 public:
  HostReduceBuffer(const CollectiveSpec& spec, absl::Span<char> bytes)
      : op_(spec.op), dtype_(spec.dtype), bytes_(bytes) {}
  HostReduceBuffer(const CollectiveSpec& spec, std::string* bytes)
      : HostReduceBuffer(spec, absl::MakeSpan(*bytes)) {}

  uint64_t size() const override { return bytes_.size(); }
  absl::StatusOr<absl::string_view> Read(const Range& range) override;
  absl::Status Combine(const Range& range, absl::string_view data,
                       bool data_first) override;
  absl::Status Store(const Range& range, absl::string_view data) override;
  absl::Status FinalizeAvg(const Range& range, int world_size) override;

  // Sets [range] to `base` combined with `data` (base first), both
  // range.size bytes: a combine that needs no copy of `base` here first.
  // `base` may be these bytes themselves. Returns INVALID_ARGUMENT as
  // Combine().
  absl::Status CombineWith(const Range& range, absl::string_view base,
                           absl::string_view data);

 private:
  const ReduceOp op_;
  const DType dtype_;
  const absl::Span<char> bytes_;  // not owned
};

// Sets *out to the elements of `in` (whole elements of `from`) converted to
// `to` (cpu_reduce::Convert: a dtype and its accumulator type, or equal
// types). Returns INVALID_ARGUMENT for another pair of types.
absl::Status ConvertBytes(DType from, DType to, absl::string_view in,
                          std::string* out);

// An Exchange() source reading `buffer` (not owned; must outlive the source).
inline ChunkSource SourceOf(ReduceBuffer& buffer) {
  return [&buffer](const Range& range) { return buffer.Read(range); };
}

// Returns INVALID_ARGUMENT unless [range] lies within `size` bytes and
// `data_size` (when not kAnySize) equals range.size.
inline constexpr uint64_t kAnySize = ~uint64_t{0};
absl::Status CheckRange(const Range& range, uint64_t size,
                        uint64_t data_size = kAnySize);

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_ALGORITHMS_REDUCE_BUFFER_H_
