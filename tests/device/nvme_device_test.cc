// The NVMe engine (device/nvme/) on the host, against the fake NVMe
// controller on the fake VFIO kernel: bring-up, every transfer direction
// with its PRP shapes, commands split at MDTS, Copy and the bounce path,
// interrupts and polling, and the failures a real controller has (fatal
// status, an error completion, DMA the IOMMU blocks, commands that never
// complete). These run in the release, ASan+UBSan and TSan jobs; the QEMU
// VM test (tests/vm) stays the end-to-end proof on an emulated controller.

#include "device/nvme/nvme_device.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "device/device.h"
#include "env/device_url.h"
#include "env/fault_injection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/device/fake_nvme_controller.h"
#include "tests/device/fake_vfio_os.h"
#include "tests/testing/scoped_test_logging.h"

namespace tpushim {
namespace {

using fake_vfio::FakeHost;
using fake_vfio::FakeNvmeConfig;
using fake_vfio::FakeNvmeController;
using fake_vfio::FakeVfioOs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr uint64_t kPage = 4096;

// Completions as the transfer engine would receive them.
class Sink : public DmaCompletionSink {
 public:
  void OnDmaComplete(DmaDirection,
                     absl::Span<const DmaCompletion> completions) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const DmaCompletion& c : completions) done_.push_back(c);
    cv_.notify_all();
  }
  // Waits (10 s at most) for the completion of `user_data`.
  std::optional<DmaCompletion> WaitFor(uint64_t user_data) {
    std::unique_lock<std::mutex> lock(mu_);
    std::optional<DmaCompletion> found;
    cv_.wait_for(lock, std::chrono::seconds(10), [&] {
      for (const DmaCompletion& c : done_) {
        if (c.user_data == user_data) found = c;
      }
      return found.has_value();
    });
    return found;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<DmaCompletion> done_;
};

// Host memory for transfers, page-aligned.
struct HostBuffer {
  explicit HostBuffer(uint64_t bytes)
      : data(static_cast<uint8_t*>(std::aligned_alloc(kPage, bytes))),
        size(bytes) {}
  ~HostBuffer() { std::free(data); }
  uint8_t* data;
  uint64_t size;
};

void Fill(uint8_t* p, uint64_t n, uint32_t seed) {
  for (uint64_t i = 0; i < n; ++i) {
    p[i] = static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 9)) & 0xff);
  }
}

// A controller, its engine and a 2 MiB host window.
class NvmeDeviceTest : public ::testing::Test {
 protected:
  absl::Status Open(FakeNvmeConfig config = {}, const std::string& query = "",
                    FakeHost host = {}, FaultInjector* faults = nullptr,
                    NvmeTuning tuning = {}) {
    os_ = std::make_unique<FakeVfioOs>(std::move(host));
    controller_ = std::make_unique<FakeNvmeController>(*os_, config);
    absl::StatusOr<DeviceUrl> url =
        ParseDeviceUrl(absl::StrCat("vfio://0000:01:00.0?engine=nvme", query));
    if (!url.ok()) return url.status();
    absl::StatusOr<std::vector<std::unique_ptr<Device>>> devices =
        OpenNvmeDevices(*url, os_.get(), faults, tuning);
    if (!devices.ok()) return devices.status();
    device_ = std::move(devices->front());
    device_->SetCompletionSink(&sink_);
    absl::StatusOr<HostWindowId> window =
        device_->RegisterHostWindow(host_.data, host_.size);
    if (!window.ok()) return window.status();
    window_ = *window;
    return absl::OkStatus();
  }

  void TearDown() override {
    Close();
    if (os_ != nullptr) {
      EXPECT_EQ(os_->open_fds(), 0u);
      EXPECT_THAT(os_->mappings(), IsEmpty());
    }
  }

  void Close() {
    if (device_ == nullptr) return;
    (void)device_->UnregisterHostWindow(window_);
    device_.reset();
    EXPECT_FALSE(controller_->unmapped_while_ready())
        << "the BAR was unmapped with the controller still enabled";
  }

  // Runs one descriptor to its completion.
  absl::Status Run(DmaDirection direction, uint64_t length,
                   uint64_t host_offset, uint64_t device_address,
                   uint64_t peer_address = 0) {
    DmaDescriptor d;
    d.user_data = ++next_id_;
    d.length = length;
    d.host_offset = host_offset;
    d.device_address = device_address;
    d.peer_address = peer_address;
    d.host_window = window_;
    d.direction = direction;
    if (device_->Submit(direction, {&d, 1}) != 1) {
      return absl::InternalError("not accepted");
    }
    std::optional<DmaCompletion> c = sink_.WaitFor(d.user_data);
    if (!c.has_value()) return absl::DeadlineExceededError("no completion");
    return c->status;
  }

  HostBuffer host_{2 << 20};
  std::unique_ptr<FakeVfioOs> os_;
  std::unique_ptr<FakeNvmeController> controller_;
  std::unique_ptr<Device> device_;
  HostWindowId window_ = kInvalidHostWindow;
  Sink sink_;
  uint64_t next_id_ = 0;
};

TEST_F(NvmeDeviceTest, OpensTheNamespaceAsDeviceMemory) {
  ASSERT_TRUE(Open().ok());
  EXPECT_EQ(device_->info().backend, "vfio-nvme");
  EXPECT_EQ(device_->info().hbm_bytes, 4096u * 512);
  EXPECT_EQ(device_->info().block_bytes, 512u);
}

// Every PRP shape: one entry, two entries, a PRP list; from page-aligned
// and block-aligned host offsets inside a page.
TEST_F(NvmeDeviceTest, HostToDeviceAndBackMovesEveryByte) {
  ASSERT_TRUE(Open().ok());
  for (uint64_t length : {512ul, 4096ul, 8192ul, 12288ul, 65536ul, 262144ul}) {
    for (uint64_t offset : {0ul, 512ul, 3584ul}) {
      SCOPED_TRACE(absl::StrCat(length, " bytes at host offset ", offset));
      Fill(host_.data + offset, length, static_cast<uint32_t>(length));
      ASSERT_TRUE(Run(DmaDirection::kHostToDevice, length, offset, 8192).ok());
      std::vector<uint8_t> sent(host_.data + offset,
                                host_.data + offset + length);
      std::fill(host_.data + 524288, host_.data + 524288 + length, 0);
      ASSERT_TRUE(Run(DmaDirection::kDeviceToHost, length, 524288, 8192).ok());
      EXPECT_TRUE(std::equal(sent.begin(), sent.end(), host_.data + 524288));
      EXPECT_TRUE(std::equal(sent.begin(), sent.end(),
                             controller_->media().begin() + 8192));
    }
  }
  EXPECT_GT(controller_->prp_list_commands(), 0);
  EXPECT_GT(controller_->interrupts(), 0);
}

// A window over memory populated behind the caller: its IOVA range is
// taken at once, the IOMMU maps it as it grows, and a descriptor beyond
// what is mapped never reaches the controller.
TEST_F(NvmeDeviceTest, AReservedWindowIsUsableAsFarAsItIsMapped) {
  ASSERT_TRUE(Open().ok());
  HostBuffer region(1 << 20);
  const size_t maps = os_->map_calls().size();
  absl::StatusOr<HostWindowId> w =
      device_->ReserveHostWindow(region.data, region.size);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(os_->map_calls().size(), maps);  // nothing mapped (nor pinned)
  const HostWindowId main_window = window_;
  window_ = *w;

  Fill(region.data, 65536, 9);
  const absl::Status beyond = Run(DmaDirection::kHostToDevice, 4096, 0, 0);
  EXPECT_EQ(beyond.code(), absl::StatusCode::kOutOfRange) << beyond;
  EXPECT_THAT(beyond.message(),
              HasSubstr("beyond the 0 bytes of the window mapped for DMA"));
  EXPECT_EQ(controller_->io_commands(), 0) << "it reached the controller";

  ASSERT_TRUE(device_->ExtendHostWindow(*w, 64 * 1024).ok());
  EXPECT_EQ(os_->map_calls().size(), maps + 1);
  ASSERT_TRUE(Run(DmaDirection::kHostToDevice, 65536, 0, 0).ok());
  EXPECT_TRUE(std::equal(region.data, region.data + 65536,
                         controller_->media().begin()));
  EXPECT_EQ(Run(DmaDirection::kDeviceToHost, 4096, 64 * 1024, 0).code(),
            absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(device_->ExtendHostWindow(*w, 2 << 20).ok());  // the length
  ASSERT_TRUE(Run(DmaDirection::kDeviceToHost, 4096, (1 << 20) - 4096, 0).ok());
  EXPECT_TRUE(std::equal(region.data, region.data + 4096,
                         region.data + (1 << 20) - 4096));

  window_ = main_window;
  ASSERT_TRUE(device_->UnregisterHostWindow(*w).ok());
  // Unregistered: extending it is refused.
  EXPECT_FALSE(device_->ExtendHostWindow(*w, 4096).ok());
}

TEST_F(NvmeDeviceTest, PolledCompletionsWork) {
  ASSERT_TRUE(Open({}, "&irq=poll").ok());
  Fill(host_.data, 65536, 3);
  ASSERT_TRUE(Run(DmaDirection::kHostToDevice, 65536, 0, 0).ok());
  ASSERT_TRUE(Run(DmaDirection::kDeviceToHost, 65536, 131072, 0).ok());
  EXPECT_TRUE(std::equal(host_.data, host_.data + 65536, host_.data + 131072));
  EXPECT_EQ(controller_->interrupts(), 0);
}

TEST_F(NvmeDeviceTest, TransfersAreSplitAtMdts) {
  // MDTS 1: 8 KiB per command.
  ASSERT_TRUE(Open({.mdts = 1}).ok());
  Fill(host_.data, 65536, 5);
  ASSERT_TRUE(Run(DmaDirection::kHostToDevice, 65536, 0, 0).ok());
  EXPECT_EQ(controller_->io_commands(), 8);
  EXPECT_EQ(controller_->largest_io_bytes(), 8192u);
  EXPECT_TRUE(
      std::equal(host_.data, host_.data + 65536, controller_->media().begin()));
}

TEST_F(NvmeDeviceTest, DeviceToDeviceByCopy) {
  ASSERT_TRUE(Open().ok());
  Fill(host_.data, 131072, 9);
  ASSERT_TRUE(Run(DmaDirection::kHostToDevice, 131072, 0, 0).ok());
  ASSERT_TRUE(Run(DmaDirection::kDeviceToDevice, 131072, 0, 0, 524288).ok());
  EXPECT_GT(controller_->copies(), 0);
  ASSERT_TRUE(Run(DmaDirection::kDeviceToHost, 131072, 262144, 524288).ok());
  EXPECT_TRUE(std::equal(host_.data, host_.data + 131072, host_.data + 262144));
}

TEST_F(NvmeDeviceTest, DeviceToDeviceThroughTheBounceBuffers) {
  ASSERT_TRUE(Open({}, "&d2d=bounce").ok());
  Fill(host_.data, 131072, 11);
  ASSERT_TRUE(Run(DmaDirection::kHostToDevice, 131072, 0, 0).ok());
  ASSERT_TRUE(Run(DmaDirection::kDeviceToDevice, 131072, 0, 0, 524288).ok());
  EXPECT_EQ(controller_->copies(), 0);
  ASSERT_TRUE(Run(DmaDirection::kDeviceToHost, 131072, 262144, 524288).ok());
  EXPECT_TRUE(std::equal(host_.data, host_.data + 131072, host_.data + 262144));
}

// One device-to-device descriptor whose source and destination overlap,
// split into many commands (MDTS 1: 8 KiB each; more of them than bounce
// buffers), acts as one memmove, by Copy and through the bounce buffers:
// its commands go one at a time in the order that reads every block
// before it is overwritten, and a Copy never spans its own overlap (the
// fake, like the specification, makes no promise for one that does).
void CheckOverlappingCopies(
    FakeNvmeController& ctrl,
    const std::function<absl::Status(uint64_t, uint64_t, uint64_t)>& copy) {
  constexpr uint64_t kBase = 262144;
  constexpr uint64_t kLength = 131072;  // 16 commands
  // Destination - source, in bytes (whole blocks, as NVMe moves).
  for (int64_t shift :
       {4096l, -4096l, 512l, -512l, 40960l, -40960l, 0l, 12288l, -12288l}) {
    SCOPED_TRACE(absl::StrCat("destination - source = ", shift));
    std::vector<uint8_t>& media = ctrl.media();
    Fill(media.data(), media.size(), static_cast<uint32_t>(shift + 100000));
    std::vector<uint8_t> want = media;
    const uint64_t dst = kBase + shift;
    std::memmove(want.data() + dst, want.data() + kBase, kLength);
    ASSERT_TRUE(copy(kBase, dst, kLength).ok());
    uint64_t wrong = 0;
    for (size_t i = 0; i < want.size(); ++i) wrong += media[i] != want[i];
    EXPECT_EQ(wrong, 0u);
  }
}

TEST_F(NvmeDeviceTest, OverlappingDeviceToDeviceByCopyActsAsMemmove) {
  ASSERT_TRUE(Open({.mdts = 1}).ok());
  CheckOverlappingCopies(
      *controller_, [&](uint64_t src, uint64_t dst, uint64_t n) {
        return Run(DmaDirection::kDeviceToDevice, n, 0, src, dst);
      });
  EXPECT_GT(controller_->copies(), 0);
}

TEST_F(NvmeDeviceTest, OverlappingDeviceToDeviceThroughTheBounceActsAsMemmove) {
  ASSERT_TRUE(Open({.mdts = 1}, "&d2d=bounce").ok());
  CheckOverlappingCopies(
      *controller_, [&](uint64_t src, uint64_t dst, uint64_t n) {
        return Run(DmaDirection::kDeviceToDevice, n, 0, src, dst);
      });
  EXPECT_EQ(controller_->copies(), 0);
}

TEST_F(NvmeDeviceTest, ErrorCompletionFailsOnlyItsTransfer) {
  ASSERT_TRUE(Open({.fail_io_at = 1, .fail_status = 0x80}).ok());
  const absl::Status failed = Run(DmaDirection::kHostToDevice, 4096, 0, 0);
  EXPECT_EQ(failed.code(), absl::StatusCode::kOutOfRange) << failed;
  EXPECT_THAT(std::string(failed.message()), HasSubstr("LBA Out of Range"));
  EXPECT_TRUE(Run(DmaDirection::kHostToDevice, 4096, 0, 0).ok());
}

// QEMU reports DMA its IOMMU blocked as success; a real controller fails
// the command, and so does the fake.
TEST_F(NvmeDeviceTest, DmaTheIommuBlocksIsAnError) {
  absl::StatusOr<FaultSpec> spec = ParseFaultSpec("iommu:nth=1");
  ASSERT_TRUE(spec.ok()) << spec.status();
  FaultInjector faults(*spec);
  ASSERT_TRUE(Open({}, "", {}, &faults).ok());
  const absl::Status failed = Run(DmaDirection::kHostToDevice, 8192, 0, 0);
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(std::string(failed.message()), HasSubstr("IOMMU blocked"));
  EXPECT_EQ(controller_->blocked_dma(), 1);
  EXPECT_TRUE(Run(DmaDirection::kHostToDevice, 8192, 0, 0).ok());
}

TEST_F(NvmeDeviceTest, FatalStatusAtEnableFailsOpenLeavingNothing) {
  testutil::ScopedTestLogging logs;
  const absl::Status s = Open({.fatal_on_enable = true});
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("fatal status"));
}

// Commands the controller never completes are aborted at shut-down: the
// engine disables the controller and waits for CSTS.RDY = 0 (here 300 ms
// late) before failing them, so no DMA can land after.
TEST_F(NvmeDeviceTest, CommandsThatNeverCompleteAreAbortedAfterRdyClears) {
  testutil::ScopedTestLogging logs;
  ASSERT_TRUE(
      Open({.timeout_units = 4, .hold_io_from = 1, .disable_delay_ms = 300})
          .ok());
  DmaDescriptor d;
  d.user_data = 77;
  d.length = 8192;
  d.host_window = window_;
  d.direction = DmaDirection::kHostToDevice;
  ASSERT_EQ(device_->Submit(DmaDirection::kHostToDevice, {&d, 1}), 1u);
  for (int i = 0; i < 10000 && controller_->held() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(controller_->held(), 1);
  device_->Shutdown();
  // Shutdown returned: the controller had stopped by then.
  EXPECT_FALSE(controller_->ready());
  EXPECT_EQ(controller_->disables(), 1);
  std::optional<DmaCompletion> c = sink_.WaitFor(77);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->status.code(), absl::StatusCode::kAborted) << c->status;
}

// A controller that fails or resets itself under I/O completes nothing
// more: the engine notices (CSTS), fails what is out with the reason, and
// fails every later transfer at once with the same one.
TEST_F(NvmeDeviceTest, FatalStatusUnderIoFailsTheTransfersOutAndLater) {
  testutil::ScopedTestLogging logs;
  ASSERT_TRUE(Open({.fatal_at_io = 2}).ok());
  ASSERT_TRUE(Run(DmaDirection::kHostToDevice, 4096, 0, 0).ok());
  const absl::Status failed = Run(DmaDirection::kHostToDevice, 4096, 0, 0);
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_THAT(std::string(failed.message()),
              HasSubstr("reports a fatal status under I/O"));
  const absl::Status later = Run(DmaDirection::kDeviceToHost, 4096, 0, 0);
  EXPECT_EQ(later.code(), absl::StatusCode::kInternal) << later;
  EXPECT_THAT(std::string(later.message()), HasSubstr("is unusable"));
  // The later one never went out: two entries were ever published.
  EXPECT_EQ(controller_->io_submitted(), 2);
}

// A command a working controller never completes: after the command
// timeout the engine gives up on the controller (disables it, so its DMA
// stops) and fails that transfer and every later one.
TEST_F(NvmeDeviceTest, CommandThatTimesOutFailsAndStopsTheController) {
  testutil::ScopedTestLogging logs;
  ASSERT_TRUE(Open({.hold_io_from = 2}, "", {}, nullptr,
                   {.command_timeout = absl::Milliseconds(300)})
                  .ok());
  ASSERT_TRUE(Run(DmaDirection::kHostToDevice, 4096, 0, 0).ok());
  const absl::Status late = Run(DmaDirection::kDeviceToHost, 4096, 0, 0);
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  EXPECT_THAT(std::string(late.message()),
              HasSubstr("did not complete within 0.3 s"));
  EXPECT_EQ(controller_->disables(), 1);
  const absl::Status later = Run(DmaDirection::kHostToDevice, 4096, 0, 0);
  EXPECT_EQ(later.code(), absl::StatusCode::kDeadlineExceeded) << later;
}

// The controller completes the late command as it is being disabled: that
// completion is real and is taken (the transfer succeeds), and the command
// id is not freed twice (a second abort or a hang would follow).
TEST_F(NvmeDeviceTest, CompletionPostedDuringTheAbortIsTakenOnce) {
  testutil::ScopedTestLogging logs;
  ASSERT_TRUE(Open({.hold_io_from = 2, .complete_held_on_disable = true}, "",
                   {}, nullptr, {.command_timeout = absl::Milliseconds(300)})
                  .ok());
  ASSERT_TRUE(Run(DmaDirection::kHostToDevice, 4096, 0, 0).ok());
  const absl::Status late = Run(DmaDirection::kDeviceToHost, 4096, 0, 0);
  EXPECT_TRUE(late.ok()) << late;
  // The controller is disabled all the same; the device is unusable.
  const absl::Status later = Run(DmaDirection::kHostToDevice, 4096, 0, 0);
  EXPECT_EQ(later.code(), absl::StatusCode::kDeadlineExceeded) << later;
  Close();  // joins the workers: no wrapped counter keeps one busy
}

// The largest command (1 MiB) from a host buffer that does not start on a
// page takes 257 pages: one PRP entry and a list of 256, which still fits
// the one list page each command id has, so no list is ever chained.
TEST_F(NvmeDeviceTest, LargestCommandAtAnOddOffsetFitsOneListPage) {
  ASSERT_TRUE(Open().ok());
  Fill(host_.data + 512, 1 << 20, 17);
  std::vector<uint8_t> sent(host_.data + 512, host_.data + 512 + (1 << 20));
  ASSERT_TRUE(Run(DmaDirection::kHostToDevice, 1 << 20, 512, 0).ok());
  EXPECT_EQ(controller_->largest_io_bytes(), 1u << 20);
  EXPECT_GT(controller_->prp_list_commands(), 0);
  EXPECT_EQ(controller_->chained_prp_lists(), 0);
  EXPECT_TRUE(
      std::equal(sent.begin(), sent.end(), controller_->media().begin()));
}

TEST_F(NvmeDeviceTest, ControllerResetUnderIoFailsTheTransfersOut) {
  testutil::ScopedTestLogging logs;
  ASSERT_TRUE(Open({.reset_at_io = 1}).ok());
  const absl::Status failed = Run(DmaDirection::kDeviceToHost, 65536, 0, 0);
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_THAT(std::string(failed.message()), HasSubstr("was reset under I/O"));
}

// More descriptors than the submission queue has entries: the engine keeps
// at most depth - 1 commands out and issues the rest as entries free up.
TEST_F(NvmeDeviceTest, MoreCommandsThanQueueEntriesAllComplete) {
  ASSERT_TRUE(Open({.max_queue_entries = 4, .mdts = 0}).ok());
  std::vector<DmaDescriptor> batch(32);
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i].user_data = 1000 + i;
    batch[i].length = 8192;
    batch[i].host_offset = i * 8192;
    batch[i].device_address = i * 8192;
    batch[i].host_window = window_;
    batch[i].direction = DmaDirection::kHostToDevice;
  }
  Fill(host_.data, 32 * 8192, 21);
  ASSERT_EQ(device_->Submit(DmaDirection::kHostToDevice, batch), 32u);
  for (const DmaDescriptor& d : batch) {
    std::optional<DmaCompletion> c = sink_.WaitFor(d.user_data);
    ASSERT_TRUE(c.has_value());
    EXPECT_TRUE(c->status.ok()) << c->status;
  }
  EXPECT_TRUE(std::equal(host_.data, host_.data + 32 * 8192,
                         controller_->media().begin()));
}

TEST_F(NvmeDeviceTest, CloseDisablesTheControllerAndUnmapsEverything) {
  ASSERT_TRUE(Open().ok());
  ASSERT_TRUE(Run(DmaDirection::kHostToDevice, 4096, 0, 0).ok());
  Close();
  EXPECT_EQ(controller_->disables(), 1);
  EXPECT_FALSE(controller_->ready());
}

}  // namespace
}  // namespace tpushim
