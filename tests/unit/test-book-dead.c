/* SPDX-License-Identifier: MIT */
/*
 * test-book-dead.c: a dead tensor (its bytes dropped, its plan's next access writes it whole) across a
 * clean stop without the memory store: the NVMe index's DEAD record brings it back dead, not lost.
 */

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/base/config.h"
#include "daemon/core/manager.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/engine-private.h"
#include "daemon/state/book.h"
#include "daemon/state/book-private.h"
#include "daemon/state/registry.h"
#include "tests/unit/book-fixture.h"
#include "tests/unit/fixture.h"
#include "proto/crc32c.h"

static void setup(Config *c, void *userdata) {
        char t[192];

        free(c->state_dir);
        c->state_dir = strdup(userdata);
        snprintf(t, sizeof(t), "%s/t0.img", (const char *) userdata);
        free(c->targets[0].path);
        c->targets[0].path = strdup(t);
        c->targets[0].size = 32 * MiB;
        c->nvme_persist = true;
        c->nvme_job_limit = 32 * MiB;
}

static Tensor *find(Manager *m, const char *job, const char *name) {
        Job *j = job_find(m->registry, job);

        assert_non_null(j);
        list_for_each_safe(n, tmp, &j->tensors) {
                Tensor *t = list_entry(n, Tensor, job_link);

                if (strcmp(t->name, name) == 0)
                        return t;
        }
        fail_msg("no tensor %s", name);
        return NULL;
}

static void on_done(Op *op, int status, const char *error) {
        int *done = op->userdata;

        assert_int_equal(status, 0);
        (*done)++;
}

/* A whole write of @t in host (a write-only pin, as a plan's hold that overwrites it). */
static void write_only_pin(Manager *m, Tensor *t, uint8_t v) {
        int done = 0;
        Op *op;

        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_HOST, on_done, NULL, &done, &op), 0);
        op->write = true;
        op->discard = true;
        FIXTURE_RUN_UNTIL(m, done);
        assert_int_equal(done, 1);
        fixture_fill(t, LEVEL_HOST, v);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, true), 0);
}

/* As plan_drop_dead(): rank 2's plan writes @t whole next; its copies go. */
static void make_dead(Tensor *t) {
        t->dead = true;
        t->dead_rank = 3;
        for (int tier = 0; tier < TIERS; tier++)
                copy_free(t, tier);
}

/*
 * G written twice (the index has a NEWER record of the first write only), then dead; L written, in
 * memory only.  A clean stop without the memory store wrote L down and left G "lost" ("its newest data
 * was in memory, not on NVMe, when tierd stopped"): the read of its plan's own hold, zeros without
 * the stop (tier.torch's optimizer phase of a block its backward did not reach), failed -ENODATA.  G
 * comes back dead now, of its rank; written again after that start, it is no longer: a kill then
 * brings it back lost (its newest data was in memory), not dead (no zeros for data that was lost).
 */
static void test_dead_across_a_clean_stop(void **state) {
        char dir[64] = "/var/tmp/tierd-book-dead.XXXXXX", cmd[128];
        Manager *m;
        Tensor *g, *l;
        Job *j;

        assert_non_null(mkdtemp(dir));
        m = fixture_new(32 * MiB, setup, dir);
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        book_job(m->book, j);
        g = fixture_tensor(j, "G", MiB);
        l = fixture_tensor(j, "L", MiB);
        fixture_host_data(m, g, 0x11);
        fixture_host_data(m, g, 0x12);
        fixture_host_data(m, l, 0x21);
        make_dead(g);
        m->stopping = true;                     /* a clean stop: what is in memory is written down */
        assert_int_equal(fixture_op(m, OP_EVICT, l, LEVEL_NVME), 0);
        fixture_free(m);

        m = fixture_new(32 * MiB, setup, dir);
        g = find(m, "j", "G");
        l = find(m, "j", "L");
        assert_true(g->dead);
        assert_int_equal(g->dead_rank, 3);
        assert_int_equal(g->version, 2);
        assert_false(l->lost);
        assert_int_equal(fixture_op(m, OP_PIN, g, LEVEL_HOST), -ENODATA);     /* no plan's hold: no read */
        write_only_pin(m, g, 0x13);             /* its plan's write */
        assert_false(g->dead);
        fixture_free(m);                        /* as a kill */

        m = fixture_new(32 * MiB, setup, dir);
        g = find(m, "j", "G");
        assert_false(g->dead);
        assert_true(g->lost);
        fixture_free(m);
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
}

/*
 * D dead at the commit, a crash: it comes back dead (the commit's DEAD record) and the rollback makes
 * it dead again, its version the committed one, the index told NEWER of it (book_version()).  A
 * compaction then (BOOK_COMPACT_MIN reached in the step after a resume, or the start of a tierd that
 * crashed again before the rollback) wrote a snapshot without its commit's DEAD record (only one of a
 * tensor written since the commit had one): the next crash brought it back lost, and its rollback
 * counted it lost ("nothing to go back to"), a resumed tier.torch job refused as before the DEAD
 * records.  The snapshot keeps it now, whatever the tensor's version.
 */
static void test_commit_dead_across_a_snapshot_after_a_rollback(void **state) {
        char dir[64] = "/var/tmp/tierd-book-dead.XXXXXX", cmd[128], why[128];
        unsigned rolled, lost;
        Manager *m;
        Tensor *d;
        Job *j;

        assert_non_null(mkdtemp(dir));
        m = fixture_new(32 * MiB, setup, dir);
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        book_job(m->book, j);
        d = fixture_tensor(j, "D", MiB);
        fixture_host_data(m, d, 0x11);
        make_dead(d);
        job_commit(j, 1);
        fixture_free(m);                        /* as a crash */

        m = fixture_new(32 * MiB, setup, dir);
        j = job_find(m->registry, "j");
        d = find(m, "j", "D");
        assert_true(d->dead && d->commit_dead);
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), 0);
        assert_int_equal(lost, 0);
        assert_true(d->dead && d->commit_dead && d->version == d->commit_version);
        assert_int_equal(book_snapshot(m->book), 0);    /* a compaction */
        fixture_free(m);                        /* a crash again */

        m = fixture_new(32 * MiB, setup, dir);
        j = job_find(m->registry, "j");
        d = find(m, "j", "D");
        assert_true(d->commit_dead);
        assert_int_equal(d->commit_dead_rank, 3);
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), 0);
        assert_int_equal(lost, 0);
        assert_int_equal(rolled, 1);
        assert_true(d->dead && !d->lost);
        assert_int_equal(d->dead_rank, 3);
        fixture_free(m);
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
}

/*
 * D dead at commit 1 and still at commit 2, never written between: the index's last record of it is the
 * DEAD record of that version already, so commit 2 writes its COMMIT record alone (it wrote another DEAD
 * record of D at every commit: 40 bytes a commit for each tensor that stays dead); after a crash D is
 * still dead at the commit, its rollback nothing lost.
 */
static void test_commit_of_one_dead_since(void **state) {
        char dir[64] = "/var/tmp/tierd-book-dead.XXXXXX", cmd[128], why[128];
        unsigned rolled, lost;
        uint64_t records;
        Manager *m;
        Tensor *d;
        Job *j;

        assert_non_null(mkdtemp(dir));
        m = fixture_new(32 * MiB, setup, dir);
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        book_job(m->book, j);
        d = fixture_tensor(j, "D", MiB);
        fixture_host_data(m, d, 0x11);
        make_dead(d);
        records = m->book->records;
        job_commit(j, 1);
        assert_int_equal(m->book->records, records + 2);       /* D's DEAD record, the COMMIT */
        job_commit(j, 2);
        assert_int_equal(m->book->records, records + 3);       /* the COMMIT alone */
        fixture_free(m);                        /* as a crash */

        m = fixture_new(32 * MiB, setup, dir);
        j = job_find(m->registry, "j");
        d = find(m, "j", "D");
        assert_true(d->dead && d->commit_dead);
        assert_int_equal(d->commit_dead_rank, 3);
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), 0);
        assert_int_equal(lost, 0);
        assert_true(d->dead && !d->lost);
        fixture_free(m);
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
}

/*
 * A (its version in memory only, the index's record NEWER) and N (on NVMe) are held by their plan to be
 * written whole when the job commits (tier.torch's activations under lru or ondemand): ipc/commit.c keeps
 * them as dead at the commit (tensor_commit_dead()), which the index learnt only from a later snapshot.
 * Written whole after the commit, then a crash: A came back lost at the rollback ("nothing to go back
 * to", a resumed job refused), as without the DEAD record of its committed version that follows the
 * COMMIT now; it is dead again, of its rank.  N goes back to its image.  A crash before the plan writes
 * them: the record after that DEAD one says what they hold, so N comes back whole from NVMe, not dead.
 */
static void test_commit_dead_by_a_hold(void **state) {
        char dir[64] = "/var/tmp/tierd-book-dead.XXXXXX", cmd[128], why[128];
        unsigned rolled, lost;
        uint64_t records;
        Manager *m;
        Tensor *a, *n;
        Job *j;

        assert_non_null(mkdtemp(dir));
        m = fixture_new(32 * MiB, setup, dir);
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        book_job(m->book, j);
        a = fixture_tensor(j, "A", MiB);
        n = fixture_tensor(j, "N", MiB);
        fixture_host_data(m, a, 0x11);
        fixture_host_data(m, n, 0x21);
        assert_int_equal(fixture_op(m, OP_EVICT, n, LEVEL_NVME), 0);
        job_commit(j, 1);
        records = m->book->records;
        tensor_commit_dead(a, 3);               /* as ipc/commit.c: rank 2's plan holds it to write it whole */
        tensor_commit_dead(n, 3);
        assert_int_equal(m->book->records, records + 4);       /* DEAD and NEWER of A; DEAD and NVME of N */
        assert_true(a->commit_dead && !a->dead && n->commit_dead && !n->dead);
        fixture_free(m);                        /* a crash before the plan writes them */

        m = fixture_new(32 * MiB, setup, dir);
        j = job_find(m->registry, "j");
        a = find(m, "j", "A");
        n = find(m, "j", "N");
        assert_true(a->commit_dead && n->commit_dead);
        assert_int_equal(a->commit_dead_rank, 3);
        assert_true(a->lost && !a->dead);       /* its newest data was in memory */
        assert_true(!n->lost && !n->dead);
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), 0);
        assert_int_equal(lost, 0);
        assert_true(a->dead && !a->lost);
        assert_int_equal(a->dead_rank, 3);
        book_fx_check_bytes(m, n, 0x21);        /* untouched: what it held at the commit */
        job_commit(j, 2);
        tensor_commit_dead(n, 3);
        write_only_pin(m, a, 0x12);             /* the plan's writes */
        write_only_pin(m, n, 0x22);
        assert_non_null(n->base);               /* its committed version's NVMe copy: its image */
        fixture_free(m);                        /* a crash after them */

        m = fixture_new(32 * MiB, setup, dir);
        j = job_find(m->registry, "j");
        a = find(m, "j", "A");
        n = find(m, "j", "N");
        assert_true(a->commit_dead && n->commit_dead);
        assert_true(a->lost && n->lost);        /* their newest data was in memory */
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), 0);
        assert_int_equal(lost, 0);
        assert_int_equal(rolled, 2);
        assert_true(a->dead && !a->lost);
        assert_int_equal(a->dead_rank, 3);
        assert_int_equal(fixture_op(m, OP_PIN, a, LEVEL_HOST), -ENODATA);     /* no plan's hold: no read */
        book_fx_check_bytes(m, n, 0x21);        /* its image */
        fixture_free(m);
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
}

/*
 * book_commit_dead()'s pair (DEAD of the committed version, then NVME again) written in one pwrite() is not
 * all or none for the replay: a write cut short (a crash of the machine before the sync, a SIGKILL in a
 * write across a page) leaves the DEAD record alone.  N then comes back dead, of its rank, its reads
 * refused, never with other bytes; a rollback leaves it so (its plan writes it whole next).
 */
static void test_commit_dead_pair_torn(void **state) {
        char dir[64] = "/var/tmp/tierd-book-dead.XXXXXX", cmd[128], why[128];
        unsigned rolled, lost;
        uint64_t off;
        Manager *m;
        Tensor *n;
        Job *j;
        int fd;

        assert_non_null(mkdtemp(dir));
        m = fixture_new(32 * MiB, setup, dir);
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        book_job(m->book, j);
        n = fixture_tensor(j, "N", MiB);
        fixture_host_data(m, n, 0x21);
        assert_int_equal(fixture_op(m, OP_EVICT, n, LEVEL_NVME), 0);
        job_commit(j, 1);
        tensor_commit_dead(n, 3);
        off = m->book->off;
        fd = open(m->book->path[m->book->cur], O_WRONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(ftruncate(fd, (off_t) off - 8), 0);    /* the NVME record's end never written */
        close(fd);
        fixture_free(m);

        m = fixture_new(32 * MiB, setup, dir);
        j = job_find(m->registry, "j");
        n = find(m, "j", "N");
        assert_true(n->commit_dead && n->dead && !copy_valid(n, LEVEL_NVME));  /* (its NVMe copy forgotten) */
        assert_int_equal(n->dead_rank, 3);
        assert_int_equal(fixture_op(m, OP_PIN, n, LEVEL_HOST), -ENODATA);
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), 0);
        assert_int_equal(lost, 0);
        assert_int_equal(rolled, 1);
        assert_true(n->dead && !n->lost);
        assert_int_equal(n->dead_rank, 3);
        fixture_free(m);
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
}

/* The header's format field of @path set to @format, its crc made again: as another tierd wrote it. */
static void set_format(const char *path, uint32_t format) {
        uint8_t buf[4096];
        ssize_t n;
        size_t hlen;
        int fd = open(path, O_RDWR | O_CLOEXEC);

        assert_true(fd >= 0);
        n = pread(fd, buf, sizeof(buf), 0);
        assert_true(n > 48);
        /* the header ends with the crc32c of what precedes it: the shortest such length is the header's */
        for (hlen = 44; hlen + 4 <= (size_t) n; hlen++) {
                uint32_t crc;

                memcpy(&crc, buf + hlen, 4);
                if (crc == crc32c(0, buf, hlen))
                        break;
        }
        assert_true(hlen + 4 <= (size_t) n);
        memcpy(buf + 8, &format, 4);
        {
                uint32_t crc = crc32c(0, buf, hlen);

                memcpy(buf + hlen, &crc, 4);
        }
        assert_int_equal(pwrite(fd, buf, hlen + 4, 0), (ssize_t) (hlen + 4));
        close(fd);
}

/*
 * This tierd writes format 2 (the DEAD record), which a tierd of format 1 refuses (it would take DEAD
 * for damage and bring every tensor back lost), and still reads format 1: an index written by the
 * tierd before, its tensors restored.
 */
static void test_format(void **state) {
        char dir[64] = "/var/tmp/tierd-book-dead.XXXXXX", cmd[160], p[128];
        uint8_t hdr[12];
        Manager *m;
        Tensor *l;
        Job *j;
        int fd;

        assert_non_null(mkdtemp(dir));
        m = fixture_new(32 * MiB, setup, dir);
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        book_job(m->book, j);
        l = fixture_tensor(j, "L", MiB);
        fixture_host_data(m, l, 0x21);
        assert_int_equal(fixture_op(m, OP_EVICT, l, LEVEL_NVME), 0);
        fixture_free(m);

        for (int i = 0; i < 2; i++) {
                snprintf(p, sizeof(p), "%s/%s.%d", dir, BOOK_FILE, i);
                fd = open(p, O_RDONLY | O_CLOEXEC);
                if (fd < 0)
                        continue;
                assert_int_equal(pread(fd, hdr, sizeof(hdr), 0), (ssize_t) sizeof(hdr));
                close(fd);
                assert_int_equal(hdr[8], BOOK_FORMAT);
                assert_int_equal(BOOK_FORMAT, 2);
                set_format(p, 1);
        }

        m = fixture_new(32 * MiB, setup, dir);
        l = find(m, "j", "L");
        assert_false(l->lost);
        assert_int_equal(l->version, 1);
        fixture_free(m);
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_dead_across_a_clean_stop),
                cmocka_unit_test(test_format),
                cmocka_unit_test(test_commit_dead_across_a_snapshot_after_a_rollback),
                cmocka_unit_test(test_commit_of_one_dead_since),
                cmocka_unit_test(test_commit_dead_by_a_hold),
                cmocka_unit_test(test_commit_dead_pair_torn),
        };

        return fixture_main("book-dead", tests, sizeof(tests) / sizeof(tests[0]));
}
