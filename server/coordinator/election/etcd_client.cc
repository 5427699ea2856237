#include "server/coordinator/election/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "common/tcp_socket.h"
#include "etcd/etcd_v3.grpc.pb.h"

namespace chorus {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path));
  }
  return contents.str();
}

// The channel to one endpoint; `tls` when it is https.
absl::StatusOr<std::shared_ptr<grpc::Channel>> ChannelTo(
    const std::string& endpoint, const EtcdOptions& options,
    std::string* address) {
  bool tls = false;
  std::string rest = endpoint;
  if (absl::StartsWith(rest, "https://")) {
    tls = true;
    rest = rest.substr(8);
  } else if (absl::StartsWith(rest, "http://")) {
    rest = rest.substr(7);
  }
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (!SplitHostPort(rest).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint '", endpoint,
                     "' is not http://host:port or https://host:port"));
  }
  *address = rest;
  grpc::ChannelArguments arguments;
  // Reconnect soon after etcd comes back rather than after gRPC's backoff.
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  if (!tls) {
    return grpc::CreateCustomChannel(rest, grpc::InsecureChannelCredentials(),
                                     arguments);
  }
  if (options.ca_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint ", endpoint, " is https: give --etcd_ca"));
  }
  grpc::SslCredentialsOptions ssl;
  absl::StatusOr<std::string> ca = ReadPem(options.ca_file);
  if (!ca.ok()) return ca.status();
  ssl.pem_root_certs = *ca;
  if (!options.cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadPem(options.cert_file);
    absl::StatusOr<std::string> key = ReadPem(options.key_file);
    if (!cert.ok()) return cert.status();
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  return grpc::CreateCustomChannel(rest, grpc::SslCredentials(ssl), arguments);
}

// Whole seconds, at least one: etcd's TTLs are seconds.
int64_t Seconds(absl::Duration duration) {
  const int64_t seconds =
      absl::ToInt64Seconds(absl::Ceil(duration, absl::Seconds(1)));
  return seconds < 1 ? 1 : seconds;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(
    const EtcdOptions& options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("no etcd endpoint given");
  }
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::string> addresses;
  for (const std::string& endpoint : options.endpoints) {
    std::string address;
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        ChannelTo(endpoint, options, &address);
    if (!channel.ok()) return channel.status();
    channels.push_back(*std::move(channel));
    addresses.push_back(std::move(address));
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(
      std::move(channels), std::move(addresses), options.rpc_timeout));
}

EtcdClient::EtcdClient(std::vector<std::shared_ptr<grpc::Channel>> channels,
                       std::vector<std::string> endpoints,
                       absl::Duration rpc_timeout)
    : channels_(std::move(channels)),
      endpoints_(std::move(endpoints)),
      rpc_timeout_(rpc_timeout) {}

EtcdClient::~EtcdClient() = default;

std::shared_ptr<grpc::Channel> EtcdClient::Current(std::string* endpoint) {
  absl::MutexLock lock(&mu_);
  *endpoint = endpoints_[current_];
  return channels_[current_];
}

absl::Status EtcdClient::Note(const absl::Status& status,
                              const std::string& endpoint) {
  if (status.ok()) return status;
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    absl::MutexLock lock(&mu_);
    if (endpoints_[current_] == endpoint) {
      current_ = (current_ + 1) % endpoints_.size();
    }
  }
  return absl::Status(status.code(), absl::StrCat("etcd at ", endpoint, ": ",
                                                  status.message()));
}

absl::StatusOr<std::pair<int64_t, absl::Duration>> EtcdClient::GrantLease(
    absl::Duration ttl) {
  std::string endpoint;
  auto lease = etcdserverpb::Lease::NewStub(Current(&endpoint));
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(rpc_timeout_));
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(Seconds(ttl));
  etcdserverpb::LeaseGrantResponse response;
  absl::Status granted =
      Note(FromGrpcStatus(lease->LeaseGrant(&context, request, &response)),
           endpoint);
  if (!granted.ok()) return granted;
  if (!response.error().empty()) {
    return absl::UnavailableError(
        absl::StrCat("etcd refused a lease: ", response.error()));
  }
  return std::make_pair(int64_t{response.id()}, absl::Seconds(response.ttl()));
}

absl::StatusOr<absl::Duration> EtcdClient::KeepAlive(int64_t id) {
  std::string endpoint;
  auto lease = etcdserverpb::Lease::NewStub(Current(&endpoint));
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(rpc_timeout_));
  auto stream = lease->LeaseKeepAlive(&context);
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(id);
  etcdserverpb::LeaseKeepAliveResponse response;
  const bool answered = stream->Write(request) && stream->Read(&response);
  stream->WritesDone();
  if (!answered) {
    // The stream ended: Finish() says why (a cancel here would hide it,
    // and with it the move to another endpoint).
    grpc::Status ended = stream->Finish();
    return Note(ended.ok() ? absl::UnavailableError("keep-alive unanswered")
                           : FromGrpcStatus(ended),
                endpoint);
  }
  context.TryCancel();
  stream->Finish();
  if (response.ttl() <= 0) {
    return absl::NotFoundError(absl::StrCat("etcd lease ", id, " expired"));
  }
  return absl::Seconds(response.ttl());
}

absl::Status EtcdClient::RevokeLease(int64_t id) {
  std::string endpoint;
  auto lease = etcdserverpb::Lease::NewStub(Current(&endpoint));
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(rpc_timeout_));
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(id);
  etcdserverpb::LeaseRevokeResponse response;
  return Note(FromGrpcStatus(lease->LeaseRevoke(&context, request, &response)),
              endpoint);
}

absl::StatusOr<EtcdCreate> EtcdClient::CreateIfAbsent(const std::string& key,
                                                      const std::string& value,
                                                      int64_t lease) {
  std::string endpoint;
  auto kv = etcdserverpb::KV::NewStub(Current(&endpoint));
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(rpc_timeout_));
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* absent = request.add_compare();
  absent->set_key(key);
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  request.add_success()->mutable_request_range()->set_key(key);
  request.add_failure()->mutable_request_range()->set_key(key);
  etcdserverpb::TxnResponse response;
  absl::Status done =
      Note(FromGrpcStatus(kv->Txn(&context, request, &response)), endpoint);
  if (!done.ok()) return done;
  EtcdCreate created;
  created.created = response.succeeded();
  created.revision = response.header().revision();
  for (const etcdserverpb::ResponseOp& op : response.responses()) {
    if (op.has_response_range() && op.response_range().kvs_size() > 0) {
      const etcdserverpb::KeyValue& held = op.response_range().kvs(0);
      created.current.value = held.value();
      created.current.create_revision = held.create_revision();
      created.current.lease = held.lease();
    }
  }
  return created;
}

absl::Status EtcdClient::FencedWrite(const std::string& fence_key,
                                     int64_t fence_revision,
                                     const std::vector<EtcdWrite>& writes) {
  std::string endpoint;
  auto kv = etcdserverpb::KV::NewStub(Current(&endpoint));
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(rpc_timeout_));
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* fence = request.add_compare();
  fence->set_key(fence_key);
  fence->set_target(etcdserverpb::Compare::CREATE);
  fence->set_result(etcdserverpb::Compare::EQUAL);
  fence->set_create_revision(fence_revision);
  for (const EtcdWrite& write : writes) {
    etcdserverpb::RequestOp* op = request.add_success();
    if (write.value.has_value()) {
      op->mutable_request_put()->set_key(write.key);
      op->mutable_request_put()->set_value(*write.value);
    } else {
      op->mutable_request_delete_range()->set_key(write.key);
    }
  }
  etcdserverpb::TxnResponse response;
  absl::Status done =
      Note(FromGrpcStatus(kv->Txn(&context, request, &response)), endpoint);
  if (!done.ok()) return done;
  if (!response.succeeded()) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd key ", fence_key,
                     " is no longer the one this leader created "
                     "(revision ",
                     fence_revision, "): another coordinator leads"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>>
EtcdClient::List(const std::string& prefix) {
  std::string endpoint;
  auto kv = etcdserverpb::KV::NewStub(Current(&endpoint));
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(rpc_timeout_));
  etcdserverpb::RangeRequest request;
  request.set_key(prefix);
  // Every key with the prefix: up to the prefix with its last byte raised.
  std::string end = prefix;
  while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) {
    end.pop_back();
  }
  if (end.empty()) {
    end.assign(1, '\0');
  } else {
    end.back() = static_cast<char>(end.back() + 1);
  }
  request.set_range_end(end);
  etcdserverpb::RangeResponse response;
  absl::Status read =
      Note(FromGrpcStatus(kv->Range(&context, request, &response)), endpoint);
  if (!read.ok()) return read;
  std::vector<std::pair<std::string, std::string>> found;
  for (const etcdserverpb::KeyValue& held : response.kvs()) {
    found.emplace_back(held.key(), held.value());
  }
  return found;
}

absl::StatusOr<EtcdValue> EtcdClient::Get(const std::string& key) {
  std::string endpoint;
  auto kv = etcdserverpb::KV::NewStub(Current(&endpoint));
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(rpc_timeout_));
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  etcdserverpb::RangeResponse response;
  absl::Status read =
      Note(FromGrpcStatus(kv->Range(&context, request, &response)), endpoint);
  if (!read.ok()) return read;
  if (response.kvs_size() == 0) {
    return absl::NotFoundError(absl::StrCat("no key ", key));
  }
  EtcdValue value;
  value.value = response.kvs(0).value();
  value.create_revision = response.kvs(0).create_revision();
  value.lease = response.kvs(0).lease();
  return value;
}

absl::Status EtcdClient::WaitForChange(const std::string& key, int64_t after,
                                       absl::Time deadline) {
  std::string endpoint;
  auto watch = etcdserverpb::Watch::NewStub(Current(&endpoint));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  {
    absl::MutexLock lock(&mu_);
    if (waits_cancelled_) return absl::CancelledError("stopping");
    waits_.insert(&context);
  }
  absl::Cleanup forget = [this, &context] {
    absl::MutexLock lock(&mu_);
    waits_.erase(&context);
  };
  auto stream = watch->Watch(&context);
  etcdserverpb::WatchRequest request;
  request.mutable_create_request()->set_key(key);
  request.mutable_create_request()->set_start_revision(after + 1);
  if (!stream->Write(request)) {
    return Note(FromGrpcStatus(stream->Finish()), endpoint);
  }
  etcdserverpb::WatchResponse response;
  bool changed = false;
  while (!changed && stream->Read(&response)) {
    // A canceled watch (its revision was compacted) may have missed the
    // change: the caller looks again.
    changed = response.events_size() > 0 || response.canceled();
  }
  if (changed) {
    context.TryCancel();
    stream->Finish();
    return absl::OkStatus();
  }
  const grpc::Status ended = stream->Finish();
  {
    absl::MutexLock lock(&mu_);
    if (waits_cancelled_) return absl::CancelledError("stopping");
  }
  if (ended.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::DeadlineExceededError(
        absl::StrCat(key, " did not change in time"));
  }
  return Note(ended.ok() ? absl::UnavailableError("the watch ended")
                         : FromGrpcStatus(ended),
              endpoint);
}

void EtcdClient::CancelWaits() {
  absl::MutexLock lock(&mu_);
  waits_cancelled_ = true;
  for (grpc::ClientContext* wait : waits_) wait->TryCancel();
}

}  // namespace chorus
