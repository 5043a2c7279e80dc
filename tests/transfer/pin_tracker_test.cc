// PinTracker: reference-counted pinning of caller pages. The OS layer is a
// FaultInjectingOs over the real one (so pages really get mlock'ed), with a
// recorder on top that keeps the exact (address, length) pairs pinned and
// checks that every unpin matches one of them.

#include "transfer/pin_tracker.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "env/fault_injection.h"
#include "env/os.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/scoped_test_logging.h"

namespace tpushim {
namespace {

// Records the ranges pinned through it, and complains about a pin that
// overlaps a live one (the tracker pins each page once) and an unpin that
// is not exactly a live pin.
class RecordingOs : public OsWrapper {
 public:
  explicit RecordingOs(Os* target) : OsWrapper(target) {}

  absl::Status PinRange(const void* addr, size_t length) override {
    absl::Status s = OsWrapper::PinRange(addr, length);
    if (!s.ok()) return s;
    const uintptr_t b = reinterpret_cast<uintptr_t>(addr);
    MutexLock lock(&mu_);
    ++pin_calls_;
    auto next = live_.lower_bound(b);
    if ((next != live_.end() && next->first < b + length) ||
        (next != live_.begin() && std::prev(next)->second > b)) {
      errors_.push_back(absl::StrCat("pin of [", b, ", ", b + length,
                                     ") overlaps a live pin"));
    }
    live_[b] = b + length;
    return s;
  }

  absl::Status UnpinRange(const void* addr, size_t length) override {
    const uintptr_t b = reinterpret_cast<uintptr_t>(addr);
    {
      MutexLock lock(&mu_);
      ++unpin_calls_;
      auto it = live_.find(b);
      if (it == live_.end() || it->second != b + length) {
        errors_.push_back(absl::StrCat("unpin of [", b, ", ", b + length,
                                       ") is not a live pin"));
      } else {
        live_.erase(it);
      }
    }
    return OsWrapper::UnpinRange(addr, length);
  }

  // Live pins, begin -> end.
  std::map<uintptr_t, uintptr_t> live() const {
    MutexLock lock(&mu_);
    return live_;
  }
  // True when every byte of [b, e) is pinned.
  bool Covers(uintptr_t b, uintptr_t e) const {
    MutexLock lock(&mu_);
    auto it = live_.upper_bound(b);
    if (it == live_.begin()) return false;
    --it;
    uintptr_t cursor = b;
    for (; it != live_.end() && it->first <= cursor && cursor < e; ++it) {
      cursor = std::max(cursor, it->second);
    }
    return cursor >= e;
  }
  std::vector<std::string> errors() const {
    MutexLock lock(&mu_);
    return errors_;
  }
  int pin_calls() const {
    MutexLock lock(&mu_);
    return pin_calls_;
  }
  int unpin_calls() const {
    MutexLock lock(&mu_);
    return unpin_calls_;
  }

 private:
  mutable Mutex mu_;
  std::map<uintptr_t, uintptr_t> live_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> errors_ ABSL_GUARDED_BY(mu_);
  int pin_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int unpin_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

constexpr int kPages = 64;

class PinTrackerTest : public ::testing::Test {
 protected:
  void SetUp() override { Build(""); }

  // (Re)builds the OS stack with fault spec `spec`.
  void Build(const std::string& spec) {
    absl::StatusOr<FaultSpec> parsed = ParseFaultSpec(spec);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    faults_ = std::make_unique<FaultInjector>(*parsed);
    fos_ = std::make_unique<FaultInjectingOs>(Os::Default(), faults_.get());
    os_ = std::make_unique<RecordingOs>(fos_.get());
    page_ = Os::Default()->PageSize();
    if (buffer_ == nullptr) {
      void* p = mmap(nullptr, kPages * page_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      ASSERT_NE(p, MAP_FAILED);
      buffer_ = static_cast<char*>(p);
    }
  }

  void TearDown() override {
    if (os_ != nullptr) {
      EXPECT_EQ(os_->errors(), std::vector<std::string>{});
    }
    if (buffer_ != nullptr) munmap(buffer_, kPages * page_);
  }

  char* page(int i) { return buffer_ + static_cast<size_t>(i) * page_; }
  uintptr_t addr(int i) { return reinterpret_cast<uintptr_t>(page(i)); }
  uint64_t pages(int n) { return static_cast<uint64_t>(n) * page_; }

  // Checks that the tracker and both OS layers agree on `n` pinned pages.
  void ExpectPinnedPages(const PinTracker& t, int n, size_t segments) {
    EXPECT_EQ(t.pinned_bytes(), pages(n));
    EXPECT_EQ(fos_->pinned_bytes(), pages(n));
    EXPECT_EQ(t.segments(), segments);
    EXPECT_EQ(os_->live().size(), segments);
  }

  std::unique_ptr<FaultInjector> faults_;
  std::unique_ptr<FaultInjectingOs> fos_;
  std::unique_ptr<RecordingOs> os_;
  size_t page_ = 0;
  char* buffer_ = nullptr;
};

TEST_F(PinTrackerTest, UnalignedRangePinsThePageHull) {
  PinTracker t(os_.get());
  // 2 pages' worth starting 100 bytes into page 1: pages 1..3.
  auto a = t.Pin(page(1) + 100, pages(2));
  ASSERT_TRUE(a.ok()) << a.status();
  ExpectPinnedPages(t, 3, 1);
  EXPECT_EQ(os_->live(), (std::map<uintptr_t, uintptr_t>{{addr(1), addr(4)}}));
  EXPECT_EQ(a->segments, std::vector<uintptr_t>{addr(1)});

  // One byte at the end of page 9: page 9 only.
  auto b = t.Pin(page(10) - 1, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectPinnedPages(t, 4, 2);
  EXPECT_TRUE(os_->Covers(addr(9), addr(10)));
  EXPECT_FALSE(os_->Covers(addr(8), addr(10)));

  // Two bytes across the 11/12 boundary: pages 11 and 12.
  auto c = t.Pin(page(12) - 1, 2);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectPinnedPages(t, 6, 3);
  EXPECT_TRUE(os_->Covers(addr(11), addr(13)));

  // Exactly one aligned page.
  auto d = t.Pin(page(20), pages(1));
  ASSERT_TRUE(d.ok()) << d.status();
  ExpectPinnedPages(t, 7, 4);

  t.Unpin(*std::move(a));
  ExpectPinnedPages(t, 4, 3);
  t.Unpin(*std::move(b));
  t.Unpin(*std::move(c));
  t.Unpin(*std::move(d));
  ExpectPinnedPages(t, 0, 0);
  EXPECT_EQ(os_->pin_calls(), 4);
  EXPECT_EQ(os_->unpin_calls(), 4);
}

TEST_F(PinTrackerTest, RangeInsideOnePinnedPageAddsNoPin) {
  PinTracker t(os_.get());
  auto a = t.Pin(page(3) + 10, 20);
  ASSERT_TRUE(a.ok());
  auto b = t.Pin(page(3) + 500, 1000);
  ASSERT_TRUE(b.ok());
  ExpectPinnedPages(t, 1, 1);
  EXPECT_EQ(os_->pin_calls(), 1);
  t.Unpin(*std::move(a));
  ExpectPinnedPages(t, 1, 1);  // b still uses it
  EXPECT_EQ(os_->unpin_calls(), 0);
  t.Unpin(*std::move(b));
  ExpectPinnedPages(t, 0, 0);
}

TEST_F(PinTrackerTest, OverlappingLeasesFirstUnpinKeepsPages) {
  for (bool first_unpinned_first : {true, false}) {
    SCOPED_TRACE(first_unpinned_first ? "A then B" : "B then A");
    PinTracker t(os_.get());
    auto a = t.Pin(page(0), pages(4));  // pages 0..3
    ASSERT_TRUE(a.ok());
    auto b = t.Pin(page(2) + 7, pages(4));  // pages 2..6
    ASSERT_TRUE(b.ok());
    // B pinned only what was missing: pages 4..6.
    ExpectPinnedPages(t, 7, 2);
    EXPECT_EQ(os_->live(), (std::map<uintptr_t, uintptr_t>{
                               {addr(0), addr(4)}, {addr(4), addr(7)}}));
    EXPECT_EQ(b->segments, (std::vector<uintptr_t>{addr(0), addr(4)}));

    if (first_unpinned_first) {
      t.Unpin(*std::move(a));
      // B still uses segment [0, 4): nothing is unpinned.
      ExpectPinnedPages(t, 7, 2);
      EXPECT_TRUE(os_->Covers(addr(2), addr(7)));
      t.Unpin(*std::move(b));
    } else {
      t.Unpin(*std::move(b));
      // [4, 7) had only B; [0, 4) still has A.
      ExpectPinnedPages(t, 4, 1);
      EXPECT_TRUE(os_->Covers(addr(0), addr(4)));
      t.Unpin(*std::move(a));
    }
    ExpectPinnedPages(t, 0, 0);
    // Every pin was undone by exactly its own (address, length).
    EXPECT_EQ(fos_->pinned_bytes(), 0u);
  }
  EXPECT_EQ(os_->pin_calls(), os_->unpin_calls());
}

TEST_F(PinTrackerTest, AdjacentLeasesStayIndependent) {
  PinTracker t(os_.get());
  auto a = t.Pin(page(0), pages(2));
  auto b = t.Pin(page(2), pages(2));
  ASSERT_TRUE(a.ok() && b.ok());
  ExpectPinnedPages(t, 4, 2);
  EXPECT_EQ(b->segments, std::vector<uintptr_t>{addr(2)});
  t.Unpin(*std::move(a));
  ExpectPinnedPages(t, 2, 1);
  EXPECT_TRUE(os_->Covers(addr(2), addr(4)));
  t.Unpin(*std::move(b));
  ExpectPinnedPages(t, 0, 0);
}

TEST_F(PinTrackerTest, LeaseCoveringTwoSegmentsAndGaps) {
  PinTracker t(os_.get());
  auto s1 = t.Pin(page(2), pages(2));  // [2, 4)
  auto s2 = t.Pin(page(6), pages(2));  // [6, 8)
  ASSERT_TRUE(s1.ok() && s2.ok());
  ExpectPinnedPages(t, 4, 2);

  // [0, 10): gaps [0, 2), [4, 6), [8, 10) get pinned, the segments counted.
  auto big = t.Pin(page(0) + 1, pages(10) - 2);
  ASSERT_TRUE(big.ok()) << big.status();
  ExpectPinnedPages(t, 10, 5);
  EXPECT_EQ(big->segments, (std::vector<uintptr_t>{addr(0), addr(2), addr(4),
                                                   addr(6), addr(8)}));
  EXPECT_EQ(os_->live(),
            (std::map<uintptr_t, uintptr_t>{{addr(0), addr(2)},
                                            {addr(2), addr(4)},
                                            {addr(4), addr(6)},
                                            {addr(6), addr(8)},
                                            {addr(8), addr(10)}}));
  EXPECT_EQ(os_->pin_calls(), 5);

  t.Unpin(*std::move(s1));
  t.Unpin(*std::move(s2));
  // The big lease still uses all five.
  ExpectPinnedPages(t, 10, 5);
  EXPECT_EQ(os_->unpin_calls(), 0);

  // A lease starting in the middle of a segment counts that segment.
  auto mid = t.Pin(page(3) + 5, pages(4));  // pages 3..7
  ASSERT_TRUE(mid.ok());
  EXPECT_EQ(mid->segments,
            (std::vector<uintptr_t>{addr(2), addr(4), addr(6)}));
  ExpectPinnedPages(t, 10, 5);
  t.Unpin(*std::move(big));
  ExpectPinnedPages(t, 6, 3);  // [2, 8)
  t.Unpin(*std::move(mid));
  ExpectPinnedPages(t, 0, 0);
  EXPECT_EQ(os_->unpin_calls(), 5);
}

TEST_F(PinTrackerTest, FailingPinInTheMiddleUndoesEverything) {
  Build("pin:nth=2");
  PinTracker t(os_.get());
  // Two existing segments, each pinned as call 1 after a counter reset, so
  // that the spec's call 2 is the second gap of the big pin below.
  auto s1 = t.Pin(page(2), pages(2));  // [2, 4)
  ASSERT_TRUE(s1.ok()) << s1.status();
  faults_->Reset();
  auto s2 = t.Pin(page(6), pages(2));  // [6, 8)
  ASSERT_TRUE(s2.ok()) << s2.status();
  faults_->Reset();
  ExpectPinnedPages(t, 4, 2);
  const auto live_before = os_->live();

  // Gaps [0, 2) (call 1, OK), [4, 6) (call 2, fails), [8, 10) (not tried).
  auto big = t.Pin(page(0), pages(10));
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted)
      << big.status();
  EXPECT_NE(big.status().message().find("injected"), std::string::npos)
      << big.status();
  EXPECT_EQ(faults_->calls(FaultPoint::kPin), 2u);
  EXPECT_EQ(faults_->injected(FaultPoint::kPin), 1u);

  // Exactly as before: same segments, same bytes, the first gap unpinned.
  ExpectPinnedPages(t, 4, 2);
  EXPECT_EQ(os_->live(), live_before);
  EXPECT_EQ(os_->unpin_calls(), 1);

  // And the use counts are back: each old lease alone unpins its segment.
  t.Unpin(*std::move(s1));
  ExpectPinnedPages(t, 2, 1);
  EXPECT_FALSE(os_->Covers(addr(2), addr(4)));
  t.Unpin(*std::move(s2));
  ExpectPinnedPages(t, 0, 0);

  // The tracker still works (call 3 is not injected).
  auto again = t.Pin(page(0), pages(10));
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectPinnedPages(t, 10, 1);
  t.Unpin(*std::move(again));
  ExpectPinnedPages(t, 0, 0);
}

TEST_F(PinTrackerTest, FailingFirstPinLeavesNothing) {
  Build("pin:nth=1");
  PinTracker t(os_.get());
  auto a = t.Pin(page(0) + 3, pages(3));
  ASSERT_FALSE(a.ok());
  ExpectPinnedPages(t, 0, 0);
  auto b = t.Pin(page(0) + 3, pages(3));
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectPinnedPages(t, 4, 1);
  t.Unpin(*std::move(b));
  ExpectPinnedPages(t, 0, 0);
}

TEST_F(PinTrackerTest, DestructorUnpinsLeftovers) {
  {
    PinTracker t(os_.get());
    auto a = t.Pin(page(0), pages(3));
    auto b = t.Pin(page(1), pages(5));
    auto c = t.Pin(page(30) + 1, 1);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    ExpectPinnedPages(t, 7, 3);
    // Leases deliberately not returned.
  }
  EXPECT_EQ(fos_->pinned_bytes(), 0u);
  EXPECT_TRUE(os_->live().empty());
  EXPECT_EQ(os_->unpin_calls(), 3);
}

// A reference model of the documented semantics, page by page: each pinned
// page belongs to one segment; a Pin counts its lease on every segment its
// page hull touches and makes each maximal run of unpinned pages in the
// hull a new segment; a segment goes when its last lease does.
class Model {
 public:
  // Returns the lease's segment ids.
  std::vector<int> Pin(int first, int last) {  // pages [first, last]
    std::vector<int> touched;
    int p = first;
    while (p <= last) {
      if (owner_[p] >= 0) {
        const int s = owner_[p];
        if (touched.empty() || touched.back() != s) touched.push_back(s);
        ++p;
        continue;
      }
      const int s = next_id_++;
      while (p <= last && owner_[p] < 0) owner_[p++] = s;
      touched.push_back(s);
    }
    for (int s : touched) ++users_[s];
    return touched;
  }
  void Unpin(const std::vector<int>& segs) {
    for (int s : segs) {
      if (--users_[s] > 0) continue;
      users_.erase(s);
      for (int& o : owner_) {
        if (o == s) o = -1;
      }
    }
  }
  int pinned_pages() const {
    return static_cast<int>(
        std::count_if(owner_.begin(), owner_.end(), [](int o) { return o >= 0; }));
  }
  size_t segments() const { return users_.size(); }
  bool pinned(int p) const { return owner_[p] >= 0; }

 private:
  std::vector<int> owner_ = std::vector<int>(kPages, -1);
  std::map<int, int> users_;
  int next_id_ = 0;
};

// An OS layer whose PinRange of one chosen address blocks until the test
// opens the gate: a pin that takes long, as mlock of a large buffer does.
class GatedOs : public OsWrapper {
 public:
  GatedOs(Os* target, uintptr_t gated) : OsWrapper(target), gated_(gated) {}
  absl::Status PinRange(const void* addr, size_t length) override {
    if (reinterpret_cast<uintptr_t>(addr) == gated_) {
      entered_.Notify();
      gate_.WaitForNotification();
    }
    return OsWrapper::PinRange(addr, length);
  }
  Notification entered_;  // the gated pin has started
  Notification gate_;     // let it finish

 private:
  const uintptr_t gated_;
};

TEST_F(PinTrackerTest, ASlowPinDoesNotHoldUpPinsOfOtherPages) {
  GatedOs gated(os_.get(), addr(0));
  PinTracker t(&gated);
  absl::StatusOr<PinTracker::Lease> slow;
  std::thread slow_pin([&] { slow = t.Pin(page(0), pages(8)); });
  gated.entered_.WaitForNotification();
  // Other pages: pinned and unpinned while the slow pin is in its syscall.
  absl::StatusOr<PinTracker::Lease> other = t.Pin(page(16), pages(2));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(os_->Covers(addr(16), addr(18)));
  t.Unpin(*std::move(other));
  EXPECT_FALSE(os_->Covers(addr(16), addr(18)));
  gated.gate_.Notify();
  slow_pin.join();
  ASSERT_TRUE(slow.ok()) << slow.status();
  t.Unpin(*std::move(slow));
  ExpectPinnedPages(t, 0, 0);
}

TEST_F(PinTrackerTest, APinOfPagesBeingPinnedWaitsForThemAndSharesThem) {
  GatedOs gated(os_.get(), addr(0));
  PinTracker t(&gated);
  absl::StatusOr<PinTracker::Lease> first;
  std::thread first_pin([&] { first = t.Pin(page(0), pages(4)); });
  gated.entered_.WaitForNotification();
  std::atomic<bool> second_done{false};
  absl::StatusOr<PinTracker::Lease> second;
  std::thread second_pin([&] {
    second = t.Pin(page(2), pages(4));  // overlaps pages 2 and 3
    second_done = true;
  });
  // It cannot finish while pages 2-3 are still being pinned.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(second_done.load());
  gated.gate_.Notify();
  first_pin.join();
  second_pin.join();
  ASSERT_TRUE(first.ok() && second.ok());
  // Pages 0-3 pinned once, 4-5 once more: two segments, six pages.
  ExpectPinnedPages(t, 6, 2);
  t.Unpin(*std::move(first));
  EXPECT_TRUE(os_->Covers(addr(0), addr(6)));  // the second keeps them
  t.Unpin(*std::move(second));
  ExpectPinnedPages(t, 0, 0);
}

TEST_F(PinTrackerTest, RandomizedAgainstModel) {
  for (uint32_t seed : {1u, 7u, 42u, 2024u}) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    std::mt19937 rng(seed);
    PinTracker t(os_.get());
    Model model;
    struct Live {
      PinTracker::Lease lease;
      std::vector<int> model_segments;
      int first_page, last_page;
    };
    std::vector<Live> live;
    const size_t bytes = static_cast<size_t>(kPages) * page_;
    for (int step = 0; step < 1500; ++step) {
      const bool pin = live.empty() || (live.size() < 24 && rng() % 2 == 0);
      if (pin) {
        // Mostly short ranges, sometimes long ones, at byte granularity.
        const size_t max_len = rng() % 8 == 0 ? bytes : 6 * page_;
        const size_t off = rng() % bytes;
        const size_t len = 1 + rng() % std::min(max_len, bytes - off);
        auto lease = t.Pin(buffer_ + off, len);
        ASSERT_TRUE(lease.ok()) << lease.status();
        const int first = static_cast<int>(off / page_);
        const int last = static_cast<int>((off + len - 1) / page_);
        live.push_back({*std::move(lease), model.Pin(first, last), first, last});
        EXPECT_EQ(live.back().lease.segments.size(),
                  live.back().model_segments.size());
      } else {
        const size_t i = rng() % live.size();
        std::swap(live[i], live.back());
        t.Unpin(std::move(live.back().lease));
        model.Unpin(live.back().model_segments);
        live.pop_back();
      }
      // The pinned pages are exactly the model's; every live lease's hull
      // is pinned; every pinned segment has a live user.
      const std::map<uintptr_t, uintptr_t> pins = os_->live();
      std::vector<bool> pinned(kPages, false);
      for (const auto& [b, e] : pins) {
        for (uintptr_t a = b; a < e; a += page_) {
          pinned[(a - addr(0)) / page_] = true;
        }
      }
      for (int p = 0; p < kPages; ++p) {
        ASSERT_EQ(pinned[p], model.pinned(p)) << "page " << p << " step "
                                              << step;
      }
      std::set<int> in_live_hulls;
      for (const Live& l : live) {
        ASSERT_TRUE(os_->Covers(addr(l.first_page), addr(l.last_page + 1)))
            << "step " << step;
        for (int p = l.first_page; p <= l.last_page; ++p) in_live_hulls.insert(p);
      }
      for (const auto& [b, e] : pins) {
        bool used = false;
        for (uintptr_t a = b; a < e && !used; a += page_) {
          used = in_live_hulls.count(static_cast<int>((a - addr(0)) / page_));
        }
        ASSERT_TRUE(used) << "a segment with no live lease, step " << step;
      }
      ASSERT_EQ(t.pinned_bytes(), pages(model.pinned_pages())) << step;
      ASSERT_EQ(fos_->pinned_bytes(), pages(model.pinned_pages())) << step;
      ASSERT_EQ(t.segments(), model.segments()) << step;
      ASSERT_EQ(pins.size(), model.segments()) << step;
    }
    // Unpin the rest in random order.
    std::shuffle(live.begin(), live.end(), rng);
    for (Live& l : live) t.Unpin(std::move(l.lease));
    EXPECT_EQ(t.pinned_bytes(), 0u);
    EXPECT_EQ(t.segments(), 0u);
    EXPECT_EQ(fos_->pinned_bytes(), 0u);
    EXPECT_TRUE(os_->live().empty());
  }
  EXPECT_EQ(os_->pin_calls(), os_->unpin_calls());
}

TEST_F(PinTrackerTest, ConcurrentPinAndUnpin) {
  PinTracker t(os_.get());
  constexpr int kThreads = 4;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      std::mt19937 rng(100 + th);
      const size_t bytes = static_cast<size_t>(kPages) * page_;
      std::vector<std::pair<PinTracker::Lease, std::pair<uintptr_t, uintptr_t>>>
          held;
      for (int i = 0; i < 1000; ++i) {
        if (held.size() < 3 && (held.empty() || rng() % 2 == 0)) {
          const size_t off = rng() % bytes;
          const size_t len = 1 + rng() % std::min(8 * page_, bytes - off);
          auto lease = t.Pin(buffer_ + off, len);
          if (!lease.ok()) {
            failures.fetch_add(1);
            continue;
          }
          const uintptr_t b = (addr(0) + off) & ~(page_ - 1);
          const uintptr_t e = (addr(0) + off + len + page_ - 1) & ~(page_ - 1);
          // Our pages stay pinned whatever the other threads do.
          if (!os_->Covers(b, e)) failures.fetch_add(1);
          held.push_back({*std::move(lease), {b, e}});
        } else {
          const size_t k = rng() % held.size();
          if (!os_->Covers(held[k].second.first, held[k].second.second)) {
            failures.fetch_add(1);
          }
          std::swap(held[k], held.back());
          t.Unpin(std::move(held.back().first));
          held.pop_back();
        }
      }
      for (auto& h : held) t.Unpin(std::move(h.first));
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(t.pinned_bytes(), 0u);
  EXPECT_EQ(t.segments(), 0u);
  EXPECT_EQ(fos_->pinned_bytes(), 0u);
  EXPECT_TRUE(os_->live().empty());
  EXPECT_EQ(os_->pin_calls(), os_->unpin_calls());
}

// Why pins are mlock()s rather than the long-term pin is logged once, at
// INFO, by the first pin after the OS layer found out.
TEST(PinTrackerNoteTest, WhyPinsAreMlocksIsLoggedOnceAtInfo) {
  class NoteOs : public OsWrapper {
   public:
    NoteOs() : OsWrapper(Os::Default()) {}
    std::string TakePinNote() override {
      return std::exchange(note_, std::string());
    }

   private:
    std::string note_ = "pins are mlocks here: the probe said so";
  };
  testutil::ScopedTestLogging logs;
  NoteOs os;
  std::vector<char> memory(3 * 4096);
  PinTracker t(&os);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<PinTracker::Lease> lease =
        t.Pin(memory.data() + i * 4096, 100);
    ASSERT_TRUE(lease.ok()) << lease.status();
    t.Unpin(*std::move(lease));
  }
  const std::string info = logs.File("INFO");
  EXPECT_THAT(info, ::testing::HasSubstr(
                        "] pins are mlocks here: the probe said so\n"));
  EXPECT_EQ(info.find("the probe said so"), info.rfind("the probe said so"));
  EXPECT_THAT(logs.File("WARNING"),
              ::testing::Not(::testing::HasSubstr("the probe said so")));
}

}  // namespace
}  // namespace tpushim
