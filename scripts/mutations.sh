#!/usr/bin/env bash
# Mutation check: does each headline claim have a test that fails without
# it? Applies named source mutations one at a time to a scratch copy of the
# tree, rebuilds the test that guards the claim (incrementally), runs it,
# and counts the mutation caught when the test fails. Prints
# "N/M mutations caught" and exits 0 only when every one is.
#
#   bash scripts/mutations.sh              # all of them (about 30 min on 2 cores)
#   bash scripts/mutations.sh --list       # names and what each breaks
#   bash scripts/mutations.sh --only NAME  # one (repeatable)
#   bash scripts/mutations.sh --check      # every text still in its file, no build
#
# The scratch copy lives in $TPUSHIM_MUTATION_DIR (default
# /tmp/tpushim-mutations) and keeps its build between runs; the working
# tree is never touched. A mutation whose text is no longer in its file is
# reported as stale and counts as not caught: the list must follow the code.
# Not part of CI (too slow); see docs/testing.md.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
scratch=${TPUSHIM_MUTATION_DIR:-/tmp/tpushim-mutations}
parallel=${TPUSHIM_JOBS:-2}

# name :: file :: text :: replacement :: test target :: gtest filter :: claim
# (\n in text or replacement is a newline)
mutations=(
  'hugetlb-flag :: allocator/region_pages.cc :: flags | MAP_HUGETLB | (shift << MAP_HUGE_SHIFT) :: flags | (shift & 0) :: region_pages_test :: *Hugetlb* :: the region is mapped from a hugetlb pool'
  'thp-advice :: allocator/region_pages.cc :: os.Madvise(start, length, MADV_HUGEPAGE) :: absl::OkStatus() :: region_pages_test :: *TransparentHugePages* :: the region is advised for transparent huge pages'
  'numa-bind :: allocator/premapped_region.cc :: ? os->NumaBindMemory(range.start, range.length, node) :: ? absl::OkStatus() :: region_pages_test :: *Numa* :: the region is bound to its NUMA node before the first touch'
  'mlock :: allocator/premapped_region.cc :: os->Mlock(range.start, range.length, Os::LockWhen::kOnFault) :: absl::OkStatus() :: region_pages_test :: *Lock* :: the region is locked in memory'
  'prefault-threads :: allocator/prefaulter.cc :: for (int i = 0; i < threads; ++i) { :: for (int i = 0; i < 1; ++i) { :: region_allocator_test :: *SeveralThreads* :: pre-faulting runs on several threads'
  'zero-copy-detection :: transfer/engine_queues.cc :: if (ClassifyHostRange(host, size) == HostRange::kPremappedRegion) { :: if (false) { :: transfer_engine_test :: *ZeroCopy* :: buffers from the region move without a copy'
  'threshold-comparison :: transfer/engine_queues.cc :: } else if (size <= threshold_) { :: } else if (size < threshold_) { :: transfer_smoke_test :: *Threshold* :: the threshold is inclusive'
  'staging-overlap :: transfer/engine_staging.cc :: if (buf == nullptr && held < StagingDepth(op)) { :: if (buf == nullptr && held < 1) { :: staging_pipeline_test :: *NextChunk* :: a staged transfer copies chunk k+1 while chunk k moves'
  'bounded-staging :: transfer/engine_staging.cc :: while (cur + bytes <= max_staging_) { :: while (true) { :: transfer_engine_test :: *StagingBackpressure* :: staging bytes in flight are bounded'
  'dependency-status :: transfer/engine_queues.cc :: if (!s.ok()) op->RecordError(s); :: (void)s; :: transfer_engine_test :: *FailedDependency* :: a failed dependency fails its dependants with its status'
  'callback-thread :: transfer/event.cc :: if (executor != nullptr) { :: if (false) { :: event_test :: *Callback* :: callbacks run on the callback thread, not the completing one'
  'c-handle-generation :: driver/c_api_support.h :: if (generation < slots_[slot].generation) { :: if (false) { :: c_api_conformance_test :: *Stale* :: a freed C handle is refused, never reused'
  'nvme-prp-list :: device/nvme/nvme_io.cc :: list[n++] = page; :: list[n++] = page + kPage; :: nvme_device_test :: *EveryByte* :: NVMe PRP lists name each page of a transfer'
  'nvme-mdts-split :: device/nvme/nvme_device.cc :: std::min<uint64_t>(kMaxCommandBytes, uint64_t{mps_min_bytes} << mdts); :: kMaxCommandBytes + 0 * mps_min_bytes; :: nvme_device_test :: *Mdts* :: NVMe commands are split at MDTS'
  'nvme-abort-waits :: device/nvme/nvme_io.cc :: WaitReady(false, "aborting commands that never completed"); :: absl::OkStatus(); :: nvme_device_test :: *NeverComplete* :: the abort waits for CSTS.RDY=0 before buffers are reused'
  'nvme-health :: device/nvme/nvme_io.cc :: shutting_down ? absl::OkStatus() : ControllerHealth(); :: absl::OkStatus(); :: nvme_device_test :: *UnderIo* :: a controller failing under I/O fails its transfers'
  'nvme-command-timeout :: device/nvme/nvme_io.cc :: if (health.ok() && !shutting_down) health = CheckCommandAges(q); :: (void)0; :: nvme_device_test :: *TimesOut* :: a command left out past the timeout fails and stops the controller'
  'fault-nth :: env/fault_injection.cc :: if (call == rule.k) return &rule; :: if (call == rule.k + 1) return &rule; :: os_test :: *Fault* :: fault points fire at exactly the nth call'
  'misaligned-staging :: transfer/engine_queues.cc :: c.rerouted = c.path != TransferPath::kStaged;\n    c.path = TransferPath::kStaged; :: c.rerouted = false; :: misaligned_test :: * :: misaligned host buffers are staged, never handed to the device'
  'vfio-root-disk :: device/vfio/host_use.cc :: Add(absl::StrCat("its disk ", disk, " holds ", mount_point, via_text)); :: (void)mount_point; :: vfio_host_use_test :: * :: no advice to unbind the controller of a mounted disk'
  'stdout-full :: tools/main/cli.cc :: if (!context.out->fail()) return context.exit_code; :: return context.exit_code; :: tpushim_flags_test :: *FullDisk* :: results that cannot be written exit 1'
  'premap-served-early :: allocator/region_allocator.cc ::   if (config.grows) { ::   if (false) { :: region_allocator_test :: *Growth*:*Background* :: a region premapped behind the caller serves only its populated part'
  'staging-not-premapped :: transfer/engine_queues.cc :: if (!StagingReady()) { :: if (false) { :: background_system_test :: *WhilePremapping* :: transfers pin until the staging room is premapped'
  'd2d-overlap-order :: transfer/engine_queues.cc :: to > from ? CopyOrder::kChainedDown : CopyOrder::kChainedUp; :: CopyOrder::kChainedUp; :: overlapping_copy_test :: *EveryOverlap* :: an overlapping device-to-device copy acts as one memmove'
  'c-submit-after-reserve :: driver/c_api_support.h :: TPUSHIM_ASSIGN_OR_RETURN(EventReservation slot, tables().events.Reserve());\n  TPUSHIM_ASSIGN_OR_RETURN(Event event, submit()); :: TPUSHIM_ASSIGN_OR_RETURN(Event event, submit());\n  TPUSHIM_ASSIGN_OR_RETURN(EventReservation slot, tables().events.Reserve()); :: c_api_conformance_test :: *FullEventTable* :: a C call refused for a full event table queued nothing'
  'io-uring-pin :: env/posix/posix_os.cc :: pins != nullptr && hull.length() <= kMaxIoUringPin :: false :: os_test :: *Pin* :: caller memory is pinned with the kernel'"'"'s long-term pin'
  'fork-advice :: env/posix/fork_guard.cc :: os.Madvise(addr, length, MADV_DONTFORK) :: os.Madvise(addr, length, MADV_NORMAL) :: fork_test :: *ParentWrites*:*Sigsegv* :: a fork() child never shares the DMA memory: no copy-on-write for the parent'
  'bounce-routing :: transfer/engine_queues.cc :: if (bounce_ != nullptr && size > 0 && :: if (false && size > 0 && :: bounce_pool_test :: *SmallTransfers*:*ManyThreads* :: with the region off, small transfers go through the bounce pool instead of pinning'
  'pinned-host-from-heap :: driver/memory_spaces.cc :: if (memory == pinned_host_id()) {\n    absl::StatusOr<PinnedHostBuffer> p :: if (false) {\n    absl::StatusOr<PinnedHostBuffer> p :: memory_kinds_test :: *OneZeroCopyDma* :: a device to pinned_host copy is one DMA straight into region memory, never staged'
  'host-released-at-dma-end :: transfer/engine_staging.cc :: ReleaseHost(op, i < n ? op.Error() : absl::OkStatus()); :: op.host_released.Notify(); :: transfer_events_test :: *StagedHostReleased*:*IsNeverLater* :: on the staged path host_released resolves when the last byte is in staging, before the DMA ends'
  'identity-array-in-place :: transfer/engine_queues.cc :: peek->size == peek->shape->host_bytes) { :: peek->size == peek->shape->host_bytes && false) { :: host_registration_test :: *ArraysInThePremappedRegion* :: an array whose device image is the dense array moves in place from the premapped region'
  'waiter-polls :: transfer/engine_queues.cc :: if (gate->Poll(tag / kDmaDirectionCount, :: if (false && gate->Poll(tag / kDmaDirectionCount, :: polled_completion_test :: *AWaiterRunsItsSmallTransfer* :: a thread awaiting a small transfer runs its descriptor rather than wait for a DMA thread to wake'
  'poll-in-engines-place :: device/sim/sim_device.cc :: if (q.shutdown || q.head == q.tail || q.running >= info_.dma_engines) { :: if (q.shutdown || q.head == q.tail) { :: sim_poll_test :: *WaitsItsTurn* :: a waiter runs a descriptor only in place of an idle DMA engine, so one engine'"'"'s queue still completes in order'
  'poll-length-bound :: device/sim/sim_device.cc :: if (next.length > max_length) return false; :: (void)max_length; :: sim_poll_test :: *LongerThanAsked* :: a waiter runs no descriptor longer than it asked for'
  'poll-link-model :: device/sim/sim_device.cc :: if (ns_per_byte_ > 0 || latency_ns_ > 0) return false; :: (void)latency_ns_; :: sim_poll_test :: *LinkModel* :: under the link model only the DMA threads run descriptors'
  'poll-shutdown-wait :: device/sim/sim_device.cc :: while (q->polling > 0) q->cv.Wait(&q->mu); :: (void)q->polling; :: sim_poll_test :: *ShutdownWaits* :: a device shuts down only after every poll has delivered'
  'registered-range :: transfer/engine_queues.cc :: if (FindRegistrationLocked(host, size) != nullptr) { :: if (false) { :: host_registration_test :: *ZeroCopyWhateverTheSize*:*RegionOff*:*ArrayTransfers* :: transfers inside registered host memory are zero-copy whatever their size'
  'c-borrowed-handle-stale :: driver/c_api_memory.cc :: if (taken.device_handle != 0) { :: if (false) { :: c_api_memory_views_test :: *GoesStale* :: a borrowed TpuShim_DeviceBuffer goes stale with its memory buffer'
  'chunked-abort-fails-ready :: transfer/engine_events.cc :: if (done != nullptr) (void)caller_events_->Set(*done, std::move(failed)); :: (void)failed; :: buffer_ready_test :: *AbortFailsTheReadyEvent* :: an abandoned chunked transfer fails the buffer'"'"'s ready event instead of never resolving'
  'host-buffer-ready :: driver/memory_spaces.cc :: d->order.Record({0, d->size}, BufferOrder::Access::kWrite, :: if (false) d->order.Record({0, d->size}, BufferOrder::Access::kWrite, :: c_api_memory_views_test :: *ReadyEventOfAHostBuffer* :: a host-memory buffer'"'"'s ready event waits for the copy that fills it'
  'buffer-order-rule :: transfer/buffer_order.cc :: if (access == Access::kRead && e.access == Access::kRead) continue; :: if (access == Access::kRead || access == Access::kWrite) continue; :: buffer_order_test :: *SameBuffer* :: operations on one buffer run in the order they were issued, with no wait_for'
  'buffer-order-atomic :: transfer/engine_queues.cc :: if (!stopped) RecordInOrder(*op); :: if (!stopped) { first->mu.Unlock(); std::this_thread::sleep_for(std::chrono::milliseconds(1)); first->mu.Lock(); RecordInOrder(*op); } :: buffer_order_test :: *NeverInterleave* :: an operation takes its place in its buffer'"'"'s order in one step, so two issuers never both go first'
  'queue-head-of-line :: transfer/engine_queues.cc :: if (q.starting || q.ready.empty()) return nullptr; :: if (q.starting || q.ready.empty() || (!q.waiting.empty() && q.waiting.begin()->first < q.ready.begin()->first)) return nullptr; :: buffer_order_test :: *HoldsUpNothing*:*NeverBlock* :: an operation waiting for its dependencies never holds up the ones behind it in its queue'
  'array-bounce :: transfer/engine_queues.cc :: if (region_ != nullptr ? StagingReady() : bounce_ != nullptr) { :: if (region_ != nullptr && StagingReady()) { :: shaped_buffer_test :: *RegionOff* :: with the region off array transfers go through the bounce pool, as byte transfers do, not a pinned heap image'
  'shutdown-stops-model :: transfer/transfer_engine.cc :: for (Device* device : devices_) device->StopModelledDelays(); :: (void)devices_; :: shutdown_test :: *SlowModelledLink* :: a system being destroyed waits out no modelled link time'
  'alias-host-released :: driver/memory_spaces.cc :: (void)released->Set(absl::OkStatus()); :: (void)released; :: c_api_memory_views_test :: *FromHostGivesHostReleased* :: an aliasing buffer releases the caller'"'"'s bytes (host_released OK) once it is freed'
)

usage() {
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
}

only=()
list=0
check=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --list) list=1 ;;
    --check) check=1 ;;
    --only)
      [[ $# -ge 2 ]] || { echo "mutations.sh: --only needs a NAME" >&2; exit 2; }
      only+=("$2")
      shift
      ;;
    -h | --help) usage; exit 0 ;;
    *) echo "mutations.sh: unknown argument \"$1\" (see --help)" >&2; exit 2 ;;
  esac
  shift
done

field() { # field N (from 0) of a mutation line, fields split on " :: "
  local rest=$1 i
  for ((i = 0; i < $2; ++i)); do rest=${rest#* :: }; done
  printf '%s' "${rest%% :: *}"
}

selected=()
for m in "${mutations[@]}"; do
  name=$(field "$m" 0)
  if [[ ${#only[@]} -eq 0 ]]; then
    selected+=("$m")
  else
    for o in "${only[@]}"; do [[ $o == "$name" ]] && selected+=("$m"); done
  fi
done
for o in "${only[@]}"; do
  found=0
  for m in "${mutations[@]}"; do [[ $(field "$m" 0) == "$o" ]] && found=1; done
  if [[ $found -eq 0 ]]; then
    echo "mutations.sh: no mutation named \"$o\" (--list names them)" >&2
    exit 2
  fi
done

if [[ $list -eq 1 ]]; then
  for m in "${selected[@]}"; do
    printf '%-22s %s (%s)\n' "$(field "$m" 0)" "$(field "$m" 6)" "$(field "$m" 1)"
  done
  exit 0
fi

# Replaces the one occurrence of literal text $2 in file $1 by $3 (\n is a
# newline in both); fails when the text occurs other than once.
mutate() {
  FROM="$2" TO="$3" perl -0pi -e '
    BEGIN { ($f, $t) = ($ENV{FROM}, $ENV{TO}); s/\\n/\n/g for $f, $t; }
    $n = () = /\Q$f\E/g;
    die "occurs $n times\n" if $n != 1;
    s/\Q$f\E/$t/;' "$1"
}

if [[ $check -eq 1 ]]; then
  stale=0
  tmp=$(mktemp)
  trap 'rm -f "$tmp"' EXIT
  for m in "${selected[@]}"; do
    file=$(field "$m" 1)
    cp "$file" "$tmp"
    if ! mutate "$tmp" "$(field "$m" 2)" "$(field "$m" 3)" 2>/dev/null; then
      echo "STALE   $(field "$m" 0): its text is not in $file exactly once"
      stale=$((stale + 1))
    fi
  done
  [[ $stale -eq 0 ]] && echo "${#selected[@]} mutations, all current"
  [[ $stale -eq 0 ]]
  exit
fi

echo "=== scratch copy in $scratch ==="
mkdir -p "$scratch"
# One run at a time per scratch directory.
exec 9>"$scratch/lock"
if ! flock -n 9; then
  echo "mutations.sh: another run is using $scratch" >&2
  exit 1
fi
# The tree as it is, uncommitted changes included. Only files whose content
# changed are replaced (with a new time), so the scratch build stays
# incremental and never mistakes a changed file for an old one.
rm -rf "$scratch/next"
mkdir -p "$scratch/next" "$scratch/src"
tar -C "$root" --exclude='./build*' --exclude=./.git -cf - . |
  tar -C "$scratch/next" -xf -
(cd "$scratch/next" && find . -type f) | while read -r f; do
  if ! cmp -s "$scratch/next/$f" "$scratch/src/$f"; then
    mkdir -p "$(dirname "$scratch/src/$f")"
    cp "$scratch/next/$f" "$scratch/src/$f"
  fi
done
(cd "$scratch/src" && find . -type f) | while read -r f; do
  [[ -e $scratch/next/$f ]] || rm -f "$scratch/src/$f"
done
rm -rf "$scratch/next"
cmake -S "$scratch/src" -B "$scratch/build" -DCMAKE_BUILD_TYPE=Release \
  -DTPUSHIM_BUILD_BENCHMARKS=OFF -DTPUSHIM_VM_TESTS=OFF >"$scratch/cmake.log" 2>&1 ||
  { cat "$scratch/cmake.log"; exit 1; }

caught=0
total=0
missed=()
for m in "${selected[@]}"; do
  name=$(field "$m" 0)
  file=$(field "$m" 1)
  from=$(field "$m" 2)
  to=$(field "$m" 3)
  target=$(field "$m" 4)
  filter=$(field "$m" 5)
  total=$((total + 1))
  cp "$scratch/src/$file" "$scratch/pristine"
  if ! mutate "$scratch/src/$file" "$from" "$to" 2>"$scratch/mutate.log"; then
    echo "STALE   $name: $(cat "$scratch/mutate.log") in $file"
    missed+=("$name (stale)")
    cp "$scratch/pristine" "$scratch/src/$file"
    continue
  fi
  result=missed
  if ! cmake --build "$scratch/build" -j"$parallel" --target "$target" \
    >"$scratch/build-$name.log" 2>&1; then
    result="build failed (see $scratch/build-$name.log)"
  else
    binary=$(find "$scratch/build/tests" -path '*initramfs*' -prune -o \
      -type f -name "$target" -perm -u+x -print | head -1)
    if ! timeout 600 "$binary" --gtest_filter="$filter" \
      >"$scratch/test-$name.log" 2>&1; then
      result=caught
    elif grep -q "0 tests, listed below\|Running 0 tests" "$scratch/test-$name.log"; then
      result="no test matched $filter"
    fi
  fi
  cp "$scratch/pristine" "$scratch/src/$file"
  if [[ $result == caught ]]; then
    caught=$((caught + 1))
    echo "caught  $name ($target $filter)"
  else
    echo "MISSED  $name: $result ($target $filter)"
    missed+=("$name")
  fi
done
echo "$caught/$total mutations caught"
if [[ ${#missed[@]} -gt 0 ]]; then
  echo "not caught: ${missed[*]}"
  exit 1
fi
