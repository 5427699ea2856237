#include "server/worker/algorithms/chunked.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace chorus {

Range SplitRange(uint64_t count, uint64_t element_size, int parts, int i) {
  const uint64_t base = count / parts;
  const uint64_t extra = count % parts;
  const uint64_t u = static_cast<uint64_t>(i);
  const uint64_t start = u * base + std::min<uint64_t>(u, extra);
  const uint64_t size = base + (u < extra ? 1 : 0);
  return Range{start * element_size, size * element_size};
}

uint64_t ChunkCount(uint64_t size, uint64_t chunk_bytes) {
  return (size + chunk_bytes - 1) / chunk_bytes;
}

Range ChunkOf(const Range& range, uint64_t chunk_bytes, uint64_t c) {
  const uint64_t begin = c * chunk_bytes;
  return Range{range.offset + begin, std::min(chunk_bytes, range.size - begin)};
}

uint64_t ElementChunkBytes(uint64_t chunk_bytes, uint64_t element_size) {
  return std::max<uint64_t>(element_size,
                            chunk_bytes / element_size * element_size);
}

absl::Status Exchange(
    Transport& transport, int to, const ChunkSource& source, const Range& send,
    int from, const Range& recv, uint64_t chunk_bytes,
    const std::function<absl::Status(const Range&, const std::string&)>&
        on_chunk) {
  const uint64_t send_chunks = to < 0 ? 0 : ChunkCount(send.size, chunk_bytes);
  const uint64_t recv_chunks =
      from < 0 ? 0 : ChunkCount(recv.size, chunk_bytes);
  for (uint64_t c = 0; c < std::max(send_chunks, recv_chunks); ++c) {
    if (c < send_chunks) {
      absl::StatusOr<absl::string_view> bytes =
          source(ChunkOf(send, chunk_bytes, c));
      if (!bytes.ok()) return bytes.status();
      absl::Status sent = transport.Send(to, *bytes);
      if (!sent.ok()) return sent;
    }
    if (c < recv_chunks) {
      const Range piece = ChunkOf(recv, chunk_bytes, c);
      absl::StatusOr<std::string> data = transport.Recv(from);
      if (!data.ok()) return data.status();
      if (data->size() != piece.size) {
        return absl::InternalError(
            absl::StrCat("rank ", from, " sent a chunk of ", data->size(),
                         " bytes; expected ", piece.size));
      }
      absl::Status used = on_chunk(piece, *data);
      if (!used.ok()) return used;
      transport.Recycle(*std::move(data));
    }
  }
  return absl::OkStatus();
}

absl::Status Exchange(
    Transport& transport, int to, const char* send_buffer, const Range& send,
    int from, const Range& recv, uint64_t chunk_bytes,
    const std::function<absl::Status(const Range&, const std::string&)>&
        on_chunk) {
  auto source =
      [send_buffer](const Range& piece) -> absl::StatusOr<absl::string_view> {
    return absl::string_view(send_buffer + piece.offset, piece.size);
  };
  return Exchange(transport, to, source, send, from, recv, chunk_bytes,
                  on_chunk);
}

}  // namespace chorus
