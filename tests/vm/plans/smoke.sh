# shellcheck shell=sh
# Smoke plan for the tests/vm harness (CTest vm_smoke): vfio_probe walks the
# VFIO set-up against the NVMe controller /init bound to vfio-pci
# (TPUSHIM_VM_PCI, TPUSHIM_VM_GROUP) and reads its registers through BAR0.
# Run: tests/vm/run_vm.sh --plan tests/vm/plans/smoke.sh \
#        --bin <build>/tests/vm/vfio_probe --expect vfio_bind vfio_probe

# shellcheck source-path=SCRIPTDIR source=../guest/vmlib.sh
. /vmlib.sh

vm_run vfio_probe vfio_probe "$TPUSHIM_VM_PCI" "$TPUSHIM_VM_GROUP"
vm_finish
