// WorkerLocal.CollectiveChunked against real daemons: a coordinator and two
// chorus-worker processes on 127.0.0.1, driven through the raw gRPC stub
// with deadlines. Tensors over gRPC's 64 MiB message limit come back whole;
// every malformed stream gets its documented code before the call takes a
// sequence number, so the next call of both ranks works with that number.

#include <grpcpp/client_context.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "common/net.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemons.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;
using Stream =
    grpc::ClientReaderWriter<v1::LocalChunkedRequest, v1::LocalChunkedResponse>;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kPiece = 4 * kMiB;
// The cap the bad-input tests give the workers (--max_tensor_bytes).
constexpr uint64_t kSmallCap = 8 * kMiB;
constexpr absl::Duration kCallTimeout = absl::Seconds(60);
// A small all_reduce's element count.
constexpr uint64_t kSmallCount = 1000;

// What a stream ended with.
struct Outcome {
  grpc::Status status;
  int headers = 0;
  v1::LocalChunkedResult header;
  std::string output;
  uint64_t largest_piece = 0;
};

// Runs one stream on `stub`: `send` writes the requests (it may ignore
// failed writes), then the stream is half-closed and read to its end.
Outcome Exchange(v1::WorkerLocal::Stub& stub,
                 const std::function<void(Stream&)>& send,
                 absl::Duration timeout = kCallTimeout) {
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(timeout));
  std::unique_ptr<Stream> stream = stub.CollectiveChunked(&context);
  send(*stream);
  stream->WritesDone();
  Outcome outcome;
  v1::LocalChunkedResponse response;
  while (stream->Read(&response)) {
    if (response.has_header()) {
      ++outcome.headers;
      outcome.header = response.header();
    } else {
      outcome.largest_piece =
          std::max<uint64_t>(outcome.largest_piece, response.data().size());
      outcome.output += response.data();
    }
  }
  outcome.status = stream->Finish();
  return outcome;
}

v1::LocalChunkedRequest Piece(absl::string_view data) {
  v1::LocalChunkedRequest request;
  request.set_data(std::string(data));
  return request;
}

// Writes `input` in pieces of `piece` bytes.
void WritePieces(Stream& stream, absl::string_view input,
                 uint64_t piece = kPiece) {
  for (uint64_t at = 0; at < input.size(); at += piece) {
    if (!stream.Write(Piece(input.substr(at, piece)))) return;
  }
}

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(T));
}

class ChunkedCollectiveTest : public ::testing::Test {
 protected:
  // Starts a coordinator and two workers with `worker_flags` and joins rank
  // r through worker r.
  void Start(const std::vector<std::string>& worker_flags = {}) {
    absl::StatusOr<Daemon> coordinator = StartCoordinator();
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> flags = worker_flags;
      flags.push_back(absl::StrCat("--name=w", r));
      absl::StatusOr<Daemon> worker = StartWorker(coordinator_.address, flags);
      ASSERT_TRUE(worker.ok()) << worker.status();
      stubs_.push_back(v1::WorkerLocal::NewStub(
          MakeChannel(worker->address, Role::kWorker)));
      workers_.push_back(*std::move(worker));
    }
    grpc::Status joined[2];
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([this, r, &joined] {
        grpc::ClientContext context;
        context.set_deadline(DeadlineAfter(kCallTimeout));
        v1::LocalJoinRequest request;
        request.set_group("chunked");
        request.set_world_size(2);
        request.set_rank(r);
        v1::LocalJoinResponse response;
        joined[r] = stubs_[r]->JoinGroup(&context, request, &response);
        epochs_[r] = response.epoch();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(joined[r].ok()) << r << ": " << joined[r].error_message();
    }
  }

  // The call of rank `rank` with its next sequence number, without data.
  v1::LocalCollectiveRequest Call(int rank, v1::CollectiveKind kind,
                                  v1::DType dtype, uint64_t count) const {
    v1::LocalCollectiveRequest call;
    call.set_group("chunked");
    call.set_rank(rank);
    v1::CollectiveSpec& spec = *call.mutable_spec();
    spec.set_kind(kind);
    spec.set_dtype(dtype);
    spec.set_count(count);
    if (kind == v1::COLLECTIVE_KIND_ALL_REDUCE) spec.set_op(v1::REDUCE_OP_SUM);
    call.set_epoch(epochs_[rank]);
    call.set_sequence(next_sequence_[rank]);
    return call;
  }

  static v1::LocalChunkedRequest Header(const v1::LocalCollectiveRequest& call,
                                        uint64_t input_bytes) {
    v1::LocalChunkedRequest request;
    *request.mutable_header()->mutable_call() = call;
    request.mutable_header()->set_input_bytes(input_bytes);
    return request;
  }

  // Streams `inputs[r]` as rank r's input of `call(r)` on both ranks at once.
  std::vector<Outcome> RunBoth(
      const std::function<v1::LocalCollectiveRequest(int)>& call,
      const std::vector<std::string>& inputs) {
    std::vector<Outcome> outcomes(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        outcomes[r] = Exchange(*stubs_[r], [&](Stream& stream) {
          if (!stream.Write(Header(call(r), inputs[r].size()))) return;
          WritePieces(stream, inputs[r]);
        });
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < 2; ++r) {
      if (outcomes[r].status.ok()) ++next_sequence_[r];
    }
    return outcomes;
  }

  // Runs a small all_reduce on both ranks and checks that it takes the
  // ranks' next numbers and sums.
  void ExpectGroupUsable() {
    const uint64_t sequence = next_sequence_[0];
    std::vector<std::string> inputs;
    for (int r = 0; r < 2; ++r) {
      inputs.push_back(Bytes(std::vector<float>(kSmallCount, r + 1.0f)));
    }
    std::vector<Outcome> outcomes = RunBoth(
        [&](int r) {
          return Call(r, v1::COLLECTIVE_KIND_ALL_REDUCE, v1::DTYPE_F32,
                      kSmallCount);
        },
        inputs);
    const std::string want = Bytes(std::vector<float>(kSmallCount, 3.0f));
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(outcomes[r].status.ok())
          << r << ": " << outcomes[r].status.error_message();
      EXPECT_EQ(outcomes[r].header.sequence(), sequence);
      EXPECT_TRUE(outcomes[r].output == want) << "rank " << r;
    }
  }

  // Runs one stream of rank 0 that `send` writes; expects it refused with
  // `code` and a message holding `message`, then the group usable.
  void ExpectRefused(const std::function<void(Stream&)>& send,
                     grpc::StatusCode code, const std::string& message) {
    Outcome outcome = Exchange(*stubs_[0], send);
    EXPECT_EQ(outcome.status.error_code(), code)
        << outcome.status.error_message();
    EXPECT_THAT(outcome.status.error_message(), HasSubstr(message));
    EXPECT_EQ(outcome.headers, 0);
    ExpectGroupUsable();
  }

  // The small all_reduce of rank 0 with `input_bytes` in its header.
  v1::LocalChunkedRequest SmallHeader(uint64_t input_bytes) const {
    return Header(
        Call(0, v1::COLLECTIVE_KIND_ALL_REDUCE, v1::DTYPE_F32, kSmallCount),
        input_bytes);
  }

  Daemon coordinator_;
  std::vector<Daemon> workers_;
  std::vector<std::unique_ptr<v1::WorkerLocal::Stub>> stubs_;
  uint64_t epochs_[2] = {0, 0};
  uint64_t next_sequence_[2] = {1, 1};
};

TEST_F(ChunkedCollectiveTest, CollectiveChunked_AllReduce96MiB_SumsInPieces) {
  ASSERT_NO_FATAL_FAILURE(Start());
  constexpr uint64_t kCount = 96 * kMiB / sizeof(float);
  std::vector<std::string> inputs;
  for (int r = 0; r < 2; ++r) {
    std::vector<float> values(kCount);
    for (uint64_t i = 0; i < kCount; ++i) {
      values[i] = static_cast<float>(i % 1000) + r;
    }
    inputs.push_back(Bytes(values));
  }
  std::vector<Outcome> outcomes = RunBoth(
      [&](int r) {
        return Call(r, v1::COLLECTIVE_KIND_ALL_REDUCE, v1::DTYPE_F32, kCount);
      },
      inputs);
  inputs.clear();
  for (int r = 0; r < 2; ++r) {
    const Outcome& outcome = outcomes[r];
    ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
    EXPECT_EQ(outcome.headers, 1);
    EXPECT_EQ(outcome.header.sequence(), 1u);
    EXPECT_EQ(outcome.header.output_bytes(), kCount * sizeof(float));
    EXPECT_LE(outcome.largest_piece, kPiece);
    ASSERT_EQ(outcome.output.size(), kCount * sizeof(float));
    const float* got = reinterpret_cast<const float*>(outcome.output.data());
    uint64_t wrong = 0;
    for (uint64_t i = 0; i < kCount; ++i) {
      if (got[i] != 2.0f * static_cast<float>(i % 1000) + 1.0f) ++wrong;
    }
    EXPECT_EQ(wrong, 0u) << "rank " << r;
  }
}

TEST_F(ChunkedCollectiveTest,
       CollectiveChunked_AllGatherOutputOver64MiB_ReturnsEveryBlock) {
  ASSERT_NO_FATAL_FAILURE(Start());
  constexpr uint64_t kCount = 36 * kMiB / sizeof(uint32_t);  // 72 MiB out
  std::vector<std::string> inputs;
  for (int r = 0; r < 2; ++r) {
    std::vector<uint32_t> values(kCount);
    for (uint64_t i = 0; i < kCount; ++i) {
      values[i] =
          static_cast<uint32_t>(i) ^ (static_cast<uint32_t>(r + 1) << 28);
    }
    inputs.push_back(Bytes(values));
  }
  std::vector<Outcome> outcomes = RunBoth(
      [&](int r) {
        return Call(r, v1::COLLECTIVE_KIND_ALL_GATHER, v1::DTYPE_U32, kCount);
      },
      inputs);
  const std::string want = inputs[0] + inputs[1];
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(outcomes[r].status.ok()) << outcomes[r].status.error_message();
    EXPECT_EQ(outcomes[r].header.output_bytes(), want.size());
    EXPECT_TRUE(outcomes[r].output == want) << "rank " << r;
  }
}

TEST_F(ChunkedCollectiveTest,
       CollectiveChunked_WrongTotal_InvalidArgumentAsCollective) {
  ASSERT_NO_FATAL_FAILURE(
      Start({absl::StrCat("--max_tensor_bytes=", kSmallCap)}));
  // The unary call's verdict on the same size, for the message.
  v1::LocalCollectiveRequest unary =
      Call(0, v1::COLLECTIVE_KIND_ALL_REDUCE, v1::DTYPE_F32, kSmallCount);
  unary.set_data(std::string(4 * kSmallCount + 4, '\0'));
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(kCallTimeout));
  v1::LocalCollectiveResponse response;
  const grpc::Status want = stubs_[0]->Collective(&context, unary, &response);
  ASSERT_EQ(want.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  ExpectRefused(
      [&](Stream& stream) {
        stream.Write(SmallHeader(4 * kSmallCount + 4));
        stream.Write(Piece(std::string(4 * kSmallCount + 4, '\0')));
      },
      grpc::StatusCode::INVALID_ARGUMENT, want.error_message());
}

TEST_F(ChunkedCollectiveTest,
       CollectiveChunked_StaleEpoch_FailedPreconditionAsCollective) {
  ASSERT_NO_FATAL_FAILURE(
      Start({absl::StrCat("--max_tensor_bytes=", kSmallCap)}));
  v1::LocalCollectiveRequest call =
      Call(0, v1::COLLECTIVE_KIND_ALL_REDUCE, v1::DTYPE_F32, kSmallCount);
  call.set_epoch(epochs_[0] + 5);
  call.set_data(std::string(4 * kSmallCount, '\0'));
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(kCallTimeout));
  v1::LocalCollectiveResponse response;
  const grpc::Status want = stubs_[0]->Collective(&context, call, &response);
  ASSERT_EQ(want.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  call.clear_data();
  ExpectRefused(
      [&](Stream& stream) {
        stream.Write(Header(call, 4 * kSmallCount));
        stream.Write(Piece(std::string(4 * kSmallCount, '\0')));
      },
      grpc::StatusCode::FAILED_PRECONDITION, want.error_message());
}

TEST_F(ChunkedCollectiveTest,
       CollectiveChunked_PiecesPastTotal_InvalidArgument) {
  ASSERT_NO_FATAL_FAILURE(
      Start({absl::StrCat("--max_tensor_bytes=", kSmallCap)}));
  ExpectRefused(
      [&](Stream& stream) {
        stream.Write(SmallHeader(4 * kSmallCount));
        stream.Write(Piece(std::string(3000, '\0')));
        stream.Write(Piece(std::string(3000, '\0')));
      },
      grpc::StatusCode::INVALID_ARGUMENT,
      "add up to 6000 bytes, past the header's input_bytes of 4000");
}

TEST_F(ChunkedCollectiveTest, CollectiveChunked_EndsEarly_InvalidArgument) {
  ASSERT_NO_FATAL_FAILURE(
      Start({absl::StrCat("--max_tensor_bytes=", kSmallCap)}));
  ExpectRefused(
      [&](Stream& stream) {
        stream.Write(SmallHeader(4 * kSmallCount));
        stream.Write(Piece(std::string(1000, '\0')));
      },
      grpc::StatusCode::INVALID_ARGUMENT,
      "ended after 1000 of 4000 bytes of input");
  ExpectRefused([](Stream&) {}, grpc::StatusCode::INVALID_ARGUMENT,
                "ended before its header");
}

TEST_F(ChunkedCollectiveTest,
       CollectiveChunked_SecondHeaderOrDataFirst_InvalidArgument) {
  ASSERT_NO_FATAL_FAILURE(
      Start({absl::StrCat("--max_tensor_bytes=", kSmallCap)}));
  ExpectRefused(
      [&](Stream& stream) {
        stream.Write(SmallHeader(4 * kSmallCount));
        stream.Write(Piece(std::string(1000, '\0')));
        stream.Write(SmallHeader(4 * kSmallCount));
      },
      grpc::StatusCode::INVALID_ARGUMENT, "second header");
  ExpectRefused(
      [&](Stream& stream) {
        stream.Write(Piece(std::string(4 * kSmallCount, '\0')));
      },
      grpc::StatusCode::INVALID_ARGUMENT, "before the header");
  ExpectRefused(
      [&](Stream& stream) {
        v1::LocalChunkedRequest header = SmallHeader(4 * kSmallCount);
        header.mutable_header()->mutable_call()->set_data("x");
        stream.Write(header);
      },
      grpc::StatusCode::INVALID_ARGUMENT, "send the input in data pieces");
}

TEST_F(ChunkedCollectiveTest, CollectiveChunked_PieceOver4MiB_InvalidArgument) {
  ASSERT_NO_FATAL_FAILURE(
      Start({absl::StrCat("--max_tensor_bytes=", kSmallCap)}));
  constexpr uint64_t kCount = 5 * kMiB / sizeof(float);
  ExpectRefused(
      [&](Stream& stream) {
        stream.Write(Header(
            Call(0, v1::COLLECTIVE_KIND_ALL_REDUCE, v1::DTYPE_F32, kCount),
            5 * kMiB));
        stream.Write(Piece(std::string(5 * kMiB, '\0')));
      },
      grpc::StatusCode::INVALID_ARGUMENT,
      absl::StrCat("a piece of ", 5 * kMiB, " bytes is over the limit"));
}

TEST_F(ChunkedCollectiveTest, CollectiveChunked_OverTheCap_ResourceExhausted) {
  ASSERT_NO_FATAL_FAILURE(
      Start({absl::StrCat("--max_tensor_bytes=", kSmallCap)}));
  // An input over the cap: refused at the header, before any data.
  constexpr uint64_t kInputCount = 2 * kSmallCap / sizeof(float);
  ExpectRefused(
      [&](Stream& stream) {
        stream.Write(Header(
            Call(0, v1::COLLECTIVE_KIND_ALL_REDUCE, v1::DTYPE_F32, kInputCount),
            2 * kSmallCap));
      },
      grpc::StatusCode::RESOURCE_EXHAUSTED,
      absl::StrCat("rank 0's input of ", 2 * kSmallCap,
                   " bytes for all_reduce f32[", kInputCount,
                   "] sum is over this worker's limit of ", kSmallCap,
                   " bytes per tensor (--max_tensor_bytes)"));
  // An output over the cap: an all_gather of 3/4 of the cap per rank.
  constexpr uint64_t kGatherCount = kSmallCap * 3 / 4 / sizeof(float);
  ExpectRefused(
      [&](Stream& stream) {
        stream.Write(Header(Call(0, v1::COLLECTIVE_KIND_ALL_GATHER,
                                 v1::DTYPE_F32, kGatherCount),
                            kGatherCount * sizeof(float)));
      },
      grpc::StatusCode::RESOURCE_EXHAUSTED, "rank 0's output of");
}

}  // namespace
}  // namespace chorus::test
