// cpp_backend: a framework backend's host side, wired to tpushim's C++ API
// (libtpushim.so) the way a framework wires it to libtpu:
//
//   HostAllocator    host memory for tensors: a PinnedHostBuffer from the
//                    premapped region when the region can serve it (the
//                    device DMAs straight from it), aligned pageable memory
//                    when the region answers RESOURCE_EXHAUSTED (full, or
//                    the tensor is above the transfer threshold).
//   TransferManager  tensors to a device and back. Every step returns an
//                    event, and the next step names it in `wait_for`, so a
//                    whole batch is in flight before anything blocks.
//
// and, in the shape of a PJRT plugin's host-memory half (PjrtBackend,
// pjrt_backend.h; flows.cc):
//
//   device_put       BufferFromHostBuffer with each of PJRT's four
//                    host-buffer semantics, and its two events
//   to_host          ToHostBuffer from device, pinned_host and unpinned_host
//   copy_to_memory   CopyToMemory device -> pinned_host -> device
//   dma_map          DmaMap / DmaUnmap: a caller buffer registered, moved
//                    zero-copy both ways, unregistered
//
// `cpp_backend` runs them all; `cpp_backend <name>` runs one (`batch` is
// the batch below). The batch copies tensors to every device, brings every
// copy back, checks it, frees everything and prints one line starting
// "cpp_backend: OK" and the system's transfer statistics; each flow checks
// every byte it moves and prints "cpp_backend: <name>: OK: ...". Exit
// status 0 on success, 1 (with the failing status on stderr) otherwise, 2
// for an unknown name.
//
// Settings (each flow's own System): a 16 MiB premapped region with a 4 MiB
// threshold (1 MiB for dma_map) and, unless TPUSHIM_DEVICE is set, two
// simulated devices with 64 MiB of HBM each.
// Logging follows the environment (TPU_LOG_DIR, default /tmp/tpu_logs).

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pjrt_backend.h"
#include "tpushim/system.h"

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

double InMiB(uint64_t bytes) { return static_cast<double>(bytes) / kMiB; }

// Host memory for one tensor: pinned (from the premapped region) or
// pageable. Move-only; frees its memory when destroyed.
class HostBuffer {
 public:
  explicit HostBuffer(tpushim::PinnedHostBuffer pinned)
      : pinned_(std::move(pinned)), size_(pinned_.size()) {}
  HostBuffer(void* pageable, uint64_t size)
      : pageable_(pageable), size_(size) {}

  void* data() const { return pinned_ ? pinned_.data() : pageable_.get(); }
  uint64_t size() const { return size_; }
  bool pinned() const { return static_cast<bool>(pinned_); }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  tpushim::PinnedHostBuffer pinned_;
  std::unique_ptr<void, Free> pageable_;
  uint64_t size_ = 0;
};

// The backend's host allocator. Thread-safe (tpushim's System is).
class HostAllocator {
 public:
  // Tensors are 64-byte aligned, as XLA's are.
  static constexpr size_t kAlignment = 64;

  // REQUIRES: `system` outlives the allocator and every buffer it returns.
  explicit HostAllocator(tpushim::System* system) : system_(system) {}

  // `size` bytes, pinned if the premapped region can serve them, else
  // pageable. Errors: any failure of the region other than
  // RESOURCE_EXHAUSTED; RESOURCE_EXHAUSTED when pageable memory runs out.
  absl::StatusOr<HostBuffer> Allocate(uint64_t size) {
    absl::StatusOr<tpushim::PinnedHostBuffer> pinned =
        system_->AllocatePinnedHost(size, kAlignment);
    if (pinned.ok()) {
      ++pinned_count_;
      return HostBuffer(*std::move(pinned));
    }
    if (!absl::IsResourceExhausted(pinned.status())) return pinned.status();
    // The region is full or `size` is above its threshold. Pageable memory
    // still works: tpushim stages or pins it per transfer.
    const uint64_t rounded = (size + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError("out of pageable host memory");
    }
    ++fallback_count_;
    return HostBuffer(p, size);
  }

  uint64_t pinned_count() const { return pinned_count_; }
  // Allocations the region answered RESOURCE_EXHAUSTED.
  uint64_t fallback_count() const { return fallback_count_; }

 private:
  tpushim::System* const system_;
  std::atomic<uint64_t> pinned_count_{0};
  std::atomic<uint64_t> fallback_count_{0};
};

// A tensor on a device: its buffer, and the event after which it holds the
// tensor's bytes (the "definition event").
struct DeviceTensor {
  int device = 0;
  tpushim::DeviceBuffer buffer;
  tpushim::Event defined;
};

// Moves tensors between host buffers and devices. Nothing blocks: every
// call returns once the operation is queued, with its event.
class TransferManager {
 public:
  // REQUIRES: `system` outlives the manager.
  explicit TransferManager(tpushim::System* system) : system_(system) {}

  // Copies `src` to a new buffer on `device`. `src` must stay alive and
  // unchanged until the returned tensor's `defined` event is ready.
  absl::StatusOr<DeviceTensor> ToDevice(const HostBuffer& src, int device) {
    absl::StatusOr<tpushim::DeviceBuffer> buffer =
        system_->AllocateDevice(device, src.size());
    if (!buffer.ok()) return buffer.status();
    absl::StatusOr<tpushim::Event> up =
        system_->TransferToDevice(src.data(), *buffer, 0, src.size());
    if (!up.ok()) {
      (void)system_->Deallocate(*buffer);
      return up.status();
    }
    return DeviceTensor{device, *buffer, *up};
  }

  // Copies `src` into `dst` once `src` is defined; ready when `dst` holds
  // the bytes. `dst` must stay alive until then.
  absl::StatusOr<tpushim::Event> ToHost(const DeviceTensor& src,
                                        HostBuffer& dst) {
    const tpushim::Event wait_for[] = {src.defined};
    return system_->TransferFromDevice(src.buffer, 0, dst.data(), dst.size(),
                                       wait_for);
  }

  // Frees `tensor`'s device memory after `last_use` (and every operation
  // already queued on it).
  absl::StatusOr<tpushim::Event> Free(const DeviceTensor& tensor,
                                      const tpushim::Event& last_use) {
    const tpushim::Event wait_for[] = {last_use};
    return system_->Deallocate(tensor.buffer, wait_for);
  }

 private:
  tpushim::System* const system_;
};

// The value of element `i` of tensor `t`: exact in a float.
float Pattern(int t, uint64_t i) {
  return static_cast<float>((t * 7919 + i) % 65536) * 0.5f;
}

absl::Status AwaitAll(const std::vector<tpushim::Event>& events) {
  absl::Status first;
  for (const tpushim::Event& e : events) first.Update(e.Await());
  return first;
}

void PrintStats(const tpushim::SystemStats& stats) {
  for (int dir = 0; dir < 2; ++dir) {
    for (int path = 0; path < tpushim::kTransferPathCount; ++path) {
      const tpushim::PathStats& p = stats.transfers.host[dir][path];
      if (p.transfers == 0) continue;
      std::printf("  %s %-9s %3llu transfers %8.2f MiB %llu failed\n",
                  std::string(tpushim::DmaDirectionName(
                                  static_cast<tpushim::DmaDirection>(dir)))
                      .c_str(),
                  std::string(tpushim::TransferPathName(
                                  static_cast<tpushim::TransferPath>(path)))
                      .c_str(),
                  static_cast<unsigned long long>(p.transfers), InMiB(p.bytes),
                  static_cast<unsigned long long>(p.failed));
    }
  }
  const tpushim::RegionStats& r = stats.region;
  std::printf(
      "  region    %.2f MiB (%s pages), peak in use %.2f MiB, %llu "
      "allocations, %llu RESOURCE_EXHAUSTED\n",
      InMiB(r.capacity_bytes), r.page_kind.c_str(), InMiB(r.peak_bytes_in_use),
      static_cast<unsigned long long>(r.allocations),
      static_cast<unsigned long long>(r.failures));
  std::printf("  staging   peak %.2f MiB in flight, %llu waits for room\n",
              InMiB(stats.transfers.peak_staging_bytes),
              static_cast<unsigned long long>(stats.transfers.staging_waits));
  for (const tpushim::DeviceStats& d : stats.devices) {
    std::printf("  %-9s %.2f of %.2f MiB HBM in use\n", d.name.c_str(),
                InMiB(d.hbm_in_use), InMiB(d.hbm_bytes));
  }
}

absl::Status RunBatch() {
  absl::StatusOr<std::unique_ptr<tpushim::System>> created =
      cpp_backend::MakeSystem(4 * kMiB);
  if (!created.ok()) return created.status();
  std::unique_ptr<tpushim::System> system = *std::move(created);
  {
    // Everything below holds pinned buffers: they go before the system.
    HostAllocator allocator(system.get());
    TransferManager transfers(system.get());

    // A batch of float tensors, 256 KiB .. 8 MiB: the 8 MiB one is above
    // the threshold, and the copies coming back overflow the region.
    const uint64_t sizes[] = {kMiB / 4, kMiB / 2, kMiB,
                              2 * kMiB, 4 * kMiB, 8 * kMiB};
    std::vector<HostBuffer> batch;
    uint64_t batch_bytes = 0;
    for (int t = 0; t < static_cast<int>(std::size(sizes)); ++t) {
      absl::StatusOr<HostBuffer> buffer = allocator.Allocate(sizes[t]);
      if (!buffer.ok()) return buffer.status();
      float* f = static_cast<float*>(buffer->data());
      for (uint64_t i = 0; i < sizes[t] / sizeof(float); ++i) {
        f[i] = Pattern(t, i);
      }
      batch_bytes += sizes[t];
      batch.push_back(*std::move(buffer));
    }

    // Every tensor to every device, and straight back: each copy back
    // waits for its copy up by event, so nothing blocks until AwaitAll.
    struct Copy {
      int tensor;
      DeviceTensor on_device;
      HostBuffer result;
      tpushim::Event back;
    };
    std::vector<Copy> copies;
    for (int d = 0; d < system->device_count(); ++d) {
      for (int t = 0; t < static_cast<int>(batch.size()); ++t) {
        absl::StatusOr<DeviceTensor> on_device =
            transfers.ToDevice(batch[t], d);
        if (!on_device.ok()) return on_device.status();
        absl::StatusOr<HostBuffer> result = allocator.Allocate(sizes[t]);
        if (!result.ok()) return result.status();
        copies.push_back(Copy{t, *on_device, *std::move(result), {}});
      }
    }
    std::vector<tpushim::Event> back;
    for (Copy& c : copies) {
      absl::StatusOr<tpushim::Event> e =
          transfers.ToHost(c.on_device, c.result);
      if (!e.ok()) return e.status();
      c.back = *e;
      back.push_back(*e);
    }
    BACKEND_RETURN_IF_ERROR(AwaitAll(back));

    for (const Copy& c : copies) {
      if (std::memcmp(c.result.data(), batch[c.tensor].data(),
                      c.result.size()) != 0) {
        return absl::DataLossError(
            "tensor " + std::to_string(c.tensor) + " came back from device " +
            std::to_string(c.on_device.device) + " changed");
      }
    }
    std::vector<tpushim::Event> freed;
    for (const Copy& c : copies) {
      absl::StatusOr<tpushim::Event> e = transfers.Free(c.on_device, c.back);
      if (!e.ok()) return e.status();
      freed.push_back(*e);
    }
    BACKEND_RETURN_IF_ERROR(AwaitAll(freed));

    std::printf(
        "cpp_backend: OK: %zu tensors x %d devices round-tripped (%.2f MiB "
        "each way per device); host allocator: %llu pinned, %llu pageable "
        "fallbacks\n",
        batch.size(), system->device_count(), InMiB(batch_bytes),
        static_cast<unsigned long long>(allocator.pinned_count()),
        static_cast<unsigned long long>(allocator.fallback_count()));
  }
  PrintStats(system->GetStats());
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  struct Flow {
    const char* name;
    absl::Status (*run)();
  };
  const Flow flows[] = {{"batch", RunBatch},
                        {"device_put", cpp_backend::RunDevicePut},
                        {"to_host", cpp_backend::RunToHost},
                        {"copy_to_memory", cpp_backend::RunCopyToMemory},
                        {"dma_map", cpp_backend::RunDmaMap}};
  const std::string only = argc > 1 ? argv[1] : "";
  bool known = only.empty();
  for (const Flow& flow : flows) {
    if (!only.empty() && only != flow.name) continue;
    known = true;
    absl::Status status = flow.run();
    if (!status.ok()) {
      std::fprintf(stderr, "cpp_backend: FAILED: %s: %s\n", flow.name,
                   status.ToString().c_str());
      return 1;
    }
  }
  if (!known) {
    std::fprintf(stderr,
                 "cpp_backend: unknown flow '%s' (batch, device_put, "
                 "to_host, copy_to_memory, dma_map)\n",
                 only.c_str());
    return 2;
  }
  return 0;
}
