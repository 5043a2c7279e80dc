# shellcheck shell=sh
# Manual plan (not in CI): how long the premapped region's IOMMU mapping
# takes against its size, on vfio://…?engine=nvme in the VM. Prints, per
# size, the start-up's "Registered premapped memory ... for DMA" and "Done
# premapping memory" lines. Needs guest memory above the largest size:
#   tests/vm/run_vm.sh --plan tests/vm/plans/map_timing.sh --memory 3G \
#     --bin build/tools/tpushim --expect map_timing --verbose
# shellcheck source=tests/vm/guest/vmlib.sh
. /vmlib.sh

export TPUSHIM_DEVICE="vfio://$TPUSHIM_VM_PCI?engine=nvme"
export TPU_LOG_DIR=/tmp/tpu_logs
export TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES=4194304
mkdir -p "$TPU_LOG_DIR"

map_timing() {
  for mib in ${MAP_TIMING_MIB:-64 256 1024 2048}; do
    rm -rf "${TPU_LOG_DIR:?}"/*
    TPU_PREMAPPED_BUFFER_SIZE=$((mib * 1048576)) tpushim bench --sizes 4K \
      --directions h2d --paths staged --seconds 0.01 >/dev/null || return 1
    grep -h -e 'for DMA by' -e 'Done premapping' -e 'IOMMU-mapp' \
      "$TPU_LOG_DIR"/tpu_driver.INFO | sed 's/^.*\] //'
  done
}
vm_run map_timing map_timing
vm_finish
