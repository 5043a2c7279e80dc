#include "tools/demo/demo.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <new>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "env/device_url.h"
#include "env/options.h"
#include "logging/log.h"
#include "nlohmann/json.hpp"
#include "tools/cli/flags.h"
#include "tools/cli/progress.h"
#include "tools/cli/pseudo_random.h"
#include "tools/demo/pipeline.h"
#include "tools/demo/summary.h"
#include "tpushim/stats.h"
#include "tpushim/system.h"
#include "tpushim/transfer.h"

namespace tpushim::tools {
namespace {

using demo_internal::DemoConfig;
using demo_internal::Json;
using demo_internal::kDefaultBatchBytes;
using demo_internal::kDefaultDevices;
using demo_internal::kDefaultProducers;
using demo_internal::kDefaultStepMs;
using demo_internal::kDefaultSteps;
using demo_internal::kMaxBatchBytes;
using demo_internal::kMinShardBytes;
using demo_internal::Pipeline;
using demo_internal::PrintSummary;
using demo_internal::ShapedModel;
using demo_internal::Summary;
using demo_internal::SummaryJson;

constexpr char kDemoDescription[] =
    "Run an input-pipeline loop like a training job and verify every byte";

constexpr char kDemoFooter[] = R"footer(
Brings the runtime up from the environment exactly as a framework would
(TPU_PREMAPPED_BUFFER_SIZE, TPUSHIM_DEVICE, TPU_LOG_DIR, ...; default
device sim://?devices=4), then runs --steps steps: producer threads fill
batches alternately in pageable memory and in pinned host buffers from the
premapped region, each batch is split across the devices and transferred
host->device, each device waits for its shard and computes for --step-ms,
its result (the shard rotated, written device->device) comes back
device->host and is hash-verified (XXH3). The summary shows start-up time,
throughput per direction and path, staging waits, fallbacks, errors, where
the logs are, and whether the run was input-bound: whether the devices
waited for input more than 10% of the time.

--devices sets only the devices= parameter of TPUSHIM_DEVICE (its other
parameters are kept); --steps 0 only brings the system up and down.

Exit status: 0 when every byte verified and nothing failed; 1 when a
transfer, an allocation or a hash check failed (the summary is still
printed) or the runtime cannot start; 2 for an invalid configuration or
command line; 130 (SIGINT) or 143 (SIGTERM) when a signal stopped the loop:
the steps issued finish and are verified, and the summary of the steps that
ran is printed marked partial ("partial": true, "interrupted_by").

Examples:
  tpushim demo
  tpushim demo --steps 100 --batch-bytes 16M --step-ms 20
  TPUSHIM_DEVICE='sim://?link_gbps=25&latency_us=2' tpushim demo --devices 2
  TPU_PREMAPPED_BUFFER_SIZE=0 tpushim demo       # no region: staged/pinned
  tpushim demo --steps 0                         # start-up only
  tpushim demo --json | jq '{input_bound, errors, h2d: .transfers.h2d}')footer";

// ---- The command
// -------------------------------------------------------------

struct DemoFlags {
  int64_t steps = kDefaultSteps;
  std::string batch_bytes = kDefaultBatchBytes;
  int devices = 0;
  bool devices_given = false;
  double step_ms = kDefaultStepMs;
  int producers = kDefaultProducers;
  bool shapes = false;
  bool json = false;
};

// Why the region was left unlocked, and what to do about it: what the
// region remembers of it (the memlock limit that kept the lock from being
// tried, the failed mlock call's status). With the default stderr level
// the start-up WARNING that says so never reaches the terminal, so the
// summary says it.
std::string NotLockedReason(const Options& options, const RegionStats& region) {
  if (options.mlock.value == MlockMode::kOff) {
    return "TPUSHIM_MLOCK=off asks not to lock it.";
  }
  if (region.lock_error.empty()) {
    return "mlock() did not lock it; tpu_driver.WARNING in the log directory "
           "says why.";
  }
  return absl::StrCat(region.lock_error,
                      absl::EndsWith(region.lock_error, ".") ? "" : ".",
                      " Its pages may be swapped out.");
}

void RunDemo(const DemoFlags& flags, CommandContext& context) {
  absl::StatusOr<Options> options = ResolveOptions(*context.os);
  if (!options.ok()) {
    ReportError(options.status(), "invalid configuration", flags.json,
                kExitUsage, context);
    return;
  }
  DemoConfig config;
  config.steps = flags.steps;
  config.step_ms = flags.step_ms;
  config.producers = flags.producers;
  // Validated by the option's check.
  config.batch_bytes =
      ParseByteSize(flags.batch_bytes, "--batch-bytes").value_or(0);

  // The device URL: TPUSHIM_DEVICE, or sim://?devices=4; --devices sets
  // only its devices= parameter.
  OptionOverrides overrides;
  const Option<DeviceUrl>& device = options->device;
  std::string url = device.value.text;
  config.devices = device.value.devices;
  if (device.source == OptionSource::kDefault) {
    config.devices = flags.devices_given ? flags.devices : kDefaultDevices;
    url = absl::StrCat("sim://?devices=", config.devices);
    overrides.device = url;
  } else if (flags.devices_given) {
    config.devices = flags.devices;
    url = WithUrlParameter(url, "devices", absl::StrCat(config.devices));
    overrides.device = url;
  }
  config.shard_bytes = config.batch_bytes / config.devices;
  if (config.shard_bytes < kMinShardBytes) {
    ReportError(absl::InvalidArgumentError(absl::StrCat(
                    "--batch-bytes=", flags.batch_bytes, " gives ",
                    config.shard_bytes, " bytes per device on ", config.devices,
                    " devices; at least ", kMinShardBytes, " are needed")),
                "invalid command line", flags.json, kExitUsage, context);
    return;
  }
  config.batch_bytes = config.shard_bytes * config.devices;

  auto display = std::make_shared<StartupProgressDisplay>(*context.err, "demo");
  // With TPUSHIM_PREMAP=background the display goes on behind the run.
  absl::StatusOr<std::unique_ptr<System>> system = System::Create(
      overrides, [display](const StartupProgress& p) { (*display)(p); },
      StartupProgressUntil::kPremapped);
  if (!system.ok()) {
    ReportStartupError(system.status(), flags.json, context);
    return;
  }
  config.devices = (*system)->device_count();
  for (int d = 0; d < config.devices; ++d) {
    config.block_bytes = std::max<uint64_t>(config.block_bytes,
                                            (*system)->device(d).block_bytes);
  }
  config.shard_bytes =
      std::max(config.block_bytes, config.batch_bytes / config.devices /
                                       config.block_bytes * config.block_bytes);
  config.batch_bytes = config.shard_bytes * config.devices;
  Summary summary;
  summary.config = config;
  summary.device_url = url;
  summary.init_seconds = absl::ToDoubleSeconds((*system)->init_time());
  summary.create_seconds = summary.init_seconds;
  display->CreateReturned();
  summary.premapped_bytes = (*system)->premapped_bytes();
  summary.threshold_bytes = (*system)->transfer_threshold_bytes();
  for (int d = 0; d < (*system)->device_count(); ++d) {
    summary.devices.push_back((*system)->device(d));
  }
  summary.log_directory = (*system)->log_directory();

  std::optional<ShapedModel> model;
  absl::Status loaded;
  if (flags.shapes) {
    model.emplace(**system);
    loaded = model->Load();
    if (!loaded.ok()) {
      LOG(ERROR) << "tpushim demo --shapes: " << loaded;
    }
  }
  if (config.steps > 0 && loaded.ok()) {
    LOG(INFO) << "tpushim demo: " << config.steps << " steps of "
              << config.batch_bytes << " bytes on " << config.devices
              << " devices, " << config.step_ms << " ms per step, "
              << config.producers << " producers";
    Pipeline pipeline(**system, config);
    if (model) {
      pipeline.set_step_hook([&model](int64_t k) { return model->Step(k); });
    }
    pipeline.Run();
    summary.run = pipeline.counters();
    // Interrupted: the figures are those of the steps that ran.
    summary.steps_requested = config.steps;
    summary.config.steps = summary.run.steps_run;
  }
  if (model) {
    model->Release();
    summary.shapes = model->report();
    if (!loaded.ok()) {
      summary.shapes->error = loaded.ToString();
      // What could not be loaded is an error of the run, as it would be of
      // a training job.
      (absl::IsDataLoss(loaded) ? summary.run.hash_mismatches
                                : summary.run.failed_allocations) += 1;
      if (summary.run.first_error.empty()) {
        summary.run.first_error =
            absl::StrCat("loading the shaped buffers: ", loaded.ToString());
      }
    }
    model.reset();
  }
  if (!loaded.ok()) {
    summary.steps_requested = config.steps;
    summary.config.steps = 0;  // the loop did not run
  }
  const SystemStats stats = (*system)->GetStats();
  summary.region = stats.region;
  if (const StartupProgress p = (*system)->premap_progress();
      p.phase == StartupProgress::Phase::kDone &&
      (stats.region.premapped || summary.premapped_bytes == 0)) {
    summary.region_ready_seconds = absl::ToDoubleSeconds(p.elapsed);
  }
  summary.transfers = stats.transfers;
  summary.min_log_level = options->min_log_level.value;
  if (summary.premapped_bytes > 0 && !summary.region.locked) {
    summary.not_locked_reason = NotLockedReason(*options, summary.region);
  }
  LOG(INFO) << "tpushim demo: done: " << summary.run.errors() << " errors, "
            << (summary.InputBound() ? "input-bound" : "not input-bound");
  system->reset();  // everything released before the summary is written

  if (flags.json) {
    WriteJson(SummaryJson(summary), *context.out);
  } else {
    PrintSummary(summary, *context.out);
  }
  context.exit_code = summary.run.errors() == 0 ? kExitOk : kExitFailure;
}

}  // namespace

void RegisterDemoCommand(CLI::App& app, CommandContext& context) {
  CLI::App* demo = app.add_subcommand("demo", kDemoDescription);
  demo->footer(kDemoFooter);
  // Owned by the callback, which CLI11 keeps as long as `app`.
  auto flags = std::make_shared<DemoFlags>();
  AddWholeFlag(demo, "--steps", &flags->steps,
               {.unit = "steps", .min = 0, .max = int64_t{1} << 40},
               "Steps to run; 0 only brings the system up and down");
  AddByteFlag(demo, "--batch-bytes", &flags->batch_bytes,
              {.min = 1, .max = kMaxBatchBytes},
              "Bytes per batch, split evenly across the devices "
              "(K/M/G suffixes, at most 1G)");
  CLI::Option* devices = AddWholeFlag(
      demo, "--devices", &flags->devices,
      {.unit = "devices", .min = 1, .max = 64},
      "Simulated devices: sets devices= of TPUSHIM_DEVICE (default: "
      "sim://?devices=4 when TPUSHIM_DEVICE is unset)");
  AddDecimalFlag(demo, "--step-ms", &flags->step_ms,
                 {.unit = "milliseconds", .min = 0, .max = 60000},
                 "Modelled device compute per step, in milliseconds");
  AddWholeFlag(demo, "--producers", &flags->producers,
               {.unit = "threads", .min = 1, .max = 64},
               "Producer threads filling batches");
  demo->add_flag("--shapes", flags->shapes,
                 "Also hold a model-like set of shaped device buffers "
                 "(weights, activations, a badly padded one-hot tensor) and "
                 "show what they take in TPU's tiled layouts");
  demo->add_flag("--json", flags->json,
                 "Print one JSON object instead of tables");
  demo->callback([flags, devices, &context] {
    flags->devices_given = devices->count() > 0;
    RunDemo(*flags, context);
  });
}

}  // namespace tpushim::tools
