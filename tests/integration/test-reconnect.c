/* SPDX-License-Identifier: MIT */
/* test-reconnect.c: a client that writes through its pins while tierd stops loses nothing, and lives through the restart. */

/*
 * tierd stops (SIGTERM) while a client is in the middle of a phase or holds
 * a pin that may write, and writes on after the stop was announced: tierd
 * waits for it to let go (its next phase, its unpin) before it writes what
 * is in memory down to NVMe, so the next tierd has every byte.  A client
 * with reconnecting (tier_client_set_reconnect()) leaves at that point by
 * itself and, once the next tierd answers, gets -ERESTART and carries on; one
 * without still gets its unpin through.  The order is explicit: the client
 * (a child process) writes only after tierd said STOPPING=1, and the next
 * tierd starts only after the old one exited.  Also: the reconnect timeout,
 * -ESTALE for a tensor the next tierd does not have, and a control
 * connection, which does not reconnect.
 */

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>
#include <tier.h>

#include "tests/helpers/harness.h"

#define MiB (1024ull * 1024ull)
#define RECONNECT_MS 30000

static const char config_body[] =
        "[daemon]\nlinger_sec = 600\n"
        "[host]\ncapacity = 16M\nsegment_size = 4M\njob_limit = 16M\nuid_share = 0\n"
        "[vram]\nbackend = emulated\ncapacity = 8M\nchunk_size = 2M\njob_limit = 8M\n"
        "[nvme]\ntarget = @DIR@/t0.img:64M\nuid_share = 0\n";

static TestDaemon d;

static void spawn(void) {
        TestDaemonOptions o = { .log_level = "debug", .wait_ready = true };

        assert_int_equal(test_daemon_spawn(&d, &o), 0);
}

/* SIGTERM, and wait until tierd began its stop (Event.shutdown follows STOPPING=1 in the same loop turn). */
static void stop_begins(void) {
        assert_int_equal(kill(d.pid, SIGTERM), 0);
        assert_true(test_daemon_wait_notify(&d, "STOPPING=1", 10000) >= 0);
}

/*
 * The client of the two tests below runs in a child process, since its
 * libtier call waits for the next tierd, which this process starts (tierd
 * dies with the thread that started it: PR_SET_PDEATHSIG).  They take turns
 * through two pipes; CHECK() ends the child with the line that failed.
 */
#define CHECK(x) do { if (!(x)) { fprintf(stderr, "client: %s:%d: %s failed\n", __FILE__, __LINE__, #x); \
                                  _exit(__LINE__ % 250 + 1); } } while (0)

typedef struct Turns {
        int to_child[2], to_parent[2];
        pid_t pid;
} Turns;

static void turn_give(int fd) {
        char b = 1;

        if (write(fd, &b, 1) != 1)
                _exit(255);
}

static void turn_take(int fd) {
        char b;

        if (read(fd, &b, 1) != 1)
                _exit(254);
}

static void forked(Turns *t, void (*client)(Turns *t)) {
        assert_int_equal(pipe2(t->to_child, O_CLOEXEC), 0);
        assert_int_equal(pipe2(t->to_parent, O_CLOEXEC), 0);
        t->pid = fork();
        assert_true(t->pid >= 0);
        if (t->pid == 0) {
                client(t);
                fflush(stdout);
                _exit(0);
        }
}

/*
 * The parent's part: once the client wrote half, SIGTERM; once tierd said
 * STOPPING=1, the client writes the rest and goes on; tierd must wait for it,
 * write down, and exit by itself (not at its bound); then the next tierd.
 */
static void stop_and_restart(Turns *t) {
        int status;

        turn_take(t->to_parent[0]);
        stop_begins();
        turn_give(t->to_child[1]);
        assert_int_equal(test_daemon_kill(&d, 0, 20000), 0);   /* signal 0: only wait */
        assert_true(test_daemon_log_contains(&d, "held only in memory down to NVMe"));
        assert_false(test_daemon_log_contains(&d, "Stopping with"));
        spawn();
        assert_int_equal(waitpid(t->pid, &status, 0), t->pid);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                test_daemon_dump_log(&d);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        for (int i = 0; i < 2; i++) {
                close(t->to_child[i]);
                close(t->to_parent[i]);
        }
}

static tier_client *connect_job(const char *job, int reconnect_ms) {
        tier_client *c = NULL;

        assert_int_equal(tier_client_new(d.socket, job, 0, &c), 0);
        if (reconnect_ms)
                assert_int_equal(tier_client_set_reconnect(c, reconnect_ms), 0);
        return c;
}

static bool all(const uint8_t *p, size_t n, uint8_t v) {
        for (size_t i = 0; i < n; i++)
                if (p[i] != v)
                        return false;
        return true;
}

/* Pinned for reading, @t holds @v in every byte. */
static void expect_bytes(tier_tensor *t, uint8_t v) {
        struct tier_grant g;

        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ, &g), 0);
        assert_true(all(g.ptr, g.length, v));
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
}

static bool all(const uint8_t *p, size_t n, uint8_t v);

static void phase_client(Turns *t) {
        tier_client *c = NULL;
        tier_tensor *a = NULL;
        tier_plan *p = NULL;
        struct tier_grant g;
        int r;

        CHECK(tier_client_new(d.socket, "phase", 0, &c) == 0);
        CHECK(tier_client_set_reconnect(c, RECONNECT_MS) == 0);
        CHECK(tier_tensor_create(c, "a", MiB, &a) == 0);
        for (int round = 0; round < 2; round++) {
                /* phase 0 writes A whole in host; phase 1 reads it */
                CHECK(tier_plan_new(c, &p) == 0);
                CHECK(tier_plan_add(p, 0, a, TIER_HOST, TIER_WRITE) == 0);
                CHECK(tier_plan_add(p, 1, a, TIER_HOST, TIER_READ) == 0);
                CHECK(tier_plan_submit(p) == 0);
                if (round == 1)
                        break;
                CHECK(tier_phase_enter(c, 0) == 0);
                CHECK(tier_phase_grant(c, a, TIER_HOST, &g) == 0);
                memset(g.ptr, 0x11, g.length / 2);
                turn_give(t->to_parent[1]);
                turn_take(t->to_child[0]);
                /* tierd is stopping, and waits for this phase: its memory is still tierd's */
                memset((uint8_t *) g.ptr + g.length / 2, 0x11, g.length - g.length / 2);
                r = tier_phase_enter(c, 1);
                fprintf(stderr, "client: tier_phase_enter() after the stop: %d: %s\n", r, tier_client_last_error(c));
                CHECK(r == -ERESTART);
                CHECK(tier_client_restarts(c) == 1);
                /* the plan went with the old tierd: phases fail until it is submitted again */
                CHECK(tier_phase_enter(c, 1) == -EINVAL);
        }
        CHECK(tier_phase_enter(c, 1) == 0);
        CHECK(tier_phase_grant(c, a, TIER_HOST, &g) == 0);
        CHECK(all(g.ptr, g.length, 0x11));
        CHECK(tier_plan_end(c) == 0);
        CHECK(tier_tensor_destroy(a) == 0);
        tier_client_free(c);
}

/*
 * In a phase that writes A, tierd is told to stop; half of A is written
 * after that.  tierd waits: the client leaves at its next tier_phase_enter(), and
 * what it wrote is on NVMe for the next tierd.
 */
static void test_stop_in_a_phase(void **state) {
        Turns t;

        forked(&t, phase_client);
        stop_and_restart(&t);
}

static void pin_client(Turns *t) {
        tier_client *c = NULL;
        tier_tensor *a = NULL;
        struct tier_stat st;
        struct tier_grant g;
        int r;

        CHECK(tier_client_new(d.socket, "pin", 0, &c) == 0);
        CHECK(tier_client_set_reconnect(c, RECONNECT_MS) == 0);
        CHECK(tier_tensor_create(c, "a", MiB, &a) == 0);
        CHECK(tier_pin(a, TIER_HOST, TIER_READ_WRITE, &g) == 0);
        memset(g.ptr, 0x22, g.length / 2);
        turn_give(t->to_parent[1]);
        turn_take(t->to_child[0]);
        memset((uint8_t *) g.ptr + g.length / 2, 0x22, g.length - g.length / 2);
        CHECK(tier_unpin(a, TIER_HOST, 1) == 0);        /* still sent */
        /* tierd closed the connection once the pin went; this call waits for the next tierd */
        r = tier_tensor_stat(a, &st);
        if (r != -ERESTART)
                fprintf(stderr, "client: stat after the stop: %d %s: %s\n", r, tier_strerror(r), tier_client_last_error(c));
        CHECK(r == -ERESTART);
        CHECK(tier_tensor_stat(a, &st) == 0);
        CHECK(tier_pin(a, TIER_HOST, TIER_READ, &g) == 0);
        CHECK(all(g.ptr, g.length, 0x22));
        CHECK(tier_unpin(a, TIER_HOST, 0) == 0);
        CHECK(tier_tensor_destroy(a) == 0);
        tier_client_free(c);
}

/*
 * A pin that may write, outside a plan: written on after the stop began,
 * unpinned (still sent), and the next call finds the next tierd.
 */
static void test_stop_with_a_pin(void **state) {
        Turns t;

        forked(&t, pin_client);
        stop_and_restart(&t);
}

/*
 * Without reconnecting: requests fail with -ESHUTDOWN once tierd announced
 * its stop, but the unpin is still sent, and what was written before it is
 * on NVMe for the next tierd.
 */
static void test_stop_without_reconnecting(void **state) {
        tier_client *c = connect_job("plain", 0);
        tier_tensor *a = NULL, *b = NULL;
        struct tier_grant g;
        int status;

        assert_int_equal(tier_tensor_create(c, "a", MiB, &a), 0);
        assert_int_equal(tier_pin(a, TIER_HOST, TIER_READ_WRITE, &g), 0);
        stop_begins();
        memset(g.ptr, 0x33, g.length);
        /*
         * Event.shutdown may still be on its way: then tierd refuses the request
         * itself (it answers only unpins, EndPlan and status while stopping)
         */
        assert_int_equal(tier_tensor_create(c, "b", MiB, &b), -ESHUTDOWN);
        printf("a request after the stop: %s\n", tier_client_last_error(c));
        assert_non_null(strstr(tier_client_last_error(c), "stopping"));
        assert_int_equal(tier_unpin(a, TIER_HOST, 1), 0);
        status = test_daemon_kill(&d, 0, 20000);
        assert_int_equal(status, 0);
        assert_false(test_daemon_log_contains(&d, "Stopping with"));
        tier_tensor_close(a);
        tier_client_free(c);

        spawn();
        c = connect_job("plain", 0);
        assert_int_equal(tier_tensor_open(c, "a", &a), 0);
        expect_bytes(a, 0x33);
        assert_int_equal(tier_tensor_destroy(a), 0);
        tier_client_free(c);
}

/*
 * No tierd within the timeout: the call fails with the error that found it
 * gone (not -ERESTART); once one runs again, the next call joins it.  A
 * tensor the next tierd does not have (its NVMe index was removed) fails
 * with -ESTALE; a control connection does not reconnect.  Meanwhile
 * tier_client_fd() and tier_unpin_after() (which asks the VRAM backend the
 * lost connection named) fail as the connection did.
 */
static void test_timeout_and_stale(void **state) {
        tier_client *c = connect_job("late", 200), *ctl = NULL;
        tier_tensor *a = NULL;
        tier_fence f = 0;
        struct tier_stat st;
        char path[512];
        int r;

        assert_int_equal(tier_tensor_create(c, "a", MiB, &a), 0);
        assert_int_equal(tier_prefetch_async(a, TIER_HOST, &f), 0);
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 20000), 0);
        r = tier_tensor_stat(a, &st);
        printf("a call with no tierd to come back to: %s (%s)\n", tier_strerror(r), tier_client_last_error(c));
        assert_true(r == -ESHUTDOWN || r == -ECONNRESET || r == -EPIPE);
        assert_non_null(strstr(tier_client_last_error(c), "did not come back within 200 ms"));
        assert_int_equal(tier_client_restarts(c), 0);
        /* a fence of before: the error that broke the connection, not "tierd restarted" (none did yet) */
        assert_int_equal(tier_fence_done(c, f), r);
        assert_non_null(strstr(tier_client_last_error(c), "and no tierd came back"));
        /* no connection now: the error that broke it, not fd -1 (-EPERM), nor a crash on a backend unknown */
        assert_int_equal(tier_client_fd(c), r);
        assert_int_equal(tier_unpin_after(a, TIER_VRAM, 0, NULL), r);
        assert_int_equal(tier_client_restarts(c), 0);

        /* the next tierd starts with nothing: no index, no target */
        for (int i = 0; i < 2; i++) {
                snprintf(path, sizeof(path), "%s/nvme-index.%d", d.dir, i);
                (void) unlink(path);
        }
        snprintf(path, sizeof(path), "%s/t0.img", d.dir);
        (void) unlink(path);
        spawn();
        assert_int_equal(tier_tensor_stat(a, &st), -ERESTART);
        assert_non_null(strstr(tier_client_last_error(c), "ESTALE"));
        assert_int_equal(tier_tensor_stat(a, &st), -ESTALE);
        assert_int_equal(tier_client_restarts(c), 1);
        assert_int_equal(tier_fence_done(c, f), -ERESTART);     /* now one did */
        assert_non_null(strstr(tier_client_last_error(c), "fence 0x"));        /* as the caller sees it: hex */
        tier_tensor_close(a);
        tier_client_free(c);

        assert_int_equal(tier_client_new(d.socket, NULL, 0, &ctl), 0);
        assert_int_equal(tier_client_set_reconnect(ctl, 1000), -EINVAL);
        assert_int_equal(tier_client_set_reconnect(NULL, 1000), -EINVAL);
        tier_client_free(ctl);
        c = connect_job("late", 0);
        assert_int_equal(tier_client_set_reconnect(c, -1), -EINVAL);
        tier_client_free(c);
}

/*
 * A tensor another connection of the job destroyed and made again, smaller,
 * under the same name: after tierd restarted, the handle of the old one is
 * gone (-ESTALE), not bound to the new one by name (its size, and so its
 * grants, would be the old one's: past the new tensor's bytes).
 */
static void test_stale_by_size(void **state) {
        tier_client *a = connect_job("resized", 30000), *b = connect_job("resized", 0);
        tier_tensor *aw = NULL, *bw = NULL;
        struct tier_stat st;

        assert_int_equal(tier_tensor_create(a, "w", MiB, &aw), 0);
        assert_int_equal(tier_tensor_open(b, "w", &bw), 0);
        assert_int_equal(tier_tensor_destroy(bw), 0);
        assert_int_equal(tier_tensor_create(b, "w", MiB / 2, &bw), 0);
        tier_tensor_close(bw);
        tier_client_free(b);
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 20000), 0);
        spawn();
        assert_int_equal(tier_tensor_stat(aw, &st), -ERESTART);
        assert_int_equal(tier_tensor_stat(aw, &st), -ESTALE);
        assert_int_equal(tier_tensor_size(aw), MiB);
        tier_tensor_close(aw);
        /* the new one, opened by name, is the new one */
        assert_int_equal(tier_tensor_open(a, "w", &aw), 0);
        assert_int_equal(tier_tensor_size(aw), MiB / 2);
        assert_int_equal(tier_tensor_destroy(aw), 0);
        tier_client_free(a);
}

/*
 * With the fd store (memory across a SIGKILL, the restart suite's subject):
 * ranks 0 and 1 both hold s for writing, rank 0 first; rank 1 writes,
 * unpins and leaves (its process is done with s: a write after its unpin is
 * out of bounds, as for any copy nothing holds), rank 0 writes on, and
 * tierd is SIGKILLed.  The copy comes back held for its writers of before
 * (a ghost), which are rank 0's only: rank 0's Hello releases it and the
 * job commits.  It used to wait for rank 1 too (Copy.write_ranks kept every
 * rank since the copy last had no writer): with rank 1 gone for good, s
 * stayed pinned and every commit and rollback was refused while the job
 * lived.
 */
static void test_ghost_not_held_for_a_rank_that_let_go(void **state) {
        tier_client *c0 = NULL, *c1 = NULL, *n0 = NULL;
        tier_tensor *s = NULL, *s1 = NULL;
        struct tier_grant g, g1;
        struct tier_stat st;

        assert_int_equal(test_daemon_kill(&d, SIGTERM, 10000), 0);
        d.fd_store = true;
        spawn();
        assert_int_equal(test_daemon_wait_stored(&d, "tierd-mem-table", 1, 10000), 0);
        assert_int_equal(tier_client_new(d.socket, "wlet", 0, &c0), 0);
        assert_int_equal(tier_client_new(d.socket, "wlet", 1, &c1), 0);
        assert_int_equal(tier_tensor_create(c0, "s", MiB, &s), 0);
        assert_int_equal(tier_tensor_open(c1, "s", &s1), 0);
        assert_int_equal(tier_pin(s, TIER_HOST, TIER_READ_WRITE, &g), 0);
        assert_int_equal(tier_pin(s1, TIER_HOST, TIER_READ_WRITE, &g1), 0);
        memset(g1.ptr, 0x22, g1.length);
        assert_int_equal(tier_unpin(s1, TIER_HOST, 1), 0);
        tier_tensor_close(s1);
        tier_client_free(c1);                   /* rank 1 is done */
        memset(g.ptr, 0x44, g.length);          /* rank 0 writes on, holding s */
        test_daemon_drain(&d);
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        spawn();
        tier_tensor_close(s);
        tier_client_free(c0);

        assert_int_equal(tier_client_new(d.socket, "wlet", 0, &n0), 0);
        assert_int_equal(tier_tensor_open(n0, "s", &s), 0);
        assert_int_equal(tier_tensor_stat(s, &st), 0);
        assert_int_equal(st.pins[TIER_HOST], 0);
        assert_int_equal(tier_job_commit(n0, 1), 0);
        expect_bytes(s, 0x44);
        assert_int_equal(tier_tensor_destroy(s), 0);
        tier_client_free(n0);
        d.fd_store = false;
}

/*
 * Rank 1 holds x for writing in host when tierd is SIGKILLed: x comes back a
 * ghost, pinned for rank 1.  Rank 0 is back first and writes x in VRAM (a
 * write pin, @unpin: let go, else held): the ghost's host copy is no longer
 * the newest, but rank 1's process may still write into its room.  Another
 * SIGKILL: the room must come back reserved for rank 1 all the same, not
 * free for another tensor (it was: only copies as new as the tensor came
 * back, so a new tensor of rank 0 took the room and rank 1's late write
 * landed in it); and x must come back (held for writing in VRAM too, it was
 * lost: "held for writing in host and VRAM at once").  At rank 1's Hello the
 * room goes.
 */
#define N_Y 4

static void stale_ghost(bool unpin) {
        tier_client *c1 = NULL, *n0 = NULL, *n1 = NULL;
        tier_tensor *x1 = NULL, *z1 = NULL, *x = NULL, *z = NULL, *y[N_Y] = {};
        struct tier_grant g1, g;
        struct tier_stat st;

        assert_int_equal(test_daemon_kill(&d, SIGTERM, 10000), 0);
        d.fd_store = true;
        spawn();
        assert_int_equal(test_daemon_wait_stored(&d, "tierd-mem-table", 1, 10000), 0);
        assert_int_equal(tier_client_new(d.socket, "wstale", 1, &c1), 0);
        assert_int_equal(tier_tensor_create(c1, "z", MiB, &z1), 0);        /* (its copy keeps the segment) */
        assert_int_equal(tier_pin(z1, TIER_HOST, TIER_READ_WRITE, &g1), 0);
        memset(g1.ptr, 0x55, g1.length);
        assert_int_equal(tier_unpin(z1, TIER_HOST, 1), 0);
        assert_int_equal(tier_tensor_create(c1, "x", MiB, &x1), 0);
        assert_int_equal(tier_pin(x1, TIER_HOST, TIER_READ_WRITE, &g1), 0);
        memset(g1.ptr, 0x11, g1.length);
        test_daemon_drain(&d);
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        spawn();

        /* rank 0 is back first and writes x in VRAM: the host ghost is stale */
        assert_int_equal(tier_client_new(d.socket, "wstale", 0, &n0), 0);
        assert_int_equal(tier_tensor_open(n0, "x", &x), 0);
        assert_int_equal(tier_pin(x, TIER_VRAM, TIER_READ_WRITE, &g), 0);
        assert_true(all(g.ptr, g.length, 0x11));
        memset(g.ptr, 0x44, g.length);
        if (unpin)
                assert_int_equal(tier_unpin(x, TIER_VRAM, 1), 0);
        assert_int_equal(tier_tensor_stat(x, &st), 0);
        assert_int_equal(st.pins[TIER_HOST], 1);

        /* killed again before rank 1 is back */
        tier_tensor_close(x);
        test_daemon_drain(&d);
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        spawn();
        tier_client_free(n0);
        assert_int_equal(tier_client_new(d.socket, "wstale", 0, &n0), 0);
        assert_int_equal(tier_tensor_open(n0, "x", &x), 0);
        assert_int_equal(tier_tensor_stat(x, &st), 0);
        assert_int_equal(st.pins[TIER_HOST], 1);        /* rank 1's room, still held */
        assert_int_equal(st.pins[TIER_VRAM], 0);        /* (rank 0's write pin: released at its Hello) */
        /* new tensors of rank 0 do not get that room (in z's segment): rank 1's late write is not theirs */
        for (unsigned i = 0; i < N_Y; i++) {
                char name[8];

                snprintf(name, sizeof(name), "y%u", i);
                assert_int_equal(tier_tensor_create(n0, name, MiB, &y[i]), 0);
                assert_int_equal(tier_pin(y[i], TIER_HOST, TIER_READ_WRITE, &g), 0);
                memset(g.ptr, 0xa0 + i, g.length);
                assert_int_equal(tier_unpin(y[i], TIER_HOST, 1), 0);
        }
        memset(g1.ptr, 0x33, g1.length);        /* rank 1's process writes on, through its old grant */
        for (unsigned i = 0; i < N_Y; i++)
                expect_bytes(y[i], 0xa0 + i);
        /* x is rank 0's write; its host room is not refilled while rank 1 may write into it */
        assert_int_equal(tier_pin(x, TIER_HOST, TIER_READ, &g), -EBUSY);
        assert_int_equal(tier_pin(x, TIER_VRAM, TIER_READ, &g), 0);
        assert_true(all(g.ptr, g.length, 0x44));
        assert_int_equal(tier_unpin(x, TIER_VRAM, 0), 0);

        /* rank 1 is back: the room goes; x is rank 0's write */
        assert_int_equal(tier_client_new(d.socket, "wstale", 1, &n1), 0);
        assert_int_equal(tier_tensor_stat(x, &st), 0);
        assert_int_equal(st.pins[TIER_HOST], 0);
        expect_bytes(x, 0x44);
        assert_int_equal(tier_tensor_open(n0, "z", &z), 0);
        expect_bytes(z, 0x55);
        assert_int_equal(tier_tensor_destroy(x), 0);
        assert_int_equal(tier_tensor_destroy(z), 0);
        for (unsigned i = 0; i < N_Y; i++)
                assert_int_equal(tier_tensor_destroy(y[i]), 0);
        tier_tensor_close(x1);
        tier_tensor_close(z1);
        tier_client_free(c1);
        tier_client_free(n1);
        tier_client_free(n0);
        d.fd_store = false;
}

static void test_stale_ghost_keeps_its_room(void **state) {
        stale_ghost(true);
}

static void test_ghost_beside_a_write_pin(void **state) {
        stale_ghost(false);
}

/*
 * Rank 1 holds x for writing in host when tierd is SIGKILLed, beside z and a
 * in the same segment; the next tierd allows the job two tensors
 * ([limits] max_tensors), so x, the third, is not restored.  Its room lies in
 * a segment that z's and a's copies would keep: it was left free there, a
 * new tensor y took it and rank 1's late write landed in y.  A segment with
 * a copy held for writing that no tensor puts back is not used again (its
 * copies are not put back, z is lost): rank 1's write lands in memory nobody
 * has.
 */
static void test_unrestored_writer_keeps_its_segment(void **state) {
        tier_client *c1 = NULL, *n0 = NULL;
        tier_tensor *z1 = NULL, *a1 = NULL, *x1 = NULL, *a = NULL, *y = NULL, *z = NULL;
        struct tier_grant g1, g;

        assert_int_equal(test_daemon_kill(&d, SIGTERM, 10000), 0);
        d.fd_store = true;
        spawn();
        assert_int_equal(test_daemon_wait_stored(&d, "tierd-mem-table", 1, 10000), 0);
        assert_int_equal(tier_client_new(d.socket, "wskip", 1, &c1), 0);
        assert_int_equal(tier_tensor_create(c1, "z", MiB, &z1), 0);
        assert_int_equal(tier_pin(z1, TIER_HOST, TIER_READ_WRITE, &g1), 0);
        memset(g1.ptr, 0x55, g1.length);
        assert_int_equal(tier_unpin(z1, TIER_HOST, 1), 0);
        assert_int_equal(tier_tensor_create(c1, "a", MiB, &a1), 0);
        assert_int_equal(tier_pin(a1, TIER_HOST, TIER_READ_WRITE, &g1), 0);
        memset(g1.ptr, 0x66, g1.length);
        assert_int_equal(tier_unpin(a1, TIER_HOST, 1), 0);
        assert_int_equal(tier_tensor_create(c1, "x", MiB, &x1), 0);
        assert_int_equal(tier_pin(x1, TIER_HOST, TIER_READ_WRITE, &g1), 0);
        memset(g1.ptr, 0x11, g1.length);
        test_daemon_drain(&d);
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        assert_int_equal(test_daemon_write_config(&d, "skip.conf", "[limits]\nmax_tensors = 2\n"), 0);
        spawn();

        /* a new tensor where a was, and further: where x's room was, in the same segment */
        assert_int_equal(tier_client_new(d.socket, "wskip", 0, &n0), 0);
        assert_int_equal(tier_tensor_open(n0, "x", &a), -ENOENT);
        /* the log names the limit that dropped x (it said "Too many open files") */
        assert_true(test_daemon_log_contains(&d, "Cannot restore tensor 'x' of job 'wskip': the job has [limits] "
                                                 "max_tensors (2) tensors already"));
        assert_int_equal(tier_tensor_open(n0, "a", &a), 0);
        assert_int_equal(tier_tensor_destroy(a), 0);
        assert_int_equal(tier_tensor_create(n0, "y", 2 * MiB, &y), 0);
        assert_int_equal(tier_pin(y, TIER_HOST, TIER_READ_WRITE, &g), 0);
        memset(g.ptr, 0xa0, g.length);
        assert_int_equal(tier_unpin(y, TIER_HOST, 1), 0);
        memset(g1.ptr, 0x33, g1.length);        /* rank 1's process writes on, through its old grant */
        expect_bytes(y, 0xa0);
        /* what lay in that segment is lost, not read from memory a process of before may write */
        assert_int_equal(tier_tensor_open(n0, "z", &z), 0);
        assert_int_equal(tier_pin(z, TIER_HOST, TIER_READ, &g), -ENODATA);

        assert_int_equal(test_daemon_write_config(&d, "skip.conf", NULL), 0);
        assert_int_equal(tier_tensor_destroy(y), 0);
        assert_int_equal(tier_tensor_destroy(z), 0);
        tier_tensor_close(x1);
        tier_tensor_close(a1);
        tier_tensor_close(z1);
        tier_client_free(c1);
        tier_client_free(n0);
        d.fd_store = false;
}

static int setup(void **state) {
        if (!test_can_lock_memory(16 * MiB))
                return -1;
        return test_daemon_start(&d, config_body) < 0 ? -1 : 0;
}

static int teardown(void **state) {
        return test_daemon_stop(&d) == 0 ? 0 : -1;
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_stop_in_a_phase),
                cmocka_unit_test(test_stop_with_a_pin),
                cmocka_unit_test(test_stop_without_reconnecting),
                cmocka_unit_test(test_timeout_and_stale),
                cmocka_unit_test(test_stale_by_size),
                cmocka_unit_test(test_ghost_not_held_for_a_rank_that_let_go),
                cmocka_unit_test(test_stale_ghost_keeps_its_room),
                cmocka_unit_test(test_ghost_beside_a_write_pin),
                cmocka_unit_test(test_unrestored_writer_keeps_its_segment),
        };

        if (!test_can_lock_memory(16 * MiB))
                return TEST_SKIP;
        if (getenv("TIER_TEST_FILTER"))                 /* one test, by name (a glob) */
                cmocka_set_test_filter(getenv("TIER_TEST_FILTER"));
        return cmocka_run_group_tests_name("reconnect", tests, setup, teardown);
}
