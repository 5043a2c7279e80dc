#include "tests/device/fake_nvme_controller.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace tpushim::fake_vfio {
namespace {

using nvme_internal::CopyRange;
using nvme_internal::Cqe;
using nvme_internal::kPage;
using nvme_internal::Sqe;

namespace spec = nvme_internal;

// Status codes (generic command status, type 0).
constexpr uint16_t kInvalidOpcode = 0x01;
constexpr uint16_t kInvalidField = 0x02;
constexpr uint16_t kDataTransferError = 0x04;
constexpr uint16_t kInvalidNamespace = 0x0b;
constexpr uint16_t kInvalidPrpOffset = 0x13;
constexpr uint16_t kLbaOutOfRange = 0x80;
// Command-specific (type 1).
constexpr uint16_t kInvalidQueueIdentifier = (1 << 8) | 0x01;
constexpr uint16_t kCompletionQueueInvalid = (1 << 8) | 0x00;

constexpr uint32_t kAdminDoorbellSq = spec::kDoorbells;

}  // namespace

FakeNvmeController::FakeNvmeController(FakeVfioOs& os, FakeNvmeConfig config)
    : os_(os), config_(config), media_(config.blocks << config.block_shift, 0) {
  os_.OnBar0([this](uint8_t* base, uint64_t size) { Mapped(base, size); },
             [this] { Unmapping(); });
}

FakeNvmeController::~FakeNvmeController() {
  Unmapping();
  os_.OnBar0(nullptr, nullptr);
}

uint32_t FakeNvmeController::Load32(uint32_t offset) const {
  return __atomic_load_n(reinterpret_cast<uint32_t*>(bar_.load() + offset),
                         __ATOMIC_ACQUIRE);
}

void FakeNvmeController::Store32(uint32_t offset, uint32_t value) {
  __atomic_store_n(reinterpret_cast<uint32_t*>(bar_.load() + offset), value,
                   __ATOMIC_RELEASE);
}

uint64_t FakeNvmeController::Load64(uint32_t offset) const {
  return Load32(offset) | (uint64_t{Load32(offset + 4)} << 32);
}

bool FakeNvmeController::ready() const {
  return bar_.load() != nullptr && (Load32(spec::kRegCsts) & 1) != 0;
}

void FakeNvmeController::Mapped(uint8_t* base, uint64_t size) {
  if (size < spec::kDoorbells + 0x100) return;
  bar_.store(base);
  // CAP: MQES, CQR (contiguous queues required), TO, DSTRD 0, the NVM
  // command set, MPSMIN = MPSMAX = 0 (4 KiB pages).
  const uint64_t cap =
      uint64_t{config_.max_queue_entries - 1u} | (uint64_t{1} << 16) |
      (uint64_t{config_.timeout_units} << 24) | (uint64_t{1} << 37);
  Store32(spec::kRegCap, static_cast<uint32_t>(cap));
  Store32(spec::kRegCap + 4, static_cast<uint32_t>(cap >> 32));
  Store32(spec::kRegVs, 0x00010400);  // 1.4
  stop_.store(false);
  thread_ = std::thread([this] { Run(); });
}

void FakeNvmeController::Unmapping() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  thread_.join();
  unmapped_while_ready_.store(ready());
  bar_.store(nullptr);
}

void FakeNvmeController::Run() {
  while (!stop_.load()) {
    Step();
    std::this_thread::sleep_for(std::chrono::microseconds(10));
  }
}

void FakeNvmeController::Step() {
  const uint32_t cc = Load32(spec::kRegCc);
  const bool en = (cc & spec::kCcEnable) != 0;
  if (!en && (enabled_ || fatal_)) {
    Disable();
    return;
  }
  // Count what the engine publishes, even to a controller that no longer
  // works.
  for (auto& [qid, sq] : sqs_) {
    if (qid == 0) continue;
    const uint32_t tail = Load32(kAdminDoorbellSq + 8 * qid) % sq.size;
    io_submitted_.fetch_add(
        static_cast<int>((tail + sq.size - sq.seen_tail) % sq.size));
    sq.seen_tail = tail;
  }
  if (fatal_) return;
  if (en && !enabled_) Enable();
  if (!enabled_) return;
  if (((cc >> 14) & 3) != 0 && !shut_down_) {
    shut_down_ = true;
    Store32(spec::kRegCsts, Load32(spec::kRegCsts) | (2u << 2));
  }
  // Admin commands create and delete queues: walk a copy of the ids.
  std::vector<uint16_t> ids;
  for (const auto& [qid, sq] : sqs_) ids.push_back(qid);
  for (uint16_t qid : ids) {
    if (enabled_ && sqs_.contains(qid)) Fetch(qid);
  }
  ids.clear();
  for (const auto& [cqid, cq] : cqs_) ids.push_back(cqid);
  for (uint16_t cqid : ids) {
    if (cqs_.contains(cqid)) Flush(cqid);
  }
}

void FakeNvmeController::Enable() {
  if (config_.fatal_on_enable) {
    fatal_ = true;
    Store32(spec::kRegCsts, spec::kCstsFatal);
    return;
  }
  const uint32_t aqa = Load32(spec::kRegAqa);
  sqs_[0] = Submission{.base = Load64(spec::kRegAsq),
                       .size = (aqa & 0xfff) + 1,
                       .head = 0,
                       .cq = 0};
  Completion admin;
  admin.base = Load64(spec::kRegAcq);
  admin.size = ((aqa >> 16) & 0xfff) + 1;
  cqs_[0] = std::move(admin);
  enabled_ = true;
  shut_down_ = false;
  Store32(spec::kRegCsts, spec::kCstsReady);
}

void FakeNvmeController::Disable() {
  if (config_.complete_held_on_disable) {
    for (const auto& [qid, sqe] : held_commands_) {
      auto sq = sqs_.find(qid);
      if (sq == sqs_.end()) continue;
      Cqe cqe;
      cqe.command_id = static_cast<uint16_t>(sqe.cdw0 >> 16);
      cqe.sq_id = qid;
      cqe.sq_head = static_cast<uint16_t>(sq->second.head);
      Post(sq->second.cq, cqe);
    }
  }
  // A disable aborts everything: queues, held commands, posted or not.
  sqs_.clear();
  cqs_.clear();
  held_commands_.clear();
  enabled_ = false;
  fatal_ = false;
  disables_.fetch_add(1);
  if (config_.disable_delay_ms > 0) {
    std::this_thread::sleep_for(
        std::chrono::milliseconds(config_.disable_delay_ms));
  }
  Store32(spec::kRegCsts, 0);
}

void FakeNvmeController::Fetch(uint16_t qid) {
  Submission& sq = sqs_.at(qid);
  const uint32_t tail = Load32(kAdminDoorbellSq + 8 * qid);
  while (sq.head != tail % sq.size) {
    Sqe sqe;
    uint8_t* entry =
        os_.Translate(sq.base + uint64_t{sq.head} * sizeof(Sqe), sizeof(Sqe));
    if (entry == nullptr) {
      // The queue itself is unreachable: a real controller goes fatal.
      fatal_ = true;
      Store32(spec::kRegCsts, Load32(spec::kRegCsts) | spec::kCstsFatal);
      return;
    }
    std::memcpy(&sqe, entry, sizeof(sqe));
    sq.head = (sq.head + 1) % sq.size;
    Cqe cqe;
    cqe.command_id = static_cast<uint16_t>(sqe.cdw0 >> 16);
    cqe.sq_id = qid;
    cqe.sq_head = static_cast<uint16_t>(sq.head);
    uint16_t status = 0;
    if (qid == 0) {
      status = Admin(sqe, &cqe.result);
    } else {
      ++io_seen_;
      if (io_seen_ == config_.fatal_at_io) {
        fatal_ = true;
        Store32(spec::kRegCsts, Load32(spec::kRegCsts) | spec::kCstsFatal);
        return;
      }
      if (io_seen_ == config_.reset_at_io) {
        sqs_.clear();
        cqs_.clear();
        held_commands_.clear();
        enabled_ = false;
        Store32(spec::kRegCc, 0);
        Store32(spec::kRegCsts, 0);
        return;
      }
      if (config_.hold_io_from > 0 && io_seen_ >= config_.hold_io_from) {
        held_commands_.emplace_back(qid, sqe);
        held_.fetch_add(1);
        continue;
      }
      status = config_.fail_io_at == io_seen_ ? config_.fail_status : Io(sqe);
    }
    cqe.status = static_cast<uint16_t>(status << 1);
    // The admin handler may have deleted this very queue.
    const uint16_t cqid = sqs_.contains(qid) ? sqs_.at(qid).cq : 0;
    Post(qid == 0 ? 0 : cqid, cqe);
    if (!sqs_.contains(qid)) return;
  }
}

void FakeNvmeController::Post(uint16_t cqid, Cqe cqe) {
  auto it = cqs_.find(cqid);
  if (it == cqs_.end()) return;
  it->second.waiting.push_back(cqe);
  Flush(cqid);
}

void FakeNvmeController::Flush(uint16_t cqid) {
  Completion& cq = cqs_.at(cqid);
  const uint32_t head = Load32(spec::kDoorbells + 8 * cqid + 4) % cq.size;
  bool posted = false;
  while (!cq.waiting.empty() && (cq.tail + 1) % cq.size != head) {
    Cqe cqe = cq.waiting.front();
    cq.waiting.pop_front();
    auto* entry = reinterpret_cast<Cqe*>(
        os_.Translate(cq.base + uint64_t{cq.tail} * sizeof(Cqe), sizeof(Cqe)));
    if (entry == nullptr) {
      fatal_ = true;
      Store32(spec::kRegCsts, Load32(spec::kRegCsts) | spec::kCstsFatal);
      return;
    }
    entry->result = cqe.result;
    entry->sq_head = cqe.sq_head;
    entry->sq_id = cqe.sq_id;
    entry->command_id = cqe.command_id;
    // The status word (with the phase bit) last: it publishes the entry.
    __atomic_store_n(&entry->status,
                     static_cast<uint16_t>(cqe.status | cq.phase),
                     __ATOMIC_RELEASE);
    cq.tail = (cq.tail + 1) % cq.size;
    if (cq.tail == 0) cq.phase ^= 1;
    posted = true;
  }
  if (posted && cq.interrupts && os_.SignalVector(cq.vector)) {
    interrupts_.fetch_add(1);
  }
}

uint16_t FakeNvmeController::Admin(const Sqe& sqe, uint32_t* result) {
  const uint8_t opcode = sqe.cdw0 & 0xff;
  const uint16_t qid = sqe.cdw10 & 0xffff;
  const uint32_t size = (sqe.cdw10 >> 16) + 1;
  switch (opcode) {
    case spec::kAdminIdentify: {
      uint8_t* page = os_.Translate(sqe.prp1, kPage);
      if (page == nullptr) return kDataTransferError;
      std::vector<uint8_t> data(kPage, 0);
      const uint32_t cns = sqe.cdw10 & 0xff;
      if (cns == 1) {
        std::memcpy(&data[4], "FAKE0001            ", 20);
        std::memcpy(&data[24], "tpushim fake NVMe controller            ", 40);
        data[77] = config_.mdts;
        const uint16_t oncs = config_.copy ? (1u << 8) : 0;
        std::memcpy(&data[520], &oncs, sizeof(oncs));
      } else if (cns == 0) {
        if (sqe.nsid != 1) return kInvalidNamespace;
        std::memcpy(&data[0], &config_.blocks, 8);  // NSZE
        std::memcpy(&data[8], &config_.blocks, 8);  // NCAP
        data[26] = 0;                               // FLBAS: format 0
        std::memcpy(&data[74], &config_.mssrl, 2);  // MSSRL
        std::memcpy(&data[76], &config_.mcl, 4);    // MCL
        data[80] = 0;                               // MSRC: 1 range
        const uint32_t lbaf = config_.block_shift << 16;
        std::memcpy(&data[128], &lbaf, 4);
      } else {
        return kInvalidField;
      }
      std::memcpy(page, data.data(), data.size());
      return 0;
    }
    case spec::kAdminSetFeatures:
      if ((sqe.cdw10 & 0xff) != spec::kFeatureNumberOfQueues) {
        return kInvalidField;
      }
      *result = sqe.cdw11;  // grants what was asked
      return 0;
    case spec::kAdminCreateCq: {
      if (qid == 0 || cqs_.contains(qid)) return kInvalidQueueIdentifier;
      if ((sqe.cdw11 & 1) == 0 || size > config_.max_queue_entries) {
        return kInvalidField;
      }
      Completion& cq = cqs_[qid];
      cq.base = sqe.prp1;
      cq.size = size;
      cq.interrupts = (sqe.cdw11 & 2) != 0;
      cq.vector = static_cast<uint16_t>(sqe.cdw11 >> 16);
      return 0;
    }
    case spec::kAdminCreateSq: {
      const uint16_t cqid = static_cast<uint16_t>(sqe.cdw11 >> 16);
      if (qid == 0 || sqs_.contains(qid)) return kInvalidQueueIdentifier;
      if (!cqs_.contains(cqid)) return kCompletionQueueInvalid;
      if ((sqe.cdw11 & 1) == 0 || size > config_.max_queue_entries) {
        return kInvalidField;
      }
      sqs_[qid] = Submission{.base = sqe.prp1, .size = size, .cq = cqid};
      return 0;
    }
    case spec::kAdminDeleteSq:
      if (qid == 0 || sqs_.erase(qid) == 0) return kInvalidQueueIdentifier;
      return 0;
    case spec::kAdminDeleteCq:
      if (qid == 0 || cqs_.erase(qid) == 0) return kInvalidQueueIdentifier;
      return 0;
    default:
      return kInvalidOpcode;
  }
}

uint16_t FakeNvmeController::Gather(
    uint64_t prp1, uint64_t prp2, uint64_t bytes,
    std::vector<std::pair<uint8_t*, uint64_t>>& pieces) {
  std::vector<std::pair<uint64_t, uint64_t>> iovas;
  if (prp1 % 4 != 0) return kInvalidPrpOffset;
  const uint64_t first = std::min(bytes, kPage - prp1 % kPage);
  iovas.emplace_back(prp1, first);
  uint64_t left = bytes - first;
  if (left > 0 && left <= kPage) {
    if (prp2 % kPage != 0) return kInvalidPrpOffset;
    iovas.emplace_back(prp2, left);
  } else if (left > 0) {
    // A PRP list: entries up to the end of its page; when more pages are
    // left than entries fit, the last entry points to the next list.
    if (prp2 % 8 != 0) return kInvalidPrpOffset;
    prp_list_commands_.fetch_add(1);
    uint64_t list = prp2;
    while (left > 0) {
      const uint64_t entries = (kPage - list % kPage) / 8;
      auto* table =
          reinterpret_cast<uint64_t*>(os_.Translate(list, entries * 8));
      if (table == nullptr) {
        blocked_dma_.fetch_add(1);
        return kDataTransferError;
      }
      const uint64_t pages = (left + kPage - 1) / kPage;
      const uint64_t here = pages > entries ? entries - 1 : pages;
      for (uint64_t i = 0; i < here; ++i) {
        if (table[i] % kPage != 0) return kInvalidPrpOffset;
        const uint64_t n = std::min(left, kPage);
        iovas.emplace_back(table[i], n);
        left -= n;
      }
      if (left > 0) {
        list = table[entries - 1];
        chained_prp_lists_.fetch_add(1);
        if (list % 8 != 0) return kInvalidPrpOffset;
      }
    }
  }
  for (const auto& [iova, n] : iovas) {
    uint8_t* host = os_.Translate(iova, n);
    if (host == nullptr) {
      blocked_dma_.fetch_add(1);
      return kDataTransferError;
    }
    pieces.emplace_back(host, n);
  }
  return 0;
}

uint16_t FakeNvmeController::Io(const Sqe& sqe) {
  io_commands_.fetch_add(1);
  const uint8_t opcode = sqe.cdw0 & 0xff;
  if (sqe.nsid != 1) return kInvalidNamespace;
  const uint64_t slba = sqe.cdw10 | (uint64_t{sqe.cdw11} << 32);
  const uint64_t block = block_bytes();
  if (opcode == spec::kNvmCopy) {
    if (!config_.copy) return kInvalidOpcode;
    const uint32_t ranges = (sqe.cdw12 & 0xff) + 1;
    auto* entries = reinterpret_cast<CopyRange*>(
        os_.Translate(sqe.prp1, ranges * sizeof(CopyRange)));
    if (entries == nullptr) {
      blocked_dma_.fetch_add(1);
      return kDataTransferError;
    }
    uint64_t dest = slba;
    uint64_t total = 0;
    for (uint32_t r = 0; r < ranges; ++r) {
      const CopyRange range = entries[r];
      const uint64_t nlb = uint64_t{range.nlb} + 1;
      total += nlb;
      if (nlb > config_.mssrl || total > config_.mcl) return kInvalidField;
      if (range.slba + nlb > config_.blocks || dest + nlb > config_.blocks) {
        return kLbaOutOfRange;
      }
      // Block by block from the first: the NVM Command Set does not make
      // a Copy whose source and destination overlap act as memmove, so the
      // fake does not either (a destination above the source reads blocks
      // the command itself has overwritten).
      for (uint64_t b = 0; b < nlb; ++b) {
        std::memmove(&media_[(dest + b) * block],
                     &media_[(range.slba + b) * block], block);
      }
      dest += nlb;
    }
    copies_.fetch_add(1);
    largest_io_bytes_.store(std::max(largest_io_bytes_.load(), total * block));
    return 0;
  }
  if (opcode != spec::kNvmRead && opcode != spec::kNvmWrite) {
    return kInvalidOpcode;
  }
  const uint64_t nlb = uint64_t{sqe.cdw12 & 0xffff} + 1;
  const uint64_t bytes = nlb * block;
  if (config_.mdts != 0 && bytes > (kPage << config_.mdts)) {
    return kInvalidField;
  }
  if (slba + nlb > config_.blocks) return kLbaOutOfRange;
  largest_io_bytes_.store(std::max(largest_io_bytes_.load(), bytes));
  std::vector<std::pair<uint8_t*, uint64_t>> pieces;
  if (const uint16_t status = Gather(sqe.prp1, sqe.prp2, bytes, pieces);
      status != 0) {
    return status;
  }
  uint8_t* at = &media_[slba * block];
  for (const auto& [host, n] : pieces) {
    if (opcode == spec::kNvmRead) {
      std::memcpy(host, at, n);
    } else {
      std::memcpy(at, host, n);
    }
    at += n;
  }
  return 0;
}

}  // namespace tpushim::fake_vfio
