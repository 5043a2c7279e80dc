#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/human_bytes.h"
#include "env/fork_guard.h"
#include "logging/log.h"
#include "transfer/engine.h"

namespace tpushim::transfer_internal {

void HostImageUnmap::operator()(char* p) const {
  ForgetForkExclusion(p);
  absl::Status s = os->Munmap(p, bytes);
  if (!s.ok()) LOG(ERROR) << "Unmapping an array transfer's host image: " << s;
}

uint32_t Engine::LayOutPinned(Op& op) {
  const uint64_t piece_bytes = config_.pinned_piece_bytes;
  const uint64_t step = config_.descriptor_bytes;
  // Pieces end on page boundaries of the caller's buffer where the device
  // allows it (the first piece then takes the bytes up to the first page
  // boundary too), so that no page belongs to two pieces and the bound on
  // pinned bytes holds page for page. A device moving whole blocks may
  // need the boundaries at whole blocks of the transfer instead; then two
  // pieces may share a page, which the pin tracker counts for both.
  const uintptr_t host = reinterpret_cast<uintptr_t>(
      op.kind == OpKind::kToDevice ? static_cast<const void*>(op.src)
                                   : static_cast<const void*>(op.dst));
  const uint64_t page = os_->PageSize();
  const uint64_t to_page = (page - host % page) % page;
  const uint64_t block = devices_[op.device]->info().block_bytes;
  const uint64_t first = piece_bytes % page == 0 && to_page % block == 0
                             ? to_page + piece_bytes
                             : piece_bytes;
  std::vector<std::pair<uint64_t, uint64_t>> bounds;  // offset, length
  for (uint64_t offset = 0; offset < op.size;) {
    const uint64_t length =
        std::min(offset == 0 ? first : piece_bytes, op.size - offset);
    bounds.emplace_back(offset, length);
    offset += length;
  }
  uint64_t descriptors = 0;
  for (const auto& [offset, length] : bounds) {
    descriptors += (length + step - 1) / step;
  }
  op.pieces = std::make_unique<PinnedPiece[]>(bounds.size());
  op.piece_count = static_cast<uint32_t>(bounds.size());
  op.chunks.resize(descriptors);
  uint32_t index = 0;
  for (uint32_t p = 0; p < op.piece_count; ++p) {
    PinnedPiece& piece = op.pieces[p];
    piece.offset = bounds[p].first;
    piece.length = bounds[p].second;
    piece.first_chunk = index;
    for (uint64_t off = 0; off < piece.length; off += step, ++index) {
      Chunk& c = op.chunks[index];
      c.op = &op;
      c.index = index;
      c.offset = piece.offset + off;
      c.length = std::min(step, piece.length - off);
      c.piece = &piece;
    }
    piece.chunk_count = index - piece.first_chunk;
  }
  // Each descriptor, and each piece until it is released.
  op.outstanding.fetch_add(descriptors + op.piece_count,
                           std::memory_order_relaxed);
  return op.piece_count;
}

bool Engine::PrepareImage(Op& op) {
  const uint64_t page = os_->PageSize();
  const uint64_t bytes = (op.size + page - 1) / page * page;
  // Its own mapping, excluded from fork like the rest of the engine's DMA
  // memory: it is pinned while its pieces move.
  absl::StatusOr<void*> mapped =
      os_->Mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped.ok()) {
    absl::Status excluded = ExcludeFromFork(*os_, *mapped, bytes,
                                            "an array transfer's host image");
    if (!excluded.ok()) {
      LOG(WARNING) << excluded
                   << "; a fork() child will get a copy of it at fork()";
    }
  }
  if (!mapped.ok()) {
    const absl::Status& excluded = mapped.status();
    op.RecordError(absl::Status(
        excluded.code(),
        absl::StrCat("an array transfer of ", op.buffer->shape->text,
                     " needs a host image of its ", HumanReadableBytes(op.size),
                     " device layout to pin (the premapped region is off or "
                     "had no staging room), and mapping one failed: ",
                     excluded.message())));
    return false;
  }
  op.image = std::unique_ptr<char, HostImageUnmap>(static_cast<char*>(*mapped),
                                                   HostImageUnmap{os_, bytes});
  if (op.kind == OpKind::kToDevice) {
    PackRange(op, 0, op.size, op.image.get());
    op.src = op.image.get();
  } else {
    op.dst = op.image.get();
  }
  return true;
}

void Engine::StartPinned(Op& op, PinReason reason) {
  if (op.path == TransferPath::kStaged) op.path = TransferPath::kPinned;
  op.pin_reason = reason;
  pinned_reasons_[static_cast<int>(reason)].fetch_add(
      1, std::memory_order_relaxed);
  if (op.size == 0) {
    ChunkDone(op);
    return;
  }
  if (op.relayout != nullptr && !PrepareImage(op)) {
    ChunkDone(op);  // the starter's hold: the operation fails
    return;
  }
  WarnPinned(op, reason);
  char* const host =
      op.kind == OpKind::kToDevice ? const_cast<char*>(op.src) : op.dst;
  Device* const device = devices_[op.device];
  const uint32_t pieces = LayOutPinned(op);
  uint32_t p = 0;
  for (; p < pieces; ++p) {
    PinnedPiece& piece = op.pieces[p];
    // Room under the bound on pinned bytes: the pieces before this one
    // are released as their DMA completes. One piece always fits.
    {
      MutexLock lock(&op.mu);
      while (op.pinned_in_flight > 0 && op.pinned_in_flight + piece.length >
                                            config_.pinned_in_flight_bytes) {
        op.pin_cv.Wait(&op.mu);
      }
    }
    // A transfer that has started finishes, shutdown or not: the caller
    // is told it either moved every byte or failed for a reason of its own.
    if (!op.Error().ok()) break;  // a descriptor failed
    absl::StatusOr<PinTracker::Lease> lease =
        pins_.Pin(host + piece.offset, piece.length);
    if (!lease.ok()) {
      op.RecordError(absl::Status(
          lease.status().code(),
          absl::StrCat("Pinning ", HumanReadableBytes(op.size),
                       " of caller memory for a ",
                       DmaDirectionDescription(op.direction),
                       " transfer failed: ", lease.status().message(),
                       ". Raise the memlock limit (ulimit -l) or allocate "
                       "the buffer from the premapped region.")));
      break;
    }
    absl::StatusOr<HostWindowId> window =
        device->RegisterHostWindow(host + piece.offset, piece.length);
    if (!window.ok()) {
      pins_.Unpin(*std::move(lease));
      op.RecordError(window.status());
      break;
    }
    VLOG(2) << "Pinned " << piece.length << " bytes at offset " << piece.offset
            << " of transfer " << op.id << " on " << device->info().name;
    piece.lease = *std::move(lease);
    piece.window = *window;
    {
      MutexLock lock(&op.mu);
      op.pinned_in_flight += piece.length;
    }
    piece.running.store(piece.chunk_count, std::memory_order_release);
    for (uint32_t c = 0; c < piece.chunk_count; ++c) {
      Chunk& chunk = op.chunks[piece.first_chunk + c];
      SubmitChunk(op, chunk, piece.window, chunk.offset - piece.offset);
    }
  }
  // Pieces never pinned: their descriptors and their holds.
  uint64_t abandoned = 0;
  for (uint32_t q = p; q < pieces; ++q)
    abandoned += op.pieces[q].chunk_count + 1;
  if (abandoned > 0) ChunkDone(op, abandoned);
  ChunkDone(op);  // the starter's hold
}

void Engine::ReleasePiece(Op& op, PinnedPiece& piece) {
  absl::Status s = devices_[op.device]->UnregisterHostWindow(piece.window);
  if (!s.ok()) LOG(ERROR) << "Unregistering pinned transfer memory: " << s;
  piece.window = kInvalidHostWindow;
  pins_.Unpin(std::move(piece.lease));
  VLOG(2) << "Unpinned " << piece.length << " bytes at offset " << piece.offset
          << " of transfer " << op.id;
  {
    MutexLock lock(&op.mu);
    op.pinned_in_flight -= piece.length;
  }
  op.pin_cv.Signal();
  ChunkDone(op);  // the piece's hold
}

bool Engine::TakeWarningTurn(uint64_t* suppressed) {
  const int64_t now = os_->MonotonicNanos();
  MutexLock lock(&warn_mu_);
  if (last_warning_ns_ != 0 &&
      now - last_warning_ns_ <
          absl::ToInt64Nanoseconds(config_.fallback_warning_interval)) {
    ++suppressed_warnings_;
    return false;
  }
  last_warning_ns_ = now;
  *suppressed = suppressed_warnings_;
  suppressed_warnings_ = 0;
  return true;
}

void Engine::WarnMisaligned(const Op& op, const void* host) {
  uint64_t suppressed = 0;
  if (!TakeWarningTurn(&suppressed)) return;
  const DeviceInfo& info = devices_[op.device]->info();
  LOG(WARNING) << "Transfer of " << HumanReadableBytes(op.size) << " "
               << DmaDirectionDescription(op.direction) << " on " << info.name
               << " is staged whatever its size (slower): the host buffer at "
               << host << " is not " << info.host_alignment
               << "-byte aligned, which " << info.name << " needs for DMA."
               << (suppressed > 0
                       ? absl::StrCat(" ", suppressed,
                                      " more such transfers since the last "
                                      "message.")
                       : std::string());
}

void Engine::WarnPinned(const Op& op, PinReason reason) {
  uint64_t suppressed = 0;
  if (!TakeWarningTurn(&suppressed)) return;
  std::string why;
  switch (reason) {
    case PinReason::kOverThreshold:
      why = absl::StrCat(
          "it is larger than TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=",
          threshold_, " (", HumanReadableBytes(threshold_), ")");
      break;
    case PinReason::kRegionOff:
      why = bounce_ != nullptr
                ? absl::StrCat(
                      "the premapped region is off (TPU_PREMAPPED_BUFFER_SIZE="
                      "0) and it is larger than the ",
                      HumanReadableBytes(config_.bounce_max_bytes),
                      " the engine's bounce pool stages")
                : std::string(
                      "the premapped region is off (TPU_PREMAPPED_BUFFER_SIZE="
                      "0, so TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES is "
                      "0)");
      break;
    case PinReason::kNotPremapped: {
      const uint64_t ready = region_->allocator().ready_bytes();
      const PremappedRegion::Stats r = region_->GetStats();
      why = r.premap_error.ok()
                ? absl::StrCat("staging space is not premapped yet (",
                               HumanReadableBytes(ready), " of the ",
                               HumanReadableBytes(region_->size()),
                               " region premapped so far, TPUSHIM_PREMAP="
                               "background)")
                : absl::StrCat("premapping the region stopped after ",
                               HumanReadableBytes(ready),
                               ", too little for staging (",
                               r.premap_error.ToString(), ")");
      break;
    }
    case PinReason::kStagingTimeout:
      if (region_ == nullptr) {
        why = absl::StrCat("the engine's ",
                           HumanReadableBytes(bounce_->size()),
                           " bounce pool had no room within ",
                           absl::FormatDuration(config_.staging_wait),
                           " (the premapped region is off)");
        break;
      }
      why = absl::StrCat(
          "no staging space in the premapped region freed up within ",
          absl::FormatDuration(config_.staging_wait), " (",
          HumanReadableBytes(
              staging_in_flight_.load(std::memory_order_relaxed)),
          " of ", HumanReadableBytes(max_staging_),
          " staging in flight; TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=",
          threshold_, ")");
      break;
  }
  LOG(WARNING) << "Transfer of " << HumanReadableBytes(op.size) << " "
               << DmaDirectionDescription(op.direction) << " on "
               << devices_[op.device]->info().name
               << " pins the caller's memory for the transfer (slower): " << why
               << "."
               << (suppressed > 0
                       ? absl::StrCat(" ", suppressed,
                                      " more such transfers since the last "
                                      "message.")
                       : std::string());
}

}  // namespace tpushim::transfer_internal
