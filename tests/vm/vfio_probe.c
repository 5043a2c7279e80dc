/* vfio_probe: the VM smoke test's guest program (tests/vm/plans/smoke.sh).
 * Inside the tests/vm guest it walks the VFIO set-up a user-space driver
 * does, against the NVMe controller /init bound to vfio-pci: container and
 * API version, the TYPE1v2 IOMMU extension, the group (viable), container
 * + IOMMU, the device fd, vendor/device/class from config space, and BAR0
 * mmapped to read the NVMe CAP and VS registers. Prints each step; exits 0
 * when all succeed, 1 naming the step that failed.
 *
 * Usage: vfio_probe [BDF [GROUP]]  (default: $TPUSHIM_VM_PCI,
 *                                   $TPUSHIM_VM_GROUP) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/vfio.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#define NVME_CLASS 0x010802u
#define NVME_REG_CAP 0x0
#define NVME_REG_VS 0x8

static int fail(const char *fmt, ...) {
  int saved = errno;
  va_list ap;
  fputs("vfio_probe: FAILED: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  if (saved != 0) fprintf(stderr, ": %s", strerror(saved));
  fputc('\n', stderr);
  return 1;
}

/* Reads `size` bytes of config space at `offset` (little-endian). */
static int config_read(int device, const struct vfio_region_info *config,
                       uint32_t offset, uint32_t size, uint32_t *value) {
  uint8_t bytes[4] = {0};
  if (pread(device, bytes, size, (off_t)(config->offset + offset)) !=
      (ssize_t)size)
    return -1;
  *value = 0;
  for (uint32_t i = 0; i < size; i++) *value |= (uint32_t)bytes[i] << (8 * i);
  return 0;
}

static int get_region(int device, uint32_t index,
                      struct vfio_region_info *info) {
  memset(info, 0, sizeof(*info));
  info->argsz = sizeof(*info);
  info->index = index;
  return ioctl(device, VFIO_DEVICE_GET_REGION_INFO, info);
}

static int open_container(void) {
  int container = open("/dev/vfio/vfio", O_RDWR);
  if (container < 0) return fail("open /dev/vfio/vfio"), -1;
  int version = ioctl(container, VFIO_GET_API_VERSION);
  if (version != VFIO_API_VERSION) {
    errno = 0;
    return fail("VFIO API version %d, expected %d", version, VFIO_API_VERSION),
           -1;
  }
  if (ioctl(container, VFIO_CHECK_EXTENSION, VFIO_TYPE1v2_IOMMU) <= 0)
    return fail("VFIO_CHECK_EXTENSION(VFIO_TYPE1v2_IOMMU)"), -1;
  printf("container: API version %d, TYPE1v2 IOMMU supported\n", version);
  return container;
}

static int open_group(int container, const char *group_name) {
  char path[64];
  snprintf(path, sizeof(path), "/dev/vfio/%s", group_name);
  int group = open(path, O_RDWR);
  if (group < 0) return fail("open %s", path), -1;
  struct vfio_group_status status = {.argsz = sizeof(status)};
  if (ioctl(group, VFIO_GROUP_GET_STATUS, &status) != 0)
    return fail("VFIO_GROUP_GET_STATUS on %s", path), -1;
  if (!(status.flags & VFIO_GROUP_FLAGS_VIABLE)) {
    errno = 0;
    return fail("group %s not viable (a device in it is bound elsewhere)",
                group_name),
           -1;
  }
  if (ioctl(group, VFIO_GROUP_SET_CONTAINER, &container) != 0)
    return fail("VFIO_GROUP_SET_CONTAINER"), -1;
  if (ioctl(container, VFIO_SET_IOMMU, VFIO_TYPE1v2_IOMMU) != 0)
    return fail("VFIO_SET_IOMMU(VFIO_TYPE1v2_IOMMU)"), -1;
  struct vfio_iommu_type1_info iommu = {.argsz = sizeof(iommu)};
  if (ioctl(container, VFIO_IOMMU_GET_INFO, &iommu) != 0)
    return fail("VFIO_IOMMU_GET_INFO"), -1;
  printf("group %s: viable, container set, TYPE1v2 IOMMU, page sizes 0x%llx\n",
         group_name, (unsigned long long)iommu.iova_pgsizes);
  return group;
}

static int check_config(int device) {
  struct vfio_region_info config;
  if (get_region(device, VFIO_PCI_CONFIG_REGION_INDEX, &config) != 0)
    return fail("VFIO_DEVICE_GET_REGION_INFO(config)");
  uint32_t ids, class_rev, command;
  if (config_read(device, &config, 0x0, 4, &ids) != 0 ||
      config_read(device, &config, 0x8, 4, &class_rev) != 0 ||
      config_read(device, &config, 0x4, 2, &command) != 0)
    return fail("reading config space");
  uint32_t vendor = ids & 0xffff, device_id = ids >> 16;
  uint32_t class_code = class_rev >> 8;
  printf("config: vendor 0x%04x device 0x%04x class 0x%06x command 0x%04x\n",
         vendor, device_id, class_code, command);
  errno = 0;
  if (vendor == 0xffff || vendor == 0) return fail("no device in config space");
  if (class_code != NVME_CLASS)
    return fail("class 0x%06x is not NVMe (0x%06x)", class_code, NVME_CLASS);
  return 0;
}

static int check_bar0(int device) {
  struct vfio_region_info bar0;
  if (get_region(device, VFIO_PCI_BAR0_REGION_INDEX, &bar0) != 0)
    return fail("VFIO_DEVICE_GET_REGION_INFO(BAR0)");
  if (!(bar0.flags & VFIO_REGION_INFO_FLAG_MMAP) || bar0.size < 0x1000) {
    errno = 0;
    return fail("BAR0 not mmappable (flags 0x%x, size 0x%llx)", bar0.flags,
                (unsigned long long)bar0.size);
  }
  void *map = mmap(NULL, bar0.size, PROT_READ | PROT_WRITE, MAP_SHARED, device,
                   (off_t)bar0.offset);
  if (map == MAP_FAILED) return fail("mmap BAR0");
  const volatile uint32_t *regs = map;
  uint64_t cap = regs[NVME_REG_CAP / 4] |
                 (uint64_t)regs[NVME_REG_CAP / 4 + 1] << 32;
  uint32_t vs = regs[NVME_REG_VS / 4];
  printf("BAR0: size 0x%llx, CAP 0x%016" PRIx64
         " (MQES %u, DSTRD %u, TO %u x 500 ms), VS 0x%08x (NVMe %u.%u.%u)\n",
         (unsigned long long)bar0.size, cap, (unsigned)(cap & 0xffff) + 1,
         (unsigned)(cap >> 32) & 0xf, (unsigned)(cap >> 24) & 0xff, vs,
         vs >> 16, (vs >> 8) & 0xff, vs & 0xff);
  munmap(map, bar0.size);
  errno = 0;
  if (cap == 0 || cap == UINT64_MAX) return fail("implausible CAP");
  if (vs == 0 || vs == UINT32_MAX || (vs >> 16) == 0)
    return fail("implausible VS");
  return 0;
}

int main(int argc, char **argv) {
  const char *bdf = argc > 1 ? argv[1] : getenv("TPUSHIM_VM_PCI");
  const char *group_name = argc > 2 ? argv[2] : getenv("TPUSHIM_VM_GROUP");
  if (bdf == NULL || group_name == NULL) {
    fprintf(stderr,
            "usage: vfio_probe [BDF [GROUP]] (default: $TPUSHIM_VM_PCI, "
            "$TPUSHIM_VM_GROUP)\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  int container = open_container();
  if (container < 0) return 1;
  int group = open_group(container, group_name);
  if (group < 0) return 1;
  int device = ioctl(group, VFIO_GROUP_GET_DEVICE_FD, bdf);
  if (device < 0) return fail("VFIO_GROUP_GET_DEVICE_FD(%s)", bdf);
  struct vfio_device_info info = {.argsz = sizeof(info)};
  if (ioctl(device, VFIO_DEVICE_GET_INFO, &info) != 0)
    return fail("VFIO_DEVICE_GET_INFO");
  printf("device %s: %u regions, %u irqs%s\n", bdf, info.num_regions,
         info.num_irqs, (info.flags & VFIO_DEVICE_FLAGS_PCI) ? ", PCI" : "");
  if (check_config(device) != 0 || check_bar0(device) != 0) return 1;
  close(device);
  close(group);
  close(container);
  printf("vfio_probe: OK\n");
  return 0;
}
