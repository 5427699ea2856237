// request_fuzzer: coordinator requests, decoded from the wire format and
// converted as the coordinator's gRPC service does (collective_proto.h),
// driven through an in-process Coordinator core on a FakeClock. Input:
// records as fuzz_format.h describes.
//
// Each input starts from the same small state: workers "w0" (id 1, Cpu) and
// "w1" (id 2, Cpu and Cuda(0), CUDA support), and group "g" of world size 2
// formed at epoch 1 with rank 0 on w0 and rank 1 on w1.
//
// Checked, besides crashes and ASan/UBSan reports:
// - every callback runs at most once, and every callback has run once the
//   table is aborted at the end (none is dropped);
// - a request refused at once (its callback the only one that ran, with an
//   error) changes nothing visible: groups, pending calls, deadlines, abort
//   notices and workers;
// - a successful collective under the inline plan returns OutputBytes()
//   bytes, and any other plan returns none;
// - views returned by joins, and the group list, are well formed;
// - after ExpireDeadlines() no deadline is left in the past.
// ParseDeviceList also runs on the whole input: an accepted list is
// non-empty, valid, free of duplicates and parses the same when written out
// again.
#include <glog/logging.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "common/collective.h"
#include "common/device.h"
#include "common/device_proto.h"
#include "google/protobuf/stubs/logging.h"
#include "server/coordinator/collective_proto.h"
#include "server/coordinator/coordinator.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_format.h"
#include "tests/testing/fake_clock.h"

namespace chorus {
namespace {

constexpr absl::Duration kLease = absl::Seconds(10);
constexpr int kMaxRecords = 64;
// Mirrored calls are made for groups up to this size with inputs up to this
// many bytes per rank.
constexpr int kMaxMirrorWorld = 8;
constexpr uint64_t kMaxMirrorBytes = 64 << 10;

// ---- ParseDeviceList --------------------------------------------------------

// Writes `device` as a spec ParseDeviceSpec reads back: "cpu", "cuda:0",
// "npu:2".
std::string SpecOf(const Device& device) {
  if (device.kind == DeviceKind::kOther) {
    return absl::StrCat(device.other_kind, ":", device.index);
  }
  std::string name = CanonicalName(device);
  name = name.substr(0, name.find('('));
  return absl::StrCat(absl::AsciiStrToLower(name), ":", device.index);
}

void FuzzDeviceList(absl::string_view input) {
  absl::StatusOr<std::vector<Device>> devices = ParseDeviceList(input);
  if (!devices.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(devices.status()),
               devices.status().ToString());
    return;
  }
  FUZZ_CHECK(!devices->empty(), std::string(input));
  std::vector<std::string> specs;
  for (const Device& device : *devices) {
    absl::Status valid = ValidateDevice(device);
    FUZZ_CHECK(valid.ok(), valid.ToString());
    specs.push_back(SpecOf(device));
  }
  absl::Status unique = CheckNoDuplicates(*devices);
  FUZZ_CHECK(unique.ok(), unique.ToString());
  const std::string again_text = absl::StrJoin(specs, ",");
  absl::StatusOr<std::vector<Device>> again = ParseDeviceList(again_text);
  FUZZ_CHECK(again.ok(),
             absl::StrCat(again_text, ": ", again.status().ToString()));
  FUZZ_CHECK(again->size() == devices->size(), again_text);
  for (size_t i = 0; i < devices->size(); ++i) {
    FUZZ_CHECK(SameDevice((*devices)[i], (*again)[i]), again_text);
  }
}

// ---- Callbacks --------------------------------------------------------------

// Counts the runs of every callback handed to the table.
class CallLog {
 public:
  // Returns the id of a new callback.
  int Add(std::string what) {
    runs_.push_back(0);
    what_.push_back(std::move(what));
    status_.emplace_back();
    return static_cast<int>(runs_.size()) - 1;
  }

  void Ran(int id, const absl::Status& status) {
    FUZZ_CHECK(++runs_[id] == 1,
               absl::StrCat("callback ran twice: ", what_[id]));
    status_[id] = status;
    ++total_;
  }

  bool ran(int id) const { return runs_[id] > 0; }
  // The status callback `id` ran with.
  const absl::Status& status(int id) const { return status_[id]; }
  // Callback runs so far, all callbacks together.
  int total() const { return total_; }

  void CheckAllRan() const {
    for (size_t id = 0; id < runs_.size(); ++id) {
      FUZZ_CHECK(runs_[id] == 1,
                 absl::StrCat("callback never ran: ", what_[id]));
    }
  }

 private:
  std::vector<int> runs_;
  std::vector<std::string> what_;
  std::vector<absl::Status> status_;
  int total_ = 0;
};

// ---- The coordinator core ---------------------------------------------------

CoordinatorOptions CoreOptions() {
  CoordinatorOptions options;
  options.lease_timeout = kLease;
  // Small, so that joins with arbitrary world sizes stay cheap.
  options.groups.max_world_size = 16;
  return options;
}

class Harness {
 public:
  Harness() : core_(&clock_, CoreOptions()) { Setup(); }

  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  // Ends everything still pending; every callback must have run then.
  ~Harness() {
    core_.Shutdown(absl::UnavailableError("fuzz input done"));
    log_.CheckAllRan();
  }

  void Run(uint8_t tag, absl::string_view payload) {
    const int amount = fuzz::RequestAmount(tag);
    const bool mirror = (tag & fuzz::kMirror) != 0;
    // How long a call may wait, as the adapter's CoreDeadline() gives it;
    // each call's a little earlier than the last so that NextDeadline()
    // moves when a call is left pending.
    const absl::Duration wait =
        absl::Seconds(1 + amount) - absl::Microseconds(++calls_);
    switch (static_cast<fuzz::RequestOp>(tag & fuzz::kOpMask)) {
      case fuzz::kRegister: {
        v1::RegisterWorkerRequest request;
        if (request.ParseFromArray(payload.data(), payload.size())) {
          Register(request);
        }
        break;
      }
      case fuzz::kJoin: {
        v1::JoinGroupRequest request;
        if (request.ParseFromArray(payload.data(), payload.size())) {
          Join(request, wait);
        }
        break;
      }
      case fuzz::kCollective: {
        v1::CollectiveRequest request;
        if (request.ParseFromArray(payload.data(), payload.size())) {
          Collective(request, wait, mirror);
        }
        break;
      }
      case fuzz::kCommit: {
        v1::CommitRequest request;
        if (request.ParseFromArray(payload.data(), payload.size())) {
          Commit(request, wait, mirror);
        }
        break;
      }
      case fuzz::kReportFailure: {
        v1::ReportFailureRequest request;
        if (request.ParseFromArray(payload.data(), payload.size())) {
          ReportFailure(request);
        }
        break;
      }
      case fuzz::kAdvance:
        Advance(absl::Milliseconds(500) * (1 + amount) * (1 + amount));
        break;
      case fuzz::kHeartbeat: {
        v1::HeartbeatRequest request;
        if (request.ParseFromArray(payload.data(), payload.size())) {
          Heartbeat(request);
        }
        break;
      }
      case fuzz::kDeregister: {
        v1::DeregisterRequest request;
        if (request.ParseFromArray(payload.data(), payload.size())) {
          Deregister(request);
        }
        break;
      }
    }
    CheckGroups();
  }

 private:
  using CallKey = std::tuple<std::string, uint64_t, int, uint64_t>;

  void Setup() {
    Device cpu;
    cpu.kind = DeviceKind::kCpu;
    Device cuda;
    cuda.kind = DeviceKind::kCuda;
    WorkerRegistration w0;
    w0.name = "w0";
    w0.host = "h0";
    w0.address = "h0:7000";
    w0.incarnation = 1;
    w0.devices = {cpu};
    WorkerRegistration w1;
    w1.name = "w1";
    w1.host = "h1";
    w1.address = "h1:7000";
    w1.incarnation = 1;
    w1.devices = {cpu, cuda};
    w1.cuda_support = true;
    FUZZ_CHECK(core_.Register(w0).ok(), "setup");
    FUZZ_CHECK(core_.Register(w1).ok(), "setup");
    int joined = 0;
    for (int rank = 0; rank < 2; ++rank) {
      JoinRequest join;
      join.group = "g";
      join.world_size = 2;
      join.rank = rank;
      join.worker_id = rank + 1;
      join.device = cpu;
      join.request_id = absl::StrCat("setup-", rank);
      core_.Join(std::move(join), [&joined](absl::StatusOr<GroupView> view) {
        FUZZ_CHECK(view.ok() && view->epoch == 1, view.status().ToString());
        ++joined;
      });
    }
    FUZZ_CHECK(joined == 2, "setup");
  }

  // Everything a refused request must leave as it was.
  // `with_deadline` false leaves out the table's next deadline.
  std::string Fingerprint(bool with_deadline = true) const {
    std::string out;
    for (const GroupSummary& s : core_.Groups()) {
      absl::StrAppend(&out, "group ", s.view.name, " e", s.view.epoch, " w",
                      s.view.world_size, " [");
      for (const GroupMember& m : s.view.members) {
        absl::StrAppend(&out, m.rank, ":", m.worker_id, ":", m.worker_name, ":",
                        m.host, ":", m.address, ":", CanonicalName(m.device),
                        ":", m.device.model, ";");
      }
      // A world-1 group decides a call the moment it arrives, so a refusal
      // and a failed verdict look alike there; its count is left out.
      if (s.view.world_size > 1) absl::StrAppend(&out, "] c", s.completed);
      absl::StrAppend(&out, " p", s.pending_sequence, " m",
                      absl::StrJoin(s.missing_ranks, ","), " t",
                      absl::FormatTime(s.pending_since), " a",
                      s.aborted.ToString(), "\n");
    }
    absl::StrAppend(
        &out, "next ",
        with_deadline ? absl::FormatTime(core_.NextDeadline()) : "-",
        " notices ", core_.LatestAbortNotice(), "\n");
    for (const WorkerRecord& r : core_.Workers()) {
      absl::StrAppend(&out, "worker ", r.id, " ", r.registration.name, " ",
                      r.registration.host, " ", r.registration.address, " ",
                      r.registration.incarnation, " ",
                      r.registration.cuda_support, " ",
                      absl::FormatTime(r.renewed_at), " [");
      for (const Device& d : r.registration.devices) {
        absl::StrAppend(&out, CanonicalName(d), ",");
      }
      absl::StrAppend(&out, "]\n");
    }
    return out;
  }

  // The group's world size, or 0 when there is no such group at `epoch`.
  int WorldOf(const std::string& group, uint64_t epoch) const {
    for (const GroupSummary& s : core_.Groups()) {
      if (s.view.name == group && s.view.epoch == epoch) {
        return s.view.world_size;
      }
    }
    return 0;
  }

  void CheckGroups() const {
    for (const GroupSummary& s : core_.Groups()) {
      FUZZ_CHECK(s.view.world_size >= 1 &&
                     s.view.world_size <= CoreOptions().groups.max_world_size,
                 s.view.name);
      FUZZ_CHECK(static_cast<int>(s.view.members.size()) == s.view.world_size,
                 s.view.name);
      for (int rank = 0; rank < s.view.world_size; ++rank) {
        FUZZ_CHECK(s.view.members[rank].rank == rank, s.view.name);
      }
      int last = -1;
      for (int rank : s.missing_ranks) {
        FUZZ_CHECK(rank > last && rank < s.view.world_size, s.view.name);
        last = rank;
      }
      FUZZ_CHECK(s.missing_ranks.empty() || s.pending_sequence > 0,
                 s.view.name);
      FUZZ_CHECK(s.aborted.ok() || absl::IsAborted(s.aborted),
                 s.aborted.ToString());
    }
  }

  // After a request whose callback `id` ran with an error: when it was the
  // only callback that ran, the request was refused at once and must have
  // changed nothing since `before` was taken.
  // A join refused for its device (UNIMPLEMENTED), or because another
  // rank's was (FAILED_PRECONDITION), may record or clear that refusal,
  // which moves only the next deadline: `before_without_deadline` (when
  // given) is compared for those.
  void CheckRefusal(int id, int runs_before, const std::string& before,
                    absl::string_view what,
                    const std::string* before_without_deadline = nullptr) {
    if (!log_.ran(id)) return;
    const absl::Status& status = log_.status(id);
    if (status.ok()) return;
    if (log_.total() != runs_before + 1) return;
    if (before_without_deadline != nullptr &&
        (absl::IsUnimplemented(status) || absl::IsFailedPrecondition(status))) {
      const std::string after = Fingerprint(/*with_deadline=*/false);
      FUZZ_CHECK(after == *before_without_deadline,
                 absl::StrCat(what, " was refused with ", status.ToString(),
                              " but changed the state from\n",
                              *before_without_deadline, "to\n", after));
      return;
    }
    const std::string after = Fingerprint();
    FUZZ_CHECK(
        after == before,
        absl::StrCat(what, " was refused with ", status.ToString(),
                     " but changed the state from\n", before, "to\n", after));
  }

  void Register(const v1::RegisterWorkerRequest& request) {
    const std::string before = Fingerprint();
    absl::StatusOr<RegisterResult> result =
        core_.Register(RegistrationFromProto(request));
    if (!result.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(result.status()) ||
                     IsDeviceRefusal(result.status()),
                 result.status().ToString());
      FUZZ_CHECK(Fingerprint() == before, "refused registration changed state");
    }
  }

  void Heartbeat(const v1::HeartbeatRequest& request) {
    const std::string before = Fingerprint();
    HeartbeatReply reply;
    absl::Status status =
        core_.Heartbeat(request.worker_id(), request.incarnation(),
                        request.aborts_seen(), &reply);
    if (!status.ok()) {
      FUZZ_CHECK(absl::IsNotFound(status) || absl::IsFailedPrecondition(status),
                 status.ToString());
      FUZZ_CHECK(Fingerprint() == before, "refused heartbeat changed state");
      return;
    }
    uint64_t last = request.aborts_seen();
    for (const AbortNotice& notice : reply.aborts) {
      FUZZ_CHECK(notice.id > last && absl::IsAborted(notice.status),
                 notice.status.ToString());
      last = notice.id;
    }
    FUZZ_CHECK(last <= std::max(reply.aborts_latest, request.aborts_seen()),
               "notice ids");
  }

  void Deregister(const v1::DeregisterRequest& request) {
    const std::string before = Fingerprint();
    absl::Status status =
        core_.Deregister(request.worker_id(), request.incarnation());
    if (!status.ok()) {
      FUZZ_CHECK(absl::IsNotFound(status) || absl::IsFailedPrecondition(status),
                 status.ToString());
      FUZZ_CHECK(Fingerprint() == before, "refused deregister changed state");
    }
  }

  void Join(const v1::JoinGroupRequest& request, absl::Duration wait) {
    JoinRequest join = JoinFromProto(request, clock_.Now() + wait);
    const std::string group = join.group;
    // A join with a request id the group already knows is answered with the
    // group its first attempt formed, whatever world size it asks for now
    // (see the report that came with this fuzzer). A newcomer or a rank
    // following an elastic group gets the group's next world size, whatever
    // it asked for.
    const bool elastic_move = join.newcomer || join.follow_epoch > 0;
    const int world =
        join.request_id.empty() && !elastic_move ? join.world_size : 0;
    const std::string before = Fingerprint();
    const std::string before_without_deadline = Fingerprint(false);
    const int runs_before = log_.total();
    const int id = log_.Add(absl::StrCat("join ", group, " rank ", join.rank));
    core_.Join(std::move(join), [this, id, group,
                                 world](absl::StatusOr<GroupView> view) {
      log_.Ran(id, view.status());
      if (!view.ok()) return;
      FUZZ_CHECK(view->name == group && view->epoch > 0 &&
                     (world == 0 || view->world_size == world) &&
                     static_cast<int>(view->members.size()) == view->world_size,
                 absl::StrCat("bad view of ", group));
      for (int rank = 0; rank < view->world_size; ++rank) {
        FUZZ_CHECK(view->members[rank].rank == rank, group);
      }
    });
    CheckRefusal(id, runs_before, before, "join", &before_without_deadline);
  }

  void Collective(const v1::CollectiveRequest& request, absl::Duration wait,
                  bool mirror) {
    CollectiveCall call = CollectiveCallFromProto(request, clock_.Now() + wait);
    const int world = WorldOf(call.group, call.epoch);
    std::vector<CollectiveCall> others;
    if (mirror && world > 1 && world <= kMaxMirrorWorld) {
      for (int rank = 0; rank < world; ++rank) {
        if (rank == call.rank) continue;
        CollectiveCall other = call;
        other.rank = rank;
        other.device.reset();
        other.data.clear();
        if (call.has_data) {
          const uint64_t bytes = InputBytes(call.spec, world, rank);
          if (bytes > kMaxMirrorBytes) break;
          for (uint64_t i = 0; i < bytes; ++i) {
            other.data.push_back(static_cast<char>(i * 31 + rank * 7 + 1));
          }
        }
        others.push_back(std::move(other));
      }
      if (static_cast<int>(others.size()) != world - 1) others.clear();
    }
    SendCall(std::move(call), world);
    for (CollectiveCall& other : others) SendCall(std::move(other), world);
  }

  void SendCall(CollectiveCall call, int world) {
    const CallKey key{call.group, call.epoch, call.rank, call.sequence};
    // A retried call is answered for the spec of the call it retries.
    const bool first = first_spec_.emplace(key, call.spec).second;
    const std::string what = absl::StrCat(
        "collective ", call.group, " e", call.epoch, " rank ", call.rank, " #",
        call.sequence, " ", DescribeSpec(call.spec));
    const uint64_t sequence = call.sequence;
    const int rank = call.rank;
    const Algorithm forced = call.algorithm;
    const std::string before = Fingerprint();
    const int runs_before = log_.total();
    const int id = log_.Add(what);
    core_.Collective(
        std::move(call), [this, id, key, sequence, rank, world, forced,
                          what](absl::StatusOr<CollectiveOutcome> outcome) {
          log_.Ran(id, outcome.status());
          if (!outcome.ok()) return;
          FUZZ_CHECK(world > 0, absl::StrCat(what, " succeeded, no group"));
          FUZZ_CHECK(outcome->sequence == sequence, what);
          const CollectiveSpec& spec = first_spec_.at(key);
          if (outcome->plan.algorithm == Algorithm::kInline) {
            FUZZ_CHECK(outcome->data.size() == OutputBytes(spec, world, rank),
                       absl::StrCat(what, ": inline result of ",
                                    outcome->data.size(), " bytes; expected ",
                                    OutputBytes(spec, world, rank)));
          } else {
            FUZZ_CHECK(outcome->data.empty(), what);
            FUZZ_CHECK(!KindCarriesNoData(spec.kind), what);
            FUZZ_CHECK(
                outcome->plan.algorithm == Algorithm::kRing ||
                    outcome->plan.algorithm == Algorithm::kRecursiveDoubling,
                what);
          }
          // Kinds without data (barrier, sync) are decided by the match
          // itself, whatever was forced.
          FUZZ_CHECK(KindCarriesNoData(spec.kind) ||
                         forced == Algorithm::kUnspecified ||
                         outcome->plan.algorithm == forced,
                     what);
        });
    if (first && log_.ran(id) && !log_.status(id).ok() &&
        log_.total() == runs_before + 1) {
      first_spec_.erase(key);
    }
    CheckRefusal(id, runs_before, before, what);
  }

  void Commit(const v1::CommitRequest& request, absl::Duration wait,
              bool mirror) {
    CommitCall call = CommitCallFromProto(request, clock_.Now() + wait);
    const int world = WorldOf(call.group, call.epoch);
    std::vector<CommitCall> calls = {call};
    if (mirror && world <= kMaxMirrorWorld) {
      for (int rank = 0; rank < world; ++rank) {
        if (rank == call.rank) continue;
        CommitCall other = call;
        other.rank = rank;
        calls.push_back(other);
      }
    }
    for (CommitCall& c : calls) {
      const std::string what = absl::StrCat("commit ", c.group, " e", c.epoch,
                                            " rank ", c.rank, " #", c.sequence);
      const std::string before = Fingerprint();
      const int runs_before = log_.total();
      const int id = log_.Add(what);
      core_.Commit(std::move(c),
                   [this, id](absl::Status status) { log_.Ran(id, status); });
      CheckRefusal(id, runs_before, before, what);
    }
  }

  void ReportFailure(const v1::ReportFailureRequest& request) {
    const std::string before = Fingerprint();
    v1::ReportFailureResponse response;
    absl::Status verdict = ReportFailureToCore(core_, "", request, &response);
    if (verdict.ok()) {
      FUZZ_CHECK(response.has_abort() &&
                     response.abort().code() ==
                         static_cast<int>(absl::StatusCode::kAborted),
                 "a failure report answered OK without the abort");
      return;
    }
    FUZZ_CHECK(absl::IsNotFound(verdict) || absl::IsFailedPrecondition(verdict),
               verdict.ToString());
    FUZZ_CHECK(Fingerprint() == before, "refused failure report changed state");
  }

  void Advance(absl::Duration by) {
    clock_.Advance(by);
    core_.RunTimers();
    FUZZ_CHECK(core_.NextDeadline() > clock_.Now(),
               "a deadline is left in the past after ExpireDeadlines()");
    for (const std::string& stall : core_.NewStalls(absl::Seconds(2))) {
      FUZZ_CHECK(!stall.empty(), "empty stall report");
    }
  }

  FakeClock clock_;
  Coordinator core_;
  // Read by the callbacks, which run at the latest in ~Harness().
  CallLog log_;
  std::map<CallKey, CollectiveSpec> first_spec_;
  int64_t calls_ = 0;
};

}  // namespace
}  // namespace chorus

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Inputs with strings that are not UTF-8 fail to parse, as they would on
  // the wire; the log line protobuf writes for each only slows fuzzing.
  google::protobuf::SetLogHandler(nullptr);
  // The core logs evictions and aborts; at fuzzing speed that is noise.
  FLAGS_minloglevel = google::GLOG_ERROR;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  chorus::FuzzDeviceList(input);
  chorus::Harness harness;
  chorus::fuzz::RecordReader reader(input);
  uint8_t tag = 0;
  absl::string_view payload;
  for (int records = 0;
       records < chorus::kMaxRecords && reader.Next(&tag, &payload);
       ++records) {
    harness.Run(tag, payload);
  }
  return 0;
}
