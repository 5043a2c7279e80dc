// The C ABI's 1.4 events block (Event_Create, Event_Set,
// DeviceBuffer_ReadyEvent, Transfer_BeginChunked, Transfer_Chunk) and the
// host_released out field of Transfer_ToDevice / Transfer_ArrayToDevice:
// struct_size checks (NULL, too small, the 1.0-size caller without the
// field), stale and foreign handles, setting twice, destroying an unset
// event, and caller events in wait_for lists and callbacks.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/driver/c_api_fixture.h"
#include "tpushim/c_api.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kKiB = uint64_t{1} << 10;

using testutil::Result;

class EventsCApiTest : public testutil::CApiFixture {
 protected:
  void SetUp() override {
    CApiFixture::SetUp();
    system_ = NewSystem("8388608");
  }

  TpuShim_DeviceBuffer Allocate(uint64_t size) {
    TpuShim_DeviceBuffer_Allocate_Args a{};
    a.struct_size = TPUSHIM_DEVICEBUFFER_ALLOCATE_ARGS_STRUCT_SIZE;
    a.system = system_;
    a.device = 0;
    a.size = size;
    const Result r = Take(api_->DeviceBuffer_Allocate(&a));
    EXPECT_TRUE(r.ok()) << r.message;
    return a.buffer;
  }

  Result Create(TpuShim_Event* event, TpuShim_System system) {
    TpuShim_Event_Create_Args a{};
    a.struct_size = TPUSHIM_EVENT_CREATE_ARGS_STRUCT_SIZE;
    a.system = system;
    Result r = Take(api_->Event_Create(&a));
    *event = a.event;
    return r;
  }

  TpuShim_Event NewEvent() {
    TpuShim_Event e{};
    const Result r = Create(&e, system_);
    EXPECT_TRUE(r.ok()) << r.message;
    return e;
  }

  Result Set(TpuShim_Event e, int32_t code, const char* message = nullptr) {
    TpuShim_Event_Set_Args a{};
    a.struct_size = TPUSHIM_EVENT_SET_ARGS_STRUCT_SIZE;
    a.event = e;
    a.code = code;
    a.message = message;
    return Take(api_->Event_Set(&a));
  }

  Result ReadyEvent(TpuShim_DeviceBuffer b, TpuShim_Event* out) {
    TpuShim_DeviceBuffer_ReadyEvent_Args a{};
    a.struct_size = TPUSHIM_DEVICEBUFFER_READYEVENT_ARGS_STRUCT_SIZE;
    a.system = system_;
    a.buffer = b;
    Result r = Take(api_->DeviceBuffer_ReadyEvent(&a));
    *out = a.event;
    return r;
  }

  Result Begin(TpuShim_DeviceBuffer b) {
    TpuShim_Transfer_BeginChunked_Args a{};
    a.struct_size = TPUSHIM_TRANSFER_BEGINCHUNKED_ARGS_STRUCT_SIZE;
    a.system = system_;
    a.buffer = b;
    return Take(api_->Transfer_BeginChunked(&a));
  }

  Result Chunk(const void* src, TpuShim_DeviceBuffer b, uint64_t offset,
               uint64_t size, bool last, TpuShim_Transfer_Chunk_Args* out) {
    TpuShim_Transfer_Chunk_Args a{};
    a.struct_size = TPUSHIM_TRANSFER_CHUNK_ARGS_STRUCT_SIZE;
    a.system = system_;
    a.src = src;
    a.dst = b;
    a.dst_offset = offset;
    a.size = size;
    a.is_last = last ? 1 : 0;
    a.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
    Result r = Take(api_->Transfer_Chunk(&a));
    if (out != nullptr) *out = a;
    return r;
  }

  TpuShim_System system_{};
};

TEST_F(EventsCApiTest, TheTableHasTheEventsBlock) {
  EXPECT_TRUE(TPUSHIM_API_HAS(api_, Event_Create));
  EXPECT_TRUE(TPUSHIM_API_HAS(api_, Event_Set));
  EXPECT_TRUE(TPUSHIM_API_HAS(api_, DeviceBuffer_ReadyEvent));
  EXPECT_TRUE(TPUSHIM_API_HAS(api_, Transfer_BeginChunked));
  EXPECT_TRUE(TPUSHIM_API_HAS(api_, Transfer_Chunk));
  EXPECT_GE(api_->api_minor, 4);
}

TEST_F(EventsCApiTest, NullArgsAndSmallStructSizesAreInvalidArgument) {
  EXPECT_EQ(Take(api_->Event_Create(nullptr)).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(Take(api_->Event_Set(nullptr)).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(Take(api_->DeviceBuffer_ReadyEvent(nullptr)).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(Take(api_->Transfer_BeginChunked(nullptr)).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(Take(api_->Transfer_Chunk(nullptr)).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);

  TpuShim_Event_Create_Args c{};
  c.struct_size = TPUSHIM_EVENT_CREATE_ARGS_STRUCT_SIZE - 1;
  c.system = system_;
  Result r = Take(api_->Event_Create(&c));
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TPUSHIM_EVENT_CREATE_ARGS_STRUCT_SIZE"));
  TpuShim_Event_Set_Args s{};
  s.struct_size = TPUSHIM_EVENT_SET_ARGS_STRUCT_SIZE - 1;
  EXPECT_EQ(Take(api_->Event_Set(&s)).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  TpuShim_DeviceBuffer_ReadyEvent_Args re{};
  re.struct_size = 0;
  EXPECT_EQ(Take(api_->DeviceBuffer_ReadyEvent(&re)).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  TpuShim_Transfer_BeginChunked_Args b{};
  b.struct_size = TPUSHIM_TRANSFER_BEGINCHUNKED_ARGS_STRUCT_SIZE - 1;
  EXPECT_EQ(Take(api_->Transfer_BeginChunked(&b)).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);
  TpuShim_Transfer_Chunk_Args k{};
  k.struct_size = TPUSHIM_TRANSFER_CHUNK_ARGS_STRUCT_SIZE - 1;
  EXPECT_EQ(Take(api_->Transfer_Chunk(&k)).code, TPUSHIM_CODE_INVALID_ARGUMENT);
}

// Calls `fn` with `args` in a buffer 32 bytes larger than Args, filled
// with 0xA5 past the struct, and struct_size saying so (a caller built
// against a newer header); true when the tail is untouched afterwards.
template <typename Args>
bool TailUntouched(TpuShim_Error* (*fn)(Args*), Args args, Result* result,
                   const TpuShim_Api* api) {
  constexpr size_t kTail = 32;
  alignas(std::max_align_t) unsigned char storage[sizeof(Args) + kTail];
  std::memset(storage, 0xA5, sizeof storage);
  args.struct_size = sizeof storage;
  std::memcpy(storage, &args, sizeof(Args));
  TpuShim_Error* error = fn(reinterpret_cast<Args*>(storage));
  *result = Result{api->Error_Code(error), api->Error_Message(error)};
  api->Error_Destroy(error);
  for (size_t i = sizeof(Args); i < sizeof storage; ++i) {
    if (storage[i] != 0xA5) return false;
  }
  return true;
}

TEST_F(EventsCApiTest, LargerStructsAreAcceptedAndTheirTailIsNotWritten) {
  Result r;
  TpuShim_Event_Create_Args c{};
  c.system = system_;
  EXPECT_TRUE(TailUntouched(api_->Event_Create, c, &r, api_));
  EXPECT_TRUE(r.ok()) << r.message;
  const TpuShim_DeviceBuffer b = Allocate(64);
  TpuShim_DeviceBuffer_ReadyEvent_Args re{};
  re.system = system_;
  re.buffer = b;
  EXPECT_TRUE(TailUntouched(api_->DeviceBuffer_ReadyEvent, re, &r, api_));
  EXPECT_TRUE(r.ok()) << r.message;
  TpuShim_Transfer_BeginChunked_Args bc{};
  bc.system = system_;
  bc.buffer = b;
  EXPECT_TRUE(TailUntouched(api_->Transfer_BeginChunked, bc, &r, api_));
  EXPECT_TRUE(r.ok()) << r.message;
  char src[64] = {};
  TpuShim_Transfer_Chunk_Args k{};
  k.system = system_;
  k.src = src;
  k.dst = b;
  k.size = sizeof src;
  k.is_last = 1;
  k.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
  EXPECT_TRUE(TailUntouched(api_->Transfer_Chunk, k, &r, api_));
  EXPECT_TRUE(r.ok()) << r.message;
  TpuShim_Event gate = NewEvent();
  TpuShim_Event_Set_Args set{};
  set.event = gate;
  EXPECT_TRUE(TailUntouched(api_->Event_Set, set, &r, api_));
  EXPECT_TRUE(r.ok()) << r.message;
  EXPECT_TRUE(Await(gate).ok());
  EXPECT_TRUE(DestroyEvent(gate).ok());
}

TEST_F(EventsCApiTest, ACallerEventGatesATransferAndIsSetOnce) {
  TpuShim_Event gate = NewEvent();
  EXPECT_FALSE(IsReady(gate));
  const TpuShim_DeviceBuffer b = Allocate(4 * kKiB);
  std::vector<char> src(4 * kKiB, 'x');
  TpuShim_Transfer_ToDevice_Args t{};
  t.struct_size = sizeof t;
  t.system = system_;
  t.src = src.data();
  t.dst = b;
  t.size = src.size();
  t.wait_for = &gate;
  t.num_wait_for = 1;
  // Not "only during call": that call would wait for the gate.
  t.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
  ASSERT_TRUE(Take(api_->Transfer_ToDevice(&t)).ok());
  EXPECT_FALSE(IsReady(t.event));
  EXPECT_FALSE(IsReady(t.host_released));

  ASSERT_TRUE(Set(gate, TPUSHIM_CODE_OK).ok());
  EXPECT_TRUE(Await(t.event).ok());
  EXPECT_TRUE(Await(t.host_released).ok());
  EXPECT_TRUE(Await(gate).ok());

  const Result twice = Set(gate, TPUSHIM_CODE_INTERNAL, "late");
  EXPECT_EQ(twice.code, TPUSHIM_CODE_FAILED_PRECONDITION);
  EXPECT_THAT(twice.message, HasSubstr("Event_Set"));
  EXPECT_THAT(twice.message, HasSubstr("already set"));
  EXPECT_TRUE(Await(gate).ok());  // unchanged
  for (TpuShim_Event e : {gate, t.event, t.host_released}) {
    EXPECT_TRUE(DestroyEvent(e).ok());
  }
}

TEST_F(EventsCApiTest, AReadIssuedRightAfterAWriteReturnsItWithNoEvent) {
  // Operations on one buffer run in the order issued: the read waits for
  // the held write before it, which it names nowhere.
  TpuShim_Event gate = NewEvent();
  const TpuShim_DeviceBuffer b = Allocate(4 * kKiB);
  std::vector<char> src(4 * kKiB, 'w');
  std::vector<char> out(4 * kKiB, 0);
  TpuShim_Transfer_ToDevice_Args up{};
  up.struct_size = sizeof up;
  up.system = system_;
  up.src = src.data();
  up.dst = b;
  up.size = src.size();
  up.wait_for = &gate;
  up.num_wait_for = 1;
  up.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
  ASSERT_TRUE(Take(api_->Transfer_ToDevice(&up)).ok());
  TpuShim_Transfer_FromDevice_Args down{};
  down.struct_size = sizeof down;
  down.system = system_;
  down.src = b;
  down.dst = out.data();
  down.size = out.size();
  down.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
  ASSERT_TRUE(Take(api_->Transfer_FromDevice(&down)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(IsReady(down.event)) << "the read ran before the write";
  ASSERT_TRUE(Set(gate, TPUSHIM_CODE_OK).ok());
  EXPECT_TRUE(Await(down.event).ok());
  EXPECT_EQ(out, src);
  for (TpuShim_Event e : {gate, up.event, up.host_released, down.event}) {
    EXPECT_TRUE(DestroyEvent(e).ok());
  }
}

TEST_F(EventsCApiTest, AWaiterOfAStreamingBufferNeverBlocksItsChunks) {
  // PJRT's async host-to-device pattern through the C ABI: a transfer into
  // Y waits for X's ready event, then X's only chunk comes.
  const TpuShim_DeviceBuffer x = Allocate(4 * kKiB);
  const TpuShim_DeviceBuffer y = Allocate(4 * kKiB);
  std::vector<char> src(4 * kKiB, 's');
  ASSERT_TRUE(Begin(x).ok());
  TpuShim_Event x_ready{};
  ASSERT_TRUE(ReadyEvent(x, &x_ready).ok());
  TpuShim_Transfer_ToDevice_Args into_y{};
  into_y.struct_size = sizeof into_y;
  into_y.system = system_;
  into_y.src = src.data();
  into_y.dst = y;
  into_y.size = src.size();
  into_y.wait_for = &x_ready;
  into_y.num_wait_for = 1;
  into_y.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
  ASSERT_TRUE(Take(api_->Transfer_ToDevice(&into_y)).ok());
  TpuShim_Transfer_Chunk_Args chunk{};
  ASSERT_TRUE(Chunk(src.data(), x, 0, src.size(), /*last=*/true, &chunk).ok());
  EXPECT_TRUE(Await(chunk.event).ok());
  EXPECT_TRUE(Await(x_ready).ok());
  EXPECT_TRUE(Await(into_y.event).ok());
  for (TpuShim_Event e : {x_ready, into_y.event, into_y.host_released,
                          chunk.event, chunk.host_released}) {
    EXPECT_TRUE(DestroyEvent(e).ok());
  }
}

TEST_F(EventsCApiTest, SetWithAnErrorFailsTheWaitersWithItsCodeAndMessage) {
  TpuShim_Event gate = NewEvent();
  TpuShim_Event_AddCallback_Args cb{};
  cb.struct_size = TPUSHIM_EVENT_ADDCALLBACK_ARGS_STRUCT_SIZE;
  cb.event = gate;
  static std::atomic<int> seen_code{-1};
  cb.callback = [](TpuShim_Error* status, void*) {
    seen_code.store(TpuShim_GetApi()->Error_Code(status));
    TpuShim_GetApi()->Error_Destroy(status);
  };
  ASSERT_TRUE(Take(api_->Event_AddCallback(&cb)).ok());
  ASSERT_TRUE(Set(gate, TPUSHIM_CODE_DATA_LOSS, "producer lost it").ok());
  const Result r = Await(gate);
  EXPECT_EQ(r.code, TPUSHIM_CODE_DATA_LOSS);
  EXPECT_EQ(r.message, "producer lost it");
  // The callback runs on the callback thread: destroying the system
  // drains it.
  ASSERT_TRUE(DestroySystem(system_).ok());
  systems_.clear();
  EXPECT_EQ(seen_code.load(), TPUSHIM_CODE_DATA_LOSS);
  EXPECT_TRUE(DestroyEvent(gate).ok());
}

TEST_F(EventsCApiTest, BadCodesOrdinaryEventsAndStaleHandlesAreRefused) {
  TpuShim_Event gate = NewEvent();
  Result r = Set(gate, 17);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("args->code 17"));
  EXPECT_EQ(Set(gate, -1).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_FALSE(IsReady(gate));  // changed nothing

  // A buffer's ready event is not the caller's to set.
  const TpuShim_DeviceBuffer b = Allocate(64);
  TpuShim_Event ready{};
  ASSERT_TRUE(ReadyEvent(b, &ready).ok());
  r = Set(ready, TPUSHIM_CODE_OK);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("not made by Event_Create"));

  // Stale: destroyed (unset: its waiters are cancelled), then used.
  ASSERT_TRUE(DestroyEvent(gate).ok());
  r = Set(gate, TPUSHIM_CODE_OK);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("TpuShim_Event"));
  EXPECT_EQ(DestroyEvent(gate).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  TpuShim_Event made_up{12345};
  EXPECT_EQ(Set(made_up, TPUSHIM_CODE_OK).code, TPUSHIM_CODE_INVALID_ARGUMENT);

  // Event_Create with a stale system handle.
  TpuShim_System other = NewSystem();
  ASSERT_TRUE(DestroySystem(other).ok());
  TpuShim_Event e{};
  EXPECT_EQ(Create(&e, other).code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_TRUE(DestroyEvent(ready).ok());
}

TEST_F(EventsCApiTest, DestroyingAnUnsetEventCancelsItsWaiters) {
  TpuShim_Event gate = NewEvent();
  const TpuShim_DeviceBuffer b = Allocate(4 * kKiB);
  std::vector<char> src(4 * kKiB, 'y');
  TpuShim_Transfer_ToDevice_Args t{};
  t.struct_size = TPUSHIM_TRANSFER_TODEVICE_ARGS_STRUCT_SIZE;  // 1.0 caller
  t.system = system_;
  t.src = src.data();
  t.dst = b;
  t.size = src.size();
  t.wait_for = &gate;
  t.num_wait_for = 1;
  // Not "only during call": that call would wait for the gate.
  t.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
  t.host_released.id = 0xABCD;  // beyond struct_size: never written
  ASSERT_TRUE(Take(api_->Transfer_ToDevice(&t)).ok());
  EXPECT_EQ(t.host_released.id, 0xABCDu);
  ASSERT_TRUE(DestroyEvent(gate).ok());
  const Result r = Await(t.event);
  EXPECT_EQ(r.code, TPUSHIM_CODE_CANCELLED);
  EXPECT_THAT(r.message, HasSubstr("destroyed before it was set"));
  EXPECT_TRUE(DestroyEvent(t.event).ok());
}

TEST_F(EventsCApiTest, DestroyingTheSystemCancelsUnsetEvents) {
  TpuShim_Event gate = NewEvent();
  ASSERT_TRUE(DestroySystem(system_).ok());
  systems_.clear();
  EXPECT_EQ(Await(gate).code, TPUSHIM_CODE_CANCELLED);
  const Result r = Set(gate, TPUSHIM_CODE_OK);
  EXPECT_EQ(r.code, TPUSHIM_CODE_FAILED_PRECONDITION);
  EXPECT_THAT(r.message, HasSubstr("shut down"));
  EXPECT_TRUE(DestroyEvent(gate).ok());
}

TEST_F(EventsCApiTest, ForeignEventsAreRefusedInWaitFor) {
  TpuShim_System other = NewSystem();
  TpuShim_Event foreign{};
  ASSERT_TRUE(Create(&foreign, other).ok());
  const TpuShim_DeviceBuffer b = Allocate(64);
  char src[64] = {};
  TpuShim_Transfer_Chunk_Args k{};
  k.struct_size = TPUSHIM_TRANSFER_CHUNK_ARGS_STRUCT_SIZE;
  k.system = system_;
  k.src = src;
  k.dst = b;
  k.size = sizeof src;
  k.is_last = 1;
  k.wait_for = &foreign;
  k.num_wait_for = 1;
  ASSERT_TRUE(Begin(b).ok());
  const Result r = Take(api_->Transfer_Chunk(&k));
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("wait_for[0]"));
  EXPECT_TRUE(DestroyEvent(foreign).ok());
}

TEST_F(EventsCApiTest, ChunkedTransferIsReadyAtItsLastChunk) {
  const uint64_t n = 8 * kKiB;
  const TpuShim_DeviceBuffer b = Allocate(n);
  std::vector<char> src(n);
  for (uint64_t i = 0; i < n; ++i) src[i] = static_cast<char>(i * 3);

  TpuShim_Transfer_Chunk_Args out{};
  Result r = Chunk(src.data(), b, 0, n, true, &out);
  EXPECT_EQ(r.code, TPUSHIM_CODE_FAILED_PRECONDITION);
  EXPECT_THAT(r.message, HasSubstr("BeginChunkedTransfer"));

  ASSERT_TRUE(Begin(b).ok());
  EXPECT_EQ(Begin(b).code, TPUSHIM_CODE_FAILED_PRECONDITION);
  TpuShim_Event ready{};
  ASSERT_TRUE(ReadyEvent(b, &ready).ok());
  ASSERT_TRUE(Chunk(src.data(), b, 0, n / 2, false, &out).ok());
  EXPECT_TRUE(Await(out.event).ok());
  EXPECT_TRUE(Await(out.host_released).ok());
  EXPECT_TRUE(DestroyEvent(out.event).ok());
  EXPECT_TRUE(DestroyEvent(out.host_released).ok());
  EXPECT_FALSE(IsReady(ready));

  r = Chunk(src.data(), b, n / 2, n, true, nullptr);
  EXPECT_EQ(r.code, TPUSHIM_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(r.message, HasSubstr("overlaps the end"));
  EXPECT_EQ(Chunk(src.data(), b, 0, 0, true, nullptr).code,
            TPUSHIM_CODE_INVALID_ARGUMENT);  // size 0

  ASSERT_TRUE(Chunk(src.data() + n / 2, b, n / 2, n / 2, true, &out).ok());
  EXPECT_TRUE(Await(ready).ok());
  r = Chunk(src.data(), b, 0, 16, false, nullptr);
  EXPECT_EQ(r.code, TPUSHIM_CODE_FAILED_PRECONDITION);
  EXPECT_THAT(r.message, HasSubstr("already had its last"));

  std::vector<char> back(n);
  TpuShim_Transfer_FromDevice_Args d{};
  d.struct_size = TPUSHIM_TRANSFER_FROMDEVICE_ARGS_STRUCT_SIZE;
  d.system = system_;
  d.src = b;
  d.dst = back.data();
  d.size = n;
  ASSERT_TRUE(Take(api_->Transfer_FromDevice(&d)).ok());
  EXPECT_TRUE(Await(d.event).ok());
  EXPECT_EQ(back, src);
  for (TpuShim_Event e : {ready, out.event, out.host_released, d.event}) {
    EXPECT_TRUE(DestroyEvent(e).ok());
  }
}

TEST_F(EventsCApiTest, ArrayToDeviceFillsHostReleasedWhenTheStructHasIt) {
  TpuShim_DeviceBuffer_AllocateShaped_Args s{};
  s.struct_size = TPUSHIM_DEVICEBUFFER_ALLOCATESHAPED_ARGS_STRUCT_SIZE;
  s.system = system_;
  s.shape = "f32[8,128]";
  ASSERT_TRUE(Take(api_->DeviceBuffer_AllocateShaped(&s)).ok());
  std::vector<char> src(8 * 128 * 4, 1);
  TpuShim_Transfer_ArrayToDevice_Args t{};
  t.struct_size = sizeof t;
  t.system = system_;
  t.src = src.data();
  t.dst = s.buffer;
  ASSERT_TRUE(Take(api_->Transfer_ArrayToDevice(&t)).ok());
  EXPECT_TRUE(Await(t.event).ok());
  EXPECT_TRUE(Await(t.host_released).ok());
  EXPECT_NE(t.host_released.id, t.event.id);
  EXPECT_TRUE(DestroyEvent(t.event).ok());
  EXPECT_TRUE(DestroyEvent(t.host_released).ok());
}

TEST_F(EventsCApiTest, SetFromAnotherThreadWhileThreadsAwaitIt) {
  TpuShim_Event gate = NewEvent();
  constexpr int kThreads = 4;
  std::atomic<int> ok{0};
  std::atomic<int> waiting{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      waiting.fetch_add(1);
      if (Await(gate).ok()) ok.fetch_add(1);
    });
  }
  std::thread setter([&] {
    while (waiting.load() < kThreads) std::this_thread::yield();
    EXPECT_TRUE(Set(gate, TPUSHIM_CODE_OK).ok());
  });
  setter.join();
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kThreads);
  EXPECT_TRUE(DestroyEvent(gate).ok());
}

}  // namespace
}  // namespace tpushim
