/* SPDX-License-Identifier: MIT */
/* test-book.c: the NVMe index (state/book.c): what is on NVMe survives a restart, anything else is lost, never wrong. */

#include <errno.h>
#include <fcntl.h>
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
#include "daemon/core/manager.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/engine-private.h"
#include "daemon/state/book.h"
#include "daemon/state/book-private.h"
#include "daemon/base/quota-rule.h"
#include "daemon/state/quota.h"
#include "daemon/state/registry.h"
#include "tests/helpers/instrumented.h"
#include "tests/unit/book-fixture.h"
#include "tests/unit/fixture.h"

/* Each test's own state directory and target (the fixture's is shared by the whole binary). */
typedef struct Dir {
        char path[128];
        uint64_t target_size;
        uint64_t host_cap;      /* 0: 16M */
        bool persist;
} Dir;

static void setup(Config *c, void *userdata) {
        const Dir *d = userdata;
        char t[192];

        free(c->state_dir);
        c->state_dir = strdup(d->path);
        snprintf(t, sizeof(t), "%s/t0.img", d->path);
        free(c->targets[0].path);
        c->targets[0].path = strdup(t);
        c->targets[0].size = d->target_size;
        c->nvme_persist = d->persist;
        c->host_capacity = d->host_cap ? d->host_cap : 16 * MiB;
        c->host_job_limit = c->host_capacity;
        c->host_uid_share = 0;
        c->nvme_uid_share = 0;
        c->nvme_job_limit = 32 * MiB;
}

static Dir dir_new(void) {
        Dir d = { .target_size = 32 * MiB, .persist = true };

        snprintf(d.path, sizeof(d.path), "/var/tmp/tierd-book.XXXXXX");
        assert_non_null(mkdtemp(d.path));
        return d;
}

static void dir_done(Dir *d) {
        char cmd[192];

        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->path);
        assert_int_equal(system(cmd), 0);
}

static Manager *start(Dir *d) {
        return fixture_new(d->target_size, setup, d);
}

static void on_done(Op *op, int status, const char *error) {
        int *done = op->userdata;

        assert_int_equal(status, 0);
        (*done)++;
}

static int read_whole(const char *path, char **ret, size_t *ret_len) {
        FILE *f = fopen(path, "rb");
        long n;

        if (!f)
                return -errno;
        assert_int_equal(fseek(f, 0, SEEK_END), 0);
        n = ftell(f);
        rewind(f);
        *ret = malloc((size_t) n + 1);
        assert_non_null(*ret);
        assert_int_equal(fread(*ret, 1, (size_t) n, f), (size_t) n);
        fclose(f);
        *ret_len = (size_t) n;
        return 0;
}

static void write_whole(const char *path, const char *data, size_t len) {
        FILE *f = fopen(path, "wb");

        assert_non_null(f);
        assert_int_equal(fwrite(data, 1, len, f), len);
        assert_int_equal(fclose(f), 0);
}

/* The newer index file's bytes. */
static char *index_path(const Dir *d, unsigned i, char *buf, size_t size) {
        snprintf(buf, size, "%s/" BOOK_FILE ".%u", d->path, i);
        return buf;
}

static unsigned newer_file(const Dir *d) {
        char p0[192], p1[192];
        struct stat s0, s1;

        if (stat(index_path(d, 0, p0, sizeof(p0)), &s0) < 0)
                return 1;
        if (stat(index_path(d, 1, p1, sizeof(p1)), &s1) < 0)
                return 0;
        return s1.st_mtim.tv_sec > s0.st_mtim.tv_sec ||
               (s1.st_mtim.tv_sec == s0.st_mtim.tv_sec && s1.st_mtim.tv_nsec > s0.st_mtim.tv_nsec) ? 1 : 0;
}

/*
 * What was written to NVMe comes back, with its data and its checksums; a
 * tensor never written comes back as zeros; one whose newest data was in
 * host only comes back lost (a read fails with ENODATA, a whole write mends
 * it); a destroyed tensor and an ended job do not come back.
 */
static void test_restart_keeps_nvme(void **state) {
        Dir d = dir_new();
        Manager *m = start(&d);
        Tensor *a, *b, *c, *n, *x, *t;
        Job *j, *gone;
        int r;

        j = book_fx_job(m, "j");
        a = fixture_tensor(j, "a", MiB);
        b = fixture_tensor(j, "b", 3 * MiB + 4096);     /* several extents, a partial last one */
        c = fixture_tensor(j, "c", MiB);                /* never written */
        n = fixture_tensor(j, "n", MiB);                /* written to NVMe, then newer in host */
        x = fixture_tensor(j, "x", MiB);                /* destroyed */
        book_fx_written(m, a, 0x11);
        book_fx_written(m, b, 0x22);
        book_fx_written(m, n, 0x33);
        fixture_host_data(m, n, 0x34);
        assert_false(copy_valid(n, LEVEL_NVME));         /* stale on NVMe: freed */
        book_fx_written(m, x, 0x55);
        assert_int_equal(tensor_free(x), 0);
        gone = book_fx_job(m, "gone");
        book_fx_written(m, fixture_tensor(gone, "g", MiB), 0x66);
        job_destroy(gone);
        fixture_free(m);                                /* as a crash: no clean stop */

        m = start(&d);
        assert_null(job_find(m->registry, "gone"));
        j = job_find(m->registry, "j");
        assert_non_null(j);
        assert_non_null(j->linger);                     /* no client yet: it lingers */
        assert_int_equal(j->n_tensors, 4);
        a = book_fx_find(m, "j", "a");
        b = book_fx_find(m, "j", "b");
        c = book_fx_find(m, "j", "c");
        n = book_fx_find(m, "j", "n");
        assert_null(book_fx_find(m, "j", "x"));
        assert_true(copy_valid(a, LEVEL_NVME) && copy_valid(b, LEVEL_NVME));
        assert_int_equal(j->used[LEVEL_NVME], 1 * MiB + 4 * MiB + 0);    /* a: 1 extent, b: 4 */
        book_fx_check_bytes(m, a, 0x11);
        book_fx_check_bytes(m, b, 0x22);
        assert_int_equal(c->version, 0);
        book_fx_check_bytes(m, c, 0);
        assert_true(n->lost);
        r = fixture_op(m, OP_PIN, n, LEVEL_HOST);
        assert_int_equal(r, -ENODATA);
        /* the NVMe space of what was freed is free again, what is restored is not handed out twice */
        t = fixture_tensor(j, "new", 8 * MiB);
        book_fx_written(m, t, 0x77);
        book_fx_check_bytes(m, a, 0x11);
        book_fx_check_bytes(m, b, 0x22);
        /* a whole write makes a lost tensor whole */
        {
                int done = 0;
                Op *op;

                assert_int_equal(op_submit(m->engine, OP_PIN, n, LEVEL_HOST, on_done, NULL, &done, &op), 0);
                op->discard = true;     /* a TIER_WRITE pin */
                FIXTURE_RUN_UNTIL(m, done);
                assert_int_equal(done, 1);
                fixture_fill(n, LEVEL_HOST, 0x35);
                assert_int_equal(tensor_unpin(n, LEVEL_HOST, true), 0);
                assert_false(n->lost);
                book_fx_check_bytes(m, n, 0x35);
        }
        fixture_free(m);

        /* and a second restart finds the state after the first (the index was rewritten at start) */
        m = start(&d);
        book_fx_check_bytes(m, book_fx_find(m, "j", "a"), 0x11);
        book_fx_check_bytes(m, book_fx_find(m, "j", "new"), 0x77);
        assert_true(book_fx_find(m, "j", "n")->lost);  /* 0x35 was in host only */
        fixture_free(m);
        dir_done(&d);
}

/* [nvme] persist = no: scratch, as before the index: nothing comes back, no file is written. */
static void test_scratch(void **state) {
        Dir d = dir_new();
        Manager *m;
        char p[192];
        Job *j;

        d.persist = false;
        m = start(&d);
        assert_null(m->book);
        j = book_fx_job(m, "j");
        book_fx_written(m, fixture_tensor(j, "a", MiB), 0x11);
        fixture_free(m);
        assert_int_equal(access(index_path(&d, 0, p, sizeof(p)), F_OK), -1);
        m = start(&d);
        assert_null(job_find(m->registry, "j"));
        fixture_free(m);
        dir_done(&d);
}

/*
 * A write cut short (the last record torn, at every length) is no record:
 * the state before it comes back.  Here the last record is b's NVMe copy:
 * b, written in host before (a NEWER record), comes back lost.
 */
static void test_torn_tail(void **state) {
        Dir d = dir_new();
        Manager *m = start(&d);
        char p[192];
        struct stat st;
        off_t whole, last;
        Job *j;

        j = book_fx_job(m, "j");
        book_fx_written(m, fixture_tensor(j, "a", MiB), 0x11);
        last = 0;
        {
                Tensor *b = fixture_tensor(j, "b", MiB);

                fixture_host_data(m, b, 0x22);
                assert_int_equal(stat(index_path(&d, newer_file(&d), p, sizeof(p)), &st), 0);
                last = st.st_size;      /* b's NVME record goes after this */
                assert_int_equal(fixture_op(m, OP_EVICT, b, LEVEL_NVME), 0);
        }
        fixture_free(m);
        index_path(&d, newer_file(&d), p, sizeof(p));
        assert_int_equal(stat(p, &st), 0);
        whole = st.st_size;
        assert_true(whole > last);
        {
                /* both files as they are now: every try starts from them (a start writes the other one) */
                char p0[192], p1[192], *f0 = NULL, *f1 = NULL;
                size_t l0 = 0, l1 = 0;
                unsigned newer = newer_file(&d);

                index_path(&d, 0, p0, sizeof(p0));
                index_path(&d, 1, p1, sizeof(p1));
                assert_int_equal(read_whole(p0, &f0, &l0), 0);
                (void) read_whole(p1, &f1, &l1);
                for (off_t cut = whole - 1; cut >= last; cut -= (cut - last > 8 ? (cut - last) / 3 : 1)) {
                        Tensor *a, *b;

                        write_whole(p0, f0, l0);
                        if (f1)
                                write_whole(p1, f1, l1);
                        else
                                (void) unlink(p1);
                        assert_int_equal(truncate(newer ? p1 : p0, cut), 0);
                        m = start(&d);
                        a = book_fx_find(m, "j", "a");
                        b = book_fx_find(m, "j", "b");
                        assert_non_null(a);
                        assert_non_null(b);
                        book_fx_check_bytes(m, a, 0x11);
                        assert_true(b->lost);
                        assert_false(copy_valid(b, LEVEL_NVME));
                        fixture_free(m);
                        if (cut == last)
                                break;
                }
                free(f0);
                free(f1);
        }
        dir_done(&d);
}

/* A damaged record with whole ones after it is no torn write: every tensor is taken as lost. */
static void test_damage_mid_file(void **state) {
        Dir d = dir_new();
        Manager *m = start(&d);
        char p[192];
        struct stat st;
        off_t at;
        int fd;
        Job *j;
        unsigned char byte;

        j = book_fx_job(m, "j");
        book_fx_written(m, fixture_tensor(j, "a", MiB), 0x11);
        assert_int_equal(stat(index_path(&d, newer_file(&d), p, sizeof(p)), &st), 0);
        at = st.st_size + 20;   /* inside the next record */
        book_fx_written(m, fixture_tensor(j, "b", MiB), 0x22);
        book_fx_written(m, fixture_tensor(j, "c", MiB), 0x33);
        fixture_free(m);
        fd = open(p, O_RDWR);
        assert_true(fd >= 0);
        assert_int_equal(pread(fd, &byte, 1, at), 1);
        byte ^= 0x40;
        assert_int_equal(pwrite(fd, &byte, 1, at), 1);
        close(fd);
        m = start(&d);
        j = job_find(m->registry, "j");
        assert_non_null(j);
        list_for_each_safe(n, tmp, &j->tensors)
                assert_false(copy_valid(list_entry(n, Tensor, job_link), LEVEL_NVME));
        assert_true(book_fx_find(m, "j", "a")->lost);
        fixture_free(m);
        dir_done(&d);
}

/* A format this tierd does not know: the start is refused, nothing is changed. */
static void test_unknown_format(void **state) {
        Dir d = dir_new();
        Manager *m = start(&d);
        char p[192], cmd[512];
        unsigned char four[4] = { 99, 0, 0, 0 };
        Config c;
        char *err = NULL;
        int fd;

        book_fx_written(m, fixture_tensor(book_fx_job(m, "j"), "a", MiB), 0x11);
        fixture_free(m);
        index_path(&d, newer_file(&d), p, sizeof(p));
        fd = open(p, O_RDWR);
        assert_true(fd >= 0);
        assert_int_equal(pwrite(fd, four, 4, 8), 4);   /* the format field, after the magic */
        close(fd);
        snprintf(cmd, sizeof(cmd), "cp '%s' '%s.before'", p, p);
        assert_int_equal(system(cmd), 0);

        config_init(&c);
        c.n_targets = 1;
        setup(&c, &d);
        c.host_capacity = 8 * MiB;
        c.host_segment_size = 4 * MiB;
        c.vram_backend = VRAM_BACKEND_EMULATED;
        c.vram_capacity = 4 * MiB;
        c.vram_chunk_size = 2 * MiB;
        c.vram_job_limit = 2 * MiB;
        assert_int_equal(config_finish(&c, &err), 0);
        m = NULL;
        assert_int_equal(manager_new(&m, &c, NULL), -EPROTONOSUPPORT);
        assert_null(m);
        snprintf(cmd, sizeof(cmd), "cmp -s '%s' '%s.before'", p, p);
        assert_int_equal(system(cmd), 0);
        dir_done(&d);
}

/* A target that is not the one the index knows (here: its size changed): its tensors are lost. */
static void test_target_changed(void **state) {
        Dir d = dir_new();
        Manager *m = start(&d);
        char p[192];

        book_fx_written(m, fixture_tensor(book_fx_job(m, "j"), "a", MiB), 0x11);
        fixture_free(m);
        snprintf(p, sizeof(p), "%s/t0.img", d.path);
        assert_int_equal(unlink(p), 0);
        d.target_size = 48 * MiB;
        m = start(&d);
        assert_true(book_fx_find(m, "j", "a")->lost);
        fixture_free(m);
        dir_done(&d);
}

/* Write @v over @t in host through a pin that may write (an op with .write, as a client's pin). */
static void write_pin(Manager *m, Tensor *t, uint8_t v) {
        int done = 0;
        Op *op;

        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_HOST, on_done, NULL, &done, &op), 0);
        op->write = true;
        FIXTURE_RUN_UNTIL(m, done);
        assert_int_equal(done, 1);
        fixture_fill(t, LEVEL_HOST, v);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, true), 0);
}

/*
 * A commit, then writes, then a rollback: every tensor holds what it held
 * at the commit, whether its committed data was on NVMe (kept as its
 * image), in host only (written to NVMe before the write was let through),
 * or not there (made after the commit: zeros).  The same across a crash of
 * tierd between the writes and the rollback.
 */
static void test_commit_rollback(void **state) {
        Dir d = dir_new();
        Manager *m = start(&d);
        Tensor *a, *b, *c;
        unsigned rolled, lost;
        char why[128];
        Job *j;

        for (int crash = 0; crash < 2; crash++) {
                j = book_fx_job(m, crash ? "j2" : "j");
                a = fixture_tensor(j, "a", MiB);
                b = fixture_tensor(j, "b", 2 * MiB);
                book_fx_written(m, a, 0x11);                    /* a: on NVMe at the commit */
                fixture_host_data(m, b, 0x22);          /* b: in host only */
                job_commit(j, 7);
                assert_true(j->committing);
                assert_int_equal(j->commit_step, 7);

                write_pin(m, a, 0x12);
                assert_non_null(a->base);               /* the committed image, kept */
                assert_false(copy_valid(a, LEVEL_NVME));
                write_pin(m, b, 0x23);                  /* b's committed data went to NVMe first */
                assert_non_null(b->base);
                write_pin(m, b, 0x24);                  /* a second write keeps the same image */
                c = fixture_tensor(j, "c", MiB);
                fixture_host_data(m, c, 0x33);
                if (crash) {
                        fixture_free(m);
                        m = start(&d);
                        j = job_find(m->registry, "j2");
                        assert_non_null(j);
                        assert_true(j->committing);
                        assert_int_equal(j->commit_step, 7);
                        a = book_fx_find(m, "j2", "a");
                        b = book_fx_find(m, "j2", "b");
                        c = book_fx_find(m, "j2", "c");
                        assert_non_null(a->base);
                        assert_non_null(b->base);
                        assert_true(a->lost && b->lost && c->lost);     /* their newest was in memory */
                }
                assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), 0);
                assert_int_equal(rolled, 3);
                assert_int_equal(lost, 0);
                book_fx_check_bytes(m, a, 0x11);
                book_fx_check_bytes(m, b, 0x22);
                book_fx_check_bytes(m, c, 0);
                assert_null(a->base);
                /* a restart now: the NVMe copies the rollback made of the images are theirs, not lost */
                fixture_free(m);
                m = start(&d);
                j = job_find(m->registry, crash ? "j2" : "j");
                a = book_fx_find(m, crash ? "j2" : "j", "a");
                b = book_fx_find(m, crash ? "j2" : "j", "b");
                assert_false(a->lost || b->lost);
                book_fx_check_bytes(m, a, 0x11);
                book_fx_check_bytes(m, b, 0x22);
                /* a second rollback has nothing to do; a new commit frees nothing it needs */
                assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), 0);
                assert_int_equal(rolled, 0);
                write_pin(m, a, 0x13);
                job_commit(j, 8);
                assert_null(a->base);
                book_fx_check_bytes(m, a, 0x13);
        }
        fixture_free(m);
        dir_done(&d);
}

/* Write @v over the whole of @t in host through a write-only pin (no old bytes brought: TIER_WRITE). */
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

/*
 * Tensors dead at the commit (Tensor.commit_dead), then a crash of tierd and
 * a rollback: none reads zeros or another version's bytes as its data, and
 * each comes back as without the crash.  d, dead when committed (its copies
 * dropped by its plan), and x, dead then and written since: the commit
 * wrote a DEAD record of each before its COMMIT, so the index knows they
 * were dead at the commit (d comes back dead, x lost: its newest data was in
 * memory), and the rollback makes both dead again with the rank whose plan
 * writes them (d, x: rank 0's), nothing lost: their reads outside that plan
 * fail ENODATA until a whole write, as before the commit.  They used to come
 * back lost from the rollback too: a resumed tier.torch job, its gradients
 * dead at every commit and written since, was refused after tierd restarted.
 * w, committed dead by its plan's write-only hold (ipc/commit.c) while NVMe
 * held its committed version, keeps that copy as its image when the hold's
 * write lands (copy_free()), and the index that image (and, since
 * tensor_commit_dead(), that it was committed dead): the rollback brings
 * back the bytes w held at the commit, its image first.  A second crash, the index now the
 * snapshot the first start wrote, keeps all that (a DEAD record of x's
 * committed version before its newer one's).  (Without the crash: test-dead.c.)
 */
static void test_commit_dead_after_restart(void **state) {
        Dir d = dir_new();
        Manager *m = start(&d);
        Tensor *dd, *w, *x;
        unsigned rolled, lost;
        char why[128];
        Job *j;

        j = book_fx_job(m, "j");
        dd = fixture_tensor(j, "d", MiB);
        w = fixture_tensor(j, "w", MiB);
        x = fixture_tensor(j, "x", MiB);
        fixture_host_data(m, dd, 0x41);
        book_fx_written(m, w, 0x51);
        fixture_host_data(m, x, 0x61);
        for (int i = 0; i < 2; i++) {
                Tensor *t = i ? x : dd;

                t->dead = true;                 /* as plan_drop_dead(): rank 0's plan overwrites it next */
                t->dead_rank = 1;
                for (int tier = 0; tier < TIERS; tier++)
                        copy_free(t, tier);
        }
        job_commit(j, 3);
        tensor_commit_dead(w, 1);               /* as ipc/commit.c for a tensor its plan's hold overwrites */
        assert_true(dd->commit_dead && x->commit_dead);
        write_only_pin(m, w, 0x52);
        assert_non_null(w->base);               /* the committed version's NVMe copy: its image */
        write_only_pin(m, x, 0x62);
        assert_false(x->dead);
        fixture_free(m);                        /* as a crash */

        m = start(&d);
        j = job_find(m->registry, "j");
        dd = book_fx_find(m, "j", "d");
        w = book_fx_find(m, "j", "w");
        x = book_fx_find(m, "j", "x");
        assert_true(dd->commit_dead && x->commit_dead);                 /* the DEAD records of the commit */
        fixture_free(m);                        /* again: this time from the snapshot the start wrote */
        m = start(&d);
        j = job_find(m->registry, "j");
        dd = book_fx_find(m, "j", "d");
        w = book_fx_find(m, "j", "w");
        x = book_fx_find(m, "j", "x");
        assert_true(dd->commit_dead && x->commit_dead);
        assert_int_equal(dd->commit_dead_rank, 1);
        assert_int_equal(x->commit_dead_rank, 1);
        assert_true(w->commit_dead);            /* (its image first: what a rollback brings back) */
        assert_non_null(w->base);
        assert_true(dd->dead && !x->dead);      /* d still dead; x lost: its newest data was in memory */
        assert_true(w->lost && x->lost);
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), 0);
        assert_int_equal(rolled, 3);
        assert_int_equal(lost, 0);
        assert_true(dd->dead && x->dead && !dd->lost && !x->lost);
        assert_int_equal(dd->dead_rank, 1);
        assert_int_equal(x->dead_rank, 1);
        assert_int_equal(fixture_op(m, OP_PIN, dd, LEVEL_HOST), -ENODATA);
        assert_int_equal(fixture_op(m, OP_PIN, x, LEVEL_HOST), -ENODATA);
        assert_false(w->lost);
        book_fx_check_bytes(m, w, 0x51);                /* what it held at the commit */
        write_only_pin(m, dd, 0x43);            /* a whole write mends a lost one */
        book_fx_check_bytes(m, dd, 0x43);
        fixture_free(m);
        dir_done(&d);
}

/*
 * A tensor written twice after its NVMe copy, then committed: the index has
 * a NEWER record of the first write only (no record while the newest is off
 * NVMe already), and the replay takes the newest it knows as the committed
 * version.  The commit records the version it commits: after a kill, the
 * committed version is the one written last (with the memory store, the copy
 * it brings back), not the one before, which a rollback would then have
 * called lost.
 */
static void test_commit_after_two_writes(void **state) {
        Dir d = dir_new();
        Manager *m = start(&d);
        Job *j = book_fx_job(m, "twice");
        Tensor *t = fixture_tensor(j, "t", MiB);
        uint64_t v;

        book_fx_written(m, t, 0x31);
        write_pin(m, t, 0x32);          /* the newest leaves NVMe: NEWER */
        write_pin(m, t, 0x33);          /* (no record) */
        v = t->version;
        job_commit(j, 4);
        assert_int_equal(t->commit_version, v);
        fixture_free(m);
        m = start(&d);
        t = book_fx_find(m, "twice", "t");
        assert_true(t->lost);           /* its newest was in memory, not kept here */
        assert_int_equal(t->version, v);
        assert_int_equal(t->commit_version, v);
        fixture_free(m);
        dir_done(&d);
}

/* A NEWER record (the newest data left NVMe for memory) is synced soon, not with the next write-down. */
static void test_newer_synced(void **state) {
        Dir d = dir_new();
        Manager *m = start(&d);
        Tensor *t;
        uint64_t seq;

        (void) state;
        t = fixture_tensor(book_fx_job(m, "j"), "a", MiB);
        book_fx_written(m, t, 0x11);
        FIXTURE_RUN_UNTIL(m, book_durable(m->book, m->book->seq));
        fixture_host_data(m, t, 0x12);          /* a NEWER record, and nothing after it */
        seq = m->book->seq;
        assert_false(book_durable(m->book, seq));
        FIXTURE_RUN_UNTIL(m, book_durable(m->book, seq));
        assert_true(book_durable(m->book, seq));
        fixture_free(m);
        dir_done(&d);
}

/*
 * A restored job whose run-time guarantee does not fit a host tier made smaller for one start is restored
 * all the same (it lingers, claiming nothing), and is there with its bytes once the capacity is back; it
 * was dropped from the index for good.
 */
static void test_restore_guarantee_too_big(void **state) {
        Dir d = dir_new();
        Manager *m = start(&d);
        QuotaRules one = QUOTA_RULES_NULL;
        char why[1024], warn[512], *err = NULL;
        Tensor *t;

        (void) state;
        t = fixture_tensor(book_fx_job(m, "j"), "a", MiB);
        book_fx_written(m, t, 0x11);
        assert_int_equal(quota_rules_parse_text(&one, "[quota]\njob = j\nhost_min = 12M\n", "x", &err), 0);
        assert_true(quota_store_set(m->quotas, &one.rules[0], false, why, sizeof(why), warn, sizeof(warn)) >= 0);
        quota_rules_clear(&one);
        fixture_free(m);
        d.host_cap = 8 * MiB;                   /* the operator shrinks host for one start */
        m = start(&d);
        assert_non_null(job_find(m->registry, "j"));
        fixture_free(m);
        d.host_cap = 0;                         /* and puts it back */
        m = start(&d);
        t = book_fx_find(m, "j", "a");
        assert_non_null(t);
        book_fx_check_bytes(m, t, 0x11);
        fixture_free(m);
        dir_done(&d);
}

/* A job of a user in 64 supplementary groups or more (quota.c keeps 64 and the primary one) replays. */
static void test_many_groups(void **state) {
        Dir d = dir_new();
        Manager *m = start(&d);
        gid_t groups[80];
        char why[1024];
        Tensor *t;
        Job *j;

        (void) state;
        t = fixture_tensor(book_fx_job(m, "victim"), "a", MiB);
        book_fx_written(m, t, 0x11);
        for (unsigned i = 0; i < 80; i++)
                groups[i] = 2000 + i;
        assert_int_equal(job_new(m->registry, "groupy", 1000, &j), 0);
        assert_int_equal(quota_job_created(m->quotas, j, 1000, groups, 80, true, why, sizeof(why)), 0);
        assert_int_equal(j->n_gids, QUOTA_GROUPS_MAX + 1);
        book_job(m->book, j);
        book_fx_written(m, fixture_tensor(j, "b", MiB), 0x22);
        fixture_free(m);
        m = start(&d);
        t = book_fx_find(m, "victim", "a");
        assert_false(t->lost);          /* the JOB record used to stop the replay: every tensor lost */
        book_fx_check_bytes(m, t, 0x11);
        j = job_find(m->registry, "groupy");
        assert_non_null(j);
        assert_int_equal(j->n_gids, QUOTA_GROUPS_MAX + 1);
        fixture_free(m);
        dir_done(&d);
}

/* Under ASan or valgrind 65537 jobs take minutes (past the suite's timeout); the plain build runs these. */
static bool instrumented(void) {
        return test_under_asan() || test_under_valgrind();
}

/* More jobs made and ended since the last snapshot than may live at once: only live ones are bounded. */
static void test_many_jobs(void **state) {
        Dir d;
        Manager *m;
        Tensor *t;

        (void) state;
        if (instrumented())
                skip();
        d = dir_new();
        m = start(&d);
        t = fixture_tensor(book_fx_job(m, "keep"), "a", MiB);
        book_fx_written(m, t, 0x11);
        for (unsigned i = 0; i < BOOK_JOBS_MAX + 1; i++)
                job_destroy(book_fx_job(m, "short"));
        fixture_free(m);
        m = start(&d);
        t = book_fx_find(m, "keep", "a");
        assert_non_null(t);
        assert_false(t->lost);
        book_fx_check_bytes(m, t, 0x11);
        fixture_free(m);
        dir_done(&d);
}

/* Records with no NVMe write among them (tensors made and freed) compact too: the file stays small. */
static void test_compact_without_nvme(void **state) {
        static char name[4001];
        char p[192];
        struct stat st;
        Manager *m;
        Tensor *t;
        Job *j;
        Dir d;

        (void) state;
        if (instrumented())
                skip();
        d = dir_new();
        m = start(&d);
        book_fx_written(m, fixture_tensor(book_fx_job(m, "j"), "a", MiB), 0x11);
        fixture_free(m);
        m = start(&d);
        t = book_fx_find(m, "j", "a");
        book_fx_check_bytes(m, t, 0x11);
        fixture_host_data(m, t, 0x12);          /* the newest in host only: NEWER */
        j = job_find(m->registry, "j");
        memset(name, 'n', 4000);
        /* about 8 KB of records a pair, 160 MB in all: ten times BOOK_COMPACT_MIN */
        for (unsigned i = 0; i < 20000; i++) {
                assert_int_equal(tensor_free(fixture_tensor(j, name, 4096)), 0);
                if (m->book->compact_wanted)    /* the sync completes on the loop, which compacts */
                        FIXTURE_RUN_UNTIL(m, !m->book->compact_wanted);
        }
        assert_int_equal(stat(index_path(&d, newer_file(&d), p, sizeof(p)), &st), 0);
        assert_true(st.st_size < 4 * (long long) BOOK_COMPACT_MIN);
        fixture_free(m);
        m = start(&d);
        t = book_fx_find(m, "j", "a");
        assert_true(t->lost);                   /* 0x12 was in host only: never 0x11 */
        fixture_free(m);
        dir_done(&d);
}

/* The index cannot be written (a full state filesystem): the next start never restores what it says. */
static void test_off_books_stale(void **state) {
        Dir d = dir_new();
        Manager *m = start(&d);
        char p[192];
        Tensor *t;
        int ro;

        (void) state;
        t = fixture_tensor(book_fx_job(m, "j"), "a", MiB);
        book_fx_written(m, t, 0x11);
        /* the next record write fails, as with ENOSPC */
        index_path(&d, m->book->cur, p, sizeof(p));
        ro = open(p, O_RDONLY | O_CLOEXEC);
        assert_true(ro >= 0);
        assert_true(dup2(ro, m->book->fd) >= 0);
        close(ro);
        fixture_host_data(m, t, 0x12);          /* its NEWER record cannot be written: off the books */
        assert_true(m->book->off_books);
        fixture_free(m);
        m = start(&d);                          /* space freed, restarted as the log says */
        assert_null(job_find(m->registry, "j"));        /* not found, as the log said; never 0x11 as current */
        fixture_free(m);
        dir_done(&d);
}

/* The index files as a SIGKILL now leaves them (the page cache has them), put back by killed_restart(). */
typedef struct Kept {
        char *data[2];
        size_t len[2];
} Kept;

static Kept index_keep(const Dir *d) {
        Kept k = { 0 };
        char p[192];

        for (unsigned i = 0; i < 2; i++)
                if (read_whole(index_path(d, i, p, sizeof(p)), &k.data[i], &k.len[i]) < 0)
                        k.data[i] = NULL;
        return k;
}

/* Stop @m, then start on the index files @k kept: as after a SIGKILL when they were kept. */
static Manager *killed_restart(Manager *m, Dir *d, Kept *k) {
        char p[192];

        fixture_free(m);
        for (unsigned i = 0; i < 2; i++) {
                index_path(d, i, p, sizeof(p));
                if (k->data[i])
                        write_whole(p, k->data[i], k->len[i]);
                else
                        (void) unlink(p);
                free(k->data[i]);
                k->data[i] = NULL;
        }
        return start(d);
}

/* After a restart @t is lost, or the version a client wrote and unpinned (@v, every byte @b): never older. */
static void never_older(Manager *m, Tensor *t, uint64_t v, uint8_t b) {
        assert_non_null(t);
        if (t->lost)
                return;
        assert_int_equal(t->version, v);
        book_fx_check_bytes(m, t, b);
}

static void on_pinned(Op *op, int status, const char *error) {
        assert_null(op->tensor->xfer);          /* no transfer reads what the pinner may write */
        on_done(op, status, error);
}

/*
 * A pin that may write waits while a write-down of the tensor reads its host copy.  Granted at
 * once, the client's write and dirty unpin (a NEWER record) came before the write-down's NVME
 * record of the version before: after a SIGKILL that version came back as current, not lost
 * (and its bytes, read from the copy while the client wrote it, a mix of both).
 */
static void test_write_pin_waits_for_write_down(void **state) {
        Dir d = dir_new();
        Manager *m = start(&d);
        Tensor *t = fixture_tensor(book_fx_job(m, "j"), "t", MiB);
        int ev = 0, pin = 0;
        uint64_t v, dl;
        Kept k;
        Op *op;

        (void) state;
        fixture_host_data(m, t, 0x11);
        v = t->version;
        assert_int_equal(op_submit(m->engine, OP_EVICT, t, LEVEL_NVME, on_done, NULL, &ev, NULL), 0);
        dl = fixture_deadline();
        while (!t->xfer && fixture_run_before(m, dl))
                ;
        assert_non_null(t->xfer);
        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_HOST, on_pinned, NULL, &pin, &op), 0);
        op->write = true;
        FIXTURE_RUN_UNTIL(m, pin);
        assert_int_equal(ev, 1);                /* the write-down ended first */
        fixture_fill(t, LEVEL_HOST, 0x22);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, true), 0);
        assert_int_equal(t->version, v + 1);
        k = index_keep(&d);
        m = killed_restart(m, &d, &k);
        never_older(m, book_fx_find(m, "j", "t"), v + 1, 0x22);
        fixture_free(m);
        dir_done(&d);
}

/*
 * Whatever wrote the tensor while a write-down of it ran (here a read pin, which shares the
 * transfer, unpinned dirty), the write-down records no version older than the tensor's newest:
 * its copy is stale, and goes (the evict writes the newest down).  An NVME record of the version
 * before, after the write's NEWER one, brought that version back as current after a SIGKILL.
 */
static void test_write_down_overtaken(void **state) {
        Dir d = dir_new();
        Manager *m = start(&d);
        Tensor *t = fixture_tensor(book_fx_job(m, "j"), "t", MiB);
        int ev = 0, pin = 0;
        uint64_t v, dl;
        Kept k;

        (void) state;
        fixture_host_data(m, t, 0x11);
        v = t->version;
        assert_int_equal(op_submit(m->engine, OP_EVICT, t, LEVEL_NVME, on_done, NULL, &ev, NULL), 0);
        dl = fixture_deadline();
        while (!t->xfer && fixture_run_before(m, dl))
                ;
        assert_non_null(t->xfer);
        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_HOST, on_done, NULL, &pin, NULL), 0);
        dl = fixture_deadline();
        while (!pin && t->xfer && fixture_run_before(m, dl))
                ;
        assert_int_equal(pin, 1);               /* granted while the write-down runs */
        assert_non_null(t->xfer);
        fixture_fill(t, LEVEL_HOST, 0x22);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, true), 0);
        assert_int_equal(t->version, v + 1);
        /* the first NVME record written after the unpin: what a SIGKILL then leaves */
        dl = fixture_deadline();
        while (t->xfer && !t->xfer->book_seq && fixture_run_before(m, dl))
                ;
        k = index_keep(&d);
        FIXTURE_RUN_UNTIL(m, ev);
        assert_true(copy_valid(t, LEVEL_NVME));
        assert_int_equal(t->copy[LEVEL_NVME].version, v + 1);
        m = killed_restart(m, &d, &k);
        never_older(m, book_fx_find(m, "j", "t"), v + 1, 0x22);
        fixture_free(m);
        dir_done(&d);
}

/* persist = yes, a run with persist = no (scratch, on the same extents), persist = yes again. */
static void test_scratch_between(void **state) {
        Dir d = dir_new();
        Manager *m = start(&d);

        (void) state;
        book_fx_written(m, fixture_tensor(book_fx_job(m, "j"), "a", MiB), 0x11);
        fixture_free(m);
        d.persist = false;
        m = start(&d);
        book_fx_written(m, fixture_tensor(book_fx_job(m, "s"), "x", MiB), 0x99);
        fixture_free(m);
        d.persist = true;
        m = start(&d);
        assert_null(job_find(m->registry, "j"));        /* its extents were reused: not restored as valid */
        fixture_free(m);
        dir_done(&d);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_restart_keeps_nvme),
                cmocka_unit_test(test_scratch),
                cmocka_unit_test(test_torn_tail),
                cmocka_unit_test(test_damage_mid_file),
                cmocka_unit_test(test_unknown_format),
                cmocka_unit_test(test_target_changed),
                cmocka_unit_test(test_commit_rollback),
                cmocka_unit_test(test_commit_dead_after_restart),
                cmocka_unit_test(test_commit_after_two_writes),
                cmocka_unit_test(test_newer_synced),
                cmocka_unit_test(test_restore_guarantee_too_big),
                cmocka_unit_test(test_many_groups),
                cmocka_unit_test(test_many_jobs),
                cmocka_unit_test(test_compact_without_nvme),
                cmocka_unit_test(test_off_books_stale),
                cmocka_unit_test(test_write_pin_waits_for_write_down),
                cmocka_unit_test(test_write_down_overtaken),
                cmocka_unit_test(test_scratch_between),
        };

        return fixture_main("book", tests, sizeof(tests) / sizeof(tests[0]));
}
