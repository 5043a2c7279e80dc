#include "driver/memory_spaces.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "device/hbm_report.h"
#include "device/xla_shape.h"
#include "transfer/relayout.h"

namespace tpushim {

using memory_internal::BufferState;
using memory_internal::HostCounters;
using memory_internal::HostStorage;

absl::string_view MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kDevice:
      return "device";
    case MemoryKind::kPinnedHost:
      return "pinned_host";
    case MemoryKind::kUnpinnedHost:
      return "unpinned_host";
  }
  return "unknown";
}

// ---- MemoryBuffer -----------------------------------------------------------

int MemoryBuffer::memory() const { return state_ ? state_->memory : -1; }
MemoryKind MemoryBuffer::kind() const {
  return state_ ? state_->kind : MemoryKind::kDevice;
}
uint64_t MemoryBuffer::size() const { return state_ ? state_->size : 0; }
void* MemoryBuffer::data() const { return state_ ? state_->data : nullptr; }
DeviceBuffer MemoryBuffer::device_buffer() const {
  return state_ ? state_->device : DeviceBuffer();
}
bool MemoryBuffer::aliases_caller_memory() const {
  return state_ && state_->aliased;
}
bool MemoryBuffer::mutable_alias() const {
  return state_ && state_->mutable_alias;
}
std::string MemoryBuffer::shape() const {
  return state_ ? state_->shape : std::string();
}
uint64_t MemoryBuffer::unpadded_size() const {
  return state_ ? state_->unpadded : 0;
}
uint64_t MemoryBuffer::host_size() const {
  return state_ ? state_->host_bytes : 0;
}
std::string MemoryBuffer::label() const {
  return state_ ? state_->label : std::string();
}

namespace memory_internal {

HostStorage::~HostStorage() {
  std::free(heap);
  if (counters != nullptr) {
    MutexLock lock(&counters->mu);
    HostCounters::One& c = counters->host[slot];
    c.bytes_in_use -= size;
    --c.buffers_live;
  }
}

}  // namespace memory_internal

namespace {

constexpr uint64_t kHeapAlignment = 4096;

int HostSlot(MemoryKind kind) {
  return kind == MemoryKind::kPinnedHost ? 0 : 1;
}

}  // namespace

// ---- MemorySpaces
// -------------------------------------------------------------

MemorySpaces::MemorySpaces(System* system, TransferEngine* engine,
                           PremappedRegion* region,
                           std::vector<DeviceDescription> devices,
                           AllocatePinned allocate_pinned)
    : system_(system),
      engine_(engine),
      region_(region),
      devices_(std::move(devices)),
      device_count_(static_cast<int>(devices_.size())),
      allocate_pinned_(std::move(allocate_pinned)),
      counters_(std::make_shared<HostCounters>()),
      executor_(std::make_unique<transfer_internal::CallbackExecutor>()) {}

MemorySpaces::~MemorySpaces() { Shutdown(); }

void MemorySpaces::Shutdown() {
  // Runs what is queued (host copies, frees) and stops the thread.
  executor_.reset();
  std::vector<std::shared_ptr<State>> live;
  {
    MutexLock lock(&mu_);
    for (const std::weak_ptr<State>& w : host_buffers_) {
      if (std::shared_ptr<State> s = w.lock()) live.push_back(std::move(s));
    }
    host_buffers_.clear();
  }
  for (const std::shared_ptr<State>& s : live) {
    std::shared_ptr<HostStorage> storage;
    {
      MutexLock lock(&s->mu);
      s->freed = true;
      storage = std::move(s->storage);
    }
    // Released here, outside the buffer's lock, while the region is alive.
  }
}

std::vector<MemoryDescription> MemorySpaces::List() const {
  std::vector<MemoryDescription> out;
  std::vector<int> all(device_count_);
  for (int i = 0; i < device_count_; ++i) all[i] = i;
  for (int i = 0; i < device_count_; ++i) {
    out.push_back(MemoryDescription{
        .id = i,
        .kind = MemoryKind::kDevice,
        .kind_name = std::string(MemoryKindName(MemoryKind::kDevice)),
        .description = absl::StrCat(devices_[i].name, " HBM"),
        .devices = {i},
        .capacity_bytes = devices_[i].hbm_bytes});
  }
  out.push_back(MemoryDescription{
      .id = pinned_host_id(),
      .kind = MemoryKind::kPinnedHost,
      .kind_name = std::string(MemoryKindName(MemoryKind::kPinnedHost)),
      .description = region_ != nullptr ? "pinned_host (premapped region)"
                                        : "pinned_host (premapped region off: "
                                          "TPU_PREMAPPED_BUFFER_SIZE=0)",
      .devices = all,
      .capacity_bytes = region_ != nullptr ? region_->size() : 0});
  out.push_back(MemoryDescription{
      .id = unpinned_host_id(),
      .kind = MemoryKind::kUnpinnedHost,
      .kind_name = std::string(MemoryKindName(MemoryKind::kUnpinnedHost)),
      .description = "unpinned_host (pageable host memory)",
      .devices = all,
      .capacity_bytes = 0});
  return out;
}

absl::Status MemorySpaces::CheckMemory(absl::string_view what,
                                       int memory) const {
  if (memory < 0 || memory > unpinned_host_id()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": memory ", memory, " does not exist (memories 0..",
        unpinned_host_id(), ": ",
        device_count_ == 1
            ? "0 is the device's HBM"
            : absl::StrCat("0..", device_count_ - 1, " the devices' HBM"),
        ", ", pinned_host_id(), " pinned_host, ", unpinned_host_id(),
        " unpinned_host)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<BufferState>> MemorySpaces::Use(
    absl::string_view what, const MemoryBuffer& buffer) const {
  const std::shared_ptr<State>& s = buffer.state();
  if (s == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the buffer refers to nothing"));
  }
  if (s->owner != this) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the buffer belongs to another system"));
  }
  if (s->kind == MemoryKind::kDevice && !s->device.valid()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the buffer wraps a DeviceBuffer that refers to nothing"));
  }
  if (s->kind != MemoryKind::kDevice) {
    MutexLock lock(&s->mu);
    if (s->freed) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the ", MemoryKindName(s->kind),
                       " buffer was freed (System::Free, or its system went)"));
    }
  }
  return s;
}

std::shared_ptr<BufferState> MemorySpaces::MakeHostState(
    int memory, std::shared_ptr<HostStorage> storage) {
  auto s = std::make_shared<State>();
  s->owner = this;
  s->memory = memory;
  s->kind = memory == pinned_host_id() ? MemoryKind::kPinnedHost
                                       : MemoryKind::kUnpinnedHost;
  if (storage != nullptr) {
    s->size = storage->size;
    s->data = storage->data;
    s->unpadded = storage->size;
    s->host_bytes = storage->size;
  }
  {
    MutexLock lock(&s->mu);
    s->storage = std::move(storage);
  }
  return s;
}

std::shared_ptr<BufferState> MemorySpaces::NewHostState(
    int memory, std::shared_ptr<HostStorage> storage) {
  std::shared_ptr<State> s = MakeHostState(memory, std::move(storage));
  Publish(s);
  return s;
}

void MemorySpaces::Publish(const std::shared_ptr<State>& s) {
  MutexLock lock(&mu_);
  // Forget buffers that are gone, now and then, so the list stays short.
  if (host_buffers_.size() >= 64 &&
      (host_buffers_.size() & (host_buffers_.size() - 1)) == 0) {
    host_buffers_.erase(
        std::remove_if(
            host_buffers_.begin(), host_buffers_.end(),
            [](const std::weak_ptr<State>& w) { return w.expired(); }),
        host_buffers_.end());
  }
  host_buffers_.push_back(s);
}

absl::StatusOr<std::shared_ptr<HostStorage>> MemorySpaces::NewStorage(
    absl::string_view what, int memory, uint64_t size, const State* request) {
  auto storage = std::make_shared<HostStorage>();
  storage->size = size;
  if (memory == pinned_host_id()) {
    absl::StatusOr<PinnedHostBuffer> p = allocate_pinned_(size);
    if (!p.ok()) {
      // libtpu's text as the region gives it, then the report of what holds
      // pinned_host; other errors say which call and memory they are about.
      if (!absl::IsResourceExhausted(p.status()) || region_ == nullptr) {
        return absl::Status(
            p.status().code(),
            absl::StrCat(what, ": memory ", memory,
                         " (pinned_host): ", p.status().message()));
      }
      std::string text(p.status().message());
      {
        State fallback;
        fallback.size = size;
        fallback.unpadded = size;
        absl::StrAppend(&text, "\n",
                        PinnedReport(request != nullptr ? *request : fallback));
      }
      return absl::Status(p.status().code(), text);
    }
    storage->pinned = *std::move(p);
    storage->data = static_cast<char*>(storage->pinned.data());
    std::memset(storage->data, 0, size);
  } else {
    const uint64_t rounded =
        (size + kHeapAlignment - 1) / kHeapAlignment * kHeapAlignment;
    storage->heap = std::aligned_alloc(kHeapAlignment, rounded);
    if (storage->heap == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, ": out of host memory allocating ", size,
                       " bytes of unpinned_host memory"));
    }
    storage->data = static_cast<char*>(storage->heap);
    std::memset(storage->data, 0, size);
  }
  const int slot = memory == pinned_host_id() ? 0 : 1;
  storage->counters = counters_;
  storage->slot = slot;
  MutexLock lock(&counters_->mu);
  HostCounters::One& c = counters_->host[slot];
  c.bytes_in_use += size;
  c.peak_bytes_in_use = std::max(c.peak_bytes_in_use, c.bytes_in_use);
  ++c.buffers_live;
  // pinned_host allocations are counted by the system's AllocatePinnedHost.
  if (slot == 1) {
    ++c.num_allocs;
    c.largest_alloc_size = std::max(c.largest_alloc_size, size);
  }
  return storage;
}

void MemorySpaces::CountPinnedAllocation(uint64_t size) {
  MutexLock lock(&counters_->mu);
  HostCounters::One& c = counters_->host[0];
  ++c.num_allocs;
  c.largest_alloc_size = std::max(c.largest_alloc_size, size);
}

std::string MemorySpaces::PinnedReport(const State& request) const {
  std::vector<HbmBuffer> buffers;
  uint64_t listed = 0;
  auto entry = [](const State& s, bool failed) {
    HbmBuffer b;
    b.padded_bytes = s.size;
    b.unpadded_bytes = s.unpadded;
    b.held_bytes = (s.size + 63) / 64 * 64;  // the region's 64-byte rounding
    if (!s.shape.empty()) {
      absl::StatusOr<ArrayShape> a = ParseArrayShape(s.shape);
      if (a.ok()) b.shape = *a;
    }
    b.label = s.label;
    b.op_metadata = s.op_metadata;
    b.failed_request = failed;
    return b;
  };
  // Released after the lock: the last reference may free region bytes.
  std::vector<std::shared_ptr<State>> live;
  {
    MutexLock lock(&mu_);
    for (const std::weak_ptr<State>& w : host_buffers_) {
      std::shared_ptr<State> s = w.lock();
      if (s != nullptr && s->kind == MemoryKind::kPinnedHost && !s->aliased) {
        live.push_back(std::move(s));
      }
    }
  }
  for (const std::shared_ptr<State>& s : live) {
    {
      MutexLock state_lock(&s->mu);
      if (s->storage == nullptr) continue;
    }
    buffers.push_back(entry(*s, false));
    listed += buffers.back().held_bytes;
  }
  const RegionAllocator::Stats r = region_->allocator().GetStats();
  if (r.bytes_in_use > listed) {
    HbmBuffer other;
    other.padded_bytes = other.unpadded_bytes = other.held_bytes =
        r.bytes_in_use - listed;
    other.label =
        "(other use of the region: AllocatePinnedHost buffers and transfer "
        "staging)";
    buffers.push_back(other);
  }
  buffers.push_back(entry(request, true));
  return FormatMemorySpaceReport("pinned_host", "pinned_host buffers",
                                 region_->size(), buffers);
}

absl::StatusOr<MemoryBuffer> MemorySpaces::Allocate(int memory, uint64_t size) {
  constexpr absl::string_view kWhat = "AllocateInMemory";
  TPUSHIM_RETURN_IF_ERROR(CheckMemory(kWhat, memory));
  if (memory < device_count_) {
    TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer b,
                             system_->AllocateDevice(memory, size));
    return Wrap(b);
  }
  if (size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": a buffer must be at least 1 byte"));
  }
  State request;
  request.size = request.unpadded = size;
  TPUSHIM_ASSIGN_OR_RETURN(std::shared_ptr<HostStorage> storage,
                           NewStorage(kWhat, memory, size, &request));
  return MemoryBuffer(NewHostState(memory, std::move(storage)));
}

absl::StatusOr<MemoryBuffer> MemorySpaces::Allocate(
    int memory, const DeviceBufferSpec& spec) {
  constexpr absl::string_view kWhat = "AllocateInMemory";
  TPUSHIM_RETURN_IF_ERROR(CheckMemory(kWhat, memory));
  if (memory < device_count_) {
    TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer b,
                             system_->AllocateDevice(memory, spec));
    return Wrap(b);
  }
  // The device's tiled image, as a device would hold it (tpushim/memory.h).
  absl::StatusOr<Shape> parsed = ParseShape(spec.shape);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": ", parsed.status().message()));
  }
  if (parsed->is_tuple) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWhat, ": ", spec.shape,
        " is a tuple; each of its elements is a buffer of its own, allocate "
        "them one by one"));
  }
  absl::StatusOr<ShapeSizes> sizes = ComputeSizes(parsed->array);
  if (!sizes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": ", sizes.status().message()));
  }
  if (sizes->padded_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": ", ToString(parsed->array),
                     " has no elements; a buffer must be at least 1 byte"));
  }
  State request;
  request.size = sizes->padded_bytes;
  request.unpadded = sizes->unpadded_bytes;
  request.shape = ToString(parsed->array);
  request.label = spec.label;
  request.op_metadata = spec.op_metadata;
  TPUSHIM_ASSIGN_OR_RETURN(
      std::shared_ptr<HostStorage> storage,
      NewStorage(kWhat, memory, sizes->padded_bytes, &request));
  std::shared_ptr<State> s = MakeHostState(memory, std::move(storage));
  s->shape = request.shape;
  s->unpadded = sizes->unpadded_bytes;
  s->host_bytes = HostBytes(parsed->array);
  s->label = spec.label;
  s->op_metadata = spec.op_metadata;
  Publish(s);  // whole before a concurrent report can see it
  return MemoryBuffer(std::move(s));
}

MemoryBuffer MemorySpaces::Wrap(const DeviceBuffer& buffer) const {
  auto s = std::make_shared<State>();
  s->owner = this;
  s->memory = buffer.valid() ? buffer.device() : 0;
  s->kind = MemoryKind::kDevice;
  s->device = buffer;
  if (buffer.valid()) {
    s->size = buffer.size();
    s->shape = buffer.shape();
    s->unpadded = buffer.unpadded_size();
    s->host_bytes = buffer.host_size();
    s->label = buffer.label();
    s->op_metadata = buffer.op_metadata();
  }
  return MemoryBuffer(std::move(s));
}

bool MemorySpaces::CanAlias(int memory, const void* data, uint64_t size) const {
  // Any host memory is unpinned_host memory; pinned_host aliases only what
  // every device DMAs directly.
  return memory == unpinned_host_id() ||
         engine_->ClassifyHostRange(data, size) != HostRange::kPageable;
}

absl::StatusOr<MemoryCopy> MemorySpaces::Alias(int memory, const void* data,
                                               uint64_t size, bool is_mutable) {
  // The caller's bytes are free once the last holder (the buffer, copies
  // in flight) lets go: then host_released is set.
  TPUSHIM_ASSIGN_OR_RETURN(CallerEvent made, system_->CreateEvent());
  auto released = std::make_shared<CallerEvent>(std::move(made));
  Event host_released = released->event();
  std::shared_ptr<State> s = MakeHostState(memory, nullptr);
  s->size = s->unpadded = s->host_bytes = size;
  s->data = static_cast<char*>(const_cast<void*>(data));
  s->aliased = true;
  s->mutable_alias = is_mutable;
  {
    MutexLock lock(&counters_->mu);
    HostCounters::One& c = counters_->host[HostSlot(s->kind)];
    ++c.buffers_live;
    if (s->kind == MemoryKind::kUnpinnedHost) {
      c.bytes_in_use += size;
      c.peak_bytes_in_use = std::max(c.peak_bytes_in_use, c.bytes_in_use);
    }
  }
  // Counted out when the last handle goes (or the system does).
  auto counters = counters_;
  const int slot = HostSlot(s->kind);
  const uint64_t in_use = s->kind == MemoryKind::kUnpinnedHost ? size : 0;
  auto release = std::shared_ptr<HostStorage>(
      new HostStorage(),
      [counters, slot, in_use, released = std::move(released)](HostStorage* h) {
        delete h;
        {
          MutexLock lock(&counters->mu);
          counters->host[slot].bytes_in_use -= in_use;
          --counters->host[slot].buffers_live;
        }
        // FAILED_PRECONDITION once the system has shut down: the event was
        // failed with CANCELLED then, which stands.
        (void)released->Set(absl::OkStatus());
      });
  {
    MutexLock lock(&s->mu);
    s->storage = std::move(release);
  }
  Publish(s);  // whole (aliased set) before a concurrent report sees it
  return MemoryCopy{MemoryBuffer(std::move(s)), Event(),
                    std::move(host_released)};
}

absl::StatusOr<MemoryCopy> MemorySpaces::Create(const void* data, uint64_t size,
                                                int memory,
                                                HostBufferSemantics semantics) {
  constexpr absl::string_view kWhat = "CreateMemoryBuffer";
  TPUSHIM_RETURN_IF_ERROR(CheckMemory(kWhat, memory));
  if (size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": a buffer must be at least 1 byte"));
  }
  if (data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": the host data is null"));
  }
  if (memory < device_count_) {
    TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer b,
                             system_->AllocateDevice(memory, size));
    absl::StatusOr<TransferEvents> up =
        system_->TransferToDeviceWithEvents(data, b, 0, size, {}, semantics);
    if (!up.ok()) {
      (void)system_->Deallocate(b);
      return up.status();
    }
    return MemoryCopy{Wrap(b), std::move(up->ready),
                      std::move(up->host_released)};
  }
  const bool zero_copy = semantics == HostBufferSemantics::kImmutableZeroCopy ||
                         semantics == HostBufferSemantics::kMutableZeroCopy;
  const bool is_mutable = semantics == HostBufferSemantics::kMutableZeroCopy;
  if (zero_copy && CanAlias(memory, data, size)) {
    return Alias(memory, data, size, is_mutable);
  }
  if (is_mutable) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWhat, ": kMutableZeroCopy needs the host range [0x",
        absl::Hex(reinterpret_cast<uintptr_t>(data)), ", +", size,
        ") to lie in memory every device DMAs directly (the premapped "
        "region, or host memory registered with RegisterHostMemory) to "
        "alias it as pinned_host, and a copy would not be "
        "mutable through it; allocate the buffer in pinned_host "
        "(AllocateInMemory) and write there, or ask for kImmutableZeroCopy, "
        "which copies"));
  }
  State request;
  request.size = request.unpadded = size;
  TPUSHIM_ASSIGN_OR_RETURN(std::shared_ptr<HostStorage> storage,
                           NewStorage(kWhat, memory, size, &request));
  std::memcpy(storage->data, data, size);
  return MemoryCopy{MemoryBuffer(NewHostState(memory, std::move(storage))),
                    Event(), Event()};
}

absl::StatusOr<MemoryCopy> MemorySpaces::Create(const void* data, int memory,
                                                const DeviceBufferSpec& spec,
                                                HostBufferSemantics semantics) {
  constexpr absl::string_view kWhat = "CreateMemoryBuffer";
  TPUSHIM_RETURN_IF_ERROR(CheckMemory(kWhat, memory));
  if (data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": the host data is null"));
  }
  if (memory < device_count_) {
    TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer b,
                             system_->AllocateDevice(memory, spec));
    absl::StatusOr<TransferEvents> up =
        system_->TransferArrayToDeviceWithEvents(data, b, {}, semantics);
    if (!up.ok()) {
      (void)system_->Deallocate(b);
      return up.status();
    }
    return MemoryCopy{Wrap(b), std::move(up->ready),
                      std::move(up->host_released)};
  }
  absl::StatusOr<ArrayShape> shape = ParseArrayShape(spec.shape);
  if (!shape.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": ", shape.status().message()));
  }
  absl::StatusOr<RelayoutPlan> plan = RelayoutPlan::Create(*shape);
  if (!plan.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": ", plan.status().message()));
  }
  const bool zero_copy = semantics == HostBufferSemantics::kImmutableZeroCopy ||
                         semantics == HostBufferSemantics::kMutableZeroCopy;
  const bool is_mutable = semantics == HostBufferSemantics::kMutableZeroCopy;
  // A host memory holds the device's tiled image (memory.h): the caller's
  // dense array is that image only when the layout keeps it as it is.
  const bool dense = plan->kernel() == RelayoutPlan::Kernel::kIdentity &&
                     plan->device_bytes() == plan->host_bytes() &&
                     plan->host_bytes() != 0;
  if (zero_copy && dense && CanAlias(memory, data, plan->host_bytes())) {
    TPUSHIM_ASSIGN_OR_RETURN(
        MemoryCopy alias, Alias(memory, data, plan->host_bytes(), is_mutable));
    State& a = *alias.buffer.state();
    a.shape = ToString(plan->shape());
    a.label = spec.label;
    a.op_metadata = spec.op_metadata;
    return alias;
  }
  if (is_mutable) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWhat, ": kMutableZeroCopy aliases the caller's array only when ",
        ToString(plan->shape()),
        "'s layout keeps the dense row-major bytes as they are and they lie "
        "in memory every device DMAs directly (pinned_host: the premapped "
        "region or registered host memory); ask for kImmutableZeroCopy, "
        "which copies, or allocate the buffer (AllocateInMemory) and copy "
        "into it"));
  }
  // Allocate checks what is left (a tuple, no elements) and says so.
  TPUSHIM_ASSIGN_OR_RETURN(MemoryBuffer made, Allocate(memory, spec));
  absl::Status packed = plan->Pack(data, 0, plan->device_bytes(), made.data());
  if (!packed.ok()) {
    (void)Free(made, {});
    return packed;
  }
  return MemoryCopy{std::move(made), Event(), Event()};
}

absl::StatusOr<Event> MemorySpaces::ReadyEvent(const MemoryBuffer& buffer) {
  constexpr absl::string_view kWhat = "BufferReadyEvent";
  TPUSHIM_ASSIGN_OR_RETURN(std::shared_ptr<State> s, Use(kWhat, buffer));
  if (s->kind == MemoryKind::kDevice) {
    return system_->BufferReadyEvent(s->device);
  }
  std::vector<std::shared_ptr<transfer_internal::EventState>> writes;
  absl::Status failed;
  {
    MutexLock lock(&s->order_mu);
    writes = s->order.PendingWrites();
    failed = s->order.failed_write();
  }
  if (writes.empty()) return Event::Ready(std::move(failed));
  return Event(transfer_internal::WhenAll(writes, std::move(failed),
                                          executor_.get(), nullptr));
}

absl::StatusOr<Event> MemorySpaces::AfterAll(absl::Span<const Event> wait_for,
                                             std::function<absl::Status()> fn) {
  bool all_ready = true;
  for (const Event& e : wait_for) {
    if (!e.IsReady()) all_ready = false;
  }
  if (all_ready) {
    for (const Event& e : wait_for) {
      absl::Status s = e.Await();
      if (!s.ok()) return Event::Ready(s);
    }
    return Event::Ready(fn());
  }
  if (executor_ == nullptr) {
    return absl::FailedPreconditionError("The system is shutting down");
  }
  auto event = std::make_shared<transfer_internal::EventState>(executor_.get());
  struct Join {
    std::atomic<int> pending;
    Mutex mu;
    absl::Status first ABSL_GUARDED_BY(mu);
    std::function<absl::Status()> fn;
  };
  auto join = std::make_shared<Join>();
  join->pending.store(static_cast<int>(wait_for.size()));
  join->fn = std::move(fn);
  transfer_internal::CallbackExecutor* executor = executor_.get();
  for (const Event& e : wait_for) {
    e.state()->AddContinuation([join, event, executor](const absl::Status& s) {
      if (!s.ok()) {
        MutexLock lock(&join->mu);
        if (join->first.ok()) join->first = s;
      }
      if (join->pending.fetch_sub(1) != 1) return;
      // Off the resolving (DMA) thread: the work may copy many bytes.
      executor->Post([join, event] {
        absl::Status first;
        {
          MutexLock lock(&join->mu);
          first = join->first;
        }
        const absl::Status status = first.ok() ? join->fn() : first;
        join->fn = nullptr;  // what it holds goes before the event is ready
        event->Resolve(status);
      });
    });
  }
  return Event(event);
}

absl::StatusOr<MemoryCopy> MemorySpaces::CopyToMemory(
    const MemoryBuffer& src, int memory, absl::Span<const Event> wait_for) {
  constexpr absl::string_view kWhat = "CopyToMemory";
  TPUSHIM_RETURN_IF_ERROR(CheckMemory(kWhat, memory));
  TPUSHIM_ASSIGN_OR_RETURN(std::shared_ptr<State> s, Use(kWhat, src));
  std::shared_ptr<HostStorage> src_storage;
  if (s->kind != MemoryKind::kDevice) {
    MutexLock lock(&s->mu);
    src_storage = s->storage;
  }
  // The destination: the same shape (or size) in `memory`.
  DeviceBufferSpec spec{
      .shape = s->shape, .label = s->label, .op_metadata = s->op_metadata};
  absl::StatusOr<MemoryBuffer> dst =
      s->shape.empty() ? Allocate(memory, s->size) : Allocate(memory, spec);
  if (!dst.ok()) return dst.status();
  const std::shared_ptr<State>& d = dst->state();
  std::shared_ptr<HostStorage> dst_storage;
  if (d->kind != MemoryKind::kDevice) {
    MutexLock lock(&d->mu);
    dst_storage = d->storage;
  }
  // The bytes both hold (a device may round a buffer up to its block).
  const uint64_t n = std::min(s->size, d->size);
  using transfer_internal::BufferOrder;
  // The copy, waiting for `waits`; its event is ready once both sides'
  // host bytes are let go of (below).
  auto submit = [&](absl::Span<const Event> waits) -> absl::StatusOr<Event> {
    absl::StatusOr<Event> event;
    if (s->kind == MemoryKind::kDevice && d->kind == MemoryKind::kDevice) {
      event =
          system_->TransferDeviceToDevice(s->device, 0, d->device, 0, n, waits);
    } else if (s->kind == MemoryKind::kDevice) {
      // Straight into the destination's bytes: in pinned_host that is the
      // region, which the device DMAs directly.
      event = system_->TransferFromDevice(
          s->device, 0, d->data, n, waits,
          HostBufferSemantics::kImmutableUntilTransferCompletes);
    } else if (d->kind == MemoryKind::kDevice) {
      event = system_->TransferToDevice(
          s->data, d->device, 0, n, waits,
          HostBufferSemantics::kImmutableUntilTransferCompletes);
    } else {
      char* const to = d->data;
      const char* const from = s->data;
      event = AfterAll(waits, [to, from, n] {
        std::memmove(to, from, n);
        return absl::OkStatus();
      });
    }
    if (!event.ok()) return event;
    // Both sides' host bytes live until the copy is done, whatever Free
    // does. The caller's event is ready only once those holds are gone: a
    // caller that awaits the copy and then frees either buffer gets its
    // bytes back at once (the transfer's own event wakes its waiters before
    // its continuations run, so it cannot promise that).
    if (src_storage != nullptr || dst_storage != nullptr) {
      auto released =
          std::make_shared<transfer_internal::EventState>(executor_.get());
      event->state()->AddContinuation(
          [src_storage = std::move(src_storage),
           dst_storage = std::move(dst_storage),
           released](const absl::Status& status) mutable {
            src_storage.reset();
            dst_storage.reset();
            released->Resolve(status);
          });
      *event = Event(std::move(released));
    }
    return event;
  };
  absl::StatusOr<Event> event;
  if (s->kind == MemoryKind::kDevice) {
    // A device source is the engine's to order.
    event = submit(wait_for);
  } else {
    // A host source is read in its order: the copy waits for the writes
    // issued to it before (their end, not their success: the source's
    // ready event carries a failure), and takes its place as a read in
    // the same critical section in which it is submitted.
    MutexLock lock(&s->order_mu);
    std::vector<BufferOrder::Wait> after;
    s->order.Conflicts({0, s->size}, BufferOrder::Access::kRead, &after);
    std::vector<Event> waits(wait_for.begin(), wait_for.end());
    for (const BufferOrder::Wait& w : after) {
      waits.push_back(Event(transfer_internal::EndOf(w.event)));
    }
    event = submit(waits);
    if (event.ok()) {
      s->order.Record({0, s->size}, BufferOrder::Access::kRead, event->state(),
                      /*tag=*/-1);
    }
  }
  if (!event.ok()) {
    (void)Free(*dst, {});
    return event.status();
  }
  if (d->kind != MemoryKind::kDevice) {
    // The copy is the write that fills the new buffer: its readiness.
    MutexLock lock(&d->order_mu);
    d->order.Record({0, d->size}, BufferOrder::Access::kWrite, event->state(),
                    /*tag=*/-1);
  }
  Event done = *event;
  return MemoryCopy{*std::move(dst), std::move(done), *std::move(event)};
}

absl::StatusOr<Event> MemorySpaces::Free(const MemoryBuffer& buffer,
                                         absl::Span<const Event> wait_for) {
  constexpr absl::string_view kWhat = "Free";
  TPUSHIM_ASSIGN_OR_RETURN(std::shared_ptr<State> s, Use(kWhat, buffer));
  if (s->kind == MemoryKind::kDevice) {
    return system_->Deallocate(s->device, wait_for);
  }
  std::shared_ptr<HostStorage> storage;
  {
    MutexLock lock(&s->mu);
    if (s->freed) {
      return absl::InvalidArgumentError(
          absl::StrCat(kWhat, ": the ", MemoryKindName(s->kind),
                       " buffer was freed already"));
    }
    s->freed = true;
    storage = std::move(s->storage);
  }
  // Released once `wait_for` is done (and copies in flight, which hold
  // their own reference).
  return AfterAll(wait_for, [storage = std::move(storage)]() mutable {
    storage.reset();
    return absl::OkStatus();
  });
}

MemoryStats MemorySpaces::HostStats(int memory) const {
  MemoryStats m;
  m.memory = memory;
  const bool pinned = memory == pinned_host_id();
  m.kind = pinned ? MemoryKind::kPinnedHost : MemoryKind::kUnpinnedHost;
  HostCounters::One c;
  {
    MutexLock lock(&counters_->mu);
    c = counters_->host[pinned ? 0 : 1];
  }
  m.num_allocs = c.num_allocs;
  m.largest_alloc_size = c.largest_alloc_size;
  m.buffers_live = c.buffers_live;
  if (pinned) {
    if (region_ != nullptr) {
      const RegionAllocator::Stats r = region_->allocator().GetStats();
      m.bytes_in_use = r.bytes_in_use;
      m.peak_bytes_in_use = r.peak_bytes_in_use;
      m.bytes_limit = r.capacity_bytes;
      m.largest_free_block_bytes = r.largest_free_block;
    }
  } else {
    m.bytes_in_use = c.bytes_in_use;
    m.peak_bytes_in_use = c.peak_bytes_in_use;
    m.has_bytes_limit = false;
  }
  return m;
}

}  // namespace tpushim
