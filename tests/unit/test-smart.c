/* SPDX-License-Identifier: MIT */
/* test-smart.c: the SMART / Health log page parser, and finding the NVMe controller under a file in sysfs. */

/*
 * The log page is built byte by byte from the NVMe Base Specification's
 * layout (2.0, Figure 207; 1.4, Figure 194): byte 0 Critical Warning,
 * bytes 1..2 Composite Temperature (kelvin, little endian), byte 5
 * Percentage Used, bytes 48..63 Data Units Written (128 bits, little
 * endian, in units of 1000 * 512 bytes).  The capture below is such a page
 * as a drive returns it, other fields (available spare, data units read,
 * power cycles ...) filled in too so that an offset mix-up shows.
 *
 * smart_locate() runs over a fake sysfs tree made here: the links of
 * /sys/dev/block and the device directories they point to, as the kernel
 * lays them out for an NVMe namespace, a partition of one, a namespace
 * under native multipath, a virtio disk, a loop device.
 */

#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/tiers/smart.h"

static void put_le(uint8_t *p, uint64_t v, int n) {
        for (int i = 0; i < n; i++, v >>= 8)
                p[i] = (uint8_t) v;
}

/* A page as a drive returns it: 1.2 PB written, 37 °C, 3% used, warning bit 1 (temperature) set. */
static void capture(uint8_t page[SMART_LOG_SIZE]) {
        memset(page, 0, SMART_LOG_SIZE);
        page[0] = 0x02;                         /* Critical Warning: temperature */
        put_le(page + 1, 310, 2);               /* Composite Temperature: 310 K */
        page[3] = 100;                          /* Available Spare */
        page[4] = 10;                           /* Available Spare Threshold */
        page[5] = 3;                            /* Percentage Used */
        put_le(page + 32, 987654321, 8);        /* Data Units Read */
        put_le(page + 48, 2343750000ull, 8);    /* Data Units Written: 1.2e15 bytes */
        put_le(page + 64, 5555, 8);             /* Host Read Commands */
        put_le(page + 112, 42, 8);              /* Power Cycles */
}

static void test_parse_capture(void **state) {
        uint8_t page[SMART_LOG_SIZE];
        SmartLog log;

        capture(page);
        assert_int_equal(smart_parse(page, sizeof(page), &log), 0);
        assert_int_equal(log.critical_warning, 0x02);
        assert_int_equal(log.temperature_k, 310);
        assert_int_equal(log.percentage_used, 3);
        assert_int_equal(log.data_units_written, 2343750000ull);
        assert_false(log.saturated);
        assert_int_equal(smart_bytes_written(&log), 2343750000ull * 512000ull);
}

static void test_parse_short(void **state) {
        uint8_t page[SMART_LOG_SIZE] = {};
        SmartLog log;

        assert_int_equal(smart_parse(page, SMART_LOG_SIZE - 1, &log), -EINVAL);
        assert_int_equal(smart_parse(NULL, SMART_LOG_SIZE, &log), -EINVAL);
        /* a longer buffer is fine: the page is its first 512 bytes */
        assert_int_equal(smart_parse(page, SMART_LOG_SIZE, &log), 0);
        assert_int_equal(log.data_units_written, 0);
}

/* Above 2^64 units (bytes 56..63 non-zero) the value saturates; so do bytes above 2^64 / 512000 units. */
static void test_parse_saturating(void **state) {
        uint8_t page[SMART_LOG_SIZE];
        SmartLog log;

        capture(page);
        put_le(page + 48, 7, 8);
        put_le(page + 56, 1, 8);                /* 2^64 + 7 units */
        assert_int_equal(smart_parse(page, sizeof(page), &log), 0);
        assert_true(log.saturated);
        assert_int_equal(log.data_units_written, UINT64_MAX);
        assert_int_equal(smart_bytes_written(&log), UINT64_MAX);

        /* exactly 2^64 - 1 units fits the field, not the bytes */
        capture(page);
        put_le(page + 48, UINT64_MAX, 8);
        assert_int_equal(smart_parse(page, sizeof(page), &log), 0);
        assert_false(log.saturated);
        assert_int_equal(log.data_units_written, UINT64_MAX);
        assert_int_equal(smart_bytes_written(&log), UINT64_MAX);

        /* the largest unit count whose bytes fit */
        capture(page);
        put_le(page + 48, UINT64_MAX / 512000, 8);
        assert_int_equal(smart_parse(page, sizeof(page), &log), 0);
        assert_int_equal(smart_bytes_written(&log), UINT64_MAX / 512000 * 512000);

        /* the top byte of the 128-bit field alone */
        capture(page);
        page[63] = 0x80;
        assert_int_equal(smart_parse(page, sizeof(page), &log), 0);
        assert_true(log.saturated);
        /* the neighbours are not part of it: byte 47 (end of Data Units Read) and 64 (Host Read Commands) */
        capture(page);
        memset(page + 32, 0xff, 16);
        memset(page + 64, 0xff, 16);
        put_le(page + 48, 5, 8);
        assert_int_equal(smart_parse(page, sizeof(page), &log), 0);
        assert_int_equal(log.data_units_written, 5);
        assert_false(log.saturated);
}

/* Temperature across both bytes, percentage used past 100. */
static void test_parse_fields(void **state) {
        uint8_t page[SMART_LOG_SIZE];
        SmartLog log;

        capture(page);
        put_le(page + 1, 0x1234, 2);
        page[5] = 255;
        page[0] = 0x1f;
        assert_int_equal(smart_parse(page, sizeof(page), &log), 0);
        assert_int_equal(log.temperature_k, 0x1234);
        assert_int_equal(log.percentage_used, 255);
        assert_int_equal(log.critical_warning, 0x1f);
}

/* ---- smart_locate() over a fake sysfs ---- */

static char root[PATH_MAX];

static void mkdirs(const char *rel) {
        char path[PATH_MAX * 2], *p;

        (void) snprintf(path, sizeof(path), "%s/%s", root, rel);
        for (p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
                *p = '\0';
                (void) mkdir(path, 0755);
                *p = '/';
        }
        assert_true(mkdir(path, 0755) == 0 || errno == EEXIST);
}

static void touch(const char *rel) {
        char path[PATH_MAX * 2];
        FILE *f;

        (void) snprintf(path, sizeof(path), "%s/%s", root, rel);
        f = fopen(path, "we");
        assert_non_null(f);
        fclose(f);
}

/* /sys/dev/block/MAJ:MIN -> ../../@target (relative, as the kernel makes it) */
static void devlink(unsigned maj, unsigned min, const char *target) {
        char path[PATH_MAX * 2], to[PATH_MAX];

        mkdirs("dev/block");
        mkdirs(target);
        (void) snprintf(path, sizeof(path), "%s/dev/block/%u:%u", root, maj, min);
        (void) snprintf(to, sizeof(to), "../../%s", target);
        assert_int_equal(symlink(to, path), 0);
}

static int setup(void **state) {
        (void) snprintf(root, sizeof(root), "/tmp/test-smart-XXXXXX");
        assert_non_null(mkdtemp(root));
        devlink(259, 0, "devices/pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0/nvme0n1");
        devlink(259, 1, "devices/pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0/nvme0n1/nvme0n1p1");
        touch("devices/pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0/nvme0n1/nvme0n1p1/partition");
        devlink(259, 5, "devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1");
        mkdirs("devices/virtual/nvme-subsystem/nvme-subsys1/nvme3");
        devlink(254, 0, "devices/pci0000:00/0000:00:02.0/virtio1/block/vda");
        devlink(254, 1, "devices/pci0000:00/0000:00:02.0/virtio1/block/vda/vda1");
        touch("devices/pci0000:00/0000:00:02.0/virtio1/block/vda/vda1/partition");
        devlink(7, 0, "devices/virtual/block/loop0");
        devlink(8, 0, "devices/pci0000:00/0000:00:17.0/ata3/host2/target2:0:0/2:0:0:0/block/sda");
        devlink(253, 2, "devices/virtual/block/dm-2");
        return 0;
}

static int teardown(void **state) {
        char cmd[PATH_MAX + 16];

        (void) snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
        return system(cmd) == 0 ? 0 : -1;
}

static void locate(unsigned maj, unsigned min, int want, const char *what) {
        char ctrl[64] = "x", why[256] = "";
        int r = smart_locate(root, makedev(maj, min), ctrl, sizeof(ctrl), why, sizeof(why));

        assert_int_equal(r, want);
        if (want) {
                assert_string_equal(ctrl, what);
        } else {
                assert_string_equal(ctrl, "");
                assert_string_equal(why, what);
        }
}

static void test_locate(void **state) {
        locate(259, 0, 1, "/dev/nvme0");       /* a namespace */
        locate(259, 1, 1, "/dev/nvme0");       /* a partition of it */
        locate(259, 5, 1, "/dev/nvme3");       /* native multipath: the subsystem's controller */
        locate(254, 0, 0, "virtio disk vda is not NVMe");
        locate(254, 1, 0, "virtio disk vda is not NVMe");      /* a partition: its disk is named */
        locate(7, 0, 0, "loop device loop0 is not NVMe");
        locate(8, 0, 0, "ATA disk sda is not NVMe");
        locate(253, 2, 0, "device-mapper device dm-2 is not NVMe (LVM, dm-crypt: the disks under it are not looked at)");
}

static void test_locate_none(void **state) {
        char ctrl[64], why[256];

        /* major 0: tmpfs, overlayfs, NFS ... */
        assert_int_equal(smart_locate(root, makedev(0, 45), ctrl, sizeof(ctrl), why, sizeof(why)), 0);
        assert_non_null(strstr(why, "has no block device (device 0:45)"));
        /* a device sysfs does not know */
        assert_int_equal(smart_locate(root, makedev(300, 1), ctrl, sizeof(ctrl), why, sizeof(why)), 0);
        assert_non_null(strstr(why, "block device 300:1 has no entry in"));
}

/* The real thing where there is one: $TIER_TEST_NVME names an NVMe block device or a file on one. */
static void test_read_real(void **state) {
        const char *path = getenv("TIER_TEST_NVME");
        char ctrl[64], why[256];
        struct stat st;
        SmartLog log;
        int r;

        if (!path || !*path) {
                skip();         /* no NVMe drive named; set TIER_TEST_NVME=/dev/nvme0n1 (as root) */
                return;
        }
        assert_int_equal(stat(path, &st), 0);
        r = smart_locate("/sys", S_ISBLK(st.st_mode) ? st.st_rdev : st.st_dev, ctrl, sizeof(ctrl), why, sizeof(why));
        if (r != 1)
                fail_msg("%s: %s", path, why);
        r = smart_read(ctrl, &log, why, sizeof(why));
        if (r < 0)
                fail_msg("%s: %s", ctrl, why);
        printf("%s (%s): %llu data units written, %u%% used, %u K, warning 0x%x\n", path, ctrl,
               (unsigned long long) log.data_units_written, log.percentage_used, log.temperature_k,
               log.critical_warning);
        assert_true(log.temperature_k > 200 && log.temperature_k < 400);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_parse_capture),
                cmocka_unit_test(test_parse_short),
                cmocka_unit_test(test_parse_saturating),
                cmocka_unit_test(test_parse_fields),
                cmocka_unit_test(test_locate),
                cmocka_unit_test(test_locate_none),
                cmocka_unit_test(test_read_real),
        };

        return cmocka_run_group_tests(tests, setup, teardown);
}
