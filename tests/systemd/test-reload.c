/* SPDX-License-Identifier: MIT */
/*
 * test-reload.c: SIGHUP applies a valid configuration live and refuses an invalid one, and one
 * naming a target a start would refuse as untrusted.
 */

#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <tier.h>

#include "proto/macro.h"
#include "tests/helpers/harness.h"
#include "tests/helpers/json.h"

#define MiB (1024ll * 1024ll)
/* [host] capacity of CONFIG_BEFORE, which stays (capacity takes effect only at a restart). */
#define HOST_CAPACITY (64 * MiB)

static const char *const CONFIG_BEFORE =
        "[daemon]\n"
        "log_level = info\n"
        "[host]\n"
        "capacity = 64M\n"
        "segment_size = 8M\n"
        "job_limit = 32M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 16M\n"
        "chunk_size = 4M\n"
        "job_limit = 8M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:64M\n";

/* Live: log_level, [host] job_limit, [vram] bandwidth.  Restart: [host] capacity. */
static const char *const CONFIG_AFTER =
        "[daemon]\n"
        "log_level = debug\n"
        "[host]\n"
        "capacity = 128M\n"
        "segment_size = 8M\n"
        "job_limit = 16M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 16M\n"
        "chunk_size = 4M\n"
        "job_limit = 8M\n"
        "bandwidth = 1G\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:64M\n";

/* CONFIG_BEFORE with a live change ([host] job_limit) and a second target, @TARGET@. */
static const char *const CONFIG_NEW_TARGET =
        "[daemon]\n"
        "log_level = info\n"
        "[host]\n"
        "capacity = 64M\n"
        "segment_size = 8M\n"
        "job_limit = 16M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 16M\n"
        "chunk_size = 4M\n"
        "job_limit = 8M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:64M\n"
        "target = @TARGET@\n";

static TestDaemon d;

static int teardown(void **state) {
        test_daemon_cleanup(&d);
        return 0;
}

static tier_client *connect_job(const char *job) {
        tier_client *c = NULL;
        int r = tier_client_new(d.socket, job, 0, &c);

        if (r < 0)
                fprintf(stderr, "connect: %s (%s)\n", tier_strerror(r), tier_client_last_error(NULL));
        assert_int_equal(r, 0);
        return c;
}

/* tier_client_status() in JSON, parsed. */
static json_t *status_json(tier_client *c) {
        _cleanup_free_ char *text = NULL;
        json_t *status;

        assert_int_equal(tier_client_status(c, TIER_STATUS_JSON, &text), 0);
        status = test_json_parse(text);
        assert_non_null(status);
        return status;
}

/* Write a pattern into @t through a host pin. */
static void fill(tier_tensor *t, uint8_t v) {
        struct tier_grant g;

        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        memset(g.ptr, v, g.length);
        assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
}

/* Check the pattern of @t (of @c's job), after a round trip through NVMe. */
static void check(tier_client *c, tier_tensor *t, uint8_t v) {
        uint64_t before[TIER_LINK_SLOTS], after[TIER_LINK_SLOTS];
        struct tier_stat st;
        struct tier_grant g;
        const uint8_t *p;

        /* NVMe holds the only copy: the host copy is gone */
        assert_int_equal(tier_evict(t, TIER_NVME), 0);
        assert_int_equal(tier_tensor_stat(t, &st), 0);
        assert_int_equal(st.state[TIER_HOST], 0);
        assert_int_equal(st.state[TIER_NVME], 2);
        assert_int_equal(tier_client_moved(c, before), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        /* the bytes came back up from NVMe */
        assert_int_equal(tier_client_moved(c, after), 0);
        assert_true(after[TIER_LINK_NVME_TO_HOST] - before[TIER_LINK_NVME_TO_HOST] >= tier_tensor_size(t));
        p = g.ptr;
        for (uint64_t i = 0; i < g.length; i += 4096)
                assert_int_equal(p[i], v);
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
}

/* SIGHUP and wait for the reload to finish; returns the STATUS= of its READY=1. */
static const char *reload(char *status, size_t size) {
        int i;

        kill(d.pid, SIGHUP);
        assert_true(test_daemon_wait_notify(&d, "RELOADING=1", 10000) >= 0);
        i = test_daemon_wait_notify(&d, "READY=1", 10000);
        assert_true(i >= 0);
        status[0] = 0;
        (void) test_notify_field(d.notes[i].text, "STATUS", status, size);
        return status;
}

static void test_reload(void **state) {
        tier_client *a, *b, *c;
        tier_tensor *t1 = NULL, *t2 = NULL;
        char status[1024], *text;
        TestDaemonOptions o = { .wait_ready = true };
        json_t *json;

        assert_int_equal(test_daemon_init(&d, CONFIG_BEFORE), 0);
        assert_int_equal(test_daemon_spawn(&d, &o), 0);

        /* a job from before the reload, connected throughout */
        a = connect_job("before");
        assert_int_equal(tier_tensor_create(a, "t1", 4 * MiB, &t1), 0);
        fill(t1, 0x11);
        json = status_json(a);
        assert_int_equal(test_json_job_tier(json, "before", "host", "limit"), 32 * MiB);
        json_decref(json);
        assert_false(test_daemon_log_contains(&d, "[debug]"));

        /* ---- a valid change ---- */
        assert_int_equal(test_daemon_write_config(&d, NULL, CONFIG_AFTER), 0);
        printf("valid reload: STATUS=%s\n", reload(status, sizeof(status)));
        assert_null(strstr(status, "refused"));

        /* the connection survived and works */
        check(a, t1, 0x11);
        assert_int_equal(tier_tensor_create(a, "t2", 4 * MiB, &t2), 0);
        fill(t2, 0x22);
        check(a, t2, 0x22);

        /* a job created now gets the new default; the running job followed it (it used the default) */
        b = connect_job("after");
        assert_int_equal(tier_client_status(b, TIER_STATUS_JSON, &text), 0);
        printf("%s", text);
        json = test_json_parse(text);
        free(text);
        assert_non_null(json);
        assert_int_equal(test_json_job_tier(json, "after", "host", "limit"), 16 * MiB);
        assert_int_equal(test_json_job_tier(json, "before", "host", "limit"), 16 * MiB);
        assert_int_equal(test_json_job_tier(json, "after", "vram", "limit"), 8 * MiB);
        /* a restart key keeps its running value */
        assert_int_equal(test_json_tier(json, "host", "capacity"), 64 * MiB);
        json_decref(json);
        assert_true(test_daemon_log_contains(&d, "[host] capacity = 128M takes effect only after a restart"));
        assert_true(test_daemon_log_contains(&d, "[host] job_limit = 16M (was 32M)"));
        assert_true(test_daemon_log_contains(&d, "[vram] bandwidth = 1G (was 0)"));
        assert_true(test_daemon_log_contains(&d, "Job 'before': host limit 32M -> 16M"));
        /* log_level = debug took effect: the new connection was logged at debug level */
        assert_true(test_daemon_log_contains(&d, "[debug]"));

        /* ---- an invalid drop-in: refused, everything stays ---- */
        assert_int_equal(test_daemon_write_config(&d, "50-bad.conf", "[host]\njob_limit = 8M\n[vram]\njob_limit = lots\n"), 0);
        printf("invalid reload: STATUS=%s\n", reload(status, sizeof(status)));
        assert_non_null(strstr(status, "last reload refused"));
        assert_non_null(strstr(status, "50-bad.conf:4: [vram] job_limit"));
        assert_true(test_daemon_log_contains(&d, "Invalid configuration, keeping the running one: "));
        assert_true(test_daemon_log_contains(&d, "tierd.conf.d/50-bad.conf:4: [vram] job_limit: invalid size 'lots'"));

        c = connect_job("after-bad");
        json = status_json(c);
        /* not 8M: the valid line before the bad one was not applied either */
        assert_int_equal(test_json_job_tier(json, "after-bad", "host", "limit"), 16 * MiB);
        assert_int_equal(test_json_job_tier(json, "after-bad", "vram", "limit"), 8 * MiB);
        json_decref(json);
        check(a, t1, 0x11);

        /* a cross-key error (no line to name) is refused the same way */
        assert_int_equal(test_daemon_write_config(&d, "50-bad.conf", "[host]\nsegment_size = 5000\n"), 0);
        printf("invalid reload: STATUS=%s\n", reload(status, sizeof(status)));
        assert_non_null(strstr(status, "[host] segment_size"));

        /* a key set twice in one file: refused with both lines, not the last one applied */
        assert_int_equal(test_daemon_write_config(&d, "50-bad.conf", "[host]\njob_limit = 8M\n\n[host]\njob_limit = 12M\n"), 0);
        printf("invalid reload: STATUS=%s\n", reload(status, sizeof(status)));
        assert_non_null(strstr(status, "last reload refused"));
        assert_non_null(strstr(status, "50-bad.conf:5: [host] job_limit"));
        assert_true(test_daemon_log_contains(&d, "50-bad.conf:5: [host] job_limit: set a second time in this file "
                                                 "(first at line 2)"));
        json = status_json(c);
        assert_int_equal(test_json_job_tier(json, "after-bad", "host", "limit"), 16 * MiB);
        json_decref(json);

        /* fixed: the next reload is clean again, and applies the drop-in */
        assert_int_equal(test_daemon_write_config(&d, "50-bad.conf", "[host]\njob_limit = 24M\n"), 0);
        printf("fixed reload: STATUS=%s\n", reload(status, sizeof(status)));
        assert_null(strstr(status, "refused"));
        json = status_json(c);
        assert_int_equal(test_json_job_tier(json, "after-bad", "host", "limit"), 24 * MiB);
        json_decref(json);

        tier_tensor_close(t1);
        tier_tensor_close(t2);
        tier_client_free(a);
        tier_client_free(b);
        tier_client_free(c);
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 15000), 0);
}

/* The command line's overrides hold across reloads, as at start. */
static void test_reload_keeps_overrides(void **state) {
        char status[1024];
        TestDaemonOptions o = { .log_level = "notice", .wait_ready = true };
        tier_client *c;

        assert_int_equal(test_daemon_init(&d, CONFIG_BEFORE), 0);
        /* --log-level beats log_level = ...; --socket (the harness gives it) beats [daemon] socket */
        assert_int_equal(test_daemon_spawn(&d, &o), 0);
        assert_int_equal(test_daemon_write_config(&d, "10-socket.conf",
                                                "[daemon]\nsocket = @DIR@/elsewhere.sock\nlog_level = debug\n"), 0);
        reload(status, sizeof(status));
        assert_null(strstr(status, "refused"));
        c = connect_job("overrides");   /* still on d.socket */
        tier_client_free(c);
        assert_false(test_daemon_log_contains(&d, "takes effect only after a restart"));
        assert_false(test_daemon_log_contains(&d, "[debug]"));
        assert_false(test_daemon_log_contains(&d, "[info]"));
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 15000), 0);
}

/* CONFIG_NEW_TARGET with @target, written as tierd.conf. */
static void write_new_target(const char *target) {
        char body[1024];
        const char *at = strstr(CONFIG_NEW_TARGET, "@TARGET@");

        assert_non_null(at);
        snprintf(body, sizeof(body), "%.*s%s%s", (int) (at - CONFIG_NEW_TARGET), CONFIG_NEW_TARGET, target,
                 at + strlen("@TARGET@"));
        assert_int_equal(test_daemon_write_config(&d, NULL, body), 0);
}

/*
 * A target named anew in a reload is judged as a start judges it (its directory, the links on its
 * way), before anything looks at it by its path: one behind a link planted in a directory every user
 * can write refuses the reload, with the start's message, and the running configuration stays, all of
 * it.  The capacity check, which stat()s a target (and opens a device) by its path, never sees it: the
 * link leads to a sparse file bigger than its filesystem could back, which it would have said.  A new
 * target in a trusted directory reloads as before (a restart key: logged, kept until a restart).
 */
static void test_reload_untrusted_target(void **state) {
        char status[1024], open_dir[300], link[320], victim[320], why[1024];
        TestDaemonOptions o = { .wait_ready = true };
        struct statvfs vfs;
        struct stat st;
        tier_client *c;
        json_t *json;
        off_t size;
        int fd;

        assert_int_equal(test_daemon_init(&d, CONFIG_BEFORE), 0);
        assert_int_equal(test_daemon_spawn(&d, &o), 0);
        c = connect_job("running");

        snprintf(open_dir, sizeof(open_dir), "%s/open", d.dir);
        assert_int_equal(mkdir(open_dir, 0777), 0);
        assert_int_equal(chmod(open_dir, 0777), 0);     /* whatever the umask */
        snprintf(victim, sizeof(victim), "%s/victim.img", d.dir);
        fd = open(victim, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        assert_int_equal(fstatvfs(fd, &vfs), 0);
        size = (off_t) (vfs.f_bavail * vfs.f_frsize) + (64ll << 30);
        if (ftruncate(fd, size) < 0) {
                printf("cannot make a sparse file of %jd bytes here (%s): the capacity check's silence "
                       "shows nothing\n", (intmax_t) size, strerror(errno));
                size = 0;
        }
        close(fd);
        snprintf(link, sizeof(link), "%s/t1.img", open_dir);
        assert_int_equal(symlink(victim, link), 0);

        /* refused before anything followed the link; nothing applied, not even the live key */
        write_new_target("@DIR@/open/t1.img");
        printf("untrusted target: STATUS=%s\n", reload(status, sizeof(status)));
        snprintf(why, sizeof(why), "Refusing NVMe target %s: the directory \"%s\" holding \"t1.img\" is not "
                 "trusted: it is writable by every user", link, open_dir);
        assert_non_null(strstr(status, "last reload refused: "));
        assert_non_null(strstr(status, why));
        assert_true(test_daemon_log_contains(&d, "Reload refused, keeping the running configuration: "));
        assert_true(test_daemon_log_contains(&d, why));
        assert_false(test_daemon_log_contains(&d, "filesystem can back"));
        assert_false(test_daemon_log_contains(&d, "takes effect only after a restart"));
        json = status_json(c);
        assert_int_equal(test_json_job_tier(json, "running", "host", "limit"), 32 * MiB);
        json_decref(json);
        assert_int_equal(lstat(link, &st), 0);
        assert_true(S_ISLNK(st.st_mode));
        assert_int_equal(stat(victim, &st), 0);
        assert_int_equal(st.st_size, size);

        /* a new target in a trusted directory: the reload passes, as before */
        write_new_target("@DIR@/t1.img:64M");
        printf("trusted target: STATUS=%s\n", reload(status, sizeof(status)));
        assert_null(strstr(status, "refused"));
        assert_true(test_daemon_log_contains(&d, "t1.img:64M takes effect only after a restart"));
        assert_true(test_daemon_log_contains(&d, "[host] job_limit = 16M (was 32M)"));
        json = status_json(c);
        assert_int_equal(test_json_job_tier(json, "running", "host", "limit"), 16 * MiB);
        json_decref(json);

        tier_client_free(c);
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 15000), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_teardown(test_reload, teardown),
                cmocka_unit_test_teardown(test_reload_keeps_overrides, teardown),
                cmocka_unit_test_teardown(test_reload_untrusted_target, teardown),
        };

        if (!test_can_lock_memory(HOST_CAPACITY))
                return TEST_SKIP;
        return cmocka_run_group_tests_name("reload", tests, NULL, NULL);
}
