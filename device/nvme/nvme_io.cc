#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "device/nvme/nvme_device_internal.h"
#include "logging/log.h"

namespace tpushim::nvme_internal {

size_t NvmeDevice::Submit(DmaDirection direction,
                          absl::Span<const DmaDescriptor> descriptors) {
  const int dir = static_cast<int>(direction);
  if (dir < 0 || dir >= kDmaDirectionCount || descriptors.empty()) return 0;
  Queue& q = *queues_[dir];
  bool wake = false;
  size_t accepted = 0;
  {
    MutexLock lock(&q.mu);
    if (q.shutdown) return 0;
    accepted = std::min(q.free_slots.size(), descriptors.size());
    for (size_t i = 0; i < accepted; ++i) {
      const uint32_t slot = q.free_slots.back();
      q.free_slots.pop_back();
      q.slots[slot] = Pending{};
      q.slots[slot].d = descriptors[i];
      q.slots[slot].queued = true;
      q.to_issue.push_back(slot);
    }
    q.in_flight.fetch_add(static_cast<uint32_t>(accepted),
                          std::memory_order_acq_rel);
    Issue(q);
    // Failed-at-start descriptors complete on the worker, and a polling
    // worker sleeps while nothing is outstanding.
    wake = q.idle || !q.done.empty();
    q.idle = false;
  }
  if (wake && accepted > 0) (void)os_->SignalEventFd(q.wake_fd);
  return accepted;
}

void NvmeDevice::Fail(Pending& p, absl::Status status) {
  if (p.status.ok()) p.status = std::move(status);
  p.issued = p.d.length;  // issue nothing more for it
}

absl::Status NvmeDevice::Start(Queue& q, Pending& p) {
  const DmaDescriptor& d = p.d;
  if (broken_set_.load(std::memory_order_acquire)) return Unusable();
  const uint64_t block = id_.block_bytes;
  const bool d2d = q.direction == DmaDirection::kDeviceToDevice;
  if (d.length == 0 || d.length % block != 0 || d.device_address % block != 0 ||
      (d2d && d.peer_address % block != 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s moves whole %d-byte logical blocks: descriptor 0x%x has length %d "
        "at device address 0x%x%s; device addresses and lengths must be "
        "multiples of %d",
        info_.name, block, d.user_data, d.length, d.device_address,
        d2d ? absl::StrFormat(" to 0x%x", d.peer_address) : "", block));
  }
  const uint64_t ns_bytes = info_.hbm_bytes;
  for (uint64_t address : {d.device_address, d2d ? d.peer_address : 0}) {
    if (address > ns_bytes || d.length > ns_bytes - address) {
      return absl::OutOfRangeError(absl::StrFormat(
          "DMA fault on %s: [0x%x, +%d) lies outside device memory of %d "
          "bytes",
          info_.name, address, d.length, ns_bytes));
    }
  }
  if (d2d) {
    if (d.peer_device != static_cast<uint32_t>(info_.id)) {
      return absl::InvalidArgumentError(
          absl::StrCat(info_.name,
                       " copies device to device only within itself, not to "
                       "device ",
                       d.peer_device));
    }
    p.overlapping = d.peer_address != d.device_address &&
                    d.peer_address < d.device_address + d.length &&
                    d.device_address < d.peer_address + d.length;
    p.from_end = d.peer_address > d.device_address;
    return absl::OkStatus();
  }
  TPUSHIM_ASSIGN_OR_RETURN(
      const HostWindowTable<Mapping>::Window w,
      windows_.Find(d.host_window, d.host_offset, d.length));
  if (w.extra.usable != nullptr &&
      d.host_offset + d.length >
          w.extra.usable->load(std::memory_order_acquire)) {
    return absl::OutOfRangeError(absl::StrFormat(
        "%s: descriptor 0x%x reaches host window byte %d, beyond the %d "
        "bytes of the window mapped for DMA so far",
        info_.name, d.user_data, d.host_offset + d.length,
        w.extra.usable->load(std::memory_order_acquire)));
  }
  p.host_iova = w.extra.iova + d.host_offset;
  if (p.host_iova % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s DMAs host memory at 4-byte aligned addresses (NVMe PRP entries "
        "are dword aligned): descriptor 0x%x starts at host address %p",
        info_.name, d.user_data, w.base + d.host_offset));
  }
  return absl::OkStatus();
}

uint64_t NvmeDevice::BuildPrp(Queue& q, uint16_t cid, uint64_t iova,
                              uint64_t bytes, uint64_t* prp2) {
  const uint64_t first = kPage - (iova % kPage);
  if (bytes <= first) {
    *prp2 = 0;
  } else if (bytes <= first + kPage) {
    *prp2 = iova + first;
  } else {
    auto* list = reinterpret_cast<uint64_t*>(q.prp_lists + cid * kPage);
    uint64_t page = iova + first;
    size_t n = 0;
    for (uint64_t covered = first; covered < bytes; covered += kPage) {
      list[n++] = page;
      page += kPage;
    }
    *prp2 = q.prp_lists_iova + cid * kPage;
  }
  return iova;
}

void NvmeDevice::WriteCommand(Queue& q, uint16_t cid, const Sqe& sqe) {
  Sqe entry = sqe;
  entry.cdw0 = (entry.cdw0 & 0xffff) | (uint32_t{cid} << 16);
  entry.nsid = kNamespace;
  q.sq[q.sq_tail] = entry;
  q.sq_tail = (q.sq_tail + 1) % q.depth;
  q.commands[cid].issued_ns = os_->MonotonicNanos();
  ++q.outstanding;
}

bool NvmeDevice::IssueOne(Queue& q, uint32_t slot) {
  Pending& p = q.slots[slot];
  const DmaDescriptor& d = p.d;
  if (!p.started) {
    p.started = true;
    p.start_ns = os_->MonotonicNanos();
    absl::Status valid = Start(q, p);
    if (valid.ok() && faults_ != nullptr) {
      valid = faults_->Check(FaultPoint::kDma, [&] {
        return absl::InternalError(absl::StrFormat(
            "DMA error on %s (%s): descriptor 0x%x of %d bytes did not "
            "complete",
            info_.name, DmaDirectionName(d.direction), d.user_data, d.length));
      });
      // Logged as the controller's own DMA errors are.
      if (!valid.ok()) LOG(ERROR) << valid;
    }
    if (!valid.ok()) Fail(p, std::move(valid));
  }
  if (p.issued < d.length && broken_set_.load(std::memory_order_acquire)) {
    // Started before the controller failed: issue nothing more.
    Fail(p, Unusable());
  }
  if (p.issued >= d.length) return false;
  // An overlapping copy: the next command once this one has completed
  // (a controller may run commands in any order).
  if (p.overlapping && p.outstanding > 0) return false;
  const bool d2d = q.direction == DmaDirection::kDeviceToDevice;
  const uint64_t block = id_.block_bytes;
  uint64_t max = id_.max_command_bytes;
  if (d2d && use_copy_) {
    max = std::min<uint64_t>(max, uint64_t{id_.copy_max_blocks} * block);
    if (p.overlapping) {
      // Whole blocks apart: both addresses are block-aligned.
      const uint64_t gap = d.peer_address > d.device_address
                               ? d.peer_address - d.device_address
                               : d.device_address - d.peer_address;
      max = std::min(max, gap);
    }
  }
  const uint64_t n = std::min(max, d.length - p.issued);
  // Where in the descriptor this command starts.
  const uint64_t at =
      p.from_end && p.overlapping ? d.length - p.issued - n : p.issued;
  const uint16_t cid = q.free_cids.back();
  Command& c = q.commands[cid];
  c = Command{};
  c.slot = slot;
  c.lba = (d.device_address + at) / block;
  c.blocks = static_cast<uint32_t>(n / block);
  Sqe sqe;
  sqe.cdw12 = c.blocks - 1;
  if (d2d && use_copy_) {
    auto* range =
        reinterpret_cast<CopyRange*>(q.prp_lists + uint64_t{cid} * kPage);
    *range = CopyRange{};
    range->slba = c.lba;
    range->nlb = static_cast<uint16_t>(c.blocks - 1);
    c.dest_lba = (d.peer_address + at) / block;
    sqe.cdw0 = kNvmCopy;
    sqe.prp1 = q.prp_lists_iova + uint64_t{cid} * kPage;
    sqe.cdw10 = static_cast<uint32_t>(c.dest_lba);
    sqe.cdw11 = static_cast<uint32_t>(c.dest_lba >> 32);
    sqe.cdw12 = 0;  // one range, format 0
  } else {
    uint64_t iova;
    if (d2d) {
      if (q.free_bounce.empty()) return false;
      c.stage = Stage::kBounceRead;
      c.bounce = q.free_bounce.back();
      q.free_bounce.pop_back();
      c.dest_lba = (d.peer_address + at) / block;
      iova = bounce_iova_ + uint64_t{c.bounce} * kMaxCommandBytes;
    } else {
      iova = p.host_iova + at;
    }
    if (faults_ != nullptr) {
      absl::Status injected = faults_->Check(FaultPoint::kIommu, [&] {
        return absl::InternalError("DMA through an unmapped IOVA");
      });
      if (!injected.ok()) {
        iova = vfio_->unmapped_iova();
        c.injected = std::string(injected.message());
      }
    }
    sqe.cdw0 =
        q.direction == DmaDirection::kHostToDevice ? kNvmWrite : kNvmRead;
    sqe.prp1 = BuildPrp(q, cid, iova, n, &sqe.prp2);
    if (!c.injected.empty() && sqe.prp2 != 0) {
      // Every page at the unmapped IOVA, and a PRP list there too: the
      // controller's first DMA (the list fetch, or the data) is blocked.
      sqe.prp2 = iova;
    }
    sqe.cdw10 = static_cast<uint32_t>(c.lba);
    sqe.cdw11 = static_cast<uint32_t>(c.lba >> 32);
  }
  q.free_cids.pop_back();
  WriteCommand(q, cid, sqe);
  p.issued += n;
  ++p.outstanding;
  return true;
}

void NvmeDevice::Issue(Queue& q) {
  bool wrote = false;
  while (!q.to_issue.empty()) {
    const uint32_t slot = q.to_issue.front();
    Pending& p = q.slots[slot];
    if (q.shutdown && !p.started) {
      p.started = true;
      p.start_ns = os_->MonotonicNanos();
      Fail(p, absl::CancelledError(absl::StrCat(
                  info_.name, " shut down before the descriptor started")));
    }
    if (p.started && p.issued >= p.d.length) {
      q.to_issue.pop_front();
      p.queued = false;
      if (p.outstanding == 0) Finish(q, slot);
      continue;
    }
    if (q.outstanding >= q.max_outstanding || q.free_cids.empty()) break;
    if (!IssueOne(q, slot)) {
      // Waiting for a bounce buffer, or for an overlapping copy's command.
      if (p.issued < p.d.length) break;
      continue;
    }
    wrote = true;
  }
  if (wrote) {
    RingDoorbell(q.qid, false, q.sq_tail);
  }
}

void NvmeDevice::Finish(Queue& q, uint32_t slot) {
  Pending& p = q.slots[slot];
  // A descriptor that failed before all its commands were issued is still
  // queued (rarely: the queue is searched only then).
  if (p.queued) {
    q.to_issue.erase(std::find(q.to_issue.begin(), q.to_issue.end(), slot));
    p.queued = false;
  }
  q.done.push_back(DmaCompletion{.user_data = p.d.user_data,
                                 .status = std::move(p.status),
                                 .start_ns = p.start_ns,
                                 .end_ns = os_->MonotonicNanos()});
  q.free_slots.push_back(slot);
}

void NvmeDevice::Reap(Queue& q) {
  bool reaped = false;
  while (true) {
    volatile Cqe* entry = &q.cq[q.cq_head];
    const uint16_t status = LoadDmaField(&entry->status);
    if ((status & 1) != q.phase) break;
    DmaReadBarrier();
    const uint16_t cid = entry->command_id;
    q.cq_head = (q.cq_head + 1) % q.depth;
    if (q.cq_head == 0) q.phase ^= 1;
    reaped = true;
    if (cid >= q.depth || q.commands[cid].issued_ns == 0) {
      // Not a command that is out: an id beyond the queue, or one already
      // failed by an abort whose completion the controller posted late.
      LOG(ERROR) << info_.name << ": completion for command id " << cid
                 << ", which is not out; ignored";
      continue;
    }
    Command& c = q.commands[cid];
    Pending& p = q.slots[c.slot];
    --q.outstanding;
    const bool failed = (status >> 1) != 0;
    if (failed) {
      const char* what = c.stage == Stage::kBounceRead    ? "Read (bounce)"
                         : c.stage == Stage::kBounceWrite ? "Write (bounce)"
                         : q.direction == DmaDirection::kHostToDevice ? "Write"
                         : q.direction == DmaDirection::kDeviceToHost ? "Read"
                                                                      : "Copy";
      std::string message = absl::StrFormat(
          "NVMe %s of %d blocks at LBA %d on %s failed: %s (descriptor 0x%x)",
          what, c.blocks, c.lba, info_.name, StatusName(status), p.d.user_data);
      if (!c.injected.empty()) {
        absl::StrAppend(&message, "; the command's data pointer was IOVA 0x",
                        absl::Hex(vfio_->unmapped_iova()),
                        ", which nothing is mapped at, so the IOMMU blocked "
                        "the DMA: ",
                        c.injected);
      }
      Fail(p, absl::Status(CodeOf(status), message));
    }
    if (c.stage == Stage::kBounceRead && !failed && p.status.ok()) {
      // Second half: write the bounce buffer to the destination.
      c.stage = Stage::kBounceWrite;
      Sqe sqe;
      sqe.cdw0 = kNvmWrite;
      sqe.prp1 =
          BuildPrp(q, cid, bounce_iova_ + uint64_t{c.bounce} * kMaxCommandBytes,
                   uint64_t{c.blocks} * id_.block_bytes, &sqe.prp2);
      sqe.cdw10 = static_cast<uint32_t>(c.dest_lba);
      sqe.cdw11 = static_cast<uint32_t>(c.dest_lba >> 32);
      sqe.cdw12 = c.blocks - 1;
      c.lba = c.dest_lba;
      WriteCommand(q, cid, sqe);
      RingDoorbell(q.qid, false, q.sq_tail);
      continue;
    }
    if (c.stage != Stage::kData) q.free_bounce.push_back(c.bounce);
    c.issued_ns = 0;
    q.free_cids.push_back(cid);
    --p.outstanding;
    if (p.outstanding == 0 && p.issued >= p.d.length) {
      Finish(q, c.slot);
    }
  }
  if (reaped) RingDoorbell(q.qid, true, q.cq_head);
}

void NvmeDevice::Worker(Queue& q) {
  {
    const std::string name =
        absl::StrFormat("nvme-%s", DmaDirectionName(q.direction));
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  }
  std::vector<DmaCompletion> done;
  int64_t stuck_since = 0;
  int64_t last_health_check = os_->MonotonicNanos();
  std::vector<int> fds = {q.wake_fd};
  if (q.irq_fd >= 0) fds.push_back(q.irq_fd);
  for (;;) {
    bool stop;
    bool busy;
    {
      MutexLock lock(&q.mu);
      Reap(q);
      Issue(q);
      done.swap(q.done);
      busy = q.outstanding > 0;
      stop = q.shutdown && q.to_issue.empty() && !busy;
      if (!busy && q.to_issue.empty()) q.idle = true;
    }
    // A controller that failed, reset itself or left the bus completes
    // nothing more, and a command out past the timeout will not come back:
    // fail the commands rather than wait for ever. Checked by the clock,
    // so a queue busy completing other commands checks too.
    if (busy) {
      const int64_t now = os_->MonotonicNanos();
      if (now - last_health_check >= kHealthCheckNs) {
        last_health_check = now;
        bool shutting_down;
        {
          MutexLock lock(&q.mu);
          shutting_down = q.shutdown;
        }
        absl::Status health =
            shutting_down ? absl::OkStatus() : ControllerHealth();
        if (health.ok() && !shutting_down) health = CheckCommandAges(q);
        if (!health.ok()) {
          AbortOutstanding(q, health);
          MutexLock lock(&q.mu);
          for (DmaCompletion& c : q.done) done.push_back(std::move(c));
          q.done.clear();
          busy = q.outstanding > 0;
        }
      }
    }
    if (!done.empty()) {
      q.in_flight.fetch_sub(static_cast<uint32_t>(done.size()),
                            std::memory_order_acq_rel);
      DmaCompletionSink* sink = sink_.load(std::memory_order_acquire);
      if (sink != nullptr) sink->OnDmaComplete(q.direction, done);
      done.clear();
      continue;
    }
    if (stop) return;
    if (busy && q.irq_fd < 0) {
      // Polling: the commands in flight take microseconds to milliseconds.
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    } else {
      // With commands out, wake now and then even without an interrupt.
      (void)os_->WaitReadable(fds, busy ? 100 : -1);
      (void)os_->DrainEventFd(q.wake_fd);
      if (q.irq_fd >= 0) (void)os_->DrainEventFd(q.irq_fd);
    }
    bool shutting_down;
    {
      MutexLock lock(&q.mu);
      shutting_down = q.shutdown;
    }
    const int64_t now = os_->MonotonicNanos();
    if (!shutting_down || !busy) {
      stuck_since = 0;
      continue;
    }
    // Shutting down with commands out: give them CAP.TO, then disable the
    // controller, which aborts them (its DMA stops), and fail them.
    if (stuck_since == 0) stuck_since = now;
    if (now - stuck_since < ready_timeout_ns_) continue;
    LOG(ERROR) << info_.name << ": commands still outstanding "
               << (now - stuck_since) / 1'000'000
               << " ms into shut-down; disabling the controller";
    AbortOutstanding(
        q, absl::AbortedError(absl::StrCat(
               info_.name,
               " did not complete the command in time; the controller was "
               "disabled")));
  }
}

absl::Status NvmeDevice::Unusable() {
  MutexLock lock(&broken_mu_);
  return absl::Status(
      broken_.code(),
      absl::StrCat(info_.name, " is unusable: ", broken_.message()));
}

absl::Status NvmeDevice::ControllerHealth() {
  MutexLock lock(&broken_mu_);
  if (!broken_.ok()) return broken_;
  if (controller_disabled_.load(std::memory_order_acquire)) {
    return absl::OkStatus();
  }
  const uint32_t csts = regs().Read32(kRegCsts);
  if (csts == 0xffffffff) {
    broken_ = absl::UnavailableError(
        absl::StrCat("NVMe controller ", info_.name,
                     " reads as all ones under I/O: it is gone from the bus"));
  } else if ((csts & kCstsFatal) != 0) {
    broken_ = absl::InternalError(absl::StrCat(
        "NVMe controller ", info_.name,
        " reports a fatal status under I/O (CSTS=0x", absl::Hex(csts),
        "); close and reopen the device to reset it"));
  } else if ((csts & kCstsReady) == 0) {
    broken_ = absl::UnavailableError(absl::StrCat(
        "NVMe controller ", info_.name,
        " was reset under I/O (CSTS.RDY=0); its queues are gone; close and "
        "reopen the device"));
  }
  if (!broken_.ok()) {
    LOG(ERROR) << broken_;
    broken_set_.store(true, std::memory_order_release);
  }
  return broken_;
}

absl::Status NvmeDevice::CheckCommandAges(Queue& q) {
  const int64_t now = os_->MonotonicNanos();
  std::string late;
  {
    MutexLock lock(&q.mu);
    for (uint32_t cid = 0; cid < q.depth; ++cid) {
      const Command& c = q.commands[cid];
      if (c.issued_ns != 0 && now - c.issued_ns > command_timeout_ns_) {
        late = absl::StrFormat(
            "NVMe command %d (%d blocks at LBA %d, %s) on %s did not "
            "complete within %.1f s; the controller is being disabled to stop "
            "it: close and reopen the device",
            cid, c.blocks, c.lba, DmaDirectionName(q.direction), info_.name,
            static_cast<double>(command_timeout_ns_) / 1e9);
        break;
      }
    }
  }
  if (late.empty()) return absl::OkStatus();
  MutexLock lock(&broken_mu_);
  if (broken_.ok()) {
    broken_ = absl::DeadlineExceededError(late);
    LOG(ERROR) << broken_;
    broken_set_.store(true, std::memory_order_release);
  }
  return broken_;
}

void NvmeDevice::AbortOutstanding(Queue& q, const absl::Status& why) {
  // Until CSTS.RDY reads 0 the controller may still be moving data: only
  // then are the commands' buffers, bounce slots included, free again.
  const bool stopped = AbortController();
  MutexLock lock(&q.mu);
  // Completions the controller posted before it stopped are real: take
  // them first, so that only the commands still out are failed (and no
  // command id is freed twice).
  Reap(q);
  for (uint32_t cid = 0; cid < q.depth; ++cid) {
    if (std::find(q.free_cids.begin(), q.free_cids.end(), cid) !=
        q.free_cids.end()) {
      continue;
    }
    Command& c = q.commands[cid];
    Pending& p = q.slots[c.slot];
    Fail(p, absl::Status(
                why.code(),
                absl::StrCat(why.message(),
                             stopped ? ""
                                     : "; the controller did not confirm it "
                                       "stopped (CSTS.RDY stayed 1, or it is "
                                       "gone) within "
                                       "CAP.TO")));
    // A controller that did not stop may still write a bounce slot: it
    // stays out of use until the function is reset at close.
    if (c.stage != Stage::kData && stopped) q.free_bounce.push_back(c.bounce);
    c.issued_ns = 0;
    q.free_cids.push_back(static_cast<uint16_t>(cid));
    --q.outstanding;
    if (--p.outstanding == 0) Finish(q, c.slot);
  }
}

bool NvmeDevice::AbortController() {
  MutexLock lock(&abort_mu_);
  if (!abort_stopped_.has_value()) {
    regs().Write32(kRegCc, regs().Read32(kRegCc) & ~kCcEnable);
    controller_disabled_.store(true, std::memory_order_release);
    const absl::Status stopped =
        WaitReady(false, "aborting commands that never completed");
    if (!stopped.ok()) LOG(ERROR) << stopped;
    abort_stopped_ = stopped.ok();
  }
  return *abort_stopped_;
}

void NvmeDevice::Shutdown() {
  {
    MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  for (auto& q : queues_) {
    {
      MutexLock lock(&q->mu);
      q->shutdown = true;
    }
    if (q->wake_fd >= 0) (void)os_->SignalEventFd(q->wake_fd);
  }
  for (auto& q : queues_) {
    if (q->worker.joinable()) q->worker.join();
  }
}

}  // namespace tpushim::nvme_internal
