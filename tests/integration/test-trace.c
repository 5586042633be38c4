/* SPDX-License-Identifier: MIT */
/* test-trace.c: tierctl trace / tier_trace_*: a traced two-job run adds up to tierd's link counters. */

/*
 * Two jobs with iteration plans (the layout of test-timeline.c, whose
 * working set is three times the host limit and six times the VRAM limit,
 * so that data moves on all four links) run while a trace records.  The
 * trace is written by libtier's one writer (tier_trace_write_json(), what
 * tierctl trace uses), parsed with jansson and checked: a valid Chrome
 * trace (every event has ph, ts, pid, tid; complete events a dur >= 0;
 * timestamps monotonic per track), one process per job with phases, and
 * per link the transfer events' bytes equal to the growth of the link
 * counters tierd reports in its status over the trace, exactly.  Tracing
 * needs root or group tier-admin: as another uid, the denial is checked
 * instead (and the tests that trace skip, saying why).
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <tier.h>

#include "tests/helpers/harness.h"
#include "tests/helpers/json.h"
#include "util/time-util.h"

#define KiB 1024ull
#define LAYERS 6
#define TSIZE (512 * KiB)
#define STEPS 3

static const char *const CONFIG =
        "[daemon]\n"
        "linger_sec = 1\n"
        "[host]\n"
        "capacity = 32M\n"
        "segment_size = 2M\n"
        "job_limit = 6M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 8M\n"
        "chunk_size = 1M\n"
        "job_limit = 3M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:256M\n"
        "target = @DIR@/t1.img:256M\n"
        "extent_size = 256K\n"
        "[sched]\n"
        "policy = timeline\n"
        "[trace]\n"
        "buffer = 200000\n";

static TestDaemon daemon_;
static const char *const LINKS[TIER_LINKS] = { "nvme->host", "host->nvme", "host->vram", "vram->host" };

static int setup(void **state) {
        return test_daemon_start(&daemon_, CONFIG) < 0 ? -1 : 0;
}

static int teardown(void **state) {
        return test_daemon_stop(&daemon_) == 0 ? 0 : -1;
}

/* Tracing needs root (or group tier-admin, which the test user is not in): say so and skip. */
static bool need_root(const char *what) {
        if (geteuid() == 0)
                return true;
        printf("%s needs root (tracing needs root or group tier-admin): skipped\n", what);
        return false;
}

static tier_client *connect_control(void) {
        tier_client *c = NULL;

        assert_int_equal(tier_client_new(daemon_.socket, NULL, 0, &c), 0);
        return c;
}

enum { PH_FWD = 0, PH_BWD = LAYERS, PH_OPT = 2 * LAYERS };

static int grant_fill(tier_client *c, tier_tensor *t, int tier, uint8_t v) {
        struct tier_grant g;

        if (tier_phase_grant(c, t, tier, &g) < 0)
                return -1;
        memset(g.ptr, v, g.length);
        return 0;
}

/* One job of @steps steps: forward reads P in VRAM, backward writes G there, the optimizer updates in host. */
static int run_job(const char *job, int steps) {
        tier_client *c = NULL;
        tier_tensor *P[LAYERS], *G[LAYERS], *O[LAYERS];
        tier_plan *plan = NULL;
        char name[16];

        if (tier_client_new(daemon_.socket, job, 0, &c) < 0)
                return -1;
        for (int i = 0; i < LAYERS; i++) {
                snprintf(name, sizeof(name), "P%d", i);
                if (tier_tensor_create(c, name, TSIZE, &P[i]) < 0)
                        return -1;
                snprintf(name, sizeof(name), "G%d", i);
                if (tier_tensor_create(c, name, TSIZE, &G[i]) < 0)
                        return -1;
                snprintf(name, sizeof(name), "O%d", i);
                if (tier_tensor_create(c, name, TSIZE, &O[i]) < 0)
                        return -1;
        }
        if (tier_plan_new(c, &plan) < 0)
                return -1;
        for (int i = 0; i < LAYERS; i++) {
                int b = LAYERS - 1 - i;

                tier_plan_add(plan, PH_FWD + i, P[i], TIER_VRAM, TIER_READ);
                tier_plan_add(plan, PH_BWD + i, P[b], TIER_VRAM, TIER_READ);
                tier_plan_add(plan, PH_BWD + i, G[b], TIER_VRAM, TIER_WRITE);
                tier_plan_add(plan, PH_OPT + i, G[i], TIER_HOST, TIER_READ);
                tier_plan_add(plan, PH_OPT + i, O[i], TIER_HOST, TIER_READ_WRITE);
                tier_plan_add(plan, PH_OPT + i, P[i], TIER_HOST, TIER_READ_WRITE);
        }
        if (tier_plan_submit(plan) < 0) {
                fprintf(stderr, "%s: plan: %s\n", job, tier_client_last_error(c));
                tier_plan_free(plan);
                return -1;
        }
        for (int step = 1; step <= steps; step++) {
                for (int i = 0; i < LAYERS; i++)
                        if (tier_phase_enter(c, PH_FWD + i) < 0)
                                return -1;
                for (int i = 0; i < LAYERS; i++) {
                        if (tier_phase_enter(c, PH_BWD + i) < 0 ||
                            grant_fill(c, G[LAYERS - 1 - i], TIER_VRAM, (uint8_t) step) < 0)
                                return -1;
                }
                for (int i = 0; i < LAYERS; i++) {
                        if (tier_phase_enter(c, PH_OPT + i) < 0 || grant_fill(c, O[i], TIER_HOST, (uint8_t) step) < 0 ||
                            grant_fill(c, P[i], TIER_HOST, (uint8_t) step) < 0)
                                return -1;
                }
        }
        if (tier_phase_enter(c, PH_FWD) < 0)
                return -1;
        tier_client_free(c);
        for (int i = 0; i < LAYERS; i++) {
                tier_tensor_close(P[i]);
                tier_tensor_close(G[i]);
                tier_tensor_close(O[i]);
        }
        return 0;
}

static void run_two_jobs(const char *a, const char *b, int steps) {
        pid_t pids[2];
        int st;

        for (int k = 0; k < 2; k++) {
                pids[k] = fork();
                assert_true(pids[k] >= 0);
                if (pids[k] == 0)
                        _exit(run_job(k ? b : a, steps) == 0 ? 0 : 1);
        }
        for (int k = 0; k < 2; k++) {
                assert_int_equal(waitpid(pids[k], &st, 0), pids[k]);
                assert_true(WIFEXITED(st));
                assert_int_equal(WEXITSTATUS(st), 0);
        }
}

/* The link counters of tierd's status (tierctl --json status), and whether any transfer is in flight. */
static bool link_counters(uint64_t bytes[TIER_LINKS]) {
        json_t *status = test_daemon_status(&daemon_), *l;
        bool busy;
        size_t i;

        assert_non_null(status);
        memset(bytes, 0, TIER_LINKS * sizeof(uint64_t));
        json_array_foreach(json_object_get(status, "links"), i, l)
                for (int k = 0; k < TIER_LINKS; k++)
                        if (strcmp(json_string_value(json_object_get(l, "name")), LINKS[k]) == 0)
                                bytes[k] = (uint64_t) json_integer_value(json_object_get(l, "bytes"));
        busy = test_json_sum(json_object_get(status, "sched"), "transfers") > 0;
        json_decref(status);
        return busy;
}

/* Wait until no transfer is in flight and the counters stand still (write-behind, drains of lingering jobs). */
static void link_counters_settled(uint64_t bytes[TIER_LINKS]) {
        uint64_t prev[TIER_LINKS] = {};

        for (int i = 0; i < 600; i++) {
                bool busy = link_counters(bytes);

                if (!busy && i > 0 && memcmp(prev, bytes, sizeof(prev)) == 0)
                        return;
                memcpy(prev, bytes, sizeof(prev));
                usleep(100000);
        }
        fail_msg("tierd's link counters never settled");
}

/* Write @t as JSON through libtier's writer into DIR/@name and parse it. */
static json_t *trace_json(const tier_trace *t, const char *name) {
        char path[400];
        json_error_t err;
        json_t *j;
        int fd;

        snprintf(path, sizeof(path), "%s/%s", daemon_.dir, name);
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        assert_true(fd >= 0);
        assert_int_equal(tier_trace_write_json(t, fd), 0);
        assert_int_equal(close(fd), 0);
        j = json_load_file(path, 0, &err);
        if (!j)
                fail_msg("%s is not JSON: line %d: %s", path, err.line, err.text);
        return j;
}

typedef struct Track {
        json_int_t pid, tid;
        double last_ts;
        double last_end;        /* of its transfers: those on one track never overlap (lanes) */
} Track;

/*
 * Check @j is a valid Chrome trace: every event has ph, ts, pid and tid,
 * lies (with its dur, for "X") inside the trace's span, and each track's
 * timestamps never go back; the span itself lies inside @t0..@t1 (the
 * test's CLOCK_MONOTONIC, tierd's clock too, read before tier_trace_start()
 * and after tier_trace_stop()).  Adds up the bytes of the transfer events
 * per link into @bytes.
 */
static void check_chrome(const json_t *j, uint64_t t0, uint64_t t1, uint64_t bytes[TIER_LINKS],
                         uint64_t job_io[TIER_LINKS], size_t *ret_phases, size_t *ret_decisions) {
        json_t *events = json_object_get(j, "traceEvents"), *e, *other = json_object_get(j, "otherData");
        Track *tracks;
        size_t i, n_tracks = 0, phases = 0, decisions = 0;
        uint64_t start_ns, stop_ns;
        double span;

        assert_true(json_is_array(events));
        assert_true(json_is_string(json_object_get(j, "displayTimeUnit")));
        assert_true(json_is_object(other));
        assert_true(json_is_integer(json_object_get(other, "start_ns")));
        assert_true(json_is_integer(json_object_get(other, "stop_ns")));
        start_ns = (uint64_t) json_integer_value(json_object_get(other, "start_ns"));
        stop_ns = (uint64_t) json_integer_value(json_object_get(other, "stop_ns"));
        assert_true(t0 <= start_ns);
        assert_true(start_ns <= stop_ns);
        assert_true(stop_ns <= t1);
        /* µs, as ts and dur; these have ns precision in 3 decimals: allow for their rounding */
        span = (double) (stop_ns - start_ns) / 1000.0 + 0.002;
        tracks = calloc(json_array_size(events) + 1, sizeof(Track));
        assert_non_null(tracks);
        memset(bytes, 0, TIER_LINKS * sizeof(uint64_t));
        memset(job_io, 0, TIER_LINKS * sizeof(uint64_t));
        json_array_foreach(events, i, e) {
                const char *ph = json_string_value(json_object_get(e, "ph"));
                json_t *ts = json_object_get(e, "ts"), *pid = json_object_get(e, "pid"), *tid = json_object_get(e, "tid");
                size_t k;

                assert_non_null(ph);
                assert_true(json_is_number(ts));
                assert_true(json_is_integer(pid));
                assert_true(json_is_integer(tid));
                if (strcmp(ph, "M") == 0)
                        continue;
                assert_true(strcmp(ph, "X") == 0 || strcmp(ph, "i") == 0);
                /* a time before the start would come out near 2^64 ns (unsigned), so past the stop */
                assert_true(json_number_value(ts) <= span);
                if (strcmp(ph, "X") == 0) {
                        assert_true(json_is_number(json_object_get(e, "dur")));
                        assert_true(json_number_value(ts) + json_number_value(json_object_get(e, "dur")) <= span);
                }
                for (k = 0; k < n_tracks; k++)
                        if (tracks[k].pid == json_integer_value(pid) && tracks[k].tid == json_integer_value(tid))
                                break;
                if (k == n_tracks)
                        tracks[n_tracks++] = (Track) { json_integer_value(pid), json_integer_value(tid), -1 };
                assert_true(json_number_value(ts) >= tracks[k].last_ts);
                tracks[k].last_ts = json_number_value(ts);

                const char *cat = json_string_value(json_object_get(e, "cat"));
                json_t *args = json_object_get(e, "args");

                assert_non_null(cat);
                if (strcmp(cat, "transfer") == 0 || strcmp(cat, "job-io") == 0) {
                        const char *link = json_string_value(json_object_get(args, "link"));
                        int l;

                        for (l = 0; l < TIER_LINKS; l++)
                                if (link && strcmp(link, LINKS[l]) == 0)
                                        break;
                        assert_true(l < TIER_LINKS);
                        assert_true(json_is_string(json_object_get(args, "job")));
                        assert_true(json_is_string(json_object_get(args, "tensor")));
                        /* the links' tracks, and the same transfers again on their jobs' */
                        (strcmp(cat, "transfer") == 0 ? bytes : job_io)[l] +=
                                (uint64_t) json_integer_value(json_object_get(args, "bytes"));
                        /* (times have ns precision in 3 decimals: allow for the rounding of their sum) */
                        assert_true(json_number_value(ts) >= tracks[k].last_end - 0.002);
                        tracks[k].last_end = json_number_value(ts) + json_number_value(json_object_get(e, "dur"));
                } else if (strcmp(cat, "phase") == 0) {
                        phases++;
                } else if (strcmp(cat, "decision") == 0) {
                        assert_true(json_is_string(json_object_get(args, "why")));
                        decisions++;
                }
        }
        free(tracks);
        *ret_phases = phases;
        *ret_decisions = decisions;
}

/* Is there a process_name metadata event naming "job @job ..."? */
static bool has_job_track(const json_t *j, const char *job) {
        json_t *e;
        size_t i;
        char want[64];

        snprintf(want, sizeof(want), "job %s (", job);
        json_array_foreach(json_object_get(j, "traceEvents"), i, e) {
                const char *name = json_string_value(json_object_get(json_object_get(e, "args"), "name"));

                if (strcmp(json_string_value(json_object_get(e, "ph")), "M") == 0 && name && strncmp(name, want,
                                                                                                  strlen(want)) == 0)
                        return true;
        }
        return false;
}

static void test_two_jobs_add_up(void **state) {
        uint64_t before[TIER_LINKS], after[TIER_LINKS], traced[TIER_LINKS], job_io[TIER_LINKS], t0, t1;
        size_t phases, decisions;
        tier_client *c;
        tier_trace *t = NULL;
        json_t *j, *other;

        if (!need_root("tracing two jobs"))
                skip();
        link_counters_settled(before);
        c = connect_control();
        t0 = now_ns();
        assert_int_equal(tier_trace_start(c, 600, 0), 0);
        run_two_jobs("trace-a", "trace-b", STEPS);
        link_counters_settled(after);
        assert_int_equal(tier_trace_stop(c, &t), 0);
        t1 = now_ns();
        tier_client_free(c);

        assert_int_equal(tier_trace_dropped(t), 0);
        assert_true(tier_trace_records(t) > 0);
        j = trace_json(t, "two-jobs.json");
        check_chrome(j, t0, t1, traced, job_io, &phases, &decisions);
        for (int l = 0; l < TIER_LINKS; l++) {
                printf("%-10s  status delta %" PRIu64 ", traced %" PRIu64 "\n", LINKS[l], after[l] - before[l],
                       traced[l]);
                assert_true(after[l] > before[l]);      /* the plans move data on every link */
                assert_int_equal(traced[l], after[l] - before[l]);
                assert_int_equal(job_io[l], traced[l]);
                assert_int_equal(tier_trace_traced_bytes(t, l), traced[l]);
                assert_int_equal(tier_trace_link_bytes(t, l), after[l] - before[l]);
        }
        /*
         * Markers tierd reads: a rank whose next phase is ready already goes on
         * without waiting, and tierd may see only its latest marker then (a
         * marker is a counter in the plan page), so there may be fewer phases
         * than 2 jobs x STEPS x 18 markers, but there are some.
         */
        printf("%zu phases, %zu decisions\n", phases, decisions);
        assert_true(phases > 0);
        assert_true(decisions > 0);
        assert_true(has_job_track(j, "trace-a"));
        assert_true(has_job_track(j, "trace-b"));
        other = json_object_get(j, "otherData");
        assert_int_equal(json_integer_value(json_object_get(other, "dropped_records")), 0);
        for (int l = 0; l < TIER_LINKS; l++)
                assert_int_equal(json_integer_value(json_object_get(json_object_get(other, "link_bytes_counted"),
                                                                    LINKS[l])), (json_int_t) (after[l] - before[l]));
        json_decref(j);
        tier_trace_free(t);
}

/*
 * A tensor wanted in VRAM whose only copy is on NVMe moves in one chained
 * transfer, piece by piece (4 extents here): still one record per hop, and
 * the records add up to the counters.  Runs first: no job lingers yet, so
 * the counters move by this tensor alone.
 */
static void test_chained_adds_up(void **state) {
        uint64_t before[TIER_LINKS], after[TIER_LINKS], traced[TIER_LINKS], job_io[TIER_LINKS], t0, t1;
        const uint64_t size = 1024 * KiB;      /* one VRAM chunk (several are mapped in place: not under valgrind) */
        size_t phases, decisions;
        tier_client *c, *job = NULL;
        tier_tensor *x = NULL;
        tier_trace *t = NULL;
        struct tier_grant g;
        json_t *j;
        int r;

        if (!need_root("tracing a chained transfer"))
                skip();
        assert_int_equal(tier_client_new(daemon_.socket, "chained", 0, &job), 0);
        assert_int_equal(tier_tensor_create(job, "x", size, &x), 0);
        assert_int_equal(tier_pin(x, TIER_HOST, TIER_READ_WRITE, &g), 0);
        for (uint64_t i = 0; i < g.length; i++)
                ((uint8_t *) g.ptr)[i] = (uint8_t) (i * 13 + (i >> 10));
        assert_int_equal(tier_unpin(x, TIER_HOST, 1), 0);
        assert_int_equal(tier_evict(x, TIER_NVME), 0);
        link_counters_settled(before);

        c = connect_control();
        t0 = now_ns();
        assert_int_equal(tier_trace_start(c, 600, 0), 0);
        r = tier_pin(x, TIER_VRAM, TIER_READ_WRITE, &g);
        if (r < 0)
                fail_msg("pin in VRAM: %s (%s)", tier_strerror(r), tier_client_last_error(job));
        for (uint64_t i = 0; i < g.length; i++)
                if (((uint8_t *) g.ptr)[i] != (uint8_t) (i * 13 + (i >> 10)))
                        fail_msg("byte %" PRIu64 " of the VRAM copy is wrong", i);
        assert_int_equal(tier_unpin(x, TIER_VRAM, 0), 0);
        link_counters_settled(after);
        assert_int_equal(tier_trace_stop(c, &t), 0);
        t1 = now_ns();
        tier_client_free(c);

        assert_int_equal(after[TIER_LINK_NVME_TO_HOST] - before[TIER_LINK_NVME_TO_HOST], size);
        assert_int_equal(after[TIER_LINK_HOST_TO_VRAM] - before[TIER_LINK_HOST_TO_VRAM], size);
        j = trace_json(t, "chained.json");
        check_chrome(j, t0, t1, traced, job_io, &phases, &decisions);
        for (int l = 0; l < TIER_LINKS; l++) {
                assert_int_equal(traced[l], after[l] - before[l]);
                assert_int_equal(job_io[l], traced[l]);
                assert_int_equal(tier_trace_link_bytes(t, l), after[l] - before[l]);
        }
        json_decref(j);
        tier_trace_free(t);
        assert_int_equal(tier_tensor_destroy(x), 0);
        tier_client_free(job);
}

static void test_one_at_a_time(void **state) {
        tier_client *a, *b;
        tier_trace *t = NULL;

        if (!need_root("one trace at a time"))
                skip();
        a = connect_control();
        b = connect_control();
        assert_int_equal(tier_trace_stop(a, &t), -ENOENT);
        assert_int_equal(tier_trace_start(a, 60, 16), 0);
        assert_int_equal(tier_trace_start(b, 60, 16), -EBUSY);
        assert_non_null(strstr(tier_client_last_error(b), "one trace at a time"));
        assert_int_equal(tier_trace_start(a, 60, 16), -EBUSY);
        /* only its owner reads it */
        assert_int_equal(tier_trace_stop(b, &t), -EPERM);
        assert_int_equal(tier_trace_stop(a, &t), 0);
        tier_trace_free(t);
        t = NULL;
        /* a trace ends with its connection: another may start */
        assert_int_equal(tier_trace_start(a, 60, 16), 0);
        tier_client_free(a);
        assert_int_equal(tier_trace_start(b, 60, 16), 0);
        assert_int_equal(tier_trace_stop(b, &t), 0);
        tier_trace_free(t);
        tier_client_free(b);
        assert_true(test_daemon_log_contains(&daemon_, "ended with its connection, unread"));
}

static void test_overflow_counted(void **state) {
        tier_client *c;
        tier_trace *t = NULL;
        uint64_t dropped;
        json_t *j;

        if (!need_root("a full trace buffer"))
                skip();
        c = connect_control();
        assert_int_equal(tier_trace_start(c, 600, 4), 0);
        run_two_jobs("small-a", "small-b", 1);
        assert_int_equal(tier_trace_stop(c, &t), 0);
        tier_client_free(c);
        assert_int_equal(tier_trace_records(t), 4);
        dropped = tier_trace_dropped(t);
        assert_true(dropped > 0);
        j = trace_json(t, "small.json");
        assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "otherData"), "dropped_records")),
                         (json_int_t) dropped);
        json_decref(j);
        tier_trace_free(t);
        assert_true(test_daemon_log_contains(&daemon_, "4 record(s) kept"));
}

static void test_nothing_when_not_tracing(void **state) {
        uint64_t links[TIER_LINKS];
        tier_client *c;
        tier_trace *t = NULL;

        if (!need_root("an empty trace"))
                skip();

        /* jobs ran before (and between traces): none of it is in a trace started afterwards */
        run_two_jobs("quiet-a", "quiet-b", 1);
        link_counters_settled(links);   /* their last write-downs are over */
        c = connect_control();
        assert_int_equal(tier_trace_start(c, 600, 0), 0);
        assert_int_equal(tier_trace_stop(c, &t), 0);
        tier_client_free(c);
        assert_int_equal(tier_trace_records(t), 0);
        assert_int_equal(tier_trace_dropped(t), 0);
        tier_trace_free(t);
}

/* The child of test_write_to_closed_pipe(): 0, or which check failed. */
static int write_to_closed_pipe(const tier_trace *t) {
        struct sigaction sa;
        sigset_t mask, pending;
        int p[2], r;

        if (pipe2(p, O_CLOEXEC) < 0)
                return 10;
        close(p[0]);
        signal(SIGPIPE, SIG_DFL);
        r = tier_trace_write_json(t, p[1]);
        /* still alive: SIGPIPE was not raised, or was taken off again */
        if (r != -EPIPE)
                return 11;
        if (sigaction(SIGPIPE, NULL, &sa) < 0 || sa.sa_handler != SIG_DFL)
                return 12;
        if (sigprocmask(SIG_SETMASK, NULL, &mask) < 0 || sigismember(&mask, SIGPIPE))
                return 13;      /* the mask is the caller's again */
        if (sigpending(&pending) < 0 || sigismember(&pending, SIGPIPE))
                return 14;
        return 0;
}

/* tier_trace_records(3): a reader gone is -EPIPE; libtier(3): libtier never raises SIGPIPE. */
static void test_write_to_closed_pipe(void **state) {
        tier_client *c;
        tier_trace *t = NULL;
        pid_t pid;
        int st;

        if (!need_root("a trace to write"))
                skip();
        c = connect_control();
        assert_int_equal(tier_trace_start(c, 600, 0), 0);
        assert_int_equal(tier_trace_stop(c, &t), 0);
        tier_client_free(c);
        fflush(stdout);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
                _exit(write_to_closed_pipe(t));
        assert_int_equal(waitpid(pid, &st, 0), pid);
        tier_trace_free(t);
        if (WIFSIGNALED(st))
                fail_msg("the writer died of signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
}

/* Run "tierctl --socket SOCK ARGS" with output to DIR/tierctl.out; its exit status. */
static int tierctl(const char *args) {
        char cmd[1400], path[300];

        snprintf(cmd, sizeof(cmd), "%s --socket %s %s >%s/tierctl.out 2>&1", test_tierctl_path(path, sizeof(path)),
                 daemon_.socket, args, daemon_.dir);
        int st = system(cmd);

        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_tierctl_trace(void **state) {
        char args[600], path[400];
        json_error_t err;
        json_t *j;

        if (!need_root("tierctl trace"))
                skip();
        snprintf(path, sizeof(path), "%s/cli.json", daemon_.dir);
        snprintf(args, sizeof(args), "trace --seconds 1 -o %s --json-summary", path);
        assert_int_equal(tierctl(args), 0);
        j = json_load_file(path, 0, &err);
        assert_non_null(j);
        assert_true(json_is_array(json_object_get(j, "traceEvents")));
        assert_true(json_is_object(json_object_get(json_object_get(j, "otherData"), "link_bytes_counted")));
        json_decref(j);
        assert_int_equal(tierctl("trace --seconds 0 -o x.json"), 2);
        assert_int_equal(tierctl("trace --seconds 1"), 2);
}

/* The mode of the file "tierctl trace -o" leaves at @path, after one made with @mode (0: none). */
static mode_t trace_file_mode(const char *path, mode_t mode) {
        char args[600];
        struct stat st;

        (void) unlink(path);
        if (mode) {
                int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);

                assert_true(fd >= 0);
                assert_int_equal(fchmod(fd, mode), 0);
                close(fd);
        }
        snprintf(args, sizeof(args), "trace --seconds 1 -o %s", path);
        assert_int_equal(tierctl(args), 0);
        assert_int_equal(lstat(path, &st), 0);
        assert_true(S_ISREG(st.st_mode) && st.st_size > 0);
        return st.st_mode & 07777;
}

/* A trace names every job's tensors: a new file is the owner's alone, a file written over keeps its mode. */
static void test_tierctl_trace_mode(void **state) {
        char path[400];
        mode_t mask;

        if (!need_root("tierctl trace"))
                skip();
        snprintf(path, sizeof(path), "%s/mode.json", daemon_.dir);
        mask = umask(022);
        assert_int_equal(trace_file_mode(path, 0), 0600);
        assert_int_equal(trace_file_mode(path, 0600), 0600);
        assert_int_equal(trace_file_mode(path, 0640), 0640);
        umask(077);
        assert_int_equal(trace_file_mode(path, 0), 0600);
        umask(mask);
}

/* As uid 65534: refused, saying who asked; logged with uid and pid. */
static int trace_as_nobody(void) {
        tier_client *x = NULL;

        if (tier_client_new(daemon_.socket, NULL, 0, &x) < 0)
                return 4;
        if (tier_trace_start(x, 1, 0) != -EACCES || !strstr(tier_client_last_error(x), "uid 65534 (pid "))
                return 5;
        tier_client_free(x);
        return 0;
}

static void test_denied(void **state) {
        pid_t pid;
        int st;

        if (geteuid() == 65534) {
                assert_int_equal(trace_as_nobody(), 0);
        } else if (geteuid() == 0) {
                assert_int_equal(chmod(daemon_.dir, 0711), 0);
                assert_int_equal(chmod(daemon_.socket, 0666), 0);
                pid = fork();
                assert_true(pid >= 0);
                if (pid == 0) {
                        if (setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
                                _exit(3);
                        _exit(trace_as_nobody());
                }
                assert_int_equal(waitpid(pid, &st, 0), pid);
                assert_true(WIFEXITED(st));
                if (WEXITSTATUS(st) == 4) {
                        printf("uid 65534 cannot reach the socket (a directory above it is closed): skipped\n");
                        skip();
                }
                assert_int_equal(WEXITSTATUS(st), 0);
        } else {
                printf("the denial needs root (to become uid 65534) or uid 65534: skipped\n");
                skip();
        }
        assert_true(test_daemon_log_contains(&daemon_, "Denied: uid 65534 (pid "));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_chained_adds_up),
                cmocka_unit_test(test_two_jobs_add_up),
                cmocka_unit_test(test_one_at_a_time),
                cmocka_unit_test(test_overflow_counted),
                cmocka_unit_test(test_nothing_when_not_tracing),
                cmocka_unit_test(test_write_to_closed_pipe),
                cmocka_unit_test(test_tierctl_trace),
                cmocka_unit_test(test_tierctl_trace_mode),
                cmocka_unit_test(test_denied),
        };

        return cmocka_run_group_tests(tests, setup, teardown);
}
