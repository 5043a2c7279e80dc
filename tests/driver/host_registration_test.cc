// Registered host memory (System::RegisterHostMemory, PJRT's DmaMap): the
// caller's own range, pinned once and mapped for every device, makes the
// transfers inside it zero-copy whatever their size, with the region on
// or off; the named errors change nothing; Unregister waits for the
// transfers that use the range; a System destroyed with registrations
// left releases them; a fork() child is refused and cannot touch the
// range; every register/unregister syscall failing leaves nothing pinned.

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "driver/system_internal.h"
#include "env/fault_injection.h"
#include "env/fork_guard.h"
#include "env/os.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logging/log.h"
#include "tests/testing/fork_child.h"
#include "tests/testing/scoped_test_logging.h"
#include "tests/testing/transfer_rig.h"
#include "tpushim/system.h"

namespace tpushim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testutil::RunForkedChild;
using testutil::ScopedTestLogging;

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr int kToDevice = 0;
constexpr int kFromDevice = 1;
constexpr int kZeroCopy = static_cast<int>(TransferPath::kZeroCopy);

OptionOverrides Options(uint64_t region,
                        std::string device = "sim://?devices=2&hbm=64M") {
  OptionOverrides o;
  o.premapped_buffer_size = region;
  o.device = std::move(device);
  o.prefault_threads = 1;
  return o;
}

// Caller memory of its own mapping (page-aligned), filled with a pattern.
class CallerMemory {
 public:
  explicit CallerMemory(uint64_t size) : size_(size) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    data_ = static_cast<char*>(p);
    Fill(1);
  }
  ~CallerMemory() { munmap(data_, size_); }
  CallerMemory(const CallerMemory&) = delete;
  CallerMemory& operator=(const CallerMemory&) = delete;

  char* data() const { return data_; }
  uint64_t size() const { return size_; }
  void Fill(int seed) {
    for (uint64_t i = 0; i < size_; ++i) {
      data_[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 12)) & 0xff);
    }
  }

 private:
  char* data_ = nullptr;
  uint64_t size_;
};

std::unique_ptr<System> Start(const OptionOverrides& o, Os* os) {
  absl::StatusOr<std::unique_ptr<System>> s = SystemFactory::Create(o, os);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

absl::Status Wait(const absl::StatusOr<Event>& e) {
  if (!e.ok()) return e.status();
  return e->Await();
}

// Up from `host` to a new buffer on `device` and back into `back`; the
// buffer is freed. True when the bytes came back.
bool RoundTrip(System& system, const char* host, char* back, uint64_t n,
               int device = 0) {
  absl::StatusOr<DeviceBuffer> b = system.AllocateDevice(device, n);
  if (!b.ok()) return false;
  const absl::Status up = Wait(system.TransferToDevice(host, *b, 0, n));
  const absl::Status down = Wait(system.TransferFromDevice(*b, 0, back, n));
  (void)Wait(system.Deallocate(*b));
  return up.ok() && down.ok() && std::memcmp(host, back, n) == 0;
}

// ---- Paths ------------------------------------------------------------------

void ExpectZeroCopyInsideWhateverTheSize(uint64_t region) {
  ScopedTestLogging logs({{"engine_queues", 1}});
  FixedEnvironmentOs os(Os::Default());
  std::unique_ptr<System> system = Start(Options(region), &os);
  ASSERT_NE(system, nullptr);
  CallerMemory mem(4 * kMiB);
  // Above the threshold (8 MiB / 2 with the region on), and tiny.
  EXPECT_NE(system->PathFor(mem.data(), mem.size()), TransferPath::kZeroCopy);
  absl::StatusOr<HostRegistration> reg =
      system->RegisterHostMemory(mem.data(), mem.size());
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(reg->data(), mem.data());
  EXPECT_EQ(reg->size(), mem.size());
  EXPECT_EQ(system->PathFor(mem.data(), mem.size()), TransferPath::kZeroCopy);
  EXPECT_EQ(system->PathFor(mem.data() + 100, 64), TransferPath::kZeroCopy);
  // Not wholly inside: another path.
  EXPECT_NE(system->PathFor(mem.data() + mem.size() - 64, 128),
            TransferPath::kZeroCopy);
  {
    // Caller memory past a registration's end (as a buffer mapped above
    // it) is not inside it either.
    CallerMemory probe(64 * kKiB);
    absl::StatusOr<HostRegistration> low =
        system->RegisterHostMemory(probe.data(), 16 * kKiB);
    ASSERT_TRUE(low.ok()) << low.status();
    EXPECT_EQ(system->PathFor(probe.data(), 64), TransferPath::kZeroCopy);
    EXPECT_NE(system->PathFor(probe.data() + 16 * kKiB, 64),
              TransferPath::kZeroCopy);
    EXPECT_NE(system->PathFor(probe.data() + 32 * kKiB, 64),
              TransferPath::kZeroCopy);
  }

  SystemStats s = system->GetStats();
  EXPECT_EQ(s.transfers.registrations_live, 1u);
  EXPECT_EQ(s.transfers.registered_bytes, mem.size());
  EXPECT_GE(s.transfers.pinned_bytes_now, mem.size());

  // Both directions, both sizes, on both devices; the data arrives.
  CallerMemory back(4 * kMiB);
  absl::StatusOr<HostRegistration> back_reg =
      system->RegisterHostMemory(back.data(), back.size());
  ASSERT_TRUE(back_reg.ok()) << back_reg.status();
  EXPECT_TRUE(RoundTrip(*system, mem.data(), back.data(), mem.size(), 0));
  EXPECT_TRUE(RoundTrip(*system, mem.data() + 8, back.data() + 16, 64, 1));
  s = system->GetStats();
  for (int d : {kToDevice, kFromDevice}) {
    EXPECT_EQ(s.transfers.zero_copy_registered_transfers[d], 2u);
    EXPECT_EQ(s.transfers.zero_copy_registered_bytes[d], mem.size() + 64);
    EXPECT_EQ(s.transfers.host[d][kZeroCopy].transfers, 2u);
  }
  EXPECT_EQ(s.transfers.registrations_live, 2u);
  EXPECT_TRUE(logging::FlushLogs());
  EXPECT_THAT(logs.File("INFO"),
              HasSubstr("zero_copy path (the host buffer is in registered "
                        "host memory)"));

  // Unregistered: the range takes its old path again, nothing is pinned.
  EXPECT_TRUE(reg->Unregister().ok());
  EXPECT_FALSE(*reg);
  EXPECT_TRUE(reg->Unregister().ok());  // empty: nothing to do
  EXPECT_TRUE(back_reg->Unregister().ok());
  EXPECT_NE(system->PathFor(mem.data(), mem.size()), TransferPath::kZeroCopy);
  s = system->GetStats();
  EXPECT_EQ(s.transfers.registrations_live, 0u);
  EXPECT_EQ(s.transfers.registered_bytes, 0u);
  EXPECT_EQ(s.transfers.pinned_bytes_now, 0u);
  EXPECT_TRUE(RoundTrip(*system, mem.data(), back.data(), mem.size()));
  EXPECT_EQ(system->GetStats().transfers.zero_copy_registered_transfers[0], 2u);
}

TEST(HostRegistrationTest, TransfersInsideAreZeroCopyWhateverTheSize) {
  ExpectZeroCopyInsideWhateverTheSize(8 * kMiB);
}

TEST(HostRegistrationTest, WorksWithTheRegionOff) {
  ExpectZeroCopyInsideWhateverTheSize(0);
}

TEST(HostRegistrationTest, ArrayTransfersInsideAreZeroCopyWhenNothingMoves) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  std::unique_ptr<System> system = Start(Options(8 * kMiB), &os);
  ASSERT_NE(system, nullptr);
  CallerMemory mem(2 * kMiB);
  CallerMemory back(2 * kMiB);
  absl::StatusOr<HostRegistration> a =
      system->RegisterHostMemory(mem.data(), mem.size());
  absl::StatusOr<HostRegistration> b =
      system->RegisterHostMemory(back.data(), back.size());
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  // A byte buffer, and an array whose device layout is the dense array:
  // the device DMAs the caller's memory. A tiled layout needs the copy
  // that lays it out, through staging.
  struct Case {
    std::string shape;  // "" = a byte buffer
    bool zero_copy;
  };
  uint64_t expected = 0;
  for (const Case& c : {Case{"", true}, Case{"f32[64,300]{1,0}", true},
                        Case{"f32[64,300]", false}}) {
    SCOPED_TRACE(c.shape);
    absl::StatusOr<DeviceBuffer> buf =
        c.shape.empty()
            ? system->AllocateDevice(0, 64 * 300 * 4)
            : system->AllocateDevice(0, DeviceBufferSpec{.shape = c.shape});
    ASSERT_TRUE(buf.ok()) << buf.status();
    const uint64_t n = buf->host_size();
    std::memset(back.data(), 0, n);
    ASSERT_TRUE(Wait(system->TransferArrayToDevice(mem.data(), *buf)).ok());
    ASSERT_TRUE(Wait(system->TransferArrayFromDevice(*buf, back.data())).ok());
    EXPECT_EQ(std::memcmp(mem.data(), back.data(), n), 0);
    if (c.zero_copy) expected += 1;
    const TransferStats t = system->GetStats().transfers;
    EXPECT_EQ(t.zero_copy_registered_transfers[kToDevice], expected);
    EXPECT_EQ(t.zero_copy_registered_transfers[kFromDevice], expected);
    ASSERT_TRUE(Wait(system->Deallocate(*buf)).ok());
  }
}

TEST(HostRegistrationTest,
     ArraysInThePremappedRegionAreZeroCopyWhenNothingMoves) {
  // The same rule for the region's pinned buffers: an array whose device
  // image is the dense array (f32[1024,128] keeps TPU's default layout,
  // one T(8,128) tile row per 8 rows) moves in place; a tiled one is laid
  // out through staging.
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  std::unique_ptr<System> system = Start(Options(8 * kMiB), &os);
  ASSERT_NE(system, nullptr);
  struct Case {
    std::string shape;
    bool zero_copy;
  };
  uint64_t expected = 0;
  for (const Case& c :
       {Case{"f32[1024,128]", true}, Case{"f32[64,300]{1,0}", true},
        Case{"f32[64,300]", false}}) {
    SCOPED_TRACE(c.shape);
    absl::StatusOr<DeviceBuffer> buf =
        system->AllocateDevice(0, DeviceBufferSpec{.shape = c.shape});
    ASSERT_TRUE(buf.ok()) << buf.status();
    const uint64_t n = buf->host_size();
    absl::StatusOr<PinnedHostBuffer> src = system->AllocatePinnedHost(n);
    absl::StatusOr<PinnedHostBuffer> back = system->AllocatePinnedHost(n);
    ASSERT_TRUE(src.ok() && back.ok()) << src.status() << back.status();
    for (uint64_t i = 0; i < n; ++i) {
      static_cast<uint8_t*>(src->data())[i] = static_cast<uint8_t>(i * 7);
    }
    std::memset(back->data(), 0, n);
    ASSERT_TRUE(Wait(system->TransferArrayToDevice(src->data(), *buf)).ok());
    ASSERT_TRUE(Wait(system->TransferArrayFromDevice(*buf, back->data())).ok());
    EXPECT_EQ(std::memcmp(src->data(), back->data(), n), 0);
    if (c.zero_copy) expected += 1;
    const TransferStats t = system->GetStats().transfers;
    EXPECT_EQ(t.host[kToDevice][kZeroCopy].transfers, expected);
    EXPECT_EQ(t.host[kFromDevice][kZeroCopy].transfers, expected);
    EXPECT_EQ(t.zero_copy_registered_transfers[kToDevice], 0u);
    ASSERT_TRUE(Wait(system->Deallocate(*buf)).ok());
  }
}

// ---- Named errors -----------------------------------------------------------

void ExpectInvalid(const absl::StatusOr<HostRegistration>& r,
                   const std::vector<std::string>& words) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
      << r.status();
  for (const std::string& w : words) {
    EXPECT_THAT(r.status().message(), HasSubstr(w));
  }
}

std::string Hex(const void* p) {
  return absl::StrFormat("0x%x", reinterpret_cast<uintptr_t>(p));
}

TEST(HostRegistrationTest, RefusesBadRangesAndChangesNothing) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  std::unique_ptr<System> system = Start(Options(8 * kMiB), &os);
  ASSERT_NE(system, nullptr);
  CallerMemory mem(2 * kMiB);
  ExpectInvalid(system->RegisterHostMemory(nullptr, 4096), {"null"});
  ExpectInvalid(system->RegisterHostMemory(mem.data(), 0), {"size is 0"});
  absl::StatusOr<HostRegistration> first =
      system->RegisterHostMemory(mem.data(), kMiB);
  ASSERT_TRUE(first.ok()) << first.status();
  // Overlapping a registration: both ranges named.
  ExpectInvalid(
      system->RegisterHostMemory(mem.data() + kMiB / 2, kMiB),
      {"overlaps the registered range", Hex(mem.data()), Hex(mem.data() + kMiB),
       Hex(mem.data() + kMiB / 2), Hex(mem.data() + kMiB + kMiB / 2)});
  ExpectInvalid(system->RegisterHostMemory(mem.data() + 4096, 4096),
                {"overlaps the registered range"});
  // The premapped region.
  absl::StatusOr<PinnedHostBuffer> pinned = system->AllocatePinnedHost(4096);
  ASSERT_TRUE(pinned.ok());
  ExpectInvalid(system->RegisterHostMemory(pinned->data(), 4096),
                {"overlaps the premapped region"});
  // Nothing changed: one registration, and the rest of the memory
  // registers.
  EXPECT_EQ(system->GetStats().transfers.registrations_live, 1u);
  EXPECT_EQ(system->GetStats().transfers.registered_bytes, kMiB);
  absl::StatusOr<HostRegistration> second =
      system->RegisterHostMemory(mem.data() + kMiB, kMiB);
  EXPECT_TRUE(second.ok()) << second.status();
}

// A device that can DMA only whole IOMMU pages (as vfio:// states it); and
// the engine's bounce pool, which is not the caller's to register.
TEST(HostRegistrationTest, RefusesARangeTheDeviceCannotMapNamingTheAlignment) {
  ScopedTestLogging logs;
  absl::StatusOr<std::unique_ptr<testutil::TransferRig>> rig =
      testutil::TransferRig::Create(
          {.region_bytes = 0, .window_alignment = 4096});
  ASSERT_TRUE(rig.ok()) << rig.status();
  TransferEngine& engine = (*rig)->engine();
  CallerMemory mem(64 * kKiB);
  for (const auto& [at, n] :
       {std::pair<uint64_t, uint64_t>{64, 4096}, {0, 4096 + 64}, {0, 100}}) {
    absl::StatusOr<uint64_t> r = engine.RegisterHostMemory(mem.data() + at, n);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(),
                AllOf(HasSubstr("4096-byte aligned"), HasSubstr("sim:0")));
  }
  // The region is off: the one window is the engine's bounce pool, the
  // runtime's own memory.
  const auto windows = (*rig)->HostWindows(0);
  ASSERT_EQ(windows.size(), 1u);
  absl::StatusOr<uint64_t> pool =
      engine.RegisterHostMemory(windows[0].first, windows[0].second);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(pool.status().message(), HasSubstr("bounce pool"));
  EXPECT_EQ(engine.GetStats().registrations_live, 0u);
  EXPECT_EQ(engine.GetStats().pinned_bytes_now, 0u);
  absl::StatusOr<uint64_t> aligned =
      engine.RegisterHostMemory(mem.data() + 4096, 8192);
  ASSERT_TRUE(aligned.ok()) << aligned.status();
  EXPECT_TRUE(engine.UnregisterHostMemory(*aligned).ok());
  // Unregistered already, or never issued.
  EXPECT_EQ(engine.UnregisterHostMemory(*aligned).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*rig)->TearDownAndReport(), "");
}

// An OS whose pins fail past a small memlock limit, without CAP_IPC_LOCK.
class SmallMemlockOs : public OsWrapper {
 public:
  using OsWrapper::OsWrapper;
  absl::Status PinRange(const void* addr, size_t length) override {
    if (length > kLimit) {
      return absl::ResourceExhaustedError("mlock: Cannot allocate memory");
    }
    return OsWrapper::PinRange(addr, length);
  }
  absl::StatusOr<ResourceLimit> GetMemlockLimit() override {
    return ResourceLimit{.soft = kLimit, .hard = 64 * kMiB};
  }
  bool HasIpcLockCapability() override { return false; }
  static constexpr uint64_t kLimit = 64 * kKiB;
};

TEST(HostRegistrationTest, APinThatFailsNamesTheMemlockLimitAndTheFix) {
  ScopedTestLogging logs;
  FixedEnvironmentOs env(Os::Default());
  SmallMemlockOs os(&env);
  std::unique_ptr<System> system = Start(Options(0), &os);
  ASSERT_NE(system, nullptr);
  CallerMemory mem(kMiB);
  absl::StatusOr<HostRegistration> r =
      system->RegisterHostMemory(mem.data(), mem.size());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr("RLIMIT_MEMLOCK soft limit is 65536"),
                    HasSubstr("lacks CAP_IPC_LOCK"),
                    HasSubstr("raise the limit with `ulimit -l"),
                    HasSubstr("LimitMEMLOCK=infinity")));
  const TransferStats t = system->GetStats().transfers;
  EXPECT_EQ(t.registrations_live, 0u);
  EXPECT_EQ(t.pinned_bytes_now, 0u);
  EXPECT_FALSE(IsExcludedFromFork(mem.data()));
}

// ---- Races and lifetimes ----------------------------------------------------

// Unregister waits for the transfers inside the range, from several
// threads at once, queued ones included: once it returns none is still
// running, the device has every byte, and later transfers take another
// path.
TEST(HostRegistrationTest, UnregisterWaitsForTheTransfersUsingTheRange) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  // A slow link, so that transfers are still running when Unregister
  // starts.
  std::unique_ptr<System> system =
      Start(Options(8 * kMiB, "sim://?devices=2&hbm=64M&link_gbps=2"), &os);
  ASSERT_NE(system, nullptr);
  constexpr int kThreads = 4;
  constexpr uint64_t kSlice = kMiB;
  CallerMemory mem(kThreads * kSlice);
  absl::StatusOr<HostRegistration> reg =
      system->RegisterHostMemory(mem.data(), mem.size());
  ASSERT_TRUE(reg.ok()) << reg.status();
  std::vector<DeviceBuffer> bufs;
  for (int i = 0; i < kThreads; ++i) {
    absl::StatusOr<DeviceBuffer> b = system->AllocateDevice(i % 2, kSlice);
    ASSERT_TRUE(b.ok());
    bufs.push_back(*b);
  }
  // A transfer in flight when Unregister starts must be done when it
  // returns.
  absl::StatusOr<Event> first =
      system->TransferToDevice(mem.data(), bufs[0], 0, kSlice);
  ASSERT_TRUE(first.ok());
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      char* slice = mem.data() + i * kSlice;
      while (!stop.load()) {
        absl::StatusOr<Event> up =
            system->TransferToDevice(slice, bufs[i], 0, kSlice);
        absl::StatusOr<Event> down =
            up.ok()
                ? system->TransferFromDevice(bufs[i], 0, slice, kSlice, {*up})
                : up;
        if (!Wait(down).ok()) failures.fetch_add(1);
      }
    });
  }
  const absl::Status s = reg->Unregister();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(first->IsReady());
  EXPECT_NE(system->PathFor(mem.data(), kSlice), TransferPath::kZeroCopy);
  stop.store(true);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  const TransferStats t = system->GetStats().transfers;
  EXPECT_GE(t.zero_copy_registered_transfers[kToDevice], 1u);
  EXPECT_EQ(t.registrations_live, 0u);
  EXPECT_EQ(t.pinned_bytes_now, 0u);
  EXPECT_EQ(t.events_pending, 0u);
  // Every slice still holds its pattern (each thread moved its own bytes
  // down and back).
  CallerMemory expect(kThreads * kSlice);
  EXPECT_EQ(std::memcmp(mem.data(), expect.data(), mem.size()), 0);
}

// Registrations from several threads at once, over neighbouring ranges:
// each is either live or refused, never both pinned twice.
TEST(HostRegistrationTest, RegistersAndUnregistersFromSeveralThreads) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  std::unique_ptr<System> system = Start(Options(0), &os);
  ASSERT_NE(system, nullptr);
  constexpr int kThreads = 4;
  CallerMemory mem(16 * 64 * kKiB);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 50; ++round) {
        // Ranges of 2 pages that overlap their neighbours' (i ± 1).
        char* at = mem.data() + ((i + round) % 15) * 64 * kKiB;
        absl::StatusOr<HostRegistration> r =
            system->RegisterHostMemory(at, 128 * kKiB);
        if (r.ok()) {
          std::vector<char> back(4096);
          if (!RoundTrip(*system, at, back.data(), back.size())) {
            wrong.fetch_add(1);
          }
          if (!r->Unregister().ok()) wrong.fetch_add(1);
        } else if (!absl::StrContains(r.status().message(), "overlaps")) {
          wrong.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  const TransferStats t = system->GetStats().transfers;
  EXPECT_EQ(t.registrations_live, 0u);
  EXPECT_EQ(t.pinned_bytes_now, 0u);
}

TEST(HostRegistrationTest, DestroyingTheSystemReleasesRegistrationsLeft) {
  ScopedTestLogging logs;
  FixedEnvironmentOs env(Os::Default());
  FaultInjector injector;
  FaultInjectingOs os(&env, &injector);
  CallerMemory mem(2 * kMiB);
  HostRegistration kept;
  HostRegistration moved;
  {
    std::unique_ptr<System> system = Start(Options(8 * kMiB), &os);
    ASSERT_NE(system, nullptr);
    absl::StatusOr<HostRegistration> a =
        system->RegisterHostMemory(mem.data(), kMiB);
    absl::StatusOr<HostRegistration> b =
        system->RegisterHostMemory(mem.data() + kMiB, kMiB);
    ASSERT_TRUE(a.ok() && b.ok());
    kept = *std::move(a);
    moved = *std::move(b);
    // A transfer in flight, too.
    absl::StatusOr<DeviceBuffer> buf = system->AllocateDevice(0, kMiB);
    ASSERT_TRUE(buf.ok());
    ASSERT_TRUE(system->TransferToDevice(mem.data(), *buf, 0, kMiB).ok());
    EXPECT_TRUE(IsExcludedFromFork(mem.data()));
  }
  EXPECT_TRUE(logging::FlushLogs());
  EXPECT_THAT(logs.File("WARNING"),
              HasSubstr("2 host memory registration(s) of 2097152 bytes"));
  EXPECT_EQ(os.pinned_bytes(), 0u);
  EXPECT_FALSE(IsExcludedFromFork(mem.data()));
  // Outliving the system: Unregister does nothing and says OK, and so do
  // the destructors.
  EXPECT_TRUE(kept);
  EXPECT_TRUE(kept.Unregister().ok());
  EXPECT_FALSE(kept);
}

// Unregisters on one thread while another destroys the system: each is
// OK (done, or released by the system), and nothing stays pinned.
TEST(HostRegistrationTest, UnregisterRacingTheSystemsDestructionIsOk) {
  ScopedTestLogging logs;
  FixedEnvironmentOs env(Os::Default());
  FaultInjector injector;
  FaultInjectingOs os(&env, &injector);
  constexpr int kRegistrations = 16;
  CallerMemory mem(kRegistrations * 64 * kKiB);
  std::vector<HostRegistration> regs;
  std::unique_ptr<System> system = Start(Options(0), &os);
  ASSERT_NE(system, nullptr);
  absl::StatusOr<DeviceBuffer> buf = system->AllocateDevice(0, 64 * kKiB);
  ASSERT_TRUE(buf.ok());
  for (int i = 0; i < kRegistrations; ++i) {
    char* at = mem.data() + i * 64 * kKiB;
    absl::StatusOr<HostRegistration> r =
        system->RegisterHostMemory(at, 64 * kKiB);
    ASSERT_TRUE(r.ok()) << r.status();
    regs.push_back(*std::move(r));
    // A transfer inside each, left running.
    ASSERT_TRUE(system->TransferToDevice(at, *buf, 0, 64 * kKiB).ok());
  }
  std::atomic<int> not_ok{0};
  std::thread unregistering([&] {
    for (HostRegistration& r : regs) {
      if (!r.Unregister().ok()) not_ok.fetch_add(1);
    }
  });
  system.reset();
  unregistering.join();
  EXPECT_EQ(not_ok.load(), 0);
  EXPECT_EQ(os.pinned_bytes(), 0u);
  EXPECT_FALSE(IsExcludedFromFork(mem.data()));
}

TEST(HostRegistrationTest, AForkChildIsRefusedAndCannotTouchTheRange) {
  ScopedTestLogging logs;
  FixedEnvironmentOs os(Os::Default());
  std::unique_ptr<System> system = Start(Options(0), &os);
  ASSERT_NE(system, nullptr);
  // Whole pages inside the range are excluded; the range is the pages.
  CallerMemory mem(256 * kKiB);
  absl::StatusOr<HostRegistration> reg =
      system->RegisterHostMemory(mem.data(), mem.size());
  ASSERT_TRUE(reg.ok()) << reg.status();
  CallerMemory other(64 * kKiB);
  char* const p = mem.data();
  const char before = p[100];

  const auto refused = RunForkedChild([&] {
    const auto fork_error = [](const absl::Status& s) {
      return s.code() == absl::StatusCode::kFailedPrecondition &&
             absl::StrContains(s.message(), "fork() child");
    };
    if (!fork_error(
            system->RegisterHostMemory(other.data(), other.size()).status())) {
      return 1;
    }
    if (!fork_error(reg->Unregister())) return 2;
    return 0;
  });
  EXPECT_TRUE(refused.Exited(0)) << refused.Describe();

  const auto touched = RunForkedChild([p] {
    signal(SIGSEGV, SIG_DFL);  // the kernel's verdict
    p[100] = 1;
    return 0;
  });
  EXPECT_TRUE(touched.KilledBy(SIGSEGV)) << touched.Describe();
  EXPECT_EQ(p[100], before);

  // Unregistered, a child inherits the memory again.
  ASSERT_TRUE(reg->Unregister().ok());
  const auto inherited =
      RunForkedChild([p, before] { return p[100] == before ? 0 : 1; });
  EXPECT_TRUE(inherited.Exited(0)) << inherited.Describe();
}

// ---- Fault sweep ------------------------------------------------------------

// Every injectable call that registering, a transfer inside the range and
// unregistering make is failed in turn: each run ends OK or with exactly
// the injected failure, and leaves nothing pinned, locked or excluded.
TEST(HostRegistrationTest, EveryRegisterAndUnregisterCallFailsCleanly) {
  ScopedTestLogging logs;
  FixedEnvironmentOs env(Os::Default());
  FaultInjector injector;
  FaultInjectingOs os(&env, &injector);
  CallerMemory mem(kMiB);
  CallerMemory back(kMiB);
  absl::StatusOr<FaultSweepReport> report =
      SweepEveryCall(injector, FaultPointSet::All(), [&](FaultSweepRun& run) {
        SCOPED_TRACE(run.Name());
        {
          absl::StatusOr<std::unique_ptr<System>> started =
              SystemFactory::Create(Options(0), &os, &injector);
          ASSERT_TRUE(started.ok()) << started.status();
          System& system = **started;
          absl::StatusOr<DeviceBuffer> buf = system.AllocateDevice(0, kMiB);
          ASSERT_TRUE(buf.ok());
          run.Arm();
          absl::StatusOr<HostRegistration> reg =
              system.RegisterHostMemory(mem.data(), mem.size());
          absl::Status status = reg.status();
          if (reg.ok()) {
            status = Wait(system.TransferToDevice(mem.data(), *buf, 0, kMiB));
            if (status.ok()) {
              status =
                  Wait(system.TransferFromDevice(*buf, 0, mem.data(), kMiB));
            }
            const absl::Status un = reg->Unregister();
            EXPECT_TRUE(un.ok()) << un;  // what fails there is logged
          }
          run.Disarm();
          if (!status.ok()) {
            ASSERT_TRUE(run.point().has_value()) << status;
            EXPECT_THAT(status.message(), HasSubstr(run.InjectedTag()))
                << status;
            if (!reg.ok()) {
              EXPECT_THAT(status.message(), HasSubstr("RegisterHostMemory"));
            }
          }
          const TransferStats t = system.GetStats().transfers;
          EXPECT_EQ(t.registrations_live, 0u);
          EXPECT_EQ(t.pinned_bytes_now, 0u);
          EXPECT_FALSE(IsExcludedFromFork(mem.data()));
          (void)Wait(system.Deallocate(*buf));
        }
        EXPECT_EQ(os.pinned_bytes(), 0u);
        EXPECT_EQ(os.locked_bytes(), 0u);
        EXPECT_EQ(os.mapped_bytes(), 0u);
        if (HasFailure()) run.StopSweep();
      });
  ASSERT_TRUE(report.ok()) << report.status();
  // Registering pins (`pin`) and excludes from fork (`madvise`);
  // unregistering madvises back.
  EXPECT_GE(report->calls[static_cast<int>(FaultPoint::kPin)], 1u);
  EXPECT_GE(report->calls[static_cast<int>(FaultPoint::kMadvise)], 2u);
  std::cout << "fault sweep register/unregister: " << report->ToString()
            << std::endl;
}

}  // namespace
}  // namespace tpushim
