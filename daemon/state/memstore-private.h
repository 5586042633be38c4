/* SPDX-License-Identifier: MIT */
/* memstore-private.h: the memory store's insides, shared by memstore.c (the table), memstore-restore.c (putting copies back) and memstore-notify.c (the messages). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/state/memstore.h"
#include "daemon/state/registry.h"     /* (RANK_SET_MAX) */

typedef struct sd_event_source sd_event_source;
typedef struct MsRecord MsRecord;

enum { MS_HOST, MS_VRAM, MS_TIERS };

struct MemStore {
        bool frozen;
        bool usable;                    /* the old table was read and matches the pools */
        uint64_t seg_size[MS_TIERS];
        uint32_t n_segs[MS_TIERS];

        /* what the service manager passed back */
        int old_table[2];
        int *old_seg[MS_TIERS];         /* per segment id, -1: none */
        bool *adopted[MS_TIERS];        /* per segment id: its memory is the last tierd's */
        bool *spoiled[MS_TIERS];        /* per segment id: a room in it no tensor holds may be written (not used) */
        uint64_t *old_ino[MS_TIERS];    /* per segment id: the inode the old table names (0: none) */
        MsRecord *old;                  /* the old table's sound records, sorted by keys */
        size_t n_old;
        unsigned old_no;                /* which table name the old one had */
        uint64_t old_generation;

        /* segments handed to the store (before the table exists: made at start) */
        uint64_t *stored_ino[MS_TIERS];

        int notify_fd;                  /* to $NOTIFY_SOCKET: sends never block the loop */
        sd_event_source *notify_source; /* writable again: the queue goes on */
        struct MsMsg *queue;            /* what waits for the service manager, in order */
        size_t n_queue, cap_queue;
        bool warned_notify;

        /* the table of this run */
        int fd;
        uint8_t *map;
        size_t map_size;
        size_t rec_at;                  /* where the records start */
        uint32_t cap;
        unsigned table_no;
        uint32_t *free_slots;
        uint32_t n_free, next_slot;
        unsigned n_records;
        unsigned restored;
        uint64_t seq;
        bool warned_pieces, warned_full;
        FaultSet *faults;               /* TIERD_TEST_FAULTS (store-kill), or NULL */
};

/* A message for the service manager that must wait its turn (its socket was full). */
typedef struct MsMsg {
        char text[96];
        char name[64];          /* its FDNAME */
        bool remove;            /* FDSTOREREMOVE=1, else FDSTORE=1 */
        int fd;                 /* ours (a dup), or -1 */
        int seg_k;              /* a segment's FDSTORE: whose inode is current once it is sent; -1: not */
        uint32_t seg_id;
        uint64_t ino;
} MsMsg;

/* The memory store's tier of a level (LEVEL_HOST, LEVEL_VRAM), and its name. */
int ms_tier(int tier);
extern const char *const ms_tier_names[MS_TIERS];
/* qsort()/bsearch() order of MsRecords: by job key, then tensor key. */
int ms_by_keys(const void *a, const void *b);

/* A segment's FDSTORE is out (memstore.c): the table names inode @ino for segment @id of pool @k. */
void ms_segment_stored(MemStore *ms, int k, uint32_t id, uint64_t ino);

/* memstore-notify.c */
int ms_notify_open(const char *path);
int ms_on_notify_writable(sd_event_source *s, int fd, uint32_t revents, void *userdata);
/* FDSTOREREMOVE=1 of what the store holds under @name. */
void ms_store_remove(MemStore *ms, const char *name);
/* The name a segment has in the store ("tierd-mem-host-3"). */
void ms_seg_name(int k, uint32_t id, char *buf, size_t size);
/* An old segment (Memstore.old_seg) this run will not adopt: closed, and removed from the store. */
void ms_old_segment_drop(MemStore *ms, int k, uint32_t id);
/* FDSTORE=1 of @fd under @name (a segment's: @seg_k, @seg_id and @ino; -1 otherwise). */
void ms_store_put(MemStore *ms, const char *name, int fd, int seg_k, uint32_t seg_id, uint64_t ino);
/* Wait until every queued message is with the service manager, @timeout_usec at most: true once it is. */
bool ms_queue_wait(MemStore *ms, uint64_t timeout_usec);

/* ---- the table's format (memstore.c) ---- */

#define MS_MAGIC "TIERMST1"
#define MS_FORMAT 1u
#define MS_MAX_PIECES 8
#define MS_REC_SIZE 512u
#define MS_HEADER_SIZE 4096u    /* the header's page; the inode array follows, then the records */
#define MS_INITIAL_RECORDS 1024u
#define MS_MAX_RECORDS 65536u
#define MS_START_WAIT_USEC (10 * USEC_PER_SEC)     /* for the service manager to take the start's messages */

enum { MS_NONE, MS_VALID, MS_WRITING };
enum { MS_F_DEAD = 1 };         /* its next access writes it whole: no copy was worth keeping */
enum {
        MS_C_UNWRITTEN = 1,     /* MS_WRITING for a write-only pin's reservation: garbage unless its writer wrote */
        MS_C_DEAD_BEFORE = 2,   /* and the tensor was dead before it (its bytes were not wanted) */
};

typedef struct MsPiece {
        uint32_t seg;
        uint32_t reserved;
        uint64_t offset;
        uint64_t len;
} MsPiece;

typedef struct MsCopy {
        uint64_t version;
        uint8_t state;
        uint8_t n_pieces;
        uint8_t flags;          /* MS_C_* (0 in tables of before it: such a copy counts as written) */
        uint8_t n_ranks;        /* MS_WRITING: RankSet.n of MsRecord.ranks (0 in tables of before it: not known) */
        uint32_t writer_rank;   /* MS_WRITING: the rank whose pin may write it */
        MsPiece pieces[MS_MAX_PIECES];
} MsCopy;

typedef struct MsRecord {
        uint64_t seq;           /* 0: free (written first and last) */
        uint64_t job_key;
        uint64_t tensor_key;
        uint64_t alloc_size;
        uint64_t version;       /* the tensor's */
        uint64_t flags;         /* MS_F_* */
        MsCopy copy[MS_TIERS];
        uint32_t dead_rank;     /* MS_F_DEAD, MS_C_DEAD_BEFORE: Tensor.dead_rank (0 in tables of before it: not known) */
        uint32_t ranks[MS_TIERS][RANK_SET_MAX]; /* MS_WRITING: the ranks whose pins held it for writing */
        uint8_t pad[MS_REC_SIZE - sizeof(uint64_t[6]) - sizeof(MsCopy[MS_TIERS]) -
                    sizeof(uint32_t[2 + MS_TIERS * RANK_SET_MAX])];
        uint32_t crc;           /* crc32c of everything after seq and before crc */
} MsRecord;

/*
 * The table: this header, then per segment of each pool (host first) the
 * inode number of the memfd the store holds for it (0: not in the store, or
 * not current: its memory is not used at the next start), padded to a page,
 * then the records.
 */
typedef struct MsHeader {
        char magic[8];
        uint32_t format;
        uint32_t rec_size;
        uint32_t n_records;
        uint32_t n_segs[MS_TIERS];
        uint32_t pad;
        uint64_t seg_size[MS_TIERS];
        uint64_t generation;
        uint32_t crc;           /* of everything before it */
} MsHeader;

_Static_assert(sizeof(MsRecord) == MS_REC_SIZE, "a record is MS_REC_SIZE bytes");
_Static_assert(sizeof(MsHeader) <= MS_HEADER_SIZE, "the header fits its page");
