#include "server/worker/algorithms/leader_call.h"

#include <glog/logging.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/little_endian.h"
#include "server/reduce/cpu/inline_executor.h"

namespace chorus {
namespace {

// The first byte of each message.
enum class MessageType : uint8_t {
  kCall = 1,      // member -> leader: spec, time left, input
  kWithdraw = 2,  // member -> leader: its answer time passed
  kResult = 3,    // leader -> member: its output
  kRedirect = 4,  // leader -> member: ask the coordinator
};

// A call: type, kind, dtype, op (1 byte each), root (4), count (8), the
// microseconds of patience the member has left (8), then the input.
constexpr size_t kCallHeaderBytes = 24;

void PutLittleEndian(uint64_t value, int bytes, std::string* out) {
  const size_t at = out->size();
  out->resize(at + bytes);
  StoreLittleEndian(value, bytes, out->data() + at);
}

uint64_t GetLittleEndian(absl::string_view in, size_t offset, int bytes) {
  return LoadLittleEndian(in.data() + offset, bytes);
}

std::string EncodeCall(const CollectiveSpec& spec, absl::Duration left,
                       absl::string_view input) {
  std::string out;
  out.reserve(kCallHeaderBytes + input.size());
  out.push_back(static_cast<char>(MessageType::kCall));
  out.push_back(static_cast<char>(spec.kind));
  out.push_back(static_cast<char>(spec.dtype));
  out.push_back(static_cast<char>(spec.op));
  PutLittleEndian(static_cast<uint32_t>(spec.root), 4, &out);
  PutLittleEndian(spec.count, 8, &out);
  PutLittleEndian(static_cast<uint64_t>(
                      std::max<int64_t>(0, absl::ToInt64Microseconds(left))),
                  8, &out);
  out.append(input.data(), input.size());
  return out;
}

absl::Status Malformed(int from, absl::string_view what) {
  return absl::InternalError(absl::StrCat(
      "rank ", from, " sent a malformed leader-plan message: ", what));
}

// What the leader took from one member.
struct MemberCall {
  bool arrived = false;
  CollectiveSpec spec;
  std::string input;
};

absl::StatusOr<MemberCall> DecodeCall(int from, absl::string_view message) {
  if (message.size() < kCallHeaderBytes ||
      static_cast<MessageType>(message[0]) != MessageType::kCall) {
    return Malformed(from, "expected a call");
  }
  MemberCall call;
  call.arrived = true;
  call.spec.kind =
      static_cast<CollectiveKind>(static_cast<uint8_t>(message[1]));
  call.spec.dtype = static_cast<DType>(static_cast<uint8_t>(message[2]));
  call.spec.op = static_cast<ReduceOp>(static_cast<uint8_t>(message[3]));
  call.spec.root = static_cast<int32_t>(GetLittleEndian(message, 4, 4));
  call.spec.count = GetLittleEndian(message, 8, 8);
  call.input = std::string(message.substr(kCallHeaderBytes));
  return call;
}

// The time a member's call says it has left.
absl::Duration TimeLeft(absl::string_view message) {
  return absl::Microseconds(
      std::min<uint64_t>(GetLittleEndian(message, 16, 8), 1ull << 50));
}

// Sends `message` to every member: first those that called, then the
// others, whose calls then end with it at once when they come (a member
// gone meanwhile learns its group's verdict from the coordinator).
void TellMembers(const LeaderCallArgs& args,
                 const std::vector<MemberCall>& calls,
                 const std::string& message) {
  for (bool arrived : {true, false}) {
    for (int rank = 0; rank < static_cast<int>(calls.size()); ++rank) {
      if (rank == kLeaderRank || calls[rank].arrived != arrived) continue;
      absl::Status sent = args.transport->Send(rank, message);
      if (!sent.ok()) LOG(WARNING) << "leader answer not sent: " << sent;
    }
  }
}

// Every rank goes to the coordinator with its call.
absl::StatusOr<LeaderEnd> Redirect(const LeaderCallArgs& args,
                                   const std::vector<MemberCall>& calls) {
  TellMembers(args, calls,
              std::string(1, static_cast<char>(MessageType::kRedirect)));
  return LeaderEnd::kAskCoordinator;
}

// Whether a member withdrew (its patience ran out before the leader
// decided). Returns the transport's error when the call is over.
absl::StatusOr<bool> AnyWithdrew(const LeaderCallArgs& args) {
  Transport& transport = *args.transport;
  for (int rank = 0; rank < transport.world_size(); ++rank) {
    if (rank == kLeaderRank) continue;
    absl::StatusOr<std::string> next =
        transport.RecvBy(rank, absl::InfinitePast());
    if (!next.ok()) {
      if (next.status().code() == absl::StatusCode::kDeadlineExceeded) continue;
      return next.status();
    }
    if (next->size() != 1 ||
        static_cast<MessageType>((*next)[0]) != MessageType::kWithdraw) {
      return Malformed(rank, "expected nothing or a withdrawal");
    }
    return true;
  }
  return false;
}

// Takes every member's call until the patience of the leader or of a member
// that called ran out; sets *all when every call came. Returns the
// transport's errors (other than the deadline).
absl::Status TakeCalls(const LeaderCallArgs& args,
                       std::vector<MemberCall>* calls, bool* all) {
  Transport& transport = *args.transport;
  absl::Time wait_until = args.patience_by;
  *all = true;
  for (int rank = 0; rank < transport.world_size(); ++rank) {
    if (rank == kLeaderRank) continue;
    absl::StatusOr<std::string> message = transport.RecvBy(rank, wait_until);
    if (!message.ok()) {
      if (message.status().code() != absl::StatusCode::kDeadlineExceeded) {
        return message.status();
      }
      *all = false;
      continue;
    }
    absl::StatusOr<MemberCall> call = DecodeCall(rank, *message);
    if (!call.ok()) return call.status();
    wait_until = std::min(wait_until, absl::Now() + TimeLeft(*message));
    (*calls)[rank] = *std::move(call);
  }
  return absl::OkStatus();
}

// Every rank's inputs, sized for RunInline; INTERNAL for one of a wrong size.
absl::StatusOr<std::vector<const std::string*>> InputsOf(
    const CollectiveSpec& spec, std::vector<MemberCall>& calls) {
  const int world = static_cast<int>(calls.size());
  std::vector<const std::string*> inputs(world);
  for (int rank = 0; rank < world; ++rank) {
    absl::Status size =
        CheckInputSize(spec, world, rank, calls[rank].input.size());
    if (!size.ok()) return Malformed(rank, size.message());
    // Off-root inputs of broadcast and scatter are ignored; any size will do.
    calls[rank].input.resize(InputBytes(spec, world, rank));
    inputs[rank] = &calls[rank].input;
  }
  return inputs;
}

absl::StatusOr<LeaderEnd> RunAsLeader(const LeaderCallArgs& args) {
  const int world = args.transport->world_size();
  std::vector<MemberCall> calls(world);
  calls[kLeaderRank] = MemberCall{true, args.spec, std::string(args.input)};
  bool all = false;
  // The transport's errors are this rank's account, for the group's verdict
  // (the members hear it from the coordinator).
  absl::Status taken = TakeCalls(args, &calls, &all);
  if (!taken.ok()) return taken;
  if (!all) return Redirect(args, calls);
  // Checked before any answer: a member that withdrew may be on its way to
  // the coordinator, where every rank must then meet it.
  absl::StatusOr<bool> withdrew = AnyWithdrew(args);
  if (!withdrew.ok()) return withdrew.status();
  if (*withdrew) return Redirect(args, calls);
  // Calls that differ are the coordinator's to judge (its account of what
  // each rank asked, its flight recorder): every rank takes it there.
  for (int rank = 0; rank < world; ++rank) {
    if (!SpecsAgree(calls[rank].spec, args.spec)) return Redirect(args, calls);
  }
  absl::StatusOr<std::vector<const std::string*>> inputs =
      InputsOf(args.spec, calls);
  if (!inputs.ok()) return inputs.status();
  absl::StatusOr<std::vector<std::string>> outputs =
      RunInline(args.spec, world, *inputs);
  if (!outputs.ok()) return outputs.status();
  for (int rank = 0; rank < world; ++rank) {
    if (rank == kLeaderRank) continue;
    std::string result(1, static_cast<char>(MessageType::kResult));
    result.append((*outputs)[rank]);
    absl::Status sent = args.transport->Send(rank, result);
    // A member that cannot be reached is gone: its group's verdict is the
    // coordinator's; the others have their results.
    if (!sent.ok()) LOG(WARNING) << "leader result not sent: " << sent;
  }
  *args.output = std::move((*outputs)[kLeaderRank]);
  return LeaderEnd::kDone;
}

// The member's wait for the leader's answer: until its patience, then, once
// it withdrew, its grace. Returns nullopt when none came.
absl::StatusOr<std::optional<std::string>> AwaitAnswer(
    const LeaderCallArgs& args) {
  Transport& transport = *args.transport;
  absl::StatusOr<std::string> answer =
      transport.RecvBy(kLeaderRank, args.patience_by);
  if (!answer.ok() &&
      answer.status().code() == absl::StatusCode::kDeadlineExceeded) {
    absl::Status sent = transport.Send(
        kLeaderRank, std::string(1, static_cast<char>(MessageType::kWithdraw)));
    if (!sent.ok()) return sent;
    answer = transport.RecvBy(kLeaderRank, args.grace_until);
    if (!answer.ok() &&
        answer.status().code() == absl::StatusCode::kDeadlineExceeded) {
      return std::nullopt;
    }
  }
  if (!answer.ok()) return answer.status();
  return *std::move(answer);
}

absl::StatusOr<LeaderEnd> RunAsMember(const LeaderCallArgs& args) {
  Transport& transport = *args.transport;
  absl::Status sent = transport.Send(
      kLeaderRank,
      EncodeCall(args.spec, args.patience_by - absl::Now(), args.input));
  if (!sent.ok()) return sent;
  absl::StatusOr<std::optional<std::string>> answer = AwaitAnswer(args);
  if (!answer.ok()) return answer.status();
  if (!answer->has_value()) return LeaderEnd::kAskCoordinator;
  const std::string& message = **answer;
  if (message.empty()) return Malformed(kLeaderRank, "empty answer");
  switch (static_cast<MessageType>(message[0])) {
    case MessageType::kResult:
      if (message.size() - 1 !=
          OutputBytes(args.spec, transport.world_size(), transport.rank())) {
        return Malformed(kLeaderRank, "result of the wrong size");
      }
      args.output->assign(message.data() + 1, message.size() - 1);
      return LeaderEnd::kDone;
    case MessageType::kRedirect:
      return LeaderEnd::kAskCoordinator;
    default:
      return Malformed(kLeaderRank, "expected a result or a redirect");
  }
}

}  // namespace

absl::StatusOr<LeaderEnd> RunLeaderCall(const LeaderCallArgs& args) {
  return args.transport->rank() == kLeaderRank ? RunAsLeader(args)
                                               : RunAsMember(args);
}

}  // namespace chorus
