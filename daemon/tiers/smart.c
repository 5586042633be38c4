/* SPDX-License-Identifier: MIT */
/* smart.c: an NVMe drive's wear (SMART / Health log page) for the drive under a target. */

/*
 * Theory of operation: a target is a file on a file system or a block
 * device.  Its block device (the file's st_dev, the device's st_rdev) leads
 * through sysfs (/sys/dev/block/MAJ:MIN, a link into /sys/devices) to the
 * device's place in the device tree.  An NVMe namespace lies under its
 * controller ("nvme0") or, with native multipath, under its subsystem
 * ("nvme-subsys0"), whose directory lists its controllers.  The controller's
 * character device /dev/nvmeN takes admin commands through the kernel's
 * passthrough ioctl (NVME_IOCTL_ADMIN_CMD): Get Log Page, log 02h, the
 * SMART / Health Information page of 512 bytes.  Anything else is not NVMe,
 * and the reason names what it is (virtio, ATA, device mapper, ...), so the
 * operator knows why there are no wear figures.
 *
 * smart_parse() reads the page and nothing else: the unit test feeds it
 * pages built from the specification's layout.
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/nvme_ioctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "daemon/tiers/smart.h"
#include "proto/macro.h"

/*
 * Offsets in the SMART / Health Information log page (NVMe Base
 * Specification 2.0, Figure 207 "SMART / Health Information Log Page";
 * the same in 1.4, Figure 194).  Multi-byte fields are little endian.
 */
#define SMART_OFF_CRITICAL_WARNING      0       /* byte 0: Critical Warning, bit field */
#define SMART_OFF_TEMPERATURE           1       /* bytes 1..2: Composite Temperature, kelvin */
#define SMART_OFF_PERCENTAGE_USED       5       /* byte 5: Percentage Used */
#define SMART_OFF_DATA_UNITS_WRITTEN    48      /* bytes 48..63: Data Units Written, 128 bits */

/* Get Log Page: admin opcode 02h; log identifier 02h; NSID FFFFFFFFh: the controller as a whole. */
#define NVME_ADMIN_GET_LOG_PAGE 0x02
#define NVME_LOG_SMART          0x02
#define NVME_NSID_ALL           0xffffffffu

/* How long an admin command may take before the kernel gives up on it. */
#define SMART_TIMEOUT_MS        2000

static uint64_t le64(const uint8_t *p) {
        uint64_t v = 0;

        for (int i = 7; i >= 0; i--)
                v = v << 8 | p[i];
        return v;
}

int smart_parse(const uint8_t *page, size_t len, SmartLog *ret) {
        uint64_t lo, hi;

        if (!page || !ret || len < SMART_LOG_SIZE)
                return -EINVAL;
        lo = le64(page + SMART_OFF_DATA_UNITS_WRITTEN);
        hi = le64(page + SMART_OFF_DATA_UNITS_WRITTEN + 8);
        *ret = (SmartLog) {
                .critical_warning = page[SMART_OFF_CRITICAL_WARNING],
                .temperature_k = (uint16_t) (page[SMART_OFF_TEMPERATURE] |
                                             page[SMART_OFF_TEMPERATURE + 1] << 8),
                .percentage_used = page[SMART_OFF_PERCENTAGE_USED],
                .data_units_written = hi ? UINT64_MAX : lo,
                .saturated = hi != 0,
        };
        return 0;
}

uint64_t smart_bytes_written(const SmartLog *log) {
        if (log->saturated || log->data_units_written > UINT64_MAX / SMART_DATA_UNIT_BYTES)
                return UINT64_MAX;
        return log->data_units_written * SMART_DATA_UNIT_BYTES;
}

/* Is @s "PREFIX<digits>" with at least one digit? */
static bool is_numbered(const char *s, const char *prefix) {
        size_t n = strlen(prefix);

        if (strncmp(s, prefix, n) != 0 || s[n] == '\0')
                return false;
        for (s += n; *s; s++)
                if (*s < '0' || *s > '9')
                        return false;
        return true;
}

/* The first controller ("nvmeN") listed in subsystem directory @dir; 1 if found. */
static int subsystem_controller(const char *dir, char *ret, size_t size) {
        DIR *d = opendir(dir);
        struct dirent *de;
        int found = 0;

        if (!d)
                return 0;
        while (!found && (de = readdir(d)))
                if (is_numbered(de->d_name, "nvme")) {
                        (void) snprintf(ret, size, "/dev/%s", de->d_name);
                        found = 1;
                }
        closedir(d);
        return found;
}

int smart_locate(const char *sysfs, dev_t dev, char *ret_ctrl, size_t ctrl_size, char *ret_why, size_t why_size) {
        char link[PATH_MAX], real[PATH_MAX], part[PATH_MAX + 16], disk[NAME_MAX + 1] = "", subsys[PATH_MAX];
        const char *what = NULL, *note = "";
        struct stat st;
        char *comp, *save = NULL, *last;

        ret_ctrl[0] = '\0';
        if (major(dev) == 0) {
                (void) snprintf(ret_why, why_size, "the file system has no block device (device %u:%u): "
                                "memory, network or virtual file system", major(dev), minor(dev));
                return 0;
        }
        (void) snprintf(link, sizeof(link), "%s/dev/block/%u:%u", sysfs, major(dev), minor(dev));
        if (!realpath(link, real)) {
                (void) snprintf(ret_why, why_size, "block device %u:%u has no entry in %s/dev/block (%s)",
                                major(dev), minor(dev), sysfs, strerror(errno));
                return 0;
        }

        /* the disk: a partition's parent */
        last = strrchr(real, '/');
        (void) snprintf(disk, sizeof(disk), "%.255s", last ? last + 1 : real);
        (void) snprintf(part, sizeof(part), "%s/partition", real);
        if (stat(part, &st) == 0 && last && last > real) {
                *last = '\0';
                last = strrchr(real, '/');
                (void) snprintf(disk, sizeof(disk), "%.255s", last ? last + 1 : real);
        }

        /* walk the device path: a controller, a multipath subsystem, or what the disk hangs off */
        (void) snprintf(subsys, sizeof(subsys), "%s", real);
        for (comp = strtok_r(subsys, "/", &save); comp; comp = strtok_r(NULL, "/", &save)) {
                if (is_numbered(comp, "nvme")) {
                        (void) snprintf(ret_ctrl, ctrl_size, "/dev/%s", comp);
                        return 1;
                }
                if (is_numbered(comp, "nvme-subsys")) {
                        char dir[PATH_MAX];
                        size_t n = (size_t) (comp - subsys) + strlen(comp);

                        (void) snprintf(dir, sizeof(dir), "%.*s", (int) n, real);
                        if (subsystem_controller(dir, ret_ctrl, ctrl_size))
                                return 1;
                        (void) snprintf(ret_why, why_size, "NVMe subsystem %s of disk %s lists no controller",
                                        comp, disk);
                        return 0;
                }
                if (is_numbered(comp, "virtio"))
                        what = "virtio disk";
                else if (is_numbered(comp, "ata") && !what)
                        what = "ATA disk";
                else if (strncmp(comp, "usb", 3) == 0 && !what)
                        what = "USB disk";
                else if (is_numbered(comp, "host") && !what)
                        what = "SCSI disk";
                else if (strcmp(comp, "mmc_host") == 0)
                        what = "MMC card";
        }
        if (!what) {
                if (strncmp(disk, "dm-", 3) == 0) {
                        what = "device-mapper device";
                        note = " (LVM, dm-crypt: the disks under it are not looked at)";
                } else if (strncmp(disk, "md", 2) == 0) {
                        what = "software RAID device";
                        note = " (the disks under it are not looked at)";
                } else if (strncmp(disk, "loop", 4) == 0)
                        what = "loop device";
                else if (strncmp(disk, "zram", 4) == 0)
                        what = "compressed RAM disk";
                else if (strncmp(disk, "ram", 3) == 0 || strncmp(disk, "pmem", 4) == 0)
                        what = "memory disk";
                else
                        what = "disk";
        }
        (void) snprintf(ret_why, why_size, "%s %s is not NVMe%s", what, disk, note);
        return 0;
}

int smart_read(const char *ctrl, SmartLog *ret, char *ret_why, size_t why_size) {
        _cleanup_close_ int fd = -1;
        uint8_t page[SMART_LOG_SIZE] = {};
        struct nvme_admin_cmd cmd = {
                .opcode = NVME_ADMIN_GET_LOG_PAGE,
                .nsid = NVME_NSID_ALL,
                .addr = (uint64_t) (uintptr_t) page,
                .data_len = sizeof(page),
                /* CDW10: NUMDL (dwords - 1, bits 31:16), LID (bits 7:0) */
                .cdw10 = (uint32_t) (sizeof(page) / 4 - 1) << 16 | NVME_LOG_SMART,
                .timeout_ms = SMART_TIMEOUT_MS,
        };
        int r;

        fd = open(ctrl, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0) {
                r = negative_errno();
                (void) snprintf(ret_why, why_size, "cannot open %s: %s", ctrl, strerror(-r));
                return r;
        }
        r = ioctl(fd, NVME_IOCTL_ADMIN_CMD, &cmd);
        if (r < 0) {
                r = negative_errno();
                if (r == -EPERM || r == -EACCES)
                        (void) snprintf(ret_why, why_size, "reading the SMART log of %s needs CAP_SYS_ADMIN (%s)",
                                        ctrl, strerror(-r));
                else
                        (void) snprintf(ret_why, why_size, "the SMART log of %s cannot be read: %s",
                                        ctrl, strerror(-r));
                return r;
        }
        if (r > 0) {
                (void) snprintf(ret_why, why_size, "%s refused Get Log Page 02h: NVMe status 0x%x", ctrl,
                                (unsigned) r);
                return -EIO;
        }
        return smart_parse(page, sizeof(page), ret);
}
