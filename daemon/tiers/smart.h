/* SPDX-License-Identifier: MIT */
/* smart.h: an NVMe drive's wear (SMART / Health log page) for the drive under a target. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Size of the SMART / Health Information log page (NVMe Base Specification, Get Log Page 02h). */
#define SMART_LOG_SIZE 512
/* One "data unit" of Data Units Written: 1000 units of 512 bytes (NVMe Base Specification). */
#define SMART_DATA_UNIT_BYTES UINT64_C(512000)

typedef struct SmartLog {
        uint8_t critical_warning;       /* bit field */
        uint16_t temperature_k;         /* composite temperature, kelvin */
        uint8_t percentage_used;        /* may exceed 100; 255 means 255 or more */
        uint64_t data_units_written;    /* saturated at UINT64_MAX */
        bool saturated;                 /* the 128-bit value did not fit in 64 bits */
} SmartLog;

/*
 * smart_parse() - the fields tierd shows from a SMART / Health Information
 * log page.  A pure function of the @len bytes at @page: -EINVAL if fewer
 * than SMART_LOG_SIZE.
 */
int smart_parse(const uint8_t *page, size_t len, SmartLog *ret);

/* Bytes written that @log's data units stand for, saturated at UINT64_MAX. */
uint64_t smart_bytes_written(const SmartLog *log);

/*
 * smart_locate() - the NVMe controller character device ("/dev/nvme0")
 * behind block device @dev (a file's st_dev, or a block device's st_rdev),
 * found under @sysfs ("/sys"; tests pass a tree of their own).  Returns 1
 * and the device in @ret_ctrl, or 0 and in @ret_why, in words, why there is
 * none ("virtio disk vda is not NVMe").  Never fails otherwise.
 */
int smart_locate(const char *sysfs, dev_t dev, char *ret_ctrl, size_t ctrl_size, char *ret_why, size_t why_size);

/*
 * smart_read() - read the SMART / Health Information log page from
 * controller @ctrl with the kernel's NVMe admin passthrough ioctl
 * (NVME_IOCTL_ADMIN_CMD).  0, or -errno with the reason in @ret_why.
 * Needs CAP_SYS_ADMIN on most kernels.  Blocks for the command (a few
 * hundred microseconds on a healthy drive).
 */
int smart_read(const char *ctrl, SmartLog *ret, char *ret_why, size_t why_size);
