// SimDevice::Poll (device/device.h): a thread about to wait for a small
// transfer runs the descriptor waiting in the ring itself, and hears of its
// completion on its own thread, rather than wait for a DMA thread to wake.
//
// A poll races the device's engine, which the submit woke: the tests that
// need a poll to win submit and poll at once after the engine went idle,
// many times, and ask for one win (the engine takes microseconds to wake,
// the poll follows the submit at once); the tests of what a poll must not
// do ask it of every try. Where a test needs the engine busy, the sink
// holds it while it delivers a first descriptor.

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "device/device.h"
#include "device/sim/sim_device.h"
#include "env/device_url.h"
#include "env/os.h"
#include "gtest/gtest.h"

namespace tpushim {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr auto kWaitTimeout = std::chrono::seconds(10);

std::string ThreadName() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

// Records each completion with the thread it arrived on. Hold(prefix):
// a completion delivered on a thread whose name starts with `prefix`
// ("dma": the device's DMA threads) blocks that thread inside the sink
// until Release(prefix) (the first such thread only); completions on other
// threads pass.
class HoldingSink : public DmaCompletionSink {
 public:
  struct Record {
    uint64_t user_data = 0;
    absl::Status status;
    std::thread::id thread;
  };

  void OnDmaComplete(DmaDirection,
                     absl::Span<const DmaCompletion> completions) override {
    std::unique_lock<std::mutex> lock(mu_);
    for (const DmaCompletion& c : completions) {
      records_.push_back({c.user_data, c.status, std::this_thread::get_id()});
    }
    cv_.notify_all();
    const std::string name = ThreadName();
    for (Rule& rule : rules_) {
      if (rule.holding && rule.held < rule.max_held &&
          absl::StartsWith(name, rule.prefix)) {
        ++rule.held;
        cv_.notify_all();
        cv_.wait(lock, [&] { return !rule.holding; });
        --rule.held;
        return;
      }
    }
  }

  // Holds at most `max_held` such threads at a time.
  void Hold(const std::string& prefix, int max_held = 1) {
    std::lock_guard<std::mutex> lock(mu_);
    rules_.push_back({prefix, true, 0, max_held});
  }
  // True once a thread of `prefix` is held inside the sink.
  bool WaitHeld(const std::string& prefix) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kWaitTimeout, [&] {
      for (const Rule& rule : rules_) {
        if (rule.prefix == prefix && rule.held > 0) return true;
      }
      return false;
    });
  }
  void Release(const std::string& prefix) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Rule& rule : rules_) {
        if (rule.prefix == prefix) rule.holding = false;
      }
    }
    cv_.notify_all();
  }
  void ReleaseAll() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Rule& rule : rules_) rule.holding = false;
    }
    cv_.notify_all();
  }
  // The record of `user_data`, once it arrived (false on timeout).
  bool WaitFor(uint64_t user_data, Record* out) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kWaitTimeout, [&] {
      for (const Record& r : records_) {
        if (r.user_data == user_data) {
          *out = r;
          return true;
        }
      }
      return false;
    });
  }
  bool Arrived(uint64_t user_data) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Record& r : records_) {
      if (r.user_data == user_data) return true;
    }
    return false;
  }

 private:
  struct Rule {
    std::string prefix;
    bool holding;
    int held;
    int max_held;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Record> records_;
  std::deque<Rule> rules_;  // stable addresses: waiters keep a reference
};

class SimPollTest : public ::testing::Test {
 protected:
  void Open(absl::string_view url_text) {
    absl::StatusOr<DeviceUrl> url = ParseDeviceUrl(url_text);
    ASSERT_TRUE(url.ok()) << url.status();
    absl::StatusOr<std::vector<std::unique_ptr<Device>>> devices =
        CreateSimDevices(*url, Os::Default(), nullptr);
    ASSERT_TRUE(devices.ok()) << devices.status();
    devices_ = *std::move(devices);
    device().SetCompletionSink(&sink_);
    host_.assign(64 * kKiB, 0);
    for (size_t i = 0; i < host_.size(); ++i) {
      host_[i] = static_cast<char>(i * 7 + 3);
    }
    absl::StatusOr<HostWindowId> w =
        device().RegisterHostWindow(host_.data(), host_.size());
    ASSERT_TRUE(w.ok()) << w.status();
    window_ = *w;
    absl::StatusOr<uint64_t> a = device().AllocateMemory(64 * kKiB);
    ASSERT_TRUE(a.ok()) << a.status();
    address_ = *a;
  }
  void TearDown() override {
    sink_.ReleaseAll();
    for (auto& d : devices_) d->Shutdown();
  }
  Device& device() { return *devices_[0]; }

  DmaDescriptor Put(uint64_t user_data, uint64_t offset, uint64_t length) {
    return DmaDescriptor{.user_data = user_data,
                         .length = length,
                         .host_offset = offset,
                         .device_address = address_ + offset,
                         .host_window = window_,
                         .direction = DmaDirection::kHostToDevice};
  }
  // Submits `first` and waits until its DMA thread is held in the sink.
  void HoldTheEngineWith(const DmaDescriptor& first) {
    sink_.Hold("dma");
    ASSERT_EQ(device().Submit(first.direction, {&first, 1}), 1u);
    ASSERT_TRUE(sink_.WaitHeld("dma")) << "the DMA thread never delivered";
  }
  void Submit(const DmaDescriptor& d) {
    ASSERT_EQ(device().Submit(d.direction, {&d, 1}), 1u);
  }

  HoldingSink sink_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<char> host_;
  HostWindowId window_ = kInvalidHostWindow;
  uint64_t address_ = 0;
};

TEST_F(SimPollTest, RunsTheWaitingDescriptorAndDeliversOnTheCallingThread) {
  Open("sim://?hbm=1M");
  int won = 0;
  for (int i = 0; i < 50 && (won < 5 || i < 8); ++i) {
    // Let the engine finish the last one and go idle.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const uint64_t id = 100 + i;
    Submit(Put(id, (i % 8) * 4 * kKiB, 4 * kKiB));
    const bool polled = device().Poll(DmaDirection::kHostToDevice, 4 * kKiB);
    HoldingSink::Record r;
    ASSERT_TRUE(sink_.WaitFor(id, &r));
    EXPECT_TRUE(r.status.ok()) << r.status;
    // Delivered on the thread that ran it: this one exactly when it polled.
    EXPECT_EQ(r.thread == std::this_thread::get_id(), polled) << i;
    if (polled) ++won;
  }
  // The engine has to wake for each; the poll, a microsecond after the
  // submit, gets there first nearly every time.
  EXPECT_GT(won, 0);
  // Nothing waits now: a poll runs nothing.
  EXPECT_FALSE(device().Poll(DmaDirection::kHostToDevice, 4 * kKiB));

  // The bytes are on the device: read them back.
  std::vector<char> back(32 * kKiB, 0);
  absl::StatusOr<HostWindowId> w =
      device().RegisterHostWindow(back.data(), back.size());
  ASSERT_TRUE(w.ok()) << w.status();
  const DmaDescriptor get{.user_data = 1,
                          .length = back.size(),
                          .host_offset = 0,
                          .device_address = address_,
                          .host_window = *w,
                          .direction = DmaDirection::kDeviceToHost};
  Submit(get);
  HoldingSink::Record r;
  ASSERT_TRUE(sink_.WaitFor(1, &r));
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(std::memcmp(back.data(), host_.data(), back.size()), 0);
  ASSERT_TRUE(device().UnregisterHostWindow(*w).ok());
}

TEST_F(SimPollTest, WaitsItsTurnBehindTheEngine) {
  // With one engine a poll runs a descriptor only in the engine's place:
  // the queue runs and completes its descriptors one at a time, in order.
  Open("sim://?hbm=1M");
  HoldTheEngineWith(Put(1, 0, 4 * kKiB));  // held while it delivers
  Submit(Put(2, 4 * kKiB, 4 * kKiB));
  EXPECT_FALSE(device().Poll(DmaDirection::kHostToDevice, 4 * kKiB));
  EXPECT_FALSE(sink_.Arrived(2));
  sink_.ReleaseAll();
  HoldingSink::Record r;
  ASSERT_TRUE(sink_.WaitFor(2, &r));
  EXPECT_TRUE(r.status.ok()) << r.status;
}

TEST_F(SimPollTest, TakesAPlaceOfSeveralEngines) {
  // Two engines, one held delivering: a poll may run the next one.
  Open("sim://?hbm=1M&dma_engines=2");
  HoldTheEngineWith(Put(1, 0, 4 * kKiB));
  int won = 0;
  for (int i = 0; i < 50 && won == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    Submit(Put(100 + i, 4 * kKiB, 4 * kKiB));
    if (device().Poll(DmaDirection::kHostToDevice, 4 * kKiB)) ++won;
  }
  EXPECT_GT(won, 0);
}

TEST_F(SimPollTest, LeavesADescriptorLongerThanAsked) {
  Open("sim://?hbm=1M");
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const uint64_t id = 100 + i;
    Submit(Put(id, 0, 8 * kKiB));
    EXPECT_FALSE(device().Poll(DmaDirection::kHostToDevice, 8 * kKiB - 1));
    HoldingSink::Record r;
    ASSERT_TRUE(sink_.WaitFor(id, &r));  // its engine runs it
    EXPECT_NE(r.thread, std::this_thread::get_id());
  }
}

TEST_F(SimPollTest, LeavesTheLinkModelsDescriptorsToItsEngines) {
  // The engines keep the modelled link's time; a poll would jump it.
  Open("sim://?hbm=1M&link_gbps=100");
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const uint64_t id = 100 + i;
    Submit(Put(id, 0, 4 * kKiB));
    EXPECT_FALSE(device().Poll(DmaDirection::kHostToDevice, 4 * kKiB));
    HoldingSink::Record r;
    ASSERT_TRUE(sink_.WaitFor(id, &r));
    EXPECT_NE(r.thread, std::this_thread::get_id());
  }
}

TEST_F(SimPollTest, ShutdownWaitsForAPollStillDelivering) {
  Open("sim://?hbm=1M");
  // A thread that submits and polls until its poll wins; the sink then
  // holds that delivery, so the poll is inside the device when Shutdown
  // starts (the engine is idle).
  sink_.Hold("poller");
  std::atomic<bool> won{false};
  std::thread poller([&] {
    pthread_setname_np(pthread_self(), "poller");
    for (int i = 0; i < 200 && !won; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const DmaDescriptor d = Put(100 + i, 0, 4 * kKiB);
      if (device().Submit(d.direction, {&d, 1}) != 1) return;
      if (device().Poll(DmaDirection::kHostToDevice, 4 * kKiB)) won = true;
    }
  });
  ASSERT_TRUE(sink_.WaitHeld("poller"));
  std::future<void> shut =
      std::async(std::launch::async, [&] { device().Shutdown(); });
  EXPECT_EQ(shut.wait_for(std::chrono::milliseconds(200)),
            std::future_status::timeout)
      << "Shutdown returned while a poll was still delivering";
  sink_.Release("poller");
  shut.get();
  poller.join();
  EXPECT_TRUE(won);
  // Shut down: no poll runs.
  EXPECT_FALSE(device().Poll(DmaDirection::kHostToDevice, 4 * kKiB));
}

}  // namespace
}  // namespace tpushim
