/* SPDX-License-Identifier: MIT */
/* memstore-private.h: the memory store's insides, shared by memstore.c (the table) and memstore-notify.c (the messages). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/state/memstore.h"

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
