// `tpushim demo --shapes`: a model-like set of shaped device buffers held
// on every device while the demo's pipeline runs, so that device memory
// behaves as a TPU's does in one command (internal to the tool).
//
// Per device, in TPU's default layouts:
//   params/embedding        bf16[32000,1024]    64.00M, no padding
//   params/dense_1/kernel   f32[1024,4096]      16.00M, no padding
//   params/dense_1/bias     f32[4096]           16.0K
//   params/dense_2/kernel   f32[4096,1024]      16.00M, no padding
//   attention/scores        f32[8,16,130,130]   both minor dimensions padded
//   loss/one_hot            s32[65536,10]       32.00M for 2.50M of data
//   activations/step_<k>    bf16[64,128,1024]   one per step, freed at the next
//   grads/all_reduce        f32[1024,4096]      every 4th step, until the next
// The leading dimensions are halved (at most ten times) until the whole
// set takes at most a quarter of the smallest device's HBM; on a device of
// a few MiB it still does not fit, and Load says so. The one-hot tensor and the
// first kernel go up with array transfers (the relayout into tiles) and the
// one-hot tensor comes back and is compared with what went up.
//
// Thread-safety: Load and Release on one thread; Step on the demo's step
// loop (one thread).

#ifndef TPUSHIM_TOOLS_DEMO_SHAPES_H_
#define TPUSHIM_TOOLS_DEMO_SHAPES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tpushim/stats.h"
#include "tpushim/system.h"
#include "tpushim/transfer.h"

namespace tpushim::tools::demo_internal {

// What --shapes adds to the summary.
struct ShapesReport {
  int arrays = 0;        // shaped buffers allocated per device at load
  uint64_t divisor = 1;  // the leading dimensions were divided by this
  // The worst padded array: its shape with layout, label, sizes and why.
  std::string worst_shape;
  std::string worst_label;
  uint64_t worst_padded = 0;
  uint64_t worst_unpadded = 0;
  std::string worst_hint;
  uint64_t array_transfers = 0;  // both directions, all devices
  bool round_trips_exact = true;
  std::vector<DeviceStats> devices;  // after the run, before release
  std::string error;                 // the first failure, "" when none
};

class ShapedModel {
 public:
  explicit ShapedModel(System& system);
  ShapedModel(const ShapedModel&) = delete;
  ShapedModel& operator=(const ShapedModel&) = delete;
  ~ShapedModel() { Release(); }

  // Allocates the set on every device and moves the arrays. On an error
  // (RESOURCE_EXHAUSTED with XLA's report when a device is too small)
  // what was allocated stays until Release.
  absl::Status Load();
  // Step `k`: this step's activations replace the previous step's.
  absl::Status Step(int64_t k);
  // Takes the device stats into the report, then frees everything.
  void Release();

  const ShapesReport& report() const { return report_; }

 private:
  struct Array {
    std::string shape;  // without a layout: TPU's default
    std::string label;
    std::string op_metadata;
  };
  absl::StatusOr<DeviceBuffer> Allocate(int device, const Array& a);
  absl::Status MoveArrays(int device, const DeviceBuffer& one_hot,
                          const DeviceBuffer& kernel);
  std::string Scaled(std::vector<int64_t> dims, const std::string& type) const;

  System& system_;
  ShapesReport report_;
  std::vector<Array> params_;
  Array activations_;
  Array grads_;
  std::vector<DeviceBuffer> held_;  // params_ on every device
  std::vector<DeviceBuffer> step_;  // the current step's temporaries
  bool released_ = false;
};

}  // namespace tpushim::tools::demo_internal

#endif  // TPUSHIM_TOOLS_DEMO_SHAPES_H_
