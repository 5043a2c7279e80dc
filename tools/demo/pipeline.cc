#include "tools/demo/pipeline.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/human_bytes.h"
#include "common/mutex.h"
#include "env/options.h"
#include "logging/log.h"
#include "tools/cli/interrupt.h"
#include "tools/cli/pseudo_random.h"
#include "tpushim/stats.h"
#include "tpushim/system.h"
#include "tpushim/transfer.h"

namespace tpushim::tools::demo_internal {

// ---- Data ------------------------------------------------------------------

// The XXH3 hash of `p[0, n)` rotated left by `r` bytes (p[r..n) p[0..r)),
// without building it.
uint64_t RotatedHash(const uint8_t* p, uint64_t n, uint64_t r) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(
      XXH3_createState(), &XXH3_freeState);
  if (state == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(state.get());
  XXH3_64bits_update(state.get(), p + r, n - r);
  XXH3_64bits_update(state.get(), p, r);
  return XXH3_64bits_digest(state.get());
}

void Pipeline::RecordError(uint64_t RunCounters::*counter,
                           absl::string_view what, const absl::Status& status) {
  LOG(ERROR) << "tpushim demo: " << what << ": " << status;
  MutexLock lock(&counters_mu_);
  ++(counters_.*counter);
  if (counters_.first_error.empty()) {
    counters_.first_error = absl::StrCat(what, ": ", status.ToString());
  }
}

bool Pipeline::AllocateDeviceBuffers() {
  in_.assign(config_.devices, {});
  out_.assign(config_.devices, {});
  for (int d = 0; d < config_.devices; ++d) {
    for (int slot = 0; slot < kSlots; ++slot) {
      for (auto* role : {&in_, &out_}) {
        absl::StatusOr<DeviceBuffer> b =
            system_.AllocateDevice(d, config_.shard_bytes);
        if (!b.ok()) {
          RecordError(&RunCounters::failed_allocations,
                      absl::StrCat("device buffer on device ", d), b.status());
          return false;
        }
        (*role)[d].push_back(*std::move(b));
      }
    }
  }
  return true;
}

void Pipeline::ReleaseDeviceBuffers() {
  std::vector<Event> freed;
  for (auto* role : {&in_, &out_}) {
    for (std::vector<DeviceBuffer>& buffers : *role) {
      for (const DeviceBuffer& b : buffers) {
        absl::StatusOr<Event> e = system_.Deallocate(b);
        if (e.ok()) freed.push_back(*std::move(e));
      }
    }
  }
  for (const Event& e : freed) (void)e.Await();
  in_.clear();
  out_.clear();
}

void Pipeline::Stop() {
  batches_.Close();
  for (auto& q : device_queues_) q->Close();
  verify_queue_.Close();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

// ---- Producers
// ---------------------------------------------------------------

std::unique_ptr<Batch> Pipeline::MakeBatch(int64_t index) {
  auto batch = std::make_unique<Batch>();
  batch->index = index;
  const uint64_t size = config_.batch_bytes;
  // Odd batches go in pinned host buffers from the premapped region.
  if (index % 2 == 1) {
    uint64_t RunCounters::*fallback = nullptr;
    if (system_.premapped_bytes() == 0) {
      fallback = &RunCounters::fallback_region_off;
    } else if (size > system_.transfer_threshold_bytes()) {
      // The region serves nothing larger (and would log an ERROR for it).
      fallback = &RunCounters::fallback_over_threshold;
    } else {
      absl::StatusOr<PinnedHostBuffer> b =
          system_.AllocatePinnedHost(size, kPinnedAlignment);
      if (b.ok()) {
        batch->pinned = true;
        batch->pinned_buffer = *std::move(b);
        batch->data = static_cast<uint8_t*>(batch->pinned_buffer.data());
      } else if (absl::IsResourceExhausted(b.status())) {
        fallback = &RunCounters::fallback_region_full;
      } else if (absl::IsFailedPrecondition(b.status())) {
        fallback = &RunCounters::fallback_region_off;
      } else {
        RecordError(&RunCounters::failed_allocations,
                    absl::StrCat("pinned host buffer for batch ", index),
                    b.status());
      }
    }
    if (fallback != nullptr) {
      MutexLock lock(&counters_mu_);
      ++(counters_.*fallback);
    }
  }
  if (!batch->pinned) {
    {
      MutexLock lock(&pool_mu_);
      if (!pageable_pool_.empty()) {
        batch->pageable = std::move(pageable_pool_.back());
        pageable_pool_.pop_back();
      }
    }
    if (batch->pageable == nullptr) {
      try {
        batch->pageable = std::make_unique_for_overwrite<uint8_t[]>(size);
      } catch (const std::bad_alloc&) {
        batch->status = absl::ResourceExhaustedError(absl::StrCat(
            "cannot allocate a pageable batch of ", HumanReadableBytes(size)));
        RecordError(&RunCounters::failed_allocations,
                    absl::StrCat("pageable batch ", index), batch->status);
        return batch;
      }
    }
    batch->data = batch->pageable.get();
  }
  {
    MutexLock lock(&counters_mu_);
    ++(batch->pinned ? counters_.batches_pinned : counters_.batches_pageable);
  }

  FillPseudoRandom(batch->data, size, static_cast<uint64_t>(index) + 1);
  const uint64_t n = config_.shard_bytes;
  const uint64_t blocks = n / config_.block_bytes;
  for (int d = 0; d < config_.devices; ++d) {
    // 1 .. blocks-1 blocks, different per batch and device (0 when the
    // shard is a single block).
    const uint64_t r =
        blocks < 2
            ? 0
            : config_.block_bytes * (1 + (static_cast<uint64_t>(index) * 7919 +
                                          static_cast<uint64_t>(d) * 104729) %
                                             (blocks - 1));
    batch->rotation.push_back(r);
    batch->expected_hash.push_back(RotatedHash(batch->data + d * n, n, r));
  }
  return batch;
}

void Pipeline::ReleaseBatch(std::unique_ptr<Batch> batch) {
  if (batch->pageable != nullptr) {
    MutexLock lock(&pool_mu_);
    pageable_pool_.push_back(std::move(batch->pageable));
  }
  batch->pinned_buffer.Reset();
}

void Pipeline::Producer() {
  while (true) {
    const int64_t index = next_batch_.fetch_add(1);
    if (index >= config_.steps) return;
    if (!batches_.Push(MakeBatch(index))) return;
  }
}

// ---- Devices
// -----------------------------------------------------------------

absl::Status Pipeline::ProduceResult(int device, StepWork& work,
                                     ShardWork& shard) {
  const uint64_t n = config_.shard_bytes;
  const uint64_t r = work.batch->rotation[device];
  const DeviceBuffer& src = in_[device][work.slot];
  const DeviceBuffer& dst = out_[(device + 1) % config_.devices][work.slot];
  // The result: the shard rotated left by r, on the next device.
  absl::StatusOr<Event> head =
      system_.TransferDeviceToDevice(src, r, dst, 0, n - r);
  // A shard of one device block is not rotated: it has no tail.
  std::optional<absl::StatusOr<Event>> tail;
  if (r > 0) tail = system_.TransferDeviceToDevice(src, 0, dst, n - r, r);
  const absl::Status head_status = head.ok() ? head->Await() : head.status();
  const absl::Status tail_status =
      !tail.has_value() ? absl::OkStatus()
                        : (tail->ok() ? (*tail)->Await() : tail->status());
  if (!head_status.ok()) return head_status;
  if (!tail_status.ok()) return tail_status;
  absl::StatusOr<Event> down =
      system_.TransferFromDevice(dst, 0, work.batch->data + device * n, n);
  if (!down.ok()) return down.status();
  shard.down = *std::move(down);
  return absl::OkStatus();
}

void Pipeline::DeviceLoop(int device) {
  int64_t free_ns = loop_start_ns_;  // when the device last became idle
  int64_t wait_ns = 0;
  int64_t compute_ns = 0;
  int64_t result_ns = 0;
  const absl::Duration step = absl::Microseconds(config_.step_ms * 1000.0);
  while (std::optional<StepWork*> item = device_queues_[device]->Pop()) {
    StepWork& work = **item;
    ShardWork& shard = work.shards[device];
    absl::Status status = shard.up.ok() ? shard.up->Await() : shard.up.status();
    const int64_t ready_ns = NowNs();
    wait_ns += std::max<int64_t>(0, ready_ns - free_ns);
    if (status.ok()) {
      if (step > absl::ZeroDuration()) absl::SleepFor(step);
      const int64_t compute_end_ns = NowNs();
      compute_ns += compute_end_ns - ready_ns;
      status = ProduceResult(device, work, shard);
      result_ns += NowNs() - compute_end_ns;
    }
    shard.status = status;
    {
      MutexLock lock(&step_mu_);
      --work.devices_left;
      step_cv_.SignalAll();
    }
    free_ns = NowNs();
  }
  MutexLock lock(&counters_mu_);
  counters_.device_wait_ns[device] = wait_ns;
  counters_.device_compute_ns[device] = compute_ns;
  counters_.device_result_ns[device] = result_ns;
}

// ---- Verifier
// ----------------------------------------------------------------

void Pipeline::WaitFor(const StepWork& work, bool StepWork::*flag) {
  MutexLock lock(&step_mu_);
  while (!(work.*flag)) step_cv_.Wait(&step_mu_);
}

void Pipeline::Verifier() {
  while (std::optional<StepWork*> item = verify_queue_.Pop()) {
    StepWork& work = **item;
    {
      MutexLock lock(&step_mu_);
      while (work.devices_left > 0) step_cv_.Wait(&step_mu_);
    }
    for (ShardWork& shard : work.shards) {
      if (shard.status.ok() && shard.down.has_value()) {
        shard.status = shard.down->Await();
      }
    }
    {
      MutexLock lock(&step_mu_);
      work.results_back = true;
      step_cv_.SignalAll();
    }
    const Batch& batch = *work.batch;
    const uint64_t n = config_.shard_bytes;
    for (int d = 0; d < static_cast<int>(work.shards.size()); ++d) {
      const std::string what = absl::StrCat(
          "step ", work.step, " (batch ", batch.index,
          batch.pinned ? ", pinned" : ", pageable", ") device ", d);
      if (!work.shards[d].status.ok()) {
        RecordError(&RunCounters::failed_transfers, what,
                    work.shards[d].status);
        continue;
      }
      const uint64_t hash = XXH3_64bits(batch.data + d * n, n);
      if (hash != batch.expected_hash[d]) {
        RecordError(&RunCounters::hash_mismatches, what,
                    absl::DataLossError(
                        absl::StrFormat("result hash %016x, expected %016x",
                                        hash, batch.expected_hash[d])));
      }
    }
    ReleaseBatch(std::move(work.batch));
    MutexLock lock(&step_mu_);
    work.verified = true;
    step_cv_.SignalAll();
  }
}

// ---- The step loop
// -----------------------------------------------------------

void Pipeline::Run() {
  if (!AllocateDeviceBuffers()) {
    ReleaseDeviceBuffers();
    return;
  }
  loop_start_ns_ = NowNs();
  for (int p = 0; p < config_.producers; ++p) {
    threads_.emplace_back([this] { Producer(); });
  }
  for (int d = 0; d < config_.devices; ++d) {
    threads_.emplace_back([this, d] { DeviceLoop(d); });
  }
  threads_.emplace_back([this] { Verifier(); });

  int64_t producer_wait_ns = 0;
  int64_t result_wait_ns = 0;
  std::deque<std::unique_ptr<StepWork>> in_flight;  // oldest first
  int64_t k = 0;
  int interrupted_by = 0;
  for (; k < config_.steps; ++k) {
    // SIGINT or SIGTERM: the steps issued so far finish and are verified.
    if ((interrupted_by = InterruptSignal()) != 0) break;
    if (step_hook_) {
      absl::Status hooked = step_hook_(k);
      if (!hooked.ok()) {
        RecordError(&RunCounters::failed_allocations, "step buffers", hooked);
      }
    }
    // Slot k % 2 is free once step k-2's results are back; at most three
    // steps are unverified (which bounds the batches alive).
    const int64_t result_wait_start = NowNs();
    if (in_flight.size() >= kSlots) {
      WaitFor(*in_flight[in_flight.size() - kSlots], &StepWork::results_back);
    }
    if (in_flight.size() > kSlots) {
      WaitFor(*in_flight.front(), &StepWork::verified);
      in_flight.pop_front();
    }
    const int64_t wait_start = NowNs();
    result_wait_ns += wait_start - result_wait_start;
    std::optional<std::unique_ptr<Batch>> batch = batches_.Pop();
    producer_wait_ns += NowNs() - wait_start;
    if (!batch.has_value()) break;  // cannot happen: producers make them all

    auto work = std::make_unique<StepWork>();
    work->step = k;
    work->slot = static_cast<int>(k % kSlots);
    work->batch = *std::move(batch);
    if (work->batch->status.ok()) {
      work->shards.resize(config_.devices);
      work->devices_left = config_.devices;
      const uint64_t n = config_.shard_bytes;
      for (int d = 0; d < config_.devices; ++d) {
        work->shards[d].up = system_.TransferToDevice(work->batch->data + d * n,
                                                      in_[d][work->slot], 0, n);
      }
      for (int d = 0; d < config_.devices; ++d) {
        device_queues_[d]->Push(work.get());
      }
    }
    verify_queue_.Push(work.get());
    in_flight.push_back(std::move(work));
  }
  for (const auto& work : in_flight) WaitFor(*work, &StepWork::verified);
  const int64_t loop_end = NowNs();
  Stop();
  ReleaseDeviceBuffers();

  MutexLock lock(&counters_mu_);
  counters_.steps_run = k;
  counters_.interrupted_by = interrupted_by;
  counters_.loop_ns = loop_end - loop_start_ns_;
  counters_.producer_wait_ns = producer_wait_ns;
  counters_.result_wait_ns = result_wait_ns;
}

}  // namespace tpushim::tools::demo_internal
