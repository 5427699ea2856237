// Writes the seed corpora of the Chorus fuzzers:
//   chorus_fuzz_make_seeds DIR
// writes DIR/request_fuzzer/*, DIR/chunk_fuzzer/*, DIR/frame_fuzzer/* and
// DIR/call_frame_fuzzer/*
// (the checked-in copy is
// tests/fuzz/corpus). Each seed is a meaningful sequence of records in the
// format of fuzz_format.h, written against the start state request_fuzzer
// sets up: workers w0 (id 1, Cpu) and w1 (id 2, Cpu and Cuda(0)), group "g"
// of world size 2 at epoch 1.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "chorus/v1/coordinator.pb.h"
#include "chorus/v1/worker.pb.h"
#include "common/call_frame.h"
#include "common/collective_spec_proto.h"
#include "common/dtype.h"
#include "server/worker/dataplane/wire_frame.h"
#include "tests/fuzz/fuzz_format.h"

namespace chorus {
namespace fuzz {
namespace {

using Seeds = std::vector<std::pair<std::string, std::string>>;

// ---- request_fuzzer ---------------------------------------------------------

v1::Device MakeDevice(v1::DeviceKind kind, int index = 0,
                      const std::string& other = "") {
  v1::Device device;
  device.set_kind(kind);
  device.set_index(index);
  device.set_other_kind(other);
  return device;
}

v1::Device Cpu() { return MakeDevice(v1::DEVICE_KIND_CPU); }

// A request-stream builder.
class Requests {
 public:
  Requests& Register(const std::string& name, uint64_t incarnation,
                     std::vector<v1::Device> devices, bool cuda = false) {
    v1::RegisterWorkerRequest r;
    r.set_name(name);
    r.set_host("host-" + name);
    r.set_address(name + ":7100");
    r.set_incarnation(incarnation);
    r.set_cuda_support(cuda);
    for (v1::Device& d : devices) *r.add_devices() = d;
    return Add(kRegister, r);
  }

  Requests& Join(const std::string& group, int world, int rank, uint64_t worker,
                 const v1::Device& device, const std::string& request_id = "",
                 int wait = 0) {
    v1::JoinGroupRequest r;
    r.set_group(group);
    r.set_world_size(world);
    r.set_rank(rank);
    r.set_worker_id(worker);
    *r.mutable_device() = device;
    r.set_request_id(request_id);
    return Add(kJoin, r, wait);
  }

  Requests& Collective(const v1::CollectiveRequest& r, bool mirror,
                       int wait = 0) {
    return Add(kCollective, r, wait, mirror);
  }

  Requests& Commit(const std::string& group, uint64_t epoch, int rank,
                   uint64_t sequence, bool mirror, int wait = 0) {
    v1::CommitRequest r;
    r.set_group(group);
    r.set_epoch(epoch);
    r.set_rank(rank);
    r.set_sequence(sequence);
    return Add(kCommit, r, wait, mirror);
  }

  Requests& ReportFailure(const std::string& group, uint64_t epoch, int rank,
                          uint64_t sequence) {
    v1::ReportFailureRequest r;
    r.set_group(group);
    r.set_epoch(epoch);
    r.set_rank(rank);
    r.set_sequence(sequence);
    r.set_code(14);  // UNAVAILABLE
    r.set_message("peer stream broke");
    return Add(kReportFailure, r);
  }

  Requests& Heartbeat(uint64_t worker, uint64_t incarnation,
                      uint64_t aborts_seen) {
    v1::HeartbeatRequest r;
    r.set_worker_id(worker);
    r.set_incarnation(incarnation);
    r.set_aborts_seen(aborts_seen);
    return Add(kHeartbeat, r);
  }

  Requests& Deregister(uint64_t worker, uint64_t incarnation) {
    v1::DeregisterRequest r;
    r.set_worker_id(worker);
    r.set_incarnation(incarnation);
    return Add(kDeregister, r);
  }

  // Moves the clock by 0.5 s * (amount + 1)^2.
  Requests& Advance(int amount) {
    AppendRecord(RequestTag(kAdvance, amount), "", &out_);
    return *this;
  }

  const std::string& bytes() const { return out_; }

 private:
  Requests& Add(RequestOp op, const google::protobuf::Message& m, int wait = 0,
                bool mirror = false) {
    AppendRecord(RequestTag(op, wait, mirror), m.SerializeAsString(), &out_);
    return *this;
  }

  std::string out_;
};

// Rank `rank`'s call #`sequence` on g (epoch 1), with `count` elements.
v1::CollectiveRequest Call(v1::CollectiveKind kind, v1::DType dtype,
                           uint64_t count, int rank = 0, uint64_t sequence = 1,
                           const std::string& group = "g", uint64_t epoch = 1) {
  v1::CollectiveRequest r;
  r.set_group(group);
  r.set_epoch(epoch);
  r.set_rank(rank);
  r.set_sequence(sequence);
  r.mutable_spec()->set_kind(kind);
  r.mutable_spec()->set_dtype(dtype);
  r.mutable_spec()->set_count(count);
  return r;
}

// Attaches `elements` elements of input (bytes of a known dtype).
v1::CollectiveRequest WithData(v1::CollectiveRequest r, uint64_t elements) {
  const size_t element = DTypeSize(SpecFromProto(r.spec()).dtype);
  std::string data;
  for (uint64_t i = 0; i < elements * element; ++i) {
    data.push_back(static_cast<char>(i % 7 + 1));
  }
  r.set_has_inline_data(true);
  r.set_inline_data(data);
  return r;
}

Seeds RequestSeeds() {
  Seeds seeds;
  auto add = [&seeds](const std::string& name, const Requests& r) {
    seeds.emplace_back(name, r.bytes());
  };

  // Registration.
  add("register_new_worker",
      Requests().Register("w2", 7, {Cpu()}).Heartbeat(3, 7, 0));
  add("register_retry_and_new_incarnation",
      Requests().Register("w0", 1, {Cpu()}).Register("w0", 2, {Cpu()}));
  add("register_refused",
      Requests()
          .Register("w3", 1, {MakeDevice(v1::DEVICE_KIND_VULKAN)})
          .Register("w4", 1, {MakeDevice(v1::DEVICE_KIND_CUDA, 1)}, false)
          .Register("w5", 1, {MakeDevice(v1::DEVICE_KIND_OTHER, 2, "Npu")})
          .Register("w6", 1, {Cpu(), Cpu()})
          .Register("", 1, {Cpu()}));
  add("register_cuda_worker_then_join",
      Requests()
          .Register("w7", 1, {Cpu(), MakeDevice(v1::DEVICE_KIND_CUDA, 3)}, true)
          .Join("c", 1, 0, 3, MakeDevice(v1::DEVICE_KIND_CUDA, 3)));

  // Joins.
  add("join_world_one", Requests().Join("solo", 1, 0, 1, Cpu()));
  add("join_new_group",
      Requests()
          .Join("h", 2, 1, 2, MakeDevice(v1::DEVICE_KIND_CUDA))
          .Join("h", 2, 0, 1, Cpu()));
  add("join_retry", Requests()
                        .Join("h", 2, 0, 1, Cpu(), "req-a")
                        .Join("h", 2, 0, 1, Cpu(), "req-a")
                        .Join("h", 2, 1, 2, Cpu(), "req-b")
                        .Join("h", 2, 1, 2, Cpu(), "req-b"));
  // A retried join is answered with the group its first attempt formed,
  // even when it now asks for another world size.
  add("join_retry_other_world", Requests()
                                    .Join("h", 2, 0, 1, Cpu(), "req-a")
                                    .Join("h", 2, 1, 2, Cpu(), "req-b")
                                    .Join("h", 0, 1, 2, Cpu(), "req-b"));
  add("join_refused",
      Requests()
          .Join("h", 0, 0, 1, Cpu())
          .Join("h", 2, 2, 1, Cpu())
          .Join("h", 2, 0, 99, Cpu())
          .Join("h", 2, 0, 1, MakeDevice(v1::DEVICE_KIND_VULKAN))
          .Join("h", 2, 0, 1, Cpu())
          .Join("h", 3, 1, 2, Cpu())
          .Join("h", 2, 0, 2, Cpu())
          .Join("", 1, 0, 1, Cpu()));
  add("join_deadline", Requests()
                           .Join("h", 2, 0, 1, Cpu())
                           .Advance(2)
                           .Join("h", 2, 1, 2, Cpu()));
  add("join_reforms_group",
      Requests()
          .Collective(
              WithData(Call(v1::COLLECTIVE_KIND_ALL_REDUCE, v1::DTYPE_F32, 4),
                       4),
              false)
          .Join("g", 2, 0, 1, Cpu())
          .Join("g", 2, 1, 2, Cpu())
          .Collective(WithData(Call(v1::COLLECTIVE_KIND_ALL_REDUCE,
                                    v1::DTYPE_F32, 4, 0, 1, "g", 2),
                               4),
                      true));

  // Every kind, inline, both ranks.
  struct Inline {
    const char* name;
    v1::CollectiveKind kind;
    v1::DType dtype;
    v1::ReduceOp op;
    int root;
    uint64_t input_elements;  // for rank 0
  };
  const Inline kinds[] = {
      {"all_reduce_f32_sum", v1::COLLECTIVE_KIND_ALL_REDUCE, v1::DTYPE_F32,
       v1::REDUCE_OP_SUM, 0, 4},
      {"all_reduce_i64_avg", v1::COLLECTIVE_KIND_ALL_REDUCE, v1::DTYPE_I64,
       v1::REDUCE_OP_AVG, 0, 3},
      {"reduce_i32_max_root1", v1::COLLECTIVE_KIND_REDUCE, v1::DTYPE_I32,
       v1::REDUCE_OP_MAX, 1, 5},
      {"broadcast_u8_root0", v1::COLLECTIVE_KIND_BROADCAST, v1::DTYPE_U8,
       v1::REDUCE_OP_UNSPECIFIED, 0, 9},
      {"all_gather_f64", v1::COLLECTIVE_KIND_ALL_GATHER, v1::DTYPE_F64,
       v1::REDUCE_OP_UNSPECIFIED, 0, 2},
      {"reduce_scatter_bf16_prod", v1::COLLECTIVE_KIND_REDUCE_SCATTER,
       v1::DTYPE_BF16, v1::REDUCE_OP_PROD, 0, 6},
      {"gather_i8_root1", v1::COLLECTIVE_KIND_GATHER, v1::DTYPE_I8,
       v1::REDUCE_OP_UNSPECIFIED, 1, 3},
      {"scatter_u64_root0", v1::COLLECTIVE_KIND_SCATTER, v1::DTYPE_U64,
       v1::REDUCE_OP_UNSPECIFIED, 0, 4},
      {"all_to_all_f16", v1::COLLECTIVE_KIND_ALL_TO_ALL, v1::DTYPE_F16,
       v1::REDUCE_OP_UNSPECIFIED, 0, 4},
  };
  for (const Inline& k : kinds) {
    const uint64_t count = k.kind == v1::COLLECTIVE_KIND_REDUCE_SCATTER ||
                                   k.kind == v1::COLLECTIVE_KIND_SCATTER ||
                                   k.kind == v1::COLLECTIVE_KIND_ALL_TO_ALL
                               ? k.input_elements / 2
                               : k.input_elements;
    v1::CollectiveRequest r =
        WithData(Call(k.kind, k.dtype, count), k.input_elements);
    r.mutable_spec()->set_op(k.op);
    r.mutable_spec()->set_root(k.root);
    add(std::string("inline_") + k.name, Requests().Collective(r, true));
  }
  {
    v1::CollectiveRequest r =
        WithData(Call(v1::COLLECTIVE_KIND_ALL_REDUCE, v1::DTYPE_U32, 2), 2);
    r.mutable_spec()->set_op(v1::REDUCE_OP_MIN);
    r.set_algorithm(v1::ALGORITHM_INLINE);
    v1::CollectiveRequest second = r;
    second.set_sequence(2);
    add("inline_forced_two_in_a_row",
        Requests().Collective(r, true).Collective(second, true));
  }
  add("barrier",
      Requests().Collective(
          Call(v1::COLLECTIVE_KIND_BARRIER, v1::DTYPE_UNSPECIFIED, 0), true));

  // Data-plane plans and commits.
  {
    v1::CollectiveRequest ring =
        Call(v1::COLLECTIVE_KIND_ALL_GATHER, v1::DTYPE_F32, 1 << 20);
    ring.set_algorithm(v1::ALGORITHM_RING);
    add("ring_then_commit",
        Requests().Collective(ring, true).Commit("g", 1, 0, 1, true));
    add("ring_commit_deadline", Requests()
                                    .Collective(ring, true)
                                    .Commit("g", 1, 1, 1, false)
                                    .Advance(3)
                                    .Commit("g", 1, 0, 1, false));
    add("ring_commit_then_failure",
        Requests()
            .Collective(ring, true)
            .Commit("g", 1, 0, 1, false)
            .ReportFailure("g", 1, 1, 1)
            .Heartbeat(1, 1, 0)
            .Collective(Call(v1::COLLECTIVE_KIND_BARRIER, v1::DTYPE_UNSPECIFIED,
                             0, 0, 2),
                        false));
    add("ring_commit_then_rejoin", Requests()
                                       .Collective(ring, true)
                                       .Commit("g", 1, 0, 1, false)
                                       .Join("g", 2, 0, 1, Cpu())
                                       .Join("g", 2, 1, 2, Cpu()));
    add("ring_commit_refused", Requests()
                                   .Collective(ring, true)
                                   .Commit("g", 1, 0, 1, false)
                                   .Commit("g", 1, 0, 1, false)
                                   .Commit("g", 1, 5, 1, false)
                                   .Commit("g", 2, 0, 1, false)
                                   .Commit("nope", 1, 0, 1, false)
                                   .Commit("g", 1, 1, 7, false));
    v1::CollectiveRequest doubling =
        Call(v1::COLLECTIVE_KIND_ALL_REDUCE, v1::DTYPE_F64, 1 << 14);
    doubling.mutable_spec()->set_op(v1::REDUCE_OP_SUM);
    add("recursive_doubling_then_commit",
        Requests().Collective(doubling, true).Commit("g", 1, 1, 1, true));
    v1::CollectiveRequest bad = doubling;
    bad.mutable_spec()->set_kind(v1::COLLECTIVE_KIND_BROADCAST);
    bad.set_algorithm(v1::ALGORITHM_RECURSIVE_DOUBLING);
    add("recursive_doubling_refused", Requests().Collective(bad, true));
  }

  // Mismatches, refusals and deadlines.
  {
    v1::CollectiveRequest a =
        WithData(Call(v1::COLLECTIVE_KIND_ALL_REDUCE, v1::DTYPE_F32, 4), 4);
    a.mutable_spec()->set_op(v1::REDUCE_OP_SUM);
    v1::CollectiveRequest b =
        WithData(Call(v1::COLLECTIVE_KIND_ALL_REDUCE, v1::DTYPE_F32, 8, 1), 8);
    b.mutable_spec()->set_op(v1::REDUCE_OP_SUM);
    add("mismatch", Requests().Collective(a, false).Collective(b, false));

    v1::CollectiveRequest vulkan = a;
    *vulkan.mutable_device() = MakeDevice(v1::DEVICE_KIND_VULKAN);
    add("device_refused_at_decision", Requests().Collective(vulkan, true));
    v1::CollectiveRequest cuda = a;
    cuda.set_rank(1);
    *cuda.mutable_device() = MakeDevice(v1::DEVICE_KIND_CUDA);
    add("device_cuda_rank1", Requests().Collective(cuda, true));

    Requests refused;
    v1::CollectiveRequest r = a;
    r.set_epoch(7);
    refused.Collective(r, false);
    r = a;
    r.set_sequence(0);
    refused.Collective(r, false);
    r = a;
    r.set_sequence(3);
    refused.Collective(r, false);
    r = a;
    r.set_rank(2);
    refused.Collective(r, false);
    r = a;
    r.mutable_spec()->set_dtype(static_cast<v1::DType>(42));
    refused.Collective(r, false);
    r = a;
    r.set_inline_data("abc");
    refused.Collective(r, false);
    r = a;
    r.set_has_inline_data(false);
    refused.Collective(r, false);
    r = a;
    r.set_group("nope");
    refused.Collective(r, false);
    r = a;
    r.mutable_spec()->set_count(uint64_t{1} << 41);
    r.clear_inline_data();
    r.set_has_inline_data(false);
    refused.Collective(r, false);
    add("collective_refused", refused);

    add("collective_deadline",
        Requests()
            .Collective(a, false)
            .Advance(3)
            .Collective(b, false)
            .Collective(Call(v1::COLLECTIVE_KIND_BARRIER, v1::DTYPE_UNSPECIFIED,
                             0, 1, 2),
                        true));
    add("collective_retry",
        Requests().Collective(a, false).Collective(a, false).Collective(
            WithData(Call(v1::COLLECTIVE_KIND_ALL_REDUCE, v1::DTYPE_F32, 4, 1),
                     4),
            false));
    v1::CollectiveRequest inline_no_data = a;
    inline_no_data.set_has_inline_data(false);
    inline_no_data.clear_inline_data();
    add("inline_without_data", Requests().Collective(inline_no_data, true));
  }

  // Workers lost.
  add("lease_expires", Requests()
                           .Collective(Call(v1::COLLECTIVE_KIND_BARRIER,
                                            v1::DTYPE_UNSPECIFIED, 0),
                                       false)
                           .Heartbeat(2, 1, 0)
                           .Advance(4)
                           .Heartbeat(1, 1, 0));
  add("deregister", Requests()
                        .Deregister(2, 2)
                        .Deregister(2, 1)
                        .Heartbeat(1, 1, 0)
                        .Collective(Call(v1::COLLECTIVE_KIND_BARRIER,
                                         v1::DTYPE_UNSPECIFIED, 0),
                                    false));

  // ParseDeviceList reads the raw input.
  int lists = 0;
  for (const char* list : {"cpu,cuda:0,npu:2", " Cuda:1 , vulkan:0 ,metal",
                           "cpu,cpu", "tpu:-1", "x_y:007,cuda:"}) {
    seeds.emplace_back("device_list_" + std::to_string(lists++), list);
  }
  return seeds;
}

// ---- chunk_fuzzer -----------------------------------------------------------

class Chunks {
 public:
  Chunks& Op(ChunkOp op, int selector, const v1::Chunk& chunk) {
    AppendRecord(ChunkTag(op, selector), chunk.SerializeAsString(), &out_);
    return *this;
  }
  Chunks& Deliver(int stream, const v1::Chunk& chunk) {
    return Op(kDeliver, stream, chunk);
  }
  Chunks& Take(const v1::Chunk& chunk) { return Op(kTake, 1, chunk); }
  Chunks& Abort(const v1::Chunk& chunk) { return Op(kAbort, 0, chunk); }
  Chunks& Raw(ChunkOp op, int selector, const std::string& bytes) {
    AppendRecord(ChunkTag(op, selector), bytes, &out_);
    return *this;
  }
  const std::string& bytes() const { return out_; }

 private:
  std::string out_;
};

v1::Chunk MakeChunk(const std::string& group, uint64_t epoch, uint64_t sequence,
                    int from, int to, uint32_t tag, size_t bytes) {
  v1::Chunk c;
  c.set_group(group);
  c.set_epoch(epoch);
  c.set_sequence(sequence);
  c.set_from_rank(from);
  c.set_to_rank(to);
  c.set_tag(tag);
  std::string data;
  for (size_t i = 0; i < bytes; ++i) {
    data.push_back(static_cast<char>('a' + (i + tag) % 26));
  }
  c.set_data(data);
  return c;
}

Seeds ChunkSeeds() {
  Seeds seeds;
  auto add = [&seeds](const std::string& name, const Chunks& c) {
    seeds.emplace_back(name, c.bytes());
  };
  const v1::Chunk a0 = MakeChunk("g", 1, 1, 0, 1, 0, 40);
  const v1::Chunk a1 = MakeChunk("g", 1, 1, 0, 1, 1, 40);
  const v1::Chunk a2 = MakeChunk("g", 1, 2, 1, 0, 0, 16);
  const v1::Chunk big = MakeChunk("g", 1, 3, 0, 1, 0, 300);
  const v1::Chunk other = MakeChunk("g", 2, 1, 0, 1, 0, 24);
  const v1::Chunk slash = MakeChunk("g/1", 5, 1, 0, 1, 0, 24);

  add("deliver_take", Chunks()
                          .Deliver(0, a0)
                          .Deliver(0, a1)
                          .Deliver(1, a2)
                          .Take(a0)
                          .Take(a1)
                          .Take(a2));
  add("take_before_deliver", Chunks().Take(a0).Deliver(0, a0).Take(a0));
  add("stream_over_limit", Chunks()
                               .Deliver(0, big)
                               .Deliver(0, a0)
                               .Deliver(1, a1)
                               .Take(big)
                               .Deliver(0, a2)
                               .Take(a1)
                               .Take(a2));
  add("stream_limit_many", Chunks()
                               .Deliver(2, MakeChunk("g", 1, 1, 0, 1, 0, 100))
                               .Deliver(2, MakeChunk("g", 1, 1, 0, 1, 1, 100))
                               .Deliver(2, MakeChunk("g", 1, 1, 0, 1, 2, 100))
                               .Op(kTakeStored, 0, v1::Chunk())
                               .Op(kTakeStored, 1, v1::Chunk())
                               .Deliver(2, MakeChunk("g", 1, 1, 0, 1, 3, 100)));
  add("abort_group", Chunks()
                         .Deliver(0, a0)
                         .Deliver(1, other)
                         .Abort(a0)
                         .Take(a0)
                         .Take(other)
                         .Deliver(0, a1));
  add("abort_prefix_group",
      Chunks().Deliver(0, slash).Deliver(1, a0).Abort(a0).Take(slash));
  add("abort_over_limit",
      Chunks().Deliver(0, big).Deliver(0, a0).Abort(big).Deliver(0, a1));
  add("abort_all_seen", Chunks()
                            .Deliver(0, a0)
                            .Take(other)
                            .Raw(kAbortAllSeen, 0, "")
                            .Deliver(1, MakeChunk("g", 3, 1, 0, 1, 0, 8))
                            .Take(a0));
  add("duplicate_key",
      Chunks().Deliver(0, a0).Deliver(1, a0).Take(a0).Deliver(0, big));
  add("duplicate_key_resumes_other_stream",
      Chunks()
          .Deliver(0, big)
          .Deliver(1, MakeChunk("g", 1, 3, 0, 1, 0, 10))
          .Raw(kCloseStream, 0, "")
          .Take(big));
  add("close_stream", Chunks()
                          .Deliver(0, big)
                          .Raw(kCloseStream, 0, "")
                          .Deliver(0, a0)
                          .Take(big)
                          .Take(a0));
  add("malformed_chunk", Chunks()
                             .Deliver(1, a0)
                             .Raw(kDeliver, 1, "\x0a\xff")
                             .Deliver(1, a1)
                             .Take(a0));
  add("empty_and_negative",
      Chunks()
          .Deliver(0, MakeChunk("", 0, 0, -1, -2, 4000000000u, 0))
          .Take(MakeChunk("", 0, 0, -1, -2, 4000000000u, 0))
          .Op(kTake, 0, MakeChunk("", 0, 0, -1, -2, 1, 0)));
  return seeds;
}

// ---- frame_fuzzer -----------------------------------------------------------

std::string Frame(const std::string& group, uint32_t tag,
                  const std::string& payload) {
  MessageKey key;
  key.group = group;
  key.epoch = 7;
  key.sequence = 3;
  key.from_rank = 1;
  key.to_rank = 2;
  key.tag = tag;
  return *EncodeFrameHeader(key, payload.size()) + payload;
}

Seeds FrameSeeds() {
  const std::string hello(kWireHello);
  const std::string two =
      Frame("g", 0, "first") + Frame("trainers", 1, std::string(300, 'x'));
  std::string bad_flags = Frame("g", 2, "p");
  bad_flags[36] = '\x04';
  return {
      {"hello_only", hello},
      {"two_then_goodbye", hello + two + EncodeGoodbyeFrame()},
      {"two_then_closed", hello + two},
      {"cut_mid_payload", hello + two.substr(0, two.size() - 10)},
      {"cut_mid_header", hello + Frame("g", 0, "x").substr(0, 20)},
      {"empty_payload", hello + Frame("g", 5, "")},
      {"bad_flags", hello + Frame("g", 0, "ok") + bad_flags},
      {"bad_hello", "GET / HTTP/1.1\r\n\r\n"},
  };
}

// ---- call_frame_fuzzer ------------------------------------------------------

// A call-port frame of `request`.
std::string CallFrame(const v1::CallPortRequest& request) {
  std::string frame;
  AppendCallFrame(request.SerializeAsString(), &frame);
  return frame;
}

v1::CallPortRequest CallOf(uint64_t call_id, int rank, uint64_t sequence,
                           v1::CollectiveKind kind) {
  v1::CallPortRequest request;
  request.set_call_id(call_id);
  request.set_timeout_us(1'000'000);
  v1::CollectiveRequest& call = *request.mutable_call();
  call.set_group("g");
  call.set_epoch(1);
  call.set_rank(rank);
  call.set_sequence(sequence);
  call.mutable_spec()->set_kind(kind);
  return request;
}

// The first byte of each seed sets the piece size (1 + byte % 64).
Seeds CallFrameSeeds() {
  const std::string barriers =
      CallFrame(CallOf(1, 0, 1, v1::COLLECTIVE_KIND_BARRIER)) +
      CallFrame(CallOf(2, 1, 1, v1::COLLECTIVE_KIND_BARRIER));
  v1::CallPortRequest sum0 = CallOf(3, 0, 2, v1::COLLECTIVE_KIND_ALL_REDUCE);
  sum0.mutable_call()->mutable_spec()->set_dtype(v1::DTYPE_F32);
  sum0.mutable_call()->mutable_spec()->set_count(2);
  sum0.mutable_call()->mutable_spec()->set_op(v1::REDUCE_OP_SUM);
  sum0.mutable_call()->set_has_inline_data(true);
  sum0.mutable_call()->set_inline_data(std::string(8, '\0'));
  v1::CallPortRequest sum1 = sum0;
  sum1.set_call_id(4);
  sum1.mutable_call()->set_rank(1);
  v1::CallPortRequest commit;
  commit.set_call_id(5);
  commit.mutable_commit()->set_group("g");
  commit.mutable_commit()->set_epoch(1);
  commit.mutable_commit()->set_sequence(2);
  v1::CallPortRequest empty;
  empty.set_call_id(6);
  v1::CallPortRequest failure;
  failure.set_call_id(7);
  failure.mutable_failure()->set_group("g");
  failure.mutable_failure()->set_epoch(1);
  failure.mutable_failure()->set_rank(1);
  failure.mutable_failure()->set_sequence(3);
  failure.mutable_failure()->set_code(14);
  failure.mutable_failure()->set_message("peer lost");
  return {
      {"barriers_whole", std::string(1, '\x3f') + barriers},
      {"barriers_bytewise", std::string(1, '\0') + barriers},
      {"inline_sum_and_commit", std::string(1, '\x07') + barriers +
                                    CallFrame(sum0) + CallFrame(sum1) +
                                    CallFrame(commit)},
      {"no_call", std::string(1, '\x10') + CallFrame(empty)},
      {"failure_report",
       std::string(1, '\x09') + barriers + CallFrame(failure)},
      {"over_limit",
       std::string(1, '\x03') + std::string("\xff\xff\x00\x00", 4)},
      {"not_a_request", std::string(1, '\x05') + barriers +
                            std::string("\x01\x00\x00\x00\x0f", 5)},
  };
}

int WriteAll(const std::filesystem::path& dir, const std::string& target,
             const Seeds& seeds) {
  const std::filesystem::path out = dir / target;
  std::filesystem::create_directories(out);
  for (const auto& [name, bytes] : seeds) {
    std::ofstream file(out / name, std::ios::binary | std::ios::trunc);
    file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!file) {
      std::fprintf(stderr, "cannot write %s\n", (out / name).c_str());
      return 1;
    }
  }
  std::printf("wrote %zu seeds to %s\n", seeds.size(), out.c_str());
  return 0;
}

}  // namespace
}  // namespace fuzz
}  // namespace chorus

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir(argv[1]);
  return chorus::fuzz::WriteAll(dir, "request_fuzzer",
                                chorus::fuzz::RequestSeeds()) |
         chorus::fuzz::WriteAll(dir, "chunk_fuzzer",
                                chorus::fuzz::ChunkSeeds()) |
         chorus::fuzz::WriteAll(dir, "frame_fuzzer",
                                chorus::fuzz::FrameSeeds()) |
         chorus::fuzz::WriteAll(dir, "call_frame_fuzzer",
                                chorus::fuzz::CallFrameSeeds());
}
