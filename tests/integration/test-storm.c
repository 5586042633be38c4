/* SPDX-License-Identifier: MIT */
/* test-storm.c: client processes SIGKILLed in every phase; tierd SIGKILLed under its clients. */

/*
 * The kill storm: STORM_CLIENTS client processes (STORM_CLIENTS_LONG with
 * TIER_TEST_LONG=1), STORM_PARALLEL at a time spread over STORM_JOBS jobs,
 * each looping over create / pin / async prefetch / evict / plan phases.
 * The parent picks a phase for each child, waits until the child reports
 * (in a shared page) that it entered that phase, waits a random 0..3 ms
 * more and SIGKILLs it, then starts the next child in its place.
 * Afterwards tierd's pinned bytes, operations, connections and open fds
 * are back at their baseline, its RSS within RSS_SLACK of it, and a
 * well-behaved job that stored its bytes before the storm reads them all
 * back.
 *
 * Daemon death: tierd SIGKILLed under a client that is pinned, waiting on
 * a fence and idle: every call returns an error within a bound (no hang,
 * no SIGPIPE: this program does not ignore SIGPIPE), and a new tierd on the
 * same socket path takes a new tier_client_new() (the reconnect pattern of
 * libtier(3)).
 */

#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <tier.h>

#include "tests/helpers/harness.h"
#include "tests/helpers/json.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)

/* [host] capacity below: locked and registered with io_uring by tierd. */
#define HOST_CAPACITY (64 * MiB)

#define STORM_CLIENTS 200
#define STORM_CLIENTS_LONG 1000
#define STORM_PARALLEL 8
#define STORM_JOBS 4
#define STORM_TENSORS 3
/*
 * The most tierd's RSS may grow over the storm.  Measured on a 2-core VM: +0.1..3.3
 * MiB after 200 clients, +3.6 MiB after 1000 (the allocator's free lists and arenas
 * reached under the storm's peak, not growth per client); 16 MiB leaves room for
 * another allocator or machine, while a leak of 16 KiB per client fails the long
 * run (1000 clients).  Not checked under ASan.
 */
#define RSS_SLACK_KIB (16 * 1024)

#define KEEPER_TENSORS 6
#define KEEPER_SIZE (1 * MiB)

/* linger_sec = 0: a storm job ends with its last connection, so nothing of it stays. */
static const char *const CONFIG =
        "[daemon]\n"
        "linger_sec = 0\n"
        "[limits]\n"
        "max_inflight = 64\n"
        "[host]\n"
        "capacity = 64M\n"
        "segment_size = 4M\n"
        "job_limit = 16M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 32M\n"
        "chunk_size = 2M\n"
        "job_limit = 8M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:128M\n"
        "target = @DIR@/t1.img:128M\n"
        "extent_size = 1M\n";

enum phase {
        PHASE_CREATE = 1,
        PHASE_PIN,
        PHASE_PREFETCH,
        PHASE_EVICT,
        PHASE_PLAN,
        PHASES_END,
};

static const char *const phase_names[PHASES_END] = {
        [PHASE_CREATE] = "create", [PHASE_PIN] = "pin", [PHASE_PREFETCH] = "prefetch",
        [PHASE_EVICT] = "evict", [PHASE_PLAN] = "plan",
};

/* One per parallel slot, shared with the child that runs in it. */
typedef struct Slot {
        _Atomic unsigned phase;         /* the phase the child entered last (0: not started) */
        _Atomic unsigned rounds;        /* full rounds of the phases done */
        pid_t pid;
        unsigned target;                /* the phase to kill it in */
        uint64_t kill_at;               /* CLOCK_MONOTONIC µs, once the phase was reached */
        uint64_t started;
} Slot;

static TestDaemon daemon_;
static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t rnd(void) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
}

static uint64_t now_us(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000u + (uint64_t) ts.tv_nsec / 1000u;
}

static int setup(void **state) {
        int r = test_daemon_start(&daemon_, CONFIG);

        if (r < 0) {
                fprintf(stderr, "cannot start tierd: %s\n", strerror(-r));
                return -1;
        }
        return 0;
}

static int teardown(void **state) {
        int r;

        if (daemon_.pid == 0) {
                test_daemon_cleanup(&daemon_);
                return 0;
        }
        r = test_daemon_stop(&daemon_);
        if (r != 0) {
                fprintf(stderr, "tierd did not exit cleanly (status %d)\n", r);
                return -1;
        }
        return 0;
}

static uint8_t pattern(uint64_t tensor, uint64_t off) {
        return (uint8_t) ((off * 131 + tensor * 17 + (off >> 11)) ^ (tensor << 5));
}

/* ---- the storm's children ------------------------------------------------------------------- */

/* An error a storm child expects under pressure from the others; anything else ends it. */
static bool tolerated(int r) {
        return r >= 0 || r == -ENOSPC || r == -EBUSY || r == -EEXIST || r == -ENOENT || r == -EAGAIN ||
               r == -ETIMEDOUT || r == -ENOMEM || r == -EDQUOT;
}

/* Set in the children of the shutdown test: tierd's stop ends them with status 0. */
static bool exit_on_shutdown;

#define CHILD_CHECK(expr, code)                                                                         \
        do {                                                                                            \
                int r_ = (expr);                                                                        \
                if (exit_on_shutdown && (r_ == -ESHUTDOWN || r_ == -ECONNRESET || r_ == -EPIPE ||      \
                                         r_ == -ENOTCONN))                                              \
                        _exit(0);                                                                       \
                if (!tolerated(r_)) {                                                                   \
                        fprintf(stderr, "storm child %d: %s: %s (%s)\n", (int) getpid(), #expr,         \
                                tier_strerror(r_), tier_client_last_error(cl));                         \
                        _exit(code);                                                                    \
                }                                                                                       \
        } while (0)

/* Open the slot's tensor @name, or create it: a killed predecessor may have left it. */
static tier_tensor *child_tensor(tier_client *cl, const char *name, uint64_t size) {
        tier_tensor *t = NULL;
        int r = tier_tensor_open(cl, name, &t);

        if (r == 0) {
                /* may be busy: the dead predecessor's pins go with its connection */
                r = tier_tensor_destroy(t);
                CHILD_CHECK(r, 10);
                if (r < 0)
                        return t;
        } else
                CHILD_CHECK(r, 11);
        r = tier_tensor_create(cl, name, size, &t);
        if (r == -EEXIST)
                r = tier_tensor_open(cl, name, &t);
        CHILD_CHECK(r, 12);
        return r < 0 ? NULL : t;
}

static _Noreturn void storm_child(Slot *slot, unsigned index) {
        tier_client *cl = NULL;
        tier_tensor *t[STORM_TENSORS] = { 0 };
        char job[32], name[32];
        int r;

        snprintf(job, sizeof(job), "storm%u", index % STORM_JOBS);
        r = tier_client_new(daemon_.socket, job, index, &cl);
        if (r < 0 && exit_on_shutdown && atomic_load(&slot->rounds) == 0 && r == -ECONNREFUSED)
                _exit(0);
        if (r < 0) {
                fprintf(stderr, "storm child: connect: %s (%s)\n", tier_strerror(r), tier_client_last_error(NULL));
                _exit(2);
        }
        for (;;) {
                struct tier_grant g;
                tier_fence f[STORM_TENSORS];
                tier_plan *p = NULL;

                atomic_store(&slot->phase, PHASE_CREATE);
                for (unsigned i = 0; i < STORM_TENSORS; i++) {
                        if (t[i] && tier_tensor_destroy(t[i]) == 0)
                                t[i] = NULL;
                        if (t[i])
                                t[i] = tier_tensor_close(t[i]);
                        snprintf(name, sizeof(name), "s%u-%u", index, i);
                        t[i] = child_tensor(cl, name, 256 * KiB * (1 + i));
                }

                atomic_store(&slot->phase, PHASE_PIN);
                for (unsigned i = 0; i < STORM_TENSORS; i++) {
                        if (!t[i])
                                continue;
                        r = tier_pin(t[i], i == 0 ? TIER_VRAM : TIER_HOST, TIER_READ_WRITE, &g);
                        CHILD_CHECK(r, 20);
                        if (r < 0)
                                continue;
                        if (g.ptr)
                                memset(g.ptr, (int) i + 1, g.length);
                        CHILD_CHECK(tier_unpin(t[i], i == 0 ? TIER_VRAM : TIER_HOST, 1), 21);
                }

                atomic_store(&slot->phase, PHASE_PREFETCH);
                for (unsigned i = 0; i < STORM_TENSORS; i++) {
                        f[i] = 0;
                        if (t[i])
                                CHILD_CHECK(tier_prefetch_async(t[i], TIER_VRAM, &f[i]), 30);
                }
                /* the last stays in flight into the next phase */
                for (unsigned i = 0; i + 1 < STORM_TENSORS; i++)
                        if (f[i])
                                CHILD_CHECK(tier_fence_wait(cl, f[i], 10000), 31);

                atomic_store(&slot->phase, PHASE_EVICT);
                for (unsigned i = 0; i < STORM_TENSORS; i++) {
                        if (!t[i])
                                continue;
                        if (i % 2)
                                CHILD_CHECK(tier_evict(t[i], TIER_NVME), 40);
                        else if (tier_evict_async(t[i], TIER_NVME, &f[i]) >= 0 && i == 0)
                                CHILD_CHECK(tier_fence_wait(cl, f[i], 10000), 41);
                }

                atomic_store(&slot->phase, PHASE_PLAN);
                if (t[0] && t[1] && tier_plan_new(cl, &p) == 0) {
                        CHILD_CHECK(tier_plan_add(p, 0, t[0], TIER_VRAM, TIER_READ_WRITE), 50);
                        CHILD_CHECK(tier_plan_add(p, 1, t[1], TIER_HOST, TIER_READ), 51);
                        r = tier_plan_submit(p);
                        if (r < 0)
                                tier_plan_free(p);
                        CHILD_CHECK(r, 52);
                        if (r == 0) {
                                for (unsigned k = 0; k < 4; k++) {
                                        unsigned i = k % 2;

                                        r = tier_phase_enter(cl, i);
                                        CHILD_CHECK(r, 53);
                                        /* the bytes the pin phase wrote are still there */
                                        if (r == 0 && tier_phase_grant(cl, t[i], i == 0 ? TIER_VRAM : TIER_HOST,
                                                                       &g) == 0 && g.ptr) {
                                                const uint8_t *b = g.ptr;

                                                if (b[0] != i + 1 || b[g.length / 2] != i + 1 ||
                                                    b[g.length - 1] != i + 1) {
                                                        fprintf(stderr, "storm child %u: tensor %u lost its bytes\n",
                                                                index, i);
                                                        _exit(60);
                                                }
                                        }
                                }
                                CHILD_CHECK(tier_plan_end(cl), 54);
                        }
                }
                atomic_fetch_add(&slot->rounds, 1);
        }
}

/* ---- tierd's resources ---------------------------------------------------------------------- */

static unsigned count_fds(pid_t pid) {
        char path[64];
        unsigned n = 0;
        DIR *d;
        struct dirent *de;

        snprintf(path, sizeof(path), "/proc/%d/fd", (int) pid);
        d = opendir(path);
        assert_non_null(d);
        while ((de = readdir(d)))
                if (de->d_name[0] != '.')
                        n++;
        closedir(d);
        return n;
}

static unsigned long rss_kib(pid_t pid) {
        char path[64], line[256];
        unsigned long kib = 0;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/status", (int) pid);
        f = fopen(path, "re");
        assert_non_null(f);
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "VmRSS: %lu kB", &kib) == 1)
                        break;
        fclose(f);
        return kib;
}

/* Is @pid built with AddressSanitizer (libasan mapped)?  Its quarantine holds up to 256 MiB of freed memory. */
static bool sanitized(pid_t pid) {
        char path[64], line[512];
        bool asan = false;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/maps", (int) pid);
        f = fopen(path, "re");
        assert_non_null(f);
        while (!asan && fgets(line, sizeof(line), f))
                asan = strstr(line, "libasan") != NULL;
        fclose(f);
        return asan;
}

typedef struct Snapshot {
        long long pinned;               /* all tiers, all jobs */
        long long ops;                  /* sched transfers + ops + queues + in flight */
        long long connections;
        long long jobs;
        long long renewing;             /* segments being renewed: each holds one more fd meanwhile */
        unsigned fds;
        unsigned long rss_kib;
} Snapshot;

static Snapshot snapshot(void) {
        Snapshot s = { 0 };
        json_t *st = test_daemon_status(&daemon_), *sched;
        static const char *const busy[] = { "transfers", "ops", "run_queue", "space_waiters",
                                            "nvme_queued", "nvme_in_flight", "vram_queued", "vram_in_flight" };

        assert_non_null(st);
        s.pinned = 0;
        for (unsigned i = 0; i < 3; i++) {
                s.pinned += test_json_tier(st, (const char *[]) { "vram", "host", "nvme" }[i], "pinned");
                s.renewing += test_json_tier(st, (const char *[]) { "vram", "host", "nvme" }[i], "renewing");
        }
        sched = json_object_get(st, "sched");
        assert_non_null(sched);
        for (size_t i = 0; i < sizeof(busy) / sizeof(busy[0]); i++) {
                json_t *v = json_object_get(sched, busy[i]);

                assert_true(json_is_integer(v));
                s.ops += json_integer_value(v);
        }
        s.connections = json_integer_value(json_object_get(st, "connections"));
        s.jobs = (long long) json_array_size(json_object_get(st, "jobs"));
        json_decref(st);
        s.fds = count_fds(daemon_.pid);
        s.rss_kib = rss_kib(daemon_.pid);
        return s;
}

static void print_snapshot(const char *what, const Snapshot *s) {
        fprintf(stderr, "%s: pinned %lld, ops %lld, connections %lld, jobs %lld, renewing %lld, fds %u, rss %lu KiB\n",
                what, s->pinned, s->ops, s->connections, s->jobs, s->renewing, s->fds, s->rss_kib);
}

/* ---- the well-behaved job ------------------------------------------------------------------- */

static tier_tensor *keeper_t[KEEPER_TENSORS];

static void keeper_store(tier_client *c) {
        char name[16];
        struct tier_grant g;

        for (unsigned i = 0; i < KEEPER_TENSORS; i++) {
                snprintf(name, sizeof(name), "k%u", i);
                assert_int_equal(tier_tensor_create(c, name, KEEPER_SIZE, &keeper_t[i]), 0);
                assert_int_equal(tier_pin(keeper_t[i], TIER_HOST, TIER_READ_WRITE, &g), 0);
                for (uint64_t o = 0; o < g.length; o++)
                        ((uint8_t *) g.ptr)[o] = pattern(i, o);
                assert_int_equal(tier_unpin(keeper_t[i], TIER_HOST, 1), 0);
                /* some on NVMe only, some in VRAM, some in host memory */
                if (i % 3 == 0)
                        assert_int_equal(tier_evict(keeper_t[i], TIER_NVME), 0);
                else if (i % 3 == 1)
                        assert_int_equal(tier_prefetch(keeper_t[i], TIER_VRAM), 0);
        }
}

static void keeper_verify(void) {
        struct tier_grant g;

        for (unsigned i = 0; i < KEEPER_TENSORS; i++) {
                assert_int_equal(tier_pin(keeper_t[i], TIER_HOST, TIER_READ_WRITE, &g), 0);
                for (uint64_t o = 0; o < g.length; o++)
                        if (((uint8_t *) g.ptr)[o] != pattern(i, o)) {
                                fprintf(stderr, "keeper tensor %u byte %" PRIu64 ": %u, not %u\n", i, o,
                                        ((uint8_t *) g.ptr)[o], pattern(i, o));
                                fail();
                        }
                assert_int_equal(tier_unpin(keeper_t[i], TIER_HOST, 0), 0);
        }
}

/* ---- the storm ------------------------------------------------------------------------------ */

static void slot_start(Slot *slots, unsigned s, unsigned n) {
        Slot *slot = &slots[s];
        pid_t pid;

        atomic_store(&slot->phase, 0);
        atomic_store(&slot->rounds, 0);
        slot->target = 1 + n % (PHASES_END - 1);
        slot->kill_at = 0;
        slot->started = now_us();
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
                storm_child(slot, s);
        slot->pid = pid;
}

static void test_kill_storm(void **state) {
        const char *lng = getenv("TIER_TEST_LONG");
        unsigned total = lng && *lng && strcmp(lng, "0") ? STORM_CLIENTS_LONG : STORM_CLIENTS;
        unsigned started = 0, killed = 0, per_phase[PHASES_END] = { 0 };
        Slot *slots;
        tier_client *keeper = NULL;
        Snapshot base, after;
        uint64_t t0;

        slots = mmap(NULL, sizeof(Slot) * STORM_PARALLEL, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
                     0);
        assert_true(slots != MAP_FAILED);
        memset(slots, 0, sizeof(Slot) * STORM_PARALLEL);

        assert_int_equal(tier_client_new(daemon_.socket, "keeper", 0, &keeper), 0);
        keeper_store(keeper);

        /* warm up: one child of each kind runs a full round and is killed, so that what tierd
         * allocates once (its allocator's arenas, a first job's tables) is in the baseline */
        for (unsigned s = 0; s < STORM_PARALLEL; s++) {
                slot_start(slots, s, s);
                while (atomic_load(&slots[s].rounds) < 1) {
                        int st;

                        assert_int_equal(waitpid(slots[s].pid, &st, WNOHANG), 0);
                        usleep(1000);
                }
        }
        for (unsigned s = 0; s < STORM_PARALLEL; s++) {
                assert_int_equal(kill(slots[s].pid, SIGKILL), 0);
                assert_int_equal(waitpid(slots[s].pid, NULL, 0), slots[s].pid);
        }
        for (unsigned i = 0; i < 200; i++) {
                base = snapshot();
                if (base.jobs == 1 && base.ops == 0 && base.pinned == 0 && base.renewing == 0)
                        break;
                usleep(50000);
        }
        print_snapshot("baseline", &base);
        assert_int_equal(base.jobs, 1);
        assert_int_equal(base.renewing, 0);     /* else its fd count is not the resting one */

        t0 = now_us();
        for (unsigned s = 0; s < STORM_PARALLEL; s++)
                slot_start(slots, s, started++);
        while (killed < total) {
                for (unsigned s = 0; s < STORM_PARALLEL; s++) {
                        Slot *slot = &slots[s];
                        int st;
                        pid_t w;

                        if (slot->pid == 0)
                                continue;
                        w = waitpid(slot->pid, &st, WNOHANG);
                        assert_true(w >= 0);
                        if (w == slot->pid) {
                                fprintf(stderr, "storm child %d exited by itself (status %d) in phase %u\n",
                                        (int) w, WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st),
                                        atomic_load(&slot->phase));
                                test_daemon_dump_log(&daemon_);
                                fail();
                        }
                        if (slot->kill_at == 0) {
                                unsigned ph = atomic_load(&slot->phase);

                                /* the target phase, or any once it ran a few rounds without seeing it */
                                if (ph == slot->target || (ph && atomic_load(&slot->rounds) > 3))
                                        slot->kill_at = now_us() + rnd() % 3000;
                                else if (now_us() - slot->started > 30000000u) {
                                        fprintf(stderr, "storm child %d stuck before phase %u (in %u)\n",
                                                (int) slot->pid, slot->target, ph);
                                        test_daemon_dump_log(&daemon_);
                                        fail();
                                }
                                continue;
                        }
                        if (now_us() < slot->kill_at)
                                continue;
                        per_phase[atomic_load(&slot->phase)]++;
                        assert_int_equal(kill(slot->pid, SIGKILL), 0);
                        assert_int_equal(waitpid(slot->pid, &st, 0), slot->pid);
                        if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
                                fprintf(stderr, "storm child %d ended with status %d before its SIGKILL\n",
                                        (int) slot->pid, st);
                                fail();
                        }
                        slot->pid = 0;
                        killed++;
                        if (started < total)
                                slot_start(slots, s, started++);
                }
                usleep(200);
        }
        fprintf(stderr, "storm: %u clients SIGKILLed in %.1f s; in phase", killed, (double) (now_us() - t0) / 1e6);
        for (unsigned p = 1; p < PHASES_END; p++)
                fprintf(stderr, " %s %u", phase_names[p], per_phase[p]);
        fprintf(stderr, "\n");

        /* tierd notices each hangup by itself; give it a bounded while to finish the dead's copies */
        for (unsigned i = 0; i < 400; i++) {
                after = snapshot();
                if (after.jobs == base.jobs && after.ops == 0 && after.pinned == 0 && after.renewing == 0 &&
                    after.connections == base.connections && after.fds <= base.fds)
                        break;
                usleep(50000);
        }
        print_snapshot("after", &after);
        assert_int_equal(after.pinned, 0);
        assert_int_equal(after.renewing, 0);
        assert_int_equal(after.ops, 0);
        assert_int_equal(after.jobs, base.jobs);
        assert_int_equal(after.connections, base.connections);
        /* none leaked; fewer is fine: a transient fd of tierd's own (a state file being replaced) may have
         * been open at the baseline (fresh-check's nonroot pass once saw 57 then 56) */
        if (after.fds > base.fds)
                fail_msg("tierd holds %u fds after the storm, %u before", (unsigned) after.fds, (unsigned) base.fds);
        if (sanitized(daemon_.pid))
                fprintf(stderr, "tierd runs with AddressSanitizer, whose quarantine keeps freed memory: "
                                "its RSS is not checked\n");
        else if (after.rss_kib > base.rss_kib + RSS_SLACK_KIB) {
                fprintf(stderr, "tierd's RSS grew by %lu KiB over the storm (slack %llu KiB)\n",
                        after.rss_kib - base.rss_kib, (unsigned long long) RSS_SLACK_KIB);
                fail();
        }

        keeper_verify();
        for (unsigned i = 0; i < KEEPER_TENSORS; i++)
                assert_int_equal(tier_tensor_destroy(keeper_t[i]), 0);
        tier_client_free(keeper);
        munmap(slots, sizeof(Slot) * STORM_PARALLEL);
}

/* ---- tierd SIGKILLed under its clients; a new tierd on the same socket -------------------- */

/* Bound on every call after tierd's death: SIGALRM's default action ends this program. */
#define DEATH_BOUND_S 20

static void test_daemon_death(void **state) {
        tier_client *busy = NULL, *idle = NULL, *again = NULL;
        tier_tensor *t[4], *u = NULL;
        struct tier_grant g, g2;
        tier_fence f = 0;
        char name[16];
        TestDaemonOptions o = { .log_level = "debug", .wait_ready = true };
        int r, k;

        assert_int_equal(tier_client_new(daemon_.socket, "mortal", 0, &busy), 0);
        assert_int_equal(tier_client_new(daemon_.socket, "mortal", 1, &idle), 0);
        for (unsigned i = 0; i < 4; i++) {
                snprintf(name, sizeof(name), "m%u", i);
                assert_int_equal(tier_tensor_create(busy, name, 2 * MiB, &t[i]), 0);
        }
        assert_int_equal(tier_pin(t[0], TIER_HOST, TIER_READ_WRITE, &g), 0);
        memset(g.ptr, 0x5a, g.length);
        for (unsigned i = 1; i < 4; i++)
                assert_int_equal(tier_evict(t[i], TIER_NVME), 0);
        /* a fence that may still be open when the axe falls */
        assert_int_equal(tier_prefetch_async(t[3], TIER_VRAM, &f), 0);

        k = test_daemon_kill(&daemon_, SIGKILL, 10000);
        assert_int_equal(k, 128 + SIGKILL);

        alarm(DEATH_BOUND_S);
        /* the mapping of a pinned copy stays readable: nothing is unmapped under the program */
        for (uint64_t o2 = 0; o2 < g.length; o2 += 4096)
                assert_int_equal(((uint8_t *) g.ptr)[o2], 0x5a);
        r = tier_fence_wait(busy, f, -1);
        /* done before the kill (0) or failed; never a hang */
        assert_true(r == 0 || r == -ECONNRESET || r == -EPIPE || r == -ESHUTDOWN);
        r = tier_pin(t[1], TIER_HOST, TIER_READ_WRITE, &g2);
        fprintf(stderr, "after tierd's death: pin: %s (%s)\n", tier_strerror(r), tier_client_last_error(busy));
        assert_true(r == -ECONNRESET || r == -EPIPE || r == -ENOTCONN);
        r = tier_unpin(t[0], TIER_HOST, 1);
        assert_true(r < 0);
        r = tier_tensor_create(idle, "late", MiB, &u);
        fprintf(stderr, "after tierd's death: create on an idle client: %s (%s)\n", tier_strerror(r),
                tier_client_last_error(idle));
        assert_true(r == -ECONNRESET || r == -EPIPE || r == -ENOTCONN);
        r = tier_client_process(idle);
        assert_true(r < 0);
        r = tier_client_status(idle, TIER_STATUS_JSON, &(char *) { NULL });
        assert_true(r < 0);
        r = tier_client_new(daemon_.socket, "mortal", 0, &again);
        fprintf(stderr, "after tierd's death: connect: %s (%s)\n", tier_strerror(r), tier_client_last_error(NULL));
        assert_true(r < 0);
        alarm(0);

        /* the documented pattern: free the dead client, connect again once a tierd runs */
        for (unsigned i = 0; i < 4; i++)
                tier_tensor_close(t[i]);
        tier_client_free(busy);
        tier_client_free(idle);
        assert_int_equal(test_daemon_spawn(&daemon_, &o), 0);
        assert_int_equal(tier_client_new(daemon_.socket, "mortal", 0, &again), 0);
        /* nothing of the old job survived the restart */
        assert_int_equal(tier_tensor_open(again, "m1", &u), -ENOENT);
        assert_int_equal(tier_tensor_create(again, "m1", 2 * MiB, &u), 0);
        assert_int_equal(tier_pin(u, TIER_VRAM, TIER_READ_WRITE, &g2), 0);
        memset(g2.ptr, 0x33, g2.length);
        assert_int_equal(tier_unpin(u, TIER_VRAM, 1), 0);
        assert_int_equal(tier_evict(u, TIER_NVME), 0);
        assert_int_equal(tier_pin(u, TIER_HOST, TIER_READ_WRITE, &g2), 0);
        for (uint64_t o2 = 0; o2 < g2.length; o2++)
                assert_int_equal(((uint8_t *) g2.ptr)[o2], 0x33);
        assert_int_equal(tier_unpin(u, TIER_HOST, 0), 0);
        assert_int_equal(tier_tensor_destroy(u), 0);
        tier_client_free(again);
}

/* ---- SIGTERM (once or twice) while copies run on every link and plans are active ------------ */

static long long link_ops(const json_t *st, const char *name) {
        json_t *l;
        size_t i;

        json_array_foreach(json_object_get(st, "links"), i, l)
                if (strcmp(json_string_value(json_object_get(l, "name")), name) == 0)
                        return json_integer_value(json_object_get(l, "ops"));
        return -1;
}

/*
 * With two SIGTERMs, the second must reach tierd while it drains: signals
 * sent microseconds apart merge into one pending SIGTERM, and a drain that
 * ends by itself before the second arrives makes it a no-op.  So the test
 * sends the second only after STOPPING=1 (tierd handled the first), and
 * holds the drain open with one write of job "stuck" whose completion
 * TIERD_TEST_FAULTS (setup_stuck()) holds back a minute: only the second
 * SIGTERM, or the 10 s drain timeout, can end that drain.
 */
static const char *const STUCK_FAULTS = "nvme-delay:ms=60000,job=stuck";

static int setup_stuck(void **state) {
        int r = test_daemon_init(&daemon_, CONFIG);

        if (r < 0) {
                fprintf(stderr, "cannot set up tierd: %s\n", strerror(-r));
                return -1;
        }
        if (setenv("TIERD_TEST_FAULTS", STUCK_FAULTS, 1) < 0)
                return -1;
        r = test_daemon_spawn(&daemon_, &(TestDaemonOptions) { .log_level = "debug", .wait_ready = true });
        unsetenv("TIERD_TEST_FAULTS");
        if (r < 0) {
                fprintf(stderr, "cannot start tierd: %s\n", strerror(-r));
                test_daemon_cleanup(&daemon_);
                return -1;
        }
        return 0;
}

static void shutdown_under_load(unsigned sigterms) {
        static const char *const links[] = { "nvme->host", "host->nvme", "host->vram", "vram->host" };
        long long start[4];
        Slot *slots;
        json_t *st;
        tier_client *stuck = NULL;
        tier_tensor *t = NULL;
        struct tier_grant g;
        tier_fence f = 0;
        int status;
        bool all = false;

        slots = mmap(NULL, sizeof(Slot) * STORM_PARALLEL, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
                     0);
        assert_true(slots != MAP_FAILED);
        memset(slots, 0, sizeof(Slot) * STORM_PARALLEL);
        st = test_daemon_status(&daemon_);
        assert_non_null(st);
        for (unsigned l = 0; l < 4; l++)
                start[l] = link_ops(st, links[l]);
        json_decref(st);

        exit_on_shutdown = true;
        for (unsigned s = 0; s < STORM_PARALLEL; s++)
                slot_start(slots, s, s);
        exit_on_shutdown = false;
        /* until every link has moved something and every child ran a round (plans included) */
        for (unsigned i = 0; i < 600 && !all; i++) {
                usleep(50000);
                all = true;
                for (unsigned s = 0; s < STORM_PARALLEL; s++)
                        all = all && atomic_load(&slots[s].rounds) > 0;
                st = test_daemon_status(&daemon_);
                assert_non_null(st);
                for (unsigned l = 0; l < 4; l++)
                        all = all && link_ops(st, links[l]) > start[l];
                json_decref(st);
        }
        assert_true(all);

        if (sigterms == 1) {
                status = test_daemon_kill(&daemon_, SIGTERM, 20000);
                if (status != 0)
                        test_daemon_dump_log(&daemon_);
                assert_int_equal(status, 0);
                assert_true(test_daemon_log_contains(&daemon_, "STOPPING") ||
                            test_daemon_find_notify(&daemon_, "STOPPING=1") >= 0);
        } else {
                /* a write that cannot complete for a minute keeps the drain open */
                assert_int_equal(tier_client_new(daemon_.socket, "stuck", 0, &stuck), 0);
                assert_int_equal(tier_tensor_create(stuck, "held", 1 * MiB, &t), 0);
                assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
                memset(g.ptr, 7, g.length);
                assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
                assert_int_equal(tier_evict_async(t, TIER_NVME, &f), 0);
                for (unsigned i = 0; i < 600 && !test_daemon_log_contains(&daemon_, "Injected fault nvme-delay");
                     i++)
                        test_daemon_collect(&daemon_, 50);
                assert_true(test_daemon_log_contains(&daemon_, "Injected fault nvme-delay"));

                assert_int_equal(kill(daemon_.pid, SIGTERM), 0);
                /* the first SIGTERM was handled: tierd drains, and the held write keeps it draining */
                assert_true(test_daemon_wait_notify(&daemon_, "STOPPING=1", 30000) >= 0);
                assert_true(test_daemon_log_contains(&daemon_, "SIGTERM received, stopping"));
                assert_int_equal(kill(daemon_.pid, SIGTERM), 0);
                status = test_daemon_kill(&daemon_, 0, 20000);
                if (status != 0 || !test_daemon_log_contains(&daemon_, "received again"))
                        test_daemon_dump_log(&daemon_);
                assert_int_equal(status, 0);
                /* the second one ended the drain, not the drain timeout */
                assert_true(test_daemon_log_contains(&daemon_,
                                                     "SIGTERM received again, stopping without waiting any longer"));
                assert_false(test_daemon_log_contains(&daemon_, "Stopping with"));
                /* the held write's fence fails instead of hanging */
                assert_true(tier_fence_wait(stuck, f, 20000) < 0);
                tier_tensor_close(t);
                tier_client_free(stuck);
        }

        /* each client learnt of the stop and ended by itself, none hung */
        for (unsigned s = 0; s < STORM_PARALLEL; s++) {
                int st2 = 0;
                pid_t w = 0;

                for (unsigned i = 0; i < 400 && w == 0; i++) {
                        w = waitpid(slots[s].pid, &st2, WNOHANG);
                        if (w == 0)
                                usleep(50000);
                }
                if (w == 0) {
                        fprintf(stderr, "client %d still runs 20 s after tierd's stop\n", (int) slots[s].pid);
                        kill(slots[s].pid, SIGKILL);
                        waitpid(slots[s].pid, NULL, 0);
                        fail();
                }
                if (!WIFEXITED(st2) || WEXITSTATUS(st2) != 0)
                        fprintf(stderr, "client %d ended with status %#x after tierd's stop\n", (int) w, st2);
                assert_true(WIFEXITED(st2));
                assert_int_equal(WEXITSTATUS(st2), 0);
        }
        munmap(slots, sizeof(Slot) * STORM_PARALLEL);
}

static void test_sigterm_under_load(void **state) {
        shutdown_under_load(1);
}

static void test_double_sigterm_under_load(void **state) {
        shutdown_under_load(2);
}

/*
 * SIGTERM while a transfer cannot end (every NVMe completion held back a
 * minute by TIERD_TEST_FAULTS): tierd waits its drain timeout (10 s), says
 * so, and exits 0 as documented, without touching the request it gave up on.
 */
static void test_drain_timeout(void **state) {
        TestDaemon d = { 0 };
        tier_client *c = NULL;
        tier_tensor *t = NULL;
        struct tier_grant g;
        tier_fence f;
        uint64_t t0;
        double waited;
        int r, status;

        r = test_daemon_init(&d, CONFIG);
        assert_int_equal(r, 0);
        assert_int_equal(setenv("TIERD_TEST_FAULTS", "nvme-delay:ms=60000", 1), 0);
        r = test_daemon_spawn(&d, &(TestDaemonOptions) { .log_level = "info", .wait_ready = true });
        unsetenv("TIERD_TEST_FAULTS");
        assert_int_equal(r, 0);
        assert_int_equal(tier_client_new(d.socket, "stuck", 0, &c), 0);
        assert_int_equal(tier_tensor_create(c, "t", 1 * MiB, &t), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        memset(g.ptr, 7, g.length);
        assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
        assert_int_equal(tier_evict_async(t, TIER_NVME, &f), 0);
        for (unsigned i = 0; i < 100 && !test_daemon_log_contains(&d, "Injected fault nvme-delay"); i++) {
                test_daemon_collect(&d, 50);
        }
        assert_true(test_daemon_log_contains(&d, "Injected fault nvme-delay"));

        t0 = now_us();
        status = test_daemon_kill(&d, SIGTERM, 30000);
        waited = (double) (now_us() - t0) / 1e6;
        fprintf(stderr, "tierd stopped %.1f s after SIGTERM with a transfer that could not end\n", waited);
        if (status != 0)
                test_daemon_dump_log(&d);
        assert_int_equal(status, 0);
        assert_true(test_daemon_log_contains(&d, "Stopping with 1 transfer(s) still in flight"));
        /* the client learns of it: the fence fails instead of hanging */
        r = tier_fence_wait(c, f, 20000);
        assert_true(r < 0);
        tier_tensor_close(t);
        tier_client_free(c);
        test_daemon_cleanup(&d);
}

/*
 * Soak (TIER_TEST_LONG=1 only; minutes from TIER_TEST_SOAK_MIN, default 5):
 * four jobs of mixed load (the storm's clients, never killed, each doing
 * every phase over and over and checking in its plan phases that its bytes
 * are still there) while the keeper's bytes stay put; every
 * minute tierd's fds and RSS are sampled: after the first minute they may
 * not grow beyond the storm's slack, and at the end the keeper verifies.
 */
static void test_soak(void **state) {
        const char *lng = getenv("TIER_TEST_LONG"), *mins_env = getenv("TIER_TEST_SOAK_MIN");
        unsigned minutes = mins_env && atoi(mins_env) > 0 ? (unsigned) atoi(mins_env) : 5;
        tier_client *keeper;
        Slot *slots;
        Snapshot base, now;

        if (!lng || strcmp(lng, "1") != 0) {
                print_message("the soak runs with TIER_TEST_LONG=1: skipped\n");
                skip();
        }
        assert_int_equal(tier_client_new(daemon_.socket, "keeper", 0, &keeper), 0);
        keeper_store(keeper);
        slots = mmap(NULL, sizeof(Slot) * STORM_JOBS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        assert_true(slots != MAP_FAILED);
        memset(slots, 0, sizeof(Slot) * STORM_JOBS);
        for (unsigned s = 0; s < STORM_JOBS; s++)
                slot_start(slots, s, s);
        sleep(60);
        base = snapshot();
        print_snapshot("soak after 1 min", &base);
        for (unsigned m = 1; m < minutes; m++) {
                sleep(60);
                now = snapshot();
                print_snapshot("soak", &now);
                assert_true(now.fds <= base.fds + STORM_JOBS);  /* a request in flight may hold one */
                if (!sanitized(daemon_.pid))
                        assert_true(now.rss_kib <= base.rss_kib + RSS_SLACK_KIB);
        }
        for (unsigned s = 0; s < STORM_JOBS; s++) {
                int st = 0;

                assert_true(atomic_load(&slots[s].rounds) > 0);
                /* still running: none found its bytes changed (it would have exited 60) */
                assert_int_equal(waitpid(slots[s].pid, &st, WNOHANG), 0);
                kill(slots[s].pid, SIGKILL);
                waitpid(slots[s].pid, NULL, 0);
        }
        munmap(slots, sizeof(Slot) * STORM_JOBS);
        keeper_verify();
        tier_client_free(keeper);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_kill_storm, setup, teardown),
                cmocka_unit_test_setup_teardown(test_daemon_death, setup, teardown),
                cmocka_unit_test_setup_teardown(test_sigterm_under_load, setup, teardown),
                cmocka_unit_test_setup_teardown(test_double_sigterm_under_load, setup_stuck, teardown),
                cmocka_unit_test(test_drain_timeout),
                cmocka_unit_test_setup_teardown(test_soak, setup, teardown),
        };

        if (!test_can_lock_memory(HOST_CAPACITY))
                return TEST_SKIP;
        /* SIGPIPE is not ignored here on purpose: libtier must never raise it */
        return cmocka_run_group_tests_name("storm", tests, NULL, NULL);
}
