// The PJRT-shaped flows of cpp_backend: device_put with each host-buffer
// semantics, to_host from every memory kind, copy_to_memory(pinned_host)
// and dma_map. Each checks every byte it moves and returns an error
// naming what differed.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "pjrt_backend.h"

namespace cpp_backend {
namespace {

using tpushim::HostBufferSemantics;
using tpushim::TransferPath;

constexpr uint64_t kMiB = uint64_t{1} << 20;

void Fill(void* data, uint64_t size, uint32_t seed) {
  auto* p = static_cast<unsigned char*>(data);
  uint32_t x = seed * 2654435761u + 1;
  for (uint64_t i = 0; i < size; ++i) {
    x = x * 1103515245u + 12345u;
    p[i] = static_cast<unsigned char>(x >> 16);
  }
}

std::vector<unsigned char> Pattern(uint64_t size, uint32_t seed) {
  std::vector<unsigned char> v(size);
  Fill(v.data(), size, seed);
  return v;
}

absl::Status Same(const void* got, const std::vector<unsigned char>& want,
                  const std::string& what) {
  if (std::memcmp(got, want.data(), want.size()) == 0) return absl::OkStatus();
  return absl::DataLossError(what + ": the bytes differ from what was put");
}

absl::Status Expect(bool condition, const std::string& what) {
  return condition ? absl::OkStatus() : absl::InternalError(what);
}

// Reads `buffer` back once `ready` and compares it with `want`.
absl::Status ReadBack(PjrtBackend& backend, const tpushim::MemoryBuffer& buffer,
                      const tpushim::Event& ready,
                      const std::vector<unsigned char>& want,
                      const std::string& what) {
  std::vector<unsigned char> got(buffer.size());
  absl::StatusOr<tpushim::Event> back =
      backend.ToHost(buffer, got.data(), ready);
  if (!back.ok()) return back.status();
  BACKEND_RETURN_IF_ERROR(back->Await());
  return Same(got.data(), want, what);
}

// A PinnedHostBuffer (premapped region memory) holding `want`.
absl::StatusOr<tpushim::PinnedHostBuffer> PinnedCopy(
    tpushim::System& system, const std::vector<unsigned char>& want) {
  absl::StatusOr<tpushim::PinnedHostBuffer> pinned =
      system.AllocatePinnedHost(want.size(), 64);
  if (pinned.ok()) std::memcpy(pinned->data(), want.data(), want.size());
  return pinned;
}

}  // namespace

absl::Status RunDevicePut() {
  absl::StatusOr<std::unique_ptr<tpushim::System>> system =
      MakeSystem(4 * kMiB);
  if (!system.ok()) return system.status();
  PjrtBackend backend(system->get());
  const int device = backend.device_memory(0);
  const int pinned = backend.pinned_host_memory();

  // kImmutableOnlyDuringCall: the caller's bytes are free when the call
  // returns, so overwriting them at once must not change the buffer.
  {
    const std::vector<unsigned char> want = Pattern(kMiB, 1);
    std::vector<unsigned char> src = want;
    absl::StatusOr<PutResult> put =
        backend.DevicePut(src.data(), src.size(), device,
                          HostBufferSemantics::kImmutableOnlyDuringCall);
    if (!put.ok()) return put.status();
    BACKEND_RETURN_IF_ERROR(Expect(put->host_released.IsReady(),
                                   "only_during_call: bytes still held"));
    Fill(src.data(), src.size(), 99);
    BACKEND_RETURN_IF_ERROR(
        ReadBack(backend, put->buffer, put->ready, want, "only_during_call"));
  }
  // kImmutableUntilTransferCompletes, 2 MiB of pageable memory: the staged
  // path. The bytes may be reused once host_released is ready, before or
  // as the DMA ends (never after ready).
  {
    const std::vector<unsigned char> want = Pattern(2 * kMiB, 2);
    std::vector<unsigned char> src = want;
    absl::StatusOr<PutResult> put = backend.DevicePut(
        src.data(), src.size(), device,
        HostBufferSemantics::kImmutableUntilTransferCompletes);
    if (!put.ok()) return put.status();
    BACKEND_RETURN_IF_ERROR(put->host_released.Await());
    Fill(src.data(), src.size(), 98);
    BACKEND_RETURN_IF_ERROR(put->ready.Await());
    BACKEND_RETURN_IF_ERROR(ReadBack(backend, put->buffer, put->ready, want,
                                     "until_transfer_completes"));
  }
  // kImmutableZeroCopy into pinned_host: region memory is aliased (no
  // copy); pageable memory is copied (PJRT lets a runtime copy).
  tpushim::MemoryBuffer on_device;
  {
    const std::vector<unsigned char> want = Pattern(kMiB, 3);
    absl::StatusOr<tpushim::PinnedHostBuffer> src = PinnedCopy(**system, want);
    if (!src.ok()) return src.status();
    absl::StatusOr<PutResult> put =
        backend.DevicePut(src->data(), src->size(), pinned,
                          HostBufferSemantics::kImmutableZeroCopy);
    if (!put.ok()) return put.status();
    BACKEND_RETURN_IF_ERROR(
        Expect(put->buffer.aliases_caller_memory() &&
                   put->buffer.data() == src->data(),
               "immutable_zero_copy: region memory was not aliased"));
    // The bytes are the buffer's until it is freed.
    BACKEND_RETURN_IF_ERROR(Expect(!put->host_released.IsReady(),
                                   "immutable_zero_copy: released early"));
    absl::StatusOr<tpushim::MemoryCopy> up =
        backend.CopyToMemory(put->buffer, device, put->ready);
    if (!up.ok()) return up.status();
    BACKEND_RETURN_IF_ERROR(
        ReadBack(backend, up->buffer, up->event, want, "immutable_zero_copy"));
    on_device = up->buffer;
    absl::StatusOr<tpushim::Event> freed = backend.Free(put->buffer);
    if (!freed.ok()) return freed.status();
    BACKEND_RETURN_IF_ERROR(put->host_released.Await());

    std::vector<unsigned char> pageable = want;
    absl::StatusOr<PutResult> copied =
        backend.DevicePut(pageable.data(), pageable.size(), pinned,
                          HostBufferSemantics::kImmutableZeroCopy);
    if (!copied.ok()) return copied.status();
    BACKEND_RETURN_IF_ERROR(
        Expect(!copied->buffer.aliases_caller_memory(),
               "immutable_zero_copy: pageable memory was aliased"));
    BACKEND_RETURN_IF_ERROR(ReadBack(backend, copied->buffer, copied->ready,
                                     want, "immutable_zero_copy (copied)"));
  }
  // kMutableZeroCopy into pinned_host: the buffer is the caller's region
  // bytes, so what is copied into the buffer lands in them.
  {
    const std::vector<unsigned char> want = Pattern(kMiB, 3);  // on_device
    absl::StatusOr<tpushim::PinnedHostBuffer> dst =
        (*system)->AllocatePinnedHost(kMiB, 64);
    if (!dst.ok()) return dst.status();
    std::memset(dst->data(), 0, dst->size());
    absl::StatusOr<PutResult> put =
        backend.DevicePut(dst->data(), dst->size(), pinned,
                          HostBufferSemantics::kMutableZeroCopy);
    if (!put.ok()) return put.status();
    BACKEND_RETURN_IF_ERROR(Expect(put->buffer.mutable_alias(),
                                   "mutable_zero_copy: not a mutable alias"));
    absl::StatusOr<tpushim::Event> down = (*system)->TransferFromDevice(
        on_device.device_buffer(), 0, put->buffer.data(), kMiB);
    if (!down.ok()) return down.status();
    BACKEND_RETURN_IF_ERROR(down->Await());
    BACKEND_RETURN_IF_ERROR(
        Same(dst->data(), want, "mutable_zero_copy (the caller's bytes)"));
    absl::StatusOr<tpushim::Event> freed = backend.Free(put->buffer);
    if (!freed.ok()) return freed.status();
    BACKEND_RETURN_IF_ERROR(put->host_released.Await());
  }
  std::printf(
      "cpp_backend: device_put: OK: immutable_only_during_call and "
      "immutable_until_transfer_completes to device, immutable_zero_copy and "
      "mutable_zero_copy aliasing pinned_host\n");
  return absl::OkStatus();
}

absl::Status RunToHost() {
  absl::StatusOr<std::unique_ptr<tpushim::System>> system =
      MakeSystem(4 * kMiB);
  if (!system.ok()) return system.status();
  PjrtBackend backend(system->get());
  // 8 MiB is above the threshold: the device copies go the pinned path.
  const struct {
    int memory;
    uint64_t size;
  } cases[] = {{backend.device_memory(0), kMiB},
               {backend.device_memory(1), 8 * kMiB},
               {backend.pinned_host_memory(), kMiB},
               {backend.unpinned_host_memory(), 8 * kMiB}};
  uint32_t seed = 10;
  for (const auto& c : cases) {
    const std::vector<unsigned char> want = Pattern(c.size, ++seed);
    absl::StatusOr<PutResult> put =
        backend.DevicePut(want.data(), want.size(), c.memory,
                          HostBufferSemantics::kImmutableOnlyDuringCall);
    if (!put.ok()) return put.status();
    BACKEND_RETURN_IF_ERROR(
        ReadBack(backend, put->buffer, put->ready, want,
                 "to_host from " +
                     std::string(tpushim::MemoryKindName(put->buffer.kind()))));
    absl::StatusOr<tpushim::Event> freed = backend.Free(put->buffer);
    if (!freed.ok()) return freed.status();
    BACKEND_RETURN_IF_ERROR(freed->Await());
  }
  std::printf(
      "cpp_backend: to_host: OK: buffers in device (2), pinned_host and "
      "unpinned_host memory read back intact\n");
  return absl::OkStatus();
}

absl::Status RunCopyToMemory() {
  absl::StatusOr<std::unique_ptr<tpushim::System>> system =
      MakeSystem(4 * kMiB);
  if (!system.ok()) return system.status();
  PjrtBackend backend(system->get());
  const int pinned = backend.pinned_host_memory();
  const std::vector<unsigned char> want = Pattern(2 * kMiB, 20);
  absl::StatusOr<PutResult> put =
      backend.DevicePut(want.data(), want.size(), backend.device_memory(0),
                        HostBufferSemantics::kImmutableOnlyDuringCall);
  if (!put.ok()) return put.status();

  // Offload: device 0 → pinned_host, one DMA into region memory.
  const tpushim::SystemStats before = (*system)->GetStats();
  absl::StatusOr<tpushim::MemoryCopy> off =
      backend.CopyToMemory(put->buffer, pinned, put->ready);
  if (!off.ok()) return off.status();
  BACKEND_RETURN_IF_ERROR(off->event.Await());
  BACKEND_RETURN_IF_ERROR(
      Expect(off->buffer.kind() == tpushim::MemoryKind::kPinnedHost,
             "copy_to_memory: the copy is not in pinned_host"));
  BACKEND_RETURN_IF_ERROR(
      Same(off->buffer.data(), want, "copy_to_memory(pinned_host)"));
  const tpushim::SystemStats after = (*system)->GetStats();
  const int d2h = static_cast<int>(tpushim::DmaDirection::kDeviceToHost);
  const int zero_copy = static_cast<int>(TransferPath::kZeroCopy);
  const int staged = static_cast<int>(TransferPath::kStaged);
  BACKEND_RETURN_IF_ERROR(
      Expect(after.transfers.host[d2h][staged].transfers ==
                 before.transfers.host[d2h][staged].transfers,
             "copy_to_memory(pinned_host) went through staging"));

  // Back: pinned_host → device 1, again one DMA.
  absl::StatusOr<tpushim::MemoryCopy> back =
      backend.CopyToMemory(off->buffer, backend.device_memory(1), off->event);
  if (!back.ok()) return back.status();
  BACKEND_RETURN_IF_ERROR(ReadBack(backend, back->buffer, back->event, want,
                                   "copy_to_memory(device 1)"));
  absl::StatusOr<std::string> stats = backend.MemoryStatsLine(pinned);
  if (!stats.ok()) return stats.status();
  std::printf(
      "cpp_backend: copy_to_memory: OK: device 0 -> pinned_host -> device 1 "
      "(%llu zero-copy device->host DMA); %s\n",
      static_cast<unsigned long long>(
          after.transfers.host[d2h][zero_copy].transfers -
          before.transfers.host[d2h][zero_copy].transfers),
      stats->c_str());
  return absl::OkStatus();
}

absl::Status RunDmaMap() {
  // A 1 MiB threshold: the 2 MiB buffer below would take the pinned path.
  absl::StatusOr<std::unique_ptr<tpushim::System>> system = MakeSystem(kMiB);
  if (!system.ok()) return system.status();
  tpushim::System& sys = **system;
  const uint64_t size = 2 * kMiB;
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> host(std::aligned_alloc(4096, size));
  if (host == nullptr) return absl::ResourceExhaustedError("aligned_alloc");
  const std::vector<unsigned char> want = Pattern(size, 30);
  std::memcpy(host.get(), want.data(), size);
  {
    PjrtBackend backend(&sys);
    BACKEND_RETURN_IF_ERROR(
        Expect(sys.PathFor(host.get(), size) == TransferPath::kPinned,
               "dma_map: unmapped memory is not pinned"));
    BACKEND_RETURN_IF_ERROR(backend.DmaMap(host.get(), size));
    BACKEND_RETURN_IF_ERROR(
        Expect(sys.PathFor(host.get(), size) == TransferPath::kZeroCopy,
               "dma_map: mapped memory is not zero-copy"));
    // Mapping it twice is refused, naming both ranges.
    absl::Status again = backend.DmaMap(host.get(), size);
    BACKEND_RETURN_IF_ERROR(
        Expect(absl::IsInvalidArgument(again),
               "dma_map: a second map was not refused: " + again.ToString()));

    // Up from the mapped bytes and back into them: both zero-copy.
    absl::StatusOr<PutResult> put = backend.DevicePut(
        host.get(), size, backend.device_memory(0),
        HostBufferSemantics::kImmutableUntilTransferCompletes);
    if (!put.ok()) return put.status();
    BACKEND_RETURN_IF_ERROR(put->ready.Await());
    std::memset(host.get(), 0, size);
    absl::StatusOr<tpushim::Event> back =
        backend.ToHost(put->buffer, host.get(), put->ready);
    if (!back.ok()) return back.status();
    BACKEND_RETURN_IF_ERROR(back->Await());
    BACKEND_RETURN_IF_ERROR(Same(host.get(), want, "dma_map round trip"));
    // Mapped memory is memory every device DMAs directly: a pinned_host
    // buffer over it aliases it rather than copying.
    absl::StatusOr<PutResult> alias =
        backend.DevicePut(host.get(), size, backend.pinned_host_memory(),
                          HostBufferSemantics::kImmutableZeroCopy);
    if (!alias.ok()) return alias.status();
    BACKEND_RETURN_IF_ERROR(
        Expect(alias->buffer.aliases_caller_memory(),
               "dma_map: pinned_host did not alias the mapped bytes"));
    absl::StatusOr<tpushim::Event> unaliased = backend.Free(alias->buffer);
    if (!unaliased.ok()) return unaliased.status();
    BACKEND_RETURN_IF_ERROR(alias->host_released.Await());
    const tpushim::TransferStats& t = sys.GetStats().transfers;
    BACKEND_RETURN_IF_ERROR(
        Expect(t.zero_copy_registered_transfers[0] == 1 &&
                   t.zero_copy_registered_transfers[1] == 1,
               "dma_map: the transfers did not use the mapping"));

    BACKEND_RETURN_IF_ERROR(backend.DmaUnmap(host.get()));
    BACKEND_RETURN_IF_ERROR(
        Expect(sys.PathFor(host.get(), size) == TransferPath::kPinned,
               "dma_unmap: still zero-copy"));
    absl::Status twice = backend.DmaUnmap(host.get());
    BACKEND_RETURN_IF_ERROR(Expect(
        absl::IsNotFound(twice),
        "dma_unmap: a second unmap was not refused: " + twice.ToString()));
  }
  std::printf(
      "cpp_backend: dma_map: OK: a 2 MiB caller buffer mapped, aliased as "
      "pinned_host, 1 host->device "
      "and 1 device->host zero-copy through the mapping, unmapped\n");
  return absl::OkStatus();
}

}  // namespace cpp_backend
