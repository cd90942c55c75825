#include "router/worker_pool.h"

#include <xxhash.h>

#include <algorithm>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "common/kv/kv_cache.h"
#include "common/util/logging.h"
#include "common/util/net.h"

namespace pdserve {
namespace {

// A healthy worker whose health/status polls time out stays routable until
// its polls have timed out for this long (and at least 3 in a row): on a
// CPU-bound worker (one core busy with long prefills, or a machine running
// more than it has cores) the answer can be seconds late without anything
// being wrong. A refused connection, NOT_SERVING or draining counts at once,
// so a dead (killed) worker is still dropped on the first poll; a hung one
// after this grace.
constexpr int kTimeoutsBeforeUnhealthy = 3;
constexpr absl::Duration kLateAnswerGrace = absl::Seconds(10);

std::shared_ptr<WorkerEndpoint> MakeEndpoint(
    const std::string& address,
    const std::shared_ptr<grpc::ChannelCredentials>& creds) {
  auto ep = std::make_shared<WorkerEndpoint>();
  ep->address = address;
  ep->channel = MakeChannel(address, creds);
  ep->prefill = pb::Prefill::NewStub(ep->channel);
  ep->decode = pb::Decode::NewStub(ep->channel);
  ep->worker = pb::Worker::NewStub(ep->channel);
  return ep;
}

const char* PoolName(PoolKind kind) {
  return kind == PoolKind::kPrefill ? "prefill" : "decode";
}

}  // namespace

void WorkerPool::ExportHealth(const std::string& address, bool healthy) {
  if (options_.metrics != nullptr) {
    options_.metrics->SetWorkerHealthy(PoolName(options_.kind), address,
                                       healthy);
  }
}

void WorkerPool::PollEndpoint(WorkerEndpoint& ep) {
  const absl::Time poll_start = absl::Now();
  absl::Status health = CheckHealth(*ep.channel, absl::Milliseconds(1000));
  pb::WorkerStatusResponse status;
  if (health.ok()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Milliseconds(1000)));
    health = FromGrpcStatus(
        ep.worker->Status(&ctx, pb::WorkerStatusRequest(), &status));
  }
  if (health.ok() && status.draining()) {
    health = absl::UnavailableError("draining");
  }
  absl::MutexLock lock(&ep.mu);
  if (health.code() == absl::StatusCode::kDeadlineExceeded && ep.healthy) {
    if (ep.consecutive_timeouts++ == 0) ep.late_since = poll_start;
  }
  if (health.code() == absl::StatusCode::kDeadlineExceeded && ep.healthy &&
      (ep.consecutive_timeouts < kTimeoutsBeforeUnhealthy ||
       absl::Now() - ep.late_since < kLateAnswerGrace)) {
    PDSERVE_LOG_DEBUG("worker %s answered late (%d in a row): %s", ep.address,
                      ep.consecutive_timeouts, health.message());
    return;
  }
  ep.consecutive_timeouts = 0;
  if (health.ok() != ep.healthy) {
    PDSERVE_LOG_INFO(
        "worker %s is now %s%s", ep.address,
        health.ok() ? "healthy" : "unhealthy",
        health.ok() ? "" : absl::StrCat(" (", health.message(), ")"));
  }
  ep.healthy = health.ok();
  ep.last_error = health.ok() ? "" : std::string(health.message());
  if (health.ok()) ep.status = std::move(status);
  ExportHealth(ep.address, ep.healthy);
}

WorkerPool::WorkerPool(WorkerPoolOptions options)
    : options_(std::move(options)) {
  Resolve();
  thread_ = std::thread([this] { Loop(); });
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

absl::Status CheckWorkerTargets(absl::string_view flag,
                                const std::vector<std::string>& targets) {
  for (const std::string& t : targets) {
    absl::string_view address = t;
    absl::ConsumePrefix(&address, "dns:///");
    absl::StatusOr<HostPort> hp = ParseHostPort(address);
    if (!hp.ok() || hp->host.empty() || hp->port == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, ": '", t,
          "' is not HOST:PORT or dns:///NAME:PORT (port 1 to 65535)"));
    }
  }
  return absl::OkStatus();
}

void WorkerPool::Resolve() {
  std::set<std::string> addresses;
  bool any_dns_failed = false;
  for (const std::string& t : options_.targets) {
    if (absl::StartsWith(t, "dns:///")) {
      auto hp = ParseHostPort(t.substr(7));
      if (!hp.ok()) {
        PDSERVE_LOG_WARNING("bad worker target %s: %s", t,
                            hp.status().ToString());
        continue;
      }
      auto ips = ResolveHost(hp->host);
      if (!ips.ok()) {
        any_dns_failed = true;
        PDSERVE_LOG_WARNING("%s", ips.status().ToString());
        continue;
      }
      for (const std::string& ip : *ips)
        addresses.insert(JoinHostPort(ip, hp->port));
    } else if (!t.empty()) {
      addresses.insert(t);
    }
  }
  absl::MutexLock lock(&mu_);
  for (const std::string& a : addresses) {
    if (endpoints_.count(a) == 0) {
      endpoints_[a] = MakeEndpoint(a, options_.creds);
      ExportHealth(a, false);  // until its first health check passes
    }
  }
  // A name that failed to resolve keeps its previous endpoints.
  if (!any_dns_failed) {
    for (auto it = endpoints_.begin(); it != endpoints_.end();) {
      if (addresses.count(it->first) == 0) {
        PDSERVE_LOG_INFO("worker %s left the pool", it->first);
        if (options_.metrics != nullptr) {
          options_.metrics->RemoveWorker(PoolName(options_.kind), it->first);
        }
        it = endpoints_.erase(it);
      } else {
        ++it;
      }
    }
  }
  next_resolve_ = absl::Now() + options_.dns_refresh;
}

void WorkerPool::PollOnce() {
  bool resolve;
  {
    absl::MutexLock lock(&mu_);
    resolve = absl::Now() >= next_resolve_;
  }
  if (resolve) Resolve();
  for (const auto& ep : Endpoints()) PollEndpoint(*ep);
}

void WorkerPool::Loop() {
  while (true) {
    PollOnce();
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.poll_interval);
    if (stop_) return;
  }
}

std::vector<std::shared_ptr<WorkerEndpoint>> WorkerPool::Endpoints() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<WorkerEndpoint>> out;
  for (const auto& [a, ep] : endpoints_) out.push_back(ep);
  return out;
}

int WorkerPool::healthy_count() const {
  int n = 0;
  for (const auto& ep : Endpoints()) {
    absl::MutexLock lock(&ep->mu);
    n += ep->healthy ? 1 : 0;
  }
  return n;
}

int64_t WorkerPool::RequestCapacity() const {
  int64_t total = 0;  // > 0 once a healthy worker is counted
  for (const auto& ep : Endpoints()) {
    absl::MutexLock lock(&ep->mu);
    if (!ep->healthy || ep->status.draining()) continue;
    const int32_t capacity = ep->status.request_capacity();
    if (capacity <= 0) {  // unbounded, or not reported yet
      last_capacity_.store(0);
      return 0;
    }
    total += capacity;
  }
  if (total == 0) return last_capacity_.load();  // none healthy
  last_capacity_.store(total);
  return total;
}

void WorkerPool::ReportFailure(const std::string& address,
                               const std::string& error) {
  absl::MutexLock lock(&mu_);
  auto it = endpoints_.find(address);
  if (it == endpoints_.end()) return;
  absl::MutexLock elock(&it->second->mu);
  it->second->healthy = false;
  it->second->last_error = error;
  ExportHealth(address, false);
}

std::optional<uint64_t> PrefixAffinityKey(absl::Span<const int32_t> prompt,
                                          int block_size, int max_blocks) {
  if (block_size <= 0 || max_blocks <= 0 || prompt.empty()) return std::nullopt;
  const int64_t blocks = std::min<int64_t>(
      max_blocks, (static_cast<int64_t>(prompt.size()) - 1) / block_size);
  if (blocks <= 0) return std::nullopt;
  return XXH3_64bits(prompt.data(), static_cast<size_t>(blocks * block_size) *
                                        sizeof(int32_t));
}

absl::StatusOr<std::shared_ptr<WorkerEndpoint>> WorkerPool::Pick(
    const std::set<std::string>& exclude, const PickHint& hint) const {
  std::vector<std::pair<double, std::shared_ptr<WorkerEndpoint>>> candidates;
  std::shared_ptr<WorkerEndpoint> best;
  double best_score = std::numeric_limits<double>::infinity();
  std::string errors;
  bool any_unhealthy = false;
  // The largest pool of the healthy endpoints too small for the request.
  absl::Status too_small;
  int64_t too_small_tokens = -1;
  for (const auto& ep : Endpoints()) {
    if (exclude.count(ep->address) > 0) continue;
    absl::MutexLock lock(&ep->mu);
    if (!ep->healthy) {
      any_unhealthy = true;
      absl::StrAppend(
          &errors, errors.empty() ? "" : "; ", ep->address, ": ",
          ep->last_error.empty() ? "not checked yet" : ep->last_error);
      continue;
    }
    const int block_size = ep->status.kv_block_size();
    if (hint.request_tokens > 0 && block_size > 0) {
      const int64_t total = ep->status.total_kv_blocks();
      absl::Status fits =
          CheckRequestFitsPool(hint.request_tokens, block_size, total,
                               options_.kind == PoolKind::kDecode
                                   ? "the largest healthy decode worker's"
                                   : "the largest healthy prefill worker's");
      if (!fits.ok()) {
        if (total * block_size > too_small_tokens) {
          too_small_tokens = total * block_size;
          too_small = std::move(fits);
        }
        continue;
      }
    }
    const int local = ep->in_flight.load();
    double score;
    if (options_.kind == PoolKind::kDecode) {
      // Fewest sequences (polled + sent since), then most free KV.
      const double total = std::max<int64_t>(1, ep->status.total_kv_blocks());
      score = ep->status.running() + ep->status.waiting() + local -
              ep->status.free_kv_blocks() / total;
    } else {
      score = ep->status.queue_depth() + local;
    }
    candidates.emplace_back(score, ep);
    if (score < best_score) {
      best_score = score;
      best = ep;
    }
  }
  if (best != nullptr && hint.affinity.has_value()) {
    // Rendezvous: the highest hash(key, endpoint) among those not too busy.
    uint64_t best_weight = 0;
    std::shared_ptr<WorkerEndpoint> affine;
    for (const auto& [score, ep] : candidates) {
      if (score > best_score + hint.max_extra_load) continue;
      const uint64_t weight = XXH3_64bits_withSeed(
          ep->address.data(), ep->address.size(), *hint.affinity);
      if (affine == nullptr || weight > best_weight) {
        best_weight = weight;
        affine = ep;
      }
    }
    best = affine;
  }
  if (best == nullptr && !too_small.ok() && !any_unhealthy) return too_small;
  if (best == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "no healthy ",
        options_.kind == PoolKind::kDecode ? "decode" : "prefill", " worker",
        errors.empty() ? "" : absl::StrCat(" (", errors, ")")));
  }
  return best;
}

}  // namespace pdserve
