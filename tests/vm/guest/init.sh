#!/bin/sh
# /init of the tests/vm guest (busybox sh, PID 1), put in the initramfs by
# tests/vm/run_vm.sh: mounts the usual file systems, raises RLIMIT_MEMLOCK,
# loads the VFIO modules (/lib/modules/tpushim-vm/order), binds the NVMe
# controller (PCI class 0x010802) to vfio-pci, then runs /plan.sh under sh
# with TPUSHIM_VM_PCI (its BDF) and TPUSHIM_VM_GROUP (its IOMMU group) in
# the environment, plus whatever /plan.env sets. Prints
# `TPUSHIM-VM: PASS vfio_bind` (or FAIL), then
# `TPUSHIM-VM: DONE status=<plan's exit status>`, and powers off. Should it
# exit instead, the kernel panics and panic=-1 with QEMU's -no-reboot ends
# the VM all the same.
PATH=/bin:/sbin:/usr/bin:/usr/sbin
export PATH

mount -t devtmpfs devtmpfs /dev
# The initramfs has no /dev/console node, so the kernel gave us no stdio.
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs -o mode=1777,size=50% tmpfs /tmp
mkdir -p /dev/shm /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t devpts devpts /dev/pts
ln -sf /proc/self/fd /dev/fd
ip link set lo up 2>/dev/null
# busybox ash has ulimit -l.
# shellcheck disable=SC3045
ulimit -l unlimited

# shellcheck source-path=SCRIPTDIR source=vmlib.sh
. /vmlib.sh

MODULES=/lib/modules/tpushim-vm
NVME_CLASS=0x010802

# load_modules: insmod each VFIO module in order.
load_modules() {
  while read -r m; do
    insmod "$MODULES/$m.ko" || {
      echo "insmod $m failed"
      return 1
    }
  done <"$MODULES/order"
}

# find_nvme: the sysfs directory of the first NVMe controller.
find_nvme() {
  for d in /sys/bus/pci/devices/*; do
    if [ "$(cat "$d/class")" = "$NVME_CLASS" ]; then
      echo "$d"
      return 0
    fi
  done
  return 1
}

# bind_vfio DEV: binds DEV to vfio-pci; sets TPUSHIM_VM_PCI and
# TPUSHIM_VM_GROUP once /dev/vfio/<group> exists.
bind_vfio() {
  dev=$1
  bdf=${dev##*/}
  if [ -e "$dev/driver" ]; then
    echo "$bdf: bound to $(basename "$(readlink "$dev/driver")"); unbinding"
    echo "$bdf" >"$dev/driver/unbind" || return 1
  fi
  echo vfio-pci >"$dev/driver_override" || return 1
  echo "$bdf" >/sys/bus/pci/drivers_probe || return 1
  driver=$(basename "$(readlink "$dev/driver" 2>/dev/null)" 2>/dev/null)
  if [ "$driver" != vfio-pci ]; then
    echo "$bdf: driver is \"$driver\" after drivers_probe, not vfio-pci"
    return 1
  fi
  if [ ! -e "$dev/iommu_group" ]; then
    echo "$bdf has no IOMMU group (intel_iommu=on missing?)"
    return 1
  fi
  group=$(basename "$(readlink "$dev/iommu_group")")
  tries=0
  while [ ! -c "/dev/vfio/$group" ]; do
    tries=$((tries + 1))
    if [ "$tries" -gt 50 ]; then
      echo "/dev/vfio/$group did not appear"
      return 1
    fi
    sleep 0.1
  done
  TPUSHIM_VM_PCI=$bdf
  TPUSHIM_VM_GROUP=$group
  export TPUSHIM_VM_PCI TPUSHIM_VM_GROUP
}

# setup: modules and binding; prints vfio_bind's result line.
setup() {
  if ! load_modules; then
    vm_fail vfio_bind "loading the VFIO modules failed"
    return 1
  fi
  if ! dev=$(find_nvme); then
    vm_fail vfio_bind "no NVMe controller (class $NVME_CLASS) in /sys/bus/pci/devices"
    return 1
  fi
  if ! bind_vfio "$dev"; then
    vm_fail vfio_bind "binding ${dev##*/} to vfio-pci failed"
    return 1
  fi
  echo "TPUSHIM-VM: INFO nvme ${TPUSHIM_VM_PCI} bound to vfio-pci, IOMMU group ${TPUSHIM_VM_GROUP}"
  vm_pass vfio_bind
}

main() {
  echo "TPUSHIM-VM: BOOT kernel $(uname -r), $(nproc) cpu(s), uptime $(vm_uptime) s"
  status=1
  if setup; then
    if [ -f /plan.env ]; then
      set -a
      # shellcheck disable=SC1091  # written by run_vm.sh (--env)
      . /plan.env
      set +a
    fi
    echo "TPUSHIM-VM: PLAN start uptime=$(vm_uptime)"
    cd /tmp || exit 1
    sh /plan.sh
    status=$?
  fi
  vm_mark "DONE status=$status uptime=$(vm_uptime)"
  sync
  poweroff -f
  # Not reached unless poweroff failed: exiting panics the kernel (panic=-1).
  exit "$status"
}

main
