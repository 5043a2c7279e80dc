#include "tools/demo/shapes.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "device/xla_shape.h"

namespace tpushim::tools::demo_internal {
namespace {

// Activations are replaced every step; gradients are held every 4th.
constexpr int64_t kGradsEvery = 4;
constexpr uint64_t kMaxDivisor = 1024;

// The padded and unpadded bytes of `shape` (valid by construction).
ShapeSizes SizesOf(const std::string& shape) {
  absl::StatusOr<Shape> parsed = ParseShape(shape);
  if (!parsed.ok()) return {};
  absl::StatusOr<ShapeSizes> sizes = ComputeSizes(*parsed);
  return sizes.ok() ? *sizes : ShapeSizes{};
}

// Pseudo-random 32-bit words (a 64-bit LCG's high halves).
void Fill(std::vector<uint32_t>& v, uint64_t seed) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (uint32_t& w : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    w = static_cast<uint32_t>(x >> 32);
  }
}

}  // namespace

std::string ShapedModel::Scaled(std::vector<int64_t> dims,
                                const std::string& type) const {
  dims[0] =
      std::max<int64_t>(1, dims[0] / static_cast<int64_t>(report_.divisor));
  return absl::StrCat(type, "[", absl::StrJoin(dims, ","), "]");
}

ShapedModel::ShapedModel(System& system) : system_(system) {
  uint64_t smallest_hbm = UINT64_MAX;
  for (int d = 0; d < system.device_count(); ++d) {
    smallest_hbm = std::min(smallest_hbm, system.device(d).hbm_bytes);
  }
  for (report_.divisor = 1;; report_.divisor *= 2) {
    params_ = {
        {Scaled({32000, 1024}, "bf16"), "params/embedding", ""},
        {Scaled({1024, 4096}, "f32"), "params/dense_1/kernel", ""},
        {Scaled({4096}, "f32"), "params/dense_1/bias", ""},
        {Scaled({4096, 1024}, "f32"), "params/dense_2/kernel", ""},
        {Scaled({8, 16, 130, 130}, "f32"), "attention/scores",
         "op_type=\"Softmax\" op_name=\"model/attention/softmax\""},
        {Scaled({65536, 10}, "s32"), "loss/one_hot",
         "op_type=\"OneHot\" op_name=\"model/loss/one_hot\""},
    };
    activations_ = {Scaled({64, 128, 1024}, "bf16"), "activations", ""};
    grads_ = {Scaled({1024, 4096}, "f32"), "grads/all_reduce",
              "op_type=\"AllReduce\" op_name=\"train/grads/all_reduce\""};
    uint64_t total = SizesOf(activations_.shape).padded_bytes +
                     SizesOf(grads_.shape).padded_bytes;
    for (const Array& a : params_) total += SizesOf(a.shape).padded_bytes;
    if (total <= smallest_hbm / 4 || report_.divisor >= kMaxDivisor) break;
  }
  report_.arrays = static_cast<int>(params_.size());
  for (const Array& a : params_) {
    const ShapeSizes s = SizesOf(a.shape);
    if (s.unpadded_bytes == 0) continue;
    // The worst: the largest padding by ratio.
    if (report_.worst_shape.empty() ||
        s.padded_bytes * report_.worst_unpadded >
            report_.worst_padded * s.unpadded_bytes) {
      absl::StatusOr<ArrayShape> shape = ParseArrayShape(a.shape);
      if (!shape.ok()) continue;
      report_.worst_shape = ToString(*shape);
      report_.worst_label = a.label;
      report_.worst_padded = s.padded_bytes;
      report_.worst_unpadded = s.unpadded_bytes;
      report_.worst_hint = ExplainPadding(*shape).text;
    }
  }
}

absl::StatusOr<DeviceBuffer> ShapedModel::Allocate(int device, const Array& a) {
  DeviceBufferSpec spec;
  spec.shape = a.shape;
  spec.label = a.label;
  spec.op_metadata = a.op_metadata;
  return system_.AllocateDevice(device, spec);
}

absl::Status ShapedModel::Load() {
  for (int d = 0; d < system_.device_count(); ++d) {
    std::vector<DeviceBuffer> on_device;
    for (const Array& a : params_) {
      TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer b, Allocate(d, a));
      held_.push_back(b);
      on_device.push_back(b);
    }
    // params_[5] is the one-hot tensor, params_[1] the first kernel.
    TPUSHIM_RETURN_IF_ERROR(MoveArrays(d, on_device[5], on_device[1]));
  }
  return absl::OkStatus();
}

absl::Status ShapedModel::MoveArrays(int device, const DeviceBuffer& one_hot,
                                     const DeviceBuffer& kernel) {
  std::vector<uint32_t> up(one_hot.host_size() / sizeof(uint32_t));
  std::vector<uint32_t> weights(kernel.host_size() / sizeof(uint32_t));
  Fill(up, 2 * device + 1);
  Fill(weights, 2 * device + 2);
  std::vector<uint32_t> back(up.size());
  // Every transfer submitted is awaited before the host arrays go, whatever
  // failed; the first error is returned.
  std::vector<Event> submitted;
  absl::Status status;
  auto submit = [&](absl::StatusOr<Event> e) {
    if (!e.ok()) {
      if (status.ok()) status = e.status();
      return;
    }
    submitted.push_back(*e);
  };
  submit(system_.TransferArrayToDevice(up.data(), one_hot));
  submit(system_.TransferArrayToDevice(weights.data(), kernel));
  if (status.ok()) {
    submit(system_.TransferArrayFromDevice(one_hot, back.data(),
                                           {submitted.front()}));
  }
  for (Event& e : submitted) {
    absl::Status done = e.Await();
    if (status.ok()) status = done;
  }
  report_.array_transfers += submitted.size();
  TPUSHIM_RETURN_IF_ERROR(status);
  if (std::memcmp(up.data(), back.data(), up.size() * sizeof(uint32_t)) != 0) {
    report_.round_trips_exact = false;
    return absl::DataLossError(absl::StrCat("the array ", one_hot.shape(),
                                            " came back from device ", device,
                                            " different from what went up"));
  }
  return absl::OkStatus();
}

absl::Status ShapedModel::Step(int64_t k) {
  std::vector<DeviceBuffer> previous;
  previous.swap(step_);
  // The previous step's buffers are gone before this step's are made, as
  // a framework's allocator reuses a step's memory: the memory profile
  // (and its peak) is then the same in every run, whatever the load.
  std::vector<Event> freed;
  for (const DeviceBuffer& b : previous) {
    TPUSHIM_ASSIGN_OR_RETURN(Event e, system_.Deallocate(b));
    freed.push_back(std::move(e));
  }
  for (const Event& e : freed) TPUSHIM_RETURN_IF_ERROR(e.Await());
  Array activations = activations_;
  activations.label = absl::StrCat("activations/step_", k);
  for (int d = 0; d < system_.device_count(); ++d) {
    TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer b, Allocate(d, activations));
    step_.push_back(b);
    if (k % kGradsEvery == kGradsEvery - 1) {
      TPUSHIM_ASSIGN_OR_RETURN(DeviceBuffer g, Allocate(d, grads_));
      step_.push_back(g);
    }
  }
  return absl::OkStatus();
}

void ShapedModel::Release() {
  if (released_) return;
  released_ = true;
  report_.devices = system_.GetStats().devices;
  for (const std::vector<DeviceBuffer>* list : {&step_, &held_}) {
    for (const DeviceBuffer& b : *list) (void)system_.Deallocate(b);
  }
  step_.clear();
  held_.clear();
}

}  // namespace tpushim::tools::demo_internal
