// Conformance suite for tpushim's C ABI (include/tpushim/c_api.h): what any
// implementation of TpuShim_Api must do, checked through the table alone.
// The suite is parameterized by a function returning the table; tpushim's
// own (TpuShim_GetApi, with an empty environment) is instantiated at the
// bottom, and another implementation plugs in with one more
// INSTANTIATE_TEST_SUITE_P.
//
// Covered: the version fields; every function against a NULL args pointer,
// a struct_size of 0 or below the 1.0 size, exactly the 1.0 size (an older
// caller) and a larger one (a newer caller; the unknown tail is neither
// read nor written); stale, doubly-freed, foreign (another system's, or
// another kind's) and made-up handles of every kind; error codes equal to
// abseil's; the RESOURCE_EXHAUSTED texts (libtpu's for the region, XLA's
// for device memory, the threshold named); failed dependencies propagating
// through events; callbacks (inline, on the callback thread, with an error
// status, calling back in); System_Destroy with live buffers and pending
// work, and racing other calls; option errors naming the variable. For
// tpushim's own table (TpushimCApiTest, through the adapter's test seam):
// a full event handle table refusing every submitting call before it
// queues anything.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <new>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "driver/c_api_internal.h"
#include "env/os.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fork_child.h"
#include "tpushim/c_api.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;

// ---- Error codes are abseil's
// -------------------------------------------------

static_assert(TPUSHIM_CODE_OK == static_cast<int>(absl::StatusCode::kOk));
static_assert(TPUSHIM_CODE_CANCELLED ==
              static_cast<int>(absl::StatusCode::kCancelled));
static_assert(TPUSHIM_CODE_UNKNOWN ==
              static_cast<int>(absl::StatusCode::kUnknown));
static_assert(TPUSHIM_CODE_INVALID_ARGUMENT ==
              static_cast<int>(absl::StatusCode::kInvalidArgument));
static_assert(TPUSHIM_CODE_DEADLINE_EXCEEDED ==
              static_cast<int>(absl::StatusCode::kDeadlineExceeded));
static_assert(TPUSHIM_CODE_NOT_FOUND ==
              static_cast<int>(absl::StatusCode::kNotFound));
static_assert(TPUSHIM_CODE_ALREADY_EXISTS ==
              static_cast<int>(absl::StatusCode::kAlreadyExists));
static_assert(TPUSHIM_CODE_PERMISSION_DENIED ==
              static_cast<int>(absl::StatusCode::kPermissionDenied));
static_assert(TPUSHIM_CODE_RESOURCE_EXHAUSTED ==
              static_cast<int>(absl::StatusCode::kResourceExhausted));
static_assert(TPUSHIM_CODE_FAILED_PRECONDITION ==
              static_cast<int>(absl::StatusCode::kFailedPrecondition));
static_assert(TPUSHIM_CODE_ABORTED ==
              static_cast<int>(absl::StatusCode::kAborted));
static_assert(TPUSHIM_CODE_OUT_OF_RANGE ==
              static_cast<int>(absl::StatusCode::kOutOfRange));
static_assert(TPUSHIM_CODE_UNIMPLEMENTED ==
              static_cast<int>(absl::StatusCode::kUnimplemented));
static_assert(TPUSHIM_CODE_INTERNAL ==
              static_cast<int>(absl::StatusCode::kInternal));
static_assert(TPUSHIM_CODE_UNAVAILABLE ==
              static_cast<int>(absl::StatusCode::kUnavailable));
static_assert(TPUSHIM_CODE_DATA_LOSS ==
              static_cast<int>(absl::StatusCode::kDataLoss));
static_assert(TPUSHIM_CODE_UNAUTHENTICATED ==
              static_cast<int>(absl::StatusCode::kUnauthenticated));

// Every size macro is the size up to the struct's last 1.0 field.
static_assert(TPUSHIM_API_STRUCT_SIZE <= sizeof(TpuShim_Api));
static_assert(TPUSHIM_STATS_STRUCT_SIZE < sizeof(TpuShim_Stats));  // 1.2
static_assert(TPUSHIM_EVENT_ISREADY_ARGS_STRUCT_SIZE <
              sizeof(TpuShim_Event_IsReady_Args));  // trailing padding

// ---- Helpers
// --------------------------------------------------------------------

// An error, taken apart (and freed).
struct Result {
  int code = TPUSHIM_CODE_OK;
  std::string message;
  bool ok() const { return code == TPUSHIM_CODE_OK; }
};

// An implementation under test.
struct Implementation {
  const char* name;
  const TpuShim_Api* (*get)();
};

// Test names show the implementation's name (not the bytes of a pointer).
[[maybe_unused]] void PrintTo(const Implementation& impl, std::ostream* os) {
  *os << impl.name;
}

using Options = std::vector<std::pair<std::string, std::string>>;

// The device the suite's systems use: two 16 MiB simulated devices, or the
// one TPUSHIM_TEST_DEVICE names (the VM test runs the suite on
// vfio://…?engine=nvme; tests that need what only sim:// has skip there).
std::string TestDevice() {
  const char* device = std::getenv("TPUSHIM_TEST_DEVICE");
  return device != nullptr && *device != '\0' ? device
                                              : "sim://?devices=2&hbm=16M";
}

// Whether the suite runs on its own two simulated devices, whose sizes
// the exact expectations below assume.
bool OnDefaultDevices() {
  const char* device = std::getenv("TPUSHIM_TEST_DEVICE");
  return device == nullptr || *device == '\0';
}

// Devices of TestDevice(): a vfio:// URL names one, sim:// `devices=N`.
int TestDeviceCount() {
  const std::string device = TestDevice();
  if (device.rfind("vfio://", 0) == 0) return 1;
  const size_t at = device.find("devices=");
  return at == std::string::npos ? 1 : std::atoi(device.c_str() + at + 8);
}

// The last device: device-to-device tests copy to it (another device when
// there are several).
int LastDevice() { return TestDeviceCount() - 1; }

// Small, quiet systems: 4 MiB region, the test device, no log files.
Options SmallOptions(std::string device = TestDevice(),
                     uint64_t region = 4 * kMiB) {
  return {{"TPU_PREMAPPED_BUFFER_SIZE", std::to_string(region)},
          {"TPUSHIM_DEVICE", std::move(device)},
          {"TPU_LOG_DIR", "disabled"},
          {"TPU_STDERR_LOG_LEVEL", "3"},
          {"TPUSHIM_PREFAULT_THREADS", "1"}};
}

// `options` with one more (later, so winning) setting.
Options With(Options options, std::string name, std::string value) {
  options.emplace_back(std::move(name), std::move(value));
  return options;
}

// A simulated chip the test device's systems never use (they own chips 0
// and 1 of a simulated host), for a second system alive beside them.
Options SpareChipOptions() {
  return With(SmallOptions("sim://?devices=3&hbm=16M"), "TPU_VISIBLE_CHIPS",
              "2");
}

// A device slow enough that work queued behind a transfer is still pending
// a while later: 0.05 Gbit/s moves 256 KiB in ~40 ms.
constexpr char kSlowDevice[] = "sim://?devices=1&hbm=16M&link_gbps=0.05";
// Two such chips, for two systems at once (each owns the chips it uses).
constexpr char kSlowPair[] = "sim://?devices=2&hbm=16M&link_gbps=0.05";

// Waits (bounded) for a count set by callbacks.
class Counter {
 public:
  void Add(int code) {
    std::lock_guard<std::mutex> lock(mu_);
    codes_.push_back(code);
    threads_.push_back(std::this_thread::get_id());
    cv_.notify_all();
  }
  bool WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30),
                        [&] { return codes_.size() >= n; });
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return codes_.size();
  }
  std::vector<int> codes() {
    std::lock_guard<std::mutex> lock(mu_);
    return codes_;
  }
  std::vector<std::thread::id> threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> codes_;
  std::vector<std::thread::id> threads_;
};

const TpuShim_Api* g_api = nullptr;  // for the C callbacks

// A callback that records its status code in the Counter `user_arg`.
void CountCallback(TpuShim_Error* status, void* user_arg) {
  const int code = g_api->Error_Code(status);
  g_api->Error_Destroy(status);
  static_cast<Counter*>(user_arg)->Add(code);
}

// The outcome of calling a function with an args struct placed at the start
// of a larger buffer pre-filled with 0xA5.
struct Outcome {
  Result result;
  // No byte at or beyond min(struct_size, sizeof(Args)) changed, apart from
  // the larger-struct case's own fields (a library must not write beyond
  // the struct_size it was given, nor beyond the fields it knows).
  bool tail_intact = true;
};

constexpr size_t kTail = 64;
constexpr unsigned char kFill = 0xA5;

class CApiConformanceTest : public ::testing::TestWithParam<Implementation> {
 protected:
  void SetUp() override {
    api_ = GetParam().get();
    ASSERT_NE(api_, nullptr);
    g_api = api_;
  }

  void TearDown() override {
    for (TpuShim_System s : systems_) {
      TpuShim_System_Destroy_Args a{};
      a.struct_size = TPUSHIM_SYSTEM_DESTROY_ARGS_STRUCT_SIZE;
      a.system = s;
      api_->Error_Destroy(api_->System_Destroy(&a));  // OK or already gone
    }
  }

  Result Take(TpuShim_Error* error) {
    Result r{api_->Error_Code(error), api_->Error_Message(error)};
    api_->Error_Destroy(error);
    return r;
  }

  // Calls `fn` with `args` copied into a 0xA5-filled buffer kTail bytes
  // larger than Args, up to `struct_size` (or all of it, when larger);
  // the args (outs included) are copied back into `*out`.
  template <typename Args>
  Outcome Invoke(TpuShim_Error* (*fn)(Args*), const Args& args,
                 size_t struct_size, bool null_args = false,
                 Args* out = nullptr) {
    EXPECT_LE(struct_size, sizeof(Args) + kTail);
    alignas(std::max_align_t) unsigned char storage[sizeof(Args) + kTail];
    std::memset(storage, kFill, sizeof storage);
    Args* p = new (storage) Args;  // trivial: keeps the bytes
    std::memcpy(static_cast<void*>(p), &args,
                std::min(struct_size, sizeof(Args)));
    p->struct_size = struct_size;
    Outcome outcome;
    outcome.result = Take(fn(null_args ? nullptr : p));
    // A newer implementation may know (and write) fields this header does
    // not: only check what it cannot know.
    const size_t known = api_->api_minor > TPUSHIM_API_MINOR
                             ? sizeof(storage)
                             : std::min(struct_size, sizeof(Args));
    const size_t from = std::max(known, sizeof(size_t));
    for (size_t i = from; i < sizeof(storage); ++i) {
      if (storage[i] != kFill) outcome.tail_intact = false;
    }
    if (out != nullptr) std::memcpy(static_cast<void*>(out), p, sizeof(Args));
    return outcome;
  }

  // ---- Systems

  Result TryCreate(const Options& options, TpuShim_System* system) {
    std::vector<TpuShim_Option> c;
    for (const auto& [name, value] : options) {
      c.push_back({name.c_str(), value.c_str()});
    }
    TpuShim_System_Create_Args a{};
    a.struct_size = TPUSHIM_SYSTEM_CREATE_ARGS_STRUCT_SIZE;
    a.options = c.data();
    a.num_options = c.size();
    Result r = Take(api_->System_Create(&a));
    if (r.ok()) {
      systems_.push_back(a.system);
      if (system != nullptr) *system = a.system;
    }
    return r;
  }

  TpuShim_System NewSystem(const Options& options = SmallOptions()) {
    TpuShim_System s{};
    const Result r = TryCreate(options, &s);
    EXPECT_TRUE(r.ok()) << r.message;
    return s;
  }

  Result DestroySystem(TpuShim_System s) {
    TpuShim_System_Destroy_Args a{};
    a.struct_size = TPUSHIM_SYSTEM_DESTROY_ARGS_STRUCT_SIZE;
    a.system = s;
    return Take(api_->System_Destroy(&a));
  }

  Result DeviceCount(TpuShim_System s, int* count = nullptr) {
    TpuShim_System_GetDeviceCount_Args a{};
    a.struct_size = TPUSHIM_SYSTEM_GETDEVICECOUNT_ARGS_STRUCT_SIZE;
    a.system = s;
    Result r = Take(api_->System_GetDeviceCount(&a));
    if (count != nullptr) *count = a.device_count;
    return r;
  }

  Result Stats(TpuShim_System s, TpuShim_Stats* stats) {
    std::memset(stats, 0, sizeof *stats);
    stats->struct_size = sizeof *stats;
    TpuShim_System_GetStats_Args a{};
    a.struct_size = TPUSHIM_SYSTEM_GETSTATS_ARGS_STRUCT_SIZE;
    a.system = s;
    a.stats = stats;
    return Take(api_->System_GetStats(&a));
  }

  // ---- Buffers

  struct Host {
    TpuShim_HostBuffer handle{};
    void* data = nullptr;
  };

  Result TryHost(TpuShim_System s, uint64_t size, Host* host) {
    TpuShim_HostBuffer_Allocate_Args a{};
    a.struct_size = TPUSHIM_HOSTBUFFER_ALLOCATE_ARGS_STRUCT_SIZE;
    a.system = s;
    a.size = size;
    Result r = Take(api_->HostBuffer_Allocate(&a));
    if (r.ok() && host != nullptr) *host = Host{a.buffer, a.data};
    return r;
  }

  Host NewHost(TpuShim_System s, uint64_t size) {
    Host h;
    const Result r = TryHost(s, size, &h);
    EXPECT_TRUE(r.ok()) << r.message;
    return h;
  }

  Result FreeHost(TpuShim_System s, TpuShim_HostBuffer b) {
    TpuShim_HostBuffer_Free_Args a{};
    a.struct_size = TPUSHIM_HOSTBUFFER_FREE_ARGS_STRUCT_SIZE;
    a.system = s;
    a.buffer = b;
    return Take(api_->HostBuffer_Free(&a));
  }

  Result TryDevice(TpuShim_System s, int device, uint64_t size,
                   TpuShim_DeviceBuffer* buffer) {
    TpuShim_DeviceBuffer_Allocate_Args a{};
    a.struct_size = TPUSHIM_DEVICEBUFFER_ALLOCATE_ARGS_STRUCT_SIZE;
    a.system = s;
    a.device = device;
    a.size = size;
    Result r = Take(api_->DeviceBuffer_Allocate(&a));
    if (r.ok() && buffer != nullptr) *buffer = a.buffer;
    return r;
  }

  TpuShim_DeviceBuffer NewDevice(TpuShim_System s, uint64_t size,
                                 int device = 0) {
    TpuShim_DeviceBuffer b{};
    const Result r = TryDevice(s, device, size, &b);
    EXPECT_TRUE(r.ok()) << r.message;
    return b;
  }

  Result Deallocate(TpuShim_System s, TpuShim_DeviceBuffer b,
                    std::vector<TpuShim_Event> wait_for = {},
                    TpuShim_Event* event = nullptr) {
    TpuShim_DeviceBuffer_Deallocate_Args a{};
    a.struct_size = TPUSHIM_DEVICEBUFFER_DEALLOCATE_ARGS_STRUCT_SIZE;
    a.system = s;
    a.buffer = b;
    a.wait_for = wait_for.data();
    a.num_wait_for = wait_for.size();
    Result r = Take(api_->DeviceBuffer_Deallocate(&a));
    if (r.ok()) {
      if (event != nullptr) {
        *event = a.event;
      } else {
        EXPECT_TRUE(Await(a.event).ok());
        EXPECT_TRUE(DestroyEvent(a.event).ok());
      }
    }
    return r;
  }

  // ---- Transfers

  Result TryToDevice(
      TpuShim_System s, const void* src, TpuShim_DeviceBuffer dst,
      uint64_t offset, uint64_t size, std::vector<TpuShim_Event> wait_for,
      TpuShim_Event* event,
      int32_t semantics =
          TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES) {
    TpuShim_Transfer_ToDevice_Args a{};
    a.struct_size = TPUSHIM_TRANSFER_TODEVICE_ARGS_STRUCT_SIZE;
    a.system = s;
    a.src = src;
    a.dst = dst;
    a.dst_offset = offset;
    a.size = size;
    a.wait_for = wait_for.data();
    a.num_wait_for = wait_for.size();
    a.semantics = semantics;
    Result r = Take(api_->Transfer_ToDevice(&a));
    if (r.ok() && event != nullptr) *event = a.event;
    return r;
  }

  TpuShim_Event ToDevice(TpuShim_System s, const void* src,
                         TpuShim_DeviceBuffer dst, uint64_t offset,
                         uint64_t size,
                         std::vector<TpuShim_Event> wait_for = {}) {
    TpuShim_Event e{};
    const Result r = TryToDevice(s, src, dst, offset, size, wait_for, &e);
    EXPECT_TRUE(r.ok()) << r.message;
    return e;
  }

  Result TryFromDevice(TpuShim_System s, TpuShim_DeviceBuffer src,
                       uint64_t offset, void* dst, uint64_t size,
                       std::vector<TpuShim_Event> wait_for,
                       TpuShim_Event* event) {
    TpuShim_Transfer_FromDevice_Args a{};
    a.struct_size = TPUSHIM_TRANSFER_FROMDEVICE_ARGS_STRUCT_SIZE;
    a.system = s;
    a.src = src;
    a.src_offset = offset;
    a.dst = dst;
    a.size = size;
    a.wait_for = wait_for.data();
    a.num_wait_for = wait_for.size();
    a.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
    Result r = Take(api_->Transfer_FromDevice(&a));
    if (r.ok() && event != nullptr) *event = a.event;
    return r;
  }

  TpuShim_Event FromDevice(TpuShim_System s, TpuShim_DeviceBuffer src,
                           uint64_t offset, void* dst, uint64_t size,
                           std::vector<TpuShim_Event> wait_for = {}) {
    TpuShim_Event e{};
    const Result r = TryFromDevice(s, src, offset, dst, size, wait_for, &e);
    EXPECT_TRUE(r.ok()) << r.message;
    return e;
  }

  Result TryDeviceToDevice(TpuShim_System s, TpuShim_DeviceBuffer src,
                           TpuShim_DeviceBuffer dst, uint64_t size,
                           std::vector<TpuShim_Event> wait_for,
                           TpuShim_Event* event) {
    TpuShim_Transfer_DeviceToDevice_Args a{};
    a.struct_size = TPUSHIM_TRANSFER_DEVICETODEVICE_ARGS_STRUCT_SIZE;
    a.system = s;
    a.src = src;
    a.dst = dst;
    a.size = size;
    a.wait_for = wait_for.data();
    a.num_wait_for = wait_for.size();
    Result r = Take(api_->Transfer_DeviceToDevice(&a));
    if (r.ok() && event != nullptr) *event = a.event;
    return r;
  }

  // ---- Events

  Result Await(TpuShim_Event e) {
    TpuShim_Event_Await_Args a{};
    a.struct_size = TPUSHIM_EVENT_AWAIT_ARGS_STRUCT_SIZE;
    a.event = e;
    return Take(api_->Event_Await(&a));
  }

  Result AwaitFor(TpuShim_Event e, int64_t timeout_ns, bool* ready) {
    TpuShim_Event_AwaitWithTimeout_Args a{};
    a.struct_size = TPUSHIM_EVENT_AWAITWITHTIMEOUT_ARGS_STRUCT_SIZE;
    a.event = e;
    a.timeout_ns = timeout_ns;
    a.ready = false;
    Result r = Take(api_->Event_AwaitWithTimeout(&a));
    *ready = a.ready;
    return r;
  }

  Result IsReady(TpuShim_Event e, bool* ready) {
    TpuShim_Event_IsReady_Args a{};
    a.struct_size = TPUSHIM_EVENT_ISREADY_ARGS_STRUCT_SIZE;
    a.event = e;
    Result r = Take(api_->Event_IsReady(&a));
    *ready = a.is_ready;
    return r;
  }

  Result AddCallback(TpuShim_Event e, TpuShim_EventCallback callback,
                     void* user_arg) {
    TpuShim_Event_AddCallback_Args a{};
    a.struct_size = TPUSHIM_EVENT_ADDCALLBACK_ARGS_STRUCT_SIZE;
    a.event = e;
    a.callback = callback;
    a.user_arg = user_arg;
    return Take(api_->Event_AddCallback(&a));
  }

  Result DestroyEvent(TpuShim_Event e) {
    TpuShim_Event_Destroy_Args a{};
    a.struct_size = TPUSHIM_EVENT_DESTROY_ARGS_STRUCT_SIZE;
    a.event = e;
    return Take(api_->Event_Destroy(&a));
  }

  // A ready event of `s` (a finished 4 KiB upload into `b`).
  TpuShim_Event ReadyEvent(TpuShim_System s, TpuShim_DeviceBuffer b) {
    static const std::vector<char> kHost(4096, 7);
    TpuShim_Event e = ToDevice(s, kHost.data(), b, 0, kHost.size());
    EXPECT_TRUE(Await(e).ok());
    return e;
  }

  // One entry per function of the table (Error_* aside): runs it with
  // fresh, valid arguments at a given struct_size and cleans up after it.
  struct Call {
    const char* name;
    size_t v1_size;      // TPUSHIM_*_ARGS_STRUCT_SIZE
    size_t header_size;  // sizeof the args struct in this header
    std::function<Outcome(size_t struct_size, bool null_args)> run;
  };
  std::vector<Call> Calls(TpuShim_System s);

  const TpuShim_Api* api_ = nullptr;
  std::vector<TpuShim_System> systems_;  // destroyed in TearDown
};

void NoOpCallback(TpuShim_Error* status, void*) {
  g_api->Error_Destroy(status);
}

std::vector<CApiConformanceTest::Call> CApiConformanceTest::Calls(
    TpuShim_System s) {
  const TpuShim_DeviceBuffer dev = NewDevice(s, 64 * kKiB);
  const TpuShim_DeviceBuffer dev2 = NewDevice(s, 64 * kKiB);
  const TpuShim_Event ready = ReadyEvent(s, dev);
  static std::vector<char> host(64 * kKiB, 3);
  std::vector<Call> calls;

  calls.push_back(
      {"System_Create", TPUSHIM_SYSTEM_CREATE_ARGS_STRUCT_SIZE,
       sizeof(TpuShim_System_Create_Args), [this](size_t size, bool null_args) {
         const Options options = SpareChipOptions();
         std::vector<TpuShim_Option> c;
         for (const auto& [n, v] : options) {
           c.push_back({n.c_str(), v.c_str()});
         }
         TpuShim_System_Create_Args a{};
         a.options = c.data();
         a.num_options = c.size();
         TpuShim_System_Create_Args out{};
         Outcome o = Invoke(api_->System_Create, a, size, null_args, &out);
         if (o.result.ok()) {
           EXPECT_NE(out.system.id, 0u);
           EXPECT_TRUE(DestroySystem(out.system).ok());
         }
         return o;
       }});
  calls.push_back({"System_Destroy", TPUSHIM_SYSTEM_DESTROY_ARGS_STRUCT_SIZE,
                   sizeof(TpuShim_System_Destroy_Args),
                   [this](size_t size, bool null_args) {
                     TpuShim_System victim = NewSystem(SpareChipOptions());
                     TpuShim_System_Destroy_Args a{};
                     a.system = victim;
                     Outcome o =
                         Invoke(api_->System_Destroy, a, size, null_args);
                     if (!o.result.ok()) DestroySystem(victim);
                     return o;
                   }});
  calls.push_back(
      {"System_GetDeviceCount", TPUSHIM_SYSTEM_GETDEVICECOUNT_ARGS_STRUCT_SIZE,
       sizeof(TpuShim_System_GetDeviceCount_Args),
       [this, s](size_t size, bool null_args) {
         TpuShim_System_GetDeviceCount_Args a{};
         a.system = s;
         TpuShim_System_GetDeviceCount_Args out{};
         Outcome o =
             Invoke(api_->System_GetDeviceCount, a, size, null_args, &out);
         if (o.result.ok()) {
           EXPECT_EQ(out.device_count, TestDeviceCount());
         }
         return o;
       }});
  calls.push_back(
      {"System_GetDeviceInfo", TPUSHIM_SYSTEM_GETDEVICEINFO_ARGS_STRUCT_SIZE,
       sizeof(TpuShim_System_GetDeviceInfo_Args),
       [this, s](size_t size, bool null_args) {
         TpuShim_System_GetDeviceInfo_Args a{};
         a.system = s;
         a.device = LastDevice();
         TpuShim_System_GetDeviceInfo_Args out{};
         Outcome o =
             Invoke(api_->System_GetDeviceInfo, a, size, null_args, &out);
         if (o.result.ok()) {
           if (OnDefaultDevices()) {
             EXPECT_EQ(out.hbm_bytes, 16 * kMiB);
           } else {
             EXPECT_GT(out.hbm_bytes, 0u);
           }
           EXPECT_NE(out.name, nullptr);
         }
         return o;
       }});
  calls.push_back({"System_GetStats", TPUSHIM_SYSTEM_GETSTATS_ARGS_STRUCT_SIZE,
                   sizeof(TpuShim_System_GetStats_Args),
                   [this, s](size_t size, bool null_args) {
                     TpuShim_Stats stats{};
                     stats.struct_size = sizeof stats;
                     TpuShim_System_GetStats_Args a{};
                     a.system = s;
                     a.stats = &stats;
                     Outcome o =
                         Invoke(api_->System_GetStats, a, size, null_args);
                     if (o.result.ok()) {
                       EXPECT_EQ(stats.region_capacity_bytes, 4 * kMiB);
                     }
                     return o;
                   }});
  calls.push_back(
      {"HostBuffer_Allocate", TPUSHIM_HOSTBUFFER_ALLOCATE_ARGS_STRUCT_SIZE,
       sizeof(TpuShim_HostBuffer_Allocate_Args),
       [this, s](size_t size, bool null_args) {
         TpuShim_HostBuffer_Allocate_Args a{};
         a.system = s;
         a.size = 4096;
         TpuShim_HostBuffer_Allocate_Args out{};
         Outcome o =
             Invoke(api_->HostBuffer_Allocate, a, size, null_args, &out);
         if (o.result.ok()) {
           EXPECT_NE(out.data, nullptr);
           EXPECT_TRUE(FreeHost(s, out.buffer).ok());
         }
         return o;
       }});
  calls.push_back({"HostBuffer_Free", TPUSHIM_HOSTBUFFER_FREE_ARGS_STRUCT_SIZE,
                   sizeof(TpuShim_HostBuffer_Free_Args),
                   [this, s](size_t size, bool null_args) {
                     const Host h = NewHost(s, 4096);
                     TpuShim_HostBuffer_Free_Args a{};
                     a.system = s;
                     a.buffer = h.handle;
                     Outcome o =
                         Invoke(api_->HostBuffer_Free, a, size, null_args);
                     if (!o.result.ok()) FreeHost(s, h.handle);
                     return o;
                   }});
  calls.push_back(
      {"DeviceBuffer_Allocate", TPUSHIM_DEVICEBUFFER_ALLOCATE_ARGS_STRUCT_SIZE,
       sizeof(TpuShim_DeviceBuffer_Allocate_Args),
       [this, s](size_t size, bool null_args) {
         TpuShim_DeviceBuffer_Allocate_Args a{};
         a.system = s;
         a.device = LastDevice();
         a.size = 4096;
         TpuShim_DeviceBuffer_Allocate_Args out{};
         Outcome o =
             Invoke(api_->DeviceBuffer_Allocate, a, size, null_args, &out);
         if (o.result.ok()) {
           EXPECT_TRUE(Deallocate(s, out.buffer).ok());
         }
         return o;
       }});
  calls.push_back({"DeviceBuffer_Deallocate",
                   TPUSHIM_DEVICEBUFFER_DEALLOCATE_ARGS_STRUCT_SIZE,
                   sizeof(TpuShim_DeviceBuffer_Deallocate_Args),
                   [this, s, ready](size_t size, bool null_args) {
                     const TpuShim_DeviceBuffer b = NewDevice(s, 4096);
                     TpuShim_DeviceBuffer_Deallocate_Args a{};
                     a.system = s;
                     a.buffer = b;
                     a.wait_for = &ready;
                     a.num_wait_for = 1;
                     TpuShim_DeviceBuffer_Deallocate_Args out{};
                     Outcome o = Invoke(api_->DeviceBuffer_Deallocate, a, size,
                                        null_args, &out);
                     if (o.result.ok()) {
                       EXPECT_TRUE(Await(out.event).ok());
                       EXPECT_TRUE(DestroyEvent(out.event).ok());
                     } else {
                       Deallocate(s, b);
                     }
                     return o;
                   }});
  calls.push_back(
      {"Transfer_ToDevice", TPUSHIM_TRANSFER_TODEVICE_ARGS_STRUCT_SIZE,
       sizeof(TpuShim_Transfer_ToDevice_Args),
       [this, s, dev, ready](size_t size, bool null_args) {
         TpuShim_Transfer_ToDevice_Args a{};
         a.system = s;
         a.src = host.data();
         a.dst = dev;
         a.size = 4096;
         a.wait_for = &ready;
         a.num_wait_for = 1;
         TpuShim_Transfer_ToDevice_Args out{};
         Outcome o = Invoke(api_->Transfer_ToDevice, a, size, null_args, &out);
         if (o.result.ok()) {
           EXPECT_TRUE(Await(out.event).ok());
           EXPECT_TRUE(DestroyEvent(out.event).ok());
           // 1.4: the host_released event, when the struct has room.
           if (size >= sizeof out && api_->api_minor >= 4) {
             EXPECT_TRUE(DestroyEvent(out.host_released).ok());
           }
         }
         return o;
       }});
  calls.push_back(
      {"Transfer_FromDevice", TPUSHIM_TRANSFER_FROMDEVICE_ARGS_STRUCT_SIZE,
       sizeof(TpuShim_Transfer_FromDevice_Args),
       [this, s, dev, ready](size_t size, bool null_args) {
         std::vector<char> back(4096);
         TpuShim_Transfer_FromDevice_Args a{};
         a.system = s;
         a.src = dev;
         a.dst = back.data();
         a.size = back.size();
         a.wait_for = &ready;
         a.num_wait_for = 1;
         TpuShim_Transfer_FromDevice_Args out{};
         Outcome o =
             Invoke(api_->Transfer_FromDevice, a, size, null_args, &out);
         if (o.result.ok()) {
           EXPECT_TRUE(Await(out.event).ok());
           EXPECT_TRUE(DestroyEvent(out.event).ok());
         }
         return o;
       }});
  calls.push_back({"Transfer_DeviceToDevice",
                   TPUSHIM_TRANSFER_DEVICETODEVICE_ARGS_STRUCT_SIZE,
                   sizeof(TpuShim_Transfer_DeviceToDevice_Args),
                   [this, s, dev, dev2, ready](size_t size, bool null_args) {
                     TpuShim_Transfer_DeviceToDevice_Args a{};
                     a.system = s;
                     a.src = dev;
                     a.dst = dev2;
                     a.size = 4096;
                     a.wait_for = &ready;
                     a.num_wait_for = 1;
                     TpuShim_Transfer_DeviceToDevice_Args out{};
                     Outcome o = Invoke(api_->Transfer_DeviceToDevice, a, size,
                                        null_args, &out);
                     if (o.result.ok()) {
                       EXPECT_TRUE(Await(out.event).ok());
                       EXPECT_TRUE(DestroyEvent(out.event).ok());
                     }
                     return o;
                   }});
  calls.push_back({"Event_IsReady", TPUSHIM_EVENT_ISREADY_ARGS_STRUCT_SIZE,
                   sizeof(TpuShim_Event_IsReady_Args),
                   [this, ready](size_t size, bool null_args) {
                     TpuShim_Event_IsReady_Args a{};
                     a.event = ready;
                     TpuShim_Event_IsReady_Args out{};
                     Outcome o =
                         Invoke(api_->Event_IsReady, a, size, null_args, &out);
                     if (o.result.ok()) {
                       EXPECT_TRUE(out.is_ready);
                     }
                     return o;
                   }});
  calls.push_back({"Event_Await", TPUSHIM_EVENT_AWAIT_ARGS_STRUCT_SIZE,
                   sizeof(TpuShim_Event_Await_Args),
                   [this, ready](size_t size, bool null_args) {
                     TpuShim_Event_Await_Args a{};
                     a.event = ready;
                     return Invoke(api_->Event_Await, a, size, null_args);
                   }});
  calls.push_back({"Event_AwaitWithTimeout",
                   TPUSHIM_EVENT_AWAITWITHTIMEOUT_ARGS_STRUCT_SIZE,
                   sizeof(TpuShim_Event_AwaitWithTimeout_Args),
                   [this, ready](size_t size, bool null_args) {
                     TpuShim_Event_AwaitWithTimeout_Args a{};
                     a.event = ready;
                     a.timeout_ns = 1'000'000'000;
                     TpuShim_Event_AwaitWithTimeout_Args out{};
                     Outcome o = Invoke(api_->Event_AwaitWithTimeout, a, size,
                                        null_args, &out);
                     if (o.result.ok()) {
                       EXPECT_TRUE(out.ready);
                     }
                     return o;
                   }});
  calls.push_back({"Event_AddCallback",
                   TPUSHIM_EVENT_ADDCALLBACK_ARGS_STRUCT_SIZE,
                   sizeof(TpuShim_Event_AddCallback_Args),
                   [this, ready](size_t size, bool null_args) {
                     TpuShim_Event_AddCallback_Args a{};
                     a.event = ready;
                     a.callback = NoOpCallback;
                     return Invoke(api_->Event_AddCallback, a, size, null_args);
                   }});
  calls.push_back({"Event_Destroy", TPUSHIM_EVENT_DESTROY_ARGS_STRUCT_SIZE,
                   sizeof(TpuShim_Event_Destroy_Args),
                   [this, s, dev](size_t size, bool null_args) {
                     const TpuShim_Event e = ReadyEvent(s, dev);
                     TpuShim_Event_Destroy_Args a{};
                     a.event = e;
                     Outcome o =
                         Invoke(api_->Event_Destroy, a, size, null_args);
                     if (!o.result.ok()) DestroyEvent(e);
                     return o;
                   }});
  if (!TPUSHIM_API_HAS(api_, System_GetDeviceMemoryStats)) return calls;
  // 1.3: shaped device memory.
  calls.push_back({"DeviceBuffer_AllocateShaped",
                   TPUSHIM_DEVICEBUFFER_ALLOCATESHAPED_ARGS_STRUCT_SIZE,
                   sizeof(TpuShim_DeviceBuffer_AllocateShaped_Args),
                   [this, s](size_t size, bool null_args) {
                     TpuShim_DeviceBuffer_AllocateShaped_Args a{};
                     a.system = s;
                     a.device = LastDevice();
                     a.shape = "f32[8,128]";
                     TpuShim_DeviceBuffer_AllocateShaped_Args out{};
                     Outcome o = Invoke(api_->DeviceBuffer_AllocateShaped, a,
                                        size, null_args, &out);
                     if (o.result.ok()) {
                       EXPECT_EQ(out.size, 4096u);
                       EXPECT_TRUE(Deallocate(s, out.buffer).ok());
                     }
                     return o;
                   }});
  calls.push_back({"Transfer_ArrayToDevice",
                   TPUSHIM_TRANSFER_ARRAYTODEVICE_ARGS_STRUCT_SIZE,
                   sizeof(TpuShim_Transfer_ArrayToDevice_Args),
                   [this, s, dev, ready](size_t size, bool null_args) {
                     TpuShim_Transfer_ArrayToDevice_Args a{};
                     a.system = s;
                     a.src = host.data();
                     a.dst = dev;
                     a.wait_for = &ready;
                     a.num_wait_for = 1;
                     TpuShim_Transfer_ArrayToDevice_Args out{};
                     Outcome o = Invoke(api_->Transfer_ArrayToDevice, a, size,
                                        null_args, &out);
                     if (o.result.ok()) {
                       EXPECT_TRUE(Await(out.event).ok());
                       EXPECT_TRUE(DestroyEvent(out.event).ok());
                       // 1.4: host_released, when the struct has room.
                       if (size >= sizeof out && api_->api_minor >= 4) {
                         EXPECT_TRUE(DestroyEvent(out.host_released).ok());
                       }
                     }
                     return o;
                   }});
  calls.push_back({"Transfer_ArrayFromDevice",
                   TPUSHIM_TRANSFER_ARRAYFROMDEVICE_ARGS_STRUCT_SIZE,
                   sizeof(TpuShim_Transfer_ArrayFromDevice_Args),
                   [this, s, dev, ready](size_t size, bool null_args) {
                     std::vector<char> back(64 * kKiB);
                     TpuShim_Transfer_ArrayFromDevice_Args a{};
                     a.system = s;
                     a.src = dev;
                     a.dst = back.data();
                     a.wait_for = &ready;
                     a.num_wait_for = 1;
                     TpuShim_Transfer_ArrayFromDevice_Args out{};
                     Outcome o = Invoke(api_->Transfer_ArrayFromDevice, a, size,
                                        null_args, &out);
                     if (o.result.ok()) {
                       EXPECT_TRUE(Await(out.event).ok());
                       EXPECT_TRUE(DestroyEvent(out.event).ok());
                     }
                     return o;
                   }});
  calls.push_back({"System_GetDeviceMemoryStats",
                   TPUSHIM_SYSTEM_GETDEVICEMEMORYSTATS_ARGS_STRUCT_SIZE,
                   sizeof(TpuShim_System_GetDeviceMemoryStats_Args),
                   [this, s](size_t size, bool null_args) {
                     TpuShim_System_GetDeviceMemoryStats_Args a{};
                     a.system = s;
                     TpuShim_System_GetDeviceMemoryStats_Args out{};
                     Outcome o = Invoke(api_->System_GetDeviceMemoryStats, a,
                                        size, null_args, &out);
                     if (o.result.ok()) {
                       EXPECT_GE(out.buffers_live, 1u);
                       EXPECT_GE(out.padded_bytes_in_use, 64 * kKiB);
                     }
                     return o;
                   }});
  return calls;
}

// ---- Version and table ------------------------------------------------------

TEST_P(CApiConformanceTest, TableHasVersionFieldsAndEveryFunction) {
  EXPECT_GE(api_->struct_size, TPUSHIM_API_STRUCT_SIZE);
  EXPECT_EQ(api_->api_major, TPUSHIM_API_MAJOR);
  EXPECT_GE(api_->api_minor, 0);
#define TPUSHIM_EXPECT_HAS(name) \
  EXPECT_TRUE(TPUSHIM_API_HAS(api_, name)) << #name
  TPUSHIM_EXPECT_HAS(Error_Destroy);
  TPUSHIM_EXPECT_HAS(Error_Code);
  TPUSHIM_EXPECT_HAS(Error_Message);
  TPUSHIM_EXPECT_HAS(System_Create);
  TPUSHIM_EXPECT_HAS(System_Destroy);
  TPUSHIM_EXPECT_HAS(System_GetDeviceCount);
  TPUSHIM_EXPECT_HAS(System_GetDeviceInfo);
  TPUSHIM_EXPECT_HAS(System_GetStats);
  TPUSHIM_EXPECT_HAS(HostBuffer_Allocate);
  TPUSHIM_EXPECT_HAS(HostBuffer_Free);
  TPUSHIM_EXPECT_HAS(DeviceBuffer_Allocate);
  TPUSHIM_EXPECT_HAS(DeviceBuffer_Deallocate);
  TPUSHIM_EXPECT_HAS(Transfer_ToDevice);
  TPUSHIM_EXPECT_HAS(Transfer_FromDevice);
  TPUSHIM_EXPECT_HAS(Transfer_DeviceToDevice);
  TPUSHIM_EXPECT_HAS(Event_IsReady);
  TPUSHIM_EXPECT_HAS(Event_Await);
  TPUSHIM_EXPECT_HAS(Event_AwaitWithTimeout);
  TPUSHIM_EXPECT_HAS(Event_AddCallback);
  TPUSHIM_EXPECT_HAS(Event_Destroy);
  if (api_->api_minor >= 3) {
    TPUSHIM_EXPECT_HAS(DeviceBuffer_AllocateShaped);
    TPUSHIM_EXPECT_HAS(Transfer_ArrayToDevice);
    TPUSHIM_EXPECT_HAS(Transfer_ArrayFromDevice);
    TPUSHIM_EXPECT_HAS(System_GetDeviceMemoryStats);
  }
#undef TPUSHIM_EXPECT_HAS
}

// ---- Shaped device memory (1.3)
// -------------------------------------------------

TEST_P(CApiConformanceTest, ShapedBuffersRoundTripAndCountPadding) {
  if (!TPUSHIM_API_HAS(api_, DeviceBuffer_AllocateShaped)) {
    GTEST_SKIP() << "a library before 1.3 has no shaped buffers";
  }
  const TpuShim_System s = NewSystem();
  char layout[8];
  TpuShim_DeviceBuffer_AllocateShaped_Args a{};
  a.struct_size = TPUSHIM_DEVICEBUFFER_ALLOCATESHAPED_ARGS_STRUCT_SIZE;
  a.system = s;
  a.shape = "s32[100,10]";
  a.label = "one_hot";
  a.layout = layout;
  a.layout_capacity = sizeof layout;
  ASSERT_TRUE(Take(api_->DeviceBuffer_AllocateShaped(&a)).ok());
  // 100 x 10 padded to 104 x 128 by T(8,128).
  EXPECT_GE(a.size, 104u * 128 * 4);
  EXPECT_EQ(a.unpadded_bytes, 100u * 10 * 4);
  EXPECT_EQ(a.host_bytes, 100u * 10 * 4);
  EXPECT_EQ(a.layout_length, std::strlen("s32[100,10]{1,0:T(8,128)}"));
  EXPECT_STREQ(layout, "s32[100");  // cut to the capacity, NUL-terminated

  std::vector<int32_t> host(1000), back(1000, -1);
  for (int i = 0; i < 1000; ++i) host[i] = i * 7 - 3000;
  TpuShim_Transfer_ArrayToDevice_Args up{};
  up.struct_size = TPUSHIM_TRANSFER_ARRAYTODEVICE_ARGS_STRUCT_SIZE;
  up.system = s;
  up.src = host.data();
  up.dst = a.buffer;
  ASSERT_TRUE(Take(api_->Transfer_ArrayToDevice(&up)).ok());
  TpuShim_Transfer_ArrayFromDevice_Args down{};
  down.struct_size = TPUSHIM_TRANSFER_ARRAYFROMDEVICE_ARGS_STRUCT_SIZE;
  down.system = s;
  down.src = a.buffer;
  down.dst = back.data();
  down.wait_for = &up.event;
  down.num_wait_for = 1;
  ASSERT_TRUE(Take(api_->Transfer_ArrayFromDevice(&down)).ok());
  EXPECT_TRUE(Await(down.event).ok());
  EXPECT_EQ(back, host);
  // The device holds the tiled image: row 1 starts 128 elements in.
  std::vector<int32_t> image(a.size / 4, -1);
  TpuShim_Transfer_FromDevice_Args bytes{};
  bytes.struct_size = TPUSHIM_TRANSFER_FROMDEVICE_ARGS_STRUCT_SIZE;
  bytes.system = s;
  bytes.src = a.buffer;
  bytes.dst = image.data();
  bytes.size = a.size;
  ASSERT_TRUE(Take(api_->Transfer_FromDevice(&bytes)).ok());
  EXPECT_TRUE(Await(bytes.event).ok());
  EXPECT_EQ(image[128], host[10]);
  EXPECT_EQ(image[10], 0);  // padding
  for (TpuShim_Event e : {up.event, down.event, bytes.event}) {
    EXPECT_TRUE(DestroyEvent(e).ok());
  }

  TpuShim_System_GetDeviceMemoryStats_Args m{};
  m.struct_size = TPUSHIM_SYSTEM_GETDEVICEMEMORYSTATS_ARGS_STRUCT_SIZE;
  m.system = s;
  ASSERT_TRUE(Take(api_->System_GetDeviceMemoryStats(&m)).ok());
  EXPECT_EQ(m.buffers_live, 1u);
  EXPECT_EQ(m.padded_bytes_in_use, 104u * 128 * 4);
  EXPECT_EQ(m.unpadded_bytes_in_use, 100u * 10 * 4);
  EXPECT_EQ(m.peak_padded_bytes, 104u * 128 * 4);
  EXPECT_GE(m.hbm_in_use, m.padded_bytes_in_use);
  EXPECT_EQ(m.hbm_in_use + m.hbm_free, m.hbm_bytes);
  EXPECT_TRUE(Deallocate(s, a.buffer).ok());
  m.device = TestDeviceCount();
  const Result bad = Take(api_->System_GetDeviceMemoryStats(&m));
  EXPECT_EQ(bad.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(bad.message, HasSubstr("does not exist"));
}

TEST_P(CApiConformanceTest, ShapedAllocationErrorsNameTheirCause) {
  if (!TPUSHIM_API_HAS(api_, DeviceBuffer_AllocateShaped)) {
    GTEST_SKIP() << "a library before 1.3 has no shaped buffers";
  }
  const TpuShim_System s = NewSystem();
  TpuShim_DeviceBuffer_AllocateShaped_Args a{};
  a.struct_size = TPUSHIM_DEVICEBUFFER_ALLOCATESHAPED_ARGS_STRUCT_SIZE;
  a.system = s;
  Result r = Take(api_->DeviceBuffer_AllocateShaped(&a));
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("args->shape is NULL"));
  a.shape = "f32[128,256";
  r = Take(api_->DeviceBuffer_AllocateShaped(&a));
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message,
              HasSubstr("f32[128,256: expected ',' or ']' at column 12"));
  // Far more than any test device holds: XLA's line, then its report.
  a.shape = "s32[29360128,10]";
  a.label = "one_hot";
  a.op_metadata = "op_type=\"OneHot\"";
  r = Take(api_->DeviceBuffer_AllocateShaped(&a));
  EXPECT_EQ(r.code, TPUSHIM_CODE_RESOURCE_EXHAUSTED);
  EXPECT_THAT(r.message, StartsWith("Error allocating device buffer: "
                                    "Attempting to allocate 14.00G."));
  EXPECT_THAT(r.message, HasSubstr("\nRan out of memory in memory space hbm."));
  EXPECT_THAT(r.message,
              HasSubstr("     Operator: op_type=\"OneHot\"\n"
                        "     Shape: s32[29360128,10]{1,0:T(8,128)}\n"
                        "     Unpadded size: 1.09G\n"
                        "     Extra memory due to padding: 12.91G "
                        "(12.8x expansion)\n"
                        "     XLA label: one_hot\n"
                        "     Allocation type: failed request\n"));
  TpuShim_System_GetDeviceMemoryStats_Args m{};
  m.struct_size = TPUSHIM_SYSTEM_GETDEVICEMEMORYSTATS_ARGS_STRUCT_SIZE;
  m.system = s;
  ASSERT_TRUE(Take(api_->System_GetDeviceMemoryStats(&m)).ok());
  EXPECT_EQ(m.buffers_live, 0u);
  EXPECT_EQ(m.hbm_in_use, 0u);
}

TEST_P(CApiConformanceTest, ErrorAccessorsTakeNullAsOk) {
  EXPECT_EQ(api_->Error_Code(nullptr), TPUSHIM_CODE_OK);
  EXPECT_STREQ(api_->Error_Message(nullptr), "");
  api_->Error_Destroy(nullptr);
}

// ---- Args structs: NULL, too small, older and newer callers
// --------------------

TEST_P(CApiConformanceTest, EveryFunctionRejectsNullArgs) {
  const TpuShim_System s = NewSystem();
  for (const Call& call : Calls(s)) {
    const Outcome o = call.run(call.v1_size, /*null_args=*/true);
    EXPECT_EQ(o.result.code, TPUSHIM_CODE_INVALID_ARGUMENT) << call.name;
  }
}

TEST_P(CApiConformanceTest, EveryFunctionRejectsAStructSizeBelowVersion1_0) {
  const TpuShim_System s = NewSystem();
  for (const Call& call : Calls(s)) {
    for (const size_t size : {size_t{0}, sizeof(size_t), call.v1_size - 1}) {
      const Outcome o = call.run(size, false);
      EXPECT_EQ(o.result.code, TPUSHIM_CODE_INVALID_ARGUMENT)
          << call.name << " struct_size " << size;
      EXPECT_TRUE(o.tail_intact) << call.name << " struct_size " << size;
    }
  }
}

// An older caller passes exactly the 1.0 size (no trailing padding, and
// garbage beyond it): accepted, and nothing beyond it is written.
TEST_P(CApiConformanceTest, EveryFunctionAcceptsTheVersion1_0Size) {
  const TpuShim_System s = NewSystem();
  for (const Call& call : Calls(s)) {
    const Outcome o = call.run(call.v1_size, false);
    EXPECT_TRUE(o.result.ok()) << call.name << ": " << o.result.message;
    EXPECT_TRUE(o.tail_intact) << call.name;
  }
}

// A newer caller passes a larger struct (fields appended in a later minor
// version): accepted, the unknown tail neither read nor written.
TEST_P(CApiConformanceTest, EveryFunctionAcceptsALargerStruct) {
  const TpuShim_System s = NewSystem();
  for (const Call& call : Calls(s)) {
    for (const size_t extra : {size_t{8}, kTail}) {
      const Outcome o = call.run(call.header_size + extra, false);
      EXPECT_TRUE(o.result.ok()) << call.name << ": " << o.result.message;
      EXPECT_TRUE(o.tail_intact) << call.name;
    }
  }
}

TEST_P(CApiConformanceTest, StatsStructIsSizeVersioned) {
  const TpuShim_System s = NewSystem();
  TpuShim_System_GetStats_Args a{};
  a.struct_size = TPUSHIM_SYSTEM_GETSTATS_ARGS_STRUCT_SIZE;
  a.system = s;
  a.stats = nullptr;
  EXPECT_EQ(Take(api_->System_GetStats(&a)).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);

  TpuShim_Stats small{};
  small.struct_size = TPUSHIM_STATS_STRUCT_SIZE - 1;
  a.stats = &small;
  EXPECT_EQ(Take(api_->System_GetStats(&a)).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);

  // A newer caller's larger stats struct: filled up to what the library
  // knows, the rest untouched.
  struct {
    TpuShim_Stats stats;
    unsigned char tail[kTail];
  } big;
  std::memset(&big, kFill, sizeof big);
  big.stats.struct_size = sizeof big;
  a.stats = &big.stats;
  EXPECT_TRUE(Take(api_->System_GetStats(&a)).ok());
  EXPECT_EQ(big.stats.region_capacity_bytes, 4 * kMiB);
  EXPECT_EQ(big.stats.events_pending, 0u);
  if (api_->api_minor == TPUSHIM_API_MINOR) {
    for (unsigned char c : big.tail) EXPECT_EQ(c, kFill);
  }

  // 1.2's staged_misaligned is written only into a struct that has it: a
  // 1.0/1.1 caller's struct ends before it.
  if (api_->api_minor >= 2) {
    TpuShim_Stats older;
    std::memset(&older, kFill, sizeof older);
    older.struct_size = TPUSHIM_STATS_STRUCT_SIZE;
    a.stats = &older;
    EXPECT_TRUE(Take(api_->System_GetStats(&a)).ok());
    uint64_t untouched;
    std::memset(&untouched, kFill, sizeof untouched);
    EXPECT_EQ(older.staged_misaligned, untouched);
    EXPECT_EQ(big.stats.staged_misaligned, 0u);
  }
}

// ---- Handles ----------------------------------------------------------------

TEST_P(CApiConformanceTest, StaleAndDoublyFreedHandlesOfEveryKind) {
  const TpuShim_System s = NewSystem();
  // Host buffer: freed twice.
  const Host h = NewHost(s, 4096);
  EXPECT_TRUE(FreeHost(s, h.handle).ok());
  Result r = FreeHost(s, h.handle);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TpuShim_HostBuffer"));

  // Device buffer: deallocated, then used and deallocated again.
  const TpuShim_DeviceBuffer keep = NewDevice(s, 4096);
  const TpuShim_DeviceBuffer d = NewDevice(s, 4096);
  EXPECT_TRUE(Deallocate(s, d).ok());
  std::vector<char> host(4096, 1);
  r = TryToDevice(s, host.data(), d, 0, 4096, {}, nullptr);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TpuShim_DeviceBuffer"));
  r = TryFromDevice(s, d, 0, host.data(), 4096, {}, nullptr);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(TryDeviceToDevice(s, keep, d, 4096, {}, nullptr).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  r = Deallocate(s, d);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TpuShim_DeviceBuffer"));

  // Event: destroyed twice, and used after.
  const TpuShim_Event e = ReadyEvent(s, keep);
  EXPECT_TRUE(DestroyEvent(e).ok());
  r = DestroyEvent(e);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TpuShim_Event"));
  bool ready = true;
  EXPECT_EQ(IsReady(e, &ready).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(Await(e).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(AwaitFor(e, 0, &ready).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(AddCallback(e, NoOpCallback, nullptr).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(TryToDevice(s, host.data(), keep, 0, 4096, {e}, nullptr).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);

  // A reused slot does not revive a stale handle.
  const Host h2 = NewHost(s, 4096);
  EXPECT_NE(h2.handle.id, h.handle.id);
  EXPECT_EQ(FreeHost(s, h.handle).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_TRUE(FreeHost(s, h2.handle).ok());

  // System: destroyed twice, and used after.
  EXPECT_TRUE(DestroySystem(s).ok());
  r = DestroySystem(s);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TpuShim_System"));
  EXPECT_EQ(DeviceCount(s).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(TryDevice(s, 0, 4096, nullptr).code, TPUSHIM_CODE_INVALID_ARGUMENT);
}

TEST_P(CApiConformanceTest, ForeignHandlesAreInvalidArgument) {
  const TpuShim_System one = NewSystem();
  // Simulated whatever the test device: a vfio:// device serves one system
  // at a time. Its own chip: `one` owns the test device's chips 0 and 1.
  const TpuShim_System two = NewSystem(
      With(SmallOptions("sim://?devices=3&hbm=16M"), "TPU_VISIBLE_CHIPS", "2"));
  const Host h = NewHost(one, 4096);
  const TpuShim_DeviceBuffer d1 = NewDevice(one, 4096);
  const TpuShim_DeviceBuffer d2 = NewDevice(two, 4096);
  const TpuShim_Event e1 = ReadyEvent(one, d1);
  std::vector<char> host(4096, 1);

  Result r = FreeHost(two, h.handle);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TpuShim_HostBuffer"));
  r = TryToDevice(two, host.data(), d1, 0, 4096, {}, nullptr);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TpuShim_DeviceBuffer"));
  EXPECT_EQ(TryFromDevice(two, d1, 0, host.data(), 4096, {}, nullptr).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(TryDeviceToDevice(one, d1, d2, 4096, {}, nullptr).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(Deallocate(two, d1).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  // An event of another system in a wait_for list.
  r = TryToDevice(two, host.data(), d2, 0, 4096, {e1}, nullptr);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TpuShim_Event"));
  EXPECT_EQ(Deallocate(two, d2, {e1}).code, TPUSHIM_CODE_INVALID_ARGUMENT);

  // A handle of another kind.
  TpuShim_DeviceBuffer event_as_buffer{e1.id};
  r = TryToDevice(one, host.data(), event_as_buffer, 0, 4096, {}, nullptr);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TpuShim_DeviceBuffer"));
  EXPECT_EQ(DeviceCount(TpuShim_System{d1.id}).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(DestroyEvent(TpuShim_Event{h.handle.id}).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(FreeHost(one, TpuShim_HostBuffer{one.id}).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);

  // Nothing above disturbed the real owners.
  EXPECT_TRUE(FreeHost(one, h.handle).ok());
  EXPECT_TRUE(TryToDevice(one, host.data(), d1, 0, 4096, {e1}, nullptr).ok());
  EXPECT_TRUE(Deallocate(one, d1, {e1}).ok());
  EXPECT_TRUE(Deallocate(two, d2).ok());
}

TEST_P(CApiConformanceTest, MadeUpHandlesAreInvalidArgument) {
  const TpuShim_System s = NewSystem();
  const TpuShim_DeviceBuffer d = NewDevice(s, 4096);
  const TpuShim_Event live = ReadyEvent(s, d);
  std::vector<char> host(4096, 1);
  std::mt19937_64 rng(20240611);
  std::vector<uint64_t> ids = {0,
                               1,
                               ~uint64_t{0},
                               uint64_t{1} << 63,
                               s.id + 1,
                               s.id ^ (uint64_t{1} << 40),
                               d.id + (uint64_t{1} << 32),
                               live.id - 1};
  for (int i = 0; i < 300; ++i) ids.push_back(rng());
  for (const uint64_t id : ids) {
    SCOPED_TRACE(id);
    if (id == s.id || id == d.id || id == live.id) continue;
    EXPECT_EQ(DeviceCount(TpuShim_System{id}).code,
              TPUSHIM_CODE_INVALID_ARGUMENT);
    EXPECT_EQ(DestroySystem(TpuShim_System{id}).code,
              TPUSHIM_CODE_INVALID_ARGUMENT);
    EXPECT_EQ(FreeHost(s, TpuShim_HostBuffer{id}).code,
              TPUSHIM_CODE_INVALID_ARGUMENT);
    EXPECT_EQ(TryToDevice(s, host.data(), TpuShim_DeviceBuffer{id}, 0, 4096, {},
                          nullptr)
                  .code,
              TPUSHIM_CODE_INVALID_ARGUMENT);
    EXPECT_EQ(Deallocate(s, TpuShim_DeviceBuffer{id}).code,
              TPUSHIM_CODE_INVALID_ARGUMENT);
    bool ready;
    EXPECT_EQ(IsReady(TpuShim_Event{id}, &ready).code,
              TPUSHIM_CODE_INVALID_ARGUMENT);
    EXPECT_EQ(Await(TpuShim_Event{id}).code, TPUSHIM_CODE_INVALID_ARGUMENT);
    EXPECT_EQ(AwaitFor(TpuShim_Event{id}, 0, &ready).code,
              TPUSHIM_CODE_INVALID_ARGUMENT);
    EXPECT_EQ(AddCallback(TpuShim_Event{id}, NoOpCallback, nullptr).code,
              TPUSHIM_CODE_INVALID_ARGUMENT);
    EXPECT_EQ(DestroyEvent(TpuShim_Event{id}).code,
              TPUSHIM_CODE_INVALID_ARGUMENT);
    EXPECT_EQ(TryToDevice(s, host.data(), d, 0, 4096, {live, TpuShim_Event{id}},
                          nullptr)
                  .code,
              TPUSHIM_CODE_INVALID_ARGUMENT);
  }
  // The live handles are still live.
  int count = 0;
  EXPECT_TRUE(DeviceCount(s, &count).ok());
  EXPECT_EQ(count, TestDeviceCount());
  EXPECT_TRUE(Await(live).ok());
  EXPECT_TRUE(Deallocate(s, d, {live}).ok());
}

TEST_P(CApiConformanceTest, NullPointersAndBadValuesAreInvalidArgument) {
  const TpuShim_System s = NewSystem();
  const TpuShim_DeviceBuffer d = NewDevice(s, 4096);
  std::vector<char> host(8192, 1);
  EXPECT_EQ(TryToDevice(s, nullptr, d, 0, 4096, {}, nullptr).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(TryFromDevice(s, d, 0, nullptr, 4096, {}, nullptr).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  // Out of range.
  EXPECT_EQ(TryToDevice(s, host.data(), d, 1, 4096, {}, nullptr).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(TryToDevice(s, host.data(), d, 0, 8192, {}, nullptr).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  // Unknown semantics.
  EXPECT_EQ(TryToDevice(s, host.data(), d, 0, 4096, {}, nullptr, 7).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  // A wait_for count without a list.
  TpuShim_Transfer_ToDevice_Args a{};
  a.struct_size = TPUSHIM_TRANSFER_TODEVICE_ARGS_STRUCT_SIZE;
  a.system = s;
  a.src = host.data();
  a.dst = d;
  a.size = 4096;
  a.wait_for = nullptr;
  a.num_wait_for = 2;
  EXPECT_EQ(Take(api_->Transfer_ToDevice(&a)).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  // Bad sizes and devices.
  EXPECT_EQ(TryDevice(s, 0, 0, nullptr).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(TryDevice(s, 2, 4096, nullptr).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(TryDevice(s, -1, 4096, nullptr).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(TryHost(s, 0, nullptr).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  TpuShim_HostBuffer_Allocate_Args odd{};
  odd.struct_size = TPUSHIM_HOSTBUFFER_ALLOCATE_ARGS_STRUCT_SIZE;
  odd.system = s;
  odd.size = 4096;
  odd.alignment = 96;
  EXPECT_EQ(Take(api_->HostBuffer_Allocate(&odd)).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  // Device info of a device that does not exist.
  for (const int device : {-1, 2, 1 << 30}) {
    TpuShim_System_GetDeviceInfo_Args info{};
    info.struct_size = TPUSHIM_SYSTEM_GETDEVICEINFO_ARGS_STRUCT_SIZE;
    info.system = s;
    info.device = device;
    EXPECT_EQ(Take(api_->System_GetDeviceInfo(&info)).code,
              TPUSHIM_CODE_INVALID_ARGUMENT)
        << device;
  }
  // Callback NULL.
  const TpuShim_Event e = ReadyEvent(s, d);
  EXPECT_EQ(AddCallback(e, nullptr, nullptr).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
}

// Found by fuzz/capi_sequence_fuzzer: a transfer of 0 bytes was accepted
// and queued, although c_api.h makes size 0 INVALID_ARGUMENT.
TEST_P(CApiConformanceTest, TransfersOfZeroBytesAreInvalidArgument) {
  const TpuShim_System s = NewSystem();
  const TpuShim_DeviceBuffer a = NewDevice(s, 4096);
  const TpuShim_DeviceBuffer b = NewDevice(s, 4096);
  std::vector<char> host(4096, 1);
  for (const int32_t semantics :
       {TPUSHIM_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL,
        TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES}) {
    EXPECT_EQ(TryToDevice(s, host.data(), a, 0, 0, {}, nullptr, semantics).code,
              TPUSHIM_CODE_INVALID_ARGUMENT);
    EXPECT_EQ(
        TryToDevice(s, host.data(), a, 4096, 0, {}, nullptr, semantics).code,
        TPUSHIM_CODE_INVALID_ARGUMENT);
  }
  EXPECT_EQ(TryFromDevice(s, a, 0, host.data(), 0, {}, nullptr).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(TryDeviceToDevice(s, a, b, 0, {}, nullptr).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  // Nothing was queued.
  TpuShim_Stats stats;
  ASSERT_TRUE(Stats(s, &stats).ok());
  EXPECT_EQ(stats.events_pending, 0u);
  EXPECT_EQ(stats.device_to_device_transfers, 0u);
  for (const auto& direction : stats.transfers) {
    for (const uint64_t transfers : direction) EXPECT_EQ(transfers, 0u);
  }
}

// ---- Devices, stats
// ------------------------------------------------------------

TEST_P(CApiConformanceTest, DescribesDevices) {
  const TpuShim_System s = NewSystem(SmallOptions(
      "sim://?devices=2&hbm=32M&dma_engines=3&link_gbps=100&latency_us=2"));
  int count = 0;
  ASSERT_TRUE(DeviceCount(s, &count).ok());
  ASSERT_EQ(count, 2);
  for (int i = 0; i < count; ++i) {
    TpuShim_System_GetDeviceInfo_Args info{};
    info.struct_size = TPUSHIM_SYSTEM_GETDEVICEINFO_ARGS_STRUCT_SIZE;
    info.system = s;
    info.device = i;
    ASSERT_TRUE(Take(api_->System_GetDeviceInfo(&info)).ok());
    EXPECT_EQ(std::string(info.name), "sim:" + std::to_string(i));
    EXPECT_STREQ(info.backend, "sim");
    EXPECT_EQ(info.hbm_bytes, 32 * kMiB);
    EXPECT_EQ(info.dma_engines, 3);
    EXPECT_GE(info.numa_node, -1);
    EXPECT_DOUBLE_EQ(info.link_gbps, 100);
    EXPECT_DOUBLE_EQ(info.latency_us, 2);
  }
}

TEST_P(CApiConformanceTest, StatsCountPathsAndLiveObjects) {
  const TpuShim_System s = NewSystem();
  const Host pinned = NewHost(s, 256 * kKiB);
  std::memset(pinned.data, 0x5A, 256 * kKiB);
  std::vector<char> pageable(512 * kKiB, 0x3C);
  const TpuShim_DeviceBuffer a = NewDevice(s, 1 * kMiB);
  const TpuShim_DeviceBuffer b = NewDevice(s, 1 * kMiB, LastDevice());
  const TpuShim_Event up1 = ToDevice(s, pinned.data, a, 0, 256 * kKiB);
  const TpuShim_Event up2 =
      ToDevice(s, pageable.data(), a, 256 * kKiB, 512 * kKiB);
  TpuShim_Event copy{};
  ASSERT_TRUE(TryDeviceToDevice(s, a, b, 768 * kKiB, {up1, up2}, &copy).ok());
  std::vector<char> back(768 * kKiB);
  const TpuShim_Event down =
      FromDevice(s, b, 0, back.data(), back.size(), {copy});
  ASSERT_TRUE(Await(down).ok());
  EXPECT_EQ(std::memcmp(back.data(), pinned.data, 256 * kKiB), 0);
  EXPECT_EQ(
      std::memcmp(back.data() + 256 * kKiB, pageable.data(), pageable.size()),
      0);

  TpuShim_Stats st;
  ASSERT_TRUE(Stats(s, &st).ok());
  EXPECT_EQ(st.region_enabled, 1);
  EXPECT_EQ(st.region_capacity_bytes, 4 * kMiB);
  EXPECT_EQ(st.region_threshold_bytes, 4 * kMiB);
  EXPECT_GE(st.region_bytes_in_use, 256 * kKiB);
  EXPECT_GE(st.region_peak_bytes_in_use, st.region_bytes_in_use);
  EXPECT_EQ(st.region_live_allocations, 1u);
  EXPECT_GT(st.region_free_bytes, 0u);
  EXPECT_GT(st.region_largest_free_block, 0u);
  EXPECT_EQ(
      st.transfers[TPUSHIM_DIRECTION_HOST_TO_DEVICE][TPUSHIM_PATH_ZERO_COPY],
      1u);
  EXPECT_EQ(st.transfer_bytes[TPUSHIM_DIRECTION_HOST_TO_DEVICE]
                             [TPUSHIM_PATH_ZERO_COPY],
            256 * kKiB);
  EXPECT_EQ(st.transfers[TPUSHIM_DIRECTION_HOST_TO_DEVICE][TPUSHIM_PATH_STAGED],
            1u);
  EXPECT_EQ(st.transfers[TPUSHIM_DIRECTION_DEVICE_TO_HOST][TPUSHIM_PATH_STAGED],
            1u);
  EXPECT_EQ(st.device_to_device_transfers, 1u);
  EXPECT_EQ(st.device_to_device_bytes, 768 * kKiB);
  EXPECT_EQ(st.device_buffers_live, 2u);
  EXPECT_EQ(st.device_bytes_live, 2 * kMiB);
  EXPECT_EQ(st.events_pending, 0u);
  EXPECT_EQ(st.pinned_bytes_now, 0u);
  EXPECT_EQ(st.region_failures, 0u);
  for (const TpuShim_Event e : {up1, up2, copy, down}) {
    EXPECT_TRUE(DestroyEvent(e).ok());
  }
}

// ---- Errors: codes and texts
// --------------------------------------------------

TEST_P(CApiConformanceTest, HostExhaustionIsResourceExhaustedWithLibtpuText) {
  const TpuShim_System s = NewSystem();
  const Host held = NewHost(s, 1 * kMiB);
  Result r = TryHost(s, 4 * kMiB, nullptr);
  EXPECT_EQ(r.code, TPUSHIM_CODE_RESOURCE_EXHAUSTED);
  EXPECT_THAT(r.message, HasSubstr("Attempting to allocate 4.00M. That was not "
                                   "possible. There are 3.00M free."));
  TpuShim_Stats st;
  ASSERT_TRUE(Stats(s, &st).ok());
  EXPECT_EQ(st.region_failures, 1u);
  EXPECT_TRUE(FreeHost(s, held.handle).ok());
}

TEST_P(CApiConformanceTest, HostAllocationAboveThresholdNamesTheThreshold) {
  const TpuShim_System s = NewSystem(
      With(SmallOptions(), "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES",
           "1048576"));
  const Result r = TryHost(s, 2 * kMiB, nullptr);
  EXPECT_EQ(r.code, TPUSHIM_CODE_RESOURCE_EXHAUSTED);
  EXPECT_THAT(r.message,
              HasSubstr("TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES"));
}

TEST_P(CApiConformanceTest, HostAllocationWithRegionOffIsFailedPrecondition) {
  const TpuShim_System s =
      NewSystem(With(SmallOptions(), "TPU_PREMAPPED_BUFFER_SIZE", "0"));
  EXPECT_EQ(TryHost(s, 4096, nullptr).code, TPUSHIM_CODE_FAILED_PRECONDITION);
  TpuShim_Stats st;
  ASSERT_TRUE(Stats(s, &st).ok());
  EXPECT_EQ(st.region_enabled, 0);
  // Transfers still work (pinned path).
  const TpuShim_DeviceBuffer d = NewDevice(s, 4096);
  std::vector<char> host(4096, 9);
  EXPECT_TRUE(Await(ToDevice(s, host.data(), d, 0, 4096)).ok());
}

TEST_P(CApiConformanceTest, DeviceExhaustionIsResourceExhaustedWithXlaText) {
  const TpuShim_System s = NewSystem();
  if (OnDefaultDevices()) {
    const Result r = TryDevice(s, 1, 17 * kMiB, nullptr);
    EXPECT_EQ(r.code, TPUSHIM_CODE_RESOURCE_EXHAUSTED);
    EXPECT_THAT(r.message,
                HasSubstr("Error allocating device buffer: Attempting to "
                          "allocate 17.00M. That was not possible. There are "
                          "16.00M free.; (0x0x1_HBM0)"));
    return;
  }
  TpuShim_System_GetDeviceInfo_Args info{};
  info.struct_size = TPUSHIM_SYSTEM_GETDEVICEINFO_ARGS_STRUCT_SIZE;
  info.system = s;
  info.device = LastDevice();
  ASSERT_EQ(api_->System_GetDeviceInfo(&info), nullptr);
  const Result r = TryDevice(s, LastDevice(), info.hbm_bytes + kMiB, nullptr);
  EXPECT_EQ(r.code, TPUSHIM_CODE_RESOURCE_EXHAUSTED);
  EXPECT_THAT(r.message, HasSubstr("Error allocating device buffer: "
                                   "Attempting to allocate "));
  EXPECT_THAT(r.message, HasSubstr(". That was not possible. There are "));
  EXPECT_THAT(r.message, HasSubstr("free.; (0x0x" +
                                   std::to_string(LastDevice()) + "_HBM0)"));
}

TEST_P(CApiConformanceTest, FailedDependencyFailsDependantsWithSameStatus) {
  const TpuShim_System s = NewSystem(
      With(SmallOptions(), "TPUSHIM_FAULTS", "dma:nth=1,code=DATA_LOSS"));
  const TpuShim_DeviceBuffer a = NewDevice(s, 64 * kKiB);
  const TpuShim_DeviceBuffer b = NewDevice(s, 64 * kKiB);
  std::vector<char> host(64 * kKiB, 1);
  const TpuShim_Event up = ToDevice(s, host.data(), a, 0, 4096);
  const Result failed = Await(up);
  ASSERT_EQ(failed.code, TPUSHIM_CODE_DATA_LOSS) << failed.message;

  TpuShim_Event copy{};
  ASSERT_TRUE(TryDeviceToDevice(s, a, b, 4096, {up}, &copy).ok());
  const TpuShim_Event down = FromDevice(s, b, 0, host.data(), 4096, {copy});
  const Result r = Await(down);
  EXPECT_EQ(r.code, failed.code);
  EXPECT_EQ(r.message, failed.message);
  EXPECT_EQ(Await(copy).message, failed.message);

  // AwaitWithTimeout reports the status of a ready event.
  bool ready = false;
  const Result timed = AwaitFor(down, 1'000'000'000, &ready);
  EXPECT_TRUE(ready);
  EXPECT_EQ(timed.code, failed.code);

  // Deallocate after a failed dependency: the event carries the failure,
  // the memory is freed all the same.
  TpuShim_Event freed{};
  ASSERT_TRUE(Deallocate(s, a, {down}, &freed).ok());
  EXPECT_EQ(Await(freed).code, failed.code);
  TpuShim_Stats st;
  ASSERT_TRUE(Stats(s, &st).ok());
  EXPECT_EQ(st.device_buffers_live, 1u);
}

// ---- Events and callbacks
// -----------------------------------------------------

TEST_P(CApiConformanceTest, AwaitWithTimeoutReportsNotReadyThenReady) {
  const TpuShim_System s = NewSystem(SmallOptions(kSlowDevice));
  const TpuShim_DeviceBuffer d = NewDevice(s, 1 * kMiB);
  std::vector<char> host(256 * kKiB, 4);
  const TpuShim_Event e = ToDevice(s, host.data(), d, 0, host.size());
  bool ready = true;
  EXPECT_TRUE(AwaitFor(e, 1'000'000, &ready).ok());  // 1 ms
  EXPECT_FALSE(ready);
  EXPECT_TRUE(AwaitFor(e, 0, &ready).ok());
  EXPECT_FALSE(ready);
  EXPECT_TRUE(AwaitFor(e, -5, &ready).ok());
  EXPECT_FALSE(ready);
  EXPECT_TRUE(IsReady(e, &ready).ok());
  EXPECT_FALSE(ready);
  EXPECT_TRUE(AwaitFor(e, INT64_MAX, &ready).ok());
  EXPECT_TRUE(ready);
  EXPECT_TRUE(IsReady(e, &ready).ok());
  EXPECT_TRUE(ready);
}

TEST_P(CApiConformanceTest, CallbackOnReadyEventRunsAtOnceOnTheCaller) {
  const TpuShim_System s = NewSystem();
  const TpuShim_DeviceBuffer d = NewDevice(s, 4096);
  const TpuShim_Event e = ReadyEvent(s, d);
  Counter counter;
  ASSERT_TRUE(AddCallback(e, CountCallback, &counter).ok());
  ASSERT_EQ(counter.count(), 1u);  // before AddCallback returned
  EXPECT_EQ(counter.codes()[0], TPUSHIM_CODE_OK);
  EXPECT_EQ(counter.threads()[0], std::this_thread::get_id());
}

TEST_P(CApiConformanceTest, CallbackOnPendingEventRunsOffTheCaller) {
  const TpuShim_System s = NewSystem(SmallOptions(kSlowDevice));
  const TpuShim_DeviceBuffer d = NewDevice(s, 1 * kMiB);
  std::vector<char> host(256 * kKiB, 4);
  const TpuShim_Event e = ToDevice(s, host.data(), d, 0, host.size());
  Counter counter;
  ASSERT_TRUE(AddCallback(e, CountCallback, &counter).ok());
  ASSERT_TRUE(AddCallback(e, CountCallback, &counter).ok());
  // The handle may go; the callbacks stay.
  EXPECT_TRUE(DestroyEvent(e).ok());
  ASSERT_TRUE(counter.WaitFor(2));
  EXPECT_EQ(counter.codes(), (std::vector<int>{0, 0}));
  EXPECT_NE(counter.threads()[0], std::this_thread::get_id());
}

TEST_P(CApiConformanceTest, CallbackGetsTheErrorStatus) {
  const TpuShim_System s = NewSystem(
      With(SmallOptions(), "TPUSHIM_FAULTS", "dma:nth=1,code=UNAVAILABLE"));
  const TpuShim_DeviceBuffer d = NewDevice(s, 4096);
  std::vector<char> host(4096, 4);
  const TpuShim_Event up = ToDevice(s, host.data(), d, 0, 4096);
  std::vector<char> back(4096);
  const TpuShim_Event down = FromDevice(s, d, 0, back.data(), 4096, {up});
  Counter counter;
  ASSERT_TRUE(AddCallback(down, CountCallback, &counter).ok());
  ASSERT_TRUE(AddCallback(up, CountCallback, &counter).ok());
  ASSERT_TRUE(counter.WaitFor(2));
  EXPECT_EQ(counter.codes(), (std::vector<int>{TPUSHIM_CODE_UNAVAILABLE,
                                               TPUSHIM_CODE_UNAVAILABLE}));
}

struct ReentrantState {
  const TpuShim_Api* api;
  TpuShim_System system;
  TpuShim_Event event;
  std::atomic<int> device_count_code{-1};
  std::atomic<int> destroy_event_code{-1};
  std::atomic<int> destroy_system_code{-1};
  Counter done;
};

void ReentrantCallback(TpuShim_Error* status, void* user_arg) {
  auto* st = static_cast<ReentrantState*>(user_arg);
  st->api->Error_Destroy(status);
  TpuShim_System_GetDeviceCount_Args count{};
  count.struct_size = TPUSHIM_SYSTEM_GETDEVICECOUNT_ARGS_STRUCT_SIZE;
  count.system = st->system;
  TpuShim_Error* e = st->api->System_GetDeviceCount(&count);
  st->device_count_code = st->api->Error_Code(e);
  st->api->Error_Destroy(e);
  TpuShim_Event_Destroy_Args destroy_event{};
  destroy_event.struct_size = TPUSHIM_EVENT_DESTROY_ARGS_STRUCT_SIZE;
  destroy_event.event = st->event;
  e = st->api->Event_Destroy(&destroy_event);
  st->destroy_event_code = st->api->Error_Code(e);
  st->api->Error_Destroy(e);
  TpuShim_System_Destroy_Args destroy_system{};
  destroy_system.struct_size = TPUSHIM_SYSTEM_DESTROY_ARGS_STRUCT_SIZE;
  destroy_system.system = st->system;
  e = st->api->System_Destroy(&destroy_system);
  st->destroy_system_code = st->api->Error_Code(e);
  st->api->Error_Destroy(e);
  st->done.Add(0);
}

// A callback may call back in and destroy its own event; destroying its
// own system from there is FAILED_PRECONDITION (and changes nothing).
TEST_P(CApiConformanceTest, CallbackMayCallBackInButNotDestroyItsSystem) {
  const TpuShim_System s = NewSystem(SmallOptions(kSlowDevice));
  const TpuShim_DeviceBuffer d = NewDevice(s, 1 * kMiB);
  std::vector<char> host(256 * kKiB, 4);
  ReentrantState st;
  st.api = api_;
  st.system = s;
  st.event = ToDevice(s, host.data(), d, 0, host.size());
  ASSERT_TRUE(AddCallback(st.event, ReentrantCallback, &st).ok());
  ASSERT_TRUE(st.done.WaitFor(1));
  EXPECT_EQ(st.device_count_code, TPUSHIM_CODE_OK);
  EXPECT_EQ(st.destroy_event_code, TPUSHIM_CODE_OK);
  EXPECT_EQ(st.destroy_system_code, TPUSHIM_CODE_FAILED_PRECONDITION);
  EXPECT_TRUE(DeviceCount(s).ok());
  EXPECT_TRUE(DestroySystem(s).ok());
}

// One of two systems' callbacks: once both run, destroys the other system.
struct MutualDestroyState {
  const TpuShim_Api* api;
  TpuShim_System other;
  std::atomic<int>* running;  // callbacks started, of both systems
  std::atomic<int> code{-1};
  std::string message;
  Counter done;
};

void DestroyTheOtherSystemCallback(TpuShim_Error* status, void* user_arg) {
  auto* st = static_cast<MutualDestroyState*>(user_arg);
  st->api->Error_Destroy(status);
  st->running->fetch_add(1);
  // Both callbacks at once, each on its own system's callback thread (a
  // bounded wait: the outcome, not a time, is checked).
  for (int i = 0; i < 10'000 && st->running->load() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  TpuShim_System_Destroy_Args a{};
  a.struct_size = TPUSHIM_SYSTEM_DESTROY_ARGS_STRUCT_SIZE;
  a.system = st->other;
  TpuShim_Error* e = st->api->System_Destroy(&a);
  st->message = st->api->Error_Message(e);
  st->code = st->api->Error_Code(e);
  st->api->Error_Destroy(e);
  st->done.Add(0);
}

// Two systems whose callbacks destroy each other would each wait for the
// other's callback forever: no callback may destroy any system
// (FAILED_PRECONDITION, nothing destroyed). Run in a fork() child that the
// test kills after 20 s, so that a deadlock fails this test, not the run.
TEST_P(CApiConformanceTest, CallbacksOfTwoSystemsCannotDestroyEachOther) {
  const testutil::ForkResult r = testutil::RunForkedChild([&] {
    // One chip each of a host of two.
    const TpuShim_System a =
        NewSystem(With(SmallOptions(kSlowPair), "TPU_VISIBLE_CHIPS", "0"));
    const TpuShim_System b =
        NewSystem(With(SmallOptions(kSlowPair), "TPU_VISIBLE_CHIPS", "1"));
    const TpuShim_DeviceBuffer da = NewDevice(a, 1 * kMiB);
    const TpuShim_DeviceBuffer db = NewDevice(b, 1 * kMiB);
    std::vector<char> host(256 * kKiB, 4);
    std::atomic<int> running{0};
    MutualDestroyState on_a;
    on_a.api = api_;
    on_a.other = b;
    on_a.running = &running;
    MutualDestroyState on_b;
    on_b.api = api_;
    on_b.other = a;
    on_b.running = &running;
    const TpuShim_Event ea = ToDevice(a, host.data(), da, 0, host.size());
    const TpuShim_Event eb = ToDevice(b, host.data(), db, 0, host.size());
    bool ready = true;
    if (!IsReady(ea, &ready).ok() || ready) return 10;  // must be pending
    if (!IsReady(eb, &ready).ok() || ready) return 10;
    if (!AddCallback(ea, DestroyTheOtherSystemCallback, &on_a).ok() ||
        !AddCallback(eb, DestroyTheOtherSystemCallback, &on_b).ok()) {
      return 11;
    }
    if (!on_a.done.WaitFor(1) || !on_b.done.WaitFor(1)) return 12;
    for (const MutualDestroyState* st : {&on_a, &on_b}) {
      if (st->code != TPUSHIM_CODE_FAILED_PRECONDITION) return 13;
      if (st->message.find("callback thread of another system") ==
              std::string::npos ||
          st->message.find("Nothing was destroyed") == std::string::npos) {
        return 14;
      }
    }
    // Both systems live on, and go from this (not a callback) thread.
    if (!DeviceCount(a).ok() || !DeviceCount(b).ok()) return 15;
    if (!DestroySystem(a).ok() || !DestroySystem(b).ok()) return 16;
    return 0;
  });
  EXPECT_TRUE(r.Exited(0)) << r.Describe();
}

// ---- System_Destroy
// -----------------------------------------------------------

TEST_P(CApiConformanceTest, DestroyWithLiveBuffersAndPendingWork) {
  const TpuShim_System s = NewSystem(SmallOptions(kSlowDevice));
  const Host pinned = NewHost(s, 64 * kKiB);
  const TpuShim_DeviceBuffer d = NewDevice(s, 4 * kMiB);
  const TpuShim_DeviceBuffer other = NewDevice(s, 4096);
  std::vector<char> host(2 * kMiB, 6);
  constexpr int kTransfers = 8;
  std::vector<TpuShim_Event> events;
  Counter counter;
  for (int i = 0; i < kTransfers; ++i) {
    const TpuShim_Event e = ToDevice(s, host.data() + i * 256 * kKiB, d,
                                     i * 256 * kKiB, 256 * kKiB);
    events.push_back(e);
    ASSERT_TRUE(AddCallback(e, CountCallback, &counter).ok());
  }
  TpuShim_Event freed{};
  ASSERT_TRUE(Deallocate(s, other, {events.back()}, &freed).ok());
  events.push_back(freed);
  ASSERT_TRUE(AddCallback(freed, CountCallback, &counter).ok());

  ASSERT_TRUE(DestroySystem(s).ok());

  // Every callback has run, once; every event is ready, OK or CANCELLED,
  // and its handle still works.
  EXPECT_EQ(counter.count(), events.size());
  int cancelled = 0;
  for (const TpuShim_Event e : events) {
    bool ready = false;
    EXPECT_TRUE(IsReady(e, &ready).ok());
    EXPECT_TRUE(ready);
    const Result r = Await(e);
    EXPECT_TRUE(r.ok() || r.code == TPUSHIM_CODE_CANCELLED) << r.message;
    if (r.code == TPUSHIM_CODE_CANCELLED) ++cancelled;
    Counter late;
    EXPECT_TRUE(AddCallback(e, CountCallback, &late).ok());
    EXPECT_EQ(late.count(), 1u);
    EXPECT_TRUE(DestroyEvent(e).ok());
  }
  EXPECT_GT(cancelled, 0);
  for (const int code : counter.codes()) {
    EXPECT_TRUE(code == TPUSHIM_CODE_OK || code == TPUSHIM_CODE_CANCELLED)
        << code;
  }
  // Its buffers went with it.
  EXPECT_EQ(FreeHost(s, pinned.handle).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(Deallocate(s, d).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  // Another system's handles are not affected.
  const TpuShim_System next = NewSystem();
  const Host h = NewHost(next, 4096);
  EXPECT_TRUE(FreeHost(next, h.handle).ok());
}

// A fork() child inherits the handles but not the system: calls on them
// are FAILED_PRECONDITION, a pending event cannot be awaited there, and
// System_Destroy returns at once without touching the parent's system,
// which goes on working.
TEST_P(CApiConformanceTest, ForkChildRefusesInheritedHandlesAndDestroyReturns) {
  const TpuShim_System s = NewSystem(SmallOptions(kSlowDevice));
  const TpuShim_DeviceBuffer d = NewDevice(s, 2 * kMiB);
  std::vector<char> host(2 * kMiB, 4);
  const TpuShim_Event pending = ToDevice(s, host.data(), d, 0, host.size());
  const pid_t child = fork();
  if (child == 0) {
    TpuShim_Event e{};
    const Result put = TryToDevice(s, host.data(), d, 0, 4096, {}, &e);
    if (put.code != TPUSHIM_CODE_FAILED_PRECONDITION ||
        put.message.find("fork() child") == std::string::npos) {
      _exit(1);
    }
    bool ready = true;
    if (!IsReady(pending, &ready).ok()) _exit(2);
    if (!ready && Await(pending).code != TPUSHIM_CODE_FAILED_PRECONDITION) {
      _exit(3);
    }
    if (!DestroySystem(s).ok()) _exit(4);
    if (DeviceCount(s).code != TPUSHIM_CODE_INVALID_ARGUMENT) _exit(5);
    _exit(0);
  }
  ASSERT_GT(child, 0);
  const testutil::ForkResult r = testutil::WaitForChild(child);
  EXPECT_TRUE(r.Exited(0)) << r.Describe();
  EXPECT_TRUE(Await(pending).ok());
  int count = 0;
  EXPECT_TRUE(DeviceCount(s, &count).ok());
  EXPECT_EQ(count, 1);
}

TEST_P(CApiConformanceTest, DestroyRacingOtherCallsIsSafe) {
  const TpuShim_System s = NewSystem();
  std::atomic<bool> bad_code{false};
  std::atomic<int> stale{0};
  auto worker = [&] {
    std::vector<char> host(4096, 2);
    for (;;) {
      TpuShim_DeviceBuffer d{};
      Result r = TryDevice(s, 0, 4096, &d);
      if (!r.ok()) {
        if (r.code != TPUSHIM_CODE_INVALID_ARGUMENT) bad_code = true;
        break;
      }
      TpuShim_Event e{};
      r = TryToDevice(s, host.data(), d, 0, 4096, {}, &e,
                      TPUSHIM_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL);
      if (r.ok()) {
        const Result a = Await(e);
        if (!a.ok() && a.code != TPUSHIM_CODE_CANCELLED) bad_code = true;
        DestroyEvent(e);
      } else if (r.code != TPUSHIM_CODE_INVALID_ARGUMENT) {
        bad_code = true;
      }
      Host h;
      r = TryHost(s, 4096, &h);
      if (r.ok()) {
        r = FreeHost(s, h.handle);
        if (!r.ok() && r.code != TPUSHIM_CODE_INVALID_ARGUMENT) bad_code = true;
      }
      r = Deallocate(s, d);
      if (!r.ok()) {
        if (r.code != TPUSHIM_CODE_INVALID_ARGUMENT) bad_code = true;
        ++stale;
      }
    }
  };
  std::thread t1(worker);
  std::thread t2(worker);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_TRUE(DestroySystem(s).ok());
  t1.join();
  t2.join();
  EXPECT_FALSE(bad_code);
}

// ---- Options
// ------------------------------------------------------------------

TEST_P(CApiConformanceTest, OptionErrorsNameTheVariable) {
  struct Case {
    const char* name;
    const char* value;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"TPU_PREMAPPED_BUFFER_SIZE",
       "5000",
       {"TPU_PREMAPPED_BUFFER_SIZE", "5000", "4096 and 8192"}},
      {"TPU_PREMAPPED_BUFFER_SIZE", "12k", {"TPU_PREMAPPED_BUFFER_SIZE"}},
      {"TPUSHIM_DEVICE", "sim://?devices=0", {"TPUSHIM_DEVICE", "devices"}},
      {"TPUSHIM_MLOCK", "sometimes", {"TPUSHIM_MLOCK", "sometimes"}},
      {"TPUSHIM_PREFAULT_THREADS", "-1", {"TPUSHIM_PREFAULT_THREADS"}},
      {"TPUSHIM_FAULTS", "dma:nth=0", {"TPUSHIM_FAULTS"}},
      {"TPU_LOG_DIR", "", {"TPU_LOG_DIR"}},
      {"TPU_NO_SUCH_SETTING", "1", {"TPU_NO_SUCH_SETTING"}},
      {"tpu_premapped_buffer_size", "4096", {"tpu_premapped_buffer_size"}},
      {"LIBTPU_INIT_ARGS",
       "--tpu_premapped_buffer_size=4096",
       {"LIBTPU_INIT_ARGS"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.name) + "=" + c.value);
    const Result r = TryCreate(With(SmallOptions(), c.name, c.value), nullptr);
    EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
    for (const std::string& e : c.expect) {
      EXPECT_THAT(r.message, HasSubstr(e));
    }
  }
}

TEST_P(CApiConformanceTest, OptionArraysAreChecked) {
  TpuShim_System_Create_Args a{};
  a.struct_size = TPUSHIM_SYSTEM_CREATE_ARGS_STRUCT_SIZE;
  a.options = nullptr;
  a.num_options = 1;
  EXPECT_EQ(Take(api_->System_Create(&a)).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  TpuShim_Option null_name[] = {{nullptr, "1"}};
  a.options = null_name;
  EXPECT_EQ(Take(api_->System_Create(&a)).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  TpuShim_Option null_value[] = {{"TPU_MIN_LOG_LEVEL", nullptr}};
  a.options = null_value;
  const Result r = Take(api_->System_Create(&a));
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TPU_MIN_LOG_LEVEL"));
}

// 1.1: a progress callback sees the region populated, in order, and then
// the end of start-up.
TEST_P(CApiConformanceTest, StartupProgressIsReported) {
  if (api_->api_minor < 1) GTEST_SKIP() << "a 1.0 library has no progress";
  struct Seen {
    std::vector<TpuShim_StartupProgress> calls;
  } seen;
  const Options options = SmallOptions(TestDevice(), 16 * kMiB);
  std::vector<TpuShim_Option> c;
  for (const auto& [name, value] : options) {
    c.push_back({name.c_str(), value.c_str()});
  }
  TpuShim_System_Create_Args a{};
  a.struct_size = sizeof(a);
  a.options = c.data();
  a.num_options = c.size();
  a.progress = [](const TpuShim_StartupProgress* p, void* user_data) {
    static_cast<Seen*>(user_data)->calls.push_back(*p);
  };
  a.progress_user_data = &seen;
  ASSERT_TRUE(Take(api_->System_Create(&a)).ok());
  const TpuShim_System first = a.system;
  ASSERT_GE(seen.calls.size(), 2u);
  EXPECT_EQ(seen.calls.front().phase, 0);
  EXPECT_EQ(seen.calls.front().done_bytes, 0u);
  EXPECT_EQ(seen.calls.back().phase, 1);
  EXPECT_EQ(seen.calls.back().done_bytes, 16 * kMiB);
  for (size_t i = 0; i < seen.calls.size(); ++i) {
    const TpuShim_StartupProgress& p = seen.calls[i];
    EXPECT_EQ(p.struct_size, sizeof(TpuShim_StartupProgress));
    EXPECT_EQ(p.total_bytes, 16 * kMiB);
    EXPECT_LE(p.done_bytes, p.total_bytes);
    if (i > 0) {
      EXPECT_GE(p.done_bytes, seen.calls[i - 1].done_bytes);
      EXPECT_GE(p.elapsed_seconds, seen.calls[i - 1].elapsed_seconds);
    }
  }
  // Only the last call is phase 1, and the one before it is all done.
  for (size_t i = 0; i + 1 < seen.calls.size(); ++i) {
    EXPECT_EQ(seen.calls[i].phase, 0);
  }
  EXPECT_EQ(seen.calls[seen.calls.size() - 2].done_bytes, 16 * kMiB);

  // A 1.0-sized struct has no callback: the fields are not read. (One
  // system at a time: a vfio:// device opens once.)
  ASSERT_TRUE(DestroySystem(first).ok());
  seen.calls.clear();
  a.struct_size = TPUSHIM_SYSTEM_CREATE_ARGS_STRUCT_SIZE;
  ASSERT_TRUE(Take(api_->System_Create(&a)).ok());
  systems_.push_back(a.system);
  EXPECT_TRUE(seen.calls.empty());
}

TEST_P(CApiConformanceTest, LaterOptionWins) {
  const TpuShim_System s =
      NewSystem(With(SmallOptions(), "TPU_PREMAPPED_BUFFER_SIZE", "2097152"));
  TpuShim_Stats st;
  ASSERT_TRUE(Stats(s, &st).ok());
  EXPECT_EQ(st.region_capacity_bytes, 2 * kMiB);
}

// ---- tpushim's implementation
// ---------------------------------------------------

// The real OS with an environment of the test's choosing (empty unless set),
// so the suite does not depend on the variables of whoever runs it.
class FakeEnvOs : public OsWrapper {
 public:
  explicit FakeEnvOs(Os* target) : OsWrapper(target) {}
  std::optional<std::string> GetEnv(const std::string& name) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [n, v] : env_) {
      if (n == name) return v;
    }
    // The test process's own chip run directory, as FixedEnvironmentOs.
    if (name == "TPUSHIM_RUN_DIR") return OsWrapper::GetEnv(name);
    return std::nullopt;
  }
  void Set(Options env) {
    std::lock_guard<std::mutex> lock(mu_);
    env_ = std::move(env);
  }

 private:
  std::mutex mu_;
  Options env_;
};

FakeEnvOs& TestOs() {
  static FakeEnvOs* const os = new FakeEnvOs(Os::Default());
  return *os;
}

const TpuShim_Api* TpushimApi() {
  TestOs().Set({});
  capi_internal::SetOsForTesting(&TestOs());
  return TpuShim_GetApi();
}

INSTANTIATE_TEST_SUITE_P(Tpushim, CApiConformanceTest,
                         ::testing::Values(Implementation{"tpushim",
                                                          &TpushimApi}),
                         [](const ::testing::TestParamInfo<Implementation>& p) {
                           return std::string(p.param.name);
                         });

// Options given through the API win over LIBTPU_INIT_ARGS and the
// environment; settings they leave out come from there.
class TpushimCApiTest : public CApiConformanceTest {};

TEST_P(TpushimCApiTest, OptionsWinOverFlagsAndEnvironment) {
  TestOs().Set({{"TPU_PREMAPPED_BUFFER_SIZE", "8388608"},
                {"LIBTPU_INIT_ARGS", "--tpu_premapped_buffer_size=6291456"},
                {"TPUSHIM_DEVICE", "sim://?devices=3&hbm=16M"},
                {"TPU_LOG_DIR", "disabled"}});
  const Options api = {{"TPU_PREMAPPED_BUFFER_SIZE", "2097152"},
                       {"TPUSHIM_PREFAULT_THREADS", "1"}};
  const TpuShim_System s = NewSystem(api);
  TpuShim_Stats st;
  ASSERT_TRUE(Stats(s, &st).ok());
  EXPECT_EQ(st.region_capacity_bytes, 2 * kMiB);
  int count = 0;
  EXPECT_TRUE(DeviceCount(s, &count).ok());
  EXPECT_EQ(count, 3);  // from the environment

  // Without the option, the flag beats the environment (on the chips
  // `s` does not own).
  ASSERT_TRUE(DestroySystem(s).ok());
  const TpuShim_System t = NewSystem({{"TPUSHIM_PREFAULT_THREADS", "1"}});
  ASSERT_TRUE(Stats(t, &st).ok());
  EXPECT_EQ(st.region_capacity_bytes, 6 * kMiB);

  // A malformed environment value is an error even when the API overrides
  // it: every value given, from any source, is validated.
  TestOs().Set(
      {{"TPU_PREMAPPED_BUFFER_SIZE", "lots"}, {"TPU_LOG_DIR", "disabled"}});
  const Result r = TryCreate(api, nullptr);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TPU_PREMAPPED_BUFFER_SIZE"));
  TestOs().Set({});
}

TEST_P(TpushimCApiTest, ThresholdAboveSizeIsCheckedAgainstTheSizeInForce) {
  // Through the API the threshold is only parsed at first; it is checked
  // against the size once that is resolved (and clamped to it).
  const TpuShim_System s = NewSystem(
      With(SmallOptions(), "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES",
           "8388608"));
  TpuShim_Stats st;
  ASSERT_TRUE(Stats(s, &st).ok());
  EXPECT_EQ(st.region_threshold_bytes, 4 * kMiB);
  const Result r =
      TryCreate(With(SmallOptions(),
                     "TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES", "0"),
                nullptr);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("threshold"));
}

TEST_P(TpushimCApiTest, ErrorMessagesOfBadHandlesSayWhy) {
  const TpuShim_System s = NewSystem();
  Result r = DeviceCount(TpuShim_System{0});
  EXPECT_THAT(r.message, StartsWith("Invalid TpuShim_System handle"));
  EXPECT_THAT(r.message, HasSubstr("no handle"));
  const TpuShim_DeviceBuffer d = NewDevice(s, 4096);
  r = DeviceCount(TpuShim_System{d.id});
  EXPECT_THAT(r.message, HasSubstr("it is a TpuShim_DeviceBuffer handle"));
  EXPECT_TRUE(Deallocate(s, d).ok());
  r = Deallocate(s, d);
  EXPECT_THAT(r.message, HasSubstr("stale"));
}

// ---- Premapping behind the caller (TPUSHIM_PREMAP=background)

// TestOs() with pre-faulting (each MADV_POPULATE_WRITE) held at a gate,
// installed as the library's Os for as long as it lives. Destroy every
// system made through it first.
class ScopedGatedPopulate : public OsWrapper {
 public:
  ScopedGatedPopulate() : OsWrapper(&TestOs()) {
    capi_internal::SetOsForTesting(this);
  }
  ~ScopedGatedPopulate() override {
    gate_closed = false;
    capi_internal::SetOsForTesting(&TestOs());
  }

  std::atomic<bool> gate_closed{true};

  absl::Status Madvise(void* addr, size_t length, int advice) override {
    constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE, Linux 5.14
    if (advice == kPopulateWrite) {
      while (gate_closed.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    return OsWrapper::Madvise(addr, length, advice);
  }
};

Options BackgroundOptions() {
  return With(With(SmallOptions(TestDevice(), 16 * kMiB), "TPUSHIM_PREMAP",
                   "background"),
              "TPUSHIM_HUGEPAGES", "off");
}

// 1.1's promise: progress calls during System_Create only, so that
// progress_user_data may point into the caller's frame. With premapping
// behind the caller, the last call (phase 1, the bytes premapped so far)
// comes before System_Create returns, and none later, also when the
// system is destroyed mid-way; 1.4's progress_after_create asks for the
// calls to go on (and a 1.1-sized struct cannot ask).
TEST_P(TpushimCApiTest, ProgressStopsAtSystemCreateUnlessAskedToGoOn) {
  struct Case {
    const char* name;
    size_t struct_size;
    int32_t progress_after_create;
    bool goes_on;
  };
  const Case cases[] = {
      {"1.4, not asked", sizeof(TpuShim_System_Create_Args), 0, false},
      {"1.1-sized struct, field beyond it set",
       TPUSHIM_STRUCT_SIZE(TpuShim_System_Create_Args, progress_user_data), 1,
       false},
      {"1.4, asked", sizeof(TpuShim_System_Create_Args), 1, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ScopedGatedPopulate gated;
    struct Seen {
      std::atomic<bool> returned{false};
      std::atomic<int> after_return{0};
      std::mutex mu;
      std::vector<TpuShim_StartupProgress> calls;
    } seen;
    const Options options = BackgroundOptions();
    std::vector<TpuShim_Option> o;
    for (const auto& [name, value] : options) {
      o.push_back({name.c_str(), value.c_str()});
    }
    TpuShim_System_Create_Args a{};
    a.options = o.data();
    a.num_options = o.size();
    a.progress = [](const TpuShim_StartupProgress* p, void* user_data) {
      Seen& s = *static_cast<Seen*>(user_data);
      if (s.returned.load()) ++s.after_return;
      std::lock_guard<std::mutex> lock(s.mu);
      s.calls.push_back(*p);
    };
    a.progress_user_data = &seen;
    a.progress_after_create = c.progress_after_create;
    a.struct_size = c.struct_size;
    ASSERT_TRUE(Take(api_->System_Create(&a)).ok());
    seen.returned = true;
    {
      std::lock_guard<std::mutex> lock(seen.mu);
      ASSERT_FALSE(seen.calls.empty());
      if (!c.goes_on) {
        EXPECT_EQ(seen.calls.back().phase, 1);
        EXPECT_EQ(seen.calls.back().done_bytes, 0u);  // held at the gate
        EXPECT_EQ(seen.calls.back().total_bytes, 16 * kMiB);
      } else {
        EXPECT_EQ(seen.calls.back().phase, 0);
      }
    }
    gated.gate_closed = false;
    ASSERT_TRUE(DestroySystem(a.system).ok());
    if (c.goes_on) {
      EXPECT_GT(seen.after_return.load(), 0);
      std::lock_guard<std::mutex> lock(seen.mu);
      EXPECT_EQ(seen.calls.back().phase, 1);
    } else {
      EXPECT_EQ(seen.after_return.load(), 0);
    }
  }
}

// System_Destroy stops premapping before it waits for the calls running
// on the system: a HostBuffer_Allocate waiting for premapping returns
// CANCELLED at once, while pre-faulting is still held at the gate (the
// destroy then waits only for the chunk in progress, not for the region).
TEST_P(TpushimCApiTest, DestroyEndsAHostAllocationWaitingForPremapping) {
  ScopedGatedPopulate gated;
  TpuShim_System s{};
  ASSERT_TRUE(TryCreate(BackgroundOptions(), &s).ok());
  std::promise<Result> allocated;
  std::future<Result> allocate_result = allocated.get_future();
  std::thread allocator(
      [&] { allocated.set_value(TryHost(s, kMiB, nullptr)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let it wait
  std::promise<Result> destroyed;
  std::thread destroyer([&] { destroyed.set_value(DestroySystem(s)); });
  // Bounded only so that an allocation the destroy does not release fails
  // the test instead of hanging it.
  const bool returned = allocate_result.wait_for(std::chrono::seconds(20)) ==
                        std::future_status::ready;
  EXPECT_TRUE(returned) << "the allocation went on waiting for premapping";
  EXPECT_TRUE(gated.gate_closed.load());
  gated.gate_closed = false;
  destroyer.join();
  allocator.join();
  EXPECT_TRUE(destroyed.get_future().get().ok());
  const Result r = allocate_result.get();
  EXPECT_EQ(r.code, TPUSHIM_CODE_CANCELLED) << r.message;
  EXPECT_THAT(r.message, HasSubstr("premapping the region was stopped while "
                                   "the allocation waited for it"));
}

// 1.4's TPUSHIM_HOSTBUFFER_NO_WAIT: UNAVAILABLE at once where
// HostBuffer_Allocate would wait; unknown flags are INVALID_ARGUMENT.
TEST_P(TpushimCApiTest, HostAllocationNoWaitFlagNeverWaits) {
  ScopedGatedPopulate gated;
  TpuShim_System s{};
  ASSERT_TRUE(TryCreate(BackgroundOptions(), &s).ok());
  TpuShim_HostBuffer_Allocate_Args a{};
  a.struct_size = sizeof a;
  a.system = s;
  a.size = kMiB;
  a.flags = TPUSHIM_HOSTBUFFER_NO_WAIT;
  Result r = Take(api_->HostBuffer_Allocate(&a));
  EXPECT_EQ(r.code, TPUSHIM_CODE_UNAVAILABLE) << r.message;
  EXPECT_THAT(r.message, HasSubstr("not premapped yet"));
  a.flags = 0x2;
  r = Take(api_->HostBuffer_Allocate(&a));
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT) << r.message;
  EXPECT_THAT(r.message, HasSubstr("args->flags is 0x2"));
  gated.gate_closed = false;
  a.flags = TPUSHIM_HOSTBUFFER_NO_WAIT;
  a.size = 16 * kMiB;  // the whole region: served once all premapped
  for (;;) {
    r = Take(api_->HostBuffer_Allocate(&a));
    if (r.code != TPUSHIM_CODE_UNAVAILABLE) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_TRUE(FreeHost(s, a.buffer).ok());
  EXPECT_TRUE(DestroySystem(s).ok());
}

// A call refused because the event handle table is full queued nothing:
// no byte moves, no statistic moves, a buffer it was to deallocate stays
// usable. Once a handle is freed, calls work again. (The table holds 2^24
// handles; the test limits it through the adapter's test seam.)
TEST_P(TpushimCApiTest, AFullEventTableRefusesACallBeforeItQueuesAnything) {
  const TpuShim_System s = NewSystem();
  constexpr uint64_t kSize = 64 * kKiB;
  const TpuShim_DeviceBuffer a = NewDevice(s, kSize);
  const TpuShim_DeviceBuffer b = NewDevice(s, kSize);
  const std::vector<char> ones(kSize, 1), twos(kSize, 2), threes(kSize, 3);
  for (const auto& [buffer, bytes] : {std::pair{a, &ones}, {b, &twos}}) {
    const TpuShim_Event e = ToDevice(s, bytes->data(), buffer, 0, kSize);
    ASSERT_TRUE(Await(e).ok());
    ASSERT_TRUE(DestroyEvent(e).ok());
  }
  const TpuShim_Event held = ToDevice(s, ones.data(), a, 0, kSize);
  ASSERT_TRUE(Await(held).ok());
  TpuShim_Stats before;
  ASSERT_TRUE(Stats(s, &before).ok());

  capi_internal::LimitEventHandlesForTesting(0);  // full from now on
  struct Restore {
    ~Restore() { capi_internal::RestoreEventHandlesForTesting(); }
  } restore;
  auto expect_full = [](const Result& r) {
    EXPECT_EQ(r.code, TPUSHIM_CODE_RESOURCE_EXHAUSTED) << r.message;
    EXPECT_THAT(r.message, HasSubstr("TpuShim_Event handles are live"));
  };
  TpuShim_Event e{};
  expect_full(TryToDevice(s, threes.data(), b, 0, kSize, {}, &e));
  std::vector<char> out(kSize, 9);
  expect_full(TryFromDevice(s, a, 0, out.data(), kSize, {}, &e));
  expect_full(TryDeviceToDevice(s, a, b, kSize, {}, &e));
  {
    TpuShim_Transfer_ArrayToDevice_Args args{};
    args.struct_size = sizeof args;
    args.system = s;
    args.src = threes.data();
    args.dst = b;
    args.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
    expect_full(Take(api_->Transfer_ArrayToDevice(&args)));
  }
  {
    TpuShim_Transfer_ArrayFromDevice_Args args{};
    args.struct_size = sizeof args;
    args.system = s;
    args.src = a;
    args.dst = out.data();
    args.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
    expect_full(Take(api_->Transfer_ArrayFromDevice(&args)));
  }
  expect_full(Deallocate(s, b, {}, &e));

  // Nothing ran, nor will.
  EXPECT_EQ(out, std::vector<char>(kSize, 9));
  TpuShim_Stats after;
  ASSERT_TRUE(Stats(s, &after).ok());
  EXPECT_EQ(
      std::memcmp(after.transfers, before.transfers, sizeof before.transfers),
      0);
  EXPECT_EQ(after.device_to_device_transfers,
            before.device_to_device_transfers);
  EXPECT_EQ(after.device_buffers_live, before.device_buffers_live);
  EXPECT_EQ(after.events_pending, 0u);

  // A handle freed makes room for one: `b` still holds its own bytes and
  // can be deallocated.
  ASSERT_TRUE(DestroyEvent(held).ok());
  const TpuShim_Event down = FromDevice(s, b, 0, out.data(), kSize);
  ASSERT_TRUE(Await(down).ok());
  EXPECT_EQ(out, twos);
  expect_full(TryToDevice(s, threes.data(), b, 0, kSize, {}, &e));
  ASSERT_TRUE(DestroyEvent(down).ok());
  EXPECT_TRUE(Deallocate(s, b).ok());
  EXPECT_TRUE(Deallocate(s, a).ok());
}

// Handle generations never wrap: a slot freed at its last generation
// (2^32 - 1) retires, so a loop of create/destroy, which reuses one slot,
// never gets an id the slot issued before (a stale handle of it would
// match the live one). The test starts the slot at its last generation
// through the adapter's test seam instead of 2^32 reuses.
TEST_P(TpushimCApiTest,
       AStaleHandleNeverMatchesALiveOneAfterTheLastGeneration) {
  const TpuShim_System s = NewSystem();
  const TpuShim_DeviceBuffer d = NewDevice(s, 4096);
  constexpr uint64_t kGenerationMask = 0xFFFFFFFF;
  auto slot_of = [](TpuShim_Event e) { return e.id & ~kGenerationMask; };
  const TpuShim_Event first = ReadyEvent(s, d);
  ASSERT_TRUE(DestroyEvent(first).ok());
  ASSERT_TRUE(capi_internal::SetEventSlotGenerationForTesting(first.id,
                                                              kGenerationMask));
  // Freed slots are reused last first: the next event takes that slot.
  const TpuShim_Event last = ReadyEvent(s, d);
  ASSERT_EQ(last.id, slot_of(first) | kGenerationMask);
  ASSERT_TRUE(DestroyEvent(last).ok());

  // The slot issued generation 1 (and every one up to first's) before.
  const TpuShim_Event stale{slot_of(first) | 1};
  for (int i = 0; i < 3; ++i) {
    const TpuShim_Event e = ReadyEvent(s, d);
    EXPECT_NE(slot_of(e), slot_of(first))
        << "the slot of 0x" << std::hex << last.id
        << " issued an id again after its last generation: 0x" << e.id;
    for (const TpuShim_Event old : {stale, first, last}) {
      bool ready = false;
      const Result r = IsReady(old, &ready);
      EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT) << std::hex << old.id;
      EXPECT_THAT(r.message, HasSubstr("stale")) << std::hex << old.id;
    }
    ASSERT_TRUE(DestroyEvent(e).ok());
  }
  // A retired slot's generation is out of the seam's reach too.
  EXPECT_FALSE(capi_internal::SetEventSlotGenerationForTesting(last.id, 2));
}

INSTANTIATE_TEST_SUITE_P(Tpushim, TpushimCApiTest,
                         ::testing::Values(Implementation{"tpushim",
                                                          &TpushimApi}),
                         [](const ::testing::TestParamInfo<Implementation>& p) {
                           return std::string(p.param.name);
                         });

}  // namespace
}  // namespace tpushim
