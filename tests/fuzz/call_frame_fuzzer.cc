// call_frame_fuzzer: what a worker sends on the coordinator's call port
// after the hello. The input's first byte sets the size of the pieces the
// rest arrives in (1 to 64 bytes, as reads might return it); the pieces go
// through CallFrameParser and every frame is parsed as a
// CallPortRequest and taken into a real Coordinator core (group "g" of two
// ranks already formed, epoch 1) through TakeCallPortRequest, as CallPort
// does.
// A frame that does not parse, or one over the limit, ends the connection.
//
// Checked, besides crashes and ASan/UBSan reports:
// - the frames handed out are, re-encoded, exactly the bytes consumed;
// - after a frame over the limit the parser keeps refusing;
// - every request taken gets exactly one reply, carrying its call id, by the
//   time every deadline has passed; a call's OK reply carries a response, a
//   failure report's the group's abort, a commit's neither.
#include <glog/logging.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "chorus/v1/coordinator.pb.h"
#include "common/call_frame.h"
#include "google/protobuf/stubs/logging.h"
#include "server/coordinator/collective_proto.h"
#include "server/coordinator/coordinator.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/testing/fake_clock.h"

namespace chorus {
namespace {

// Small, so that inputs reach it.
constexpr uint64_t kMaxFrame = 4096;
constexpr int kMaxRequests = 64;

// The coordinator core with group "g" of two ranks formed at epoch 1.
class Core {
 public:
  Core() : core_(&clock_, Options()) {
    Device cpu;
    cpu.kind = DeviceKind::kCpu;
    for (int w = 0; w < 2; ++w) {
      WorkerRegistration r;
      r.name = absl::StrCat("w", w);
      r.host = "h";
      r.address = absl::StrCat("h:", 7000 + w);
      r.incarnation = 1;
      r.devices = {cpu};
      FUZZ_CHECK(core_.Register(r).ok(), "setup");
    }
    int joined = 0;
    for (int rank = 0; rank < 2; ++rank) {
      JoinRequest join;
      join.group = "g";
      join.world_size = 2;
      join.rank = rank;
      join.worker_id = rank + 1;
      join.device = cpu;
      core_.Join(std::move(join), [&joined](absl::StatusOr<GroupView> view) {
        FUZZ_CHECK(view.ok() && view->epoch == 1, view.status().ToString());
        ++joined;
      });
    }
    FUZZ_CHECK(joined == 2, "setup");
  }

  Coordinator& core() { return core_; }

  // Lets every deadline pass.
  void ExpireAll() {
    clock_.Advance(absl::Hours(1));
    core_.RunTimers();
  }

 private:
  static CoordinatorOptions Options() {
    CoordinatorOptions options;
    // Longer than ExpireAll() moves the clock: nobody is evicted.
    options.lease_timeout = absl::Hours(2);
    options.groups.max_world_size = 16;
    options.groups.first_epoch = 0;
    return options;
  }

  FakeClock clock_;
  Coordinator core_;
};

struct Taken {
  uint64_t call_id = 0;
  v1::CallPortRequest::KindCase kind = v1::CallPortRequest::KIND_NOT_SET;
  int replies = 0;
};

void Run(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const size_t piece = 1 + data[0] % 64;
  const absl::string_view stream(reinterpret_cast<const char*>(data) + 1,
                                 size - 1);
  // Before the core: callbacks point into it until the core is gone.
  std::vector<Taken> taken;
  taken.reserve(kMaxRequests);
  Core core;
  CallFrameParser frames(kMaxFrame);
  std::string consumed;  // the frames handed out, re-encoded
  bool open = true;
  bool over_limit = false;
  std::string payload;
  for (size_t at = 0; open && at < stream.size(); at += piece) {
    frames.Append(stream.substr(at, piece));
    while (open) {
      absl::StatusOr<bool> next = frames.Next(&payload);
      if (!next.ok()) {
        FUZZ_CHECK(absl::IsResourceExhausted(next.status()),
                   next.status().ToString());
        FUZZ_CHECK(!frames.Next(&payload).ok(),
                   "the parser went on after a frame over the limit");
        over_limit = true;
        open = false;
        break;
      }
      if (!*next) break;
      FUZZ_CHECK(payload.size() <= kMaxFrame, "a frame over the limit");
      AppendCallFrame(payload, &consumed);
      v1::CallPortRequest request;
      if (!request.ParseFromString(payload) ||
          static_cast<int>(taken.size()) == kMaxRequests) {
        open = false;
        break;
      }
      taken.push_back(Taken{request.call_id(), request.kind_case(), 0});
      Taken* mine = &taken.back();
      TakeCallPortRequest(
          core.core(), "", request, [mine](v1::CallPortReply reply) {
            ++mine->replies;
            FUZZ_CHECK(reply.call_id() == mine->call_id,
                       absl::StrCat("reply for call ", reply.call_id(),
                                    " to call ", mine->call_id));
            if (reply.code() == 0) {
              FUZZ_CHECK(reply.has_response() ==
                                 (mine->kind == v1::CallPortRequest::kCall) &&
                             reply.has_abort() ==
                                 (mine->kind == v1::CallPortRequest::kFailure),
                         "an OK reply of the wrong shape");
            }
          });
    }
  }
  FUZZ_CHECK(absl::string_view(stream).substr(0, consumed.size()) == consumed,
             "the frames handed out are not the bytes that came in");
  (void)over_limit;
  core.ExpireAll();
  for (const Taken& t : taken) {
    FUZZ_CHECK(t.replies == 1, absl::StrCat("call ", t.call_id, " got ",
                                            t.replies, " replies"));
  }
}

}  // namespace
}  // namespace chorus

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  google::protobuf::SetLogHandler(nullptr);
  // The core logs evictions and aborts; at fuzzing speed that is noise.
  FLAGS_minloglevel = google::GLOG_ERROR;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::Run(data, size);
  return 0;
}
