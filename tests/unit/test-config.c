/* SPDX-License-Identifier: MIT */
/* test-config.c: tierd.conf parsing, validation, drop-ins and error messages. */

#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <cmocka.h>

#include "daemon/base/config.h"
#include "daemon/core/reload.h"
#include "proto/macro.h"
#include "tests/unit/config-fixture.h"

#define KIB UINT64_C(1024)
#define MIB (KIB * 1024)
#define GIB (MIB * 1024)


/* Parse @text, then expect config_finish() to fail with a message containing @needle. */
static void finish_fails(const char *text, const char *needle) {
        _cleanup_config_ Config c;
        _cleanup_free_ char *error = NULL;

        config_init(&c);
        parse_text_ok(&c, text);
        assert_int_equal(config_finish(&c, &error), -EINVAL);
        assert_non_null(error);
        if (!strstr(error, needle))
                fail_msg("message '%s' lacks '%s'", error, needle);
}

/*
 * Sizes in tierd.conf are util's one size syntax (util/size.h, tested in
 * test-size): K..E in either case, an optional B or iB; what config adds is
 * the per-key range and the message.
 */
static void test_parse_size(_unused_ void **state) {
        static const struct {
                const char *s;
                uint64_t v;
        } good[] = {
                { "4096", 4096 }, { "4096B", 4096 }, { "64K", 64 * KIB }, { "512m", 512 * MIB },
                { "1G", GIB }, { "1GiB", GIB }, { "1giB", GIB }, { "2T", 2048 * GIB }, { "1P", 1024 * 1024 * GIB },
        };
        static const char *const bad[] = { "-1", "1.5G", "1Q", "1 G", "0x10", "1Gb", "1gb", "99999999999999999999" };

        for (size_t i = 0; i < ELEMENTSOF(good); i++) {
                _cleanup_config_ Config c;
                char text[64];

                config_init(&c);
                snprintf(text, sizeof(text), "[host]\njob_limit = %s\n", good[i].s);
                parse_text_ok(&c, text);
                assert_int_equal(c.host_job_limit, good[i].v);
        }
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                _cleanup_config_ Config c;
                _cleanup_free_ char *err = NULL;
                char text[64];

                config_init(&c);
                snprintf(text, sizeof(text), "[host]\njob_limit = %s\n", bad[i]);
                assert_int_equal(config_parse_text(&c, text, "test.conf", &err), -EINVAL);
                assert_non_null(strstr(err, "test.conf:2: [host] job_limit: invalid size"));
        }
}

static void test_vram_backend_strings(_unused_ void **state) {
        for (int k = 0; k < _VRAM_BACKEND_MAX; k++)
                assert_int_equal(vram_backend_from_string(vram_backend_to_string(k)), k);
        assert_string_equal(vram_backend_to_string(VRAM_BACKEND_CUDA), "cuda");
        assert_null(vram_backend_to_string(_VRAM_BACKEND_MAX));
        assert_null(vram_backend_to_string(_VRAM_BACKEND_INVALID));
        assert_int_equal(vram_backend_from_string("CUDA"), _VRAM_BACKEND_INVALID);
        assert_int_equal(vram_backend_from_string(NULL), _VRAM_BACKEND_INVALID);
}

static void test_defaults(_unused_ void **state) {
        _cleanup_config_ Config c;
        _cleanup_free_ char *error = NULL;

        config_init(&c);
        assert_string_equal(c.socket_path, "/run/tierd/tierd.sock");
        assert_string_equal(c.state_dir, "/var/lib/tierd");
        assert_int_equal(c.log_level, LOG_INFO);
        assert_int_equal(c.linger_usec, 30 * UINT64_C(1000000));
        assert_int_equal(c.max_connections, 1024);
        assert_int_equal(c.max_connections_per_uid, 64);
        assert_int_equal(c.max_message, 64 * KIB);
        assert_int_equal(c.max_tensors, 65536);
        assert_int_equal(c.max_tensors_per_uid, 262144);
        assert_int_equal(c.max_inflight, 256);
        assert_int_equal(c.max_name, 255);
        assert_int_equal(c.host_capacity, GIB);
        assert_int_equal(c.host_segment_size, 64 * MIB);
        assert_int_equal(c.numa_node, -1);
        assert_int_equal(c.host_job_limit, 512 * MIB);
        assert_int_equal(c.vram_backend, VRAM_BACKEND_AUTO);
        assert_int_equal(c.vram_capacity, GIB);
        assert_int_equal(c.vram_chunk_size, 64 * MIB);
        assert_int_equal(c.vram_job_limit, 512 * MIB);
        assert_int_equal(c.vram_bandwidth, 0);
        assert_int_equal(c.n_targets, 0);
        assert_int_equal(c.nvme_extent_size, MIB);
        assert_int_equal(c.nvme_queue_depth, 64);
        assert_int_equal(c.nvme_checksum_threads, 1);
        assert_true(c.nvme_persist);
        assert_int_equal(c.host_uid_share, 50);
        assert_int_equal(c.vram_uid_share, 50);
        assert_int_equal(c.nvme_uid_share, 50);
        assert_int_equal(c.nvme_job_limit, 2 * GIB);
        assert_int_equal(c.nvme_bandwidth, 0);

        /* The defaults are valid; finishing adds the default target. */
        assert_int_equal(config_finish(&c, &error), 0);
        assert_null(error);
        assert_int_equal(c.n_targets, 1);
        assert_string_equal(c.targets[0].path, "/var/lib/tierd/nvme0.img");
        assert_int_equal(c.targets[0].size, 4 * GIB);

        /* Finishing twice changes nothing. */
        assert_int_equal(config_finish(&c, &error), 0);
        assert_int_equal(c.n_targets, 1);
        assert_string_equal(c.targets[0].path, "/var/lib/tierd/nvme0.img");

        /* An empty text, and the sample file (every key commented out), change nothing. */
        parse_text_ok(&c, "");
        parse_text_ok(&c, "\n\n   \n");
        assert_string_equal(c.socket_path, "/run/tierd/tierd.sock");

        /* deinit twice is harmless. */
        config_deinit(&c);
        config_deinit(&c);
}

static const char full_config[] =
        "# A full configuration, every key set away from its default.\n"
        "; semicolon comment\n"
        "\n"
        "[daemon]\n"
        "socket = /run/test/t.sock\n"
        "state_dir=/srv/tierd/\n"
        "  log_level   =   debug   \n"
        "linger_sec = 0\n"
        "\tmax_connections = 10\r\n"
        "max_connections_per_uid = 2\n"
        "\n"
        "[limits]\n"
        "max_message = 1M\n"
        "max_tensors = 1000\n"
        "max_inflight = 65536\n"
        "max_name = 16\n"
        "\n"
        "[ host ]\n"
        "capacity = 2GiB\n"
        "segment_size = 128M\n"
        "numa_node = 1\n"
        "job_limit = 1G\n"
        "\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 4G\n"
        "chunk_size = 2M\n"
        "job_limit = 3G\n"
        "bandwidth = 12G\n"
        "\n"
        "[nvme]\n"
        "target = /dev/nvme0n1\n"
        "target = relative.img:8G\n"
        "target = /mnt/a:b\n"
        "target = /mnt/c:d:1T\n"
        "extent_size = 4M\n"
        "queue_depth = 4096\n"
        "checksum_threads = 0\n"
        "job_limit = 100G\n"
        "bandwidth = 500M\n"
        "persist = no\n"
        "# trailing comment without newline";

static void test_full(_unused_ void **state) {
        _cleanup_config_ Config c;
        _cleanup_free_ char *error = NULL;

        config_init(&c);
        parse_text_ok(&c, full_config);

        assert_string_equal(c.socket_path, "/run/test/t.sock");
        assert_string_equal(c.state_dir, "/srv/tierd/");
        assert_int_equal(c.log_level, LOG_DEBUG);
        assert_int_equal(c.linger_usec, 0);
        assert_int_equal(c.max_connections, 10);
        assert_int_equal(c.max_connections_per_uid, 2);
        assert_int_equal(c.max_message, MIB);
        assert_int_equal(c.max_tensors, 1000);
        assert_int_equal(c.max_inflight, 65536);
        assert_int_equal(c.max_name, 16);
        assert_int_equal(c.host_capacity, 2 * GIB);
        assert_int_equal(c.host_segment_size, 128 * MIB);
        assert_int_equal(c.numa_node, 1);
        assert_int_equal(c.host_job_limit, GIB);
        assert_int_equal(c.vram_backend, VRAM_BACKEND_EMULATED);
        assert_int_equal(c.vram_capacity, 4 * GIB);
        assert_int_equal(c.vram_chunk_size, 2 * MIB);
        assert_int_equal(c.vram_job_limit, 3 * GIB);
        assert_int_equal(c.vram_bandwidth, 12 * GIB);
        assert_int_equal(c.nvme_extent_size, 4 * MIB);
        assert_int_equal(c.nvme_queue_depth, 4096);
        assert_int_equal(c.nvme_checksum_threads, 0);
        assert_int_equal(c.nvme_job_limit, 100 * GIB);
        assert_int_equal(c.nvme_bandwidth, 500 * MIB);
        assert_false(c.nvme_persist);

        /* PATH[:SIZE] splits at the last ':' only before a size. */
        assert_int_equal(c.n_targets, 4);
        assert_string_equal(c.targets[0].path, "/dev/nvme0n1");
        assert_int_equal(c.targets[0].size, 0);
        assert_string_equal(c.targets[1].path, "relative.img");
        assert_int_equal(c.targets[1].size, 8 * GIB);
        assert_string_equal(c.targets[2].path, "/mnt/a:b");
        assert_int_equal(c.targets[2].size, 0);
        assert_string_equal(c.targets[3].path, "/mnt/c:d");
        assert_int_equal(c.targets[3].size, 1024 * GIB);

        assert_int_equal(config_finish(&c, &error), 0);
        assert_null(error);
        assert_int_equal(c.n_targets, 4);
        assert_string_equal(c.targets[1].path, "/srv/tierd/relative.img");
        assert_string_equal(c.targets[0].path, "/dev/nvme0n1");

        /* Later assignments override; numa auto and linger conversion. */
        parse_text_ok(&c, "[host]\nnuma_node = auto\n[daemon]\nlinger_sec = 90\nlog_level = err\n");
        assert_int_equal(c.numa_node, -1);
        assert_int_equal(c.linger_usec, 90 * UINT64_C(1000000));
        assert_int_equal(c.log_level, LOG_ERR);

        /* An empty "target =" drops the list. */
        parse_text_ok(&c, "[nvme]\ntarget =\ntarget = /x.img:1G\n");
        assert_int_equal(c.n_targets, 1);
        assert_string_equal(c.targets[0].path, "/x.img");
}

static void test_log_levels(_unused_ void **state) {
        static const struct {
                const char *name;
                int level;
        } levels[] = {
                { "err", LOG_ERR }, { "warning", LOG_WARNING }, { "notice", LOG_NOTICE },
                { "info", LOG_INFO }, { "debug", LOG_DEBUG },
        };
        _cleanup_config_ Config c;

        config_init(&c);
        for (size_t i = 0; i < ELEMENTSOF(levels); i++) {
                char text[64];

                snprintf(text, sizeof(text), "[daemon]\nlog_level = %s\n", levels[i].name);
                parse_text_ok(&c, text);
                assert_int_equal(c.log_level, levels[i].level);
        }
}

static void test_syntax_errors(_unused_ void **state) {
        parse_fails("[daemon]\nlog_level = info\nbogus = 1\n",
                    "test.conf:3:", "[daemon]", "bogus", "unknown key", NULL);
        /* A key that exists, but in another section. */
        parse_fails("[host]\nsocket = /x\n", "test.conf:2:", "[host]", "socket", NULL);
        parse_fails("\n[daemon]\n[nosuch]\n", "test.conf:3:", "nosuch", "unknown section", NULL);
        parse_fails("# comment\nsocket = /run/x.sock\n[daemon]\n", "test.conf:2:", "socket", NULL);
        parse_fails("[daemon]\n\nlog_level info\n", "test.conf:3:", "[daemon]", "log_level info", "'='", NULL);
        parse_fails("[daemon]\n= info\n", "test.conf:2:", "missing key", NULL);
        parse_fails("[daemon\n", "test.conf:1:", "section", NULL);
        /* Comments are whole lines only. */
        parse_fails("[host]\ncapacity = 1G # one gig\n", "test.conf:2:", "capacity", "1G # one gig", NULL);
}

static void test_value_errors(_unused_ void **state) {
        parse_fails("[host]\ncapacity = abc\n",
                    "test.conf:2: [host] capacity: invalid size 'abc'", NULL);
        parse_fails("[host]\ncapacity =\n", "test.conf:2:", "capacity", "invalid size", NULL);
        parse_fails("[host]\ncapacity = -1G\n", "test.conf:2:", "capacity", NULL);
        parse_fails("[host]\ncapacity = 0\n", "test.conf:2:", "capacity", NULL);
        parse_fails("[host]\njob_limit = 99999999999999999999\n", "test.conf:2:", "job_limit", NULL);
        parse_fails("[daemon]\nmax_connections = many\n",
                    "test.conf:2:", "max_connections", "invalid number 'many'", NULL);
        parse_fails("[daemon]\nmax_connections = 0\n", "max_connections", "out of range", NULL);
        parse_fails("[daemon]\nmax_connections = 65537\n", "max_connections", "out of range", NULL);
        parse_fails("[daemon]\nmax_connections_per_uid = -3\n", "max_connections_per_uid", NULL);
        parse_fails("[daemon]\nlinger_sec = 1.5\n", "linger_sec", NULL);
        parse_fails("[daemon]\nlinger_sec = 99999999999\n", "linger_sec", "out of range", NULL);
        parse_fails("[daemon]\nlog_level = verbose\n",
                    "test.conf:2:", "log_level", "'verbose'", NULL);
        parse_fails("[daemon]\nlog_level = INFO\n", "log_level", NULL);
        parse_fails("[daemon]\nstate_dir = relative/dir\n", "state_dir", "absolute", NULL);
        parse_fails("[daemon]\nsocket = run/x.sock\n", "socket", "absolute", NULL);
        parse_fails("[daemon]\nsocket = /run/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.sock\n",
                    "socket", "too long", NULL);
        parse_fails("[limits]\nmax_message = 512\n", "max_message", "out of range", NULL);
        parse_fails("[limits]\nmax_message = 17M\n", "max_message", NULL);
        parse_fails("[limits]\nmax_tensors = 1048577\n", "max_tensors", NULL);
        parse_fails("[limits]\nmax_tensors = 0\n", "max_tensors", NULL);
        parse_fails("[limits]\nmax_tensors_per_uid = 0\n", "max_tensors_per_uid", NULL);
        parse_fails("[limits]\nmax_inflight = 65537\n", "max_inflight", NULL);
        parse_fails("[limits]\nmax_name = 15\n", "max_name", "out of range (16..4096)", NULL);
        parse_fails("[limits]\nmax_name = 4097\n", "max_name", NULL);
        parse_fails("[host]\nnuma_node = 1024\n", "numa_node", NULL);
        parse_fails("[host]\nnuma_node = -1\n", "numa_node", NULL);
        parse_fails("[host]\nnuma_node = Auto\n", "numa_node", NULL);
        parse_fails("[vram]\nbackend = opencl\n", "test.conf:2:", "[vram] backend", "'opencl'", NULL);
        parse_fails("[vram]\nbandwidth = fast\n", "bandwidth", NULL);
        parse_fails("[nvme]\nqueue_depth = 0\n", "queue_depth", NULL);
        parse_fails("[nvme]\nqueue_depth = 4097\n", "queue_depth", NULL);
        parse_fails("[nvme]\nchecksum_threads = 17\n", "checksum_threads", NULL);
        parse_fails("[nvme]\npersist = maybe\n", "test.conf:2:", "persist", "expected yes or no", NULL);
        parse_fails("[host]\nuid_share = 101\n", "uid_share", NULL);
        parse_fails("[nvme]\ntarget = :4G\n", "test.conf:2:", "target", "empty path", NULL);
        /* Single-key bounds are checked where the line number is known. */
        parse_fails("[host]\nsegment_size = 2G\n", "test.conf:2:", "segment_size", "out of range (4K..1G)", NULL);
        parse_fails("[host]\nsegment_size = 0\n", "test.conf:2:", "segment_size", NULL);
        parse_fails("[vram]\nchunk_size = 512\n", "test.conf:2:", "chunk_size", NULL);
        parse_fails("[nvme]\nextent_size = 2K\n", "test.conf:2:", "extent_size", NULL);
        parse_fails("[nvme]\nextent_size = 128M\n", "test.conf:2:", "extent_size", NULL);
        parse_fails("[nvme]\nextent_size = 0\n", "test.conf:2:", "extent_size", NULL);
}

static void test_targets(_unused_ void **state) {
        char text[4096];
        size_t n = 0;

        n += (size_t) snprintf(text + n, sizeof(text) - n, "[nvme]\n");
        for (int i = 0; i < CONFIG_MAX_TARGETS + 1; i++)
                n += (size_t) snprintf(text + n, sizeof(text) - n, "target = /dev/t%d\n", i);
        parse_fails(text, "test.conf:18:", "target", "too many targets", "16", NULL);

        parse_fails("[nvme]\ntarget = /a.img:1G\ntarget = /b.img\ntarget = /a.img:2G\n",
                    "test.conf:4:", "[nvme] target", "duplicate", "/a.img", NULL);
}

static void test_finish_errors(_unused_ void **state) {
        finish_fails("[host]\nsegment_size = 65537\n", "[host] segment_size");
        finish_fails("[host]\nsegment_size = 1G\ncapacity = 512M\n", "[host] segment_size");
        finish_fails("[host]\nsegment_size = 128M\ncapacity = 64M\n", "[host] segment_size");
        finish_fails("[host]\nsegment_size = 64M\ncapacity = 96M\n", "[host] capacity");
        finish_fails("[vram]\nchunk_size = 5000\n", "[vram] chunk_size");
        finish_fails("[vram]\nchunk_size = 2G\ncapacity = 1G\n", "[vram] chunk_size");
        finish_fails("[vram]\nchunk_size = 64M\ncapacity = 100M\n",
                     "[vram] capacity: 100M is not a multiple of chunk_size 64M");
        finish_fails("[nvme]\nextent_size = 3M\n", "[nvme] extent_size");
        finish_fails("[nvme]\nextent_size = 12K\n", "[nvme] extent_size");
        /* Duplicates only visible once relative paths are resolved. */
        finish_fails("[daemon]\nstate_dir = /st\n[nvme]\ntarget = a.img\ntarget = /st/a.img\n",
                     "duplicate target '/st/a.img'");
        finish_fails("[nvme]\ntarget = /small.img:64K\n", "[nvme] target");
        /* tierd replaces the metrics file every interval: never one of its own files, nor one node_exporter skips */
        finish_fails("[daemon]\nstate_dir = /st\n[metrics]\ntextfile = /st/quotas\n",
                     "[metrics] textfile: '/st/quotas' does not end in .prom");
        finish_fails("[metrics]\ntextfile = /etc/tierd/tierd.conf\n", "does not end in .prom");
        finish_fails("[metrics]\ntextfile = /m/.prom\n", "does not end in .prom");
        finish_fails("[daemon]\nstate_dir = /st\n[nvme]\ntarget = t.prom:1G\n[metrics]\ntextfile = /st/t.prom\n",
                     "[metrics] textfile: '/st/t.prom' is also an [nvme] target");

        /* Limits of what is accepted. */
        _cleanup_config_ Config c;
        _cleanup_free_ char *error = NULL;

        config_init(&c);
        parse_text_ok(&c, "[host]\nsegment_size = 1G\ncapacity = 1G\n[vram]\nchunk_size = 1G\n"
                     "[nvme]\nextent_size = 64M\n[metrics]\ntextfile = /var/lib/node_exporter/tierd.prom\n");
        assert_int_equal(config_finish(&c, &error), 0);
        config_deinit(&c);

        config_init(&c);
        parse_text_ok(&c, "[host]\nsegment_size = 4K\ncapacity = 4K\n[vram]\nchunk_size = 4K\ncapacity = 4K\n"
                     "[nvme]\nextent_size = 4K\ntarget = /x:4K\n");
        assert_int_equal(config_finish(&c, &error), 0);

        /* Set by hand, bypassing the parser. */
        c.host_job_limit = 0;
        assert_int_equal(config_finish(&c, &error), -EINVAL);
        assert_non_null(strstr(error, "[host] job_limit"));
}

/* ---- files --------------------------------------------------------------- */

typedef struct TempDir {
        char path[64];
} TempDir;

/* "@dir/@name", malloc'ed. */
static char *path_join(const char *dir, const char *name) {
        char *p;

        assert_true(asprintf(&p, "%s/%s", dir, name) >= 0);
        return p;
}

static void write_file(const char *dir, const char *name, const char *text) {
        _cleanup_free_ char *path = path_join(dir, name);
        FILE *f;

        f = fopen(path, "we");
        assert_non_null(f);
        assert_int_equal(fputs(text, f) >= 0, 1);
        assert_int_equal(fclose(f), 0);
}

/* Remove @dir and everything below it (two levels are all these tests make). */
static void rm_rf(const char *dir) {
        DIR *d = opendir(dir);
        struct dirent *de;

        if (!d)
                return;
        while ((de = readdir(d))) {
                _cleanup_free_ char *path = NULL;

                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                path = path_join(dir, de->d_name);
                if (unlink(path) < 0)
                        rm_rf(path);
        }
        closedir(d);
        (void) rmdir(dir);
}

static int tempdir_setup(void **state) {
        static TempDir t;

        snprintf(t.path, sizeof(t.path), "/tmp/test-config-XXXXXX");
        if (!mkdtemp(t.path))
                return -1;
        *state = &t;
        return 0;
}

static int tempdir_teardown(void **state) {
        TempDir *t = *state;

        rm_rf(t->path);
        return 0;
}

static void test_load_dropins(void **state) {
        TempDir *t = *state;
        _cleanup_config_ Config c;
        _cleanup_free_ char *error = NULL, *path = path_join(t->path, "tierd.conf"),
                *dropins = path_join(t->path, "tierd.conf.d"), *subdir = path_join(dropins, "dir.conf");

        write_file(t->path, "tierd.conf",
                   "[daemon]\nstate_dir = /st\nlog_level = warning\n"
                   "[host]\ncapacity = 2G\n"
                   "[nvme]\ntarget = a.img:1G\n");
        assert_int_equal(mkdir(dropins, 0755), 0);
        /* Applied in strcmp() order: 10 before 20, whatever the creation order. */
        write_file(dropins, "20-later.conf", "[host]\ncapacity = 8G\n[daemon]\nlog_level = debug\n");
        write_file(dropins, "10-first.conf", "[host]\ncapacity = 4G\n[nvme]\ntarget = /b.img:2G\n");
        /* Not drop-ins: wrong suffix, hidden, a directory. */
        write_file(dropins, "README", "garbage\n");
        write_file(dropins, "30-off.conf.disabled", "garbage\n");
        write_file(dropins, ".hidden.conf", "garbage\n");
        assert_int_equal(mkdir(subdir, 0755), 0);

        assert_int_equal(config_load(&c, path, true, &error), 0);
        assert_null(error);
        assert_int_equal(c.host_capacity, 8 * GIB);
        assert_int_equal(c.log_level, LOG_DEBUG);
        assert_int_equal(c.n_targets, 2);
        assert_string_equal(c.targets[0].path, "/st/a.img");
        assert_int_equal(c.targets[0].size, GIB);
        assert_string_equal(c.targets[1].path, "/b.img");
        assert_int_equal(c.targets[1].size, 2 * GIB);
        config_deinit(&c);

        /* A bad drop-in is an error naming that file and line; c is released. */
        write_file(dropins, "40-bad.conf", "[vram]\n\nbackend = tpu\n");
        assert_int_equal(config_load(&c, path, true, &error), -EINVAL);
        assert_non_null(error);
        assert_non_null(strstr(error, "40-bad.conf:3:"));
        assert_non_null(strstr(error, "[vram] backend"));
        assert_null(c.socket_path);
        error = mfree(error);

        /* Each drop-in opens its own section. */
        write_file(dropins, "40-bad.conf", "capacity = 1G\n");
        assert_int_equal(config_load(&c, path, true, &error), -EINVAL);
        assert_non_null(strstr(error, "40-bad.conf:1:"));
        error = mfree(error);

        /* A bad main file is named too. */
        write_file(dropins, "40-bad.conf", "\n");
        write_file(t->path, "tierd.conf", "[host]\ncapacity = lots\n");
        assert_int_equal(config_load(&c, path, true, &error), -EINVAL);
        assert_non_null(strstr(error, "tierd.conf:2: [host] capacity: invalid size 'lots'"));
        error = mfree(error);

        /* Drop-ins that together violate a cross-key constraint. */
        write_file(t->path, "tierd.conf", "[vram]\nchunk_size = 2G\n");
        assert_int_equal(config_load(&c, path, true, &error), -EINVAL);
        assert_non_null(strstr(error, "[vram] chunk_size"));
        error = mfree(error);

        /* Targets from the main file and drop-ins are duplicates too. */
        write_file(t->path, "tierd.conf", "[nvme]\ntarget = /b.img\n");
        assert_int_equal(config_load(&c, path, true, &error), -EINVAL);
        assert_non_null(strstr(error, "10-first.conf:4:"));
        assert_non_null(strstr(error, "duplicate"));
}

static void test_load_missing(void **state) {
        TempDir *t = *state;
        _cleanup_config_ Config c;
        _cleanup_free_ char *error = NULL, *path = path_join(t->path, "nosuch.conf"),
                *dropins = path_join(t->path, "nosuch.conf.d"), *nul = path_join(t->path, "nul.conf");

        assert_int_equal(config_load(&c, path, true, &error), -ENOENT);
        assert_non_null(error);
        assert_non_null(strstr(error, "nosuch.conf"));
        error = mfree(error);

        /* Not required: the defaults, finished. */
        assert_int_equal(config_load(&c, path, false, &error), 0);
        assert_null(error);
        assert_string_equal(c.socket_path, "/run/tierd/tierd.sock");
        assert_int_equal(c.n_targets, 1);
        assert_string_equal(c.targets[0].path, "/var/lib/tierd/nvme0.img");
        config_deinit(&c);

        /* Drop-ins still apply without the main file. */
        assert_int_equal(mkdir(dropins, 0755), 0);
        write_file(dropins, "a.conf", "[limits]\nmax_name = 100\n");
        assert_int_equal(config_load(&c, path, false, &error), 0);
        assert_int_equal(c.max_name, 100);
        config_deinit(&c);

        /* A directory where the file should be. */
        assert_int_equal(config_load(&c, t->path, true, &error), -EISDIR);
        assert_non_null(error);
        error = mfree(error);

        /* A NUL byte is not text. */
        write_file(t->path, "nul.conf", "[host]\n");
        int fd = open(nul, O_WRONLY | O_APPEND | O_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, "\0\n", 2), 2);
        safe_close(fd);
        assert_true(config_load(&c, nul, true, &error) < 0);
        assert_non_null(strstr(error, "NUL"));
        error = mfree(error);

        /* /dev/null is an empty config. */
        assert_int_equal(config_load(&c, "/dev/null", true, &error), 0);
        assert_int_equal(c.max_name, 255);
        config_deinit(&c);

        /* A FIFO (no writer: a blocking open would never return) is refused, as the file or a
         * drop-in, and a drop-in linked to /dev/null (systemd's mask) is still an empty one. */
        {
                _cleanup_free_ char *fifo = path_join(t->path, "fifo.conf"), *in = path_join(dropins, "50-fifo.conf"),
                        *mask = path_join(dropins, "60-masked.conf");

                assert_int_equal(mkfifo(fifo, 0644), 0);
                assert_int_equal(config_load(&c, fifo, true, &error), -EBADFD);
                assert_non_null(strstr(error, "fifo.conf: not a regular file"));
                error = mfree(error);

                assert_int_equal(symlink("/dev/null", mask), 0);
                assert_int_equal(config_load(&c, path, false, &error), 0);
                assert_int_equal(c.max_name, 100);
                config_deinit(&c);

                assert_int_equal(mkfifo(in, 0644), 0);
                assert_int_equal(config_load(&c, path, false, &error), -EBADFD);
                assert_non_null(strstr(error, "50-fifo.conf: not a regular file"));
                error = mfree(error);
        }
}

/*
 * --socket and --state-dir go through the parsers of [daemon] socket and
 * state_dir: a relative path, or a socket path too long for sun_path, is
 * refused naming the option.  They were copied in unchecked.
 */
static void test_overrides_checked(_unused_ void **state) {
        char long_path[200];
        ConfigArgs args = { .config_path = (char *) "/dev/null", .config_must_exist = true, .log_level = -1 };
        _cleanup_config_ Config c;
        _cleanup_free_ char *error = NULL;

        args.socket_path = "tierd.sock";
        assert_int_equal(reload_config_load(&args, &c, &error), -EINVAL);
        assert_non_null(error);
        if (!strstr(error, "--socket: [daemon] socket: 'tierd.sock' is not an absolute path"))
                fail_msg("message '%s'", error);
        error = mfree(error);

        memset(long_path, 'a', sizeof(long_path) - 1);
        long_path[0] = '/';
        long_path[sizeof(long_path) - 1] = '\0';
        args.socket_path = long_path;
        assert_int_equal(reload_config_load(&args, &c, &error), -EINVAL);
        assert_non_null(strstr(error, "too long for a socket path"));
        error = mfree(error);

        args.socket_path = NULL;
        args.state_dir = "var/lib/tierd";
        assert_int_equal(reload_config_load(&args, &c, &error), -EINVAL);
        assert_non_null(error);
        if (!strstr(error, "--state-dir: [daemon] state_dir: 'var/lib/tierd' is not an absolute path"))
                fail_msg("message '%s'", error);
        error = mfree(error);

        /* absolute ones are taken */
        args.socket_path = "/run/t/t.sock";
        args.state_dir = "/srv/tierd";
        assert_int_equal(reload_config_load(&args, &c, &error), 0);
        assert_string_equal(c.socket_path, "/run/t/t.sock");
        assert_string_equal(c.state_dir, "/srv/tierd");
        assert_string_equal(c.targets[0].path, "/srv/tierd/nvme0.img");
}

/*
 * The default file (not named with -c: it need not exist) that was read once must
 * stay: a reload after it was removed is refused, where it fell back to the
 * built-in defaults (another socket, state directory and pools).  One that never
 * existed still gives the defaults.
 */
static void test_reload_file_removed(void **state) {
        TempDir *t = *state;
        _cleanup_free_ char *path = path_join(t->path, "tierd.conf"), *error = NULL;
        ConfigArgs args = { .config_path = path, .config_must_exist = false, .log_level = -1 };
        _cleanup_config_ Config c;

        assert_int_equal(reload_config_load(&args, &c, &error), 0);   /* none yet: the defaults */
        config_deinit(&c);

        write_file(t->path, "tierd.conf", "[limits]\nmax_name = 100\n");
        assert_int_equal(reload_config_load(&args, &c, &error), 0);
        assert_int_equal(c.max_name, 100);
        config_deinit(&c);

        assert_int_equal(unlink(path), 0);
        assert_int_equal(reload_config_load(&args, &c, &error), -ENOENT);
        assert_non_null(error);
        if (!strstr(error, "tierd.conf"))
                fail_msg("message '%s' lacks the file", error);
}

/* ---- the man pages --------------------------------------------------------- */

/* $TIER_SOURCE/@name, read whole (malloc'ed), or NULL when the sources are not at hand. */
static char *read_source(const char *name) {
        const char *src = getenv("TIER_SOURCE");
        _cleanup_free_ char *path = NULL;
        char *text;
        FILE *f;
        long n;

        if (!src)
                return NULL;
        path = path_join(src, name);
        f = fopen(path, "re");
        if (!f)
                return NULL;
        assert_int_equal(fseek(f, 0, SEEK_END), 0);
        n = ftell(f);
        assert_true(n > 0);
        rewind(f);
        text = malloc((size_t) n + 1);
        assert_non_null(text);
        assert_int_equal(fread(text, 1, (size_t) n, f), (size_t) n);
        text[n] = '\0';
        fclose(f);
        return text;
}

/*
 * Every key a reload applies is in tierd(8)'s list of them (RELOADING THE
 * CONFIGURATION, up to "Every other key"), and tierd.conf(5) marks each key
 * _(reload)_ or _(restart)_ as config-keys.c has it.  The list lacked the
 * uid_share keys and [trace] buffer, which tierd.conf(5) marked _(live)_.
 */
static void test_man_reload_keys(_unused_ void **state) {
        _cleanup_free_ char *tierd8 = read_source("man/tierd.8.scd"), *conf5 = read_source("man/tierd.conf.5.scd");
        char *list, *end;
        const ConfigKey *k;

        if (!tierd8 || !conf5)
                skip();
        list = strstr(tierd8, "# RELOADING THE CONFIGURATION");
        assert_non_null(list);
        end = strstr(list, "Every other key");
        assert_non_null(end);
        *end = '\0';
        {
                /* lines joined: "[nvme]\n  job_limit" is "[nvme] job_limit" */
                char *w = list;

                for (char *r = list; *r; r++)
                        if (!(*r == ' ' || *r == '\n') || (w > list && w[-1] != ' '))
                                *w++ = *r == '\n' ? ' ' : *r;
                *w = '\0';
        }

        for (size_t i = 0; (k = config_key_at(i)); i++) {
                char want[96], heading[64], *sec, *entry, *eol;

                if (k->live) {
                        if (strcmp(k->section, "daemon") == 0)
                                snprintf(want, sizeof(want), "*%s*", k->name);
                        else
                                snprintf(want, sizeof(want), "[%s] %s", k->section, k->name);
                        if (!strstr(list, want))
                                fail_msg("tierd(8) does not list %s among the keys a reload applies", want);
                }

                snprintf(heading, sizeof(heading), "\n# [%s] SECTION", k->section);
                sec = strstr(conf5, heading);
                assert_non_null(sec);
                snprintf(want, sizeof(want), "\n*%s =*", k->name);
                entry = strstr(sec + 1, want);
                if (!entry || (strstr(sec + 1, "\n# ") && entry > strstr(sec + 1, "\n# ")))
                        fail_msg("tierd.conf(5) has no entry for [%s] %s", k->section, k->name);
                eol = strchr(entry + 1, '\n');
                assert_non_null(eol);
                *eol = '\0';
                if (!strstr(entry, k->live ? "_(reload)_" : "_(restart)_"))
                        fail_msg("tierd.conf(5) marks [%s] %s as '%s', not %s", k->section, k->name, entry + 1,
                                 k->live ? "_(reload)_" : "_(restart)_");
                *eol = '\n';
        }
}

/*
 * The sample tierd.conf's opening comment names every key a reload applies: it said "the others need
 * systemctl restart" of uid_share, default_weight and [trace] buffer, which a reload applies.
 */
static void test_sample_reload_keys(_unused_ void **state) {
        _cleanup_free_ char *sample = read_source("systemd/tierd.conf");
        char *end;
        const ConfigKey *k;

        if (!sample)
                skip();
        end = strstr(sample, "\n[daemon]");
        assert_non_null(end);
        *end = '\0';
        for (size_t i = 0; (k = config_key_at(i)); i++)
                if (k->live && !strstr(sample, k->name))
                        fail_msg("systemd/tierd.conf's opening comment does not name %s among the keys a reload "
                                 "applies", k->name);
        assert_non_null(strstr(sample, "[quota] sections"));
}

/*
 * README.md's configuration table has a row of each key, in its section, with the default
 * tierd --check-config prints and "reload" or "restart" as config-keys.c has it.  The table
 * lacked [nvme] checksum_threads, [metrics] textfile and interval_sec, and [trace] buffer.
 */
static void test_readme_keys(_unused_ void **state) {
        _cleanup_free_ char *readme = read_source("README.md");
        _cleanup_config_ Config c;
        const ConfigKey *k;
        char *table, *end;

        if (!readme)
                skip();
        table = strstr(readme, "\n## Configuration\n");
        assert_non_null(table);
        end = strstr(table + 1, "\n## ");
        if (end)
                *end = '\0';
        config_init(&c);
        for (size_t i = 0; (k = config_key_at(i)); i++) {
                _cleanup_free_ char *value = NULL;
                char heading[64], want[128], *sec, *row, *next, *eol;

                snprintf(heading, sizeof(heading), "\n| **[%s]** |", k->section);
                sec = strstr(table, heading);
                if (!sec)
                        fail_msg("README.md's configuration table has no [%s] section", k->section);
                next = strstr(sec + 1, "\n| **[");
                snprintf(want, sizeof(want), "\n| `%s` |", k->name);
                row = strstr(sec + 1, want);
                if (!row || (next && row > next))
                        fail_msg("README.md's configuration table has no row of [%s] %s", k->section, k->name);
                eol = strchr(row + 1, '\n');
                assert_non_null(eol);
                *eol = '\0';
                if (k->type != CONFIG_TARGETS) {                /* the default target is a path in state_dir */
                        value = config_value_format(k, &c);
                        assert_non_null(value);
                        if (value[0])
                                snprintf(want, sizeof(want), "| `%s` | `%s` | %s |", k->name, value,
                                         k->live ? "reload" : "restart");
                        else
                                snprintf(want, sizeof(want), "| `%s` | empty | %s |", k->name,
                                         k->live ? "reload" : "restart");
                } else
                        snprintf(want, sizeof(want), "| %s |", k->live ? "reload" : "restart");
                if (!strstr(row, want))
                        fail_msg("README.md's row of [%s] %s is '%s', not '%s ...'", k->section, k->name, row + 1,
                                 want);
                *eol = '\n';
        }
}

/* A NULL ret_error is allowed everywhere. */
static void test_no_error_string(_unused_ void **state) {
        _cleanup_config_ Config c;

        config_init(&c);
        assert_int_equal(config_parse_text(&c, "[bad]\n", "x", NULL), -EINVAL);
        assert_int_equal(config_parse_text(&c, "[host]\nsegment_size = 5K\n", NULL, NULL), 0);
        assert_int_equal(config_finish(&c, NULL), -EINVAL);
        config_deinit(&c);
        assert_int_equal(config_load(&c, "/nonexistent/tierd.conf", true, NULL), -ENOENT);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_parse_size),
                cmocka_unit_test(test_vram_backend_strings),
                cmocka_unit_test(test_defaults),
                cmocka_unit_test(test_full),
                cmocka_unit_test(test_log_levels),
                cmocka_unit_test(test_syntax_errors),
                cmocka_unit_test(test_value_errors),
                cmocka_unit_test(test_targets),
                cmocka_unit_test(test_finish_errors),
                cmocka_unit_test_setup_teardown(test_load_dropins, tempdir_setup, tempdir_teardown),
                cmocka_unit_test_setup_teardown(test_load_missing, tempdir_setup, tempdir_teardown),
                cmocka_unit_test(test_overrides_checked),
                cmocka_unit_test_setup_teardown(test_reload_file_removed, tempdir_setup, tempdir_teardown),
                cmocka_unit_test(test_man_reload_keys),
                cmocka_unit_test(test_sample_reload_keys),
                cmocka_unit_test(test_readme_keys),
                cmocka_unit_test(test_no_error_string),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
