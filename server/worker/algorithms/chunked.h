// Helpers shared by the algorithms: sending and receiving a byte range as a
// series of chunks, and splitting element ranges into blocks.
//
// Stateless; thread-compatible.
#ifndef CHORUS_SERVER_WORKER_ALGORITHMS_CHUNKED_H_
#define CHORUS_SERVER_WORKER_ALGORITHMS_CHUNKED_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/collective.h"
#include "server/worker/dataplane/transport.h"

namespace chorus {

// A byte range [offset, offset + size) of a buffer.
struct Range {
  uint64_t offset = 0;
  uint64_t size = 0;
};

// Splits `count` elements of `element_size` bytes into `parts` nearly equal
// ranges (the first count % parts get one element more); returns part `i`.
Range SplitRange(uint64_t count, uint64_t element_size, int parts, int i);

// Number of chunks of at most `chunk_bytes` needed for `size` bytes.
uint64_t ChunkCount(uint64_t size, uint64_t chunk_bytes);

// Chunk `c` of `range`.
Range ChunkOf(const Range& range, uint64_t chunk_bytes, uint64_t c);

// Largest whole-element chunk at most `chunk_bytes` (at least one element).
uint64_t ElementChunkBytes(uint64_t chunk_bytes, uint64_t element_size);

// Where Exchange reads a chunk it sends: returns the bytes of `range`, valid
// until the next call.
using ChunkSource =
    std::function<absl::StatusOr<absl::string_view>(const Range& range)>;

// Sends `send` (read through `source`) to `to` and receives `recv` from
// `from`, chunk by chunk and interleaved, calling `on_chunk(range, bytes)`
// for each received chunk. Either side may be skipped with to/from = -1.
// Chunk c is sent before chunk c is received, so with send == recv a chunk
// may be combined into the source as soon as it arrives. At most one chunk
// is in flight ahead of what was received, so a pair of ranks never buffers
// more than a chunk for each other.
absl::Status Exchange(
    Transport& transport, int to, const ChunkSource& source, const Range& send,
    int from, const Range& recv, uint64_t chunk_bytes,
    const std::function<absl::Status(const Range&, const std::string&)>&
        on_chunk);

// Exchange() sending from host bytes `send_buffer` (null when to is -1).
absl::Status Exchange(
    Transport& transport, int to, const char* send_buffer, const Range& send,
    int from, const Range& recv, uint64_t chunk_bytes,
    const std::function<absl::Status(const Range&, const std::string&)>&
        on_chunk);

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_ALGORITHMS_CHUNKED_H_
