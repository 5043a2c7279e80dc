// The C ABI's memory kinds (API 1.4, include/tpushim/c_api.h "memory
// kinds"), through the function table alone: the struct_size rule for each
// new function (NULL args, below the 1.4 size), stale, doubly-freed,
// foreign and made-up TpuShim_MemoryBuffer handles, the memory list, the
// default memory, allocating, aliasing, copying, freeing, per-memory stats,
// the pinned_host out-of-memory text, and the 1.4 tail of
// System_GetDeviceMemoryStats.

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

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uint64_t kMiB = uint64_t{1} << 20;

using testutil::Result;

class CApiMemoryKindsTest : public testutil::CApiFixture {
 protected:
  void SetUp() override {
    CApiFixture::SetUp();
    ASSERT_TRUE(TPUSHIM_API_HAS(api_, System_GetMemoryStats));
    system_ = NewSystem("4194304");
  }

  Result Allocate(TpuShim_System s, int memory, uint64_t size,
                  TpuShim_MemoryBuffer* out, const char* shape = nullptr) {
    TpuShim_MemoryBuffer_Allocate_Args a{};
    a.struct_size = TPUSHIM_MEMORYBUFFER_ALLOCATE_ARGS_STRUCT_SIZE;
    a.system = s;
    a.memory = memory;
    a.size = size;
    a.shape = shape;
    const Result r = Take(api_->MemoryBuffer_Allocate(&a));
    *out = a.buffer;
    return r;
  }
  Result Info(TpuShim_MemoryBuffer b, TpuShim_MemoryBuffer_GetInfo_Args* out,
              TpuShim_System s = {}) {
    *out = {};
    out->struct_size = TPUSHIM_MEMORYBUFFER_GETINFO_ARGS_STRUCT_SIZE;
    out->system = s.id != 0 ? s : system_;
    out->buffer = b;
    return Take(api_->MemoryBuffer_GetInfo(out));
  }
  Result Copy(TpuShim_MemoryBuffer src, int memory, TpuShim_MemoryBuffer* out,
              TpuShim_System s = {}) {
    TpuShim_MemoryBuffer_CopyToMemory_Args a{};
    a.struct_size = TPUSHIM_MEMORYBUFFER_COPYTOMEMORY_ARGS_STRUCT_SIZE;
    a.system = s.id != 0 ? s : system_;
    a.src = src;
    a.memory = memory;
    const Result r = Take(api_->MemoryBuffer_CopyToMemory(&a));
    if (r.ok()) {
      EXPECT_TRUE(AwaitAndDestroy(a.event).ok());
      *out = a.buffer;
    }
    return r;
  }
  Result Free(TpuShim_MemoryBuffer b) { return FreeMemoryBuffer(system_, b); }
  Result Stats(int memory, TpuShim_System_GetMemoryStats_Args* out) {
    *out = {};
    out->struct_size = TPUSHIM_SYSTEM_GETMEMORYSTATS_ARGS_STRUCT_SIZE;
    out->system = system_;
    out->memory = memory;
    return Take(api_->System_GetMemoryStats(out));
  }

  TpuShim_System system_{};
};

// Every new function: NULL args and a struct_size below its 1.4 size are
// INVALID_ARGUMENT naming the function.
TEST_F(CApiMemoryKindsTest, EveryFunctionChecksItsArgs) {
  auto check = [&](auto fn, auto args, size_t full, const char* name) {
    using Args = decltype(args);
    Result r = Take(fn(static_cast<Args*>(nullptr)));
    EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT) << name;
    EXPECT_THAT(r.message, HasSubstr(name));
    args.struct_size = full - 1;
    r = Take(fn(&args));
    EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT) << name;
    EXPECT_THAT(r.message, HasSubstr("struct_size")) << name;
  };
  check(api_->System_GetMemories, TpuShim_System_GetMemories_Args{},
        TPUSHIM_SYSTEM_GETMEMORIES_ARGS_STRUCT_SIZE, "System_GetMemories");
  check(api_->System_GetDefaultMemory, TpuShim_System_GetDefaultMemory_Args{},
        TPUSHIM_SYSTEM_GETDEFAULTMEMORY_ARGS_STRUCT_SIZE,
        "System_GetDefaultMemory");
  check(api_->MemoryBuffer_Allocate, TpuShim_MemoryBuffer_Allocate_Args{},
        TPUSHIM_MEMORYBUFFER_ALLOCATE_ARGS_STRUCT_SIZE,
        "MemoryBuffer_Allocate");
  check(api_->MemoryBuffer_FromHost, TpuShim_MemoryBuffer_FromHost_Args{},
        TPUSHIM_MEMORYBUFFER_FROMHOST_ARGS_STRUCT_SIZE,
        "MemoryBuffer_FromHost");
  check(api_->MemoryBuffer_CopyToMemory,
        TpuShim_MemoryBuffer_CopyToMemory_Args{},
        TPUSHIM_MEMORYBUFFER_COPYTOMEMORY_ARGS_STRUCT_SIZE,
        "MemoryBuffer_CopyToMemory");
  check(api_->MemoryBuffer_GetInfo, TpuShim_MemoryBuffer_GetInfo_Args{},
        TPUSHIM_MEMORYBUFFER_GETINFO_ARGS_STRUCT_SIZE, "MemoryBuffer_GetInfo");
  check(api_->MemoryBuffer_Free, TpuShim_MemoryBuffer_Free_Args{},
        TPUSHIM_MEMORYBUFFER_FREE_ARGS_STRUCT_SIZE, "MemoryBuffer_Free");
  check(api_->System_GetMemoryStats, TpuShim_System_GetMemoryStats_Args{},
        TPUSHIM_SYSTEM_GETMEMORYSTATS_ARGS_STRUCT_SIZE,
        "System_GetMemoryStats");
}

TEST_F(CApiMemoryKindsTest, ListsTheMemories) {
  TpuShim_System_GetMemories_Args a{};
  a.struct_size = TPUSHIM_SYSTEM_GETMEMORIES_ARGS_STRUCT_SIZE;
  a.system = system_;
  ASSERT_TRUE(Take(api_->System_GetMemories(&a)).ok());  // count only
  ASSERT_EQ(a.num_memories, 4u);
  TpuShim_MemoryInfo m[4];
  a.memories = m;
  a.capacity = 4;
  ASSERT_TRUE(Take(api_->System_GetMemories(&a)).ok());
  EXPECT_EQ(m[0].kind, TPUSHIM_MEMORY_DEVICE);
  EXPECT_STREQ(m[0].kind_name, "device");
  EXPECT_EQ(m[0].device, 0);
  EXPECT_EQ(m[1].device, 1);
  EXPECT_EQ(m[1].capacity_bytes, 16 * kMiB);
  EXPECT_EQ(m[2].id, 2);
  EXPECT_EQ(m[2].kind, TPUSHIM_MEMORY_PINNED_HOST);
  EXPECT_STREQ(m[2].kind_name, "pinned_host");
  EXPECT_EQ(m[2].device, -1);
  EXPECT_EQ(m[2].capacity_bytes, 4 * kMiB);
  EXPECT_EQ(m[3].kind, TPUSHIM_MEMORY_UNPINNED_HOST);
  EXPECT_STREQ(m[3].kind_name, "unpinned_host");
  // A short array gets the first entries and the full count.
  TpuShim_MemoryInfo one[1];
  a.memories = one;
  a.capacity = 1;
  ASSERT_TRUE(Take(api_->System_GetMemories(&a)).ok());
  EXPECT_EQ(a.num_memories, 4u);
  EXPECT_EQ(one[0].id, 0);
  a.memories = nullptr;
  EXPECT_EQ(Take(api_->System_GetMemories(&a)).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);

  TpuShim_System_GetDefaultMemory_Args d{};
  d.struct_size = TPUSHIM_SYSTEM_GETDEFAULTMEMORY_ARGS_STRUCT_SIZE;
  d.system = system_;
  d.device = 1;
  ASSERT_TRUE(Take(api_->System_GetDefaultMemory(&d)).ok());
  EXPECT_EQ(d.memory, 1);
  d.device = 2;
  const Result bad = Take(api_->System_GetDefaultMemory(&d));
  EXPECT_EQ(bad.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(bad.message, HasSubstr("device 2 does not exist"));
}

TEST_F(CApiMemoryKindsTest, CopiesThroughEveryKindAndKeepsTheBytes) {
  std::vector<char> data(64 * 1024);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 3);
  TpuShim_MemoryBuffer_FromHost_Args f{};
  f.struct_size = TPUSHIM_MEMORYBUFFER_FROMHOST_ARGS_STRUCT_SIZE;
  f.system = system_;
  f.data = data.data();
  f.size = data.size();
  f.memory = 3;  // unpinned_host
  f.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL;
  ASSERT_TRUE(Take(api_->MemoryBuffer_FromHost(&f)).ok());
  ASSERT_TRUE(AwaitAndDestroy(f.event).ok());
  EXPECT_EQ(f.aliased, 0);
  TpuShim_MemoryBuffer dev, pinned, dev1, back;
  ASSERT_TRUE(Copy(f.buffer, 0, &dev).ok());
  ASSERT_TRUE(Copy(dev, 2, &pinned).ok());
  ASSERT_TRUE(Copy(pinned, 1, &dev1).ok());
  ASSERT_TRUE(Copy(dev1, 3, &back).ok());
  TpuShim_MemoryBuffer_GetInfo_Args i;
  ASSERT_TRUE(Info(dev1, &i).ok());
  EXPECT_EQ(i.memory, 1);
  EXPECT_EQ(i.kind, TPUSHIM_MEMORY_DEVICE);
  EXPECT_EQ(i.data, nullptr);
  ASSERT_TRUE(Info(pinned, &i).ok());
  EXPECT_EQ(i.memory, 2);
  EXPECT_EQ(i.kind, TPUSHIM_MEMORY_PINNED_HOST);
  ASSERT_TRUE(Info(back, &i).ok());
  EXPECT_EQ(i.kind, TPUSHIM_MEMORY_UNPINNED_HOST);
  ASSERT_EQ(i.size, data.size());
  EXPECT_EQ(std::memcmp(i.data, data.data(), data.size()), 0);
  // device -> pinned_host went zero-copy.
  TpuShim_Stats st{};
  st.struct_size = sizeof(st);
  TpuShim_System_GetStats_Args g{};
  g.struct_size = TPUSHIM_SYSTEM_GETSTATS_ARGS_STRUCT_SIZE;
  g.system = system_;
  g.stats = &st;
  ASSERT_TRUE(Take(api_->System_GetStats(&g)).ok());
  EXPECT_EQ(
      st.transfers[TPUSHIM_DIRECTION_DEVICE_TO_HOST][TPUSHIM_PATH_ZERO_COPY],
      1u);
}

TEST_F(CApiMemoryKindsTest, ZeroCopySemanticsAlias) {
  std::vector<char> data(8192, 7);
  TpuShim_MemoryBuffer_FromHost_Args f{};
  f.struct_size = TPUSHIM_MEMORYBUFFER_FROMHOST_ARGS_STRUCT_SIZE;
  f.system = system_;
  f.data = data.data();
  f.size = data.size();
  f.memory = 3;
  f.semantics = TPUSHIM_HOST_BUFFER_MUTABLE_ZERO_COPY;
  ASSERT_TRUE(Take(api_->MemoryBuffer_FromHost(&f)).ok());
  ASSERT_TRUE(AwaitAndDestroy(f.event).ok());
  EXPECT_EQ(f.aliased, 1);
  TpuShim_MemoryBuffer_GetInfo_Args i;
  ASSERT_TRUE(Info(f.buffer, &i).ok());
  EXPECT_EQ(i.data, data.data());
  EXPECT_EQ(i.aliased, 1);
  // Mutable zero-copy into pinned_host from outside the region: named.
  f.memory = 2;
  const Result r = Take(api_->MemoryBuffer_FromHost(&f));
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("kMutableZeroCopy"));
  // Unknown semantics.
  f.semantics = 9;
  EXPECT_EQ(Take(api_->MemoryBuffer_FromHost(&f)).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  f.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_ZERO_COPY;
  f.data = nullptr;
  EXPECT_EQ(Take(api_->MemoryBuffer_FromHost(&f)).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
}

TEST_F(CApiMemoryKindsTest, StaleForeignAndMadeUpHandlesAreInvalidArgument) {
  TpuShim_MemoryBuffer b;
  ASSERT_TRUE(Allocate(system_, 2, 4096, &b).ok());
  ASSERT_TRUE(Free(b).ok());
  TpuShim_MemoryBuffer_GetInfo_Args i;
  Result r = Info(b, &i);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("stale"));
  r = Free(b);  // doubly freed
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TpuShim_MemoryBuffer"));
  TpuShim_MemoryBuffer made_up{0x1234};
  EXPECT_EQ(Info(made_up, &i).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  TpuShim_MemoryBuffer none{0};
  EXPECT_EQ(Info(none, &i).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  // Another system's.
  const TpuShim_System other = NewSystem("4194304");
  TpuShim_MemoryBuffer theirs;
  ASSERT_TRUE(Allocate(other, 3, 64, &theirs).ok());
  r = Info(theirs, &i);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("another TpuShim_System"));
  TpuShim_MemoryBuffer out;
  EXPECT_EQ(Copy(theirs, 0, &out).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  // A handle of another kind.
  TpuShim_MemoryBuffer system_id{system_.id};
  r = Info(system_id, &i);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TpuShim_System handle"));
  // Destroying a system makes its buffers' handles stale.
  TpuShim_System_Destroy_Args d{};
  d.struct_size = TPUSHIM_SYSTEM_DESTROY_ARGS_STRUCT_SIZE;
  d.system = other;
  ASSERT_TRUE(Take(api_->System_Destroy(&d)).ok());
  r = Info(theirs, &i);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
}

TEST_F(CApiMemoryKindsTest, AllocationErrors) {
  TpuShim_MemoryBuffer b;
  Result r = Allocate(system_, 4, 64, &b);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("memory 4 does not exist"));
  EXPECT_EQ(Allocate(system_, 3, 0, &b).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(Allocate(system_, 2, 0, &b, "f32[").code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  // pinned_host full: libtpu's text, then the pinned_host report.
  TpuShim_MemoryBuffer held;
  ASSERT_TRUE(Allocate(system_, 2, 3 * kMiB, &held).ok());
  r = Allocate(system_, 2, 2 * kMiB, &b);
  EXPECT_EQ(r.code, TPUSHIM_CODE_RESOURCE_EXHAUSTED);
  EXPECT_THAT(r.message, StartsWith("Attempting to allocate 2.00M. That was "
                                    "not possible. There are 1.00M free."));
  EXPECT_THAT(r.message,
              HasSubstr("Ran out of memory in memory space pinned_host."));
  // Region off: pinned_host is listed and refuses.
  const TpuShim_System off = NewSystem("0");
  r = Allocate(off, 2, 4096, &b);
  EXPECT_EQ(r.code, TPUSHIM_CODE_FAILED_PRECONDITION);
  EXPECT_THAT(r.message, HasSubstr("TPU_PREMAPPED_BUFFER_SIZE=0"));
  // A shaped buffer in host memory holds the tiled image.
  ASSERT_TRUE(Allocate(system_, 3, 0, &b, "f32[16,10]").ok());
  TpuShim_MemoryBuffer_GetInfo_Args i;
  ASSERT_TRUE(Info(b, &i).ok());
  EXPECT_EQ(i.size, 16u * 128 * 4);
}

TEST_F(CApiMemoryKindsTest, PerMemoryStatsAndTheDeviceStatsTail) {
  TpuShim_MemoryBuffer a, b;
  ASSERT_TRUE(Allocate(system_, 0, 4096, &a).ok());
  ASSERT_TRUE(Allocate(system_, 0, 3 * 4096, &b).ok());
  TpuShim_System_GetMemoryStats_Args s;
  ASSERT_TRUE(Stats(0, &s).ok());
  EXPECT_EQ(s.kind, TPUSHIM_MEMORY_DEVICE);
  EXPECT_EQ(s.num_allocs, 2u);
  EXPECT_EQ(s.largest_alloc_size, 3u * 4096);
  EXPECT_EQ(s.bytes_in_use, 4u * 4096);
  EXPECT_EQ(s.has_bytes_limit, 1);
  EXPECT_EQ(s.bytes_limit, 16 * kMiB);
  EXPECT_EQ(s.buffers_live, 2u);
  ASSERT_TRUE(Stats(3, &s).ok());
  EXPECT_EQ(s.kind, TPUSHIM_MEMORY_UNPINNED_HOST);
  EXPECT_EQ(s.has_bytes_limit, 0);
  ASSERT_TRUE(Stats(2, &s).ok());
  EXPECT_EQ(s.bytes_limit, 4 * kMiB);
  EXPECT_EQ(Stats(7, &s).code, TPUSHIM_CODE_INVALID_ARGUMENT);

  // System_GetDeviceMemoryStats: the 1.4 fields, only when struct_size
  // covers them.
  TpuShim_System_GetDeviceMemoryStats_Args d{};
  d.struct_size = sizeof(d);
  d.system = system_;
  d.device = 0;
  ASSERT_TRUE(Take(api_->System_GetDeviceMemoryStats(&d)).ok());
  EXPECT_EQ(d.num_allocs, 2u);
  EXPECT_EQ(d.largest_alloc_size, 3u * 4096);
  TpuShim_System_GetDeviceMemoryStats_Args old{};
  old.struct_size = TPUSHIM_SYSTEM_GETDEVICEMEMORYSTATS_ARGS_STRUCT_SIZE;
  old.system = system_;
  old.num_allocs = 777;
  old.largest_alloc_size = 888;
  ASSERT_TRUE(Take(api_->System_GetDeviceMemoryStats(&old)).ok());
  EXPECT_EQ(old.num_allocs, 777u);
  EXPECT_EQ(old.largest_alloc_size, 888u);
}

}  // namespace
}  // namespace tpushim
