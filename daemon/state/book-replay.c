/* SPDX-License-Identifier: MIT */
/* book-replay.c: the NVMe index read back at start: the newer whole file replayed, checked, restored. */

/*
 * Theory of operation: see book.c for the format.  book_open() reads both
 * files, replays the records of the newer one whose snapshot is whole into
 * tables (BkJob, BkTensor, by key), stopping at the first record that is cut
 * short, fails its crc32c or breaks the sequence, and checks every record
 * against bounds before allocating for it.  book_restore() then makes the
 * registry's jobs and tensors from the tables and hands over to book.c,
 * which writes a fresh snapshot and records from then on.
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

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/base/statefile.h"
#include "daemon/state/book-private.h"
#include "daemon/state/memstore.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/fault.h"
#include "util/escape.h"
#include "util/size.h"
#include "daemon/tiers/segpool.h"
#include "daemon/tiers/tier-nvme.h"
#include "proto/crc32c.h"
#include "proto/macro.h"
#include "util/time-util.h"

static int keymap_put(KeyMap *m, uint64_t key, uint32_t idx) {
        if (key == 0)
                return -EINVAL;
        if (m->cap == 0 || (m->n + 1) * 2 > m->cap) {
                size_t cap = m->cap ? m->cap * 2 : 256;
                uint64_t *k = calloc(cap, sizeof(uint64_t));
                uint32_t *x = calloc(cap, sizeof(uint32_t));

                if (!k || !x) {
                        free(k);
                        free(x);
                        return -ENOMEM;
                }
                for (size_t i = 0; i < m->cap; i++)
                        if (m->keys[i]) {
                                size_t h = (size_t) (m->keys[i] * 0x9e3779b97f4a7c15ull) & (cap - 1);

                                while (k[h])
                                        h = (h + 1) & (cap - 1);
                                k[h] = m->keys[i];
                                x[h] = m->idx[i];
                        }
                free(m->keys);
                free(m->idx);
                m->keys = k;
                m->idx = x;
                m->cap = cap;
        }
        for (size_t h = (size_t) (key * 0x9e3779b97f4a7c15ull) & (m->cap - 1);; h = (h + 1) & (m->cap - 1))
                if (m->keys[h] == 0 || m->keys[h] == key) {
                        m->n += m->keys[h] == 0;
                        m->keys[h] = key;
                        m->idx[h] = idx;
                        return 0;
                }
}

static int keymap_get(const KeyMap *m, uint64_t key) {
        if (m->cap == 0 || key == 0)
                return -1;
        for (size_t h = (size_t) (key * 0x9e3779b97f4a7c15ull) & (m->cap - 1);; h = (h + 1) & (m->cap - 1)) {
                if (m->keys[h] == key)
                        return (int) m->idx[h];
                if (m->keys[h] == 0)
                        return -1;
        }
}

static void keymap_done(KeyMap *m) {
        free(m->keys);
        free(m->idx);
        *m = (KeyMap) {};
}

/* A little-endian reader over a buffer: a read past its end sets bad. */
typedef struct Rd {
        const uint8_t *p;
        size_t left;
        bool bad;
} Rd;

static uint64_t rd_u(Rd *r, size_t n) {
        uint64_t v = 0;

        if (r->bad || r->left < n) {
                r->bad = true;
                return 0;
        }
        for (size_t i = 0; i < n; i++)
                v |= (uint64_t) r->p[i] << (8 * i);
        r->p += n;
        r->left -= n;
        return v;
}

/* A string of rd_u(2) bytes, NUL-free, at most @max: malloc()ed, or NULL (bad set). */
static char *rd_str(Rd *r, size_t max) {
        size_t n = (size_t) rd_u(r, 2);
        char *s;

        if (r->bad || n == 0 || n > max || n > r->left || memchr(r->p, 0, n)) {
                r->bad = true;
                return NULL;
        }
        s = strndup((const char *) r->p, n);
        if (!s) {
                r->bad = true;
                return NULL;
        }
        r->p += n;
        r->left -= n;
        return s;
}

/* ---- reading -------------------------------------------------------------------------------------- */

void bk_forget(Book *b) {
        for (size_t i = 0; i < b->n_jobs; i++) {
                free(b->jobs[i].groups);
                free(b->jobs[i].name);
        }
        for (size_t i = 0; i < b->n_tensors; i++) {
                free(b->tensors[i].ext);
                free(b->tensors[i].image);
                free(b->tensors[i].name);
        }
        for (size_t i = 0; i < b->n_targets; i++)
                free(b->targets[i].path);
        free(b->jobs);
        free(b->tensors);
        free(b->targets);
        b->jobs = NULL;
        b->tensors = NULL;
        b->targets = NULL;
        b->n_jobs = b->n_jobs_gone = b->n_tensors = b->n_targets = 0;
        keymap_done(&b->job_map);
        keymap_done(&b->tensor_map);
}

/* The whole file @path (at most BOOK_FILE_MAX bytes); -ENOENT, -EFBIG, -EINVAL (not a regular file). */
static int read_file(const char *path, uint8_t **ret, size_t *ret_len) {
        char *data = NULL;
        size_t len = 0;
        int r;

        r = statefile_read(path, BOOK_FILE_MAX, &data, &len);
        if (r < 0)
                return r;
        *ret = (uint8_t *) data;
        *ret_len = len;
        return 0;
}

typedef struct Parse {
        uint64_t generation;
        uint64_t extent_size;
        size_t header_len;
        bool snapshot_whole;
        bool clean;
        uint64_t end;           /* offset after the last whole record */
        uint64_t seq;
        uint64_t records;
        bool damaged;           /* a damaged record with whole ones after it */
} Parse;

/* Parse the header of @p/@len into b->targets.  -EBADMSG (not ours or damaged), -EPROTONOSUPPORT. */
static int parse_header(Book *b, const uint8_t *p, size_t len, Parse *ret, char *why, size_t why_size) {
        Rd r = { p, len };
        uint32_t format, n;
        size_t hlen;

        if (len < 8 || memcmp(p, BOOK_MAGIC, 8) != 0) {
                snprintf(why, why_size, "not an NVMe index (no magic)");
                return -EBADMSG;
        }
        rd_u(&r, 8);
        format = (uint32_t) rd_u(&r, 4);
        if (!r.bad && (format < BOOK_FORMAT_OLDEST || format > BOOK_FORMAT)) {
                snprintf(why, why_size, "format %u, and this tierd reads formats %u to %u only", format,
                         BOOK_FORMAT_OLDEST, BOOK_FORMAT);
                return -EPROTONOSUPPORT;
        }
        ret->generation = rd_u(&r, 8);
        rd_u(&r, 8);    /* created */
        ret->extent_size = rd_u(&r, 8);
        n = (uint32_t) rd_u(&r, 4);
        if (r.bad || n > BOOK_TARGETS_MAX) {
                snprintf(why, why_size, "a damaged header");
                return -EBADMSG;
        }
        b->targets = calloc(n ? n : 1, sizeof(BkTarget));
        if (!b->targets)
                return -ENOMEM;
        for (uint32_t i = 0; i < n; i++) {
                BkTarget *t = &b->targets[i];

                t->size = rd_u(&r, 8);
                t->dev = rd_u(&r, 8);
                t->ino = rd_u(&r, 8);
                t->blockdev = rd_u(&r, 1);
                t->path = rd_str(&r, BOOK_NAME_MAX);
                t->now = -1;
                if (r.bad)
                        break;
                b->n_targets++;
        }
        hlen = len - r.left;
        if (r.bad || rd_u(&r, 4) != crc32c(0, p, hlen) || r.bad) {
                snprintf(why, why_size, "a damaged header");
                return -EBADMSG;
        }
        ret->header_len = len - r.left;
        return 0;
}

static BkTensor *bk_tensor(Book *b, uint64_t key) {
        int i = keymap_get(&b->tensor_map, key);

        return i < 0 || b->tensors[i].gone ? NULL : &b->tensors[i];
}

static BkJob *bk_job(Book *b, uint64_t key) {
        int i = keymap_get(&b->job_map, key);

        return i < 0 || b->jobs[i].gone ? NULL : &b->jobs[i];
}

/* Apply one record; false when it makes no sense (the file is damaged from there on). */
/* Do @a and @b name the same extents, in order? */
static bool extents_same(const NvmeExtent *a, const NvmeExtent *b, uint32_t n) {
        for (uint32_t i = 0; i < n; i++)
                if (a[i].target != b[i].target || a[i].unit != b[i].unit)
                        return false;
        return true;
}

static bool apply(Book *b, unsigned type, Rd *r) {
        switch (type) {
        case REC_JOB: {
                BkJob j = { .key = rd_u(r, 8) };
                BkJob *n;

                j.uid = (uid_t) rd_u(r, 4);
                j.admin = rd_u(r, 1);
                j.committing = rd_u(r, 1);
                j.commit_step = rd_u(r, 8);
                j.n_groups = (uint32_t) rd_u(r, 4);
                if (r->bad || j.n_groups > BOOK_GROUPS_MAX || b->n_jobs - b->n_jobs_gone >= BOOK_JOBS_MAX ||
                    b->n_jobs >= BOOK_TENSORS_MAX || j.key == 0 ||
                    keymap_get(&b->job_map, j.key) >= 0)
                        return false;
                j.groups = calloc(j.n_groups + 1, sizeof(gid_t));
                if (!j.groups)
                        return false;
                for (uint32_t i = 0; i < j.n_groups; i++)
                        j.groups[i] = (gid_t) rd_u(r, 4);
                j.name = rd_str(r, BOOK_NAME_MAX);
                if (r->bad || r->left != 0) {
                        free(j.groups);
                        free(j.name);
                        return false;
                }
                n = realloc(b->jobs, (b->n_jobs + 1) * sizeof(BkJob));
                if (!n || keymap_put(&b->job_map, j.key, (uint32_t) b->n_jobs) < 0) {
                        if (n)
                                b->jobs = n;
                        free(j.groups);
                        free(j.name);
                        return false;
                }
                b->jobs = n;
                b->jobs[b->n_jobs++] = j;
                return true;
        }
        case REC_JOB_GONE: {
                BkJob *j = bk_job(b, rd_u(r, 8));

                if (r->bad || r->left != 0 || !j)
                        return false;
                b->n_jobs_gone += !j->gone;
                j->gone = true;
                for (size_t i = 0; i < b->n_tensors; i++)
                        if (b->tensors[i].job_key == j->key)
                                b->tensors[i].gone = true;
                return true;
        }
        case REC_TENSOR: {
                BkTensor t = { .key = rd_u(r, 8) };
                BkTensor *n;

                t.job_key = rd_u(r, 8);
                t.size = rd_u(r, 8);
                t.commit_version = rd_u(r, 8);
                if (r->bad || t.key == 0 || !bk_job(b, t.job_key) || b->n_tensors >= BOOK_TENSORS_MAX ||
                    keymap_get(&b->tensor_map, t.key) >= 0)
                        return false;
                t.name = rd_str(r, BOOK_NAME_MAX);
                if (r->bad || r->left != 0) {
                        free(t.name);
                        return false;
                }
                n = realloc(b->tensors, (b->n_tensors + 1) * sizeof(BkTensor));
                if (!n || keymap_put(&b->tensor_map, t.key, (uint32_t) b->n_tensors) < 0) {
                        if (n)
                                b->tensors = n;
                        free(t.name);
                        return false;
                }
                b->tensors = n;
                b->tensors[b->n_tensors++] = t;
                return true;
        }
        case REC_TENSOR_GONE: {
                BkTensor *t = bk_tensor(b, rd_u(r, 8));

                if (r->bad || r->left != 0 || !t)
                        return false;
                t->gone = true;
                return true;
        }
        case REC_NVME:
        case REC_IMAGE: {
                BkTensor *t = bk_tensor(b, rd_u(r, 8));
                uint64_t version = rd_u(r, 8);
                uint32_t n = (uint32_t) rd_u(r, 4);
                NvmeExtent *e;

                /* every extent of the tensor, and 16 bytes each in the record */
                if (r->bad || !t || version == 0 || n == 0 || (uint64_t) n * 16 != r->left ||
                    b->nvme->extent_size == 0 || n != DIV_ROUND_UP(t->size, b->nvme->extent_size))
                        return false;
                e = calloc(n, sizeof(NvmeExtent));
                if (!e)
                        return false;
                for (uint32_t i = 0; i < n; i++) {
                        e[i].target = (uint32_t) rd_u(r, 4);
                        e[i].crc = (uint32_t) rd_u(r, 4);
                        e[i].unit = rd_u(r, 8);
                        if (e[i].target >= b->n_targets || e[i].unit >= b->targets[e[i].target].size /
                            b->nvme->extent_size) {
                                free(e);
                                return false;
                        }
                }
                if (type == REC_IMAGE) {
                        free(t->image);
                        t->image = e;
                        t->n_image = n;
                        t->commit_version = version;
                        return true;
                }
                free(t->ext);
                t->ext = e;
                t->n_ext = n;
                t->nvme_version = version;
                t->newest = version;
                t->dead = false;
                return true;
        }
        case REC_COMMIT: {
                BkJob *j = bk_job(b, rd_u(r, 8));
                uint64_t step = rd_u(r, 8);

                if (r->bad || r->left != 0 || !j)
                        return false;
                j->committing = true;
                j->commit_step = step;
                for (size_t i = 0; i < b->n_tensors; i++) {
                        BkTensor *t = &b->tensors[i];

                        if (t->gone || t->job_key != j->key)
                                continue;
                        t->image = mfree(t->image);
                        t->n_image = 0;
                        t->commit_version = t->newest;
                        t->commit_dead = t->dead;
                        t->commit_dead_rank = t->dead ? t->dead_rank : 0;
                }
                return true;
        }
        case REC_BLANK: {
                BkTensor *t = bk_tensor(b, rd_u(r, 8));

                if (r->bad || r->left != 0 || !t)
                        return false;
                t->ext = mfree(t->ext);
                t->n_ext = 0;
                t->nvme_version = 0;
                t->newest = 0;
                t->dead = false;
                return true;
        }
        case REC_DEAD: {
                BkTensor *t = bk_tensor(b, rd_u(r, 8));
                uint64_t version = rd_u(r, 8);
                uint32_t rank = (uint32_t) rd_u(r, 4);

                if (r->bad || r->left != 0 || !t || version == 0)
                        return false;
                /* its newest version (a NEWER record may be of one before), with no bytes anywhere */
                if (version < t->newest)
                        return true;    /* (written since) */
                t->ext = mfree(t->ext);
                t->n_ext = 0;
                t->nvme_version = 0;
                t->newest = version;
                t->dead = true;
                t->dead_rank = rank;
                /* the committed version (book_commit(), or a snapshot's record of it before the newer ones) */
                if (version == t->commit_version) {
                        t->commit_dead = true;
                        t->commit_dead_rank = rank;
                }
                return true;
        }
        case REC_NEWER: {
                BkTensor *t = bk_tensor(b, rd_u(r, 8));
                uint64_t version = rd_u(r, 8);

                if (r->bad || r->left != 0 || !t)
                        return false;
                t->ext = mfree(t->ext);
                t->n_ext = 0;
                t->nvme_version = 0;
                t->newest = MAX(version, 1u);
                t->dead = false;
                return true;
        }
        case REC_SNAPSHOT:
        case REC_CLEAN:
                return r->left == 0;
        default:
                return false;
        }
}

/* Is there a whole record whose crc32c holds at @off of @p/@len?  Its payload length and seq then. */
static bool record_at(const uint8_t *p, size_t len, size_t off, uint64_t *ret_n, unsigned *ret_type,
                      uint64_t *ret_seq) {
        const uint8_t *h = p + off;
        Rd hr = { h, BOOK_REC_HEAD };
        uint64_t n;
        unsigned magic;

        if (off + BOOK_REC_HEAD + 4 > len)
                return false;
        n = rd_u(&hr, 4);
        *ret_type = (unsigned) rd_u(&hr, 2);
        magic = (unsigned) rd_u(&hr, 2);
        *ret_seq = rd_u(&hr, 8);
        if (magic != BOOK_REC_MAGIC || n > len - off - BOOK_REC_HEAD - 4)
                return false;
        *ret_n = n;
        return crc32c(0, h, BOOK_REC_HEAD + n) == (uint32_t) (h[BOOK_REC_HEAD + n] |
                                                             (uint32_t) h[BOOK_REC_HEAD + n + 1] << 8 |
                                                             (uint32_t) h[BOOK_REC_HEAD + n + 2] << 16 |
                                                             (uint32_t) h[BOOK_REC_HEAD + n + 3] << 24);
}

/*
 * Replay @p/@len (a whole file) into the book's tables.  The records stop
 * at the first that is cut short or does not check: @ret says where, and
 * whether the snapshot before them was whole.  A record that does not
 * check with whole ones after it is no write cut short but damage (a bad
 * sector, a hand): @ret->damaged, and what it said is unknown.
 */
static int parse_file(Book *b, const uint8_t *p, size_t len, Parse *ret, char *why, size_t why_size) {
        size_t off;
        int r;

        *ret = (Parse) {};
        r = parse_header(b, p, len, ret, why, why_size);
        if (r < 0)
                return r;
        if (ret->extent_size != b->nvme->extent_size) {
                snprintf(why, why_size, "written with extents of %" PRIu64 " bytes, [nvme] extent_size is %" PRIu64
                         " now", ret->extent_size, b->nvme->extent_size);
                return -ESTALE;
        }
        off = ret->header_len;
        ret->end = off;
        for (;;) {
                uint64_t n, seq;
                unsigned type;
                Rd body;

                if (!record_at(p, len, off, &n, &type, &seq) || (ret->seq && seq != ret->seq + 1))
                        break;
                body = (Rd) { p + off + BOOK_REC_HEAD, n };
                if (!apply(b, type, &body))
                        break;
                ret->seq = seq;
                ret->records++;
                off += BOOK_REC_HEAD + n + 4;
                ret->end = off;
                if (type == REC_SNAPSHOT)
                        ret->snapshot_whole = true;
                ret->clean = type == REC_CLEAN;
        }
        /* whole records further on: the one that stopped us was damaged, not the last one written */
        for (size_t at = off + 1; at + BOOK_REC_HEAD + 4 <= len; at++) {
                uint64_t n, seq;
                unsigned type;

                if (record_at(p, len, at, &n, &type, &seq) && seq > ret->seq) {
                        ret->damaged = true;
                        break;
                }
        }
        return 0;
}

/* Match the file's targets to the configured ones: same path, size and identity. */
static void match_targets(Book *b) {
        for (size_t i = 0; i < b->n_targets; i++) {
                BkTarget *bt = &b->targets[i];

                for (unsigned k = 0; k < b->nvme->n_targets; k++) {
                        const NvmeTarget *t = &b->nvme->targets[k];
                        struct stat st;

                        if (strcmp(t->path, bt->path) != 0)
                                continue;
                        if (fstat(t->fd, &st) < 0 || t->size != bt->size || t->blockdev != bt->blockdev ||
                            (t->blockdev ? (uint64_t) st.st_rdev != bt->dev :
                             (uint64_t) st.st_dev != bt->dev || (uint64_t) st.st_ino != bt->ino))
                                log_warning("NVMe target %s is not the one the NVMe index knows (size %" PRIu64
                                            " then, %" PRIu64 " now; or another file or device): the tensors "
                                            "stored on it are lost", t->path, bt->size, t->size);
                        else
                                bt->now = (int) k;
                        break;
                }
                if (bt->now < 0)
                        log_warning("NVMe target %s of the NVMe index is no longer configured, or changed: the "
                                    "tensors stored on it are lost", bt->path);
        }
}

int book_start_thread(Book *b) {
        int r;

        b->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (b->efd < 0)
                return negative_errno();
        r = pthread_create(&b->thread, NULL, book_sync_thread, b);
        if (r != 0)
                return -r;
        b->started = true;
        return 0;
}

/* An index file not read (damaged, not tierd's, a leftover) goes aside; --check-config says a start moves it. */
static void index_set_aside(const Book *b, const char *path) {
        char aside[PATH_MAX];

        if (b->check)
                log_warning("NVMe index %s: a start sets it aside (renames it), --check-config leaves it", path);
        else if (statefile_set_aside(path, aside, sizeof(aside)) >= 0)
                log_warning("NVMe index %s set aside as %s", path, aside);
}

/*
 * Read STATE_DIR/nvme-index.{0,1} into @data/@len and judge them (@parse):
 * *@ret_pick, the newer one whose snapshot is whole, or -1.  Refused (-ESTALE,
 * -EPROTONOSUPPORT, *@ret_error saying what to do) where a start must not go
 * on.  What is no index (damaged, too large) is set aside, except in check
 * mode (Book.check: tierd --check-config), which changes nothing.
 */
static int book_read(Book *b, uint8_t *data[2], size_t len[2], Parse parse[2], int *ret_pick, char **ret_error) {
        bool stale[2] = {};
        int r, pick = -1;
        char why[512] = "";

        /* the newer file whose snapshot is whole; the other is only looked at for its generation */
        for (unsigned i = 0; i < 2; i++) {
                r = read_file(b->path[i], &data[i], &len[i]);
                if (r == -ENOENT)
                        continue;
                if (r == -EFBIG || r == -EINVAL) {
                        log_warning("NVMe index %s is %s, not read", b->path[i],
                                    r == -EFBIG ? "larger than any index tierd writes" : "not a regular file");
                        index_set_aside(b, b->path[i]);
                        continue;
                }
                if (r < 0) {
                        if (asprintf(ret_error, "Cannot read the NVMe index %s: %s", b->path[i], strerror(-r)) < 0)
                                *ret_error = NULL;
                        return r;
                }
                bk_forget(b);
                r = parse_file(b, data[i], len[i], &parse[i], why, sizeof(why));
                if (r == -EPROTONOSUPPORT) {
                        if (asprintf(ret_error, "The NVMe index %s is of %s: it was written by a newer tierd. "
                                     "Nothing was changed. Start the tierd that wrote it, or move %s and %s aside "
                                     "(the tensors it lists are then lost), or set [nvme] persist = no",
                                     b->path[i], why, b->path[0], b->path[1]) < 0)
                                *ret_error = NULL;
                        return r;
                }
                if (r == -ENOMEM)
                        return r;
                if (r == -ESTALE) {
                        /* another extent_size: judged below, once it is known whether this file is the newer */
                        stale[i] = true;
                        continue;
                }
                if (r < 0 || !parse[i].snapshot_whole) {
                        log_warning("NVMe index %s: %s, not read", b->path[i],
                                    r < 0 ? why : "its snapshot is not whole (a crash while it was written)");
                        parse[i].generation = r < 0 ? 0 : parse[i].generation;
                        parse[i].snapshot_whole = false;
                        if (r == -EBADMSG)
                                index_set_aside(b, b->path[i]);
                        continue;
                }
                if (pick < 0 || parse[i].generation > parse[pick].generation)
                        pick = (int) i;
        }
        bk_forget(b);
        /*
         * The newer index written with another [nvme] extent_size: its tensors are all on the targets, in
         * extents of that size.  A changed configuration, not damage: refused before anything changes
         * (setting it aside lost every tensor it listed), for the operator to put the size back or give up
         * the tensors.  An older file of another size is a leftover: set aside.
         */
        for (unsigned i = 0; i < 2; i++) {
                if (!stale[i])
                        continue;
                if (pick < 0 || parse[i].generation > parse[pick].generation) {
                        if (asprintf(ret_error, "The NVMe index %s was written with [nvme] extent_size = %s; it "
                                     "is %s now. Nothing was changed. Set extent_size = %s again to find the "
                                     "tensors it lists, or move %s and %s aside (those tensors are then lost), "
                                     "or set [nvme] persist = no", b->path[i],
                                     FORMAT_SIZE_EXACT(parse[i].extent_size), FORMAT_SIZE_EXACT(b->nvme->extent_size),
                                     FORMAT_SIZE_EXACT(parse[i].extent_size), b->path[0], b->path[1]) < 0)
                                *ret_error = NULL;
                        r = -ESTALE;
                        return r;
                }
                log_warning("NVMe index %s: written with extents of %" PRIu64 " bytes, [nvme] extent_size is %"
                            PRIu64 " now, and older than %s, not read", b->path[i], parse[i].extent_size,
                            b->nvme->extent_size, b->path[pick]);
                index_set_aside(b, b->path[i]);
        }
        *ret_pick = pick;
        return 0;
}
/* A book of nothing yet, for the index files of @state_dir.  NULL: out of memory. */
static Book *book_new(const char *state_dir, NvmeTier *nvme, FaultSet *faults) {
        Book *b = calloc(1, sizeof(*b));

        if (!b)
                return NULL;
        b->fd = b->efd = b->syncing_fd = b->retired_fd = -1;
        b->nvme = nvme;
        b->faults = faults;
        pthread_mutex_init(&b->lock, NULL);
        pthread_cond_init(&b->cond, NULL);
        if (asprintf(&b->path[0], "%s/" BOOK_FILE ".0", state_dir) < 0 ||
            asprintf(&b->path[1], "%s/" BOOK_FILE ".1", state_dir) < 0)
                return book_free(b, false);
        return b;
}

int book_check(const char *state_dir, uint64_t extent_size, char **ret_error) {
        NvmeTier nvme = { .extent_size = extent_size };
        uint8_t *data[2] = {};
        size_t len[2] = {};
        Parse parse[2] = {};
        int r, pick;
        Book *b;

        b = book_new(state_dir, &nvme, NULL);
        if (!b)
                return -ENOMEM;
        b->check = true;
        r = book_read(b, data, len, parse, &pick, ret_error);
        free(data[0]);
        free(data[1]);
        book_free(b, false);
        return r;
}

int book_open(const char *state_dir, NvmeTier *nvme, sd_event *event, FaultSet *faults, Book **ret,
              char **ret_error) {
        Book *b;
        uint8_t *data[2] = {};
        size_t len[2] = {};
        Parse parse[2] = {};
        int r, pick = -1;
        char why[512] = "";

        b = book_new(state_dir, nvme, faults);
        if (!b)
                return -ENOMEM;

        r = book_read(b, data, len, parse, &pick, ret_error);
        if (r < 0)
                goto fail;
        if (pick >= 0) {
                r = parse_file(b, data[pick], len[pick], &parse[pick], why, sizeof(why));
                if (r < 0)
                        goto fail;
                b->generation = parse[pick].generation;
                b->cur = (unsigned) pick;
                b->seq = parse[pick].seq;
                b->found.records = parse[pick].records;
                b->found.torn_bytes = len[pick] - parse[pick].end;
                b->found.clean = parse[pick].clean;
                b->found.damaged = parse[pick].damaged;
                if (b->found.damaged)
                        log_error("NVMe index %s: a record after the %" PRIu64 "th is damaged and whole ones follow it "
                                  "(a bad sector, or the file was edited): what it said is unknown, so every tensor "
                                  "it lists is treated as lost", b->path[pick], parse[pick].records);
                b->found.generation = (unsigned) parse[pick].generation;
                match_targets(b);
                for (size_t i = 0; i < b->n_tensors; i++)
                        b->next_key = MAX(b->next_key, b->tensors[i].key);
                for (size_t i = 0; i < b->n_jobs; i++)
                        b->next_key = MAX(b->next_key, b->jobs[i].key);
        } else {
                /* the next snapshot goes to file 0 */
                b->cur = 1;
                b->generation = MAX(parse[0].generation, parse[1].generation);
        }
        free(data[0]);
        free(data[1]);
        data[0] = data[1] = NULL;

        r = book_start_thread(b);
        if (r < 0)
                goto fail;
        r = sd_event_add_io(event, &b->source, b->efd, EPOLLIN, book_on_synced, b);
        if (r < 0)
                goto fail;
        (void) sd_event_source_set_description(b->source, "nvme-index-sync");
        *ret = b;
        return 0;
fail:
        free(data[0]);
        free(data[1]);
        book_free(b, false);
        return r;
}

/*
 * Claim @n extents (targets numbered as in the file) in the targets as they
 * are now, each once, rewriting their target numbers; false (nothing
 * claimed) when one lies on a target that changed or is claimed already.
 */
static bool reserve_extents(Book *b, NvmeExtent *ext, uint32_t n) {
        for (uint32_t i = 0; i < n; i++) {
                int now = b->targets[ext[i].target].now;

                if (now < 0 || extent_alloc_reserve(&b->nvme->targets[now].extents, ext[i].unit, 1) < 0) {
                        for (uint32_t k = 0; k < i; k++)
                                (void) extent_alloc_put(&b->nvme->targets[ext[k].target].extents, ext[k].unit, 1);
                        return false;
                }
                ext[i].target = (uint32_t) now;
        }
        return true;
}

/*
 * A name an older tierd took holds control characters (C1: 71551ef refuses
 * them), bidirectional format characters (U+202E: refused since) or is not
 * UTF-8: no client could name it again (a Hello, an open by
 * name are refused), and tierctl would print it escaped.  It is restored under
 * that escaped text (text_escape_name(): "evil\u009b31m"), which a client can
 * name, and said so; cut to max_name with a hash of the old name ("~1f2e3d4c")
 * when too long (the index takes no longer name) or taken by a real name (of
 * job @j, or a job).  -EEXIST: that is taken too (the caller drops it).
 * *@ret_was (may be NULL): the old name when it was changed (malloc()ed), else NULL.
 */
static int restore_name(Registry *reg, Job *j, char **name, char **ret_was) {
        char *e = NULL;

        if (!text_needs_escape(*name))
                return 0;
        for (int tagged = 0; tagged < 2; tagged++) {
                free(e);
                e = text_escape_name(*name, reg->config->max_name, tagged);
                if (!e)
                        return -ENOMEM;
                if (!(j ? (void *) tensor_find_name(j, e) : (void *) job_find(reg, e)))
                        break;
                if (tagged) {
                        free(e);
                        return -EEXIST;
                }
        }
        if (j)
                log_warning("Tensor of job '%s' restored from the NVMe index as '%s': its name, from an older tierd, "
                            "holds control or bidirectional format characters or is not UTF-8, which tierd "
                            "refuses now", j->name, e);
        else
                log_warning("Job restored from the NVMe index as '%s': its name, from an older tierd, holds control "
                            "or bidirectional format characters or is not UTF-8, which tierd refuses now; its "
                            "clients attach under the new name (tierctl detach ends it)", e);
        if (ret_was)
                *ret_was = *name;
        else
                free(*name);
        *name = e;
        return 0;
}

int book_restore(Book *b, Registry *reg, int (*job_made)(Job *j, const char *was, gid_t gid, const gid_t *groups,
                                                         size_t n, bool admin, void *userdata),
                 void *userdata, BookFound *ret_found) {
        BookFound *f = &b->found;
        int r;

        /*
         * b->registry stays NULL meanwhile: what is made here is not recorded again.  Every job and
         * tensor first, then their copies: the memory store must know which of its records no tensor
         * takes before it puts any copy back (memstore_prepare()).
         */
        for (size_t k = 0; k < 2 * b->n_jobs; k++) {
                BkJob *bj = &b->jobs[k % b->n_jobs];
                _cleanup_free_ char *was = NULL;
                Job *j = NULL;

                /* the names restore_name() changes last: a name as it was keeps its job */
                if (bj->gone || text_needs_escape(bj->name) != (k >= b->n_jobs))
                        continue;
                r = restore_name(reg, NULL, &bj->name, &was);
                if (r >= 0)
                        r = job_new(reg, bj->name, bj->uid, &j);
                if (r >= 0)
                        r = job_made(j, was, bj->n_groups ? bj->groups[0] : (gid_t) -1, bj->n_groups ? bj->groups + 1 : NULL,
                                     bj->n_groups ? bj->n_groups - 1 : 0, bj->admin, userdata);
                if (r < 0) {
                        log_warning_errno(r, "Cannot restore job '%s' from the NVMe index, its tensors are lost: %m",
                                          bj->name);
                        if (j)
                                job_destroy(j);
                        continue;
                }
                j->book_key = bj->key;
                j->committing = bj->committing;
                j->commit_step = bj->commit_step;
                bj->made = j;
                /* the names restore_name() changes last: a name as it was keeps its tensor */
                for (size_t tk = 0; tk < 2 * b->n_tensors; tk++) {
                        BkTensor *bt = &b->tensors[tk % b->n_tensors];
                        Tensor *t;

                        if (bt->gone || bt->job_key != bj->key || text_needs_escape(bt->name) != (tk >= b->n_tensors))
                                continue;
                        r = restore_name(reg, j, &bt->name, NULL);
                        if (r >= 0)
                                r = tensor_new(j, bt->name, bt->size, &t);
                        if (r == -EMFILE) {
                                /* (not "Too many open files": the limit is tierd's own) */
                                log_warning("Cannot restore tensor '%s' of job '%s': the job has [limits] "
                                            "max_tensors (%u) tensors already, fewer than the NVMe index holds; "
                                            "the tensor and its data are dropped. Keep max_tensors at least as "
                                            "high as the most tensors a job has across a restart",
                                            bt->name, bj->name, reg->config->max_tensors);
                                continue;
                        }
                        if (r < 0) {
                                log_warning_errno(r, "Cannot restore tensor '%s' of job '%s': %m", bt->name, bj->name);
                                continue;
                        }
                        t->book_key = bt->key;
                        t->commit_version = bt->commit_version;
                        t->commit_dead = bt->commit_dead;
                        t->commit_dead_rank = bt->commit_dead_rank;
                        bt->made = t;
                        bj->kept++;
                }
        }
        memstore_prepare(reg->memstore, reg);
        for (size_t ji = 0; ji < b->n_jobs; ji++) {
                BkJob *bj = &b->jobs[ji];
                Job *j = bj->made;

                if (!j)
                        continue;
                for (size_t ti = 0; ti < b->n_tensors; ti++) {
                        BkTensor *bt = &b->tensors[ti];
                        Tensor *t = bt->made;
                        bool ok = bt->nvme_version > 0 && !f->damaged;

                        if (!t || bt->job_key != bj->key)
                                continue;
                        /*
                         * An image that is the NVMe copy itself (a rollback made it that copy
                         * again; or tierd died between the image's record and the newer
                         * version's) is that copy, the newest the index knows: no image apart.
                         */
                        if (bt->image && bt->ext && bt->n_image == bt->n_ext &&
                            extents_same(bt->image, bt->ext, bt->n_ext)) {
                                bt->image = mfree(bt->image);
                                bt->n_image = 0;
                        }
                        /* the committed version's image, when a newer one was written since */
                        if (bt->image && !f->damaged && reserve_extents(b, bt->image, bt->n_image)) {
                                t->base = TAKE_PTR(bt->image);
                                t->n_base = bt->n_image;
                                copy_account(t, LEVEL_NVME, (int64_t) ((uint64_t) t->n_base * b->nvme->extent_size));
                        }
                        ok = ok && reserve_extents(b, bt->ext, bt->n_ext);
                        if (ok) {
                                t->version = bt->nvme_version;
                                r = copy_restore_nvme(t, TAKE_PTR(bt->ext), bt->n_ext);
                                if (r < 0) {
                                        log_warning_errno(r, "Cannot restore tensor '%s' of job '%s': %m", bt->name,
                                                          bj->name);
                                        continue;
                                }
                                t->book_state = BOOK_T_NVME;
                                t->book_version = t->version;
                                f->tensors++;
                                f->bytes += t->alloc_size;
                                /* a memory copy of the same version, or a newer one the index had not heard of */
                                if (memstore_restore(reg->memstore, reg, t, MAX(bt->newest, t->version)) &&
                                    t->version != t->book_version)
                                        f->in_memory++;
                        } else if (!f->damaged && memstore_restore(reg->memstore, reg, t, bt->newest)) {
                                /* its newest data was in memory, which the service manager kept */
                                f->in_memory++;
                        } else if (bt->newest == 0 && !f->damaged) {
                                t->book_state = BOOK_T_BLANK;
                                f->blank++;
                        } else {
                                /* its newest data was in memory, or its extents are gone: never handed out */
                                t->version = bt->newest;
                                t->lost = true;
                                t->lost_why = f->damaged ? TENSOR_LOST_DAMAGED :
                                              bt->nvme_version ? TENSOR_LOST_TARGET : TENSOR_LOST_STOPPED;
                                t->book_state = BOOK_T_NEWER;
                                /* dead at a clean stop (its DEAD record), or by the memory store's table */
                                t->dead_rank = bt->dead_rank;
                                if (!f->damaged && (bt->dead ||
                                                    memstore_was_dead(reg->memstore, t, bt->newest, &t->dead_rank))) {
                                        /*
                                         * still: so the next kill says so too; and whose plan made it dead, so
                                         * that a read of it fails as before the restart (op.c ensure_copy())
                                         */
                                        t->dead = true;
                                        if (bt->dead)   /* (a next write of it says NEWER: book_version()) */
                                                t->book_state = BOOK_T_DEAD;
                                        f->dead++;
                                        log_job(LOG_DEBUG, 0, j->name, "Tensor '%s' of job '%s' was dead when tierd "
                                                "went (its next access writes it whole): nothing of it to bring "
                                                "back, its reads fail until that write", t->name, j->name);
                                        continue;
                                }
                                f->lost++;
                                log_job(LOG_WARNING, 0, j->name, "Tensor '%s' of job '%s' is lost: %s", t->name, j->name,
                                        tensor_lost_reason(t));
                        }
                }
                f->jobs++;
                log_job(LOG_INFO, 0, j->name, "Job '%s' of uid %u restored from the NVMe index with %u tensor(s); "
                        "it lingers until a client attaches", j->name, (unsigned) j->uid, bj->kept);
                job_linger_start(j);
        }
        bk_forget(b);

        /* from now on: a fresh file holding just that, then every change */
        b->registry = reg;
        r = book_snapshot(b);
        if (r < 0)
                return r;
        book_sync(b);
        *ret_found = *f;
        return 0;
}

