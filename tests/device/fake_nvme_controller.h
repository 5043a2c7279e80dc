// A fake NVMe controller on the fake VFIO kernel (fake_vfio_os.h), so that
// the NVMe engine runs on the host under every sanitizer: BAR 0's registers
// (CAP, VS, CC, CSTS, AQA, ASQ, ACQ, the doorbells) in the memory that
// stands in for the BAR, and a controller thread that does what a
// controller does with them:
//   * CC.EN 0 -> 1 reads the admin queue registers and sets CSTS.RDY
//     (or CSTS.CFS, when told to fail); 1 -> 0 drops every queue and
//     clears CSTS.RDY, after a delay when told to; CC.SHN sets CSTS.SHST;
//   * fetches submission entries up to each tail doorbell and carries out
//     Identify (controller, namespace 1), Set Features (Number of Queues),
//     Create/Delete I/O Submission and Completion Queue, Read, Write and
//     Copy, moving data through the fake IOMMU's live mappings between
//     host memory and a namespace buffer, PRP entries and PRP lists
//     (chained) included; one command at a time, in submission order; a
//     Copy moves its blocks first to last, so one whose destination
//     overlaps its source from above reads blocks it has overwritten (the
//     specification promises nothing for overlapping ranges);
//   * posts each completion with the phase bit, never overrunning a
//     completion queue's head doorbell, and raises the queue's MSI-X
//     vector.
// DMA the IOMMU blocks (no mapping) fails the command with Data Transfer
// Error, as a real controller reports it.
//
// Register and queue-entry accesses are acquire loads and release stores,
// matching device/mmio.h under ThreadSanitizer, so TSan checks the
// engine's ordering of entries and doorbells.
//
//   FakeVfioOs os(FakeHost{});
//   FakeNvmeController controller(os, {.mdts = 1});
//   auto devices = OpenNvmeDevices(url, &os, nullptr);
//
// Thread-safety: the knobs are set before the engine opens the device; the
// counters may be read from any thread.

#ifndef TPUSHIM_TESTS_DEVICE_FAKE_NVME_CONTROLLER_H_
#define TPUSHIM_TESTS_DEVICE_FAKE_NVME_CONTROLLER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "device/nvme/nvme_spec.h"
#include "tests/device/fake_vfio_os.h"

namespace tpushim::fake_vfio {

struct FakeNvmeConfig {
  uint64_t blocks = 4096;  // namespace 1: 2 MiB of 512-byte blocks
  uint32_t block_shift = 9;
  uint16_t max_queue_entries = 64;  // CAP.MQES + 1
  uint8_t timeout_units = 2;        // CAP.TO, in 500 ms
  uint8_t mdts = 0;                 // 0: no limit; else 2^mdts pages
  bool copy = true;                 // ONCS bit 8
  uint16_t mssrl = 256;             // blocks per source range
  uint32_t mcl = 1024;              // blocks per Copy
  // Failures.
  bool fatal_on_enable = false;  // CSTS.CFS instead of CSTS.RDY
  int fail_io_at = 0;            // n > 0: the n-th I/O command fails ...
  uint16_t fail_status = 0x80;   // ... with this status code (LBA Out of Range)
  int hold_io_from = 0;  // n > 0: I/O commands from the n-th on never complete
  int disable_delay_ms = 0;  // from CC.EN = 0 to CSTS.RDY = 0
  // On CC.EN = 0, complete the held commands (successfully) before
  // stopping, as a controller finishing its work in flight does.
  bool complete_held_on_disable = false;
  // n > 0: on receiving the n-th I/O command (which it never completes)
  // the controller sets CSTS.CFS and stops working ...
  int fatal_at_io = 0;
  // ... or resets itself: CC and CSTS to 0, every queue gone.
  int reset_at_io = 0;
};

class FakeNvmeController {
 public:
  FakeNvmeController(FakeVfioOs& os, FakeNvmeConfig config);
  ~FakeNvmeController();
  FakeNvmeController(const FakeNvmeController&) = delete;
  FakeNvmeController& operator=(const FakeNvmeController&) = delete;

  // The namespace's bytes (read them when no command is running).
  std::vector<uint8_t>& media() { return media_; }
  uint64_t block_bytes() const { return uint64_t{1} << config_.block_shift; }

  // What the controller saw.
  int io_commands() const { return io_commands_.load(); }
  uint64_t largest_io_bytes() const { return largest_io_bytes_.load(); }
  int prp_list_commands() const { return prp_list_commands_.load(); }
  int chained_prp_lists() const { return chained_prp_lists_.load(); }
  int blocked_dma() const { return blocked_dma_.load(); }
  int copies() const { return copies_.load(); }
  int interrupts() const { return interrupts_.load(); }
  int held() const { return held_.load(); }
  // I/O submission entries the engine published (tail doorbell writes
  // counted in entries), whether or not the controller fetched them.
  int io_submitted() const { return io_submitted_.load(); }
  bool ready() const;  // CSTS.RDY now
  // Times CC.EN went 1 -> 0, and whether CSTS.RDY was still 1 when the
  // BAR was unmapped (the engine did not wait for the disable).
  int disables() const { return disables_.load(); }
  bool unmapped_while_ready() const { return unmapped_while_ready_.load(); }

 private:
  struct Submission {
    uint64_t base = 0;  // IOVA
    uint32_t size = 0;
    uint32_t head = 0;
    uint16_t cq = 0;
    uint32_t seen_tail = 0;  // the tail doorbell last seen
  };
  struct Completion {
    uint64_t base = 0;
    uint32_t size = 0;
    uint32_t tail = 0;
    uint16_t phase = 1;
    bool interrupts = false;
    uint16_t vector = 0;
    std::deque<nvme_internal::Cqe> waiting;  // not posted yet (queue full)
  };

  void Mapped(uint8_t* base, uint64_t size);
  void Unmapping();
  void Run();
  void Step();
  uint32_t Load32(uint32_t offset) const;
  void Store32(uint32_t offset, uint32_t value);
  uint64_t Load64(uint32_t offset) const;

  void Enable();
  void Disable();
  void Fetch(uint16_t qid);
  void Post(uint16_t cqid, nvme_internal::Cqe cqe);
  void Flush(uint16_t cqid);
  uint16_t Admin(const nvme_internal::Sqe& sqe, uint32_t* result);
  uint16_t Io(const nvme_internal::Sqe& sqe);
  // The host pieces a command's PRPs name for `bytes`; a status code when
  // they cannot be followed (0 when they can).
  uint16_t Gather(uint64_t prp1, uint64_t prp2, uint64_t bytes,
                  std::vector<std::pair<uint8_t*, uint64_t>>& pieces);

  FakeVfioOs& os_;
  const FakeNvmeConfig config_;
  std::vector<uint8_t> media_;
  std::atomic<uint8_t*> bar_{nullptr};
  std::thread thread_;
  std::atomic<bool> stop_{false};

  // The controller thread's own state.
  bool enabled_ = false;
  bool fatal_ = false;  // CSTS.CFS set: nothing is processed until CC.EN = 0
  bool shut_down_ = false;
  std::map<uint16_t, Submission> sqs_;  // 0: admin
  std::map<uint16_t, Completion> cqs_;
  int io_seen_ = 0;
  std::vector<std::pair<uint16_t, nvme_internal::Sqe>> held_commands_;

  std::atomic<int> io_commands_{0};
  std::atomic<uint64_t> largest_io_bytes_{0};
  std::atomic<int> prp_list_commands_{0};
  std::atomic<int> chained_prp_lists_{0};
  std::atomic<int> blocked_dma_{0};
  std::atomic<int> copies_{0};
  std::atomic<int> interrupts_{0};
  std::atomic<int> held_{0};
  std::atomic<int> io_submitted_{0};
  std::atomic<int> disables_{0};
  std::atomic<bool> unmapped_while_ready_{false};
};

}  // namespace tpushim::fake_vfio

#endif  // TPUSHIM_TESTS_DEVICE_FAKE_NVME_CONTROLLER_H_
