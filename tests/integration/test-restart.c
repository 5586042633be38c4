/* SPDX-License-Identifier: MIT */
/* test-restart.c: what tierd wrote to NVMe survives its stop, its SIGKILL, and a SIGKILL at every step of an index update. */

/*
 * A client writes tensors, some of them down to NVMe (tier_evict(): its
 * return is the fence), some only in host, and writes some again.  tierd
 * is then stopped cleanly, SIGKILLed, or killed by itself at the N-th step
 * of an NVMe index update (TIERD_TEST_FAULTS=index-kill / index-torn,
 * daemon/state/book.c) for every N until the workload runs through.  After
 * each, a tierd without faults starts on the same directory and a client
 * re-attaches the job: every tensor must hold exactly what its client was
 * last told is on NVMe, or be reported lost (ENODATA) where its newest data
 * was in memory only; a call that tierd's death cut off (no answer) may have
 * happened or not, and either outcome is allowed.  Never other bytes.
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
#include <unistd.h>
#include <cmocka.h>
#include <tier.h>

#include "tests/helpers/harness.h"

#define MiB (1024ull * 1024ull)
#define N_TENSORS 3
#define ROUNDS 2

static const char config_body[] =
        "[daemon]\nlinger_sec = 600\n"
        "[host]\ncapacity = 32M\nsegment_size = 4M\njob_limit = 32M\nuid_share = 0\n"
        "[vram]\nbackend = emulated\ncapacity = 8M\nchunk_size = 2M\njob_limit = 8M\n"
        "[nvme]\ntarget = @DIR@/t0.img:64M\ntarget = @DIR@/t1.img:64M\nuid_share = 0\n";

static TestDaemon d;

/* What the client knows of one tensor. */
typedef struct Known {
        uint8_t durable;        /* the pattern a finished tier_evict() put on NVMe (0: none) */
        uint8_t newest;         /* the pattern of its last acknowledged dirty unpin (0: never written) */
        uint8_t maybe_newer;    /* a dirty unpin that got no answer: this pattern may be the newest (0: none) */
        bool maybe_durable;     /* a tier_evict() of newest that got no answer: it may have reached NVMe */
        /*
         * A write-only pin that got no answer.  Where the memory store kept tierd's
         * memory, the copy tierd reserved for it comes back held for writing; the
         * next client of the job says it holds no write (check() is a new client),
         * so tierd puts the tensor back as it was before the pin: nothing changes
         * what check() accepts (it used to accept any bytes here).
         */
        bool pin_cut;
} Known;

static void spawn(void) {
        TestDaemonOptions o = { .log_level = "debug", .wait_ready = true };

        assert_int_equal(test_daemon_spawn(&d, &o), 0);
}

/* A fresh tierd with the fd store, its table stored. */
static void spawn_with_store(void) {
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 10000), 0);
        d.fd_store = true;
        spawn();
        assert_int_equal(test_daemon_wait_stored(&d, "tierd-mem-table", 1, 10000), 0);
}

static void name_of(unsigned i, char *buf, size_t size) {
        snprintf(buf, size, "t%u", i);
}

/* Pin @t in host for a whole write, fill it with @v, unpin it dirty.  0, or the call that failed's status. */
static int write_host(tier_tensor *t, uint8_t v, bool *ret_unpin_sent) {
        struct tier_grant g;
        int r;

        *ret_unpin_sent = false;
        r = tier_pin(t, TIER_HOST, TIER_WRITE, &g);
        if (r < 0)
                return r;
        memset(g.ptr, v, tier_tensor_size(t));
        *ret_unpin_sent = true;
        return tier_unpin(t, TIER_HOST, 1);
}

/* A call of the workload failed: say which and why (tierd's death, expected, or a bug). */
static bool failed(tier_client *c, const char *call, int r) {
        fprintf(stderr, "workload: %s: %s (%s)\n", call, strerror(-r), c ? tier_client_last_error(c) : "");
        return false;
}

/*
 * The workload: for each round and tensor, write it in host with a new
 * pattern; every other one goes down to NVMe.  Stops at the first call
 * tierd's death cuts off.  Returns true when it ran through.
 */
static bool workload(Known k[N_TENSORS]) {
        tier_client *c = NULL;
        tier_tensor *t[N_TENSORS] = {};
        bool done = false;

        int r;

        r = tier_client_new(d.socket, "r", 0, &c);
        if (r < 0)
                return failed(NULL, "tier_client_new", r);
        for (unsigned i = 0; i < N_TENSORS; i++) {
                char name[16];

                name_of(i, name, sizeof(name));
                r = tier_tensor_create(c, name, MiB + 4096 * i, &t[i]);
                if (r < 0) {
                        failed(c, "tier_tensor_create", r);
                        goto out;
                }
        }
        for (unsigned round = 0; round < ROUNDS; round++)
                for (unsigned i = 0; i < N_TENSORS; i++) {
                        uint8_t v = (uint8_t) (0x10 * (round + 1) + i + 1);
                        bool sent;

                        r = write_host(t[i], v, &sent);
                        if (r < 0) {
                                failed(c, sent ? "tier_unpin" : "tier_pin", r);
                                if (sent)
                                        k[i].maybe_newer = v;
                                else
                                        k[i].pin_cut = true;
                                goto out;
                        }
                        k[i].newest = v;
                        if ((round + i) % 2 == 0) {
                                r = tier_evict(t[i], TIER_NVME);
                                if (r < 0) {
                                        failed(c, "tier_evict", r);
                                        k[i].maybe_durable = true;
                                        goto out;
                                }
                                k[i].durable = v;
                        }
                }
        done = true;
out:
        for (unsigned i = 0; i < N_TENSORS; i++)
                if (t[i])
                        tier_tensor_close(t[i]);
        tier_client_free(c);
        return done;
}

/* Every byte of @t in host is @v (its size's worth). */
static bool all(tier_tensor *t, const uint8_t *p, uint8_t v) {
        uint64_t n = tier_tensor_size(t);

        for (uint64_t off = 0; off < n; off++)
                if (p[off] != v)
                        return false;
        return true;
}

/*
 * Re-attach and check each tensor against what its client knew (see the
 * file's comment).  @kept: the fd store kept tierd's memory, so nothing may
 * be lost: each holds its newest pattern (or a cut-off dirty unpin's).
 */
static void check(const Known k[N_TENSORS], bool kept, const char *what) {
        tier_client *c = NULL;

        assert_int_equal(tier_client_new(d.socket, "r", 0, &c), 0);
        for (unsigned i = 0; i < N_TENSORS; i++) {
                const Known *x = &k[i];
                char name[16];
                tier_tensor *t = NULL;
                struct tier_grant g;
                int r;
                /*
                 * What may be there: what a finished evict put on NVMe, unless a dirty unpin made something
                 * newer (in memory only: then lost); a cut-off evict of the newest may have put it there; a
                 * cut-off dirty unpin may have made it lost; never written: zeros.  With the memory kept: the
                 * newest, or what a cut-off dirty unpin wrote.
                 */
                bool newer_in_memory = x->newest && x->newest != x->durable;
                bool may_lost = !kept && (newer_in_memory || x->maybe_newer);
                bool may_durable = x->durable && !newer_in_memory;
                bool may_newest = (x->maybe_durable || kept) && x->newest;
                bool may_newer = kept && x->maybe_newer;
                bool may_blank = !x->newest && !x->durable;
                bool ok;

                name_of(i, name, sizeof(name));
                r = tier_tensor_open(c, name, &t);
                if (r == -ENOENT) {
                        /* never created, or its creation was cut off */
                        assert_true(!x->newest && !x->durable);
                        continue;
                }
                assert_int_equal(r, 0);
                r = tier_pin(t, TIER_HOST, TIER_READ, &g);
                if (r == -ENODATA) {
                        if (!may_lost)
                                fail_msg("%s: %s reported lost, but its newest (0x%02x) was %s", what, name,
                                         x->newest, kept ? "kept in memory" : "on NVMe");
                } else {
                        assert_int_equal(r, 0);
                        ok = (may_durable && all(t, g.ptr, x->durable)) || (may_newest && all(t, g.ptr, x->newest)) ||
                             (may_newer && all(t, g.ptr, x->maybe_newer)) || (may_blank && all(t, g.ptr, 0));
                        if (!ok)
                                fail_msg("%s: %s holds 0x%02x..., the client knew durable 0x%02x newest 0x%02x "
                                         "(maybe newer 0x%02x, maybe durable %d)", what, name,
                                         ((const uint8_t *) g.ptr)[0], x->durable, x->newest, x->maybe_newer,
                                         x->maybe_durable);
                        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
                }
                tier_tensor_close(t);
        }
        tier_client_free(c);
}

/* The job goes, so that the next run starts from nothing (its tensors are destroyed one by one). */
static void forget_job(void) {
        tier_client *c = NULL;

        assert_int_equal(tier_client_new(d.socket, "r", 0, &c), 0);
        for (unsigned i = 0; i < N_TENSORS; i++) {
                char name[16];
                tier_tensor *t = NULL;

                name_of(i, name, sizeof(name));
                if (tier_tensor_open(c, name, &t) == 0)
                        assert_int_equal(tier_tensor_destroy(t), 0);
        }
        tier_client_free(c);
}

/*
 * A clean stop writes what is only in memory down first: everything comes
 * back.  After a SIGKILL what was on NVMe comes back, the rest is lost.
 */
static void test_stop_and_kill(void **state) {
        for (int sig = SIGTERM; ; sig = SIGKILL) {
                Known k[N_TENSORS] = {};
                int st;

                assert_true(workload(k));
                st = test_daemon_kill(&d, sig, 10000);
                assert_int_equal(st, sig == SIGTERM ? 0 : 128 + SIGKILL);
                if (sig == SIGTERM) {
                        assert_true(test_daemon_log_contains(&d, "held only in memory down to NVMe"));
                        for (unsigned i = 0; i < N_TENSORS; i++)
                                k[i].durable = k[i].newest;
                }
                spawn();
                assert_true(test_daemon_log_contains(&d, "restored from the NVMe index"));
                check(k, false, sig == SIGTERM ? "after a clean stop" : "after SIGKILL");
                forget_job();
                if (sig == SIGKILL)
                        break;
        }
}

static bool under_valgrind(void) {
        const char *p = getenv("LD_PRELOAD");

        return p && strstr(p, "vgpreload");
}

/*
 * tierd kills itself at the N-th step of an index update (@kind index-kill),
 * tears the N-th record it writes (index-torn), or kills itself at the N-th
 * point of a memory-store record write (store-kill, with the fd store: @kept),
 * for every N until the workload runs through; after each, the check.
 */
static void kill_at_every_step(const char *kind, bool kept) {
        unsigned stride = under_valgrind() ? 7 : 1;     /* valgrind: every 7th step (each takes seconds) */
        unsigned n;

        d.fd_store = kept;
        for (n = 0;; n += stride) {
                Known k[N_TENSORS] = {};
                char spec[64], what[96];
                bool through;
                int st;

                if (d.pid > 0)
                        assert_int_equal(test_daemon_kill(&d, SIGTERM, 10000), 0);
                snprintf(spec, sizeof(spec), "%s:after=%u,count=1", kind, n);
                assert_int_equal(setenv("TIERD_TEST_FAULTS", spec, 1), 0);
                {
                        TestDaemonOptions o = { .log_level = "debug", .wait_ready = false };

                        assert_int_equal(test_daemon_spawn(&d, &o), 0);
                }
                unsetenv("TIERD_TEST_FAULTS");
                /* it may die before it is ready (a step of its start-up snapshot): then the socket never answers */
                st = test_daemon_wait_notify(&d, "READY=1", 30000);
                through = st >= 0 && workload(k);
                st = d.pid > 0 ? test_daemon_kill(&d, through ? SIGTERM : 0, 10000) : d.exited;
                snprintf(what, sizeof(what), "%s at point %u", kind, n);
                if (through && st == 0)
                        break;
                assert_int_equal(st, 128 + SIGKILL);
                /* killed in the clean stop, after the workload: its write-downs may have put the newest on NVMe */
                for (unsigned i = 0; through && i < N_TENSORS; i++)
                        k[i].maybe_durable = true;
                spawn();
                check(k, kept, what);
                forget_job();
        }
        print_message("%s: tierd killed at each of the first %u points (every %u) of %s, then the workload ran "
                      "through\n", kind, n, stride, kept ? "memory-store record writes" : "NVMe index updates");
        /* (index-kill counts about three steps per record, index-torn one, store-kill two per record write) */
        assert_true(n >= 10);
        spawn();
        forget_job();           /* the workload's tensors, for the next test */
        d.fd_store = false;
}

static void test_kill_at_every_step(void **state) {
        kill_at_every_step("index-kill", false);
}

static void test_torn_record_at_every_write(void **state) {
        kill_at_every_step("index-torn", false);
}

/*
 * With the fd store, tierd killed halfway through a record of its memory
 * store, or after a record and before the one it replaces is freed: the
 * tensor's last sound record stands, so nothing only in memory is lost.
 */
static void test_store_kill_at_every_point(void **state) {
        kill_at_every_step("store-kill", true);
}

/*
 * With the service manager's fd store (the harness plays it): tierd SIGKILLed
 * after the workload brings every tensor back with its newest data, those
 * held only in memory included; and a client that was writing a tensor when
 * tierd died, and went on writing, finds every byte it wrote once it has
 * reconnected (the copy held for writing is the newest, and nothing moves it
 * until the job's next Hello): through a pin that reads and writes, and
 * through a write-only pin, whose copy tierd keeps only because the
 * reconnecting Hello names it (else it would be the zeros of before).
 */
static void test_kill_with_fd_store(void **state) {
        /* the pools of config_body: 32M of host in 4M segments, 8M of VRAM in 2M chunks */
        const size_t host_segs = 8, vram_segs = 4;
        Known k[N_TENSORS] = {};
        tier_client *w = NULL;
        tier_tensor *wt = NULL, *wo = NULL;
        struct tier_grant g, go;
        struct tier_stat st;

        spawn_with_store();
        assert_int_equal(test_daemon_wait_stored(&d, "tierd-mem-host-", host_segs, 10000), 0);
        assert_int_equal(test_daemon_wait_stored(&d, "tierd-mem-vram-", vram_segs, 10000), 0);

        assert_true(workload(k));
        assert_int_equal(tier_client_new(d.socket, "w", 0, &w), 0);
        assert_int_equal(tier_client_set_reconnect(w, 30000), 0);
        assert_int_equal(tier_tensor_create(w, "w", MiB, &wt), 0);
        assert_int_equal(tier_pin(wt, TIER_HOST, TIER_READ_WRITE, &g), 0);
        memset(g.ptr, 0x77, g.length / 2);
        assert_int_equal(tier_tensor_create(w, "wo", MiB, &wo), 0);
        assert_int_equal(tier_pin(wo, TIER_HOST, TIER_WRITE, &go), 0);
        memset(go.ptr, 0x55, go.length / 2);

        /* whatever the store was sent is in (a segment renewed meanwhile is sent again) */
        test_daemon_drain(&d);
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        memset((uint8_t *) g.ptr + g.length / 2, 0x77, g.length - g.length / 2);     /* after tierd died */
        memset((uint8_t *) go.ptr + go.length / 2, 0x55, go.length - go.length / 2);
        print_message("the fd store holds %zu fd(s) for the next start\n", d.n_stored);
        spawn();
        assert_true(test_daemon_log_contains(&d, "with newer data kept in memory"));
        check(k, true, "after SIGKILL, with the fd store");     /* nothing lost: what was only in memory is back too */

        assert_int_equal(tier_tensor_stat(wt, &st), -ERESTART);
        assert_int_equal(tier_pin(wt, TIER_HOST, TIER_READ, &g), 0);
        assert_true(all(wt, g.ptr, 0x77));
        assert_int_equal(tier_unpin(wt, TIER_HOST, 0), 0);
        assert_int_equal(tier_pin(wo, TIER_HOST, TIER_READ, &go), 0);
        assert_true(all(wo, go.ptr, 0x55));
        assert_int_equal(tier_unpin(wo, TIER_HOST, 0), 0);
        assert_int_equal(tier_tensor_destroy(wo), 0);
        assert_int_equal(tier_tensor_destroy(wt), 0);
        tier_client_free(w);
        forget_job();
        d.fd_store = false;
}

/*
 * A write-only pin's copy, put back held for writing after a SIGKILL, and
 * tierd killed again before any client of the job attached: the second
 * start finds it held for writing still, with the copy of the version
 * before beside it (it used to find it written, with the room's bytes); a
 * new client, which names no write, then finds the tensor as it was before
 * the pin.
 */
static void test_write_only_ghost_twice(void **state) {
        tier_client *c = NULL, *c2 = NULL;
        tier_tensor *x = NULL;
        struct tier_grant g;
        bool sent;

        spawn_with_store();
        assert_int_equal(tier_client_new(d.socket, "twice", 0, &c), 0);
        assert_int_equal(tier_tensor_create(c, "x", MiB, &x), 0);
        assert_int_equal(write_host(x, 0x33, &sent), 0);
        assert_int_equal(tier_pin(x, TIER_HOST, TIER_READ, &g), 0);       /* a copy of version 1 stays in host */
        assert_int_equal(tier_unpin(x, TIER_HOST, 0), 0);
        assert_int_equal(tier_pin(x, TIER_VRAM, TIER_WRITE, &g), 0);      /* reserved: its room holds no bytes */
        memset(g.ptr, 0x99, g.length / 2);

        for (int i = 0; i < 2; i++) {
                test_daemon_drain(&d);
                assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
                spawn();
                assert_true(test_daemon_log_contains(&d, "with newer data kept in memory"));
        }
        tier_tensor_close(x);
        tier_client_free(c);

        assert_int_equal(tier_client_new(d.socket, "twice", 0, &c2), 0);
        assert_int_equal(tier_tensor_open(c2, "x", &x), 0);
        assert_int_equal(tier_pin(x, TIER_HOST, TIER_READ, &g), 0);
        assert_true(all(x, g.ptr, 0x33));
        assert_int_equal(tier_unpin(x, TIER_HOST, 0), 0);
        assert_true(test_daemon_log_contains(&d, "back at the version before (its copy in host)"));
        assert_int_equal(tier_tensor_destroy(x), 0);
        tier_client_free(c2);
        d.fd_store = false;
}

/*
 * A write-only pin's copy put back after a SIGKILL, then reverted when its
 * job's client attaches (it names no write): the tensor is at the version
 * before again, whose copy lies in host.  tierd killed once more, the next
 * start finds that copy: the index said the pin's version was the newest,
 * so the copy of the version before was refused and the tensor called lost.
 */
static void test_write_only_ghost_reverted_then_killed(void **state) {
        tier_client *c = NULL, *c2 = NULL, *c3 = NULL;
        tier_tensor *x = NULL;
        struct tier_grant g;
        bool sent;

        spawn_with_store();
        assert_int_equal(tier_client_new(d.socket, "reverted", 0, &c), 0);
        assert_int_equal(tier_tensor_create(c, "x", MiB, &x), 0);
        assert_int_equal(write_host(x, 0x44, &sent), 0);         /* version 1, in host only */
        assert_int_equal(tier_pin(x, TIER_VRAM, TIER_WRITE, &g), 0);      /* reserved: its room holds no bytes */
        memset(g.ptr, 0x99, g.length / 2);
        test_daemon_drain(&d);
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        spawn();
        tier_tensor_close(x);
        tier_client_free(c);

        /* a new client, which names no write: back at version 1, its copy in host */
        assert_int_equal(tier_client_new(d.socket, "reverted", 0, &c2), 0);
        assert_int_equal(tier_tensor_open(c2, "x", &x), 0);
        assert_true(test_daemon_log_contains(&d, "back at the version before (its copy in host)"));
        tier_tensor_close(x);
        test_daemon_drain(&d);
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        tier_client_free(c2);
        spawn();

        assert_int_equal(tier_client_new(d.socket, "reverted", 0, &c3), 0);
        assert_int_equal(tier_tensor_open(c3, "x", &x), 0);
        assert_int_equal(tier_pin(x, TIER_HOST, TIER_READ, &g), 0);
        assert_true(all(x, g.ptr, 0x44));
        assert_int_equal(tier_unpin(x, TIER_HOST, 0), 0);
        assert_int_equal(tier_tensor_destroy(x), 0);
        tier_client_free(c3);
        d.fd_store = false;
}

/*
 * A commit while a write-only pin of another rank, of before a SIGKILL, is held for it (a ghost):
 * refused until that rank attaches.  It used to be taken: the commit recorded the pin's version,
 * rank 3's Hello (naming no write) set the tensor back to the version before, and rank 3's next
 * write made it the committed version again: a rollback then kept bytes written after the commit.
 */
static void test_commit_waits_for_ghost(void **state) {
        tier_client *c = NULL, *c0 = NULL, *c3 = NULL;
        tier_tensor *x = NULL;
        struct tier_grant g;
        bool sent;

        spawn_with_store();
        assert_int_equal(tier_client_new(d.socket, "cghost", 3, &c), 0);
        assert_int_equal(tier_tensor_create(c, "x", MiB, &x), 0);
        assert_int_equal(write_host(x, 0x55, &sent), 0);         /* version 1, in host */
        assert_int_equal(tier_pin(x, TIER_VRAM, TIER_WRITE, &g), 0);      /* reserved: its room holds no bytes */
        memset(g.ptr, 0x99, g.length / 2);
        test_daemon_drain(&d);
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        spawn();
        tier_tensor_close(x);
        tier_client_free(c);

        assert_int_equal(tier_client_new(d.socket, "cghost", 0, &c0), 0);
        assert_int_equal(tier_job_commit(c0, 1), -EBUSY);
        assert_non_null(strstr(tier_client_last_error(c0), "tensor 'x' is held in vram for the client of rank 3 of "
                                                           "before tierd restarted"));
        /* rank 3 attaches, naming no write: x is back at version 1, and the commit goes */
        assert_int_equal(tier_client_new(d.socket, "cghost", 3, &c3), 0);
        assert_int_equal(tier_job_commit(c0, 1), 0);
        assert_int_equal(tier_tensor_open(c3, "x", &x), 0);
        assert_int_equal(tier_pin(x, TIER_HOST, TIER_READ, &g), 0);
        assert_true(all(x, g.ptr, 0x55));
        assert_int_equal(tier_unpin(x, TIER_HOST, 0), 0);
        assert_int_equal(tier_tensor_destroy(x), 0);
        tier_client_free(c3);
        tier_client_free(c0);
        d.fd_store = false;
}

/*
 * A write-only pin of rank 3 (its copy reserved, half written) cut off by a
 * SIGKILL: with the fd store its copy comes back held for rank 3 until a
 * client of that rank attaches and says whether the pin reached it.  Till
 * then a read of the tensor by another rank, in that tier or another, is
 * refused (EBUSY naming rank 3) and changes nothing: it was served the
 * copy's room as the tensor's data (the half written and garbage, in host
 * too, refilled from it), and rank 3's Hello then found the copy of the
 * version before overwritten: lost.  @take_over: rank 0 writes it whole
 * meanwhile, which takes the copy over and stands.
 */
static void ghost_read_refused(bool take_over) {
        tier_client *c = NULL, *c0 = NULL, *c3 = NULL;
        tier_tensor *x = NULL;
        struct tier_grant g;
        bool sent;

        spawn_with_store();
        assert_int_equal(tier_client_new(d.socket, "gread", 3, &c), 0);
        assert_int_equal(tier_tensor_create(c, "x", MiB, &x), 0);
        assert_int_equal(write_host(x, 0x55, &sent), 0);         /* version 1, in host */
        assert_int_equal(tier_pin(x, TIER_VRAM, TIER_WRITE, &g), 0);      /* reserved: its room holds no bytes */
        memset(g.ptr, 0x99, g.length / 2);
        test_daemon_drain(&d);
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        spawn();
        tier_tensor_close(x);
        tier_client_free(c);

        assert_int_equal(tier_client_new(d.socket, "gread", 0, &c0), 0);
        assert_int_equal(tier_tensor_open(c0, "x", &x), 0);
        assert_int_equal(tier_pin(x, TIER_VRAM, TIER_READ, &g), -EBUSY);
        assert_non_null(strstr(tier_client_last_error(c0), "write-only pin (TIER_WRITE) of rank 3 when tierd "
                                                           "stopped"));
        assert_int_equal(tier_pin(x, TIER_HOST, TIER_READ, &g), -EBUSY);
        assert_int_equal(tier_pin(x, TIER_VRAM, TIER_READ | TIER_WRITE, &g), -EBUSY);
        if (take_over) {
                assert_int_equal(tier_pin(x, TIER_VRAM, TIER_WRITE, &g), 0);
                memset(g.ptr, 0x66, g.length);
                assert_int_equal(tier_unpin(x, TIER_VRAM, 1), 0);
        }
        /* rank 3 attaches, naming no write: x is back at version 1 (or, taken over, what rank 0 wrote) */
        assert_int_equal(tier_client_new(d.socket, "gread", 3, &c3), 0);
        assert_int_equal(tier_pin(x, TIER_HOST, TIER_READ, &g), 0);
        assert_true(all(x, g.ptr, take_over ? 0x66 : 0x55));
        assert_int_equal(tier_unpin(x, TIER_HOST, 0), 0);
        assert_int_equal(tier_pin(x, TIER_VRAM, TIER_READ, &g), 0);
        assert_int_equal(tier_unpin(x, TIER_VRAM, 0), 0);
        assert_int_equal(tier_tensor_destroy(x), 0);
        tier_client_free(c3);
        tier_client_free(c0);
        d.fd_store = false;
}

static void test_write_only_ghost_not_read(void **state) {
        ghost_read_refused(false);
        ghost_read_refused(true);
}

/*
 * Rank 1 holds x1 for writing (read-write, in host) and ranks 1 and 0 both
 * hold s (rank 0 last) when tierd is SIGKILLed; with the fd store both come
 * back held for their writers (ghosts).  Rank 0 attaches first: rank 1's
 * process may still be writing through its mapping of the same memory (it
 * keeps writing until its next call finds tierd gone), so x1 and s stay
 * pinned and their rooms cannot move (an evict is refused), and what rank 1
 * writes meanwhile is x1's; so after another SIGKILL too.  Both used to be
 * released at rank 0's Hello, whatever its rank: x1's room could then go to
 * another tensor, which rank 1's writes overwrote.  They go at rank 1's Hello.
 */
static void test_written_ghost_waits_for_its_rank(void **state) {
        tier_client *c0 = NULL, *c1 = NULL, *n0 = NULL, *n1 = NULL;
        tier_tensor *x1 = NULL, *s = NULL, *s1 = NULL;
        struct tier_grant g1, gs, g;
        struct tier_stat st;

        spawn_with_store();
        assert_int_equal(tier_client_new(d.socket, "wrank", 0, &c0), 0);
        assert_int_equal(tier_client_new(d.socket, "wrank", 1, &c1), 0);
        assert_int_equal(tier_tensor_create(c1, "x1", MiB, &x1), 0);
        assert_int_equal(tier_pin(x1, TIER_HOST, TIER_READ_WRITE, &g1), 0);
        memset(g1.ptr, 0x11, g1.length);
        assert_int_equal(tier_tensor_create(c0, "s", MiB, &s), 0);
        assert_int_equal(tier_tensor_open(c1, "s", &s1), 0);
        assert_int_equal(tier_pin(s1, TIER_HOST, TIER_READ_WRITE, &gs), 0);
        assert_int_equal(tier_pin(s, TIER_HOST, TIER_READ_WRITE, &g), 0);  /* (the last writer: rank 0) */
        memset(gs.ptr, 0x22, gs.length);
        test_daemon_drain(&d);
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        spawn();
        tier_tensor_close(s);
        tier_client_free(c0);

        /* rank 0 is back; rank 1's process is not, and may still write */
        assert_int_equal(tier_client_new(d.socket, "wrank", 0, &n0), 0);
        tier_tensor_close(x1);
        assert_int_equal(tier_tensor_open(n0, "x1", &x1), 0);
        assert_int_equal(tier_tensor_open(n0, "s", &s), 0);
        assert_int_equal(tier_tensor_stat(x1, &st), 0);
        assert_int_equal(st.pins[TIER_HOST], 1);
        assert_int_equal(tier_tensor_stat(s, &st), 0);
        assert_int_equal(st.pins[TIER_HOST], 1);
        assert_int_equal(tier_evict(x1, TIER_NVME), -EBUSY);
        assert_int_equal(tier_evict(s, TIER_NVME), -EBUSY);
        memset(g1.ptr, 0x33, g1.length);        /* rank 1's process writes on, through its old grant */

        /* killed again before rank 1 is back: recorded so, held for rank 1 still */
        tier_tensor_close(x1);
        tier_tensor_close(s);
        test_daemon_drain(&d);
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        spawn();
        tier_client_free(n0);
        assert_int_equal(tier_client_new(d.socket, "wrank", 0, &n0), 0);
        assert_int_equal(tier_tensor_open(n0, "x1", &x1), 0);
        assert_int_equal(tier_tensor_open(n0, "s", &s), 0);
        assert_int_equal(tier_evict(x1, TIER_NVME), -EBUSY);
        assert_int_equal(tier_evict(s, TIER_NVME), -EBUSY);

        /* rank 1 is back: its ghosts go; x1 holds what it wrote */
        assert_int_equal(tier_client_new(d.socket, "wrank", 1, &n1), 0);
        assert_int_equal(tier_tensor_stat(x1, &st), 0);
        assert_int_equal(st.pins[TIER_HOST], 0);
        assert_int_equal(tier_tensor_stat(s, &st), 0);
        assert_int_equal(st.pins[TIER_HOST], 0);
        assert_int_equal(tier_pin(x1, TIER_HOST, TIER_READ, &g), 0);
        assert_true(all(x1, g.ptr, 0x33));
        assert_int_equal(tier_unpin(x1, TIER_HOST, 0), 0);
        assert_int_equal(tier_pin(s, TIER_HOST, TIER_READ, &g), 0);
        assert_true(all(s, g.ptr, 0x22));
        assert_int_equal(tier_unpin(s, TIER_HOST, 0), 0);
        assert_int_equal(tier_tensor_destroy(x1), 0);
        assert_int_equal(tier_tensor_destroy(s), 0);
        tier_tensor_close(s1);
        tier_client_free(c1);
        tier_client_free(n1);
        tier_client_free(n0);
        d.fd_store = false;
}

/* The generation of the memory-store table behind @fd (memstore.c's header: magic, then at 48); 0: not sound. */
static uint64_t table_generation(int fd) {
        char magic[8];
        uint64_t gen = 0;

        if (pread(fd, magic, sizeof(magic), 0) != (ssize_t) sizeof(magic) || memcmp(magic, "TIERMST1", 8) != 0)
                return 0;
        assert_int_equal(pread(fd, &gen, sizeof(gen), 48), (ssize_t) sizeof(gen));
        return gen;
}

/* The sound tables the store holds: how many, and (@ret_fd, @ret_gen) the newest. */
static unsigned stored_tables(int *ret_fd, uint64_t *ret_gen) {
        unsigned n = 0;

        *ret_fd = -1;
        *ret_gen = 0;
        for (size_t i = 0; i < d.n_stored; i++) {
                uint64_t gen;

                if (strncmp(d.stored[i].name, "tierd-mem-table-", 16) != 0)
                        continue;
                gen = table_generation(d.stored[i].fd);
                if (gen == 0)
                        continue;
                n++;
                if (gen > *ret_gen) {
                        *ret_gen = gen;
                        *ret_fd = d.stored[i].fd;
                }
        }
        return n;
}

/*
 * A run with the fd store does the workload, then is SIGKILLed: the one sound
 * table the store holds then (a dup of its fd returned; its generation in
 * *@ret_gen) is the one the next start reads.
 */
static int workload_then_kill(Known k[N_TENSORS], uint64_t *ret_gen) {
        int fd, last;

        assert_int_equal(test_daemon_kill(&d, SIGTERM, 10000), 0);
        d.fd_store = true;
        spawn();
        assert_true(workload(k));
        test_daemon_drain(&d);
        assert_int_equal(stored_tables(&fd, ret_gen), 1);
        last = dup(fd);
        assert_true(last >= 0);
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        return last;
}

/*
 * When tierd says READY=1 the store holds its new table (what it sent the
 * store at start went out before), and the last run's table is void in place,
 * whatever the store made of its removal: a kill from then on never puts
 * memory back by a table that no longer describes it.
 */
static void test_store_table_at_ready(void **state) {
        Known k[N_TENSORS] = {};
        uint64_t gen, last_gen;
        int fd, last = workload_then_kill(k, &last_gen);

        spawn();
        assert_int_equal(table_generation(last), 0);
        assert_int_equal(stored_tables(&fd, &gen), 1);
        assert_int_equal(gen, last_gen + 1);
        close(last);
        check(k, true, "after SIGKILL, with the fd store, tables checked at READY=1");
        forget_job();
        d.fd_store = false;
}

/*
 * The memory store cannot make its table at a start (store-table): that run
 * keeps no memory, and the last run's table, which describes memory the run
 * changes, is made void all the same.  It used to stay sound in the store:
 * a tensor put back from it, then written down and its room taken by
 * another tensor, came back at the next start with the other one's bytes.
 */
static void test_store_table_fails(void **state) {
        Known k[N_TENSORS] = {};
        uint64_t gen;
        int fd, last = workload_then_kill(k, &gen);

        assert_int_equal(setenv("TIERD_TEST_FAULTS", "store-table", 1), 0);
        spawn();
        unsetenv("TIERD_TEST_FAULTS");
        if (!test_daemon_log_contains(&d, "Memory store: cannot make its table, memory is not kept")) {
                test_daemon_dump_log(&d);
                fail_msg("no word of the table that could not be made");
        }
        assert_int_equal(table_generation(last), 0);   /* void in place */
        close(last);
        test_daemon_drain(&d);
        assert_int_equal(stored_tables(&fd, &gen), 0);
        check(k, true, "after SIGKILL, the next start's table not made");      /* put back before it */
        forget_job();
        d.fd_store = false;
}

/* Records in use (a seq set) in the newest sound table the store holds. */
static unsigned records_in_use(void) {
        const size_t records_at = 8192, rec_size = 512;        /* as in tear_stored_tables() */
        uint32_t n_records = 0;
        unsigned used = 0;
        uint64_t gen;
        int fd;

        assert_true(stored_tables(&fd, &gen) >= 1);
        assert_int_equal(pread(fd, &n_records, sizeof(n_records), 16), (ssize_t) sizeof(n_records));
        for (uint32_t r = 0; r < n_records; r++) {
                uint64_t seq = 0;

                assert_int_equal(pread(fd, &seq, sizeof(seq), (off_t) (records_at + r * rec_size)),
                                 (ssize_t) sizeof(seq));
                used += seq != 0;
        }
        return used;
}

/*
 * A tensor that its plan made dead (its next access writes it whole: its
 * copies went) keeps a record in the memory store's table, which says so.
 * Destroyed, it gives the record back: it used to keep its slot until tierd
 * stopped, and after 65536 such slots no tensor's memory was kept any more.
 */
static void test_store_dead_tensor_record_freed(void **state) {
        tier_client *c = NULL;
        tier_tensor *x = NULL, *y = NULL;
        tier_plan *p = NULL;
        struct tier_stat st;
        unsigned dead_there;
        bool sent;

        spawn_with_store();
        assert_int_equal(tier_client_new(d.socket, "dead", 0, &c), 0);
        assert_int_equal(tier_tensor_create(c, "x", MiB, &x), 0);
        assert_int_equal(tier_tensor_create(c, "y", MiB, &y), 0);
        assert_int_equal(write_host(x, 0x21, &sent), 0);
        assert_int_equal(write_host(y, 0x22, &sent), 0);
        /* x read in phase 0, written whole in phase 3: dead once phase 0 is over (the plan ends in phase 1) */
        assert_int_equal(tier_plan_new(c, &p), 0);
        assert_int_equal(tier_plan_add(p, 0, x, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_add(p, 1, y, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_add(p, 2, y, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_add(p, 3, x, TIER_HOST, TIER_WRITE), 0);
        assert_int_equal(tier_plan_submit(p), 0);
        assert_int_equal(tier_phase_enter(c, 0), 0);
        assert_int_equal(tier_phase_enter(c, 1), 0);
        assert_int_equal(tier_tensor_stat(y, &st), 0);          /* a request: tierd has read marker 1 */
        assert_true(test_daemon_log_contains(&d, "'x' of job 'dead' is dead until its next write"));
        dead_there = records_in_use();
        assert_int_equal(tier_plan_end(c), 0);
        assert_int_equal(tier_tensor_destroy(x), 0);
        assert_int_equal(records_in_use(), dead_there - 1);
        assert_int_equal(tier_tensor_destroy(y), 0);
        assert_int_equal(records_in_use(), dead_there - 2);
        tier_client_free(c);
        d.fd_store = false;
}

/*
 * A tensor the plan of rank 0 made dead (its bytes dropped after their last
 * read, its next access writes it whole), then tierd SIGKILLed with the fd
 * store: a read of it by another rank fails ENODATA naming rank 0, after the
 * restart as before it, and a whole write mends it.  The memory store kept
 * that it was dead, but not which plan's overwrite made it so
 * (Tensor.dead_rank): the read after the restart gave zeros as its data.
 */
static void test_store_dead_read_after_restart(void **state) {
        tier_client *c = NULL, *c1 = NULL;
        tier_tensor *x = NULL, *y = NULL, *x1 = NULL;
        tier_plan *p = NULL;
        struct tier_grant g;
        struct tier_stat st;
        bool sent;

        spawn_with_store();
        assert_int_equal(tier_client_new(d.socket, "deadr", 0, &c), 0);
        assert_int_equal(tier_tensor_create(c, "x", MiB, &x), 0);
        assert_int_equal(tier_tensor_create(c, "y", MiB, &y), 0);
        assert_int_equal(write_host(x, 0x21, &sent), 0);
        assert_int_equal(write_host(y, 0x22, &sent), 0);
        /* x read in phase 0, written whole in phase 3: dead once phase 0 is over */
        assert_int_equal(tier_plan_new(c, &p), 0);
        assert_int_equal(tier_plan_add(p, 0, x, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_add(p, 1, y, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_add(p, 2, y, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_add(p, 3, x, TIER_HOST, TIER_WRITE), 0);
        assert_int_equal(tier_plan_submit(p), 0);
        assert_int_equal(tier_phase_enter(c, 0), 0);
        assert_int_equal(tier_phase_enter(c, 1), 0);
        assert_int_equal(tier_tensor_stat(y, &st), 0);          /* a request: tierd has read marker 1 */
        assert_true(test_daemon_log_contains(&d, "'x' of job 'deadr' is dead until its next write"));
        assert_int_equal(tier_client_new(d.socket, "deadr", 1, &c1), 0);
        assert_int_equal(tier_tensor_open(c1, "x", &x1), 0);
        assert_int_equal(tier_pin(x1, TIER_HOST, TIER_READ, &g), -ENODATA);
        assert_non_null(strstr(tier_client_last_error(c1), "the plan of rank 0 overwrites it whole next"));
        tier_tensor_close(x1);
        tier_client_free(c1);

        test_daemon_drain(&d);
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        tier_tensor_close(x);
        tier_tensor_close(y);
        tier_client_free(c);
        spawn();
        assert_true(test_daemon_log_contains(&d, "Tensor 'x' of job 'deadr' was dead when tierd went"));
        assert_int_equal(tier_client_new(d.socket, "deadr", 1, &c1), 0);
        assert_int_equal(tier_tensor_open(c1, "x", &x1), 0);
        assert_int_equal(tier_pin(x1, TIER_HOST, TIER_READ, &g), -ENODATA);
        assert_non_null(strstr(tier_client_last_error(c1), "the plan of rank 0 overwrites it whole next"));
        assert_int_equal(write_host(x1, 0x31, &sent), 0);      /* a whole write mends it */
        assert_int_equal(tier_pin(x1, TIER_HOST, TIER_READ, &g), 0);
        assert_true(all(x1, g.ptr, 0x31));
        assert_int_equal(tier_unpin(x1, TIER_HOST, 0), 0);
        assert_int_equal(tier_tensor_destroy(x1), 0);
        assert_int_equal(tier_tensor_open(c1, "y", &y), 0);
        assert_int_equal(tier_tensor_destroy(y), 0);
        tier_client_free(c1);
        d.fd_store = false;
}

/* Cut short, as a kill in the middle of its write would, every record in use of the tables in the store. */
static unsigned tear_stored_tables(void) {
        const size_t records_at = 8192;         /* memstore.c: a page of header, a page of inodes (12 segments) */
        const size_t rec_size = 512;
        unsigned torn = 0;

        for (size_t i = 0; i < d.n_stored; i++) {
                uint32_t n_records = 0;
                int fd = d.stored[i].fd;

                if (strncmp(d.stored[i].name, "tierd-mem-table-", 16) != 0)
                        continue;
                assert_int_equal(pread(fd, &n_records, sizeof(n_records), 16), (ssize_t) sizeof(n_records));
                for (uint32_t r = 0; r < n_records; r++) {
                        off_t at = (off_t) (records_at + r * rec_size);
                        uint8_t zeros[256] = {};
                        uint64_t seq = 0;

                        assert_int_equal(pread(fd, &seq, sizeof(seq), at), (ssize_t) sizeof(seq));
                        if (!seq)
                                continue;
                        assert_int_equal(pwrite(fd, zeros, sizeof(zeros), at + 256), (ssize_t) sizeof(zeros));
                        torn++;
                }
        }
        return torn;
}

/* A table whose records a kill cut short, or pools shaped otherwise: what was only in memory is lost, never wrong. */
static void test_store_torn_or_reshaped(void **state) {
        for (int round = 0; round < 2; round++) {
                Known k[N_TENSORS] = {};
                char needle[128];

                assert_int_equal(test_daemon_kill(&d, SIGTERM, 10000), 0);
                d.fd_store = true;
                spawn();
                assert_true(workload(k));
                assert_true(k[0].newest != k[0].durable);       /* something is only in memory */
                test_daemon_drain(&d);
                assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
                if (round == 0) {
                        unsigned torn = tear_stored_tables(), in_memory = 0;

                        for (unsigned i = 0; i < N_TENSORS; i++)
                                in_memory += k[i].newest != k[i].durable;
                        assert_true(torn >= in_memory);
                        snprintf(needle, sizeof(needle), " %u of its records cut short (not used)", torn);
                } else {
                        assert_int_equal(test_daemon_write_config(&d, "shape.conf", "[host]\nsegment_size = 2M\n"), 0);
                        snprintf(needle, sizeof(needle), "Memory store: the host pool was 8 segment(s) of %llu bytes "
                                 "and is 16 of %llu now", 4 * MiB, 2 * MiB);
                }
                spawn();
                if (!test_daemon_log_contains(&d, needle)) {
                        test_daemon_dump_log(&d);
                        fail_msg("the log does not say '%s'", needle);
                }
                check(k, false, round == 0 ? "after SIGKILL, the store's table torn" : "after SIGKILL, pools reshaped");
                forget_job();
                if (round == 1)
                        assert_int_equal(test_daemon_write_config(&d, "shape.conf", NULL), 0);
        }
        d.fd_store = false;
}

static int setup(void **state) {
        if (!test_can_lock_memory(32 * MiB))
                return -1;
        return test_daemon_start(&d, config_body) < 0 ? -1 : 0;
}

static int teardown(void **state) {
        return test_daemon_stop(&d) == 0 ? 0 : -1;
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_stop_and_kill),
                cmocka_unit_test(test_kill_with_fd_store),
                cmocka_unit_test(test_write_only_ghost_twice),
                cmocka_unit_test(test_write_only_ghost_reverted_then_killed),
                cmocka_unit_test(test_commit_waits_for_ghost),
                cmocka_unit_test(test_write_only_ghost_not_read),
                cmocka_unit_test(test_written_ghost_waits_for_its_rank),
                cmocka_unit_test(test_store_table_at_ready),
                cmocka_unit_test(test_store_table_fails),
                cmocka_unit_test(test_store_dead_tensor_record_freed),
                cmocka_unit_test(test_store_dead_read_after_restart),
                cmocka_unit_test(test_store_torn_or_reshaped),
                cmocka_unit_test(test_kill_at_every_step),
                cmocka_unit_test(test_torn_record_at_every_write),
                cmocka_unit_test(test_store_kill_at_every_point),
        };

        if (!test_can_lock_memory(32 * MiB))
                return TEST_SKIP;
        if (getenv("TIER_TEST_FILTER"))                 /* one test, by name (a glob) */
                cmocka_set_test_filter(getenv("TIER_TEST_FILTER"));
        return cmocka_run_group_tests_name("restart", tests, setup, teardown);
}
