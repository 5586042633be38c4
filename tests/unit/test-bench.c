/* SPDX-License-Identifier: MIT */
/* test-bench.c: tierctl bench's helpers (lists, link speed, tierd's targets, cliff, fio) and its runs. */

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/tierctl/bench.h"

static void test_bs_list(void **state) {
        uint64_t bs[BENCH_LIST_MAX];
        char err[256], many[512] = "";
        size_t n = 0;

        assert_int_equal(bench_parse_bs_list("128K,1M,4096", bs, &n, err, sizeof(err)), 0);
        assert_int_equal(n, 3);
        assert_int_equal(bs[0], 128 * 1024);
        assert_int_equal(bs[1], 1 << 20);
        assert_int_equal(bs[2], 4096);
        assert_int_equal(bench_parse_bs_list("1000", bs, &n, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "multiple of 4096"));
        assert_int_equal(bench_parse_bs_list("0", bs, &n, err, sizeof(err)), -EINVAL);
        assert_int_equal(bench_parse_bs_list("128M", bs, &n, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "64M"));
        assert_int_equal(bench_parse_bs_list("1M,,2M", bs, &n, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "empty item"));
        assert_int_equal(bench_parse_bs_list("", bs, &n, err, sizeof(err)), -EINVAL);
        assert_int_equal(bench_parse_bs_list("1M,x", bs, &n, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "'x' is not a size"));
        for (int i = 0; i <= BENCH_LIST_MAX; i++)
                strcat(many, i ? ",4K" : "4K");
        assert_int_equal(bench_parse_bs_list(many, bs, &n, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "more than"));
}

static void test_qd_list(void **state) {
        unsigned qd[BENCH_LIST_MAX];
        char err[256];
        size_t n = 0;

        assert_int_equal(bench_parse_qd_list("1,2,128", qd, &n, err, sizeof(err)), 0);
        assert_int_equal(n, 3);
        assert_int_equal(qd[2], 128);
        assert_int_equal(bench_parse_qd_list("0", qd, &n, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "out of range"));
        assert_int_equal(bench_parse_qd_list("1025", qd, &n, err, sizeof(err)), -EINVAL);
        assert_int_equal(bench_parse_qd_list("-1", qd, &n, err, sizeof(err)), -EINVAL);
        assert_int_equal(bench_parse_qd_list("4x", qd, &n, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "not a number"));
}

static void test_pcie(void **state) {
        /* Gen3 x4: 8 GT/s x 128/130 / 8 x 4 = 3.94 GB/s; Gen4 x4 7.88; Gen1 x1 0.25 */
        assert_float_equal(bench_pcie_gbps("8.0 GT/s PCIe", 4), 3.938, 0.001);
        assert_float_equal(bench_pcie_gbps("16.0 GT/s PCIe", 4), 7.877, 0.001);
        assert_float_equal(bench_pcie_gbps("2.5 GT/s PCIe", 1), 0.25, 0.0001);
        assert_float_equal(bench_pcie_gbps("Unknown", 4), 0, 0);
        assert_float_equal(bench_pcie_gbps("8.0 GT/s PCIe", 0), 0, 0);
}

static void write_file(const char *path, const char *text) {
        FILE *f = fopen(path, "we");

        assert_non_null(f);
        fputs(text, f);
        fclose(f);
}

/* A sysfs tree: an NVMe namespace under a PCIe device, and a virtio disk under another. */
static void test_link(void **state) {
        char root[] = "/tmp/test-bench-sysfs.XXXXXX", p[512], q[1200];

        assert_non_null(mkdtemp(root));
        snprintf(p, sizeof(p), "%s/devices/pci0000:00/0000:00:01.0/0000:01:00.0/nvme/nvme0/nvme0n1", root);
        snprintf(q, sizeof(q), "mkdir -p %s %s/dev/block %s/devices/pci0000:00/0000:00:02.0/virtio1/block/vda", p,
                 root, root);
        assert_int_equal(system(q), 0);
        snprintf(q, sizeof(q), "%s/devices/pci0000:00/0000:00:01.0/0000:01:00.0/current_link_speed", root);
        write_file(q, "16.0 GT/s PCIe\n");
        snprintf(q, sizeof(q), "%s/devices/pci0000:00/0000:00:01.0/0000:01:00.0/current_link_width", root);
        write_file(q, "4\n");
        snprintf(q, sizeof(q), "%s/devices/pci0000:00/0000:00:02.0/current_link_speed", root);
        write_file(q, "2.5 GT/s PCIe\n");
        snprintf(q, sizeof(q), "%s/devices/pci0000:00/0000:00:02.0/current_link_width", root);
        write_file(q, "1\n");
        snprintf(q, sizeof(q), "%s/dev/block/259:0", root);
        assert_int_equal(symlink(p, q), 0);
        snprintf(p, sizeof(p), "%s/devices/pci0000:00/0000:00:02.0/virtio1/block/vda", root);
        snprintf(q, sizeof(q), "%s/dev/block/254:0", root);
        assert_int_equal(symlink(p, q), 0);

        assert_float_equal(bench_link_gbps(root, 259, 0), 7.877, 0.001);
        /* virtio: its PCIe link says nothing about the disk */
        assert_float_equal(bench_link_gbps(root, 254, 0), 0, 0);
        assert_float_equal(bench_link_gbps(root, 8, 0), 0, 0);
        snprintf(q, sizeof(q), "rm -rf %s", root);
        assert_int_equal(system(q), 0);
}

static void test_status_targets(void **state) {
        const char *json = "{\"tiers\":[{\"name\":\"nvme\",\"path\":\"no\"}],\"targets\":[{\"path\":\"/a/t0.img\","
                           "\"capacity\":1,\"smart\":{\"path\":\"x\"}},{\"capacity\":2,\"path\":\"/b/q\\\"\\\\u.img\"}],"
                           "\"jobs\":[{\"targets\":[{\"path\":\"not this\"}]}]}";
        char **paths = NULL;
        size_t n = 0;

        assert_int_equal(bench_status_targets(json, &paths, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(paths[0], "/a/t0.img");
        assert_string_equal(paths[1], "/b/q\"\\u.img");
        for (size_t i = 0; i < n; i++)
                free(paths[i]);
        free(paths);

        assert_int_equal(bench_status_targets("{\"targets\":[]}", &paths, &n), 0);
        assert_int_equal(n, 0);
        free(paths);
        assert_int_equal(bench_status_targets("{\"jobs\":[]}", &paths, &n), -EBADMSG);
        assert_int_equal(bench_status_targets("{\"targets\":[{\"path\":\"/a", &paths, &n), -EBADMSG);
        assert_int_equal(bench_status_targets("{\"targets\":3}", &paths, &n), -EBADMSG);
}

static void test_cliff(void **state) {
        const double flat[] = { 3, 3.1, 2.9, 3, 3 };
        const double cliff[] = { 3, 3, 3, 3, 1, 0.9, 1.1, 1 };
        const double blip[] = { 3, 3, 3, 1, 3, 3, 3 };

        assert_int_equal(bench_cliff(flat, 5), -1);
        assert_int_equal(bench_cliff(cliff, 8), 4);
        assert_int_equal(bench_cliff(blip, 7), -1);
        assert_int_equal(bench_cliff(cliff, 2), -1);
        assert_int_equal(bench_cliff(NULL, 0), -1);
        /* the last interval alone is no cliff */
        assert_int_equal(bench_cliff(cliff, 5), -1);
        assert_int_equal(bench_cliff(cliff, 6), 4);
}

static void test_fio_parse(void **state) {
        /* fio 3.33's JSON for 16 MiB written in "3 ms": bw_bytes 16 MiB / 3 ms, runtime in whole ms */
        const char *out = "note: both iodepth >= 1 and synchronous I/O engine are selected\n"
                          "{\n  \"jobs\" : [\n    {\n      \"jobname\" : \"tierctl-bench\",\n"
                          "      \"job_runtime\" : 2,\n      \"read\" : {\n        \"io_bytes\" : 0,\n"
                          "        \"io_kbytes\" : 0,\n        \"bw_bytes\" : 0,\n        \"runtime\" : 0,\n"
                          "        \"slat_ns\" : {\n          \"min\" : 0\n        }\n      },\n"
                          "      \"write\" : {\n        \"io_bytes\" : 16777216,\n        \"io_kbytes\" : 16384,\n"
                          "        \"bw_bytes\" : 5592405333,\n        \"bw\" : 5461333,\n        \"iops\" : 5333.333333,\n"
                          "        \"runtime\" : 3,\n        \"total_ios\" : 16,\n"
                          "        \"clat_ns\" : {\n          \"min\" : 120000\n        }\n      }\n    }\n  ]\n}\n";
        uint64_t bytes = 1, ms = 1;

        assert_int_equal(bench_fio_parse(out, BENCH_WRITE, &bytes, &ms), 0);
        assert_int_equal(bytes, 16777216);
        assert_int_equal(ms, 3);
        /* 3 whole ms are 2.5-3.5 or so: too short to trust; run again with enough bytes for FIO_MIN_MS */
        assert_true(bench_fio_longer(bytes, ms) >= bytes * FIO_MIN_MS / ms);
        assert_int_equal(bench_fio_longer(bytes * 100, FIO_MIN_MS), 0);
        assert_int_equal(bench_fio_longer(0, 0), 0);
        assert_float_equal(bench_fio_gbps(UINT64_C(2500000000), 1000), 2.5, 1e-12);
        assert_float_equal(bench_fio_gbps(0, 0), 0, 0);
        assert_int_equal(bench_fio_parse(out, BENCH_READ, &bytes, &ms), 0);
        assert_int_equal(bytes, 0);
        assert_int_equal(ms, 0);
        /* under a millisecond: fio says 0, taken as 1 (and so run again) */
        assert_int_equal(bench_fio_parse("\"write\" : { \"io_bytes\" : 4096, \"runtime\" : 0 }", BENCH_WRITE, &bytes,
                                         &ms), 0);
        assert_int_equal(ms, 1);
        assert_int_equal(bench_fio_parse("{}", BENCH_READ, &bytes, &ms), -EBADMSG);
        assert_int_equal(bench_fio_parse("\"write\" : 3", BENCH_WRITE, &bytes, &ms), -EBADMSG);
        assert_int_equal(bench_fio_parse("\"write\" : { \"io_bytes\" : 4096 }", BENCH_WRITE, &bytes, &ms), -EBADMSG);
}

/* A one-target Bench with read and write cells of the given GB/s, bs x qd (row-major). */
static Bench *bench_of(const uint64_t *bs, size_t n_bs, const unsigned *qd, size_t n_qd, const double *rd,
                       const double *wr) {
        Bench *b = calloc(1, sizeof(Bench));
        size_t k = 0;

        assert_non_null(b);
        b->n_targets = 1;
        strcpy(b->targets[0].name, "t0");
        memcpy(b->bs, bs, n_bs * sizeof(*bs));
        b->n_bs = n_bs;
        memcpy(b->qd, qd, n_qd * sizeof(*qd));
        b->n_qd = n_qd;
        b->n_cells = 2 * n_bs * n_qd;
        b->cells = calloc(b->n_cells, sizeof(BenchCell));
        assert_non_null(b->cells);
        for (int op = 0; op < 2; op++)
                for (size_t i = 0; i < n_bs; i++)
                        for (size_t j = 0; j < n_qd; j++)
                                b->cells[k++] = (BenchCell) {
                                        .target = 0, .op = (BenchOp) op, .bs = bs[i], .qd = qd[j],
                                        .res.gbps = (op == BENCH_READ ? rd : wr)[i * n_qd + j],
                                };
        return b;
}

static void bench_free(Bench *b) {
        free(b->cells);
        free(b);
}

static void test_choose_config(void **state) {
        const uint64_t bs[] = { 128 << 10, 1 << 20, 3 << 20, 4 << 20 };
        const unsigned qd[] = { 1, 8, 32 };
        /* best mean: 3M x 32 (not a power of two: never chosen), then 4M x 32 (2.0); 1M x 8 is within 5% */
        const double rd[] = { 0.5, 0.9, 1.0,   1.0, 1.95, 2.0,   3.0, 3.0, 3.0,   1.0, 1.5, 2.0 };
        const double wr[] = { 0.5, 0.9, 1.0,   1.0, 1.95, 2.0,   3.0, 3.0, 3.0,   1.0, 1.5, 2.0 };
        const uint64_t bs_odd[] = { 3 << 20 };
        Bench *b = bench_of(bs, 4, qd, 3, rd, wr);
        char *json = NULL;

        bench_choose_config(b);
        assert_true(b->config.set);
        assert_int_equal(b->config.extent_size, 1 << 20);
        assert_int_equal(b->config.queue_depth, 8);
        assert_float_equal(b->config.read_gbps, 1.95, 1e-9);
        assert_int_equal(b->config.target, 0);
        assert_int_equal(bench_json(b, &json), 0);
        assert_non_null(strstr(json, "\"config\":{\"extent_size\":1048576,\"queue_depth\":8,\"target\":\"t0\"}"));
        assert_non_null(strstr(json, "\"fio\":null,\"fio_reason\":\"not run\""));
        assert_non_null(strstr(json, "\"sustained\":null"));
        free(json);
        bench_free(b);

        /* no power of two among the block sizes: nothing to write, and why */
        b = bench_of(bs_odd, 1, qd, 1, rd, wr);
        bench_choose_config(b);
        assert_false(b->config.set);
        assert_non_null(strstr(b->config.why, "power of two"));
        {
                char *err = NULL;

                assert_int_equal(bench_write_config(b, "/nonexistent/x.conf", &err), -EINVAL);
                assert_non_null(strstr(err, "power of two"));
                free(err);
        }
        bench_free(b);
}

/*
 * Runs through uring.c: a striped write over two files covers both whole
 * (block i on file i mod 2), the read back counts the same bytes, and the
 * queue depth, byte bound and interval figures hold.
 */
static void test_run(void **state) {
        char dir[] = "/var/tmp/test-bench.XXXXXX", path[2][128];
        const uint64_t area = 1 << 20, bs = 64 << 10;
        int fds[2];
        uint8_t *pool;
        sd_event *event = NULL;
        BenchResult res = {};
        char *err = NULL;
        BenchRunSpec spec = {
                .fds = fds,
                .n_fds = 2,
                .area = area,
                .bs = bs,
                .qd = 4,
                .op = BENCH_WRITE,
                .first_block = 3,
                .max_bytes = 2 * area,
        };
        int r;

        assert_non_null(mkdtemp(dir));
        for (int i = 0; i < 2; i++) {
                snprintf(path[i], sizeof(path[i]), "%s/f%d", dir, i);
                fds[i] = open(path[i], O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0600);
                if (fds[i] < 0 && errno == EINVAL) {
                        skip();         /* /var/tmp on a tmpfs: no O_DIRECT */
                        return;
                }
                assert_true(fds[i] >= 0);
                assert_int_equal(fallocate(fds[i], 0, 0, (off_t) area), 0);
        }
        assert_int_equal(posix_memalign((void **) &pool, 4096, 256 << 10), 0);
        memset(pool, 0xa5, 256 << 10);
        assert_int_equal(sd_event_new(&event), 0);

        r = bench_run(event, &spec, pool, 256 << 10, NULL, &res, &err);
        if (r == -ENOSYS || r == -EPERM) {
                skip();         /* no io_uring here */
                return;
        }
        assert_int_equal(r, 0);
        assert_null(err);
        assert_int_equal(res.bytes, 2 * area);
        assert_int_equal(res.n_io, 2 * area / bs);
        assert_true(res.gbps > 0);
        assert_true(res.iops > 0);
        assert_true(res.lat_us_p50 > 0);
        assert_null(res.interval_gbps);

        /* both files written whole: every byte is the pool's */
        for (int i = 0; i < 2; i++) {
                for (uint64_t off = 0; off < area; off += 256 << 10) {
                        assert_int_equal(pread(fds[i], pool, 256 << 10, (off_t) off), 256 << 10);
                        for (size_t k = 0; k < (256 << 10); k++)
                                if (pool[k] != 0xa5)
                                        fail_msg("file %d byte %zu is 0x%02x", i, (size_t) off + k, pool[k]);
                }
        }

        /* read back: a byte bound below one queue's worth still issues qd requests; intervals */
        spec.op = BENCH_READ;
        spec.max_bytes = 1;
        spec.interval_s = 10;
        bench_result_deinit(&res);
        assert_int_equal(bench_run(event, &spec, pool, 256 << 10, NULL, &res, &err), 0);
        assert_int_equal(res.n_io, 4);
        assert_int_equal(res.bytes, 4 * bs);
        assert_int_equal(res.n_intervals, 1);
        assert_true(res.last_partial);
        assert_true(res.interval_gbps[0] > 0);
        assert_float_equal(res.lat_us_p50, 0, 0);      /* no latencies kept with intervals */
        bench_result_deinit(&res);

        /* a stop set before the run: nothing is issued */
        {
                volatile sig_atomic_t stop = 1;

                assert_int_equal(bench_run(event, &spec, pool, 256 << 10, &stop, &res, &err), 0);
                assert_int_equal(res.n_io, 0);
        }

        /* bad specs */
        spec.bs = 2 * area;
        assert_int_equal(bench_run(event, &spec, pool, 256 << 10, NULL, &res, &err), -EINVAL);
        spec.bs = bs;
        spec.qd = 0;
        assert_int_equal(bench_run(event, &spec, pool, 256 << 10, NULL, &res, &err), -EINVAL);

        /* a read past what a file holds fails with words */
        spec.qd = 1;
        spec.area = 4 * area;
        assert_int_equal(ftruncate(fds[1], 0), 0);
        r = bench_run(event, &spec, pool, 256 << 10, NULL, &res, &err);
        assert_true(r < 0);
        assert_non_null(err);
        assert_non_null(strstr(err, "A read failed"));
        free(err);

        sd_event_unref(event);
        free(pool);
        for (int i = 0; i < 2; i++) {
                close(fds[i]);
                unlink(path[i]);
        }
        rmdir(dir);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_bs_list),
                cmocka_unit_test(test_qd_list),
                cmocka_unit_test(test_pcie),
                cmocka_unit_test(test_link),
                cmocka_unit_test(test_status_targets),
                cmocka_unit_test(test_cliff),
                cmocka_unit_test(test_fio_parse),
                cmocka_unit_test(test_choose_config),
                cmocka_unit_test(test_run),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
