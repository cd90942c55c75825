// UcxWorker's tagged sends and receives (the rest of the worker is in
// ucx_worker.cc and ucx_memory.cc).
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/transport/ucx_worker.h"
#include "common/transport/ucx_worker_internal.h"

namespace pdserve::transport {
namespace {

using OpRef = std::shared_ptr<UcxOpState>;

// UCX's completion callbacks (they may run in any thread that progresses
// the worker). `user_data` is a heap reference to the operation, dropped
// here.
void SendDone(void*, ucs_status_t status, void* user_data) {
  std::unique_ptr<OpRef> ref(static_cast<OpRef*>(user_data));
  (*ref)->Completed();
  (*ref)->Finish(status, 0);
}

void RecvDone(void*, ucs_status_t status, const ucp_tag_recv_info_t* info,
              void* user_data) {
  std::unique_ptr<OpRef> ref(static_cast<OpRef*>(user_data));
  (*ref)->Completed();
  (*ref)->Finish(status, info != nullptr && status == UCS_OK
                             ? static_cast<int64_t>(info->length)
                             : 0);
}

// After posting: records the request, or completes the operation at once
// (no callback will come then).
void Posted(ucs_status_ptr_t r, const OpRef& op, OpRef* heap_ref,
            int64_t immediate_length) {
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
    op->request = r;  // the callback owns heap_ref
    return;
  }
  std::unique_ptr<OpRef> drop(heap_ref);
  op->Completed();
  op->Finish(r == nullptr ? UCS_OK : UCS_PTR_STATUS(r), immediate_length);
}

bool InRegion(const UcxRegion& region, int64_t offset, int64_t bytes) {
  return offset >= 0 && bytes >= 0 && offset <= region.size() &&
         bytes <= region.size() - offset;
}

}  // namespace

bool UcxSendOp::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&op_->mu);
  while (!op_->done && absl::Now() < deadline) {
    op_->mu.AwaitWithTimeout(
        absl::Condition(&op_->done),
        std::min(deadline - absl::Now(), absl::Milliseconds(20)));
  }
  return op_->done;
}

absl::Status UcxSendOp::status() const {
  absl::MutexLock lock(&op_->mu);
  if (!op_->done) return absl::UnavailableError("UCX send in flight");
  if (op_->status == UCS_OK) return absl::OkStatus();
  return UcxError("UCX send to the decode worker", op_->status);
}

void UcxSendOp::Abandon() {
  absl::MutexLock lock(&op_->mu);
  if (op_->done || op_->abandoned.exchange(true)) return;
  op_->abandoned_count->fetch_add(1);
}

unsigned UcxWorker::Progress() {
  absl::MutexLock lock(&progress_mu_);
  return ucp_worker_progress(static_cast<ucp_worker_h>(worker_));
}

void UcxWorker::CancelRequest(UcxOpState& op) {
  {
    // Under progress_mu_: UCX 1.13's ucp_request_cancel tests whether a
    // receive is still expected before it takes the worker lock, so a
    // cancel beside a progress call that matched the receive removed it
    // from the expected queue twice (SIGSEGV in ucp_tag_exp_remove, seen
    // in InputTest with UCX_TLS=tcp). Not under op.mu: UCX may complete it
    // (callback) inside the call.
    absl::MutexLock lock(&progress_mu_);
    ucp_request_cancel(static_cast<ucp_worker_h>(worker_), op.request);
  }
  Wake();
}

void UcxWorker::Drive(UcxOpState& op) {
  // Over shared memory the rendezvous (and its single CMA copy) happens in
  // the next progress calls; leaving that to the progress thread would cost
  // two thread hand-offs per message. Over a network the message is not
  // there yet: the progress thread completes it.
  for (int i = 0; i < kInlineProgress && !op.Done(); ++i) {
    if (Progress() == 0 && i >= kInlineProgress / 2) break;
  }
  if (!op.Done()) Wake();
}

absl::StatusOr<UcxSendOp> UcxWorker::Send(UcxConnection& connection,
                                          const UcxRegion& region,
                                          int64_t offset, int64_t bytes,
                                          uint64_t tag) {
  if (!InRegion(region, offset, bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("UCX send of ", bytes, " bytes at ", offset,
                     " outside a region of ", region.size()));
  }
  auto op = std::make_shared<UcxOpState>();
  op->in_flight = &counters_.ops_in_flight;
  op->abandoned_count = &counters_.ops_abandoned;
  {
    UcxEndpointState& ep = *connection.ep_;
    absl::MutexLock lock(&ep.mu);
    if (ep.ep == nullptr) {
      return absl::UnavailableError(
          "UCX endpoint to the decode worker is closed");
    }
    auto heap_ref = std::make_unique<OpRef>(op);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_MEMH;
    p.cb.send = &SendDone;
    p.user_data = heap_ref.get();
    p.memh = static_cast<ucp_mem_h>(region.memh());
    counters_.ops_in_flight.fetch_add(1);
    ucs_status_ptr_t r = ucp_tag_send_nbx(ep.ep, region.data() + offset,
                                          static_cast<size_t>(bytes), tag, &p);
    Posted(r, op, heap_ref.release(), 0);
  }
  if (!op->Done()) Drive(*op);
  UcxSendOp out;
  out.worker_ = this;
  out.op_ = std::move(op);
  return out;
}

absl::StatusOr<int64_t> UcxWorker::Receive(
    UcxRegion& region, int64_t offset, int64_t bytes, uint64_t tag,
    const std::function<bool()>& cancelled) {
  auto op = PostReceive(region, offset, bytes, tag);
  if (!op.ok()) return op.status();
  return AwaitReceive(*op, cancelled);
}

absl::StatusOr<UcxRecvOp> UcxWorker::PostReceive(UcxRegion& region,
                                                 int64_t offset, int64_t bytes,
                                                 uint64_t tag) {
  if (!InRegion(region, offset, bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("UCX receive of ", bytes, " bytes at ", offset,
                     " outside a region of ", region.size()));
  }
  auto op = std::make_shared<UcxOpState>();
  op->in_flight = &counters_.ops_in_flight;
  op->abandoned_count = &counters_.ops_abandoned;
  {
    auto heap_ref = std::make_unique<OpRef>(op);
    ucp_request_param_t p{};
    // Always through the callback, which reports the message's length.
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = &RecvDone;
    p.user_data = heap_ref.get();
    p.memh = static_cast<ucp_mem_h>(region.memh());
    counters_.ops_in_flight.fetch_add(1);
    ucs_status_ptr_t r = ucp_tag_recv_nbx(
        static_cast<ucp_worker_h>(worker_), region.data() + offset,
        static_cast<size_t>(bytes), tag, ~uint64_t{0}, &p);
    Posted(r, op, heap_ref.release(), 0);
  }
  if (!op->Done()) Drive(*op);
  UcxRecvOp out;
  out.op_ = std::move(op);
  out.bytes_ = bytes;
  out.tag_ = tag;
  return out;
}

absl::StatusOr<int64_t> UcxWorker::AwaitReceive(
    UcxRecvOp& recv, const std::function<bool()>& cancelled) {
  if (!recv.posted()) {
    return absl::FailedPreconditionError("UCX receive not posted");
  }
  const std::shared_ptr<UcxOpState> op = std::move(recv.op_);
  absl::Time cancelled_at = absl::InfiniteFuture();
  bool cancel_sent = false;
  while (true) {
    {
      absl::MutexLock lock(&op->mu);
      op->mu.AwaitWithTimeout(absl::Condition(&op->done),
                              absl::Milliseconds(20));
      if (op->done) break;
    }
    if (!cancelled()) continue;
    const absl::Time now = absl::Now();
    if (cancelled_at == absl::InfiniteFuture()) cancelled_at = now;
    if (cancel_sent) {
      if (now - cancelled_at >= 10 * kCancelGrace) {
        // UCX did not end it (a rendezvous stuck on a dead peer): `region`
        // may still be written, the caller must not reuse it.
        return absl::AbortedError("UCX receive did not end after its cancel");
      }
      continue;
    }
    if (now - cancelled_at >= kCancelGrace) {
      CancelRequest(*op);
      cancel_sent = true;
    }
  }
  absl::MutexLock lock(&op->mu);
  if (op->status == UCS_OK) return op->received;
  if (op->status == UCS_ERR_CANCELED) {
    return absl::CancelledError("KV push cancelled during a UCX receive");
  }
  if (op->status == UCS_ERR_MESSAGE_TRUNCATED) {
    return absl::DataLossError(absl::StrCat("UCX message larger than the ",
                                            recv.bytes_, " bytes announced"));
  }
  return UcxError("UCX receive from the prefill worker", op->status);
}

bool UcxWorker::CancelReceive(UcxRecvOp& recv, absl::Duration timeout) {
  if (!recv.posted()) return true;
  const std::shared_ptr<UcxOpState> op = std::move(recv.op_);
  if (!op->Done()) CancelRequest(*op);
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&op->mu);
  op->mu.AwaitWithDeadline(absl::Condition(&op->done), deadline);
  return op->done;
}

void UcxWorker::DrainLater(uint64_t tag, uint64_t mask,
                           absl::Duration duration) {
  Post([this, tag, mask, duration] {
    drains_.push_back(Drainer{tag, mask, absl::Now() + duration});
  });
}

namespace {

void DrainDone(void*, ucs_status_t, const ucp_tag_recv_info_t*,
               void* user_data) {
  static_cast<std::atomic<int64_t>*>(user_data)->fetch_sub(1);
}

}  // namespace

void UcxWorker::ProcessDrains() {
  const absl::Time now = absl::Now();
  auto worker = static_cast<ucp_worker_h>(worker_);
  for (auto it = drains_.begin(); it != drains_.end();) {
    while (true) {
      ucp_tag_recv_info_t info{};
      // Peek first: the buffer may have to grow, which only happens while
      // no discarded message is still landing in it.
      ucp_tag_message_h msg =
          ucp_tag_probe_nb(worker, it->tag, it->mask, 0, &info);
      if (msg == nullptr) break;
      const int64_t need = static_cast<int64_t>(info.length);
      if (drain_buffer_ == nullptr || drain_buffer_->size() < need) {
        if (drains_in_flight_.load() > 0) break;  // next time
        drain_buffer_.reset();
        auto buffer = Allocate(std::max<int64_t>(need, 1));
        if (!buffer.ok()) break;
        drain_buffer_ = *std::move(buffer);
      }
      msg = ucp_tag_probe_nb(worker, it->tag, it->mask, 1, &info);
      if (msg == nullptr) break;
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                       UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
      p.cb.recv = &DrainDone;
      p.user_data = &drains_in_flight_;
      p.memh = static_cast<ucp_mem_h>(drain_buffer_->memh());
      drains_in_flight_.fetch_add(1);
      ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(worker, drain_buffer_->data(),
                                                info.length, msg, &p);
      if (r == nullptr || UCS_PTR_IS_ERR(r)) {
        drains_in_flight_.fetch_sub(1);
      } else {
        ucp_request_free(r);  // the callback still runs
      }
      counters_.drained.fetch_add(1);
    }
    it = now >= it->until ? drains_.erase(it) : it + 1;
  }
}

}  // namespace pdserve::transport
