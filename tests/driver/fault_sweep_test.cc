// Fault sweeps (the reliability issue's part 3): every
// injectable call that System start-up, a representative transfer on each
// path, the 1.4 paths (memory-kind copies, pinned_host allocations, a
// chunked transfer, both events of a transfer, an alias of a registration)
// and System teardown make is failed in turn. SweepEveryCall runs each
// scenario once to count its calls per fault point (mmap, madvise, mlock,
// numa, alloc, dma, pin, log_open), then once per call with exactly that
// call failing. One FaultInjector decides every point: the alloc and dma
// points inside the system, and the OS points — log_open included, as each
// run's start-up sets logging up through the same OS layer — in a
// FaultInjectingOs that also tracks what is mapped, locked, pinned and open.
//
// Every run must end with a clean status: OK, or exactly the injected
// failure (its code, its "[injected: ...]" tag); a fault tpushim is meant
// to tolerate (mlock on, NUMA binding, huge-page advice, a log file, a
// staging buffer) must not fail anything, and the ones start-up and
// teardown tolerate are reported. Afterwards nothing is mapped, locked,
// pinned or open, every log file is whole (header, then only whole glog
// lines), a start-up that succeeded logged its start-up lines, and the next
// system in the process starts and moves data. Each sweep prints its size,
// "fault sweep <phase>: <points> points, <runs> runs (<point> <calls>, ...)",
// and records it as a test property.

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "driver/system_internal.h"
#include "env/fault_injection.h"
#include "env/os.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logging/log.h"
#include "tests/testing/log_check.h"
#include "tests/testing/stderr_capture.h"
#include "tests/testing/temp_dir.h"
#include "tpushim/system.h"

namespace tpushim {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using testutil::LogDirectoryProblems;
using testutil::ReadFileOrEmpty;
using testutil::StartupLinesProblems;
using testutil::StderrCapture;
using testutil::TempDir;

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;

// Small enough to lock under the usual 8 MiB RLIMIT_MEMLOCK of a non-root
// shell together with the pinned scenario's pages.
constexpr uint64_t kRegionBytes = 4 * kMiB;
constexpr uint64_t kThresholdBytes = 2 * kMiB;
constexpr int kDevices = 2;

// Long enough that only a hang exceeds it.
constexpr absl::Duration kHangTimeout = absl::Seconds(30);

OptionOverrides SweepOptions(const std::string& log_dir) {
  OptionOverrides o;
  o.premapped_buffer_size = kRegionBytes;
  o.premapped_buffer_transfer_threshold_bytes = kThresholdBytes;
  // HBM is reserved, and backed only where written: 96M holds the 64 MiB
  // buffers of the teardown sweep.
  o.device = "sim://?devices=2&hbm=96M";
  // One pre-fault thread: start-up makes its calls in one order.
  o.prefault_threads = 1;
  o.log_dir = log_dir;
  // Only logging's own diagnostics (which the runs capture) reach stderr.
  o.stderr_log_level = 3;
  return o;
}

// The code of an injected failure at `point`: FaultInjectingOs fails the OS
// points as ENOMEM (mmap, madvise, mlock, pin), EINVAL (numa) or EACCES
// (log_open) would; the allocator fails `alloc` with its libtpu text, and
// the simulated device fails `dma` as a descriptor error.
absl::StatusCode InjectedCode(FaultPoint point) {
  switch (point) {
    case FaultPoint::kNuma:
      return absl::StatusCode::kInvalidArgument;
    case FaultPoint::kLogOpen:
      return absl::StatusCode::kPermissionDenied;
    case FaultPoint::kDma:
    case FaultPoint::kIommu:  // vfio:// only: the device's transfer error
      return absl::StatusCode::kInternal;
    case FaultPoint::kVfio:  // vfio:// only: ioctl's EIO
      return absl::ErrnoToStatusCode(EIO);
    case FaultPoint::kMmap:
    case FaultPoint::kMadvise:
    case FaultPoint::kMlock:
    case FaultPoint::kAlloc:
    case FaultPoint::kPin:
      return absl::StatusCode::kResourceExhausted;
  }
  return absl::StatusCode::kUnknown;
}

// `e`'s status once ready; a test failure (and DEADLINE_EXCEEDED) when it
// is not ready within kHangTimeout.
absl::Status Wait(const absl::StatusOr<Event>& e) {
  if (!e.ok()) return e.status();
  std::optional<absl::Status> s = e->AwaitWithTimeout(kHangTimeout);
  if (!s.has_value()) {
    ADD_FAILURE() << "event not ready after " << kHangTimeout << ": a hang";
    return absl::DeadlineExceededError("hang");
  }
  return *s;
}

// `n` bytes that differ from run to run.
std::vector<char> Pattern(uint64_t n, uint64_t seed) {
  std::vector<char> bytes(n);
  for (uint64_t i = 0; i < n; ++i) {
    bytes[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 12)) & 0xff);
  }
  return bytes;
}

// The contents of device buffer `b`, read back through staging.
std::vector<char> ReadBack(System& system, const DeviceBuffer& b, uint64_t n) {
  std::vector<char> back(n, 0);
  const absl::Status s = Wait(system.TransferFromDevice(b, 0, back.data(), n));
  EXPECT_TRUE(s.ok()) << "reading back: " << s;
  return back;
}

// Frees `b`; REQUIRES: every transfer on it is done.
void Free(System& system, const DeviceBuffer& b) {
  const absl::Status s = Wait(system.Deallocate(b));
  EXPECT_TRUE(s.ok()) << "deallocating: " << s;
}

// Host → device 0 → device 1 → host, `n` bytes; true when they all arrive.
bool RoundTrip(System& system, uint64_t n) {
  const std::vector<char> data = Pattern(n, 1);
  absl::StatusOr<DeviceBuffer> a = system.AllocateDevice(0, n);
  absl::StatusOr<DeviceBuffer> b = system.AllocateDevice(1, n);
  if (!a.ok() || !b.ok()) {
    ADD_FAILURE() << "device buffers: " << a.status() << " " << b.status();
    return false;
  }
  std::vector<char> back(n, 0);
  const absl::StatusOr<Event> up =
      system.TransferToDevice(data.data(), *a, 0, n);
  const absl::StatusOr<Event> across =
      up.ok() ? system.TransferDeviceToDevice(*a, 0, *b, 0, n, {*up}) : up;
  const absl::StatusOr<Event> down =
      across.ok() ? system.TransferFromDevice(*b, 0, back.data(), n, {*across})
                  : across;
  const absl::Status arrived = Wait(down);
  EXPECT_TRUE(arrived.ok()) << "round trip: " << arrived;
  Free(system, *a);
  Free(system, *b);
  return arrived.ok() && back == data;
}

// The INFO log of `dir` with everything logged so far, "" when there is
// none.
std::string InfoLog(const TempDir& dir) {
  EXPECT_TRUE(logging::FlushLogs());
  return ReadFileOrEmpty(dir.Join("tpu_driver.INFO"));
}

class FaultSweepTest : public ::testing::Test {
 protected:
  void TearDown() override { logging::ShutdownLogging(); }

  // A system whose every injectable call goes through injector_.
  absl::StatusOr<std::unique_ptr<System>> Start(const OptionOverrides& o) {
    return SystemFactory::Create(o, &os_, &injector_);
  }

  // A run's window: opened and closed with nothing queued for the log
  // writer, whose file creations (log_open) must fall inside or outside it
  // and never race with arming.
  static void OpenWindow(FaultSweepRun& run) {
    EXPECT_TRUE(logging::FlushLogs());
    run.Arm();
  }
  static void CloseWindow(FaultSweepRun& run) {
    EXPECT_TRUE(logging::FlushLogs());
    run.Disarm();
  }

  // After a run (its systems gone): logging shut down, which closes the log
  // files (they were opened through os_ too); then nothing is mapped,
  // locked, pinned or open, and every log file in `log_dir` is whole.
  void ExpectNothingLeft(const TempDir& log_dir) {
    logging::ShutdownLogging();
    EXPECT_EQ(os_.mapped_bytes(), 0u);
    EXPECT_EQ(os_.locked_bytes(), 0u);
    EXPECT_EQ(os_.pinned_bytes(), 0u);
    EXPECT_EQ(os_.open_files(), 0u);
    EXPECT_EQ(LogDirectoryProblems(log_dir.path()), "");
  }

  // The next system in the process, with nothing injected, starts with
  // its start-up lines, moves data and leaves nothing behind.
  void ExpectNextSystemWorks() {
    SCOPED_TRACE("the next system");
    TempDir logs;
    {
      absl::StatusOr<std::unique_ptr<System>> next =
          Start(SweepOptions(logs.path()));
      ASSERT_TRUE(next.ok()) << next.status();
      EXPECT_TRUE(RoundTrip(**next, 256 * kKiB));
      EXPECT_EQ(
          StartupLinesProblems(InfoLog(logs),
                               {.region_bytes = kRegionBytes,
                                .threshold_bytes = kThresholdBytes,
                                .devices = kDevices,
                                .locked = (*next)->GetStats().region.locked}),
          "");
    }
    ExpectNothingLeft(logs);
  }

  // Sweeps `scenario` over every point, ending at the first run with a
  // test failure (one violation, one report); prints and records the
  // sweep's size.
  absl::StatusOr<FaultSweepReport> Sweep(
      const std::string& phase,
      const std::function<void(FaultSweepRun&)>& scenario) {
    absl::StatusOr<FaultSweepReport> report = SweepEveryCall(
        injector_, FaultPointSet::All(), [&](FaultSweepRun& run) {
          SCOPED_TRACE(run.Name());
          scenario(run);
          if (HasFailure()) run.StopSweep();
        });
    if (report.ok()) {
      std::cout << "fault sweep " << phase << ": " << report->ToString()
                << std::endl;
      RecordProperty("fault_sweep", report->ToString());
    }
    return report;
  }

  FixedEnvironmentOs env_{Os::Default()};
  FaultInjector injector_;
  FaultInjectingOs os_{&env_, &injector_};
};

uint64_t Calls(const FaultSweepReport& report, FaultPoint point) {
  return report.calls[static_cast<int>(point)];
}

// ---- Start-up ---------------------------------------------------------------

TEST_F(FaultSweepTest, EveryStartupCallFailsCleanly) {
  absl::StatusOr<FaultSweepReport> report =
      Sweep("start-up", [&](FaultSweepRun& run) {
        // Start-up sets logging up itself, so log_open is among its calls.
        logging::ShutdownLogging();
        TempDir logs;
        StderrCapture diagnostics;
        {
          run.Arm();
          absl::StatusOr<std::unique_ptr<System>> system =
              Start(SweepOptions(logs.path()));
          CloseWindow(run);
          if (!system.ok()) {
            ASSERT_TRUE(run.point().has_value())
                << "start-up failed with nothing injected: " << system.status();
            // Only mapping and pre-faulting may fail it: start-up
            // tolerates failures of mlock (TPUSHIM_MLOCK=on), NUMA binding
            // (auto), huge-page advice (auto) and log files.
            EXPECT_THAT(*run.point(),
                        AnyOf(FaultPoint::kMmap, FaultPoint::kMadvise))
                << system.status();
            EXPECT_EQ(system.status().code(), InjectedCode(*run.point()))
                << system.status();
            EXPECT_THAT(system.status().message(),
                        HasSubstr(run.InjectedTag()));
          } else {
            const std::string info = InfoLog(logs);
            if (run.point().has_value()) {
              // Tolerated, and said so: in the log, or on stderr for a log
              // file that could not be created.
              EXPECT_THAT(info + diagnostics.Contents(),
                          HasSubstr(run.InjectedTag()));
            }
            if (info.empty()) {
              // Only the run that failed the INFO file's creation lacks it.
              EXPECT_EQ(run.point(), FaultPoint::kLogOpen);
              EXPECT_THAT(diagnostics.Contents(),
                          HasSubstr("Could not create the INFO log file"));
            } else {
              EXPECT_EQ(
                  StartupLinesProblems(
                      info, {.region_bytes = kRegionBytes,
                             .threshold_bytes = kThresholdBytes,
                             .devices = kDevices,
                             .locked = (*system)->GetStats().region.locked}),
                  "");
            }
            EXPECT_TRUE(RoundTrip(**system, 256 * kKiB));
          }
        }
        ExpectNothingLeft(logs);
        ExpectNextSystemWorks();
      });
  ASSERT_TRUE(report.ok()) << report.status();
  // The region and each device's HBM are mapped, the region pre-faulted
  // (MADV_POPULATE_WRITE) and bound to a NUMA node, and the INFO log file
  // created; mlock and huge-page advice depend on the host.
  EXPECT_GE(Calls(*report, FaultPoint::kMmap), 1u + kDevices);
  EXPECT_GE(Calls(*report, FaultPoint::kMadvise), 1u);
  EXPECT_GE(Calls(*report, FaultPoint::kNuma), 1u);
  EXPECT_GE(Calls(*report, FaultPoint::kLogOpen), 1u);
}

// The region off: the transfer engine's bounce pool is mapped, excluded
// from fork() and locked at start-up. Only mapping may fail start-up
// (named); a failed fork advice or mlock (TPUSHIM_MLOCK=on) is tolerated,
// said at WARNING, and the pool works.
TEST_F(FaultSweepTest, EveryRegionOffStartupCallFailsCleanly) {
  absl::StatusOr<FaultSweepReport> report =
      Sweep("region-off start-up", [&](FaultSweepRun& run) {
        logging::ShutdownLogging();
        TempDir logs;
        StderrCapture diagnostics;
        {
          OptionOverrides o = SweepOptions(logs.path());
          o.premapped_buffer_size = 0;
          o.premapped_buffer_transfer_threshold_bytes.reset();
          run.Arm();
          absl::StatusOr<std::unique_ptr<System>> system = Start(o);
          CloseWindow(run);
          if (!system.ok()) {
            ASSERT_TRUE(run.point().has_value())
                << "start-up failed with nothing injected: " << system.status();
            EXPECT_THAT(*run.point(), AnyOf(FaultPoint::kMmap))
                << system.status();
            EXPECT_EQ(system.status().code(), InjectedCode(*run.point()));
            EXPECT_THAT(system.status().message(),
                        HasSubstr(run.InjectedTag()));
          } else {
            const std::string info = InfoLog(logs);
            if (run.point().has_value()) {
              EXPECT_THAT(info + diagnostics.Contents(),
                          HasSubstr(run.InjectedTag()));
            }
            if (!info.empty()) {
              EXPECT_THAT(info, HasSubstr("TPU premapped buffer disabled."));
            }
            const SystemStats stats = (*system)->GetStats();
            EXPECT_EQ(stats.transfers.bounce_pool_bytes, kBouncePoolBytes);
            // A small transfer goes through the pool, locked or not.
            EXPECT_TRUE(RoundTrip(**system, 256 * kKiB));
            EXPECT_EQ((*system)->GetStats().transfers.staged_bounce, 2u);
          }
        }
        ExpectNothingLeft(logs);
        ExpectNextSystemWorks();
      });
  ASSERT_TRUE(report.ok()) << report.status();
  // The pool is mapped, excluded from fork() and locked; each device's HBM
  // mapped and excluded too.
  EXPECT_GE(Calls(*report, FaultPoint::kMmap), 1u + kDevices);
  EXPECT_GE(Calls(*report, FaultPoint::kMadvise), 1u + kDevices);
  EXPECT_GE(Calls(*report, FaultPoint::kMlock), 1u);
}

// Premapped behind the caller (TPUSHIM_PREMAP=background): every call of
// start-up and of the premapping that follows it fails in turn. Creation
// may fail only where the foreground's may; a failure behind the caller
// ends premapping with the injected status (AwaitPremapped) and the
// system goes on working on the part that is ready. The window closes
// once premapping has ended, so its calls are all inside it.
TEST_F(FaultSweepTest, EveryBackgroundStartupCallFailsCleanly) {
  absl::StatusOr<FaultSweepReport> report =
      Sweep("background start-up", [&](FaultSweepRun& run) {
        logging::ShutdownLogging();
        TempDir logs;
        StderrCapture diagnostics;
        {
          OptionOverrides o = SweepOptions(logs.path());
          o.premap = PremapMode::kBackground;
          run.Arm();
          absl::StatusOr<std::unique_ptr<System>> system = Start(o);
          const absl::Status premapped =
              system.ok() ? (*system)->AwaitPremapped() : absl::OkStatus();
          CloseWindow(run);
          if (!system.ok()) {
            ASSERT_TRUE(run.point().has_value())
                << "start-up failed with nothing injected: " << system.status();
            EXPECT_EQ(*run.point(), FaultPoint::kMmap) << system.status();
            EXPECT_EQ(system.status().code(), InjectedCode(*run.point()));
          } else if (!premapped.ok()) {
            // Pre-faulting failed behind the caller.
            ASSERT_TRUE(run.point().has_value()) << premapped;
            EXPECT_EQ(*run.point(), FaultPoint::kMadvise) << premapped;
            EXPECT_EQ(premapped.code(), InjectedCode(*run.point()));
            EXPECT_THAT(premapped.message(), HasSubstr(run.InjectedTag()));
            const SystemStats stats = (*system)->GetStats();
            EXPECT_FALSE(stats.region.premapped);
            EXPECT_THAT(stats.region.premap_error,
                        HasSubstr(run.InjectedTag()));
            EXPECT_THAT(InfoLog(logs),
                        HasSubstr("Premapping the region failed after "));
          } else {
            const std::string info = InfoLog(logs);
            if (!info.empty()) {
              EXPECT_EQ(
                  StartupLinesProblems(
                      info, {.region_bytes = kRegionBytes,
                             .threshold_bytes = kThresholdBytes,
                             .devices = kDevices,
                             .locked = (*system)->GetStats().region.locked,
                             .background = true}),
                  "");
            }
          }
          // Whatever premapping reached, data move.
          if (system.ok()) {
            EXPECT_TRUE(RoundTrip(**system, 256 * kKiB));
          }
        }
        ExpectNothingLeft(logs);
      });
  ASSERT_TRUE(report.ok()) << report.status();
  // Pre-faulting calls madvise once per chunk of the region.
  EXPECT_GE(Calls(*report, FaultPoint::kMadvise), 2u);
}

// ---- Transfers --------------------------------------------------------------

struct TransferCase {
  const char* name;
  DmaDirection direction;
  // The path of a host transfer; nullopt for device to device.
  std::optional<TransferPath> path;
  uint64_t bytes;
  // The calls per point the transfer makes, as FaultSweepReport::ToString
  // lists them.
  const char* calls;
};

std::ostream& operator<<(std::ostream& os, const TransferCase& c) {
  return os << c.name;
}

// Sizes are multiples of nothing, so each transfer ends with a short
// descriptor (of 512 KiB for zero-copy, pinned and d2d).
const TransferCase kTransferCases[] = {
    // The pinned host buffer's allocation is part of the zero-copy path.
    {"zero_copy_h2d", DmaDirection::kHostToDevice, TransferPath::kZeroCopy,
     kMiB + 100, "2 points, 4 runs (alloc 1, dma 3)"},
    {"zero_copy_d2h", DmaDirection::kDeviceToHost, TransferPath::kZeroCopy,
     kMiB + 100, "2 points, 4 runs (alloc 1, dma 3)"},
    // One 512 KiB chunk: with more, whether a chunk takes a new staging
    // buffer or one its predecessor's DMA has just freed depends on timing,
    // so the alloc calls would vary from run to run (transfer_engine_test
    // fails every DMA descriptor of multi-chunk transfers).
    {"staged_h2d", DmaDirection::kHostToDevice, TransferPath::kStaged,
     300 * kKiB + 7, "2 points, 2 runs (alloc 1, dma 1)"},
    // Two 1 MiB chunks through one staging buffer (a quarter of the region
    // may be in flight), taken before the first DMA.
    {"staged_d2h", DmaDirection::kDeviceToHost, TransferPath::kStaged,
     kMiB + 512 * kKiB + 100, "2 points, 3 runs (alloc 1, dma 2)"},
    // Over the threshold: the caller's pages are pinned, and the first
    // pinned transfer's WARNING starts the WARNING log file.
    {"pinned_h2d", DmaDirection::kHostToDevice, TransferPath::kPinned,
     2 * kMiB + 512 * kKiB + 100,
     "3 points, 8 runs (dma 6, pin 1, log_open 1)"},
    {"pinned_d2h", DmaDirection::kDeviceToHost, TransferPath::kPinned,
     2 * kMiB + 512 * kKiB + 100,
     "3 points, 8 runs (dma 6, pin 1, log_open 1)"},
    {"d2d", DmaDirection::kDeviceToDevice, std::nullopt, kMiB + 100,
     "1 point, 3 runs (dma 3)"},
};

class TransferFaultSweepTest
    : public FaultSweepTest,
      public ::testing::WithParamInterface<TransferCase> {};

TEST_P(TransferFaultSweepTest, EveryCallOfTheTransferFailsCleanly) {
  const TransferCase& c = GetParam();
  const uint64_t n = c.bytes;
  const bool to_device = c.direction == DmaDirection::kHostToDevice;
  const bool from_device = c.direction == DmaDirection::kDeviceToHost;
  const auto scenario = [&](FaultSweepRun& run) {
    logging::ShutdownLogging();
    TempDir logs;
    // Logging's own diagnostics (a log file it could not create) stay out
    // of the test's output.
    StderrCapture diagnostics;
    {
      absl::StatusOr<std::unique_ptr<System>> started =
          Start(SweepOptions(logs.path()));
      ASSERT_TRUE(started.ok()) << started.status();
      System& system = **started;
      const std::vector<char> data = Pattern(n, run.call());
      absl::StatusOr<DeviceBuffer> device = system.AllocateDevice(0, n);
      absl::StatusOr<DeviceBuffer> other = system.AllocateDevice(1, n);
      ASSERT_TRUE(device.ok() && other.ok());
      if (!to_device) {
        // Staged, in pieces within the threshold, so that the transfer
        // under test is the first of its path (and its WARNING).
        for (uint64_t at = 0; at < n; at += kThresholdBytes) {
          const uint64_t piece = std::min(kThresholdBytes, n - at);
          ASSERT_TRUE(Wait(system.TransferToDevice(data.data() + at, *device,
                                                   at, piece))
                          .ok());
        }
      }
      // Caller memory for the staged and pinned paths.
      std::vector<char> pageable = to_device ? data : std::vector<char>(n, 0);
      PinnedHostBuffer pinned;
      char* host = pageable.data();

      OpenWindow(run);
      absl::Status status;
      bool submitted = false;
      if (c.path == TransferPath::kZeroCopy) {
        absl::StatusOr<PinnedHostBuffer> b = system.AllocatePinnedHost(n);
        status = b.status();
        if (b.ok()) {
          pinned = *std::move(b);
          host = static_cast<char*>(pinned.data());
          std::memcpy(host, pageable.data(), n);
        }
      }
      if (status.ok()) {
        if (c.path.has_value()) {
          EXPECT_EQ(system.PathFor(host, n), *c.path);
        }
        submitted = true;
        absl::StatusOr<Event> event;
        if (to_device) {
          event = system.TransferToDevice(host, *device, 0, n);
        } else if (from_device) {
          event = system.TransferFromDevice(*device, 0, host, n);
        } else {
          event = system.TransferDeviceToDevice(*device, 0, *other, 0, n);
        }
        status = Wait(event);
      }
      CloseWindow(run);

      if (status.ok()) {
        const std::vector<char> arrived =
            to_device     ? ReadBack(system, *device, n)
            : from_device ? std::vector<char>(host, host + n)
                          : ReadBack(system, *other, n);
        EXPECT_TRUE(arrived == data) << "the bytes that arrived differ";
      } else {
        ASSERT_TRUE(run.point().has_value())
            << "failed with nothing injected: " << status;
        // A DMA descriptor or a pin may fail the transfer, and the
        // allocation may fail a pinned host buffer — but a transfer
        // never fails because the region is busy, nor for a log file.
        if (submitted) {
          EXPECT_THAT(*run.point(), AnyOf(FaultPoint::kDma, FaultPoint::kPin))
              << status;
        } else {
          EXPECT_EQ(*run.point(), FaultPoint::kAlloc) << status;
        }
        EXPECT_EQ(status.code(), InjectedCode(*run.point())) << status;
        EXPECT_THAT(status.message(), HasSubstr(run.InjectedTag()));
      }
      // A failed transfer is counted on its path, and nothing of the
      // transfer is still held.
      const TransferStats t = system.GetStats().transfers;
      const PathStats& stats =
          c.path.has_value()
              ? t.host[static_cast<int>(c.direction)][static_cast<int>(*c.path)]
              : t.device_to_device;
      EXPECT_EQ(stats.failed, submitted && !status.ok() ? 1u : 0u);
      EXPECT_EQ(t.pinned_bytes_now, 0u);
      EXPECT_EQ(t.staging_bytes_in_flight, 0u);
      EXPECT_EQ(t.events_pending, 0u);
      pinned.Reset();
      Free(system, *device);
      Free(system, *other);
      EXPECT_EQ(system.GetStats().region.live_allocations, 0u);
    }
    ExpectNothingLeft(logs);
    ExpectNextSystemWorks();
  };
  absl::StatusOr<FaultSweepReport> report = Sweep(c.name, scenario);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->ToString(), c.calls);
}

INSTANTIATE_TEST_SUITE_P(
    EveryPath, TransferFaultSweepTest, ::testing::ValuesIn(kTransferCases),
    [](const ::testing::TestParamInfo<TransferCase>& param) {
      return std::string(param.param.name);
    });

// ---- Memory kinds, events, chunked transfers, registrations (1.4) -----------

// A scenario of the 1.4 surface: `op` runs in the window, calls `close`
// when the operation under test is over (before it reads anything back),
// frees everything it made and returns the operation's status (every event
// it made awaited). It must end OK or with exactly the injected
// failure; then nothing of it is live: no region allocation, registration,
// pinned byte, staging byte or pending event; after the system goes,
// nothing is mapped, locked, pinned or open.
class NewPathFaultSweepTest : public FaultSweepTest {
 protected:
  absl::StatusOr<FaultSweepReport> SweepOp(
      const std::string& phase,
      const std::function<absl::Status(System&, const std::function<void()>&)>&
          op) {
    return Sweep(phase, [&](FaultSweepRun& run) {
      logging::ShutdownLogging();
      TempDir logs;
      StderrCapture diagnostics;
      {
        absl::StatusOr<std::unique_ptr<System>> started =
            Start(SweepOptions(logs.path()));
        ASSERT_TRUE(started.ok()) << started.status();
        System& system = **started;
        OpenWindow(run);
        const absl::Status status = op(system, [&run] { CloseWindow(run); });
        CloseWindow(run);
        if (!status.ok()) {
          ASSERT_TRUE(run.point().has_value())
              << "failed with nothing injected: " << status;
          EXPECT_EQ(status.code(), InjectedCode(*run.point())) << status;
          EXPECT_THAT(status.message(), HasSubstr(run.InjectedTag()));
        }
        const SystemStats stats = system.GetStats();
        EXPECT_EQ(stats.region.live_allocations, 0u);
        EXPECT_EQ(stats.transfers.registrations_live, 0u);
        EXPECT_EQ(stats.transfers.pinned_bytes_now, 0u);
        EXPECT_EQ(stats.transfers.staging_bytes_in_flight, 0u);
        EXPECT_EQ(stats.transfers.events_pending, 0u);
      }
      ExpectNothingLeft(logs);
    });
  }
};

// The first failed status of `statuses` (OK when none failed).
absl::Status FirstError(std::initializer_list<absl::Status> statuses) {
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// pinned_host -> device -> pinned_host, one DMA each way (nothing staged,
// so every run makes the same calls).
TEST_F(NewPathFaultSweepTest, MemoryKindCopiesFailCleanly) {
  const uint64_t n = kMiB + 100;
  absl::StatusOr<FaultSweepReport> report = SweepOp(
      "pinned_host<->device copy",
      [&](System& system, const std::function<void()>& close) {
        const std::vector<char> data = Pattern(n, 3);
        const int pinned = system.memory_of_kind(MemoryKind::kPinnedHost);
        absl::StatusOr<MemoryBuffer> host = system.AllocateInMemory(pinned, n);
        if (!host.ok()) return host.status();
        std::memcpy(host->data(), data.data(), n);
        absl::StatusOr<MemoryCopy> up = system.CopyToMemory(*host, 0);
        absl::Status status = up.ok() ? Wait(up->event) : up.status();
        absl::StatusOr<MemoryCopy> down;
        if (status.ok()) {
          down = system.CopyToMemory(up->buffer, pinned);
          status = down.ok() ? Wait(down->event) : down.status();
        }
        close();
        if (status.ok()) {
          EXPECT_TRUE(std::memcmp(down->buffer.data(), data.data(), n) == 0);
        }
        absl::Status freed = Wait(system.Free(*host));
        if (up.ok()) freed.Update(Wait(system.Free(up->buffer)));
        if (down.ok()) freed.Update(Wait(system.Free(down->buffer)));
        EXPECT_TRUE(freed.ok()) << freed;
        return status;
      });
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->ToString(), "2 points, 8 runs (alloc 2, dma 6)");
}

// Byte and shaped buffers in pinned_host come from the region.
TEST_F(NewPathFaultSweepTest, PinnedHostAllocationsFailCleanly) {
  absl::StatusOr<FaultSweepReport> report = SweepOp(
      "pinned_host allocation",
      [&](System& system, const std::function<void()>&) {
        const int pinned = system.memory_of_kind(MemoryKind::kPinnedHost);
        absl::StatusOr<MemoryBuffer> bytes =
            system.AllocateInMemory(pinned, 300 * kKiB);
        absl::StatusOr<MemoryBuffer> shaped = system.AllocateInMemory(
            pinned, DeviceBufferSpec{.shape = "f32[100,100]"});
        absl::Status freed;
        if (bytes.ok()) freed.Update(Wait(system.Free(*bytes)));
        if (shaped.ok()) freed.Update(Wait(system.Free(*shaped)));
        EXPECT_TRUE(freed.ok()) << freed;
        return FirstError({bytes.status(), shaped.status()});
      });
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->ToString(), "1 point, 2 runs (alloc 2)");
}

// A chunked transfer: every chunk's events resolve, and the buffer's
// ready event fails with the first chunk that failed.
TEST_F(NewPathFaultSweepTest, ChunkedTransfersFailCleanly) {
  const uint64_t chunk = 100 * kKiB + 3;
  const uint64_t n = 3 * chunk;
  absl::StatusOr<FaultSweepReport> report =
      SweepOp("chunked transfer",
              [&](System& system, const std::function<void()>& close) {
                const std::vector<char> data = Pattern(n, 4);
                absl::StatusOr<DeviceBuffer> b = system.AllocateDevice(0, n);
                if (!b.ok()) return b.status();
                absl::Status status = system.BeginChunkedTransfer(*b);
                absl::Status first_chunk_error;
                for (int i = 0; i < 3 && status.ok(); ++i) {
                  absl::StatusOr<TransferEvents> e = system.TransferChunk(
                      data.data() + i * chunk, *b, i * chunk, chunk,
                      /*is_last=*/i == 2);
                  if (!e.ok()) {
                    status = e.status();
                    break;
                  }
                  const absl::Status ready = Wait(e->ready);
                  const absl::Status released = Wait(e->host_released);
                  EXPECT_TRUE(released.ok() || released == ready) << released;
                  if (first_chunk_error.ok()) first_chunk_error = ready;
                }
                if (status.ok()) {
                  status = Wait(system.BufferReadyEvent(*b));
                  EXPECT_EQ(status, first_chunk_error);
                }
                close();
                if (status.ok()) {
                  EXPECT_TRUE(ReadBack(system, *b, n) == data);
                }
                Free(system, *b);
                return status;
              });
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->ToString(), "2 points, 6 runs (alloc 3, dma 3)");
}

// Both events of a host→device transfer resolve, staged and pinned:
// host_released OK (every byte was read) or the same error as ready.
TEST_F(NewPathFaultSweepTest, TransfersWithEventsResolveBothEvents) {
  struct Case {
    uint64_t bytes;
    const char* calls;
  };
  for (const Case& c :
       {Case{300 * kKiB + 7, "2 points, 2 runs (alloc 1, dma 1)"},
        Case{2 * kMiB + 512 * kKiB + 100,
             "3 points, 8 runs (dma 6, pin 1, log_open 1)"}}) {
    const uint64_t n = c.bytes;
    SCOPED_TRACE(n);
    absl::StatusOr<FaultSweepReport> report = SweepOp(
        absl::StrCat("TransferToDeviceWithEvents ", n),
        [&](System& system, const std::function<void()>& close) {
          const std::vector<char> data = Pattern(n, 5);
          absl::StatusOr<DeviceBuffer> b = system.AllocateDevice(0, n);
          if (!b.ok()) return b.status();
          absl::StatusOr<TransferEvents> e =
              system.TransferToDeviceWithEvents(data.data(), *b, 0, n);
          absl::Status status = e.status();
          if (e.ok()) {
            status = Wait(e->ready);
            const absl::Status released = Wait(e->host_released);
            EXPECT_TRUE(released.ok() || released == status) << released;
          }
          close();
          if (status.ok()) {
            EXPECT_TRUE(ReadBack(system, *b, n) == data);
          }
          Free(system, *b);
          return status;
        });
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->ToString(), c.calls);
  }
}

// A pinned_host buffer aliasing a registration: registering (pin, fork
// advice), the DMA out of it, unregistering.
TEST_F(NewPathFaultSweepTest, AliasingARegistrationFailsCleanly) {
  const uint64_t n = 1024 * kKiB;
  absl::StatusOr<FaultSweepReport> report = SweepOp(
      "pinned_host alias of a registration",
      [&](System& system, const std::function<void()>& close) {
        std::vector<char> mem = Pattern(n, 6);
        absl::StatusOr<HostRegistration> reg =
            system.RegisterHostMemory(mem.data(), n);
        if (!reg.ok()) return reg.status();
        absl::StatusOr<MemoryCopy> alias = system.CreateMemoryBuffer(
            mem.data(), n, system.memory_of_kind(MemoryKind::kPinnedHost),
            HostBufferSemantics::kMutableZeroCopy);
        absl::Status status = alias.status();
        absl::StatusOr<MemoryCopy> up;
        if (status.ok()) {
          EXPECT_TRUE(alias->buffer.aliases_caller_memory());
          up = system.CopyToMemory(alias->buffer, /*memory=*/0);
          status = up.ok() ? Wait(up->event) : up.status();
        }
        if (alias.ok()) {
          EXPECT_TRUE(Wait(system.Free(alias->buffer)).ok());
          EXPECT_TRUE(Wait(alias->host_released).ok());
        }
        // Unregistering is part of the sweep: munlock / unpin may fail.
        status.Update(reg->Unregister());
        close();
        if (status.ok()) {
          EXPECT_TRUE(ReadBack(system, up->buffer.device_buffer(), n) == mem);
        }
        if (up.ok()) {
          EXPECT_TRUE(Wait(system.Free(up->buffer)).ok());
        }
        return status;
      });
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_GE(
      Calls(*report, FaultPoint::kPin) + Calls(*report, FaultPoint::kMlock),
      1u);
  EXPECT_GE(Calls(*report, FaultPoint::kDma), 1u);
}

// ---- Teardown ---------------------------------------------------------------

TEST_F(FaultSweepTest, EveryTeardownCallFailsCleanly) {
  absl::StatusOr<FaultSweepReport> report =
      Sweep("teardown", [&](FaultSweepRun& run) {
        logging::ShutdownLogging();
        TempDir logs;
        StderrCapture diagnostics;
        OptionOverrides o = SweepOptions(logs.path());
        // Teardown has things to say: the trace's directory is gone, so
        // writing the trace fails and teardown logs an ERROR (which starts
        // the WARNING and ERROR log files); and a failure to give device
        // memory back is logged at VLOG(1) of the simulated device.
        const std::string trace = logs.Join("gone/trace.json");
        o.trace_file = trace;
        o.vmodule = "sim_device=1";
        {
          absl::StatusOr<std::unique_ptr<System>> system = Start(o);
          ASSERT_TRUE(system.ok()) << system.status();
          // Left for teardown to free: 64 MiB on each device, enough for
          // the simulated device to give the pages back with madvise.
          for (int d = 0; d < kDevices; ++d) {
            ASSERT_TRUE((*system)->AllocateDevice(d, 64 * kMiB).ok());
          }
          EXPECT_TRUE(RoundTrip(**system, 256 * kKiB));
          OpenWindow(run);
          system->reset();
          CloseWindow(run);
        }
        const std::string said = InfoLog(logs) + diagnostics.Contents();
        EXPECT_THAT(said,
                    HasSubstr(absl::StrCat("Writing the transfer trace to ",
                                           trace, " failed")));
        if (run.point().has_value()) {
          EXPECT_THAT(said, HasSubstr(run.InjectedTag()));
        }
        ExpectNothingLeft(logs);
        ExpectNextSystemWorks();
      });
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->ToString(), "2 points, 4 runs (madvise 2, log_open 2)");
}

}  // namespace
}  // namespace tpushim
