// chunk_fuzzer: the receiving end of the data plane. Input: records as
// fuzz_format.h describes, each a serialized chorus.v1.Chunk and what to do
// with it. Chunks are delivered to an Inbox as the TCP data plane's reader
// does: the MessageKey from the chunk's fields, one inbox stream per peer
// stream, no reading from a stream while the inbox holds it back, and a
// chunk that does not parse ending its stream (the peer then opens a new
// one). Takes use a deadline already passed, so nothing blocks.
//
// A model of the inbox (plain maps) predicts every answer. Checked, besides
// crashes and ASan/UBSan reports:
// - Take returns exactly the bytes delivered last under the key, the status
//   the key's group epoch was first aborted with, ABORTED when a newer epoch
//   of the group was seen (the older one is then forgotten, its messages
//   dropped and later data for it ignored), or DEADLINE_EXCEEDED;
// - Deliver holds a stream back exactly when the stream's untaken bytes are
//   over the limit, and the stream's resume callback runs once, as soon as
//   they are not;
// - once everything was taken every stream's count is back at 0 (a message
//   of exactly the limit is accepted without holding the stream back).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "chorus/v1/worker.pb.h"
#include "google/protobuf/stubs/logging.h"
#include "server/worker/dataplane/inbox.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_format.h"

namespace chorus {
namespace {

// Small, so that inputs reach it.
constexpr uint64_t kStreamLimit = 256;
constexpr int kMaxRecords = 256;

using Key = std::tuple<std::string, uint64_t, uint64_t, int, int, uint32_t>;
using GroupEpoch = std::pair<std::string, uint64_t>;

Key KeyOf(const MessageKey& key) {
  return Key{key.group,     key.epoch,   key.sequence,
             key.from_rank, key.to_rank, key.tag};
}

MessageKey MessageKeyOf(const Key& key) {
  MessageKey out;
  std::tie(out.group, out.epoch, out.sequence, out.from_rank, out.to_rank,
           out.tag) = key;
  return out;
}

// The key of a chunk, as the TCP data plane reads it from a frame header.
MessageKey KeyFromChunk(const v1::Chunk& chunk) {
  MessageKey key;
  key.group = chunk.group();
  key.epoch = chunk.epoch();
  key.sequence = chunk.sequence();
  key.from_rank = chunk.from_rank();
  key.to_rank = chunk.to_rank();
  key.tag = chunk.tag();
  return key;
}

class Harness {
 public:
  Harness() : inbox_(kStreamLimit) {
    for (int slot = 0; slot < fuzz::kChunkStreams; ++slot) {
      slots_.push_back(OpenStream());
    }
  }

  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  void Run(uint8_t tag, absl::string_view payload) {
    const int selector = fuzz::ChunkSelector(tag);
    const int slot = selector % fuzz::kChunkStreams;
    v1::Chunk chunk;
    const bool parsed = chunk.ParseFromArray(payload.data(), payload.size());
    switch (static_cast<fuzz::ChunkOp>(tag & fuzz::kOpMask)) {
      case fuzz::kDeliver:
      case fuzz::kDeliverToo:
      case fuzz::kDeliverAlso:
        if (!parsed) {
          // The stream's read fails: the reactor finishes, the peer
          // reconnects.
          ReopenStream(slot);
        } else {
          Deliver(slot, chunk);
        }
        break;
      case fuzz::kTake:
        if (parsed) Take(KeyOf(KeyFromChunk(chunk)), selector);
        break;
      case fuzz::kAbort:
        if (parsed) {
          Abort(GroupEpoch(chunk.group(), chunk.epoch()),
                absl::AbortedError(absl::StrCat("abort #", ++aborts_)));
        }
        break;
      case fuzz::kAbortAllSeen:
        AbortAllSeen(absl::UnavailableError(
            absl::StrCat("coordinator lost #", ++aborts_)));
        break;
      case fuzz::kCloseStream:
        ReopenStream(slot);
        break;
      case fuzz::kTakeStored:
        if (!messages_.empty()) {
          auto it = messages_.begin();
          std::advance(it, selector % messages_.size());
          Take(it->first, selector);
        }
        break;
    }
  }

  // Takes everything left and checks that every stream is back at 0.
  void Finish() {
    while (!messages_.empty()) Take(messages_.begin()->first, 0);
    CheckAllResumes();
    for (int slot = 0; slot < fuzz::kChunkStreams; ++slot) {
      const Inbox::StreamId id = slots_[slot];
      Stream& stream = streams_.at(id);
      FUZZ_CHECK(stream.bytes == 0 && stream.resume == nullptr,
                 "model: stream not drained");
      // Nothing is stored any more; any key of a group epoch that was not
      // aborted will do.
      MessageKey probe;
      probe.group = "probe";
      if (auto latest = latest_.find(probe.group); latest != latest_.end()) {
        probe.epoch = latest->second;
      }
      while (aborted_.count(GroupEpoch(probe.group, probe.epoch)) > 0) {
        ++probe.epoch;
      }
      NoteEpoch(GroupEpoch(probe.group, probe.epoch));
      FUZZ_CHECK(
          inbox_.Deliver(id, probe, std::string(kStreamLimit, 'p'), [] {}),
          absl::StrCat("stream ", id,
                       " still counts untaken bytes after every "
                       "message was taken"));
      absl::StatusOr<std::string> back =
          inbox_.Take(probe, absl::InfinitePast());
      FUZZ_CHECK(back.ok() && back->size() == kStreamLimit,
                 back.status().ToString());
    }
  }

 private:
  struct Stream {
    uint64_t bytes = 0;
    // Set while the inbox holds the stream back: counts the runs of the
    // callback Deliver() was given.
    std::shared_ptr<int> resume;
  };
  struct Stored {
    std::string data;
    Inbox::StreamId stream = 0;
  };

  Inbox::StreamId OpenStream() {
    const Inbox::StreamId id = inbox_.NewStream();
    FUZZ_CHECK(streams_.emplace(id, Stream()).second,
               absl::StrCat("stream id ", id, " handed out twice"));
    return id;
  }

  void ReopenStream(int slot) {
    const Inbox::StreamId id = slots_[slot];
    inbox_.CloseStream(id);
    // A closed stream's resume is dropped with it; it must not run later.
    Stream& stream = streams_.at(id);
    if (stream.resume != nullptr) closed_resumes_.push_back(stream.resume);
    streams_.erase(id);
    slots_[slot] = OpenStream();
  }

  // Takes `bytes` of `stream`'s data out of the count and checks that the
  // stream's resume ran iff it is no longer over the limit.
  void Release(Inbox::StreamId id, uint64_t bytes) {
    auto it = streams_.find(id);
    if (it == streams_.end()) return;
    Stream& stream = it->second;
    FUZZ_CHECK(stream.bytes >= bytes, "model: count underflow");
    stream.bytes -= bytes;
    CheckResume(id);
  }

  void CheckResume(Inbox::StreamId id) {
    Stream& stream = streams_.at(id);
    if (stream.resume == nullptr) return;
    const int runs = *stream.resume;
    FUZZ_CHECK(runs <= 1, absl::StrCat("stream ", id, " resumed twice"));
    if (stream.bytes <= kStreamLimit) {
      FUZZ_CHECK(runs == 1, absl::StrCat("stream ", id, " is at ", stream.bytes,
                                         " bytes of ", kStreamLimit,
                                         " but was not resumed"));
      stream.resume = nullptr;
    } else {
      FUZZ_CHECK(runs == 0,
                 absl::StrCat("stream ", id, " resumed at ", stream.bytes,
                              " bytes of ", kStreamLimit));
    }
  }

  // Delivers `chunk` on `slot`'s stream and checks the answer and every
  // stream's resume (a newer epoch may have released other streams).
  void Deliver(int slot, v1::Chunk& chunk) {
    DeliverAndCheck(slot, chunk);
    CheckAllResumes();
  }

  void DeliverAndCheck(int slot, v1::Chunk& chunk) {
    const Inbox::StreamId id = slots_[slot];
    Stream& stream = streams_.at(id);
    // The data plane does not read while the inbox holds its stream back.
    if (stream.resume != nullptr) return;
    const MessageKey key = KeyFromChunk(chunk);
    std::string data = std::move(*chunk.mutable_data());
    const uint64_t size = data.size();
    auto resume = std::make_shared<int>(0);
    const bool more = inbox_.Deliver(id, key, data, [resume] { ++*resume; });
    FUZZ_CHECK(*resume == 0, "resume ran inside Deliver()");
    const GroupEpoch group_epoch(key.group, key.epoch);
    const bool over = !NoteEpoch(group_epoch);
    if (over || aborted_.count(group_epoch) > 0) {
      FUZZ_CHECK(more, "a message for an aborted group held a stream back");
      return;
    }
    seen_.insert(group_epoch);
    const Key k = KeyOf(key);
    auto old = messages_.find(k);
    if (old != messages_.end()) {
      // Delivered again (a misbehaving or restarted peer): the new message
      // replaces the old one, whose bytes are no longer held.
      const Inbox::StreamId old_stream = old->second.stream;
      const uint64_t old_size = old->second.data.size();
      messages_.erase(old);
      // The stream the first message came on, held back, may be resumed
      // now.
      Release(old_stream, old_size);
    }
    messages_[k] = Stored{std::move(data), id};
    stream.bytes += size;
    const bool want = stream.bytes <= kStreamLimit;
    FUZZ_CHECK(more == want,
               absl::StrCat("Deliver() of ", size, " bytes on stream ", id,
                            " returned ", more, " with ", stream.bytes,
                            " bytes held (limit ", kStreamLimit, ")"));
    if (!more) stream.resume = resume;
  }

  // Takes `k` and checks the answer and every stream's resume (a newer
  // epoch seen by the take may have released other streams).
  void Take(const Key& k, int selector) {
    TakeAndCheck(k, selector);
    CheckAllResumes();
  }

  void TakeAndCheck(const Key& k, int selector) {
    const MessageKey key = MessageKeyOf(k);
    const absl::Time deadline = (selector & 1) != 0
                                    ? absl::InfinitePast()
                                    : absl::Now() - absl::Milliseconds(1);
    absl::StatusOr<std::string> got = inbox_.Take(key, deadline);
    const GroupEpoch group_epoch(key.group, key.epoch);
    if (!NoteEpoch(group_epoch)) {
      FUZZ_CHECK(absl::IsAborted(got.status()),
                 absl::StrCat("Take(", key.ToString(),
                              ") of an epoch older "
                              "than one seen gave ",
                              got.ok() ? "data" : got.status().ToString()));
      return;
    }
    seen_.insert(group_epoch);
    if (auto aborted = aborted_.find(group_epoch); aborted != aborted_.end()) {
      FUZZ_CHECK(got.status() == aborted->second,
                 absl::StrCat("Take(", key.ToString(), ") after abort gave ",
                              got.status().ToString(), "; expected ",
                              aborted->second.ToString()));
      return;
    }
    auto it = messages_.find(k);
    if (it == messages_.end()) {
      FUZZ_CHECK(absl::IsDeadlineExceeded(got.status()),
                 absl::StrCat("Take(", key.ToString(), ") of nothing gave ",
                              got.ok() ? "data" : got.status().ToString()));
      return;
    }
    FUZZ_CHECK(got.ok(), absl::StrCat("Take(", key.ToString(),
                                      ") of a delivered message gave ",
                                      got.status().ToString()));
    FUZZ_CHECK(
        *got == it->second.data,
        absl::StrCat("Take(", key.ToString(), ") gave ", got->size(),
                     " bytes, not the ", it->second.data.size(), " delivered"));
    const Inbox::StreamId stream = it->second.stream;
    const uint64_t size = it->second.data.size();
    messages_.erase(it);
    Release(stream, size);
  }

  void Abort(const GroupEpoch& group_epoch, const absl::Status& status) {
    inbox_.Abort(group_epoch.first, group_epoch.second, status);
    if (NoteEpoch(group_epoch)) AbortModel(group_epoch, status);
    CheckAllResumes();
  }

  // The model of the inbox's epochs: returns false when `group_epoch` is
  // older than an epoch of its group seen before; forgets the group's
  // older epoch (and drops its messages) when it is newer.
  bool NoteEpoch(const GroupEpoch& group_epoch) {
    auto [latest, inserted] =
        latest_.try_emplace(group_epoch.first, group_epoch.second);
    if (inserted || latest->second == group_epoch.second) return true;
    if (group_epoch.second < latest->second) return false;
    const GroupEpoch old(group_epoch.first, latest->second);
    seen_.erase(old);
    aborted_.erase(old);
    DropModel(old);
    latest->second = group_epoch.second;
    return true;
  }

  void AbortAllSeen(const absl::Status& status) {
    inbox_.AbortAllSeen(status);
    for (const GroupEpoch& group_epoch : seen_) AbortModel(group_epoch, status);
    CheckAllResumes();
  }

  void AbortModel(const GroupEpoch& group_epoch, const absl::Status& status) {
    aborted_.emplace(group_epoch, status);
    DropModel(group_epoch);
  }

  // Drops the model's messages of `group_epoch` and their bytes.
  void DropModel(const GroupEpoch& group_epoch) {
    for (auto it = messages_.begin(); it != messages_.end();) {
      if (std::get<0>(it->first) != group_epoch.first ||
          std::get<1>(it->first) != group_epoch.second) {
        ++it;
        continue;
      }
      auto s = streams_.find(it->second.stream);
      if (s != streams_.end()) {
        FUZZ_CHECK(s->second.bytes >= it->second.data.size(),
                   "model: count underflow");
        s->second.bytes -= it->second.data.size();
      }
      it = messages_.erase(it);
    }
  }

  void CheckAllResumes() {
    for (auto& [id, stream] : streams_) CheckResume(id);
    for (const std::shared_ptr<int>& resume : closed_resumes_) {
      FUZZ_CHECK(*resume == 0, "a closed stream was resumed");
    }
  }

  Inbox inbox_;
  std::vector<Inbox::StreamId> slots_;
  std::map<Inbox::StreamId, Stream> streams_;
  std::vector<std::shared_ptr<int>> closed_resumes_;
  std::map<Key, Stored> messages_;
  std::set<GroupEpoch> seen_;
  std::map<GroupEpoch, absl::Status> aborted_;
  // group -> the newest epoch seen.
  std::map<std::string, uint64_t> latest_;
  int aborts_ = 0;
};

}  // namespace
}  // namespace chorus

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Inputs with strings that are not UTF-8 fail to parse, as they would on
  // the wire; the log line protobuf writes for each only slows fuzzing.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::Harness harness;
  chorus::fuzz::RecordReader reader(
      absl::string_view(reinterpret_cast<const char*>(data), size));
  uint8_t tag = 0;
  absl::string_view payload;
  for (int records = 0;
       records < chorus::kMaxRecords && reader.Next(&tag, &payload);
       ++records) {
    harness.Run(tag, payload);
  }
  harness.Finish();
  return 0;
}
