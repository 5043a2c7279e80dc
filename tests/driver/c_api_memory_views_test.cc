// The C ABI's bridges between memory buffers and the device-buffer calls
// (1.4): MemoryBuffer_GetInfo's borrowed TpuShim_DeviceBuffer (usable by
// Transfer_*, DeviceBuffer_ReadyEvent and the chunked calls; stale after
// MemoryBuffer_Free or System_Destroy; refused by DeviceBuffer_Deallocate),
// MemoryBuffer_ReadyEvent in every memory, MemoryBuffer_FromHost's
// host_released and shape fields, and Transfer_AbortChunked. Each new field
// is written only when struct_size covers it.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/driver/c_api_fixture.h"
#include "tpushim/c_api.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using testutil::Result;

constexpr uint64_t kKiB = uint64_t{1} << 10;

// Memory ids of a system on two chips: 0 and 1 the devices' HBM.
constexpr int kDevice0 = 0;
constexpr int kPinnedHost = 2;
constexpr int kUnpinnedHost = 3;

std::vector<char> Pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 29 + seed);
  return v;
}

class CApiMemoryViewsTest : public testutil::CApiFixture {
 protected:
  void SetUp() override {
    CApiFixture::SetUp();
    ASSERT_TRUE(TPUSHIM_API_HAS(api_, MemoryBuffer_ReadyEvent));
    ASSERT_TRUE(TPUSHIM_API_HAS(api_, Transfer_AbortChunked));
    system_ = NewSystem();
  }

  TpuShim_MemoryBuffer Allocate(int memory, uint64_t size) {
    TpuShim_MemoryBuffer_Allocate_Args a{};
    a.struct_size = TPUSHIM_MEMORYBUFFER_ALLOCATE_ARGS_STRUCT_SIZE;
    a.system = system_;
    a.memory = memory;
    a.size = size;
    const Result r = Take(api_->MemoryBuffer_Allocate(&a));
    EXPECT_TRUE(r.ok()) << r.message;
    return a.buffer;
  }
  Result Info(TpuShim_MemoryBuffer b, TpuShim_MemoryBuffer_GetInfo_Args* out,
              size_t struct_size = sizeof(TpuShim_MemoryBuffer_GetInfo_Args)) {
    *out = {};
    out->struct_size = struct_size;
    out->system = system_;
    out->buffer = b;
    return Take(api_->MemoryBuffer_GetInfo(out));
  }
  TpuShim_DeviceBuffer Borrow(TpuShim_MemoryBuffer b) {
    TpuShim_MemoryBuffer_GetInfo_Args info;
    const Result r = Info(b, &info);
    EXPECT_TRUE(r.ok()) << r.message;
    return info.device_buffer;
  }
  Result Free(TpuShim_MemoryBuffer b) { return FreeMemoryBuffer(system_, b); }
  Result ToDevice(const void* src, TpuShim_DeviceBuffer dst, uint64_t size,
                  const TpuShim_Event* wait_for = nullptr,
                  size_t num_wait_for = 0) {
    TpuShim_Transfer_ToDevice_Args a{};
    a.struct_size = TPUSHIM_TRANSFER_TODEVICE_ARGS_STRUCT_SIZE;
    a.system = system_;
    a.src = src;
    a.dst = dst;
    a.size = size;
    a.wait_for = wait_for;
    a.num_wait_for = num_wait_for;
    a.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
    const Result r = Take(api_->Transfer_ToDevice(&a));
    if (r.ok()) last_event_ = a.event;
    return r;
  }
  Result FromDevice(TpuShim_DeviceBuffer src, void* dst, uint64_t size) {
    TpuShim_Transfer_FromDevice_Args a{};
    a.struct_size = TPUSHIM_TRANSFER_FROMDEVICE_ARGS_STRUCT_SIZE;
    a.system = system_;
    a.src = src;
    a.dst = dst;
    a.size = size;
    a.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
    const Result r = Take(api_->Transfer_FromDevice(&a));
    if (!r.ok()) return r;
    return AwaitAndDestroy(a.event);
  }
  Result ReadyEvent(TpuShim_MemoryBuffer b, TpuShim_Event* out) {
    TpuShim_MemoryBuffer_ReadyEvent_Args a{};
    a.struct_size = TPUSHIM_MEMORYBUFFER_READYEVENT_ARGS_STRUCT_SIZE;
    a.system = system_;
    a.buffer = b;
    const Result r = Take(api_->MemoryBuffer_ReadyEvent(&a));
    *out = a.event;
    return r;
  }
  TpuShim_Event NewEvent() {
    TpuShim_Event_Create_Args a{};
    a.struct_size = TPUSHIM_EVENT_CREATE_ARGS_STRUCT_SIZE;
    a.system = system_;
    EXPECT_TRUE(Take(api_->Event_Create(&a)).ok());
    return a.event;
  }
  Result Set(TpuShim_Event e, int32_t code) {
    TpuShim_Event_Set_Args a{};
    a.struct_size = TPUSHIM_EVENT_SET_ARGS_STRUCT_SIZE;
    a.event = e;
    a.code = code;
    return Take(api_->Event_Set(&a));
  }
  Result Abort(TpuShim_DeviceBuffer b, int32_t code, const char* message) {
    TpuShim_Transfer_AbortChunked_Args a{};
    a.struct_size = TPUSHIM_TRANSFER_ABORTCHUNKED_ARGS_STRUCT_SIZE;
    a.system = system_;
    a.buffer = b;
    a.code = code;
    a.message = message;
    return Take(api_->Transfer_AbortChunked(&a));
  }

  TpuShim_System system_{};
  TpuShim_Event last_event_{};
};

TEST_F(CApiMemoryViewsTest, NewFunctionsCheckTheirArgs) {
  Result r = Take(api_->MemoryBuffer_ReadyEvent(nullptr));
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("MemoryBuffer_ReadyEvent"));
  TpuShim_MemoryBuffer_ReadyEvent_Args ready{};
  ready.struct_size = TPUSHIM_MEMORYBUFFER_READYEVENT_ARGS_STRUCT_SIZE - 1;
  r = Take(api_->MemoryBuffer_ReadyEvent(&ready));
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("struct_size"));

  r = Take(api_->Transfer_AbortChunked(nullptr));
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("Transfer_AbortChunked"));
  TpuShim_Transfer_AbortChunked_Args abort{};
  abort.struct_size = TPUSHIM_TRANSFER_ABORTCHUNKED_ARGS_STRUCT_SIZE - 1;
  r = Take(api_->Transfer_AbortChunked(&abort));
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("struct_size"));
}

// A device-memory TpuShim_MemoryBuffer reaches every device-buffer call
// through its borrowed handle.
TEST_F(CApiMemoryViewsTest, TheBorrowedDeviceBufferWorksWithTransfers) {
  const uint64_t n = 16 * kKiB;
  const TpuShim_MemoryBuffer m = Allocate(kDevice0, n);
  const TpuShim_DeviceBuffer d = Borrow(m);
  ASSERT_NE(d.id, 0u);
  EXPECT_EQ(Borrow(m).id, d.id);  // one handle, every call

  const std::vector<char> src = Pattern(n, 1);
  ASSERT_TRUE(ToDevice(src.data(), d, n).ok());
  EXPECT_TRUE(AwaitAndDestroy(last_event_).ok());
  std::vector<char> back(n);
  ASSERT_TRUE(FromDevice(d, back.data(), n).ok());
  EXPECT_TRUE(back == src);

  // The buffer's readiness, from either handle.
  TpuShim_DeviceBuffer_ReadyEvent_Args ready{};
  ready.struct_size = TPUSHIM_DEVICEBUFFER_READYEVENT_ARGS_STRUCT_SIZE;
  ready.system = system_;
  ready.buffer = d;
  ASSERT_TRUE(Take(api_->DeviceBuffer_ReadyEvent(&ready)).ok());
  EXPECT_TRUE(AwaitAndDestroy(ready.event).ok());

  // A chunked transfer into it.
  TpuShim_Transfer_BeginChunked_Args begin{};
  begin.struct_size = TPUSHIM_TRANSFER_BEGINCHUNKED_ARGS_STRUCT_SIZE;
  begin.system = system_;
  begin.buffer = d;
  ASSERT_TRUE(Take(api_->Transfer_BeginChunked(&begin)).ok());
  const std::vector<char> next = Pattern(n, 2);
  TpuShim_Transfer_Chunk_Args chunk{};
  chunk.struct_size = TPUSHIM_TRANSFER_CHUNK_ARGS_STRUCT_SIZE;
  chunk.system = system_;
  chunk.src = next.data();
  chunk.dst = d;
  chunk.size = n;
  chunk.is_last = 1;
  chunk.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
  ASSERT_TRUE(Take(api_->Transfer_Chunk(&chunk)).ok());
  TpuShim_Event m_ready{};
  ASSERT_TRUE(ReadyEvent(m, &m_ready).ok());
  EXPECT_TRUE(AwaitAndDestroy(m_ready).ok());
  EXPECT_TRUE(AwaitAndDestroy(chunk.event).ok());
  EXPECT_TRUE(AwaitAndDestroy(chunk.host_released).ok());
  ASSERT_TRUE(FromDevice(d, back.data(), n).ok());
  EXPECT_TRUE(back == next);
  EXPECT_TRUE(Free(m).ok());
}

// Borrowed means borrowed: Deallocate refuses it, and it goes stale with
// its memory buffer (or its system), never undefined behaviour.
TEST_F(CApiMemoryViewsTest,
       TheBorrowedHandleIsRefusedByDeallocateAndGoesStale) {
  const TpuShim_MemoryBuffer m = Allocate(kDevice0, 4 * kKiB);
  const TpuShim_DeviceBuffer d = Borrow(m);
  ASSERT_NE(d.id, 0u);
  TpuShim_DeviceBuffer_Deallocate_Args dealloc{};
  dealloc.struct_size = TPUSHIM_DEVICEBUFFER_DEALLOCATE_ARGS_STRUCT_SIZE;
  dealloc.system = system_;
  dealloc.buffer = d;
  Result r = Take(api_->DeviceBuffer_Deallocate(&dealloc));
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("borrowed"));
  EXPECT_THAT(r.message, HasSubstr("MemoryBuffer_Free"));
  // Refused, it still works.
  const std::vector<char> src = Pattern(4 * kKiB, 3);
  ASSERT_TRUE(ToDevice(src.data(), d, src.size()).ok());
  EXPECT_TRUE(AwaitAndDestroy(last_event_).ok());

  ASSERT_TRUE(Free(m).ok());
  r = ToDevice(src.data(), d, src.size());
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TpuShim_DeviceBuffer"));
  EXPECT_THAT(r.message, HasSubstr("stale"));
  EXPECT_EQ(Take(api_->DeviceBuffer_Deallocate(&dealloc)).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);

  // With its system: stale too.
  const TpuShim_MemoryBuffer m2 = Allocate(kDevice0, 4 * kKiB);
  const TpuShim_DeviceBuffer d2 = Borrow(m2);
  ASSERT_TRUE(DestroySystem(system_).ok());
  systems_.clear();
  TpuShim_System other = NewSystem();
  TpuShim_Transfer_ToDevice_Args up{};
  up.struct_size = TPUSHIM_TRANSFER_TODEVICE_ARGS_STRUCT_SIZE;
  up.system = other;
  up.src = src.data();
  up.dst = d2;
  up.size = src.size();
  r = Take(api_->Transfer_ToDevice(&up));
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TpuShim_DeviceBuffer"));
}

// GetInfo writes device_buffer only when struct_size covers it; host
// memories have none, and their `data` is where Transfer_* reach them.
TEST_F(CApiMemoryViewsTest, GetInfoWritesTheHandleOnlyWhenTheStructHasIt) {
  const TpuShim_MemoryBuffer m = Allocate(kDevice0, 4 * kKiB);
  TpuShim_MemoryBuffer_GetInfo_Args info{};
  info.struct_size = TPUSHIM_MEMORYBUFFER_GETINFO_ARGS_STRUCT_SIZE;
  info.system = system_;
  info.buffer = m;
  info.device_buffer.id = 0xABCD;  // beyond struct_size: never written
  ASSERT_TRUE(Take(api_->MemoryBuffer_GetInfo(&info)).ok());
  EXPECT_EQ(info.device_buffer.id, 0xABCDu);
  EXPECT_EQ(info.kind, TPUSHIM_MEMORY_DEVICE);

  const TpuShim_MemoryBuffer host = Allocate(kPinnedHost, 4 * kKiB);
  ASSERT_TRUE(Info(host, &info).ok());
  EXPECT_EQ(info.device_buffer.id, 0u);
  ASSERT_NE(info.data, nullptr);
  // pinned_host bytes move to a device straight from the region.
  const TpuShim_DeviceBuffer d = Borrow(m);
  std::memset(info.data, 0x5A, 4 * kKiB);
  ASSERT_TRUE(ToDevice(info.data, d, 4 * kKiB).ok());
  EXPECT_TRUE(AwaitAndDestroy(last_event_).ok());
  std::vector<char> back(4 * kKiB);
  ASSERT_TRUE(FromDevice(d, back.data(), back.size()).ok());
  EXPECT_EQ(back[0], 0x5A);
  EXPECT_EQ(back.back(), 0x5A);
}

// MemoryBuffer_ReadyEvent answers in every memory: a host-memory buffer
// filled by a copy is ready when the copy is.
TEST_F(CApiMemoryViewsTest, ReadyEventOfAHostBufferWaitsForTheCopyFillingIt) {
  const uint64_t n = 8 * kKiB;
  const TpuShim_MemoryBuffer dev = Allocate(kDevice0, n);
  const TpuShim_Event gate = NewEvent();
  TpuShim_MemoryBuffer_CopyToMemory_Args copy{};
  copy.struct_size = TPUSHIM_MEMORYBUFFER_COPYTOMEMORY_ARGS_STRUCT_SIZE;
  copy.system = system_;
  copy.src = dev;
  copy.memory = kPinnedHost;
  copy.wait_for = &gate;
  copy.num_wait_for = 1;
  ASSERT_TRUE(Take(api_->MemoryBuffer_CopyToMemory(&copy)).ok());
  TpuShim_Event ready{};
  ASSERT_TRUE(ReadyEvent(copy.buffer, &ready).ok());
  EXPECT_FALSE(IsReady(ready));
  ASSERT_TRUE(Set(gate, TPUSHIM_CODE_OK).ok());
  EXPECT_TRUE(AwaitAndDestroy(ready).ok());
  EXPECT_TRUE(AwaitAndDestroy(copy.event).ok());

  // Allocated or made from host bytes: ready at once.
  const TpuShim_MemoryBuffer fresh = Allocate(kUnpinnedHost, n);
  ASSERT_TRUE(ReadyEvent(fresh, &ready).ok());
  EXPECT_TRUE(IsReady(ready));
  EXPECT_TRUE(AwaitAndDestroy(ready).ok());

  // A failed copy fails it.
  const TpuShim_Event bad = NewEvent();
  copy.wait_for = &bad;
  copy.memory = kUnpinnedHost;
  ASSERT_TRUE(Take(api_->MemoryBuffer_CopyToMemory(&copy)).ok());
  ASSERT_TRUE(ReadyEvent(copy.buffer, &ready).ok());
  ASSERT_TRUE(Set(bad, TPUSHIM_CODE_DATA_LOSS).ok());
  EXPECT_EQ(AwaitAndDestroy(ready).code, TPUSHIM_CODE_DATA_LOSS);
  EXPECT_EQ(AwaitAndDestroy(copy.event).code, TPUSHIM_CODE_DATA_LOSS);

  // Freed: stale.
  ASSERT_TRUE(Free(fresh).ok());
  const Result r = ReadyEvent(fresh, &ready);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TpuShim_MemoryBuffer"));
  for (TpuShim_Event e : {gate, bad}) EXPECT_TRUE(DestroyEvent(e).ok());
}

// MemoryBuffer_FromHost's host_released: into device memory the
// transfer's; over aliased bytes, once the buffer is freed.
TEST_F(CApiMemoryViewsTest, FromHostGivesHostReleased) {
  const std::vector<char> src = Pattern(64 * kKiB, 4);
  TpuShim_MemoryBuffer_FromHost_Args a{};
  a.struct_size = sizeof a;
  a.system = system_;
  a.data = src.data();
  a.size = src.size();
  a.memory = kDevice0;
  a.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
  ASSERT_TRUE(Take(api_->MemoryBuffer_FromHost(&a)).ok());
  ASSERT_NE(a.host_released.id, 0u);
  EXPECT_NE(a.host_released.id, a.event.id);
  EXPECT_TRUE(AwaitAndDestroy(a.host_released).ok());
  EXPECT_TRUE(AwaitAndDestroy(a.event).ok());
  std::vector<char> back(src.size());
  ASSERT_TRUE(FromDevice(Borrow(a.buffer), back.data(), back.size()).ok());
  EXPECT_TRUE(back == src);

  // Aliased in unpinned_host: the bytes are the buffer's until it is freed.
  a.memory = kUnpinnedHost;
  a.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_ZERO_COPY;
  ASSERT_TRUE(Take(api_->MemoryBuffer_FromHost(&a)).ok());
  ASSERT_EQ(a.aliased, 1);
  EXPECT_TRUE(IsReady(a.event));
  EXPECT_FALSE(IsReady(a.host_released));
  ASSERT_TRUE(Free(a.buffer).ok());
  EXPECT_TRUE(AwaitAndDestroy(a.host_released).ok());
  EXPECT_TRUE(AwaitAndDestroy(a.event).ok());

  // A caller built before the field: never written.
  TpuShim_MemoryBuffer_FromHost_Args old{};
  old.struct_size = TPUSHIM_MEMORYBUFFER_FROMHOST_ARGS_STRUCT_SIZE;
  old.system = system_;
  old.data = src.data();
  old.size = src.size();
  old.memory = kDevice0;
  old.host_released.id = 0xABCD;
  ASSERT_TRUE(Take(api_->MemoryBuffer_FromHost(&old)).ok());
  EXPECT_EQ(old.host_released.id, 0xABCDu);
  EXPECT_TRUE(AwaitAndDestroy(old.event).ok());
}

// MemoryBuffer_FromHost with a shape: the dense array in, the tiled image
// held; `size` must be the dense array's length.
TEST_F(CApiMemoryViewsTest, FromHostMakesShapedBuffersInAnyMemory) {
  // f32[4,10]: 160 dense bytes; T(8,128) pads it to 8 x 128 x 4 = 4096.
  std::vector<float> dense(40);
  for (size_t i = 0; i < dense.size(); ++i) dense[i] = static_cast<float>(i);
  TpuShim_MemoryBuffer_FromHost_Args a{};
  a.struct_size = sizeof a;
  a.system = system_;
  a.data = dense.data();
  a.size = 160;
  a.shape = "f32[4,10]{1,0:T(8,128)}";
  a.label = "weights";
  a.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL;
  TpuShim_MemoryBuffer_GetInfo_Args info;
  for (int memory : {kDevice0, kPinnedHost}) {
    a.memory = memory;
    ASSERT_TRUE(Take(api_->MemoryBuffer_FromHost(&a)).ok()) << memory;
    EXPECT_TRUE(AwaitAndDestroy(a.event).ok());
    EXPECT_TRUE(AwaitAndDestroy(a.host_released).ok());
    ASSERT_TRUE(Info(a.buffer, &info).ok());
    EXPECT_EQ(info.size, 4096u) << memory;
  }
  // The pinned_host image: row r's 10 floats at r * 128 floats.
  const float* image = static_cast<const float*>(info.data);
  EXPECT_EQ(image[0], 0.0f);
  EXPECT_EQ(image[128 + 3], 13.0f);
  EXPECT_EQ(image[11], 0.0f);  // padding

  a.size = 161;
  const Result r = Take(api_->MemoryBuffer_FromHost(&a));
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("args->size is 161"));
  EXPECT_THAT(r.message, HasSubstr("160 bytes"));
  a.size = 160;
  a.shape = "f32[4,";
  EXPECT_EQ(Take(api_->MemoryBuffer_FromHost(&a)).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
}

// Transfer_AbortChunked: the buffer's waiters see the producer's error,
// with the bytes that never came.
TEST_F(CApiMemoryViewsTest, AbortChunkedFailsTheBufferNamingWhatIsMissing) {
  const TpuShim_MemoryBuffer m = Allocate(kDevice0, 4 * kKiB);
  const TpuShim_DeviceBuffer d = Borrow(m);
  TpuShim_Transfer_BeginChunked_Args begin{};
  begin.struct_size = TPUSHIM_TRANSFER_BEGINCHUNKED_ARGS_STRUCT_SIZE;
  begin.system = system_;
  begin.buffer = d;

  Result r = Abort(d, TPUSHIM_CODE_ABORTED, "producer gave up");
  EXPECT_EQ(r.code, TPUSHIM_CODE_FAILED_PRECONDITION);
  EXPECT_THAT(r.message, HasSubstr("Transfer_AbortChunked"));
  ASSERT_TRUE(Take(api_->Transfer_BeginChunked(&begin)).ok());
  r = Abort(d, 0, "ok is no error");
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("args->code 0"));
  EXPECT_EQ(Abort(d, 17, nullptr).code, TPUSHIM_CODE_INVALID_ARGUMENT);

  const std::vector<char> src = Pattern(kKiB, 5);
  TpuShim_Transfer_Chunk_Args chunk{};
  chunk.struct_size = TPUSHIM_TRANSFER_CHUNK_ARGS_STRUCT_SIZE;
  chunk.system = system_;
  chunk.src = src.data();
  chunk.dst = d;
  chunk.size = kKiB;
  chunk.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
  ASSERT_TRUE(Take(api_->Transfer_Chunk(&chunk)).ok());
  TpuShim_Event ready{};
  ASSERT_TRUE(ReadyEvent(m, &ready).ok());
  ASSERT_TRUE(Abort(d, TPUSHIM_CODE_ABORTED, "producer gave up").ok());
  r = AwaitAndDestroy(ready);
  EXPECT_EQ(r.code, TPUSHIM_CODE_ABORTED);
  EXPECT_THAT(r.message, HasSubstr("producer gave up"));
  EXPECT_THAT(r.message, HasSubstr("3072 of the buffer's 4096 bytes never "
                                   "came (1 chunk gave 1024 bytes)"));
  EXPECT_TRUE(AwaitAndDestroy(chunk.event).ok());
  EXPECT_TRUE(AwaitAndDestroy(chunk.host_released).ok());
  TpuShim_DeviceBuffer stale{12345};
  EXPECT_EQ(Abort(stale, TPUSHIM_CODE_ABORTED, nullptr).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace tpushim
