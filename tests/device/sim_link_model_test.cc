// The sim:// link model at its limits: times that would overflow saturate
// (never delivered by the model, not wrapped into the past), and
// StopModelledDelays delivers what the model still held at once and
// stops timing later descriptors, so a device being torn down never
// sleeps out model time. Which descriptor an engine has taken is seen
// through the `dma` fault point's call count, never through timing.

#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "device/device.h"
#include "device/sim/sim_device.h"
#include "env/device_url.h"
#include "env/fault_injection.h"
#include "env/os.h"
#include "gtest/gtest.h"

namespace tpushim {
namespace {

constexpr int64_t kTenSecondsNs = 10'000'000'000;

class Sink : public DmaCompletionSink {
 public:
  struct Record {
    DmaCompletion completion;
    int64_t arrived_ns;
  };
  void OnDmaComplete(DmaDirection,
                     absl::Span<const DmaCompletion> completions) override {
    const int64_t now = Os::Default()->MonotonicNanos();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const DmaCompletion& c : completions) records_.push_back({c, now});
    }
    cv_.notify_all();
  }
  // Waits (without a time limit: a hang is ctest's timeout) for `n`.
  std::vector<Record> WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return records_.size() >= n; });
    return records_;
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return records_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Record> records_;
};

DmaDescriptor Copy(uint64_t user_data, uint64_t length) {
  DmaDescriptor d;
  d.user_data = user_data;
  d.length = length;
  d.device_address = 0;
  d.peer_device = 0;
  d.peer_address = 512 * 1024;
  d.direction = DmaDirection::kDeviceToDevice;
  return d;
}

// Until an engine has taken (and run) `n` descriptors in all.
void AwaitTaken(const FaultInjector& faults, uint64_t n) {
  while (faults.calls(FaultPoint::kDma) < n) std::this_thread::yield();
}

using Devices = std::vector<std::unique_ptr<Device>>;

// The devices of `url`, device 0 completing into `sink`.
Devices Start(const DeviceUrl& url, FaultInjector& faults, Sink& sink) {
  absl::StatusOr<Devices> devices =
      CreateSimDevices(url, Os::Default(), &faults);
  EXPECT_TRUE(devices.ok()) << devices.status();
  if (!devices.ok()) return {};
  (*devices)[0]->SetCompletionSink(&sink);
  return *std::move(devices);
}

TEST(SimLinkModelTest, StopModelledDelaysDeliversWhatTheModelStillHeld) {
  absl::StatusOr<DeviceUrl> url =
      ParseDeviceUrl("sim://?hbm=2M&latency_us=10000000");  // 10 s
  ASSERT_TRUE(url.ok()) << url.status();
  FaultInjector faults;
  Sink sink;
  Devices devices = Start(*url, faults, sink);
  ASSERT_FALSE(devices.empty());
  Device& dev = *devices[0];
  const DmaDescriptor first = Copy(1, 4096);
  ASSERT_EQ(dev.Submit(first.direction, {&first, 1}), 1u);
  AwaitTaken(faults, 1);  // it ran, and its completion waits for the model

  dev.StopModelledDelays();
  std::vector<Sink::Record> records = sink.WaitFor(1);
  const DmaCompletion& held = records[0].completion;
  EXPECT_TRUE(held.status.ok()) << held.status;
  EXPECT_EQ(held.end_ns - held.start_ns, kTenSecondsNs);
  EXPECT_LT(records[0].arrived_ns, held.end_ns)
      << "delivered at its modelled time, not when told to stop waiting";

  // Later descriptors are not timed at all.
  const DmaDescriptor second = Copy(2, 4096);
  ASSERT_EQ(dev.Submit(second.direction, {&second, 1}), 1u);
  records = sink.WaitFor(2);
  EXPECT_TRUE(records[1].completion.status.ok());
  EXPECT_LT(records[1].completion.end_ns - records[1].completion.start_ns,
            kTenSecondsNs);
}

// Settings the URL parser refuses, given straight to the device: the
// modelled end saturates at "never" instead of overflowing (which made a
// 512 KiB copy over 10^-13 Gb/s complete at once).
TEST(SimLinkModelTest, TimesPastTheRangeSaturateInsteadOfWrapping) {
  for (const auto& [gbps, latency_us] :
       {std::pair<double, double>{1e-13, 0}, std::pair<double, double>{0, 1e16},
        std::pair<double, double>{1e-13, 1e16}}) {
    SCOPED_TRACE(testing::Message()
                 << gbps << " Gb/s, " << latency_us << " us");
    DeviceUrl url;
    url.hbm_bytes = uint64_t{2} << 20;
    url.link_gbps = gbps;
    url.latency_us = latency_us;
    FaultInjector faults;
    Sink sink;
    Devices devices = Start(url, faults, sink);
    ASSERT_FALSE(devices.empty());
    Device& dev = *devices[0];
    const DmaDescriptor d = Copy(7, 512 * 1024);
    ASSERT_EQ(dev.Submit(d.direction, {&d, 1}), 1u);
    AwaitTaken(faults, 1);
    EXPECT_EQ(sink.count(), 0u) << "the model delivered it at once";
    dev.StopModelledDelays();
    const std::vector<Sink::Record> records = sink.WaitFor(1);
    EXPECT_TRUE(records[0].completion.status.ok());
    EXPECT_EQ(records[0].completion.end_ns,
              std::numeric_limits<int64_t>::max());
    EXPECT_GE(records[0].completion.end_ns, records[0].completion.start_ns);
    dev.Shutdown();
  }
}

}  // namespace
}  // namespace tpushim
