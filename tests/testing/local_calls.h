// Requests for a worker daemon's local API (chorus.v1.WorkerLocal) that
// integration tests send through the raw stub. Pure functions.
#ifndef CHORUS_TESTS_TESTING_LOCAL_CALLS_H_
#define CHORUS_TESTS_TESTING_LOCAL_CALLS_H_

#include <grpcpp/support/status.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "chorus/v1/worker.pb.h"

namespace chorus::test {

// Rank `rank`'s all_reduce (sum) of one u32 of value 1 as its call
// #`sequence` of `group` at `epoch`.
inline v1::LocalCollectiveRequest OneU32AllReduce(const std::string& group,
                                                  uint64_t epoch, int rank,
                                                  uint64_t sequence) {
  v1::LocalCollectiveRequest call;
  call.set_group(group);
  call.set_rank(rank);
  call.set_epoch(epoch);
  call.set_sequence(sequence);
  v1::CollectiveSpec& spec = *call.mutable_spec();
  spec.set_kind(v1::COLLECTIVE_KIND_ALL_REDUCE);
  spec.set_dtype(v1::DTYPE_U32);
  spec.set_count(1);
  spec.set_op(v1::REDUCE_OP_SUM);
  const uint32_t value = 1;
  call.set_data(std::string(reinterpret_cast<const char*>(&value), 4));
  return call;
}

// Rank `rank`'s all_reduce (sum) of one i64 of `value` as its call
// #`sequence` of `group` at `epoch`.
inline v1::LocalCollectiveRequest OneI64Sum(const std::string& group,
                                            uint64_t epoch, int rank,
                                            uint64_t sequence, int64_t value) {
  v1::LocalCollectiveRequest call =
      OneU32AllReduce(group, epoch, rank, sequence);
  call.mutable_spec()->set_dtype(v1::DTYPE_I64);
  call.set_data(std::string(reinterpret_cast<const char*>(&value), 8));
  return call;
}

// "OK <sum>" for the answer to a OneI64Sum call, or `status`'s message.
inline std::string SumOrError(const grpc::Status& status,
                              const v1::LocalCollectiveResponse& response) {
  if (!status.ok()) return status.error_message();
  int64_t sum = -1;
  if (response.data().size() == sizeof(sum)) {
    memcpy(&sum, response.data().data(), sizeof(sum));
  }
  return absl::StrCat("OK ", sum);
}

}  // namespace chorus::test

#endif  // CHORUS_TESTS_TESTING_LOCAL_CALLS_H_
