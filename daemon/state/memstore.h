/* SPDX-License-Identifier: MIT */
/* memstore.h: host and emulated VRAM memory outlive tierd, in the service manager's fd store. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

typedef struct MemStore MemStore;
typedef struct sd_event sd_event;
typedef struct Registry Registry;
typedef struct Segment Segment;
typedef struct Tensor Tensor;
typedef struct Job Job;
typedef struct FaultSet FaultSet;

/* The names tierd gives its fds in the store (FDNAME=): a prefix no socket unit uses. */
#define MEMSTORE_FD_PREFIX "tierd-mem-"

/*
 * memstore_new() - the memory store, or none (*ret NULL) when it cannot
 * work: no service manager to hold the fds ($NOTIFY_SOCKET unset), or no
 * NVMe index to name the tensors by (@persist false).  The pools' shapes
 * are what the table and the segments found at start must match.  What it
 * sends the service manager never blocks @event's loop: it waits its turn
 * when the socket is full (the table names a segment only once the store
 * has it).
 */
int memstore_new(sd_event *event, bool persist, uint64_t host_seg_size, uint32_t host_segs,
                 uint64_t vram_seg_size, uint32_t vram_segs, MemStore **ret);
MemStore *memstore_free(MemStore *ms);

/*
 * memstore_inherit() - an fd the service manager passed back at start,
 * named @name: taken (returns 1, @fd is the store's) when it is one of
 * ours, else 0 (the caller keeps it).  Runs before memstore_load().
 */
int memstore_inherit(MemStore *ms, const char *name, int fd);
/* Read the table the last tierd left; says in the log what it found.  Never fatal. */
void memstore_load(MemStore *ms);

/*
 * memstore_take_segment() - the memfd the last tierd had for segment @id of
 * @tier's pool (LEVEL_HOST or LEVEL_VRAM), when its contents can be used
 * (the table was read and the memfd is the pool's size): returned, owned by
 * the caller; -1 otherwise.  At start only, while the pools are made.
 */
int memstore_take_segment(MemStore *ms, int tier, uint32_t id, uint64_t size);
/* Segment @seg's memory was made (at start, or renewed): into the store under its name. */
void memstore_segment_made(MemStore *ms, int tier, const Segment *seg);

/*
 * memstore_prepare() - once the NVMe index made its jobs and tensors, and
 * before any memstore_restore(): a segment in which the last tierd's table
 * has a copy held for writing that no tensor takes (not restored, or of
 * another size) is not used again, since a process of before may still
 * write into that room and nothing would keep it reserved; its other copies
 * are not put back.  memstore_begin() renews it.
 */
void memstore_prepare(MemStore *ms, Registry *r);
/*
 * memstore_restore() - put back the memory copies the last tierd had of @t
 * (restored from the NVMe index, book keys set), when they are at least the
 * version @newest the index heard of: their segments are claimed for the job,
 * their ranges reserved.  A copy a client held for writing when tierd went
 * is the newest (version + 1) and stays pinned until a Hello of each rank
 * whose pins held it (job_release_ghosts()), or the job's end, since a
 * process of that rank may still be writing into it.
 * Returns true when @t's newest data is back in memory.
 */
bool memstore_restore(MemStore *ms, Registry *r, Tensor *t, uint64_t newest);
/*
 * memstore_was_dead() - @t's newest data (version @newest) was nowhere when
 * tierd went because nothing needed it: its next access writes it whole.  It
 * comes back lost all the same (its reads fail until that write), but that is
 * no loss to warn of.  *@ret_dead_rank: its Tensor.dead_rank then (0 from a
 * table of before it was recorded).
 */
bool memstore_was_dead(MemStore *ms, const Tensor *t, uint64_t newest, uint32_t *ret_dead_rank);
/*
 * memstore_begin() - after the restore: a new table holds what was put back
 * (and then every change), the old one leaves the store; adopted segments
 * that hold nothing are renewed before any job gets them.  When it cannot
 * make its table, memory is not kept in this run, and the last run's
 * tables are made void all the same (this run changes what they describe).
 */
int memstore_begin(MemStore *ms, Registry *r);

/* @t's memory copies changed (state, version, pieces, writers): its record follows, before anything else happens. */
void memstore_note(MemStore *ms, Tensor *t);
/* Tests only: TIERD_TEST_FAULTS's store-kill and store-table rules (daemon/tiers/fault.h), or NULL. */
void memstore_set_faults(MemStore *ms, FaultSet *faults);
/* tierd exits: the table stays as it is, for the next start (nothing is noted any more). */
void memstore_freeze(MemStore *ms);
