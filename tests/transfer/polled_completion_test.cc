// A thread that awaits a small transfer runs the transfer's descriptor
// itself when no DMA thread has taken it (Device::Poll), instead of
// waiting for one to wake: on a VM a wake-up costs tens of microseconds,
// the 4 KiB copy about one.
//
// The devices are wrapped to count the completions delivered off the DMA
// threads (by a waiter that ran the descriptor), and to hold a DMA thread
// inside the completion sink. A waiter races the DMA thread its submit
// woke, so the tests that need the waiter to win make many transfers,
// each after the thread went idle, and ask for one win; what a waiter
// must not do is asked of every transfer.

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "device/device.h"
#include "gtest/gtest.h"
#include "tests/testing/forwarding_device.h"
#include "tests/testing/transfer_rig.h"
#include "transfer/engine.h"
#include "transfer/transfer_engine.h"

namespace tpushim {
namespace {

using testutil::TransferRig;

constexpr uint64_t kKiB = 1024;

bool OnDmaThread() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return absl::StartsWith(name, "dma");
}

// Forwards everything to the device under it; while held, a completion
// that one of the device's DMA threads delivers waits inside the sink
// until released (one a poll delivers, on its caller's thread, passes).
class HoldingDevice : public testutil::ForwardingDevice,
                      public DmaCompletionSink {
 public:
  using ForwardingDevice::ForwardingDevice;

  void Hold() {
    std::lock_guard<std::mutex> lock(mu_);
    holding_ = true;
  }
  // True once a DMA thread waits inside the sink.
  bool WaitHeld() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10),
                        [&] { return held_ > 0; });
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      holding_ = false;
    }
    cv_.notify_all();
  }
  // Completions delivered on threads that are not the device's.
  uint64_t polled() const { return polled_.load(); }

  void OnDmaComplete(DmaDirection direction,
                     absl::Span<const DmaCompletion> completions) override {
    if (!OnDmaThread()) {
      polled_ += completions.size();
    } else {
      std::unique_lock<std::mutex> lock(mu_);
      if (holding_) {
        ++held_;
        cv_.notify_all();
        cv_.wait(lock, [&] { return !holding_; });
        --held_;
      }
    }
    sink_.load()->OnDmaComplete(direction, completions);
  }

  void SetCompletionSink(DmaCompletionSink* sink) override {
    sink_.store(sink);
    ForwardingDevice::SetCompletionSink(sink == nullptr ? nullptr : this);
  }
  void Shutdown() override {
    Release();
    ForwardingDevice::Shutdown();
  }

 private:
  std::atomic<DmaCompletionSink*> sink_{nullptr};
  std::atomic<uint64_t> polled_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool holding_ = false;
  int held_ = 0;
};

std::vector<char> Pattern(uint64_t n, int seed) {
  std::vector<char> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 13 + seed);
  return v;
}

class PolledCompletionTest : public ::testing::Test {
 protected:
  void Open(const std::string& url) {
    absl::StatusOr<std::unique_ptr<TransferRig>> rig = TransferRig::Create(
        {.region_bytes = 16 << 20,
         .device_url = url,
         .wrap_device = [this](std::unique_ptr<Device> d) {
           auto holding = std::make_unique<HoldingDevice>(std::move(d));
           if (device_ == nullptr) device_ = holding.get();
           return std::unique_ptr<Device>(std::move(holding));
         }});
    ASSERT_TRUE(rig.ok()) << rig.status();
    rig_ = *std::move(rig);
    absl::StatusOr<DeviceBuffer> b = rig_->engine().Allocate(0, 2 << 20);
    ASSERT_TRUE(b.ok()) << b.status();
    buffer_ = *b;
  }
  void TearDown() override {
    if (device_ != nullptr) device_->Release();
  }
  TransferEngine& engine() { return rig_->engine(); }

  // Holds device 0's host→device DMA thread inside the sink, with a
  // transfer of its own; returns that transfer's event.
  Event HoldTheDmaThread(const std::vector<char>& first) {
    device_->Hold();
    absl::StatusOr<Event> e =
        engine().TransferToDevice(first.data(), buffer_, 0, first.size());
    EXPECT_TRUE(e.ok()) << e.status();
    EXPECT_TRUE(device_->WaitHeld()) << "the DMA thread never delivered";
    return *e;
  }
  std::vector<char> ReadBack(uint64_t offset, uint64_t n) {
    std::vector<char> back(n, 0);
    absl::StatusOr<Event> e =
        engine().TransferFromDevice(buffer_, offset, back.data(), n);
    EXPECT_TRUE(e.ok()) << e.status();
    if (e.ok()) {
      EXPECT_TRUE(e->Await().ok());
    }
    return back;
  }

  std::unique_ptr<TransferRig> rig_;
  HoldingDevice* device_ = nullptr;
  DeviceBuffer buffer_;
};

// Transfers `count` pieces of `n` bytes to the buffer, each after the DMA
// threads went idle, each awaited; returns how many of their completions a
// waiter delivered (it ran the descriptor).
uint64_t AwaitedOneByOne(TransferEngine& engine, HoldingDevice& device,
                         const DeviceBuffer& buffer, uint64_t n, int count) {
  const uint64_t before = device.polled();
  for (int i = 0; i < count; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const std::vector<char> data = Pattern(n, i);
    absl::StatusOr<Event> e =
        engine.TransferToDevice(data.data(), buffer, 64 * kKiB, n);
    EXPECT_TRUE(e.ok()) << e.status();
    if (e.ok()) {
      EXPECT_TRUE(e->Await().ok());
    }
  }
  return device.polled() - before;
}

TEST_F(PolledCompletionTest, AWaiterRunsItsSmallTransferNotTheDmaThread) {
  Open("sim://?hbm=64M");
  EXPECT_GT(AwaitedOneByOne(engine(), *device_, buffer_, 4 * kKiB, 50), 0u);
  // What the waiters ran arrived.
  EXPECT_EQ(ReadBack(64 * kKiB, 4 * kKiB), Pattern(4 * kKiB, 49));
}

TEST_F(PolledCompletionTest, AWaiterLeavesALargeTransferToTheDmaThreads) {
  // Above the size whose waiters poll: it waits for its DMA thread.
  Open("sim://?hbm=64M");
  const uint64_t large = transfer_internal::kSpinAwaitMaxBytes * 2;
  EXPECT_EQ(AwaitedOneByOne(engine(), *device_, buffer_, large, 20), 0u);
}

TEST_F(PolledCompletionTest, UnderTheLinkModelTheDmaThreadsKeepTheTime) {
  Open("sim://?hbm=64M&link_gbps=100");
  EXPECT_EQ(AwaitedOneByOne(engine(), *device_, buffer_, 4 * kKiB, 20), 0u);
}

TEST_F(PolledCompletionTest, AWaiterWaitsItsTurnBehindTheDmaThread) {
  // One DMA engine: a waiter runs a descriptor only in its place, so the
  // queue's transfers still complete in submission order.
  Open("sim://?hbm=64M");
  const std::vector<char> first = Pattern(4 * kKiB, 1);
  const std::vector<char> second = Pattern(4 * kKiB, 2);
  Event held = HoldTheDmaThread(first);
  absl::StatusOr<Event> e =
      engine().TransferToDevice(second.data(), buffer_, 64 * kKiB, 4 * kKiB);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_FALSE(e->AwaitWithTimeout(absl::Milliseconds(200)).has_value());
  device_->Release();
  EXPECT_TRUE(held.Await().ok());
  EXPECT_TRUE(e->Await().ok());
  EXPECT_EQ(ReadBack(64 * kKiB, 4 * kKiB), second);
}

TEST_F(PolledCompletionTest, ConcurrentRoundTripsArriveWhole) {
  // Waiters and DMA threads run descriptors side by side: two threads of
  // round trips on their own halves of the buffer, every byte checked.
  Open("sim://?hbm=64M");
  auto worker = [this](int id, int* mismatches) {
    const uint64_t base = static_cast<uint64_t>(id) << 20;
    for (int i = 0; i < 300; ++i) {
      const uint64_t n = (1 + (i % 16)) * kKiB;
      const std::vector<char> out = Pattern(n, id * 1000 + i);
      std::vector<char> back(n, 0);
      absl::StatusOr<Event> up =
          engine().TransferToDevice(out.data(), buffer_, base, n);
      ASSERT_TRUE(up.ok()) << up.status();
      ASSERT_TRUE(up->Await().ok());
      absl::StatusOr<Event> down =
          engine().TransferFromDevice(buffer_, base, back.data(), n);
      ASSERT_TRUE(down.ok()) << down.status();
      ASSERT_TRUE(down->Await().ok());
      if (back != out) ++*mismatches;
    }
  };
  int mismatches[2] = {0, 0};
  std::thread a(worker, 0, &mismatches[0]);
  std::thread b(worker, 1, &mismatches[1]);
  a.join();
  b.join();
  EXPECT_EQ(mismatches[0], 0);
  EXPECT_EQ(mismatches[1], 0);
}

}  // namespace
}  // namespace tpushim
