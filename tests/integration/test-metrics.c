/* SPDX-License-Identifier: MIT */
/* test-metrics.c: tierd's Prometheus metrics (tierctl and the text file) and its drive wear book, end to end. */

/*
 * A real tierd with two NVMe target files and "[metrics] textfile" at a
 * 1 s interval:
 *
 * - with a job that moved known bytes (an evict to NVMe, a prefetch back)
 *   and runs a plan, `tierctl status --prometheus` passes `promtool check
 *   metrics` (skipped, saying why, without promtool: Debian's prometheus),
 *   and its values are those of `tierctl status --json`;
 * - the text file appears and is replaced whole: read over and over while
 *   tierd rewrites it, it always ends with a newline and parses, and its
 *   inode changes (a rename, not a rewrite in place);
 * - drive wear survives a restart on the same state directory, per target
 *   and per job name; a corrupt wear file is set aside and said so;
 * - the targets here are files: their SMART entry is "n/a" with the reason
 *   (on this machine's virtio disk: "virtio disk vda is not NVMe"), in the
 *   JSON, the table and the metrics.
 *
 * Nothing here waits for a time to pass as a test: loops wait for a
 * condition, with a generous bound that only a broken tierd reaches.
 */

#include <errno.h>
#include <glob.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include <tier.h>

#include "tests/helpers/harness.h"
#include "tests/helpers/json.h"

#define MiB (UINT64_C(1) << 20)
/* How long a condition may take before the test calls tierd broken. */
#define WAIT_MS 20000

static const char *const CONFIG =
        "[host]\n"
        "capacity = 32M\n"
        "segment_size = 2M\n"
        "job_limit = 16M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 8M\n"
        "chunk_size = 1M\n"
        "job_limit = 4M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:64M\n"
        "target = @DIR@/t1.img:64M\n"
        "extent_size = 256K\n"
        "[metrics]\n"
        "textfile = @DIR@/tierd.prom\n"
        "interval_sec = 1\n";

/* A job name that needs escaping in a label value. */
#define JOB "train \"7b\"\\x"
#define JOB_LABEL "train \\\"7b\\\"\\\\x"

static TestDaemon d;

static int setup(void **state) {
        if (!test_can_lock_memory(40 * MiB))
                return -1;
        return test_daemon_start(&d, CONFIG) < 0 ? -1 : 0;
}

static int teardown(void **state) {
        return test_daemon_stop(&d) == 0 ? 0 : -1;
}

static void sleep_ms(unsigned ms) {
        struct timespec ts = { ms / 1000, (long) (ms % 1000) * 1000000L };

        nanosleep(&ts, NULL);
}

/* Run @cmd through sh; its stdout (malloc'ed) and exit status. */
static char *run(const char *cmd, int *ret_status) {
        FILE *p = popen(cmd, "r");
        char *buf = NULL;
        size_t size = 0, n;
        char chunk[4096];
        FILE *m;
        int st;

        assert_non_null(p);
        m = open_memstream(&buf, &size);
        assert_non_null(m);
        while ((n = fread(chunk, 1, sizeof(chunk), p)) > 0)
                fwrite(chunk, 1, n, m);
        st = pclose(p);
        fclose(m);
        *ret_status = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
        return buf;
}

static char *tierctl(const char *args, int *ret_status) {
        char path[512], cmd[2048];

        (void) snprintf(cmd, sizeof(cmd), "%s --socket '%s' %s", test_tierctl_path(path, sizeof(path)), d.socket, args);
        return run(cmd, ret_status);
}

/* The value of the sample whose line starts with @series + " " in @text; fails the test if there is none. */
static double prom_value(const char *text, const char *series) {
        size_t n = strlen(series);

        for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
                if (strncmp(line, series, n) == 0 && line[n] == ' ')
                        return strtod(line + n + 1, NULL);
        fail_msg("no sample %s in:\n%s", series, text);
        return -1;
}

/*
 * Does @text parse as the text format?  Comments are "# HELP name text" or
 * "# TYPE name type"; samples "name[{labels}] value" with a value strtod()
 * takes whole; the text ends with a newline.  Enough to tell a cut file.
 */
static bool prom_parses(const char *text, size_t len) {
        const char *line = text;

        if (len == 0 || text[len - 1] != '\n' || strncmp(text, "# HELP ", 7) != 0)
                return false;
        while (line < text + len) {
                const char *end = memchr(line, '\n', (size_t) (text + len - line));
                char buf[1024], *sp, *num_end;

                if (!end || (size_t) (end - line) >= sizeof(buf))
                        return false;
                (void) snprintf(buf, sizeof(buf), "%.*s", (int) (end - line), line);
                if (buf[0] == '#') {
                        if (strncmp(buf, "# HELP tierd_", 13) != 0 && strncmp(buf, "# TYPE tierd_", 13) != 0)
                                return false;
                } else {
                        if (strncmp(buf, "tierd_", 6) != 0)
                                return false;
                        sp = strrchr(buf, ' ');
                        if (!sp || sp[1] == '\0')
                                return false;
                        (void) strtod(sp + 1, &num_end);
                        if (*num_end != '\0')
                                return false;
                }
                line = end + 1;
        }
        return true;
}

/* Fill @t (1 MiB) with @byte through a host pin. */
static void fill(tier_tensor *t, uint8_t byte) {
        struct tier_grant g;

        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        memset(g.ptr, byte, g.length);
        assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
}

static json_t *target0(json_t *st) {
        json_t *t = json_array_get(json_object_get(st, "targets"), 0);

        assert_non_null(t);
        return t;
}

/* The id of tierd's job @name (its counters' job_id label), from its status. */
static long long job_id(const char *name) {
        json_t *st = test_daemon_status(&d);
        long long id;

        assert_non_null(st);
        assert_non_null(test_json_job(st, name));
        id = json_integer_value(json_object_get(test_json_job(st, name), "id"));
        json_decref(st);
        assert_true(id > 0);
        return id;
}

/* ---- tierctl status --prometheus with a job running ---------------------------------- */

static void test_prometheus(void **state) {
        tier_client *c = NULL;
        tier_tensor *a = NULL, *b = NULL;
        tier_plan *plan = NULL;
        char series[512], *text, *table, path[600], cmd[1200];
        json_t *st, *job, *tg;
        long long jid;
        const char *na;
        int status;

        assert_int_equal(tier_client_new(d.socket, JOB, 0, &c), 0);
        assert_int_equal(tier_tensor_create(c, "a", MiB, &a), 0);
        assert_int_equal(tier_tensor_create(c, "b", MiB, &b), 0);
        fill(a, 0x11);
        fill(b, 0x22);
        jid = job_id(JOB);
        /* known traffic: a to NVMe and back, b to NVMe */
        assert_int_equal(tier_evict(a, TIER_NVME), 0);
        assert_int_equal(tier_prefetch(a, TIER_HOST), 0);
        assert_int_equal(tier_evict(b, TIER_NVME), 0);
        /* exactly that, before the plan moves more */
        text = tierctl("status --prometheus", &status);
        assert_int_equal(status, 0);
        (void) snprintf(series, sizeof(series), "tierd_job_moved_bytes_total{job_name=\"%s\",job_id=\"%lld\",link=\"nvme->host\"}",
                        JOB_LABEL, jid);
        assert_true(prom_value(text, series) == 1.0 * MiB);
        assert_true(prom_value(text, "tierd_link_transfers_total{link=\"host->nvme\"}") == 2);
        free(text);

        /* a plan over both, a few steps */
        assert_int_equal(tier_plan_new(c, &plan), 0);
        assert_int_equal(tier_plan_add(plan, 0, a, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_add(plan, 1, b, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_submit(plan), 0);
        for (int i = 0; i < 4; i++) {
                assert_int_equal(tier_phase_enter(c, 0), 0);
                assert_int_equal(tier_phase_enter(c, 1), 0);
        }

        text = tierctl("status --prometheus", &status);
        assert_int_equal(status, 0);
        st = test_daemon_status(&d);
        assert_non_null(st);

        /* promtool's own check (lint included) */
        if (test_have_program("promtool")) {
                char *out;

                (void) snprintf(path, sizeof(path), "%s/status.prom", d.dir);
                FILE *f = fopen(path, "we");
                assert_non_null(f);
                fputs(text, f);
                fclose(f);
                (void) snprintf(cmd, sizeof(cmd), "promtool check metrics < '%s' 2>&1", path);
                out = run(cmd, &status);
                if (status != 0)
                        fail_msg("promtool check metrics failed (%d):\n%s\non:\n%s", status, out, text);
                free(out);
        } else
                print_message("promtool not found (Debian package prometheus): its check is skipped\n");

        /* the values are the JSON's */
        job = test_json_job(st, JOB);
        assert_non_null(job);
        (void) snprintf(series, sizeof(series), "tierd_job_moved_bytes_total{job_name=\"%s\",job_id=\"%lld\",link=\"host->nvme\"}",
                        JOB_LABEL, jid);
        assert_true(prom_value(text, series) == 2.0 * MiB);
        assert_int_equal(json_integer_value(json_object_get(json_object_get(job, "moved"), "host->nvme")), 2 * MiB);
        (void) snprintf(series, sizeof(series), "tierd_job_nvme_written_bytes_total{job_name=\"%s\",job_id=\"%lld\"}",
                        JOB_LABEL, jid);
        assert_true(prom_value(text, series) == 2.0 * MiB);
        assert_int_equal(json_integer_value(json_object_get(job, "nvme_written")), 2 * MiB);
        (void) snprintf(series, sizeof(series), "tierd_job_nvme_host_changed_total{job_name=\"%s\",job_id=\"%lld\"}",
                        JOB_LABEL, jid);
        assert_true(prom_value(text, series) == 0);
        assert_non_null(json_object_get(job, "nvme_host_changed"));
        (void) snprintf(series, sizeof(series), "tierd_job_nvme_crc_errors_total{job_name=\"%s\",job_id=\"%lld\"}",
                        JOB_LABEL, jid);
        assert_true(prom_value(text, series) == 0);
        assert_non_null(json_object_get(job, "nvme_crc_errors"));
        (void) snprintf(series, sizeof(series), "tierd_job_used_bytes{job_name=\"%s\",tier=\"host\"}", JOB_LABEL);
        assert_true(prom_value(text, series) == (double) test_json_job_tier(st, JOB, "host", "used"));
        (void) snprintf(series, sizeof(series), "tierd_plan_iterations{job_name=\"%s\",rank=\"0\"}", JOB_LABEL);
        assert_true(prom_value(text, series) >= 3);
        assert_true(prom_value(text, "tierd_link_moved_bytes_total{link=\"host->nvme\"}") == 2.0 * MiB);
        assert_true(prom_value(text, "tierd_tier_capacity_bytes{tier=\"host\"}") == 32.0 * MiB);
        assert_true(prom_value(text, "tierd_sched_transfers_in_flight") == 0);
        /* the client (and nothing else): neither tierctl counts itself */
        assert_int_equal(json_integer_value(json_object_get(st, "connections")), 1);
        assert_true(prom_value(text, "tierd_connections") == 1);

        tg = target0(st);
        (void) snprintf(series, sizeof(series), "tierd_target_written_bytes_total{target=\"%s\"}",
                        json_string_value(json_object_get(tg, "path")));
        assert_true(prom_value(text, series) == (double) json_integer_value(json_object_get(tg, "bytes_written")));
        assert_true(json_integer_value(json_object_get(tg, "bytes_written")) > 0);
        assert_int_equal(json_integer_value(json_object_get(tg, "wear_written")),
                         json_integer_value(json_object_get(tg, "bytes_written")));

        /* SMART: figures, or n/a with the reason, in the JSON, the table and the metrics */
        na = json_string_value(json_object_get(json_object_get(tg, "smart"), "na"));
        table = tierctl("status", &status);
        assert_int_equal(status, 0);
        if (na) {
                char want[512];

                print_message("SMART n/a for the target files here: %s\n", na);
                assert_true(strlen(na) > 10);
                (void) snprintf(want, sizeof(want), "SMART: n/a (%s)", na);
                assert_non_null(strstr(table, want));
                (void) snprintf(series, sizeof(series), "tierd_target_smart_available{target=\"%s\",device=\"%s\",reason=\"%s\"}",
                                json_string_value(json_object_get(tg, "path")),
                                json_string_value(json_object_get(json_object_get(tg, "smart"), "device")), na);
                assert_true(prom_value(text, series) == 0);
        } else {
                print_message("SMART read from %s\n",
                              json_string_value(json_object_get(json_object_get(tg, "smart"), "device")));
                assert_non_null(json_object_get(json_object_get(tg, "smart"), "percentage_used"));
                assert_null(strstr(table, "SMART: n/a"));
        }
        assert_non_null(strstr(table, "wear:\n"));

        /* --json and --prometheus together: a usage error */
        free(tierctl("status --json --prometheus 2>/dev/null", &status));
        assert_int_equal(status, 2);

        free(table);
        free(text);
        json_decref(st);
        assert_int_equal(tier_plan_end(c), 0);     /* the submitted plan belongs to the client */
        tier_tensor_destroy(a);
        tier_tensor_destroy(b);
        tier_client_free(c);
}

/* ---- the text file --------------------------------------------------------------------- */

static void test_textfile(void **state) {
        char path[600];
        ino_t first = 0, last = 0;
        unsigned changes = 0, reads = 0;
        struct timespec t0, now;

        (void) snprintf(path, sizeof(path), "%s/tierd.prom", d.dir);
        clock_gettime(CLOCK_MONOTONIC, &t0);
        /* read it as fast as we can while tierd replaces it every second, until it was replaced 3 times */
        while (changes < 3) {
                int fd = open(path, O_RDONLY | O_CLOEXEC);
                char *buf = NULL;
                size_t size = 0;
                struct stat st;

                clock_gettime(CLOCK_MONOTONIC, &now);
                if ((now.tv_sec - t0.tv_sec) * 1000 > WAIT_MS)
                        fail_msg("the metrics file %s was replaced %u times in %d ms (%u reads)", path, changes,
                                 WAIT_MS, reads);
                if (fd < 0) {
                        assert_int_equal(errno, ENOENT);        /* not there yet; never "gone" once there */
                        assert_int_equal(first, 0);
                        sleep_ms(10);
                        continue;
                }
                assert_int_equal(fstat(fd, &st), 0);
                assert_int_equal(st.st_mode & 0777, 0644);
                {
                        FILE *m = open_memstream(&buf, &size);
                        char chunk[8192];
                        ssize_t n;

                        while ((n = read(fd, chunk, sizeof(chunk))) > 0)
                                fwrite(chunk, 1, (size_t) n, m);
                        fclose(m);
                }
                close(fd);
                reads++;
                if (!prom_parses(buf, size))
                        fail_msg("read %u of %s is not whole metrics text (%zu bytes):\n%s", reads, path, size, buf);
                free(buf);
                if (!first)
                        first = last = st.st_ino;
                else if (st.st_ino != last) {
                        changes++;
                        last = st.st_ino;
                }
                sleep_ms(2);
        }
        print_message("%u reads of %s, replaced %u times, each read whole\n", reads, path, changes);
        /* and no temporary files are left behind in its directory */
        {
                char cmd[800], *out;
                int status;

                (void) snprintf(cmd, sizeof(cmd), "ls '%s' | grep -c '^tierd.prom\\.' ", d.dir);
                out = run(cmd, &status);
                /* one may exist for an instant while tierd writes: never more than one */
                assert_true(atoi(out) <= 1);
                free(out);
        }
}

/* Wait until the metrics file is there (tierd writes it as soon as it runs). */
static void wait_textfile(const char *path) {
        for (unsigned ms = 0; access(path, F_OK) < 0; ms += 10) {
                assert_int_equal(errno, ENOENT);
                if (ms > WAIT_MS)
                        fail_msg("no metrics file %s after %d ms", path, WAIT_MS);
                sleep_ms(10);
        }
}

/*
 * A clean stop removes the file: left there, node_exporter would go on
 * serving a running tierd's jobs and uptime.  After a crash it stays (its
 * mtime says how old it is), and the next start replaces it.
 */
static void test_textfile_removed_at_stop(void **state) {
        TestDaemonOptions o = { .log_level = "debug", .wait_ready = true };
        tier_client *c = NULL;
        char path[600];

        (void) snprintf(path, sizeof(path), "%s/tierd.prom", d.dir);
        assert_int_equal(tier_client_new(d.socket, "stopjob", 0, &c), 0);
        wait_textfile(path);
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 10000), 0);
        tier_client_free(c);
        assert_int_equal(access(path, F_OK), -1);
        assert_int_equal(errno, ENOENT);

        assert_int_equal(test_daemon_spawn(&d, &o), 0);
        wait_textfile(path);
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        assert_int_equal(access(path, F_OK), 0);
        assert_int_equal(test_daemon_spawn(&d, &o), 0);        /* for the teardown */
}

/* ---- wear across restarts ------------------------------------------------------------ */

static void restart(void) {
        TestDaemonOptions o = { .log_level = "debug", .wait_ready = true };

        assert_int_equal(test_daemon_kill(&d, SIGTERM, 10000), 0);
        assert_int_equal(test_daemon_spawn(&d, &o), 0);
}

static long long job_field(const char *job, const char *field) {
        json_t *st = test_daemon_status(&d);
        json_t *j;
        long long v;

        assert_non_null(st);
        j = test_json_job(st, job);
        assert_non_null(j);
        v = json_integer_value(json_object_get(j, field));
        json_decref(st);
        return v;
}

static long long target_field(const char *field) {
        json_t *st = test_daemon_status(&d);
        long long v;

        assert_non_null(st);
        v = json_integer_value(json_object_get(target0(st), field));
        json_decref(st);
        return v;
}

static void write_down(tier_client *c, const char *name) {
        tier_tensor *t = NULL;

        assert_int_equal(tier_tensor_create(c, name, MiB, &t), 0);
        fill(t, 0x5a);
        assert_int_equal(tier_evict(t, TIER_NVME), 0);
        tier_tensor_destroy(t);
}

static void test_wear_restart(void **state) {
        tier_client *c = NULL;
        long long target_total, job_total;
        char path[600], *text;
        int status;

        assert_int_equal(tier_client_new(d.socket, "wearjob", 0, &c), 0);
        write_down(c, "w0");
        write_down(c, "w1");
        job_total = job_field("wearjob", "wear_written");
        assert_int_equal(job_total, 2 * MiB);
        target_total = target_field("wear_written");
        assert_true(target_total >= (long long) MiB);  /* striped: at least half on target 0 */
        tier_client_free(c);

        restart();
        (void) snprintf(path, sizeof(path), "%s/wear", d.dir);
        assert_int_equal(access(path, F_OK), 0);
        assert_int_equal(target_field("bytes_written"), 0);
        assert_int_equal(target_field("wear_written"), target_total);

        /* the job name's past comes back with the name */
        assert_int_equal(tier_client_new(d.socket, "wearjob", 0, &c), 0);
        assert_int_equal(job_field("wearjob", "nvme_written"), 0);
        assert_int_equal(job_field("wearjob", "wear_written"), job_total);
        write_down(c, "w2");
        assert_int_equal(job_field("wearjob", "wear_written"), job_total + (long long) MiB);
        text = tierctl("status --prometheus", &status);
        assert_int_equal(status, 0);
        assert_true(prom_value(text, "tierd_job_wear_written_bytes_total{job_name=\"wearjob\"}") ==
                    (double) (job_total + (long long) MiB));
        free(text);
        tier_client_free(c);

        /* a corrupt book: set aside, said so, counted from zero */
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 10000), 0);
        {
                FILE *f = fopen(path, "we");

                assert_non_null(f);
                fputs("tierd-wear 1\ntarget /x notanumber\n", f);
                fclose(f);
        }
        {
                TestDaemonOptions o = { .log_level = "debug", .wait_ready = true };
                char aside[700];

                assert_int_equal(test_daemon_spawn(&d, &o), 0);
                assert_true(test_daemon_log_contains(&d, "is corrupt: line 2: 'notanumber' is not a byte count"));
                glob_t g;

                (void) snprintf(aside, sizeof(aside), "%s.corrupt.*", path);
                assert_int_equal(glob(aside, 0, NULL, &g), 0);
                assert_int_equal(g.gl_pathc, 1);
                globfree(&g);
                assert_int_equal(target_field("wear_written"), 0);
        }
}

/* ---- plan series across ranks ------------------------------------------------------- */

/* A client of job "pjob" as @rank with a plan over its own tensor (its handle in *@ret_t), @steps steps done. */
static tier_client *plan_rank(unsigned rank, const char *tensor, unsigned steps, tier_tensor **ret_t) {
        tier_client *c = NULL;
        tier_tensor *t = NULL;
        tier_plan *p = NULL;

        assert_int_equal(tier_client_new(d.socket, "pjob", rank, &c), 0);
        assert_int_equal(tier_tensor_create(c, tensor, MiB, &t), 0);
        assert_int_equal(tier_plan_new(c, &p), 0);
        assert_int_equal(tier_plan_add(p, 0, t, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_add(p, 1, t, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_submit(p), 0);
        for (unsigned i = 0; i < steps; i++) {
                assert_int_equal(tier_phase_enter(c, 0), 0);
                assert_int_equal(tier_phase_enter(c, 1), 0);
        }
        assert_int_equal(tier_phase_enter(c, 0), 0);   /* the last step counted */
        *ret_t = t;
        return c;
}

/* The samples of "pjob" in tierd_plan_iterations: their series (labels and all) and values. */
typedef struct Samples {
        char series[8][256];
        double value[8];
        unsigned n;
} Samples;

static void plan_samples(Samples *ret) {
        static const char prefix[] = "tierd_plan_iterations{job_name=\"pjob\"";
        char *text;
        int status;

        text = tierctl("status --prometheus", &status);
        assert_int_equal(status, 0);
        *ret = (Samples) { .n = 0 };
        for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
                size_t n = strcspn(line, " ");

                if (strncmp(line, prefix, strlen(prefix)) != 0)
                        continue;
                assert_true(ret->n < sizeof(ret->series) / sizeof(ret->series[0]) && n < sizeof(ret->series[0]));
                (void) snprintf(ret->series[ret->n], sizeof(ret->series[0]), "%.*s", (int) n, line);
                ret->value[ret->n++] = strtod(line + n + 1, NULL);
        }
        free(text);
}

static bool samples_find(const Samples *s, const char *series, double *ret) {
        for (unsigned i = 0; i < s->n; i++)
                if (strcmp(s->series[i], series) == 0) {
                        *ret = s->value[i];
                        return true;
                }
        return false;
}

/*
 * A plan's series is its rank's: when rank 0 leaves, rank 1's counter stays
 * where it was (it was labelled by the plan's index among the job's, so
 * "plan 0" became rank 1's and went from 5 steps to 1).  Two plans of one
 * rank are two series.
 */
static void test_plan_series_by_rank(void **state) {
        tier_tensor *t[3];
        tier_client *r0 = plan_rank(0, "w0", 5, &t[0]), *r1 = plan_rank(1, "w1", 1, &t[1]), *again;
        Samples before, after;
        unsigned with_conn = 0;
        json_t *st, *plans;
        double v;

        plan_samples(&before);
        assert_int_equal(before.n, 2);
        st = test_daemon_status(&d);
        assert_non_null(st);
        plans = json_object_get(test_json_job(st, "pjob"), "plans");
        assert_int_equal(json_array_size(plans), 2);
        assert_int_equal(json_integer_value(json_object_get(json_array_get(plans, 0), "rank")) +
                         json_integer_value(json_object_get(json_array_get(plans, 1), "rank")), 1);
        json_decref(st);

        tier_client_free(r0);
        for (unsigned ms = 0;; ms += 10) {      /* tierd sees the connection go in its own time */
                plan_samples(&after);
                if (after.n == 1 || ms > WAIT_MS)
                        break;
                sleep_ms(10);
        }
        assert_int_equal(after.n, 1);
        for (unsigned i = 0; i < after.n; i++) {
                double was;

                /* a counter that goes on goes on from where it was */
                if (samples_find(&before, after.series[i], &was) && after.value[i] < was)
                        fail_msg("%s went from %g to %g when rank 0 left", after.series[i], was, after.value[i]);
        }
        assert_true(samples_find(&before, "tierd_plan_iterations{job_name=\"pjob\",rank=\"0\"}", &v));
        assert_true(v == 5);
        assert_true(samples_find(&before, "tierd_plan_iterations{job_name=\"pjob\",rank=\"1\"}", &v));
        assert_true(v == 1);
        assert_true(samples_find(&after, "tierd_plan_iterations{job_name=\"pjob\",rank=\"1\"}", &v));
        assert_true(v == 1);

        /* a second client saying rank 1: its own series, named by its connection too */
        again = plan_rank(1, "w2", 2, &t[2]);
        plan_samples(&after);
        assert_int_equal(after.n, 2);
        assert_true(samples_find(&after, "tierd_plan_iterations{job_name=\"pjob\",rank=\"1\"}", &v));
        assert_true(v == 1);
        for (unsigned i = 0; i < after.n; i++)
                if (strstr(after.series[i], ",rank=\"1\",connection=\"")) {
                        with_conn++;
                        assert_true(after.value[i] == 2);
                }
        assert_int_equal(with_conn, 1);
        tier_client_free(again);
        tier_client_free(r1);
        for (unsigned i = 0; i < 3; i++)
                tier_tensor_close(t[i]);
}

/* ---- counters never go down ------------------------------------------------------------ */

/*
 * Every sample of a "_total" family in @after whose series (name and labels)
 * is also in @before has at least its value there: a counter goes down only
 * when tierd restarts.  @when says what happened in between.
 */
static void counters_not_down(const char *before, const char *after, const char *when) {
        unsigned checked = 0;

        for (const char *line = after; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
                size_t n = strcspn(line, " \n"), name = strcspn(line, "{ \n");
                char series[512];

                if (line[0] == '#' || name < 6 || strncmp(line + name - 6, "_total", 6) != 0)
                        continue;
                assert_true(n < sizeof(series) - 1);
                (void) snprintf(series, sizeof(series), "%.*s", (int) n, line);
                for (const char *b = before; b && *b; b = strchr(b, '\n') ? strchr(b, '\n') + 1 : NULL)
                        if (strncmp(b, series, n) == 0 && b[n] == ' ') {
                                double was = strtod(b + n + 1, NULL), now = strtod(line + n + 1, NULL);

                                if (now < was)
                                        fail_msg("counter %s went from %g to %g when %s", series, was, now, when);
                                checked++;
                        }
        }
        assert_true(checked > 0);
}

/*
 * A rank that ends its plan and submits another (the same connection): the
 * job's plan counters go on from where they were, and are the JSON's
 * (they were the plan's own, and went from 5 steps back to 1).
 */
static void test_counters_across_plans(void **state) {
        tier_tensor *t = NULL;
        tier_client *c = plan_rank(0, "w0", 5, &t);
        tier_plan *p = NULL;
        char *before, *after, series[128];
        json_t *st, *job;
        int status;

        before = tierctl("status --prometheus", &status);
        assert_int_equal(status, 0);

        assert_int_equal(tier_plan_end(c), 0);
        assert_int_equal(tier_plan_new(c, &p), 0);
        assert_int_equal(tier_plan_add(p, 0, t, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_add(p, 1, t, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_submit(p), 0);
        assert_int_equal(tier_phase_enter(c, 0), 0);
        assert_int_equal(tier_phase_enter(c, 1), 0);
        assert_int_equal(tier_phase_enter(c, 0), 0);   /* one step of the new plan */

        after = tierctl("status --prometheus", &status);
        assert_int_equal(status, 0);
        st = test_daemon_status(&d);
        assert_non_null(st);
        counters_not_down(before, after, "rank 0 submitted a new plan");
        assert_true(prom_value(before, "tierd_plan_iterations{job_name=\"pjob\",rank=\"0\"}") == 5);
        (void) snprintf(series, sizeof(series), "tierd_job_plan_iterations_total{job_name=\"pjob\",job_id=\"%lld\"}",
                        job_id("pjob"));
        assert_true(prom_value(before, series) == 5);
        /* the plan's own figures start again; the job's go on */
        assert_true(prom_value(after, "tierd_plan_iterations{job_name=\"pjob\",rank=\"0\"}") == 1);
        assert_true(prom_value(after, series) == 6);
        job = test_json_job(st, "pjob");
        assert_non_null(job);
        assert_int_equal(json_integer_value(json_object_get(job, "plan_iterations")), 6);
        (void) snprintf(series, sizeof(series), "tierd_job_plan_stall_seconds_total{job_name=\"pjob\",job_id=\"%lld\"}",
                        job_id("pjob"));
        assert_true(prom_value(after, series) >= 0);
        assert_non_null(json_object_get(job, "plan_stall_s"));

        json_decref(st);
        free(before);
        free(after);
        tier_client_free(c);
        tier_tensor_close(t);
}

/* The same tierd, but a job ends as soon as its last connection closes. */
static int setup_no_linger(void **state) {
        static char config[2048];

        if (!test_can_lock_memory(40 * MiB))
                return -1;
        (void) snprintf(config, sizeof(config), "[daemon]\nlinger_sec = 0\n%s", CONFIG);
        return test_daemon_start(&d, config) < 0 ? -1 : 0;
}

/* Has tierd no job named @name (its last status says so)? */
static bool job_gone(const char *name) {
        json_t *st = test_daemon_status(&d);
        bool gone;

        assert_non_null(st);
        gone = test_json_job(st, name) == NULL;
        json_decref(st);
        return gone;
}

/*
 * A job ends and a job of the same name begins: the counters of the one
 * that ended do not go on as the new one's from 0 (they were labelled by
 * the name alone: its NVMe bytes went from 1 MiB back to 0).
 */
static void test_counters_across_jobs(void **state) {
        tier_client *c = NULL;
        tier_tensor *t = NULL;
        char *before, *after;
        int status;

        assert_int_equal(tier_client_new(d.socket, "rjob", 0, &c), 0);
        assert_int_equal(tier_tensor_create(c, "a", MiB, &t), 0);
        fill(t, 0x33);
        assert_int_equal(tier_evict(t, TIER_NVME), 0);
        assert_int_equal(tier_prefetch(t, TIER_HOST), 0);
        before = tierctl("status --prometheus", &status);
        assert_int_equal(status, 0);

        tier_tensor_close(t);
        tier_client_free(c);
        for (unsigned ms = 0; !job_gone("rjob"); ms += 10) {  /* tierd sees the connection go in its own time */
                if (ms > WAIT_MS)
                        fail_msg("job rjob did not end with its last connection (linger_sec = 0)");
                sleep_ms(10);
        }
        assert_int_equal(tier_client_new(d.socket, "rjob", 0, &c), 0);
        after = tierctl("status --prometheus", &status);
        assert_int_equal(status, 0);
        counters_not_down(before, after, "job rjob ended and another job rjob began");

        free(before);
        free(after);
        tier_client_free(c);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_prometheus, setup, teardown),
                cmocka_unit_test_setup_teardown(test_textfile, setup, teardown),
                cmocka_unit_test_setup_teardown(test_textfile_removed_at_stop, setup, teardown),
                cmocka_unit_test_setup_teardown(test_wear_restart, setup, teardown),
                cmocka_unit_test_setup_teardown(test_plan_series_by_rank, setup, teardown),
                cmocka_unit_test_setup_teardown(test_counters_across_plans, setup, teardown),
                cmocka_unit_test_setup_teardown(test_counters_across_jobs, setup_no_linger, teardown),
        };

        if (getenv("TIER_TEST_FILTER"))                 /* one test, by name (a glob) */
                cmocka_set_test_filter(getenv("TIER_TEST_FILTER"));
        return cmocka_run_group_tests(tests, NULL, NULL);
}
