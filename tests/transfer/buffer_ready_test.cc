// Device buffers' ready events (the writes issued so far, the first
// failure) and chunked host→device transfers into a pre-created buffer:
// ready only after the last chunk, a failing middle chunk, and the named
// errors (a chunk after the last, past the end, without a begin).

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/transfer_rig.h"
#include "transfer/transfer_engine.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;
using testutil::TransferRig;

constexpr uint64_t kKiB = uint64_t{1} << 10;

std::unique_ptr<TransferRig> MakeRig(TransferRig::Params params = {}) {
  absl::StatusOr<std::unique_ptr<TransferRig>> rig =
      TransferRig::Create(std::move(params));
  EXPECT_TRUE(rig.ok()) << rig.status();
  return rig.ok() ? *std::move(rig) : nullptr;
}

std::vector<char> Pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 13 + seed);
  return v;
}

std::vector<char> ReadBack(TransferEngine& engine, const DeviceBuffer& b,
                           uint64_t n) {
  std::vector<char> out(n);
  absl::StatusOr<Event> down = engine.TransferFromDevice(b, 0, out.data(), n);
  EXPECT_TRUE(down.ok()) << down.status();
  if (down.ok()) {
    EXPECT_TRUE(down->Await().ok()) << down->Await();
  }
  return out;
}

// ---- buffer ready events -------------------------------------------------

TEST(BufferReadyTest, ANewBufferIsReady) {
  auto rig = MakeRig();
  ASSERT_NE(rig, nullptr);
  absl::StatusOr<DeviceBuffer> b = rig->engine().Allocate(0, 4 * kKiB);
  ASSERT_TRUE(b.ok());
  absl::StatusOr<Event> ready = rig->engine().BufferReadyEvent(*b);
  ASSERT_TRUE(ready.ok()) << ready.status();
  EXPECT_TRUE(ready->IsReady());
  EXPECT_TRUE(ready->Await().ok());
}

TEST(BufferReadyTest, WaitsForTheWritesIssuedSoFarNotForReads) {
  auto rig = MakeRig();
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 64 * kKiB;
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, n);
  absl::StatusOr<DeviceBuffer> other = engine.Allocate(0, n);
  ASSERT_TRUE(b.ok() && other.ok());
  absl::StatusOr<CallerEvent> gate = engine.CreateEvent();
  ASSERT_TRUE(gate.ok());
  std::vector<char> src = Pattern(n, 1);
  // A host→device write and a device→device write into `b`, both held.
  absl::StatusOr<Event> up =
      engine.TransferToDevice(src.data(), *b, 0, n / 2, {gate->event()});
  absl::StatusOr<Event> copy = engine.TransferDeviceToDevice(
      *other, 0, *b, n / 2, n / 2, {gate->event()});
  ASSERT_TRUE(up.ok() && copy.ok());
  // A read of `other`, held as well: it does not count for `other`.
  std::vector<char> sink(n);
  absl::StatusOr<Event> read =
      engine.TransferFromDevice(*other, 0, sink.data(), n, {gate->event()});
  ASSERT_TRUE(read.ok());

  absl::StatusOr<Event> ready = engine.BufferReadyEvent(*b);
  ASSERT_TRUE(ready.ok());
  EXPECT_FALSE(ready->IsReady());
  absl::StatusOr<Event> other_ready = engine.BufferReadyEvent(*other);
  ASSERT_TRUE(other_ready.ok());
  EXPECT_TRUE(other_ready->IsReady());

  ASSERT_TRUE(gate->Set(absl::OkStatus()).ok());
  EXPECT_TRUE(ready->Await().ok());
  EXPECT_TRUE(up->IsReady());
  EXPECT_TRUE(copy->IsReady());
  // A write issued after the ready event was taken is not in it.
  absl::StatusOr<CallerEvent> gate2 = engine.CreateEvent();
  ASSERT_TRUE(gate2.ok());
  absl::StatusOr<Event> later =
      engine.TransferToDevice(src.data(), *b, 0, n, {gate2->event()});
  ASSERT_TRUE(later.ok());
  EXPECT_TRUE(ready->IsReady());
  absl::StatusOr<Event> ready2 = engine.BufferReadyEvent(*b);
  ASSERT_TRUE(ready2.ok());
  EXPECT_FALSE(ready2->IsReady());
  ASSERT_TRUE(gate2->Set(absl::OkStatus()).ok());
  EXPECT_TRUE(ready2->Await().ok());
  // The read lands in `sink`, which goes before the engine does.
  EXPECT_TRUE(read->Await().ok());
}

TEST(BufferReadyTest, FailsWithTheFirstFailedWriteFromThenOn) {
  TransferRig::Params params;
  params.faults = "dma:nth=2,code=DATA_LOSS";
  auto rig = MakeRig(params);
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 4 * kKiB;
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, n);
  ASSERT_TRUE(b.ok());
  std::vector<char> src = Pattern(n, 2);
  absl::StatusOr<Event> first = engine.TransferToDevice(src.data(), *b, 0, n);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(first->Await().ok());
  absl::StatusOr<Event> second =
      engine.TransferToDevice(src.data(), *b, 0, n, {*first});
  ASSERT_TRUE(second.ok());
  absl::StatusOr<Event> ready = engine.BufferReadyEvent(*b);
  ASSERT_TRUE(ready.ok());
  EXPECT_EQ(ready->Await().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(second->Await().code(), absl::StatusCode::kDataLoss);
  // A later, successful write does not make the bytes what they were
  // meant to be: the buffer keeps its failure.
  absl::StatusOr<Event> third = engine.TransferToDevice(src.data(), *b, 0, n);
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(third->Await().ok());
  absl::StatusOr<Event> again = engine.BufferReadyEvent(*b);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->Await().code(), absl::StatusCode::kDataLoss);
}

TEST(BufferReadyTest, RejectsDeallocatedEmptyAndForeignBuffers) {
  auto rig = MakeRig();
  auto other = MakeRig();
  ASSERT_NE(rig, nullptr);
  ASSERT_NE(other, nullptr);
  TransferEngine& engine = rig->engine();
  absl::StatusOr<Event> none = engine.BufferReadyEvent(DeviceBuffer());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("handle is empty"));
  absl::StatusOr<DeviceBuffer> foreign = other->engine().Allocate(0, 64);
  ASSERT_TRUE(foreign.ok());
  EXPECT_THAT(engine.BufferReadyEvent(*foreign).status().message(),
              HasSubstr("another transfer engine"));
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, 64);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(engine.Deallocate(*b).ok());
  absl::StatusOr<Event> gone = engine.BufferReadyEvent(*b);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(gone.status().message(), HasSubstr("deallocated"));
}

// ---- chunked transfers -------------------------------------------------

TEST(ChunkedTransferTest, ReadyOnlyAfterTheLastChunk) {
  auto rig = MakeRig();
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 3 * 64 * kKiB;
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, n);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(engine.BeginChunkedTransfer(*b).ok());
  absl::StatusOr<Event> ready = engine.BufferReadyEvent(*b);
  ASSERT_TRUE(ready.ok());
  std::vector<char> src = Pattern(n, 3);
  const uint64_t c = n / 3;
  // Out of order on purpose: offsets say where each chunk goes.
  for (uint64_t off : {2 * c, 0 * c}) {
    absl::StatusOr<TransferEvents> chunk =
        engine.TransferChunk(src.data() + off, *b, off, c, /*is_last=*/false);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    ASSERT_TRUE(chunk->ready.Await().ok());
    EXPECT_TRUE(chunk->host_released.Await().ok());
  }
  // Every chunk so far has completed, and still the buffer is not ready.
  EXPECT_FALSE(ready->IsReady());
  absl::StatusOr<Event> mid = engine.BufferReadyEvent(*b);
  ASSERT_TRUE(mid.ok());
  EXPECT_FALSE(mid->IsReady());
  absl::StatusOr<TransferEvents> last =
      engine.TransferChunk(src.data() + c, *b, c, c, /*is_last=*/true);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(ready->Await().ok());
  EXPECT_TRUE(mid->Await().ok());
  EXPECT_TRUE(last->ready.IsReady());
  EXPECT_TRUE(ReadBack(engine, *b, n) == src);
}

TEST(ChunkedTransferTest, AFailingMiddleChunkFailsTheReadyEventWithItsStatus) {
  TransferRig::Params params;
  params.faults = "dma:nth=2,code=DATA_LOSS";
  auto rig = MakeRig(params);
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t c = 16 * kKiB;
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, 3 * c);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(engine.BeginChunkedTransfer(*b).ok());
  absl::StatusOr<Event> ready = engine.BufferReadyEvent(*b);
  ASSERT_TRUE(ready.ok());
  std::vector<char> src = Pattern(3 * c, 4);
  std::vector<Event> chunks;
  for (int i = 0; i < 3; ++i) {
    // Each once the one before is done: the second descriptor the device
    // serves is the middle chunk's.
    if (!chunks.empty()) (void)chunks.back().Await();
    absl::StatusOr<TransferEvents> chunk =
        engine.TransferChunk(src.data() + i * c, *b, i * c, c, i == 2);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    chunks.push_back(chunk->ready);
  }
  EXPECT_TRUE(chunks[0].Await().ok());
  EXPECT_EQ(chunks[1].Await().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(chunks[2].Await().ok());  // later chunks still run
  absl::Status s = ready->Await();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("injected"));
}

TEST(ChunkedTransferTest, NamedErrorsChangeNothing) {
  auto rig = MakeRig();
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 8 * kKiB;
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, n);
  ASSERT_TRUE(b.ok());
  std::vector<char> src = Pattern(n, 5);

  absl::StatusOr<TransferEvents> early =
      engine.TransferChunk(src.data(), *b, 0, n, true);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.status().message(), HasSubstr("BeginChunkedTransfer"));

  ASSERT_TRUE(engine.BeginChunkedTransfer(*b).ok());
  absl::Status twice = engine.BeginChunkedTransfer(*b);
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(twice.message(), HasSubstr("already open"));

  // Overlapping the end, even as the last chunk: refused, still open.
  absl::StatusOr<TransferEvents> over =
      engine.TransferChunk(src.data(), *b, n - 100, 200, true);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(over.status().message(), HasSubstr("overlaps the end"));
  absl::StatusOr<Event> ready = engine.BufferReadyEvent(*b);
  ASSERT_TRUE(ready.ok());
  EXPECT_FALSE(ready->IsReady());

  absl::StatusOr<TransferEvents> last =
      engine.TransferChunk(src.data(), *b, 0, n, true);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(ready->Await().ok());

  absl::StatusOr<TransferEvents> after =
      engine.TransferChunk(src.data(), *b, 0, 16, false);
  EXPECT_EQ(after.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(after.status().message(), HasSubstr("already had its last"));
  // A new chunked transfer may write it again.
  ASSERT_TRUE(engine.BeginChunkedTransfer(*b).ok());
  absl::StatusOr<TransferEvents> again =
      engine.TransferChunk(src.data(), *b, 0, n, true);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->ready.Await().ok());
  EXPECT_TRUE(ReadBack(engine, *b, n) == src);
}

TEST(ChunkedTransferTest, DeallocatingOrShuttingDownBeforeTheLastCancels) {
  auto rig = MakeRig();
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, 4 * kKiB);
  absl::StatusOr<DeviceBuffer> c = engine.Allocate(0, 4 * kKiB);
  ASSERT_TRUE(b.ok() && c.ok());
  ASSERT_TRUE(engine.BeginChunkedTransfer(*b).ok());
  ASSERT_TRUE(engine.BeginChunkedTransfer(*c).ok());
  absl::StatusOr<Event> b_ready = engine.BufferReadyEvent(*b);
  absl::StatusOr<Event> c_ready = engine.BufferReadyEvent(*c);
  ASSERT_TRUE(b_ready.ok() && c_ready.ok());
  absl::StatusOr<Event> freed = engine.Deallocate(*b);
  ASSERT_TRUE(freed.ok());
  EXPECT_TRUE(freed->Await().ok());
  absl::Status s = b_ready->Await();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(s.message(), HasSubstr("deallocated before"));
  engine.Shutdown();
  EXPECT_EQ(c_ready->Await().code(), absl::StatusCode::kCancelled);
}

TEST(ChunkedTransferTest, ShapedBuffersTakeChunksOfTheirDeviceImage) {
  auto rig = MakeRig();
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  absl::StatusOr<DeviceBuffer> b =
      engine.Allocate(0, DeviceBufferSpec{.shape = "f32[10,100]"});
  ASSERT_TRUE(b.ok()) << b.status();
  // The image is padded (tiles of 8x128): larger than the dense array.
  ASSERT_GT(b->size(), b->host_size());
  std::vector<char> image = Pattern(b->size(), 6);
  ASSERT_TRUE(engine.BeginChunkedTransfer(*b).ok());
  const uint64_t half = b->size() / 2;
  ASSERT_TRUE(engine.TransferChunk(image.data(), *b, 0, half, false).ok());
  absl::StatusOr<TransferEvents> last = engine.TransferChunk(
      image.data() + half, *b, half, b->size() - half, true);
  ASSERT_TRUE(last.ok()) << last.status();
  absl::StatusOr<Event> ready = engine.BufferReadyEvent(*b);
  ASSERT_TRUE(ready.ok());
  EXPECT_TRUE(ready->Await().ok());
  EXPECT_TRUE(ReadBack(engine, *b, b->size()) == image);
  // Past the image's end is past the buffer's end.
  ASSERT_TRUE(engine.BeginChunkedTransfer(*b).ok());
  EXPECT_EQ(engine.TransferChunk(image.data(), *b, 0, b->size() + 1, true)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A producer that gives up (PJRT's SetBufferError): the waiters see its
// error, with the bytes no chunk covered, instead of waiting forever.
TEST(ChunkedTransferTest, AbortFailsTheReadyEventNamingTheMissingBytes) {
  auto rig = MakeRig();
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  const uint64_t n = 4 * kKiB;
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, n);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(engine.BeginChunkedTransfer(*b).ok());
  std::vector<char> src = Pattern(n, 5);
  // Two chunks that overlap: 1536 bytes covered, 2560 missing.
  absl::StatusOr<TransferEvents> first =
      engine.TransferChunk(src.data(), *b, 0, kKiB, false);
  absl::StatusOr<TransferEvents> second =
      engine.TransferChunk(src.data() + 512, *b, 512, kKiB, false);
  ASSERT_TRUE(first.ok() && second.ok());
  absl::StatusOr<Event> ready = engine.BufferReadyEvent(*b);
  ASSERT_TRUE(ready.ok());
  ASSERT_TRUE(engine
                  .AbortChunkedTransfer(
                      *b, absl::AbortedError("the input pipeline stopped"))
                  .ok());
  // Bounded, so that a ready event that never resolves fails the test
  // instead of hanging it (a guard, not a timing claim).
  const std::optional<absl::Status> got =
      ready->AwaitWithTimeout(absl::Seconds(30));
  ASSERT_TRUE(got.has_value()) << "the ready event never resolved";
  const absl::Status s = *got;
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(s.message(), HasSubstr("the input pipeline stopped"));
  EXPECT_THAT(s.message(),
              HasSubstr("2560 of the buffer's 4096 bytes never came (2 chunks "
                        "gave 1536 bytes)"));
  // The chunks given still ran; the buffer stays failed from then on.
  EXPECT_TRUE(first->ready.Await().ok());
  EXPECT_TRUE(second->ready.Await().ok());
  absl::StatusOr<Event> later = engine.BufferReadyEvent(*b);
  ASSERT_TRUE(later.ok());
  EXPECT_EQ(later->Await().code(), absl::StatusCode::kAborted);
  // Closed: a later chunk is refused until another Begin.
  EXPECT_EQ(engine.TransferChunk(src.data(), *b, 0, n, true).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ChunkedTransferTest, AbortNamedErrorsChangeNothing) {
  auto rig = MakeRig();
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, 4 * kKiB);
  ASSERT_TRUE(b.ok());
  // Nothing open.
  absl::Status none = engine.AbortChunkedTransfer(*b, absl::AbortedError("x"));
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.message(), HasSubstr("no chunked transfer"));
  ASSERT_TRUE(engine.BeginChunkedTransfer(*b).ok());
  // An OK error is no error to give.
  absl::Status ok = engine.AbortChunkedTransfer(*b, absl::OkStatus());
  EXPECT_EQ(ok.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ok.message(), HasSubstr("the error is OK"));
  EXPECT_EQ(engine.AbortChunkedTransfer(DeviceBuffer(), absl::AbortedError("x"))
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Still open: the last chunk completes it as usual.
  std::vector<char> src = Pattern(4 * kKiB, 6);
  absl::StatusOr<TransferEvents> last =
      engine.TransferChunk(src.data(), *b, 0, 4 * kKiB, true);
  ASSERT_TRUE(last.ok());
  absl::StatusOr<Event> ready = engine.BufferReadyEvent(*b);
  ASSERT_TRUE(ready.ok());
  EXPECT_TRUE(ready->Await().ok());
  // Closed by its last chunk: nothing to abort.
  EXPECT_EQ(engine.AbortChunkedTransfer(*b, absl::AbortedError("x")).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ChunkedTransferTest, DeallocatingBeforeTheLastNamesTheMissingBytes) {
  auto rig = MakeRig();
  ASSERT_NE(rig, nullptr);
  TransferEngine& engine = rig->engine();
  absl::StatusOr<DeviceBuffer> b = engine.Allocate(0, 4 * kKiB);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(engine.BeginChunkedTransfer(*b).ok());
  std::vector<char> src = Pattern(kKiB, 7);
  absl::StatusOr<TransferEvents> one =
      engine.TransferChunk(src.data(), *b, 3 * kKiB, kKiB, false);
  ASSERT_TRUE(one.ok());
  absl::StatusOr<Event> ready = engine.BufferReadyEvent(*b);
  ASSERT_TRUE(ready.ok());
  absl::StatusOr<Event> freed = engine.Deallocate(*b);
  ASSERT_TRUE(freed.ok());
  EXPECT_TRUE(freed->Await().ok());
  const absl::Status s = ready->Await();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(s.message(),
              HasSubstr("3072 of the buffer's 4096 bytes never came (1 chunk "
                        "gave 1024 bytes)"));
}

}  // namespace
}  // namespace tpushim
