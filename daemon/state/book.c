/* SPDX-License-Identifier: MIT */
/* book.c: the NVMe index: which tensor's data lies in which extents, on disk, crash-consistent. */

/*
 * Theory of operation
 *
 * What tierd wrote to its NVMe targets outlives tierd: a restart (an
 * upgrade, a crash, SIGKILL, a power loss) finds every tensor whose data a
 * fence reported written to NVMe, and says which tensors it cannot find
 * (their newest data was in memory only), never handing out anything else.
 * The book is the index that makes it so: a journal of what changes, in
 * STATE_DIR/nvme-index.0 and nvme-index.1.
 *
 * A file is a header (format, generation, extent size, the targets: path,
 * size and identity) and records, each {len, type, magic, seq, payload,
 * crc32c}; the crc covers the whole record, seq grows by one per record.
 * The records:
 *
 *     JOB         key, uid, admin, groups, name      a job came to be
 *     JOB_GONE    key                                it ended for good
 *     TENSOR      key, job key, size, name           a tensor came to be
 *     TENSOR_GONE key                                it was destroyed
 *     NVME        key, version, extents (+crc32c)    its NVMe copy holds version
 *     NEWER       key, version                       its newest data is not on NVMe
 *     SNAPSHOT    (the file's first records are whole: end of them)
 *     CLEAN       tierd stopped cleanly after the record before it
 *     IMAGE       key, version, extents              its committed version's image
 *     COMMIT      job key, step                      a commit: images go
 *     BLANK       key                                rolled back to zeros
 *     DEAD        key, version, rank                 that version is dead: no bytes, none lost
 *
 * JOB carries the job's commit state (committing, step) and TENSOR its
 * committed version, for snapshots; commits are Job.committing's
 * (state/tensor.c): a tensor written after a commit keeps the committed
 * version's NVMe image until the next one, so that a rollback finds it.
 *
 * Records are written on the event loop with pwrite() at the file's end as
 * the change happens (a SIGKILL loses none: the page cache keeps them), and
 * made durable by fdatasync() on the book's thread, together with the NVMe
 * targets the records name (O_DIRECT writes may sit in a drive's volatile
 * cache; a file target's unwritten extents are converted by its
 * filesystem's journal).  An NVMe write-down is reported (its fence) only
 * once its NVME record and its data are durable: the engine parks the
 * transfer until book_durable() says so (engine/xfer.c), and every
 * earlier record is durable with it.  A NEWER record is not waited for: it
 * follows a client's dirty unpin, whose data was never promised to
 * survive; it asks for a sync at once (book_sync(), on the book's thread),
 * and until that is done (milliseconds) a power loss may bring back the
 * NVMe version it replaced.
 *
 * Reading (book_open()): the file of the higher generation whose records
 * up to its SNAPSHOT are whole is replayed; the first record that is short,
 * has a bad crc32c, or breaks the sequence ends it (a write cut short by a
 * crash: what came before is the last consistent state).  Records are
 * checked against bounds (names, extents within their target, counts)
 * before anything is allocated for them.  A tensor's NVMe copy is restored
 * when its last record is NVME and its target still is what it was; its
 * extents are reserved, and every read still checks their crc32c.  A tensor
 * whose last record is NEWER is restored as lost: reads fail and say why,
 * a whole write (TIER_WRITE) makes it whole again; one whose last is DEAD
 * (a clean stop or a commit found it dead: no bytes, its plan writes it
 * whole next, book_note_dead(), book_commit()) is restored dead, as it was.
 * A DEAD record of the version a COMMIT (before it) or a snapshot's TENSOR
 * (after it) names as committed says the tensor was dead at the commit
 * (Tensor.commit_dead): a rollback makes it dead again.  One its plan's hold
 * keeps as dead after the COMMIT, not dead yet, gets a DEAD record of the
 * committed version after the COMMIT and, in the same write, the record of
 * what it holds now again (NEWER or NVME, book_commit_dead()); a write cut
 * short leaves the DEAD record alone: the tensor comes back dead, its reads
 * refused until that hold writes it.
 *
 * Compaction: at start, and when the file has grown past BOOK_COMPACT_MIN
 * and four times its snapshot (at once after an NVME record, after the next
 * sync after any other, book_on_synced()), the live state is written as a snapshot to
 * the other file (generation + 1, ending in SNAPSHOT) and appending goes on
 * there.  A crash in the middle leaves the new file without its SNAPSHOT:
 * the old one is read.  Two files written in turn need no rename, so no
 * directory sync.
 *
 * A target whose fdatasync() fails fails the write-downs that sync was
 * for (book_sync_failed(): their copy goes, a NEWER record follows); the
 * book stays on.  Index writes or syncs that fail (a full state
 * filesystem) turn the book off: tierd says
 * so, sets both files aside (what they say stops being true with the next
 * write: a later start must not restore it), keeps running as scratch
 * (nothing of the NVMe tier survives the next restart) and reports the
 * parked transfers written, as if there were no book.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <systemd/sd-event.h>
#include <time.h>
#include <unistd.h>

#include "daemon/base/log.h"
#include "daemon/base/statefile.h"
#include "daemon/state/book-private.h"
#include "daemon/state/quota.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/fault.h"
#include "daemon/tiers/segpool.h"
#include "daemon/tiers/tier-nvme.h"
#include "proto/crc32c.h"
#include "proto/macro.h"
#include "util/time-util.h"

/* ---- small helpers ------------------------------------------------------------------------ */

/* A writer into Book.buf. */
typedef struct Wr {
        Book *b;
        size_t len;
        bool oom;
} Wr;

static void wr_bytes(Wr *w, const void *p, size_t n) {
        Book *b = w->b;

        if (w->oom)
                return;
        if (w->len + n > b->buf_cap) {
                size_t cap = MAX(b->buf_cap * 2, w->len + n + 256);
                char *nb = realloc(b->buf, cap);

                if (!nb) {
                        w->oom = true;
                        return;
                }
                b->buf = nb;
                b->buf_cap = cap;
        }
        memcpy(b->buf + w->len, p, n);
        w->len += n;
}

static void wr_u(Wr *w, uint64_t v, size_t n) {
        uint8_t x[8];

        for (size_t i = 0; i < n; i++)
                x[i] = (uint8_t) (v >> (8 * i));
        wr_bytes(w, x, n);
}

static void wr_str(Wr *w, const char *s) {
        size_t n = strlen(s);

        wr_u(w, n, 2);
        wr_bytes(w, s, n);
}

/* index-kill: SIGKILL ourselves at this step when a rule says so (tests only). */
void book_step(Book *b, BookStep step) {
        if (b->faults && fault_fire(b->faults, FAULT_INDEX_KILL, UINT32_MAX, FAULT_TARGET_ANY)) {
                log_warning("Injected fault index-kill: SIGKILL at NVMe index step %d (record %" PRIu64 ")",
                            (int) step, b->seq);
                (void) raise(SIGKILL);
        }
}

/* ---- writing ------------------------------------------------------------------------------ */

/* The header of a file of generation @gen: into Book.buf from 0; its length. */
static size_t header_build(Book *b, uint64_t gen, bool *oom) {
        Wr w = { b };
        uint32_t crc;

        wr_bytes(&w, BOOK_MAGIC, 8);
        wr_u(&w, BOOK_FORMAT, 4);
        wr_u(&w, gen, 8);
        wr_u(&w, (uint64_t) time(NULL), 8);    /* when it was made (for a person reading it) */
        wr_u(&w, b->nvme->extent_size, 8);
        wr_u(&w, b->nvme->n_targets, 4);
        for (unsigned i = 0; i < b->nvme->n_targets; i++) {
                const NvmeTarget *t = &b->nvme->targets[i];
                struct stat st = {};

                (void) fstat(t->fd, &st);
                wr_u(&w, t->size, 8);
                wr_u(&w, t->blockdev ? (uint64_t) st.st_rdev : (uint64_t) st.st_dev, 8);
                wr_u(&w, t->blockdev ? 0 : (uint64_t) st.st_ino, 8);
                wr_u(&w, t->blockdev, 1);
                wr_str(&w, t->path);
        }
        crc = crc32c(0, b->buf, w.len);
        wr_u(&w, crc, 4);
        *oom = w.oom;
        return w.len;
}

/* Write @len bytes at @off of @fd, whole. */
static int write_at(int fd, const void *p, size_t len, uint64_t off) {
        while (len > 0) {
                ssize_t n = pwrite(fd, p, len, (off_t) off);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return negative_errno();
                if (n == 0)
                        return -EIO;
                p = (const uint8_t *) p + n;
                len -= (size_t) n;
                off += (uint64_t) n;
        }
        return 0;
}

_Static_assert(BOOK_GROUPS_MAX >= QUOTA_GROUPS_MAX + 1, "a job's groups as quota.c keeps them must replay");

/*
 * Set the index file @path aside (statefile_set_aside()), else remove it:
 * what it says is no longer so (@why), and a replay would restore older
 * versions as current.  Renaming and removing take no room, so this works
 * on the full filesystem that turned the book off.
 */
static void void_file(const char *path, const char *why) {
        char aside[PATH_MAX];
        int r;

        r = statefile_set_aside(path, aside, sizeof(aside));
        if (r == -ENOENT)
                return;
        if (r >= 0)
                log_warning("NVMe index %s set aside as %s: %s", path, aside, why);
        else if (unlink(path) == 0)
                log_warning("NVMe index %s removed: %s", path, why);
        else if (errno != ENOENT)
                log_error_errno(errno, "Cannot set aside or remove the NVMe index %s (%m): the next start would "
                                "bring back older versions of what it lists; remove it before restarting tierd", path);
}

void book_void_files(const char *state_dir, const char *why) {
        char path[PATH_MAX];

        for (unsigned i = 0; i < 2; i++)
                if (snprintf(path, sizeof(path), "%s/" BOOK_FILE ".%u", state_dir, i) < (int) sizeof(path))
                        void_file(path, why);
}

static void book_off(Book *b, int r, const char *what) {
        if (b->off_books)
                return;
        b->off_books = true;
        log_error_errno(r, "Cannot write the NVMe index %s (%s): %m. tierd goes on WITHOUT it: what is on NVMe "
                        "now will not be found after tierd restarts. Free space in the state directory and "
                        "restart tierd.", b->path[b->cur], what);
        /*
         * What the files say stops being true with the next write (a version newer
         * than their NVMe one, extents handed out again): no later start may read them.
         */
        for (unsigned i = 0; i < 2; i++)
                void_file(b->path[i], "tierd went on without the index, which no longer says what is on NVMe");
        /* parked write-downs are released: without the book they count as written */
        if (b->durable_cb)
                b->durable_cb(b->durable_userdata);
}

/* Fill in the head and append the crc32c of the record built in Book.buf from @start, numbered @seq. */
static void rec_seal(Book *b, Wr *w, size_t start, unsigned type, uint64_t seq) {
        size_t len;
        uint8_t *h;

        if (w->oom)
                return;
        len = w->len - start - BOOK_REC_HEAD;
        h = (uint8_t *) b->buf + start;
        for (size_t i = 0; i < 4; i++)
                h[i] = (uint8_t) (len >> (8 * i));
        h[4] = (uint8_t) type;
        h[5] = (uint8_t) (type >> 8);
        h[6] = (uint8_t) BOOK_REC_MAGIC;
        h[7] = (uint8_t) (BOOK_REC_MAGIC >> 8);
        for (size_t i = 0; i < 8; i++)
                h[8 + i] = (uint8_t) (seq >> (8 * i));
        wr_u(w, crc32c(0, b->buf + start, w->len - start), 4);
}

/*
 * Append the @n records built in Book.buf from 0 (sealed, numbered on from Book.seq) to the file in one
 * write; the last one's sequence number, 0 if the book went off.  Not all or none: a write cut short (a
 * SIGKILL in a pwrite() across a page, index-torn, a crash of the machine before the sync) leaves the
 * first whole ones, and the replay takes them, stopping at the torn one.
 */
static uint64_t records_append(Book *b, Wr *w, unsigned n) {
        int r;

        if (w->oom) {
                book_off(b, -ENOMEM, "out of memory");
                return 0;
        }
        b->seq += n;
        book_step(b, STEP_RECORD);
        if (b->faults && fault_fire(b->faults, FAULT_INDEX_TORN, UINT32_MAX, FAULT_TARGET_ANY)) {
                log_warning("Injected fault index-torn: half of NVMe index record %" PRIu64 " written, then SIGKILL",
                            b->seq);
                (void) write_at(b->fd, b->buf, w->len / 2, b->off);
                (void) raise(SIGKILL);
        }
        r = write_at(b->fd, b->buf, w->len, b->off);
        if (r < 0) {
                book_off(b, r, "a record");
                return 0;
        }
        b->off += w->len;
        b->records += n;
        book_step(b, STEP_RECORDED);
        /*
         * Grown past compaction without an NVMe record (which compacts at once):
         * compact once this record is synced, back on the loop (book_on_synced()),
         * where the registry is whole; else an index of creates and frees only
         * would grow without end.
         */
        if (!b->compact_wanted && b->off >= BOOK_COMPACT_MIN && b->off >= 4 * b->snapshot_len) {
                b->compact_wanted = true;
                book_sync(b);
        }
        return b->seq;
}

/* The record built in Book.buf from 0 (its head left blank): finish and write it. */
static uint64_t record_write(Book *b, Wr *w, unsigned type) {
        rec_seal(b, w, 0, type, b->seq + 1);
        return records_append(b, w, 1);
}

static void rec_begin(Wr *w) {
        static const uint8_t blank[BOOK_REC_HEAD];

        wr_bytes(w, blank, sizeof(blank));
}

static void put_job(Wr *w, const Job *j) {
        wr_u(w, j->book_key, 8);
        wr_u(w, j->uid, 4);
        wr_u(w, j->admin, 1);
        wr_u(w, j->committing, 1);
        wr_u(w, j->commit_step, 8);
        wr_u(w, j->n_gids, 4);
        for (uint32_t i = 0; i < j->n_gids; i++)
                wr_u(w, j->gids[i], 4);
        wr_str(w, j->name);
}

static void put_tensor(Wr *w, const Tensor *t) {
        wr_u(w, t->book_key, 8);
        wr_u(w, t->job->book_key, 8);
        wr_u(w, t->size, 8);
        wr_u(w, t->commit_version, 8);
        wr_str(w, t->name);
}

static void put_extents(Wr *w, const Tensor *t, uint64_t version, const NvmeExtent *ext, uint32_t n) {
        wr_u(w, t->book_key, 8);
        wr_u(w, version, 8);
        wr_u(w, n, 4);
        for (uint32_t i = 0; i < n; i++) {
                wr_u(w, ext[i].target, 4);
                wr_u(w, ext[i].crc, 4);
                wr_u(w, ext[i].unit, 8);
        }
}

static void put_nvme(Wr *w, const Tensor *t, uint64_t version) {
        put_extents(w, t, version, t->copy[LEVEL_NVME].extents, t->copy[LEVEL_NVME].n_extents);
}

static void put_dead(Wr *w, const Tensor *t) {
        wr_u(w, t->book_key, 8);
        wr_u(w, t->version, 8);
        wr_u(w, t->dead_rank, 4);
}

/* Recording: a book that works, restored and not detached (tierd's exit forgets jobs, it does not end them). */
static bool book_on(const Book *b) {
        return b && !b->off_books && b->registry;
}

void book_detach(Book *b) {
        if (b)
                b->registry = NULL;
}

void book_job(Book *b, Job *j) {
        Wr w = { b };

        if (!book_on(b) || j->book_key)
                return;
        j->book_key = ++b->next_key;
        rec_begin(&w);
        put_job(&w, j);
        (void) record_write(b, &w, REC_JOB);
}

void book_job_gone(Book *b, Job *j) {
        Wr w = { b };

        if (!book_on(b) || !j->book_key)
                return;
        rec_begin(&w);
        wr_u(&w, j->book_key, 8);
        (void) record_write(b, &w, REC_JOB_GONE);
        j->book_key = 0;
        list_for_each_safe(n, tmp, &j->tensors) {
                Tensor *t = list_entry(n, Tensor, job_link);

                t->book_key = 0;
                t->book_state = BOOK_T_NONE;
        }
}

void book_tensor(Book *b, Tensor *t) {
        Wr w = { b };

        if (!book_on(b) || t->book_key || !t->job->book_key)
                return;
        t->book_key = ++b->next_key;
        t->book_state = BOOK_T_BLANK;
        rec_begin(&w);
        put_tensor(&w, t);
        (void) record_write(b, &w, REC_TENSOR);
}

void book_tensor_gone(Book *b, Tensor *t) {
        Wr w = { b };

        if (!book_on(b) || !t->book_key)
                return;
        rec_begin(&w);
        wr_u(&w, t->book_key, 8);
        (void) record_write(b, &w, REC_TENSOR_GONE);
        t->book_key = 0;
        t->book_state = BOOK_T_NONE;
}

static void book_maybe_compact(Book *b);

uint64_t book_nvme(Book *b, Tensor *t, uint64_t version) {
        const Copy *c = &t->copy[LEVEL_NVME];
        Wr w = { b };
        uint64_t seq;

        if (!book_on(b) || !t->book_key)
                return 0;
        rec_begin(&w);
        put_nvme(&w, t, version);
        seq = record_write(b, &w, REC_NVME);
        if (seq == 0)
                return 0;
        t->book_state = BOOK_T_NVME;
        t->book_version = version;
        for (uint32_t i = 0; i < c->n_extents; i++)
                b->dirty_targets |= 1ull << (c->extents[i].target % 64);
        book_maybe_compact(b);
        return seq;
}

void book_version(Book *b, Tensor *t) {
        Wr w = { b };

        if (!book_on(b) || !t->book_key || t->book_state == BOOK_T_NEWER)
                return;
        if (t->book_state == BOOK_T_BLANK && t->version == 0)
                return;         /* still zeros */
        if (t->book_state == BOOK_T_NVME && t->book_version == t->version &&
            (t->copy[LEVEL_NVME].state != COPY_ABSENT || t->xfer))
                return;         /* what the book says is still the newest (or being written there) */
        rec_begin(&w);
        wr_u(&w, t->book_key, 8);
        wr_u(&w, t->version, 8);
        if (record_write(b, &w, REC_NEWER)) {
                t->book_state = BOOK_T_NEWER;
                t->book_version = t->version;
                /*
                 * On the drive soon, not whenever the next write-down or commit syncs:
                 * until then a power loss brings back the NVMe version it replaced (the
                 * book's thread syncs, batched; nothing here waits for it).
                 */
                book_sync(b);
        }
}

void book_version_back(Book *b, Tensor *t) {
        if (t->book_state == BOOK_T_NEWER)
                t->book_state = BOOK_T_NONE;    /* the newer version it recorded is not the newest any more */
        book_version(b, t);
}

void book_image(Book *b, Tensor *t) {
        Wr w = { b };

        if (!book_on(b) || !t->book_key || !t->base)
                return;
        rec_begin(&w);
        put_extents(&w, t, t->commit_version, t->base, t->n_base);
        (void) record_write(b, &w, REC_IMAGE);
}

/* A DEAD record of @t's version now, which is dead: the next write of it says NEWER (book_version()). */
static void note_dead(Book *b, Tensor *t) {
        Wr w = { b };

        /* (NEWER: its copies went, book_version(); its NEWER record may be of a version before) */
        if (!t->book_key || !t->dead || t->version == 0 ||
            (t->book_state != BOOK_T_NEWER && t->book_state != BOOK_T_DEAD))
                return;
        if (t->book_state == BOOK_T_DEAD && t->book_version == t->version)
                return;         /* the index's last record of it says so already (one per commit was 40 bytes each) */
        rec_begin(&w);
        put_dead(&w, t);
        if (record_write(b, &w, REC_DEAD)) {
                t->book_state = BOOK_T_DEAD;
                t->book_version = t->version;
        }
}

void book_commit(Book *b, Job *j) {
        Wr w = { b };

        if (!book_on(b) || !j->book_key)
                return;
        /*
         * The replay takes each tensor's newest version as the committed one: a
         * tensor written again since its NEWER record (book_version() writes one
         * only when the newest leaves NVMe) gets one for the version committed.
         */
        list_for_each_safe(n, tmp, &j->tensors) {
                Tensor *t = list_entry(n, Tensor, job_link);

                if (t->book_key && (t->book_state == BOOK_T_NEWER || t->book_state == BOOK_T_DEAD) &&
                    t->book_version != t->version)
                        book_version_back(b, t);
                /*
                 * Dead at the commit (Tensor.commit_dead): the replay of the COMMIT takes that from the
                 * DEAD record before it, so that a rollback after a restart makes it dead again, as
                 * without the restart, rather than lost (a resumed job's gradients, written since)
                 */
                note_dead(b, t);
        }
        rec_begin(&w);
        wr_u(&w, j->book_key, 8);
        wr_u(&w, j->commit_step, 8);
        (void) record_write(b, &w, REC_COMMIT);
        book_sync(b);   /* a commit is what a resumed job comes back to: on the drive soon */
}

void book_commit_dead(Book *b, Tensor *t) {
        Wr w = { b };
        size_t second;
        bool nvme = t->book_state == BOOK_T_NVME;

        /* the index's last record of it is of its version now (book_commit()): NEWER, or NVME of its copy there */
        if (!book_on(b) || !t->book_key || !t->commit_dead || t->dead || t->version == 0 ||
            t->version != t->commit_version || t->book_version != t->version ||
            !(t->book_state == BOOK_T_NEWER || (nvme && copy_valid(t, LEVEL_NVME))))
                return;
        /*
         * A DEAD record of the committed version after its COMMIT makes the replay take it as committed
         * dead (as a snapshot's does), but also as dead now: the record after it says again what the
         * tensor holds, so that a start before its plan writes it finds its bytes as they are.  One write
         * for both, which a kill of tierd in between its calls cannot split; one cut short (see
         * records_append()) leaves the DEAD record alone: the tensor comes back dead, of its rank (its
         * NVMe copy forgotten, its reads refused until its plan's hold writes it whole), never other
         * bytes (test-book-dead.c test_commit_dead_pair_torn).
         */
        rec_begin(&w);
        wr_u(&w, t->book_key, 8);
        wr_u(&w, t->commit_version, 8);
        wr_u(&w, t->commit_dead_rank, 4);
        rec_seal(b, &w, 0, REC_DEAD, b->seq + 1);
        second = w.len;
        rec_begin(&w);
        if (nvme)
                put_nvme(&w, t, t->version);
        else {
                wr_u(&w, t->book_key, 8);
                wr_u(&w, t->version, 8);
        }
        rec_seal(b, &w, second, nvme ? REC_NVME : REC_NEWER, b->seq + 2);
        if (records_append(b, &w, 2))
                book_sync(b);   /* with its COMMIT (book_commit()) */
}

void book_note_dead(Book *b) {
        if (!book_on(b))
                return;
        list_for_each_safe(jn, jtmp, &b->registry->jobs) {
                Job *j = list_entry(jn, Job, link);

                list_for_each_safe(tn, ttmp, &j->tensors)
                        note_dead(b, list_entry(tn, Tensor, job_link));
        }
}

void book_restored(Book *b, Tensor *t) {
        Wr w = { b };

        if (!book_on(b) || !t->book_key)
                return;
        if (t->version > 0 && t->copy[LEVEL_NVME].state == COPY_RESIDENT) {
                (void) book_nvme(b, t, t->version);
                return;
        }
        rec_begin(&w);
        wr_u(&w, t->book_key, 8);
        if (record_write(b, &w, REC_BLANK))
                t->book_state = BOOK_T_BLANK;
}

/* ---- syncing, on the book's thread ------------------------------------------------------------ */

void *book_sync_thread(void *arg) {
        Book *b = arg;

        pthread_mutex_lock(&b->lock);
        for (;;) {
                uint64_t want, targets, failed = 0, one = 1;
                int fd, err = 0, terr = 0;

                while (!b->stop && b->want_seq <= b->done_seq)
                        pthread_cond_wait(&b->cond, &b->lock);
                if (b->want_seq <= b->done_seq)
                        break;          /* stopping, and nothing asked */
                want = b->want_seq;
                targets = b->want_targets;
                b->want_targets = 0;
                fd = b->syncing_fd = b->fd;
                pthread_mutex_unlock(&b->lock);

                /* the data first, then the records that name it */
                for (unsigned i = 0; i < b->nvme->n_targets && i < 64; i++)
                        if ((targets & (1ull << i)) && fdatasync(b->nvme->targets[i].fd) < 0 && errno != EINVAL) {
                                failed |= 1ull << i;
                                terr = -errno;
                        }
                if (fdatasync(fd) < 0)
                        err = -errno;

                pthread_mutex_lock(&b->lock);
                b->syncing_fd = -1;
                b->retired_fd = safe_close(b->retired_fd);
                if (failed) {
                        b->target_err_mask |= failed;
                        b->target_err = terr;
                        b->target_err_seq = MAX(b->target_err_seq, want);
                }
                if (err)
                        b->sync_error = err;
                else if (want > b->done_seq)
                        b->done_seq = want;
                (void) !write(b->efd, &one, sizeof(one));
        }
        pthread_mutex_unlock(&b->lock);
        return NULL;
}

int book_on_synced(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        Book *b = userdata;
        uint64_t n;
        int err;

        (void) !read(fd, &n, sizeof(n));
        pthread_mutex_lock(&b->lock);
        b->durable_seq = b->done_seq;
        err = b->sync_error;
        b->sync_error = 0;
        b->failed_targets = b->target_err_mask;
        b->failed_seq = b->target_err_seq;
        b->failed_error = b->target_err;
        b->target_err_mask = 0;
        pthread_mutex_unlock(&b->lock);
        /*
         * A target that could not make its writes durable fails them (the
         * engine asks book_sync_failed()); the index itself is fine: it stays.
         */
        for (unsigned i = 0; i < b->nvme->n_targets && i < 64; i++)
                if (b->failed_targets & (1ull << i))
                        log_error_errno(b->failed_error, "Cannot flush NVMe target %s (fdatasync: %m): what was "
                                        "written to it since the last flush counts as not written",
                                        b->nvme->targets[i].path);
        b->syncs++;
        if (err)
                book_off(b, err, "fdatasync");
        book_step(b, STEP_SYNCED);
        if (b->compact_wanted) {
                b->compact_wanted = false;
                if (book_on(b))
                        book_maybe_compact(b);
        }
        if (b->durable_cb)
                b->durable_cb(b->durable_userdata);
        b->failed_targets = 0;
        return 0;
}

int book_sync_failed(const Book *b, uint64_t seq, uint64_t targets) {
        if (!b || seq == 0 || seq > b->failed_seq || !(targets & b->failed_targets))
                return 0;
        return b->failed_error < 0 ? b->failed_error : -EIO;
}

void book_sync(Book *b) {
        if (!book_on(b))
                return;
        pthread_mutex_lock(&b->lock);
        if (b->want_seq < b->seq) {
                b->want_seq = b->seq;
                b->want_targets |= b->dirty_targets;
                b->dirty_targets = 0;
                pthread_cond_signal(&b->cond);
        }
        pthread_mutex_unlock(&b->lock);
        book_step(b, STEP_SYNC);
}

bool book_durable(const Book *b, uint64_t seq) {
        return !book_on(b) || seq == 0 || seq <= b->durable_seq;
}

void book_set_durable_cb(Book *b, void (*cb)(void *userdata), void *userdata) {
        if (!b)
                return;
        b->durable_cb = cb;
        b->durable_userdata = userdata;
}

void book_stats(const Book *b, uint64_t *ret_records, uint64_t *ret_syncs, uint64_t *ret_bytes) {
        *ret_records = b ? b->records : 0;
        *ret_syncs = b ? b->syncs : 0;
        *ret_bytes = b ? b->off : 0;
}

/* ---- snapshots ---------------------------------------------------------------------------------- */

/*
 * Everything the registry holds, as records after a header of generation
 * + 1, written to the other file; appending goes on there.  Built whole in
 * memory first (bounded by the tensors tierd holds), so a failure changes
 * nothing: the old file goes on.
 */
int book_snapshot(Book *b) {
        unsigned next = b->cur ^ 1;
        uint64_t gen = b->generation + 1, seq = b->seq;
        size_t hlen, len, half;
        bool oom = false;
        int fd, old_fd, r;
        Wr w = { b };

        book_step(b, STEP_SNAPSHOT);
        hlen = header_build(b, gen, &oom);
        if (oom)
                return -ENOMEM;
        w.len = hlen;
        /* records numbered on from the book's sequence (committed only once the file is written) */
#define SNAP_REC(type, body) do {                                                                       size_t start_ = w.len;                                                                  rec_begin(&w);                                                                          body;                                                                                   rec_seal(b, &w, start_, (type), ++seq);                                         } while (0)
        list_for_each_safe(jn, jtmp, &b->registry->jobs) {
                Job *j = list_entry(jn, Job, link);

                if (!j->book_key)
                        continue;
                SNAP_REC(REC_JOB, put_job(&w, j));
                list_for_each_safe(tn, ttmp, &j->tensors) {
                        Tensor *t = list_entry(tn, Tensor, job_link);

                        if (!t->book_key)
                                continue;
                        SNAP_REC(REC_TENSOR, put_tensor(&w, t));
                        /*
                         * dead at its commit: a DEAD record of the committed version first, written since
                         * or not (rolled back to it: dead again, its record NEWER, book_version()); one
                         * whose record is DEAD of that version has it below
                         */
                        if (t->commit_dead && t->commit_version > 0 &&
                            (t->book_state == BOOK_T_NVME || t->book_state == BOOK_T_NEWER ||
                             (t->book_state == BOOK_T_DEAD && t->version != t->commit_version)))
                                SNAP_REC(REC_DEAD, {
                                        wr_u(&w, t->book_key, 8);
                                        wr_u(&w, t->commit_version, 8);
                                        wr_u(&w, t->commit_dead_rank, 4);
                                });
                        if (t->base)
                                SNAP_REC(REC_IMAGE, put_extents(&w, t, t->commit_version, t->base, t->n_base));
                        if (t->book_state == BOOK_T_NVME)
                                SNAP_REC(REC_NVME, put_nvme(&w, t, t->book_version));
                        else if (t->book_state == BOOK_T_NEWER || t->book_state == BOOK_T_DEAD)
                                SNAP_REC(REC_NEWER, {
                                        wr_u(&w, t->book_key, 8);
                                        wr_u(&w, t->version, 8);
                                        t->book_version = t->version;
                                });
                        if (t->book_state == BOOK_T_DEAD)
                                SNAP_REC(REC_DEAD, put_dead(&w, t));
                }
        }
        SNAP_REC(REC_SNAPSHOT, (void) 0);
#undef SNAP_REC
        if (w.oom)
                return -ENOMEM;
        len = w.len;

        fd = open(b->path[next], O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
        if (fd < 0)
                return negative_errno();
        if (ftruncate(fd, 0) < 0) {
                r = negative_errno();
                safe_close(fd);
                return r;
        }
        half = hlen + (len - hlen) / 2;
        r = write_at(fd, b->buf, half, 0);
        if (r >= 0) {
                book_step(b, STEP_SNAPSHOT_HALF);
                r = write_at(fd, b->buf + half, len - half, half);
        }
        if (r < 0) {
                safe_close(fd);
                return r;
        }
        book_step(b, STEP_SNAPSHOT_DONE);

        /* appending moves over; the sync thread lets go of the old file (Book.retired_fd) */
        pthread_mutex_lock(&b->lock);
        old_fd = b->fd;
        b->fd = fd;
        if (b->syncing_fd == old_fd && old_fd >= 0) {
                safe_close(b->retired_fd);
                b->retired_fd = old_fd;
                old_fd = -1;
        }
        pthread_mutex_unlock(&b->lock);
        safe_close(old_fd);
        b->cur = next;
        b->generation = gen;
        b->records += seq - b->seq;
        b->seq = seq;
        b->off = len;
        b->snapshot_len = len;
        log_debug("NVMe index: a snapshot of %zu bytes in %s", len, b->path[next]);
        /* the new file durable with the next sync (what it names is on the drive already) */
        return 0;
}

static void book_maybe_compact(Book *b) {
        int r;

        if (b->off < BOOK_COMPACT_MIN || b->off < 4 * b->snapshot_len)
                return;
        r = book_snapshot(b);
        if (r < 0)
                log_warning_errno(r, "Cannot compact the NVMe index into %s, going on with %s (it grows): %m",
                                  b->path[b->cur ^ 1], b->path[b->cur]);
        else
                book_sync(b);
}

Book *book_free(Book *b, bool clean) {
        if (!b)
                return NULL;
        if (b->started) {
                if (clean && !b->off_books && b->fd >= 0) {
                        Wr w = { b };

                        rec_begin(&w);
                        (void) record_write(b, &w, REC_CLEAN);
                        b->want_targets |= b->dirty_targets;
                }
                pthread_mutex_lock(&b->lock);
                if (clean && !b->off_books && b->want_seq < b->seq) {
                        b->want_seq = b->seq;
                        b->want_targets |= b->dirty_targets;
                }
                b->stop = true;
                pthread_cond_signal(&b->cond);
                pthread_mutex_unlock(&b->lock);
                pthread_join(b->thread, NULL);
        }
        sd_event_source_disable_unref(b->source);
        safe_close(b->efd);
        safe_close(b->fd);
        safe_close(b->retired_fd);
        bk_forget(b);
        pthread_mutex_destroy(&b->lock);
        pthread_cond_destroy(&b->cond);
        free(b->path[0]);
        free(b->path[1]);
        free(b->buf);
        free(b);
        return NULL;
}
