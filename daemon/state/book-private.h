/* SPDX-License-Identifier: MIT */
/* book-private.h: the NVMe index's insides, shared by book.c (writing) and book-replay.c (reading). */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/state/book.h"

typedef struct NvmeExtent NvmeExtent;
typedef struct sd_event_source sd_event_source;

#define BOOK_MAGIC "TIERIDX\n"
#define BOOK_REC_MAGIC 0x4b42u          /* "BK" */
#define BOOK_REC_HEAD 16u               /* len u32, type u16, magic u16, seq u64 */
/* Bounds on what a file may ask us to allocate. */
#define BOOK_NAME_MAX 4096u
/* a job's groups: its creator's primary one and up to QUOTA_GROUPS_MAX supplementary ones (quota.c) */
#define BOOK_GROUPS_MAX 65u
/* jobs that are not gone; JOB records in all (gone ones too) at most BOOK_TENSORS_MAX */
#define BOOK_JOBS_MAX 65536u
#define BOOK_TENSORS_MAX (16u << 20)
#define BOOK_TARGETS_MAX 64u
/* Larger than this, a file is not one tierd wrote (it compacts long before). */
#define BOOK_FILE_MAX (1ull << 30)
/* Compact once the file is this large and four times its snapshot. */
#define BOOK_COMPACT_MIN (16ull << 20)

enum {
        REC_JOB = 1,
        REC_JOB_GONE,
        REC_TENSOR,
        REC_TENSOR_GONE,
        REC_NVME,
        REC_NEWER,
        REC_SNAPSHOT,
        REC_CLEAN,
        REC_IMAGE,              /* key, version, extents: its committed version's image */
        REC_COMMIT,             /* job key, step: its tensors' committed versions are their newest */
        REC_BLANK,              /* key: rolled back to zeros */
        REC_DEAD,               /* key, version, rank: that version is dead (no bytes: its next access writes it) */
};

/* Step points of an index update, for the index-kill and index-torn faults. */
typedef enum BookStep {
        STEP_RECORD,            /* a record is about to be written */
        STEP_RECORDED,          /* it was */
        STEP_SYNC,              /* a sync is asked for */
        STEP_SYNCED,            /* a sync came back */
        STEP_SNAPSHOT,          /* a snapshot is about to be written */
        STEP_SNAPSHOT_HALF,     /* half of it is */
        STEP_SNAPSHOT_DONE,     /* it is whole, appending not moved over yet */
} BookStep;

/* ---- what a file holds, read back ------------------------------------------------------ */

typedef struct BkJob {
        uint64_t key;
        uid_t uid;
        bool admin;
        bool committing;
        uint64_t commit_step;
        bool gone;
        gid_t *groups;          /* primary first */
        uint32_t n_groups;
        char *name;
        Job *made;              /* book_restore(): the job made of it, or NULL */
        unsigned kept;          /* book_restore(): its tensors made */
} BkJob;

typedef struct BkTensor {
        uint64_t key;
        uint64_t job_key;
        uint64_t size;
        uint64_t newest;        /* newest version (0: never written) */
        uint64_t nvme_version;  /* 0: no NVMe copy */
        NvmeExtent *ext;
        uint32_t n_ext;
        uint64_t commit_version;
        NvmeExtent *image;      /* of commit_version */
        uint32_t n_image;
        bool gone;
        bool dead;              /* a DEAD record of version newest (a later record of it clears it) */
        uint32_t dead_rank;     /* its Tensor.dead_rank */
        bool commit_dead;       /* dead at commit_version (a DEAD record of it): its Tensor.commit_dead */
        uint32_t commit_dead_rank;
        char *name;
        Tensor *made;           /* book_restore(): the tensor made of it, or NULL */
} BkTensor;

/* A map from key to index, open addressing. */
typedef struct KeyMap {
        uint64_t *keys;         /* 0: empty (keys start at 1) */
        uint32_t *idx;
        size_t cap, n;
} KeyMap;

typedef struct BkTarget {
        uint64_t size, dev, ino;
        bool blockdev;
        char *path;
        int now;                /* the index of the configured target it is, -1: none (changed or gone) */
} BkTarget;

/* ---- the book ---------------------------------------------------------------------------- */

struct Book {
        char *path[2];
        int fd;                 /* the file being appended to */
        unsigned cur;           /* its index, 0 or 1 */
        uint64_t generation;
        uint64_t off;           /* its end */
        uint64_t snapshot_len;  /* bytes of its snapshot */
        uint64_t seq;           /* last record's */
        uint64_t next_key;
        bool off_books;         /* a write failed: scratch from then on */
        bool check;             /* book_check(): read only, nothing set aside */
        NvmeTier *nvme;
        Registry *registry;     /* after book_restore() */
        FaultSet *faults;
        char *buf;              /* one record being built */
        size_t buf_cap;
        uint64_t records, syncs;
        bool compact_wanted;    /* grown past BOOK_COMPACT_MIN: compact once the next sync is done */

        /* read by book_open(), used by book_restore() */
        BkJob *jobs;
        size_t n_jobs, n_jobs_gone;
        BkTensor *tensors;
        size_t n_tensors;
        KeyMap job_map, tensor_map;
        BkTarget *targets;
        size_t n_targets;
        BookFound found;

        /* the sync thread; under lock: want_seq, want_targets, done_seq, stop */
        pthread_t thread;
        bool started;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        uint64_t want_seq;      /* the loop wants every record up to it durable */
        uint64_t want_targets;  /* targets (bits) to sync with it */
        uint64_t done_seq;      /* the thread made those durable */
        int sync_error;         /* the thread's last failure to sync the index (0: none) */
        uint64_t target_err_mask; /* targets (bits) whose fdatasync() failed, in syncs up to target_err_seq */
        uint64_t target_err_seq;
        int target_err;         /* the last such failure */
        bool stop;
        int syncing_fd;         /* the file the thread syncs now (-1: none) */
        int retired_fd;         /* a file appending left while the thread synced it: closed by the thread */
        uint64_t dirty_targets; /* loop: targets written since the last sync request */
        uint64_t durable_seq;   /* loop's copy of done_seq */
        uint64_t failed_targets, failed_seq; /* loop: target_err_mask, _seq, while durable_cb runs */
        int failed_error;
        int efd;
        sd_event_source *source;
        void (*durable_cb)(void *userdata);
        void *durable_userdata;
};

/* book.c */
void book_step(Book *b, BookStep step);
int book_snapshot(Book *b);
void *book_sync_thread(void *arg);
int book_on_synced(sd_event_source *s, int fd, uint32_t revents, void *userdata);
/* book-replay.c */
void bk_forget(Book *b);
int book_start_thread(Book *b);
