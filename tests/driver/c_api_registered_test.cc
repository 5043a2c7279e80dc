// The C ABI's registered host memory (1.4): HostMemory_Register and
// HostMemory_Unregister check their args' struct_size and their handles
// (stale, doubly unregistered, foreign, of a destroyed system: all
// INVALID_ARGUMENT, never undefined behaviour), move the caller's range to
// the zero-copy path, and report it in TpuShim_Stats' appended fields.

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/driver/c_api_fixture.h"
#include "tpushim/c_api.h"

namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

static_assert(offsetof(TpuShim_Api, HostMemory_Unregister) >
              offsetof(TpuShim_Api, System_GetDeviceMemoryStats));

using tpushim::testutil::Result;

class CApiRegisteredTest : public tpushim::testutil::CApiFixture {
 protected:
  void SetUp() override {
    CApiFixture::SetUp();
    ASSERT_TRUE(TPUSHIM_API_HAS(api_, HostMemory_Register));
    ASSERT_TRUE(TPUSHIM_API_HAS(api_, HostMemory_Unregister));
    system_ = NewSystem();
    void* p = mmap(nullptr, 2 * kMiB, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    mem_ = static_cast<char*>(p);
    for (uint64_t i = 0; i < 2 * kMiB; ++i) mem_[i] = static_cast<char>(i * 7);
  }
  void TearDown() override {
    CApiFixture::TearDown();
    if (mem_ != nullptr) munmap(mem_, 2 * kMiB);
  }

  Result Register(
      TpuShim_System s, const void* data, uint64_t size,
      TpuShim_HostRegistration* out,
      size_t struct_size = sizeof(TpuShim_HostMemory_Register_Args)) {
    TpuShim_HostMemory_Register_Args a{};
    a.struct_size = struct_size;
    a.system = s;
    a.data = data;
    a.size = size;
    const Result r = Take(api_->HostMemory_Register(&a));
    if (out != nullptr) *out = a.registration;
    return r;
  }
  Result Unregister(
      TpuShim_System s, TpuShim_HostRegistration reg,
      size_t struct_size = sizeof(TpuShim_HostMemory_Unregister_Args)) {
    TpuShim_HostMemory_Unregister_Args a{};
    a.struct_size = struct_size;
    a.system = s;
    a.registration = reg;
    return Take(api_->HostMemory_Unregister(&a));
  }
  TpuShim_Stats Stats(TpuShim_System s) {
    TpuShim_Stats stats{};
    stats.struct_size = sizeof stats;
    TpuShim_System_GetStats_Args a{};
    a.struct_size = TPUSHIM_SYSTEM_GETSTATS_ARGS_STRUCT_SIZE;
    a.system = s;
    a.stats = &stats;
    EXPECT_EQ(Take(api_->System_GetStats(&a)).code, TPUSHIM_CODE_OK);
    return stats;
  }
  // Up and back through a new device buffer; true when the bytes came back.
  bool RoundTrip(TpuShim_System s, const char* src, char* dst, uint64_t n) {
    TpuShim_DeviceBuffer_Allocate_Args alloc{};
    alloc.struct_size = TPUSHIM_DEVICEBUFFER_ALLOCATE_ARGS_STRUCT_SIZE;
    alloc.system = s;
    alloc.size = n;
    if (Take(api_->DeviceBuffer_Allocate(&alloc)).code != 0) return false;
    TpuShim_Transfer_ToDevice_Args up{};
    up.struct_size = TPUSHIM_TRANSFER_TODEVICE_ARGS_STRUCT_SIZE;
    up.system = s;
    up.src = src;
    up.dst = alloc.buffer;
    up.size = n;
    bool ok = Take(api_->Transfer_ToDevice(&up)).code == 0;
    TpuShim_Transfer_FromDevice_Args down{};
    down.struct_size = TPUSHIM_TRANSFER_FROMDEVICE_ARGS_STRUCT_SIZE;
    down.system = s;
    down.src = alloc.buffer;
    down.dst = dst;
    down.size = n;
    down.wait_for = &up.event;
    down.num_wait_for = ok ? 1 : 0;
    ok = ok && Take(api_->Transfer_FromDevice(&down)).code == 0;
    if (ok) {
      TpuShim_Event_Await_Args w{};
      w.struct_size = TPUSHIM_EVENT_AWAIT_ARGS_STRUCT_SIZE;
      w.event = down.event;
      ok = Take(api_->Event_Await(&w)).code == 0;
      for (TpuShim_Event e : {up.event, down.event}) {
        TpuShim_Event_Destroy_Args d{};
        d.struct_size = TPUSHIM_EVENT_DESTROY_ARGS_STRUCT_SIZE;
        d.event = e;
        Take(api_->Event_Destroy(&d));
      }
    }
    return ok && std::memcmp(src, dst, n) == 0;
  }

  TpuShim_System system_{};
  char* mem_ = nullptr;
};

TEST_F(CApiRegisteredTest, RegistersMovesZeroCopyAndCountsIt) {
  TpuShim_HostRegistration reg{};
  Result r = Register(system_, mem_, 2 * kMiB, &reg);
  ASSERT_EQ(r.code, TPUSHIM_CODE_OK) << r.message;
  EXPECT_NE(reg.id, 0u);
  TpuShim_Stats s = Stats(system_);
  EXPECT_EQ(s.registrations_live, 1u);
  EXPECT_EQ(s.registered_bytes, 2 * kMiB);
  // 1 MiB up from the registration and back into it: zero-copy, whatever
  // the size and the threshold.
  EXPECT_TRUE(RoundTrip(system_, mem_, mem_ + kMiB, kMiB));
  s = Stats(system_);
  for (int d = 0; d < TPUSHIM_HOST_DIRECTION_COUNT; ++d) {
    EXPECT_EQ(s.zero_copy_registered_transfers[d], 1u);
    EXPECT_EQ(s.zero_copy_registered_bytes[d], kMiB);
    EXPECT_EQ(s.transfers[d][TPUSHIM_PATH_ZERO_COPY], 1u);
  }
  r = Unregister(system_, reg);
  EXPECT_EQ(r.code, TPUSHIM_CODE_OK) << r.message;
  s = Stats(system_);
  EXPECT_EQ(s.registrations_live, 0u);
  EXPECT_EQ(s.pinned_bytes_now, 0u);
}

TEST_F(CApiRegisteredTest, ChecksStructSizes) {
  TpuShim_HostRegistration reg{};
  Result r = Register(system_, mem_, 4096, &reg,
                      TPUSHIM_HOSTMEMORY_REGISTER_ARGS_STRUCT_SIZE - 1);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("HostMemory_Register"));
  EXPECT_THAT(r.message, HasSubstr("struct_size"));
  EXPECT_EQ(Stats(system_).registrations_live, 0u);
  EXPECT_EQ(Take(api_->HostMemory_Register(nullptr)).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  // The exact 1.4 size works.
  r = Register(system_, mem_, 4096, &reg,
               TPUSHIM_HOSTMEMORY_REGISTER_ARGS_STRUCT_SIZE);
  ASSERT_EQ(r.code, TPUSHIM_CODE_OK) << r.message;
  r = Unregister(system_, reg,
                 TPUSHIM_HOSTMEMORY_UNREGISTER_ARGS_STRUCT_SIZE - 1);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("HostMemory_Unregister"));
  EXPECT_EQ(Take(api_->HostMemory_Unregister(nullptr)).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  // Still registered: the refused call changed nothing.
  EXPECT_EQ(Stats(system_).registrations_live, 1u);
  r = Unregister(system_, reg, TPUSHIM_HOSTMEMORY_UNREGISTER_ARGS_STRUCT_SIZE);
  EXPECT_EQ(r.code, TPUSHIM_CODE_OK) << r.message;
}

TEST_F(CApiRegisteredTest, StaleDoubleAndForeignHandlesAreInvalidArgument) {
  TpuShim_HostRegistration reg{};
  ASSERT_EQ(Register(system_, mem_, kMiB, &reg).code, TPUSHIM_CODE_OK);
  // Another system's registration.
  TpuShim_System other = NewSystem();
  Result r = Unregister(other, reg);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TpuShim_HostRegistration"));
  EXPECT_THAT(r.message, HasSubstr("another TpuShim_System"));
  // Never issued, and another kind's id.
  EXPECT_EQ(Unregister(system_, TpuShim_HostRegistration{12345}).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(Unregister(system_, TpuShim_HostRegistration{system_.id}).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  ASSERT_EQ(Unregister(system_, reg).code, TPUSHIM_CODE_OK);
  // Twice.
  r = Unregister(system_, reg);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TpuShim_HostRegistration"));
}

TEST_F(CApiRegisteredTest, NamedErrorsRegisterNothing) {
  TpuShim_HostRegistration reg{};
  EXPECT_EQ(Register(system_, nullptr, 4096, &reg).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(Register(system_, mem_, 0, &reg).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  ASSERT_EQ(Register(system_, mem_, kMiB, &reg).code, TPUSHIM_CODE_OK);
  TpuShim_HostRegistration clash{};
  const Result r = Register(system_, mem_ + 4096, kMiB, &clash);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("overlaps the registered range"));
  EXPECT_EQ(Stats(system_).registrations_live, 1u);
}

// System_Destroy releases the registrations left; their handles are stale.
TEST_F(CApiRegisteredTest, DestroyingTheSystemReleasesAndStalesRegistrations) {
  TpuShim_System off = NewSystem("0");  // registering with the region off
  TpuShim_HostRegistration reg{};
  ASSERT_EQ(Register(off, mem_, kMiB, &reg).code, TPUSHIM_CODE_OK);
  std::vector<char> back(64 * 1024);
  EXPECT_TRUE(RoundTrip(off, mem_, back.data(), back.size()));
  EXPECT_EQ(Stats(off).zero_copy_registered_transfers[0], 1u);
  ASSERT_EQ(DestroySystem(off).code, TPUSHIM_CODE_OK);
  EXPECT_EQ(Unregister(off, reg).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  // The memory is free to register again, with another system.
  TpuShim_HostRegistration again{};
  EXPECT_EQ(Register(system_, mem_, kMiB, &again).code, TPUSHIM_CODE_OK);
}

}  // namespace
