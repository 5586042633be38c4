/* SPDX-License-Identifier: MIT */
/* test-capacity.c: the capacity rules on made-up machines, their exact messages, and reading this one. */

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/base/config.h"
#include "daemon/core/capacity.h"
#include "proto/macro.h"

#define KIB UINT64_C(1024)
#define MIB (KIB * 1024)
#define GIB (MIB * 1024)
#define TIB (GIB * 1024)

/* A 24 GiB machine as the brief saw it: MemAvailable 21.3 GiB, MemTotal 23.4 GiB. */
#define AVAIL (21811 * MIB)
#define TOTAL (23962 * MIB)

static void config_deinitp(Config *c) {
        config_deinit(c);
}
#define _cleanup_config_ _cleanup_(config_deinitp)

/* The defaults, with [host] capacity @host (segments of 64M) and no targets. */
static void config_host(Config *c, uint64_t host) {
        config_init(c);
        c->host_capacity = host;
        c->host_segment_size = 64 * MIB;
}

static void add_target(Config *c, const char *path, uint64_t size) {
        c->targets[c->n_targets] = (ConfigTarget) { .path = strdup(path), .size = size };
        assert_non_null(c->targets[c->n_targets].path);
        c->n_targets++;
}

/* A machine with @avail of @total available, no cgroup limit, CAP_IPC_LOCK, VRAM on a GPU. */
static CapacityFacts machine(uint64_t avail, uint64_t total) {
        return (CapacityFacts) {
                .mem_total = total,
                .mem_available = avail,
                .cgroup_limit = UINT64_MAX,
                .memlock_limit = UINT64_MAX,
                .cap_ipc_lock = true,
        };
}

static void expect_ok(const Config *c, const CapacityFacts *f) {
        _cleanup_free_ char *msg = NULL;
        int r = capacity_check(c, f, &msg);

        if (r != 0)
                fail_msg("refused (%d): %s", r, msg ? msg : "(no message)");
        assert_null(msg);
}

static void expect_refused(const Config *c, const CapacityFacts *f, const char *message) {
        _cleanup_free_ char *msg = NULL;

        assert_int_equal(capacity_check(c, f, &msg), CAPACITY_REFUSED);
        assert_non_null(msg);
        assert_null(strchr(msg, '\n'));         /* one line */
        assert_string_equal(msg, message);
}

/* ---- host memory ------------------------------------------------------------------------ */

static void test_host_fits(void **state) {
        _cleanup_config_ Config c;
        _cleanup_free_ char *msg = NULL;
        CapacityFacts f = machine(AVAIL, TOTAL);

        config_host(&c, 16 * GIB);
        expect_ok(&c, &f);
        /* 90% of MemAvailable, rounded down to whole segments, is the most */
        c.host_capacity = AVAIL / 100 * 90 / (64 * MIB) * (64 * MIB);
        expect_ok(&c, &f);
        c.host_capacity += 64 * MIB;
        assert_int_equal(capacity_check(&c, &f, &msg), CAPACITY_REFUSED);
}

static void test_host_above_memavailable(void **state) {
        _cleanup_config_ Config c;
        CapacityFacts f = machine(AVAIL, TOTAL);

        config_host(&c, 32 * GIB);
        expect_refused(&c, &f,
                       "[host] capacity = 32G is more than this machine can lock: MemAvailable 21.3 GiB "
                       "(MemTotal 23.4 GiB); at most about 19.2 GiB (90% of MemAvailable); "
                       "set [host] capacity = 19G");
        /* the suggestion passes */
        c.host_capacity = 19 * GIB;
        expect_ok(&c, &f);
}

static void test_host_above_cgroup(void **state) {
        _cleanup_config_ Config c;
        CapacityFacts f = machine(AVAIL, TOTAL);

        f.cgroup_limit = 4 * GIB;
        f.cgroup_usage = 100 * MIB;
        snprintf(f.cgroup_file, sizeof(f.cgroup_file), "/sys/fs/cgroup/memory/job/memory.limit_in_bytes");
        config_host(&c, 8 * GIB);
        expect_refused(&c, &f,
                       "[host] capacity = 8G is more than tierd's memory cgroup allows: limit 4.0 GiB "
                       "(/sys/fs/cgroup/memory/job/memory.limit_in_bytes), 100.0 MiB of it in use; "
                       "at most about 3.5 GiB (90% of what the limit leaves); set [host] capacity = 3584M");
        c.host_capacity = 3584 * MIB;
        expect_ok(&c, &f);
        /* a cgroup limit above MemAvailable: MemAvailable decides */
        f.cgroup_limit = 64 * GIB;
        c.host_capacity = 32 * GIB;
        expect_refused(&c, &f,
                       "[host] capacity = 32G is more than this machine can lock: MemAvailable 21.3 GiB "
                       "(MemTotal 23.4 GiB); at most about 19.2 GiB (90% of MemAvailable); "
                       "set [host] capacity = 19G");
}

static void test_memlock_without_cap(void **state) {
        _cleanup_config_ Config c;
        CapacityFacts f = machine(AVAIL, TOTAL);

        config_host(&c, GIB);
        f.cap_ipc_lock = false;
        f.memlock_limit = 64 * MIB;
        expect_refused(&c, &f,
                       "[host] capacity = 1G is more than tierd may lock: RLIMIT_MEMLOCK 64.0 MiB and no "
                       "CAP_IPC_LOCK (mlock() and io_uring's fixed buffers both count against it); "
                       "at most 64.0 MiB; set [host] capacity = 64M, or raise LimitMEMLOCK= or grant CAP_IPC_LOCK");
        /* below one segment: smaller segments */
        f.memlock_limit = 8 * MIB;
        expect_refused(&c, &f,
                       "[host] capacity = 1G is more than tierd may lock: RLIMIT_MEMLOCK 8.0 MiB and no "
                       "CAP_IPC_LOCK (mlock() and io_uring's fixed buffers both count against it); "
                       "at most 8.0 MiB; set [host] capacity = 8M and segment_size = 8M, or raise "
                       "LimitMEMLOCK= or grant CAP_IPC_LOCK");
        /* the capability lifts the limit; so does an unlimited RLIMIT_MEMLOCK */
        f.cap_ipc_lock = true;
        expect_ok(&c, &f);
        f.cap_ipc_lock = false;
        f.memlock_limit = UINT64_MAX;
        expect_ok(&c, &f);
        /* exactly the limit is allowed */
        f.memlock_limit = GIB;
        expect_ok(&c, &f);
}

static void test_uring_buffers(void **state) {
        _cleanup_config_ Config c;
        CapacityFacts f = machine(100 * TIB, 128 * TIB);

        /* 16384 segments of 64M fit one ring; one more does not */
        config_host(&c, TIB);
        expect_ok(&c, &f);
        c.host_capacity = TIB + 64 * MIB;
        expect_refused(&c, &f,
                       "[host] capacity = 1048640M is more than io_uring can register: 16385 segments of 64M, "
                       "and one ring takes at most 16384 fixed buffers; at most 1T with segment_size = 64M; "
                       "set [host] capacity = 1T (or a larger [host] segment_size: up to 1G, for 16T)");
}

static void test_64t(void **state) {
        _cleanup_config_ Config c;
        CapacityFacts big = machine(100 * TIB, 128 * TIB), small = machine(AVAIL, TOTAL);

        config_host(&c, 64 * TIB);
        /* a machine with the memory: io_uring's limit decides */
        expect_refused(&c, &big,
                       "[host] capacity = 64T is more than io_uring can register: 1048576 segments of 64M, "
                       "and one ring takes at most 16384 fixed buffers; at most 1T with segment_size = 64M; "
                       "set [host] capacity = 1T (or a larger [host] segment_size: up to 1G, for 16T)");
        c.host_segment_size = GIB;
        expect_refused(&c, &big,
                       "[host] capacity = 64T is more than io_uring can register: 65536 segments of 1G, "
                       "and one ring takes at most 16384 fixed buffers; at most 16T with segment_size = 1G; "
                       "set [host] capacity = 16T");
        /* this machine: the tighter rule is named, and its suggestion passes every rule */
        c.host_segment_size = 64 * MIB;
        expect_refused(&c, &small,
                       "[host] capacity = 64T is more than this machine can lock: MemAvailable 21.3 GiB "
                       "(MemTotal 23.4 GiB); at most about 19.2 GiB (90% of MemAvailable); "
                       "set [host] capacity = 19G");
}

static void test_emulated_vram(void **state) {
        _cleanup_config_ Config c;
        CapacityFacts f = machine(AVAIL, TOTAL);

        config_host(&c, 16 * GIB);
        c.vram_capacity = 8 * GIB;
        /* on a GPU the VRAM is not host memory (vram-cuda.c cuts it to the device's free memory) */
        expect_ok(&c, &f);

        f.vram_emulated = true;
        expect_refused(&c, &f,
                       "[host] capacity = 16G with the emulated [vram] capacity = 8G (host memory too) is more "
                       "than this machine can hold: MemAvailable 21.3 GiB (MemTotal 23.4 GiB); at most about "
                       "19.2 GiB for both (90% of MemAvailable); set [host] capacity = 11G");
        c.host_capacity = 11 * GIB;
        expect_ok(&c, &f);

        /* the VRAM alone leaves no room: it is the one to shrink */
        c.host_capacity = GIB;
        c.vram_capacity = 30 * GIB;
        expect_refused(&c, &f,
                       "[vram] capacity = 30G (emulated: host memory) with [host] capacity = 1G is more than "
                       "this machine can hold: MemAvailable 21.3 GiB (MemTotal 23.4 GiB); at most about "
                       "19.2 GiB for both (90% of MemAvailable); set [vram] capacity = 18G");
        c.vram_capacity = 18 * GIB;
        expect_ok(&c, &f);

        /* capacity = 0: the emulated backend's default, 1G, counts */
        c.vram_capacity = 0;
        c.host_capacity = 19 * GIB;
        expect_refused(&c, &f,
                       "[host] capacity = 19G with the emulated [vram] capacity = 1G (host memory too) is more "
                       "than this machine can hold: MemAvailable 21.3 GiB (MemTotal 23.4 GiB); at most about "
                       "19.2 GiB for both (90% of MemAvailable); set [host] capacity = 18G");
        assert_int_equal(capacity_host_bytes(&c, true), 20 * GIB);
        assert_int_equal(capacity_host_bytes(&c, false), 19 * GIB);
}

/* A reload: the running pools' memory comes back at the restart that would apply the new file. */
static void test_reload_counts_running_pools(void **state) {
        _cleanup_config_ Config c;
        CapacityFacts f = machine(2 * GIB, TOTAL);

        config_host(&c, 16 * GIB);
        f.vram_emulated = true;
        f.held = 17 * GIB;      /* 16G host pool and the 1G emulated VRAM running now */
        expect_ok(&c, &f);
        c.host_capacity = 32 * GIB;
        expect_refused(&c, &f,
                       "[host] capacity = 32G with the emulated [vram] capacity = 1G (host memory too) is more "
                       "than this machine can hold: MemAvailable 2.0 GiB, plus the 17.0 GiB tierd's running "
                       "pools hold (MemTotal 23.4 GiB); at most about 17.1 GiB for both (90% of MemAvailable "
                       "and the running pools); set [host] capacity = 16G");
}

/* Facts that could not be read skip their rule. */
static void test_unknown_facts(void **state) {
        _cleanup_config_ Config c;
        CapacityFacts f = machine(0, 0);

        config_host(&c, 64 * GIB);
        expect_ok(&c, &f);
        add_target(&c, "/data/t0.img", 100 * TIB);
        f.targets[0].kind = CAPACITY_TARGET_UNKNOWN;
        expect_ok(&c, &f);
}

/* ---- NVMe targets ------------------------------------------------------------------------ */

static void test_target_above_free(void **state) {
        _cleanup_config_ Config c;
        CapacityFacts f = machine(AVAIL, TOTAL);

        config_host(&c, GIB);
        add_target(&c, "/data/t0.img", 100 * GIB);
        f.targets[0] = (CapacityTarget) { .kind = CAPACITY_TARGET_NEW, .fs_id = 1, .fs_free = 50 * GIB };
        expect_refused(&c, &f,
                       "[nvme] target = /data/t0.img:100G is more than the filesystem can hold: 50.0 GiB free on "
                       "/data; at most about 50.0 GiB; set [nvme] target = /data/t0.img:50G");
        c.targets[0].size = 50 * GIB;
        expect_ok(&c, &f);
        /* a size of 0 (the file's own) allocates nothing */
        c.targets[0].size = 0;
        expect_ok(&c, &f);
}

static void test_target_in_root(void **state) {
        _cleanup_config_ Config c;
        CapacityFacts f = machine(AVAIL, TOTAL);

        config_host(&c, GIB);
        add_target(&c, "/t0.img", 64 * GIB);
        f.targets[0] = (CapacityTarget) { .kind = CAPACITY_TARGET_NEW, .fs_id = 1, .fs_free = 1536 * MIB };
        expect_refused(&c, &f,
                       "[nvme] target = /t0.img:64G is more than the filesystem can hold: 1.5 GiB free on /; "
                       "at most about 1.5 GiB; set [nvme] target = /t0.img:1536M");
        f.targets[0].fs_free = 512 * KIB;
        expect_refused(&c, &f,
                       "[nvme] target = /t0.img:64G is more than the filesystem can hold: 512.0 KiB free on /; "
                       "not one extent fits: free space there or put the target elsewhere");
}

static void test_target_preallocated(void **state) {
        _cleanup_config_ Config c;
        CapacityFacts f = machine(AVAIL, TOTAL);

        config_host(&c, GIB);
        add_target(&c, "/data/t0.img", 100 * GIB);
        /* the file holds its 100G already: nothing to allocate, however full the filesystem */
        f.targets[0] = (CapacityTarget) {
                .kind = CAPACITY_TARGET_FILE,
                .fs_id = 1,
                .fs_free = GIB,
                .file_size = 100 * GIB,
                .file_allocated = 100 * GIB,
        };
        expect_ok(&c, &f);
        c.targets[0].size = 101 * GIB;
        expect_ok(&c, &f);
        c.targets[0].size = 120 * GIB;
        expect_refused(&c, &f,
                       "[nvme] target = /data/t0.img:120G is more than the filesystem can hold: 1.0 GiB free on "
                       "/data, plus the 100.0 GiB the file holds already; at most about 101.0 GiB; "
                       "set [nvme] target = /data/t0.img:101G");

        /* a sparse file holds nothing: growing it allocates all of it */
        f.targets[0].file_allocated = 0;
        f.targets[0].file_size = 10 * GIB;
        c.targets[0].size = 20 * GIB;
        expect_refused(&c, &f,
                       "[nvme] target = /data/t0.img:20G is more than the filesystem can hold: 1.0 GiB free on "
                       "/data; at most about 1.0 GiB; set [nvme] target = /data/t0.img:1G");
}

static void test_targets_share_filesystem(void **state) {
        _cleanup_config_ Config c;
        CapacityFacts f = machine(AVAIL, TOTAL);

        config_host(&c, GIB);
        add_target(&c, "/data/a.img", 30 * GIB);
        add_target(&c, "/data/b.img", 30 * GIB);
        f.targets[0] = (CapacityTarget) { .kind = CAPACITY_TARGET_NEW, .fs_id = 7, .fs_free = 50 * GIB };
        f.targets[1] = f.targets[0];
        expect_refused(&c, &f,
                       "[nvme] target = /data/b.img:30G is more than the filesystem can hold: 50.0 GiB free on "
                       "/data, of which the targets listed before it take 30.0 GiB; at most about 20.0 GiB; "
                       "set [nvme] target = /data/b.img:20G");
        /* on two filesystems each has its own space */
        f.targets[1].fs_id = 8;
        expect_ok(&c, &f);
}

static void test_target_block_device(void **state) {
        _cleanup_config_ Config c;
        CapacityFacts f = machine(AVAIL, TOTAL);

        config_host(&c, GIB);
        add_target(&c, "/dev/nvme1n1", 2 * TIB);
        f.targets[0] = (CapacityTarget) { .kind = CAPACITY_TARGET_BLOCK, .device_size = TIB };
        expect_refused(&c, &f,
                       "[nvme] target = /dev/nvme1n1:2T is more than the device holds: 1.0 TiB; "
                       "set [nvme] target = /dev/nvme1n1 (the whole device)");
        c.targets[0].size = TIB;
        expect_ok(&c, &f);
        c.targets[0].size = 0;
        expect_ok(&c, &f);
}

/* The host pool is checked before the targets: one line, the first refusal. */
static void test_first_refusal_only(void **state) {
        _cleanup_config_ Config c;
        _cleanup_free_ char *msg = NULL;
        CapacityFacts f = machine(AVAIL, TOTAL);

        config_host(&c, 32 * GIB);
        add_target(&c, "/data/t0.img", 100 * GIB);
        f.targets[0] = (CapacityTarget) { .kind = CAPACITY_TARGET_NEW, .fs_id = 1, .fs_free = GIB };
        assert_int_equal(capacity_check(&c, &f, &msg), CAPACITY_REFUSED);
        assert_non_null(strstr(msg, "[host] capacity = 32G"));
        assert_null(strstr(msg, "[nvme]"));
}

/* ---- the memory cgroup, on a made-up /sys/fs/cgroup ---------------------------------------- */

static char cgdir[] = "/var/tmp/tierd-capacity-cg.XXXXXX";

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        return remove(path);
}

static int cgdir_setup(void **state) {
        return mkdtemp(cgdir) ? 0 : -1;
}

static int cgdir_teardown(void **state) {
        return nftw(cgdir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Write @text to @cgdir/@rel, making the directories on the way. */
static void put(const char *rel, const char *text) {
        char path[512];
        FILE *f;

        snprintf(path, sizeof(path), "%s/%s", cgdir, rel);
        for (char *p = path + strlen(cgdir) + 1; (p = strchr(p, '/')); p++) {
                *p = '\0';
                assert_true(mkdir(path, 0755) == 0 || errno == EEXIST);
                *p = '/';
        }
        f = fopen(path, "we");
        assert_non_null(f);
        fputs(text, f);
        assert_int_equal(fclose(f), 0);
}

static CapacityFacts read_cgroup_facts(const char *proc) {
        CapacityFacts f = machine(AVAIL, TOTAL);
        char path[512];

        snprintf(path, sizeof(path), "%s/%s", cgdir, proc);
        capacity_read_cgroup(path, cgdir, &f);
        return f;
}

static void test_read_cgroup(void **state) {
        CapacityFacts f;
        char want[512];

        /* v1: the tightest of the cgroup and its parents, by what each leaves; v2 is ignored then */
        put("proc-v1", "9:pids:/a/b\n4:memory,foo:/a/b\n0::/elsewhere\n");
        put("memory/memory.limit_in_bytes", "9223372036854771712\n");     /* the root: no limit */
        put("memory/a/memory.limit_in_bytes", "4294967296\n");
        put("memory/a/memory.usage_in_bytes", "1073741824\n");
        put("memory/a/memory.stat", "cache 1\ntotal_inactive_file 536870912\n");
        put("memory/a/b/memory.limit_in_bytes", "6442450944\n");
        put("memory/a/b/memory.usage_in_bytes", "104857600\n");
        f = read_cgroup_facts("proc-v1");
        assert_int_equal(f.cgroup_limit, 4 * GIB);
        assert_int_equal(f.cgroup_usage, 512 * MIB);
        snprintf(want, sizeof(want), "%s/memory/a/memory.limit_in_bytes", cgdir);
        assert_string_equal(f.cgroup_file, want);

        /* v2: memory.max, "max" for none */
        put("proc-v2", "0::/s/t\n");
        put("s/t/memory.max", "max\n");
        put("s/t/memory.current", "4096\n");
        put("s/memory.max", "2147483648\n");
        put("s/memory.current", "1073741824\n");
        put("s/memory.stat", "anon 1\ninactive_file 0\n");
        f = read_cgroup_facts("proc-v2");
        assert_int_equal(f.cgroup_limit, 2 * GIB);
        assert_int_equal(f.cgroup_usage, GIB);
        snprintf(want, sizeof(want), "%s/s/memory.max", cgdir);
        assert_string_equal(f.cgroup_file, want);

        /* no limit anywhere, or nothing to read: left as it was */
        put("proc-root", "0::/\n");
        f = read_cgroup_facts("proc-root");
        assert_int_equal(f.cgroup_limit, UINT64_MAX);
        f = read_cgroup_facts("no-such-file");
        assert_int_equal(f.cgroup_limit, UINT64_MAX);
        assert_string_equal(f.cgroup_file, "");
}

/* ---- this machine ------------------------------------------------------------------------ */

static char dir[] = "/var/tmp/tierd-capacity.XXXXXX";

static int tempdir_setup(void **state) {
        return mkdtemp(dir) ? 0 : -1;
}

static int tempdir_teardown(void **state) {
        char path[sizeof(dir) + 16];

        snprintf(path, sizeof(path), "%s/t0.img", dir);
        (void) unlink(path);
        return rmdir(dir) < 0 ? -1 : 0;
}

static void test_facts_read(void **state) {
        _cleanup_config_ Config c;
        CapacityFacts f;
        char path[sizeof(dir) + 16], missing[sizeof(dir) + 16], absent_dir[sizeof(dir) + 32];
        _cleanup_close_ int fd = -1;

        config_host(&c, 8 * MIB);
        c.host_segment_size = 4 * MIB;
        snprintf(path, sizeof(path), "%s/t0.img", dir);
        snprintf(missing, sizeof(missing), "%s/t1.img", dir);
        snprintf(absent_dir, sizeof(absent_dir), "%s/nowhere/t2.img", dir);
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        assert_int_equal(ftruncate(fd, 1 * MIB), 0);
        add_target(&c, path, 4 * MIB);
        add_target(&c, missing, 4 * MIB);
        add_target(&c, absent_dir, 4 * MIB);

        c.vram_backend = VRAM_BACKEND_EMULATED;
        assert_int_equal(capacity_facts_read(&c, -1, &f), 0);
        assert_true(f.mem_total > 0);
        assert_true(f.mem_available > 0 && f.mem_available <= f.mem_total);
        assert_true(f.memlock_limit > 0);
        assert_true(f.vram_emulated);
        assert_int_equal(f.held, 0);
        if (f.cgroup_limit != UINT64_MAX)
                assert_non_null(strstr(f.cgroup_file, "memory."));

        assert_int_equal(f.targets[0].kind, CAPACITY_TARGET_FILE);
        assert_int_equal(f.targets[0].file_size, 1 * MIB);
        assert_true(f.targets[0].fs_free > 0);
        assert_int_equal(f.targets[1].kind, CAPACITY_TARGET_NEW);
        assert_int_equal(f.targets[1].fs_id, f.targets[0].fs_id);
        assert_int_equal(f.targets[2].kind, CAPACITY_TARGET_UNKNOWN);

        /* the caller's word on the VRAM backend wins; cuda is never host memory */
        assert_int_equal(capacity_facts_read(&c, 0, &f), 0);
        assert_false(f.vram_emulated);
        c.vram_backend = VRAM_BACKEND_CUDA;
        assert_int_equal(capacity_facts_read(&c, -1, &f), 0);
        assert_false(f.vram_emulated);

        /* a small pool passes on this machine */
        expect_ok(&c, &f);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_host_fits),
                cmocka_unit_test(test_host_above_memavailable),
                cmocka_unit_test(test_host_above_cgroup),
                cmocka_unit_test(test_memlock_without_cap),
                cmocka_unit_test(test_uring_buffers),
                cmocka_unit_test(test_64t),
                cmocka_unit_test(test_emulated_vram),
                cmocka_unit_test(test_reload_counts_running_pools),
                cmocka_unit_test(test_unknown_facts),
                cmocka_unit_test(test_target_above_free),
                cmocka_unit_test(test_target_in_root),
                cmocka_unit_test(test_target_preallocated),
                cmocka_unit_test(test_targets_share_filesystem),
                cmocka_unit_test(test_target_block_device),
                cmocka_unit_test(test_first_refusal_only),
                cmocka_unit_test_setup_teardown(test_read_cgroup, cgdir_setup, cgdir_teardown),
                cmocka_unit_test_setup_teardown(test_facts_read, tempdir_setup, tempdir_teardown),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
