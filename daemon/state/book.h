/* SPDX-License-Identifier: MIT */
/* book.h: the NVMe index: which tensor's data lies in which extents, on disk, crash-consistent. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct Book Book;
typedef struct FaultSet FaultSet;
typedef struct Job Job;
typedef struct NvmeTier NvmeTier;
typedef struct Registry Registry;
typedef struct Tensor Tensor;
typedef struct sd_event sd_event;

/*
 * The on-disk format this tierd writes (the header's format field), and the oldest it reads.  2 added
 * the DEAD record: a tierd that reads format 1 only took it for damage and brought every tensor back
 * lost, so it must refuse a format 2 index (as it does: -EPROTONOSUPPORT, nothing overwritten).
 */
#define BOOK_FORMAT 2u
#define BOOK_FORMAT_OLDEST 1u
/* The two files, STATE_DIR/nvme-index.0 and .1, written in turn (book.c). */
#define BOOK_FILE "nvme-index"

/* What book_open() found, for the log and status. */
typedef struct BookFound {
        unsigned jobs;          /* jobs with tensors */
        unsigned tensors;       /* tensors restored with their data on NVMe */
        unsigned blank;         /* tensors never written (zeros: nothing to restore) */
        unsigned lost;          /* tensors whose newest data was not on NVMe (or lies on a target that changed) */
        unsigned in_memory;     /* tensors whose newest data the memory store kept (state/memstore.c) */
        unsigned dead;          /* tensors nothing needed (the next access writes them whole): none of their data kept */
        uint64_t bytes;         /* bytes of NVMe those restored hold */
        uint64_t records;       /* records replayed */
        uint64_t torn_bytes;    /* bytes after the last whole record of the file read (a write cut short) */
        bool clean;             /* the last tierd stopped cleanly (its last record says so) */
        bool damaged;           /* a damaged record amid whole ones: every tensor was taken as lost */
        unsigned generation;    /* of the file read */
} BookFound;

/*
 * book_open() - read STATE_DIR/nvme-index.{0,1} (the newer whole one) and
 * keep what it says for book_restore(): the jobs and tensors whose data
 * lies on NVMe, checked against @nvme's targets (a target whose path,
 * size, extent size or identity changed loses the tensors with extents on
 * it).  Extents are not reserved yet.  No file: an empty book.  A file
 * that does not parse is set aside (statefile_set_aside()) and the book
 * starts empty, said in the log.  A format this
 * tierd does not know refuses the start (-EPROTONOSUPPORT), nothing
 * overwritten.  @faults: TIERD_TEST_FAULTS (index-kill, index-torn), may be
 * NULL.
 */
int book_open(const char *state_dir, NvmeTier *nvme, sd_event *event, FaultSet *faults, Book **ret,
              char **ret_error);
/*
 * book_check() - for tierd --check-config: what book_open() would refuse of
 * STATE_DIR/nvme-index.{0,1} with extents of @extent_size (-ESTALE: the
 * index's extent_size is another; -EPROTONOSUPPORT), *@ret_error the same
 * words.  Reads the files only: nothing is set aside or written.
 */
int book_check(const char *state_dir, uint64_t extent_size, char **ret_error);
/*
 * book_void_files() - set STATE_DIR/nvme-index.{0,1} aside (else remove
 * them), logging @why: a start with [nvme] persist = no reuses the extents
 * they list, so a later start with persist must not read them.
 */
void book_void_files(const char *state_dir, const char *why);
/* tierd is exiting: the registry is freed next, and that forgets jobs, it does not end them: nothing more is recorded. */
void book_detach(Book *b);
/* Writes the clean-stop record (when @clean), waits for the last sync and frees. */
Book *book_free(Book *b, bool clean);

/*
 * book_restore() - recreate in @r what the book holds: each job (owner,
 * groups, admin) through @job_made (which resolves its quota; @was: the
 * name the index had when the job was restored under its escaped text, for
 * the quota rules and the wear book to follow, else NULL; a negative
 * return drops the job and its tensors, logged), lingering; each tensor
 * with its NVMe copy resident (extents reserved, their crc32c kept), or
 * marked lost.  Then writes a fresh file (the other one) holding just that,
 * and from then on records every change.  *@ret_found says what there was.
 */
int book_restore(Book *b, Registry *r, int (*job_made)(Job *j, const char *was, gid_t gid, const gid_t *groups,
                                                       size_t n, bool admin, void *userdata),
                 void *userdata, BookFound *ret_found);

/* ---- what changes (called where it happens; all no-ops on a NULL book) ---------------------- */

/* A job came to be (after its quota resolved: its owner, groups and admin flag are known). */
void book_job(Book *b, Job *j);
/* A job ended for good (not tierd's exit: the registry's freeing skips it). */
void book_job_gone(Book *b, Job *j);
void book_tensor(Book *b, Tensor *t);
void book_tensor_gone(Book *b, Tensor *t);
/*
 * book_nvme() - @t's NVMe copy holds @version, written to its extents
 * (their crc32c set): recorded, and the targets it lies on marked for the
 * next sync.  Returns the record's sequence number: the copy may be called
 * written (a fence) only once book_durable() says so.
 */
uint64_t book_nvme(Book *b, Tensor *t, uint64_t version);
/*
 * book_version() - @t's newest data changed (a dirty unpin: @t->version is
 * new) or its NVMe copy went: if the book holds an NVMe copy of it, or
 * thinks it never written, it records that the newest data is no longer on
 * NVMe (lost if tierd stops before a write-down, unless memory survives).
 */
void book_version(Book *b, Tensor *t);
/*
 * book_version_back() - book_version() even where the book holds a NEWER
 * record already, of another version: @t's newest went back to an older one
 * in memory (a write-only pin cut off by tierd's death, reverted), so that a
 * next start looks for that one; or went on since (book_commit(): the
 * replay takes the newest recorded as the committed version).
 */
void book_version_back(Book *b, Tensor *t);

/* @t's committed version now lies in its image (Tensor.base): a newer one was written. */
void book_image(Book *b, Tensor *t);
/* @j made a commit (job_commit()): every tensor's committed version is its version now, images go. */
void book_commit(Book *b, Job *j);
/*
 * book_commit_dead() - @t, not dead, was committed dead all the same (Tensor.commit_dead, set after
 * book_commit(): its plan's hold writes it whole next): a DEAD record of the committed version and, in
 * the same write, the record of what it holds now (NEWER, or NVME), so that a rollback after a restart
 * makes it dead again, as without the restart, and a start before its plan writes it finds it as it is.
 * A tierd of format 2 older than the commit_dead replay reads both as before (dead, then not).
 */
void book_commit_dead(Book *b, Tensor *t);
/*
 * book_note_dead() - a clean stop, after the write-down: each dead tensor (its newest version has no
 * bytes, its plan's next access writes it whole) gets a DEAD record, so that the next start brings it back
 * dead, as it was, not lost (with the memory store, its table says so too).
 */
void book_note_dead(Book *b);
/* @t was rolled back (job_rollback()): to its NVMe copy (its image), or to zeros. */
void book_restored(Book *b, Tensor *t);

/* Has every record up to @seq reached the drive (and the NVMe data it names)? */
bool book_durable(const Book *b, uint64_t seq);
/*
 * book_sync_failed() - in a durable callback: did the sync that made record
 * @seq durable fail to flush one of @targets (bits)?  -errno of the
 * target's fdatasync() then (the write-down is not on the drive), else 0.
 */
int book_sync_failed(const Book *b, uint64_t seq, uint64_t targets);
/* Ask for a sync of what is recorded so far (done on the book's thread). */
void book_sync(Book *b);
/* Called on the loop whenever book_durable() may say yes to more (the engine's parked writes). */
void book_set_durable_cb(Book *b, void (*cb)(void *userdata), void *userdata);
/* For status: records written since start, syncs done, the file's bytes. */
void book_stats(const Book *b, uint64_t *ret_records, uint64_t *ret_syncs, uint64_t *ret_bytes);
