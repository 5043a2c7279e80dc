// What the C ABI tests of the 1.4 surface share (c_api_memory_kinds_test,
// c_api_registered_test, events_conformance_test,
// c_api_memory_views_test): systems made through the function table
// alone, each on chips of its own, destroyed after the test; errors taken
// into a plain Result; the event calls every test uses.
//
// Systems see a fixed environment (FixedEnvironmentOs): what the test
// passes as options is all there is.
//
//   class MyTest : public testutil::CApiFixture {};
//   TEST_F(MyTest, Works) {
//     TpuShim_System s = NewSystem();  // region of 4 MiB, 2 chips
//     ...
//     EXPECT_TRUE(AwaitAndDestroy(event).ok());
//   }

#ifndef TPUSHIM_TESTS_DRIVER_C_API_FIXTURE_H_
#define TPUSHIM_TESTS_DRIVER_C_API_FIXTURE_H_

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "driver/c_api_internal.h"
#include "env/os.h"
#include "gtest/gtest.h"
#include "tpushim/c_api.h"

namespace tpushim::testutil {

// A TpuShim_Error taken apart (and destroyed): code 0 and "" for NULL.
struct Result {
  int code = TPUSHIM_CODE_OK;
  std::string message;
  bool ok() const { return code == TPUSHIM_CODE_OK; }
};

class CApiFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    capi_internal::SetOsForTesting(&os_);
    api_ = TpuShim_GetApi();
  }

  void TearDown() override {
    for (TpuShim_System s : systems_) (void)DestroySystem(s);
    systems_.clear();
    capi_internal::SetOsForTesting(nullptr);
  }

  Result Take(TpuShim_Error* e) {
    if (e == nullptr) return {};
    Result r{api_->Error_Code(e), api_->Error_Message(e)};
    api_->Error_Destroy(e);
    return r;
  }

  // A system on two chips of its own (of the sim's 16 per host, so up to
  // 8 per test), with a premapped region of `region` bytes; destroyed
  // after the test unless the test destroys it (then it erases it from
  // systems_).
  TpuShim_System NewSystem(const char* region = "4194304") {
    const std::string chips =
        absl::StrCat(2 * next_chip_pair_, ",", 2 * next_chip_pair_ + 1);
    ++next_chip_pair_;
    const TpuShim_Option options[] = {
        {"TPU_PREMAPPED_BUFFER_SIZE", region},
        {"TPUSHIM_DEVICE", "sim://?devices=16&hbm=16M"},
        {"TPU_VISIBLE_CHIPS", chips.c_str()},
        {"TPU_LOG_DIR", "disabled"},
        {"TPU_STDERR_LOG_LEVEL", "3"},
        {"TPUSHIM_PREFAULT_THREADS", "1"}};
    TpuShim_System_Create_Args a{};
    a.struct_size = TPUSHIM_SYSTEM_CREATE_ARGS_STRUCT_SIZE;
    a.options = options;
    a.num_options = sizeof(options) / sizeof(options[0]);
    const Result r = Take(api_->System_Create(&a));
    EXPECT_TRUE(r.ok()) << r.message;
    systems_.push_back(a.system);
    return a.system;
  }

  Result DestroySystem(TpuShim_System s) {
    TpuShim_System_Destroy_Args a{};
    a.struct_size = TPUSHIM_SYSTEM_DESTROY_ARGS_STRUCT_SIZE;
    a.system = s;
    return Take(api_->System_Destroy(&a));
  }

  Result Await(TpuShim_Event e) {
    TpuShim_Event_Await_Args a{};
    a.struct_size = TPUSHIM_EVENT_AWAIT_ARGS_STRUCT_SIZE;
    a.event = e;
    return Take(api_->Event_Await(&a));
  }

  Result DestroyEvent(TpuShim_Event e) {
    TpuShim_Event_Destroy_Args a{};
    a.struct_size = TPUSHIM_EVENT_DESTROY_ARGS_STRUCT_SIZE;
    a.event = e;
    return Take(api_->Event_Destroy(&a));
  }

  // Await, then destroy the handle; the event's status.
  Result AwaitAndDestroy(TpuShim_Event e) {
    const Result r = Await(e);
    (void)DestroyEvent(e);
    return r;
  }

  // Frees memory buffer `b` of `s`; on success awaits (and destroys) the
  // free's event, expecting OK.
  Result FreeMemoryBuffer(TpuShim_System s, TpuShim_MemoryBuffer b) {
    TpuShim_MemoryBuffer_Free_Args a{};
    a.struct_size = TPUSHIM_MEMORYBUFFER_FREE_ARGS_STRUCT_SIZE;
    a.system = s;
    a.buffer = b;
    const Result r = Take(api_->MemoryBuffer_Free(&a));
    if (r.ok()) {
      EXPECT_TRUE(AwaitAndDestroy(a.event).ok());
    }
    return r;
  }

  bool IsReady(TpuShim_Event e) {
    TpuShim_Event_IsReady_Args a{};
    a.struct_size = TPUSHIM_EVENT_ISREADY_ARGS_STRUCT_SIZE;
    a.event = e;
    EXPECT_TRUE(Take(api_->Event_IsReady(&a)).ok());
    return a.is_ready != 0;
  }

  FixedEnvironmentOs os_{Os::Default()};
  const TpuShim_Api* api_ = nullptr;
  std::vector<TpuShim_System> systems_;
  int next_chip_pair_ = 0;
};

}  // namespace tpushim::testutil

#endif  // TPUSHIM_TESTS_DRIVER_C_API_FIXTURE_H_
