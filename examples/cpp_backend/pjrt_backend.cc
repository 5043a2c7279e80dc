// PjrtBackend: the host-memory half of a PJRT plugin on tpushim (see
// pjrt_backend.h and docs/pjrt.md).

#include "pjrt_backend.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

namespace cpp_backend {

absl::StatusOr<std::unique_ptr<tpushim::System>> MakeSystem(
    uint64_t threshold) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  tpushim::OptionOverrides options;
  options.premapped_buffer_size = 16 * kMiB;
  options.premapped_buffer_transfer_threshold_bytes = threshold;
  if (std::getenv("TPUSHIM_DEVICE") == nullptr) {
    options.device = "sim://?devices=2&hbm=64M";
  }
  return tpushim::System::Create(options);
}

PjrtBackend::~PjrtBackend() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [data, registration] : mapped_) {
    absl::Status status = registration.Unregister();
    if (!status.ok()) {
      std::fprintf(stderr, "cpp_backend: unmapping %p: %s\n", data,
                   status.ToString().c_str());
    }
  }
}

int PjrtBackend::device_memory(int device) const {
  return system_->memory_of_kind(tpushim::MemoryKind::kDevice, device);
}
int PjrtBackend::pinned_host_memory() const {
  return system_->memory_of_kind(tpushim::MemoryKind::kPinnedHost);
}
int PjrtBackend::unpinned_host_memory() const {
  return system_->memory_of_kind(tpushim::MemoryKind::kUnpinnedHost);
}

absl::StatusOr<PutResult> PjrtBackend::DevicePut(
    const void* data, uint64_t size, int memory,
    tpushim::HostBufferSemantics semantics) {
  using tpushim::HostBufferSemantics;
  const bool device_memory = memory >= 0 && memory < system_->device_count();
  if (device_memory &&
      semantics != HostBufferSemantics::kImmutableOnlyDuringCall) {
    // The transfer's two events are PJRT's: ready, and done_with_host_buffer
    // (given to a transfer, the zero-copy semantics mean
    // kImmutableUntilTransferCompletes).
    absl::StatusOr<tpushim::MemoryBuffer> buffer =
        system_->AllocateInMemory(memory, size);
    if (!buffer.ok()) return buffer.status();
    absl::StatusOr<tpushim::TransferEvents> up =
        system_->TransferToDeviceWithEvents(data, buffer->device_buffer(), 0,
                                            size, {}, semantics);
    if (!up.ok()) {
      (void)system_->Free(*buffer);
      return up.status();
    }
    return PutResult{*buffer, up->ready, up->host_released};
  }
  absl::StatusOr<tpushim::MemoryCopy> made =
      system_->CreateMemoryBuffer(data, size, memory, semantics);
  if (!made.ok()) return made.status();
  PutResult result{made->buffer, made->event, tpushim::Event()};
  if (made->buffer.aliases_caller_memory()) {
    // The buffer is the caller's bytes: PJRT releases them when the buffer
    // goes. A caller event (PJRT_Event_Create) stands for that; Free sets
    // it (PJRT_Event_Set).
    absl::StatusOr<tpushim::CallerEvent> released = system_->CreateEvent();
    if (!released.ok()) {
      (void)system_->Free(made->buffer);
      return released.status();
    }
    result.host_released = released->event();
    std::lock_guard<std::mutex> lock(mu_);
    release_on_free_.emplace(made->buffer.state().get(), *std::move(released));
  }
  return result;
}

absl::StatusOr<tpushim::Event> PjrtBackend::Free(
    const tpushim::MemoryBuffer& buffer) {
  absl::StatusOr<tpushim::Event> freed = system_->Free(buffer);
  if (!freed.ok()) return freed;
  std::unique_ptr<tpushim::CallerEvent> release;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = release_on_free_.find(buffer.state().get());
    if (it != release_on_free_.end()) {
      release = std::make_unique<tpushim::CallerEvent>(std::move(it->second));
      release_on_free_.erase(it);
    }
  }
  if (release != nullptr) {
    freed->AddCallback([release = std::move(release)](absl::Status status) {
      (void)release->Set(status);
    });
  }
  return freed;
}

absl::StatusOr<tpushim::Event> PjrtBackend::ToHost(
    const tpushim::MemoryBuffer& buffer, void* dst,
    const tpushim::Event& wait_for) {
  if (buffer.kind() == tpushim::MemoryKind::kDevice) {
    const tpushim::Event deps[] = {wait_for};
    return system_->TransferFromDevice(buffer.device_buffer(), 0, dst,
                                       buffer.size(), deps);
  }
  // A host memory's bytes are at data(): copy them once they are defined.
  absl::Status defined = wait_for.Await();
  if (defined.ok()) std::memcpy(dst, buffer.data(), buffer.size());
  return tpushim::Event::Ready(defined);
}

absl::StatusOr<tpushim::MemoryCopy> PjrtBackend::CopyToMemory(
    const tpushim::MemoryBuffer& buffer, int memory,
    const tpushim::Event& wait_for) {
  const tpushim::Event deps[] = {wait_for};
  return system_->CopyToMemory(buffer, memory, deps);
}

absl::Status PjrtBackend::DmaMap(void* data, uint64_t size) {
  absl::StatusOr<tpushim::HostRegistration> registration =
      system_->RegisterHostMemory(data, size);
  if (!registration.ok()) return registration.status();
  std::lock_guard<std::mutex> lock(mu_);
  // RegisterHostMemory refuses overlapping ranges, so the start is free.
  mapped_.emplace(data, *std::move(registration));
  return absl::OkStatus();
}

absl::Status PjrtBackend::DmaUnmap(void* data) {
  tpushim::HostRegistration registration;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = mapped_.find(data);
    if (it == mapped_.end()) {
      char address[32];
      std::snprintf(address, sizeof(address), "%p", data);
      return absl::NotFoundError(std::string("DmaUnmap: ") + address +
                                 " was not mapped by DmaMap");
    }
    registration = std::move(it->second);
    mapped_.erase(it);
  }
  // Outside the lock: Unregister waits for the transfers inside the range.
  return registration.Unregister();
}

bool PjrtBackend::IsDmaMapped(const void* data) const {
  std::lock_guard<std::mutex> lock(mu_);
  return mapped_.count(data) != 0;
}

absl::StatusOr<std::string> PjrtBackend::MemoryStatsLine(int memory) const {
  absl::StatusOr<tpushim::MemoryStats> s = system_->GetMemoryStats(memory);
  if (!s.ok()) return s.status();
  char line[256];
  std::snprintf(
      line, sizeof(line),
      "%s: bytes_in_use=%" PRIu64 " peak_bytes_in_use=%" PRIu64
      " num_allocs=%" PRIu64 " largest_alloc_size=%" PRIu64 " bytes_limit=%s",
      std::string(tpushim::MemoryKindName(s->kind)).c_str(), s->bytes_in_use,
      s->peak_bytes_in_use, s->num_allocs, s->largest_alloc_size,
      s->has_bytes_limit ? std::to_string(s->bytes_limit).c_str() : "unset");
  return std::string(line);
}

}  // namespace cpp_backend
