/* SPDX-License-Identifier: MIT */
/* fixture.c: an in-process tierd core (Manager without a socket) for the unit tests of the rooms. */

#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <systemd/sd-event.h>
#include <cmocka.h>

#include "tests/unit/fixture.h"
#include "util/time-util.h"

static char dir[] = "/var/tmp/tierd-unit.XXXXXX";

Manager *fixture_new(uint64_t target_size, void (*setup)(Config *c, void *userdata), void *userdata) {
        Manager *m = NULL;
        Config c;
        char *err = NULL;
        char path[128], sub[64];
        static unsigned n_made;

        config_init(&c);
        c.host_capacity = 8 * MiB;
        c.host_segment_size = 4 * MiB;
        c.host_job_limit = 4 * MiB;
        c.vram_backend = VRAM_BACKEND_EMULATED;
        c.vram_capacity = 4 * MiB;
        c.vram_chunk_size = 2 * MiB;
        c.vram_job_limit = 2 * MiB;
        c.nvme_job_limit = 16 * MiB;
        /* a directory of its own: one a failed test left running (locked) is not in the next one's way */
        snprintf(sub, sizeof(sub), "%s/%u", dir, ++n_made);
        assert_int_equal(mkdir(sub, 0700), 0);
        snprintf(path, sizeof(path), "%s/t0.img", sub);
        free(c.state_dir);
        c.state_dir = strdup(sub);
        c.targets[0].path = strdup(path);
        c.targets[0].size = target_size;
        c.n_targets = 1;
        if (setup)
                setup(&c, userdata);
        if (config_finish(&c, &err) < 0)
                fail_msg("config_finish: %s", err ? err : "?");
        assert_int_equal(manager_new(&m, &c, NULL), 0);
        return m;
}

void fixture_free(Manager *m) {
        /* transfers still running finish first, as tierd's stop does */
        FIXTURE_RUN_UNTIL(m, m->engine->n_xfers == 0);
        manager_free(m);
}

void fixture_run(Manager *m, unsigned rounds) {
        for (unsigned i = 0; i < rounds; i++)
                assert_true(sd_event_run(m->event, 2000) >= 0);
}

uint64_t fixture_deadline(void) {
        return now_usec() + FIXTURE_NEVER_USEC;
}

bool fixture_run_before(Manager *m, uint64_t deadline) {
        if (now_usec() >= deadline)
                return false;
        fixture_run(m, 1);
        return true;
}

typedef struct Done {
        int done;
        int status;
} Done;

static void on_done(Op *op, int status, const char *error) {
        Done *d = op->userdata;

        d->done++;
        d->status = status;
}

int fixture_op(Manager *m, OpKind kind, Tensor *t, int tier) {
        Done d = {};

        assert_int_equal(op_submit(m->engine, kind, t, tier, on_done, NULL, &d, NULL), 0);
        FIXTURE_RUN_UNTIL(m, d.done);
        assert_int_equal(d.done, 1);
        return d.status;
}

uint8_t fixture_byte(const Tensor *t, int tier, uint64_t off) {
        return *copy_addr(&t->copy[tier], off);
}

void fixture_fill(Tensor *t, int tier, uint8_t v) {
        const Copy *c = &t->copy[tier];

        for (uint32_t i = 0; i < c->n_pieces; i++)
                memset((uint8_t *) c->pieces[i].seg->map + c->pieces[i].offset, v, c->pieces[i].len);
}

void fixture_host_data(Manager *m, Tensor *t, uint8_t v) {
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_HOST), 0);
        fixture_fill(t, LEVEL_HOST, v);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, true), 0);
}

void fixture_on_nvme(Manager *m, Tensor *t) {
        fixture_touch(m, t, LEVEL_HOST, true);
        assert_int_equal(fixture_op(m, OP_EVICT, t, LEVEL_NVME), 0);
        assert_true(copy_valid(t, LEVEL_NVME));
        assert_false(copy_valid(t, LEVEL_HOST));
}

void fixture_touch(Manager *m, Tensor *t, int tier, bool dirty) {
        assert_int_equal(fixture_op(m, OP_PIN, t, tier), 0);
        assert_int_equal(tensor_unpin(t, tier, dirty), 0);
}

Tensor *fixture_tensor(Job *j, const char *name, uint64_t size) {
        Tensor *t = NULL;

        assert_int_equal(tensor_new(j, name, size, &t), 0);
        return t;
}

int fixture_main(const char *name, const struct CMUnitTest *tests, size_t n) {
        char cmd[128];
        sigset_t ss;
        int r;

        /* the manager watches these through signalfd, which needs them blocked */
        sigemptyset(&ss);
        sigaddset(&ss, SIGTERM);
        sigaddset(&ss, SIGINT);
        sigaddset(&ss, SIGHUP);
        sigprocmask(SIG_BLOCK, &ss, NULL);
        /* as tierd's main(): a wakeup pipe whose client closed its read end is EPIPE, not a signal */
        signal(SIGPIPE, SIG_IGN);
        if (!mkdtemp(dir)) {
                perror("mkdtemp");
                return 1;
        }
        if (getenv("TIER_TEST_FILTER"))                 /* one test, by name (a glob) */
                cmocka_set_test_filter(getenv("TIER_TEST_FILTER"));
        r = _cmocka_run_group_tests(name, tests, n, NULL, NULL);
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        if (system(cmd) != 0)
                fprintf(stderr, "cannot remove %s\n", dir);
        return r;
}
