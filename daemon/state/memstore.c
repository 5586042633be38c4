/* SPDX-License-Identifier: MIT */
/* memstore.c: host and emulated VRAM memory outlive tierd, in the service manager's fd store. */

/*
 * Theory of operation: the host pool and the emulated VRAM pool are memfds,
 * one per segment.  tierd hands each to the service manager's fd store
 * (FDSTORE=1, FDNAME=tierd-mem-host-ID / tierd-mem-vram-ID), together with
 * one more memfd, the table (tierd-mem-table-0 or -1), which says where each
 * tensor's memory copies lie: per tensor (named by its NVMe index keys) and
 * per tier, the version, whether a client holds it for writing, and the
 * pieces (segment, offset, length).  When tierd exits, however it exits,
 * the store keeps the memfds, so their pages and the table survive; the
 * next tierd gets them back (LISTEN_FDS, LISTEN_FDNAMES), maps the segments
 * in place of fresh ones and puts each tensor's copies back where they were.
 *
 * The table is written in place, on the loop, as copies change and before
 * anything else happens (memstore_note() runs where a copy is freed, filled,
 * made stale or pinned for writing): a SIGKILL leaves it as of the last
 * change.  A record is written with its seq at 0 first and set last, and
 * carries a crc32c, so a record cut short by a kill counts as absent; and a
 * tensor's new record goes into a free slot, the one it replaces freed only
 * after, so a kill at any point leaves one sound record of it (two: the
 * higher seq is the current one).  A copy is recorded only while it is valid
 * (its version is the tensor's) or held for writing; a stale or filling one
 * is not, and the record changes before a freed range can be reused.  A copy
 * held for writing when tierd died is the newest: the client may have
 * written it, and keeps writing until its next call finds tierd gone, so the
 * record names the ranks whose pins held it, and it stays pinned until each
 * said Hello (or the job ends).  It is held for writing from before the
 * grant goes out, so tierd cannot tell a grant its client got from one its
 * death cut off.  For a copy a write-only pin reserved (its room holds none
 * of the tensor's bytes until the client writes them) the record says so
 * (MS_C_UNWRITTEN), and those Hellos decide: each names the writes its
 * client got the grant of (job_release_ghosts(), state/tensor.c).
 *
 * At start, what tierd sends the store (segments renewed, the new table) is
 * with the service manager before READY=1 (memstore_begin() waits for the
 * socket, 10 s at most), and then the last run's tables are made void in
 * place: the store holds the same files, so a next start never puts memory
 * back by a table that no longer describes it, whatever became of their
 * removal.  Without the new table there, memory only is lost, never wrong.
 *
 * What is not kept: CUDA VRAM (the driver's allocations die with the
 * process; exporting their fds to the store is not done), tensors in more
 * than MS_MAX_PIECES pieces, and everything without the NVMe index ([nvme]
 * persist = no) or without a service manager.  Nor, until its FDSTORE is out,
 * what lies in a segment renewed while running (a job gave it back) when the
 * service manager's socket was full: the segment is used at once, and a kill
 * before the message leaves loses its copies (reported lost), since holding
 * it back would make allocations wait on the service manager.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>

#include "daemon/base/level.h"
#include "daemon/base/log.h"
#include "daemon/state/book.h"
#include "daemon/state/memstore-private.h"
#include "daemon/state/memstore.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/fault.h"
#include "daemon/tiers/segpool.h"
#include "proto/crc32c.h"
#include "proto/macro.h"
#include "util/time-util.h"

/* Where the records start in a table of these pools. */
static size_t records_at(const uint32_t n_segs[MS_TIERS]) {
        size_t inodes = ((size_t) n_segs[0] + n_segs[1]) * sizeof(uint64_t);

        return MS_HEADER_SIZE + ALIGN_UP(inodes, (size_t) 4096);
}

int ms_tier(int tier) {
        return tier == LEVEL_HOST ? MS_HOST : MS_VRAM;
}

const char *const ms_tier_names[MS_TIERS] = { "host", "vram" };

static uint64_t *table_ino(MemStore *ms, int k, uint32_t id);

/* A segment's memfd is in the store: the table says so now (the next start may use it). */
void ms_segment_stored(MemStore *ms, int k, uint32_t id, uint64_t ino) {
        ms->stored_ino[k][id] = ino;
        if (ms->map)
                __atomic_store_n(table_ino(ms, k, id), ino, __ATOMIC_RELEASE);
}

int memstore_new(sd_event *event, bool persist, uint64_t host_seg_size, uint32_t host_segs,
                 uint64_t vram_seg_size, uint32_t vram_segs, MemStore **ret) {
        const char *path = getenv("NOTIFY_SOCKET"), *max = getenv("FDSTORE");
        uint64_t need = (uint64_t) host_segs + vram_segs + 3, limit;
        char *end;
        MemStore *ms;
        int fd, r;

        *ret = NULL;
        if (!persist) {
                log_debug("Memory store: off ([nvme] persist = no)");
                return 0;
        }
        if (!path) {
                log_debug("Memory store: off (no service manager: $NOTIFY_SOCKET unset)");
                return 0;
        }
        if (!max) {
                /* systemd >= 254 sets $FDSTORE to FileDescriptorStoreMax=; tierd.service sets it for older ones */
                log_debug("Memory store: off ($FDSTORE unset: the service manager keeps no fds for tierd)");
                return 0;
        }
        errno = 0;
        limit = strtoull(max, &end, 10);
        if (errno != 0 || end == max || *end != 0 || limit < need) {
                log_warning("Memory store: off: the service manager keeps %s fd(s) for tierd ($FDSTORE), "
                            "it needs %" PRIu64 " (one per segment, and its tables); "
                            "raise FileDescriptorStoreMax= and FDSTORE= in tierd.service", max, need);
                return 0;
        }
        fd = ms_notify_open(path);
        if (fd < 0) {
                log_warning_errno(fd, "Memory store: cannot reach the service manager at $NOTIFY_SOCKET: %m; "
                                  "memory is not kept across restarts");
                return 0;
        }
        ms = calloc(1, sizeof(*ms));
        if (!ms) {
                safe_close(fd);
                return -ENOMEM;
        }
        ms->notify_fd = fd;
        ms->fd = -1;
        ms->old_table[0] = ms->old_table[1] = -1;
        ms->seg_size[MS_HOST] = host_seg_size;
        ms->seg_size[MS_VRAM] = vram_seg_size;
        ms->n_segs[MS_HOST] = host_segs;
        ms->n_segs[MS_VRAM] = vram_segs;
        for (int k = 0; k < MS_TIERS; k++) {
                size_t n = MAX(ms->n_segs[k], 1u);

                ms->old_seg[k] = malloc(n * sizeof(int));
                ms->adopted[k] = calloc(n, sizeof(bool));
                ms->spoiled[k] = calloc(n, sizeof(bool));
                ms->old_ino[k] = calloc(n, sizeof(uint64_t));
                ms->stored_ino[k] = calloc(n, sizeof(uint64_t));
                if (!ms->old_seg[k] || !ms->adopted[k] || !ms->spoiled[k] || !ms->old_ino[k] || !ms->stored_ino[k]) {
                        memstore_free(ms);
                        return -ENOMEM;
                }
                for (uint32_t i = 0; i < ms->n_segs[k]; i++)
                        ms->old_seg[k][i] = -1;
        }
        r = event ? sd_event_add_io(event, &ms->notify_source, fd, EPOLLOUT, ms_on_notify_writable, ms) : 0;
        if (r < 0) {
                memstore_free(ms);
                return r;
        }
        if (ms->notify_source) {
                (void) sd_event_source_set_enabled(ms->notify_source, SD_EVENT_OFF);
                (void) sd_event_source_set_description(ms->notify_source, "memstore-notify");
        }
        *ret = ms;
        return 0;
}

MemStore *memstore_free(MemStore *ms) {
        if (!ms)
                return NULL;
        for (int i = 0; i < 2; i++)
                safe_close(ms->old_table[i]);
        for (int k = 0; k < MS_TIERS; k++) {
                for (uint32_t i = 0; ms->old_seg[k] && i < ms->n_segs[k]; i++)
                        safe_close(ms->old_seg[k][i]);
                free(ms->old_seg[k]);
                free(ms->adopted[k]);
                free(ms->spoiled[k]);
                free(ms->old_ino[k]);
                free(ms->stored_ino[k]);
        }
        free(ms->old);
        if (ms->map)
                munmap(ms->map, ms->map_size);
        safe_close(ms->fd);
        ms->notify_source = sd_event_source_disable_unref(ms->notify_source);
        for (size_t i = 0; i < ms->n_queue; i++)
                safe_close(ms->queue[i].fd);
        free(ms->queue);
        safe_close(ms->notify_fd);
        free(ms->free_slots);
        free(ms);
        return NULL;
}

/* An fd of the last run's that this run does not take: closed, and out of the service manager's store
 * too, which would otherwise keep its memory until tierd is stopped for good. */
static void inherited_drop(const char *name, int fd) {
        safe_close(fd);
        (void) sd_notifyf(false, "FDSTOREREMOVE=1\nFDNAME=%s", name);
}

int memstore_inherit(MemStore *ms, const char *name, int fd) {
        const char *rest;
        char *end;
        unsigned long id;

        if (!name || strncmp(name, MEMSTORE_FD_PREFIX, strlen(MEMSTORE_FD_PREFIX)) != 0)
                return 0;
        rest = name + strlen(MEMSTORE_FD_PREFIX);
        if (!ms) {
                inherited_drop(name, fd);       /* no store this run: the memory is not ours to use */
                return 1;
        }
        if (strcmp(rest, "table-0") == 0 || strcmp(rest, "table-1") == 0) {
                int k = rest[6] - '0';

                safe_close(ms->old_table[k]);
                ms->old_table[k] = fd;
                return 1;
        }
        for (int k = 0; k < MS_TIERS; k++) {
                size_t l = strlen(ms_tier_names[k]);

                if (strncmp(rest, ms_tier_names[k], l) != 0 || rest[l] != '-')
                        continue;
                errno = 0;
                id = strtoul(rest + l + 1, &end, 10);
                if (errno || *end || end == rest + l + 1 || id >= ms->n_segs[k]) {
                        log_info("Memory store: '%s' is not a segment of the %s pool as configured now: dropped",
                                 name, ms_tier_names[k]);
                        inherited_drop(name, fd);
                        return 1;
                }
                safe_close(ms->old_seg[k][id]);
                ms->old_seg[k][id] = fd;
                return 1;
        }
        log_info("Memory store: an fd named '%s' is not one tierd knows: dropped", name);
        inherited_drop(name, fd);
        return 1;
}

static uint32_t header_crc(const MsHeader *h) {
        return crc32c(0, h, offsetof(MsHeader, crc));
}

static uint32_t record_crc(const MsRecord *r) {
        return crc32c(0, (const uint8_t *) r + sizeof(r->seq), offsetof(MsRecord, crc) - sizeof(r->seq));
}

int ms_by_keys(const void *a, const void *b) {
        const MsRecord *x = a, *y = b;

        if (x->job_key != y->job_key)
                return x->job_key < y->job_key ? -1 : 1;
        return x->tensor_key < y->tensor_key ? -1 : x->tensor_key > y->tensor_key;
}

/* By keys, then by seq: a tensor's newest record last. */
static int by_keys_seq(const void *a, const void *b) {
        const MsRecord *x = a, *y = b;
        int c = ms_by_keys(a, b);

        return c ? c : x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Read the table behind @fd (its header @h sound and of these pools): the inodes, the sound records. */
static int load_table(MemStore *ms, int fd, const MsHeader *h, unsigned *ret_torn) {
        size_t at = records_at(h->n_segs), size = at + (size_t) h->n_records * MS_REC_SIZE;
        const uint64_t *ino;
        struct stat st;
        uint8_t *map;
        unsigned torn = 0;
        size_t kept = 0;

        if (fstat(fd, &st) < 0)
                return negative_errno();
        if ((uint64_t) st.st_size < size)
                return -EBADMSG;
        map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED)
                return negative_errno();
        ms->old = calloc(MAX(h->n_records, 1u), sizeof(MsRecord));
        if (!ms->old) {
                munmap(map, size);
                return -ENOMEM;
        }
        ino = (const uint64_t *) (const void *) (map + MS_HEADER_SIZE);
        for (int k = 0; k < MS_TIERS; k++)
                for (uint32_t i = 0; i < ms->n_segs[k]; i++)
                        ms->old_ino[k][i] = ino[(k == MS_HOST ? 0 : ms->n_segs[MS_HOST]) + i];
        for (uint32_t i = 0; i < h->n_records; i++) {
                MsRecord r;

                memcpy(&r, map + at + (size_t) i * MS_REC_SIZE, sizeof(r));
                if (r.seq == 0)
                        continue;
                if (r.crc != record_crc(&r) || !r.job_key || !r.tensor_key) {
                        torn++;
                        continue;
                }
                ms->old[ms->n_old++] = r;
        }
        munmap(map, size);
        /*
         * Two sound records of one tensor: a kill came after its new record was
         * written and before the old one was freed (memstore_note()): the newer
         * (higher seq) is what was current.
         */
        qsort(ms->old, ms->n_old, sizeof(MsRecord), by_keys_seq);
        for (size_t i = 0; i < ms->n_old; i++)
                if (kept > 0 && ms_by_keys(&ms->old[kept - 1], &ms->old[i]) == 0)
                        ms->old[kept - 1] = ms->old[i];
                else
                        ms->old[kept++] = ms->old[i];
        ms->n_old = kept;
        *ret_torn = torn;
        return 0;
}

static bool read_header(int fd, MsHeader *h) {
        if (fd < 0 || pread(fd, h, sizeof(*h), 0) != (ssize_t) sizeof(*h))
                return false;
        return memcmp(h->magic, MS_MAGIC, 8) == 0 && h->crc == header_crc(h);
}

static void load(MemStore *ms, unsigned segs) {
        MsHeader h[2] = {}, *use = NULL;
        unsigned torn = 0;
        bool ok[2];
        int r;

        for (int i = 0; i < 2; i++)
                ok[i] = read_header(ms->old_table[i], &h[i]);
        if (ok[0] || ok[1]) {
                ms->old_no = ok[1] && (!ok[0] || h[1].generation > h[0].generation) ? 1 : 0;
                use = &h[ms->old_no];
                ms->old_generation = use->generation;
        }
        if (!use) {
                if (segs > 0 || ms->old_table[0] >= 0 || ms->old_table[1] >= 0)
                        log_warning("Memory store: %u segment(s) handed back, but no sound table of where the "
                                    "tensors lie: their memory is not used (tensors held only there are lost)", segs);
                return;
        }
        if (use->format != MS_FORMAT || use->rec_size != MS_REC_SIZE) {
                log_warning("Memory store: a table of format %u (records of %u bytes) from another tierd version: "
                            "not used, the memory it describes is dropped", use->format, use->rec_size);
                return;
        }
        if (use->n_records > MS_MAX_RECORDS) {
                log_warning("Memory store: the table of the last run says %" PRIu32 " records, more than the %u "
                            "a table holds: damaged, not used (the memory it describes is dropped)",
                            use->n_records, MS_MAX_RECORDS);
                return;
        }
        for (int k = 0; k < MS_TIERS; k++)
                if (use->seg_size[k] != ms->seg_size[k] || use->n_segs[k] != ms->n_segs[k]) {
                        log_warning("Memory store: the %s pool was %" PRIu32 " segment(s) of %" PRIu64 " bytes and is "
                                    "%" PRIu32 " of %" PRIu64 " now: the memory of the last run is not used",
                                    ms_tier_names[k], use->n_segs[k], use->seg_size[k], ms->n_segs[k], ms->seg_size[k]);
                        return;
                }
        r = load_table(ms, ms->old_table[ms->old_no], use, &torn);
        if (r < 0) {
                log_warning_errno(r, "Memory store: cannot read the table of the last run, its memory is not used: %m");
                return;
        }
        ms->usable = true;
        log_info("Memory store: the last run's table (generation %" PRIu64 ") lists %zu tensor(s) with copies in "
                 "memory, %u of its records cut short (not used); %u segment(s) handed back",
                 use->generation, ms->n_old, torn, segs);
}


void memstore_load(MemStore *ms) {
        unsigned segs = 0;

        if (!ms)
                return;
        for (int k = 0; k < MS_TIERS; k++)
                for (uint32_t i = 0; i < ms->n_segs[k]; i++)
                        segs += ms->old_seg[k][i] >= 0;
        load(ms, segs);
        if (!ms->usable)
                for (int k = 0; k < MS_TIERS; k++)
                        for (uint32_t i = 0; i < ms->n_segs[k]; i++)
                                ms_old_segment_drop(ms, k, i);
}

int memstore_take_segment(MemStore *ms, int tier, uint32_t id, uint64_t size) {
        int k = ms_tier(tier), fd;
        struct stat st;

        if (!ms || !ms->usable || id >= ms->n_segs[k] || ms->old_seg[k][id] < 0)
                return -1;
        fd = ms->old_seg[k][id];
        /* the memfd the table names (not one the store kept from before a renewal), of the pool's size */
        if (fstat(fd, &st) < 0 || (uint64_t) st.st_size != size || ms->old_ino[k][id] == 0 ||
            (uint64_t) st.st_ino != ms->old_ino[k][id]) {
                ms_old_segment_drop(ms, k, id);
                return -1;
        }
        ms->old_seg[k][id] = -1;
        ms->adopted[k][id] = true;
        return fd;
}

static uint64_t *table_ino(MemStore *ms, int k, uint32_t id) {
        return (uint64_t *) (void *) (ms->map + MS_HEADER_SIZE) + (k == MS_HOST ? 0 : ms->n_segs[MS_HOST]) + id;
}

void memstore_segment_made(MemStore *ms, int tier, const Segment *seg) {
        char name[64];
        int k = ms_tier(tier);
        struct stat st;

        if (!ms || ms->frozen || seg->fd < 0 || seg->id >= ms->n_segs[k] || fstat(seg->fd, &st) < 0)
                return;
        /* not current in the store until it is in: a kill meanwhile leaves the segment unused */
        ms_segment_stored(ms, k, seg->id, 0);
        ms_seg_name(k, seg->id, name, sizeof(name));
        /* what the store had under the name (the memory before a renewal) goes */
        ms_store_remove(ms, name);
        ms_store_put(ms, name, seg->fd, k, seg->id, (uint64_t) st.st_ino);
}

/* ---- this run's table ----------------------------------------------------------------------------- */

static int table_map(MemStore *ms, uint32_t cap) {
        size_t size = ms->rec_at + (size_t) cap * MS_REC_SIZE;
        void *map;

        if (ftruncate(ms->fd, (off_t) size) < 0)
                return negative_errno();
        map = ms->map ? mremap(ms->map, ms->map_size, size, MREMAP_MAYMOVE)
                      : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, ms->fd, 0);
        if (map == MAP_FAILED)
                return negative_errno();
        ms->map = map;
        ms->map_size = size;
        ms->cap = cap;
        return 0;
}

static void header_write(MemStore *ms, uint64_t generation) {
        MsHeader h = {
                .format = MS_FORMAT,
                .rec_size = MS_REC_SIZE,
                .n_records = ms->cap,
                .generation = generation,
        };

        memcpy(h.magic, MS_MAGIC, 8);
        for (int k = 0; k < MS_TIERS; k++) {
                h.n_segs[k] = ms->n_segs[k];
                h.seg_size[k] = ms->seg_size[k];
        }
        h.crc = header_crc(&h);
        memcpy(ms->map, &h, sizeof(h));
        __atomic_thread_fence(__ATOMIC_RELEASE);
}

static MsRecord *slot_at(MemStore *ms, uint32_t slot) {
        return (MsRecord *) (void *) (ms->map + ms->rec_at + (size_t) slot * MS_REC_SIZE);
}

static int slot_get(MemStore *ms, uint32_t *ret) {
        if (ms->n_free > 0) {
                *ret = ms->free_slots[--ms->n_free];
                return 0;
        }
        if (ms->next_slot == ms->cap) {
                uint32_t cap = ms->cap * 2;
                uint32_t *f;
                int r;

                if (ms->cap >= MS_MAX_RECORDS)
                        return -ENOSPC;
                /* the free list first: when the table cannot grow, the larger list is harmless */
                f = reallocarray(ms->free_slots, cap, sizeof(uint32_t));
                if (!f)
                        return -ENOMEM;
                ms->free_slots = f;
                r = table_map(ms, cap);
                if (r < 0)
                        return r;
                header_write(ms, ms->old_generation + 1);
        }
        *ret = ms->next_slot++;
        return 0;
}

/* Free @slot: its record reads as absent from now on (seq 0), and the slot may be taken again. */
static void slot_put(MemStore *ms, uint32_t slot) {
        __atomic_store_n(&slot_at(ms, slot)->seq, 0, __ATOMIC_RELEASE);
        ms->free_slots[ms->n_free++] = slot;
}

/* What @t's record says now: false when it has no copy worth keeping. */
static bool record_build(MemStore *ms, const Tensor *t, MsRecord *rec) {
        bool any = false;

        *rec = (MsRecord) {
                .job_key = t->job->book_key,
                .tensor_key = t->book_key,
                .alloc_size = t->alloc_size,
                .version = t->version,
        };
        for (int tier = 0; tier < TIERS; tier++) {
                const Copy *c = &t->copy[tier];
                /*
                 * Put back held for writing by the last run (a ghost): recorded as it was
                 * there, so that another restart before its client attaches again finds
                 * it so too; with, for a write-only pin's, the copy of the version before.
                 */
                bool ghost = (t->ghost >> tier) & 1;
                bool before = t->ghost_unwritten && c->version > 0 && c->version + 1 == t->version;
                MsCopy *mc;

                if (tier == LEVEL_NVME || c->n_pieces == 0 || (t->version == 0 && c->writers == 0 && !ghost))
                        continue;       /* (zeros need no copy, unless a client is writing it) */
                if (c->state != COPY_RESIDENT && c->state != COPY_DRAINING)
                        continue;
                /*
                 * A copy held for writing holds what its client wrote (a dead or lost
                 * tensor's too: that write mends it); else only the valid copy of a
                 * tensor whose bytes count: not a stale one, not one reserved for a
                 * writer that never wrote, nothing of a lost or dead tensor.
                 */
                if (c->writers == 0 && !ghost && !before &&
                    (c->version != t->version || c->unwritten || t->lost || t->dead))
                        continue;
                if (c->n_pieces > MS_MAX_PIECES || strcmp(c->pieces[0].seg->pool->kind, "memfd") != 0) {
                        if (!ms->warned_pieces && c->n_pieces > MS_MAX_PIECES)
                                log_info("Memory store: tensor '%s' of job '%s' lies in %" PRIu32 " pieces, more than "
                                         "the %d a record holds: its memory copy is not kept across restarts (nor are "
                                         "others like it; logged once)", t->name, t->job->name, c->n_pieces,
                                         MS_MAX_PIECES);
                        ms->warned_pieces = ms->warned_pieces || c->n_pieces > MS_MAX_PIECES;
                        continue;
                }
                mc = &rec->copy[ms_tier(tier)];
                mc->version = c->version;
                mc->state = c->writers > 0 ? MS_WRITING : MS_VALID;
                mc->n_ranks = copy_write_ranks(t, tier, rec->ranks[ms_tier(tier)]);
                if (c->writers > 0) {
                        mc->flags = c->unwritten ? MS_C_UNWRITTEN | (t->dead ? MS_C_DEAD_BEFORE : 0) : 0;
                        mc->writer_rank = c->writer_rank;
                } else if (ghost) {
                        bool unwritten = (t->ghost_unwritten >> tier) & 1;

                        mc->version = c->version - 1;   /* (held for writing: its write's version is one more) */
                        mc->state = MS_WRITING;
                        mc->flags = unwritten ? MS_C_UNWRITTEN | (t->ghost_dead_before ? MS_C_DEAD_BEFORE : 0) : 0;
                        mc->writer_rank = unwritten ? t->ghost_rank : c->writer_rank;
                }
                mc->n_pieces = (uint8_t) c->n_pieces;
                for (uint32_t i = 0; i < c->n_pieces; i++)
                        mc->pieces[i] = (MsPiece) {
                                .seg = c->pieces[i].seg->id,
                                .offset = c->pieces[i].offset,
                                .len = c->pieces[i].len,
                        };
                any = true;
        }
        if (t->dead || t->ghost_dead_before)
                rec->dead_rank = t->dead_rank;  /* (a read of it fails naming that rank's plan, after a restart too) */
        if (!any && t->dead && t->version > 0) {
                rec->flags |= MS_F_DEAD;        /* nothing lost with it: the next start can say so */
                return true;
        }
        return any;
}

/* store-kill: SIGKILL ourselves at this point of a record write when a rule says so (tests only). */
static bool store_kill(MemStore *ms, const char *where) {
        if (!ms->faults || !fault_fire(ms->faults, FAULT_STORE_KILL, UINT32_MAX, FAULT_TARGET_ANY))
                return false;
        log_warning("Injected fault store-kill: SIGKILL %s a memory-store record write", where);
        return true;
}

/* Write @rec into slot @s: its seq 0 while the rest changes and set last, so a kill halfway leaves the slot free. */
static void slot_write(MemStore *ms, uint32_t s, MsRecord *rec) {
        MsRecord *slot = slot_at(ms, s);
        const size_t body = MS_REC_SIZE - sizeof(rec->seq);

        rec->crc = record_crc(rec);
        rec->seq = ++ms->seq;
        __atomic_store_n(&slot->seq, 0, __ATOMIC_RELEASE);
        if (store_kill(ms, "halfway through")) {
                memcpy((uint8_t *) slot + sizeof(rec->seq), (const uint8_t *) rec + sizeof(rec->seq), body / 2);
                (void) raise(SIGKILL);
        }
        memcpy((uint8_t *) slot + sizeof(rec->seq), (const uint8_t *) rec + sizeof(rec->seq), body);
        __atomic_store_n(&slot->seq, rec->seq, __ATOMIC_RELEASE);
}

void memstore_note(MemStore *ms, Tensor *t) {
        MsRecord rec;
        uint32_t s;
        bool keep;
        int r;

        if (!ms || ms->frozen || !ms->map)
                return;
        keep = t->book_key && t->job->book_key && !t->doomed && record_build(ms, t, &rec);
        if (!keep) {
                if (t->mem_slot) {
                        slot_put(ms, t->mem_slot - 1);
                        t->mem_slot = 0;
                        ms->n_records--;
                }
                return;
        }
        /*
         * Into a free slot, and only then the record it replaces freed: a kill at
         * any point leaves one sound record of the tensor, the old or the new (both
         * sound: the higher seq is the newer, load_table() keeps that one).
         */
        r = slot_get(ms, &s);
        if (r < 0) {
                if (!ms->warned_full)
                        log_warning_errno(r, "Memory store: no room for more records (%u): memory copies of "
                                          "more tensors are not kept across restarts, and a kill halfway "
                                          "through a record's update loses that tensor's: %m", ms->cap);
                ms->warned_full = true;
                if (!t->mem_slot)
                        return;
                slot_write(ms, t->mem_slot - 1, &rec);  /* in place: the table is full */
                return;
        }
        slot_write(ms, s, &rec);
        if (store_kill(ms, "after the new record and before the old one is freed in"))
                (void) raise(SIGKILL);
        if (t->mem_slot)
                slot_put(ms, t->mem_slot - 1);
        else
                ms->n_records++;
        t->mem_slot = s + 1;
}

/* A table of a last run made void in place: its header no longer reads as sound.  0, or -1 with errno. */
static int table_void(int fd) {
        static const char zeros[sizeof(((MsHeader *) NULL)->magic)];

        return pwrite(fd, zeros, sizeof(zeros), offsetof(MsHeader, magic)) == (ssize_t) sizeof(zeros) ? 0 : -1;
}

/*
 * From now on this run changes the memory the last run's tables describe: they
 * are made void in place (the store holds the same files, so whether it has
 * taken their removal yet does not matter), and a next start that finds no
 * newer table loses what was only in memory, never reads it wrong.  Out of the
 * store too, but for the name @keep (the new table took it; -1: none).
 */
static void old_tables_drop(MemStore *ms, int keep) {
        char name[64];

        for (int i = 0; i < 2; i++) {
                if (ms->old_table[i] >= 0 && table_void(ms->old_table[i]) < 0)
                        log_warning_errno(errno, "Memory store: cannot make the last run's table %d void: %m", i);
                ms->old_table[i] = safe_close(ms->old_table[i]);
                if (i != keep) {
                        snprintf(name, sizeof(name), MEMSTORE_FD_PREFIX "table-%d", i);
                        ms_store_remove(ms, name);
                }
        }
}

/* memstore_begin() cannot make its table: no memory is kept, and the last run's tables must not stay sound. */
static int begin_failed(MemStore *ms, int error) {
        if (ms->map)
                munmap(ms->map, ms->map_size);
        ms->map = NULL;
        ms->fd = safe_close(ms->fd);
        old_tables_drop(ms, -1);
        return log_warning_errno(error, "Memory store: cannot make its table, memory is not kept across restarts: %m");
}

int memstore_begin(MemStore *ms, Registry *r) {
        char name[64];
        unsigned renewed = 0;
        int fd, q;

        if (!ms)
                return 0;
        free(ms->old);
        ms->old = NULL;
        ms->n_old = 0;

        /* memory of the last run that holds nothing put back: fresh before any job gets it */
        for (int tier = 0; tier < TIERS; tier++) {
                SegPool *pool = tier == LEVEL_NVME ? NULL : r->pools[tier];
                int k = ms_tier(tier);

                if (!pool)
                        continue;
                for (uint32_t i = 0; i < ms->n_segs[k] && i < pool->n_segs; i++) {
                        ms->old_seg[k][i] = safe_close(ms->old_seg[k][i]);
                        if (ms->adopted[k][i] && !pool->segs[i].owner) {
                                q = segpool_renew_free(pool, &pool->segs[i]);
                                if (q < 0)
                                        log_warning_errno(q, "Memory store: cannot renew %s segment %" PRIu32 ": %m",
                                                          ms_tier_names[k], i);
                                renewed++;
                        }
                }
        }
        if (renewed)
                log_debug("Memory store: %u segment(s) of the last run held nothing put back: renewed", renewed);

        if (ms->faults && fault_fire(ms->faults, FAULT_STORE_TABLE, UINT32_MAX, FAULT_TARGET_ANY))
                return begin_failed(ms, -EMFILE);       /* store-table (tests only) */
        fd = memfd_create("tierd-mem-table", MFD_CLOEXEC);
        if (fd < 0)
                return begin_failed(ms, -errno);
        ms->fd = fd;
        ms->rec_at = records_at(ms->n_segs);
        q = table_map(ms, MS_INITIAL_RECORDS);
        if (q >= 0) {
                ms->free_slots = calloc(ms->cap, sizeof(uint32_t));
                if (!ms->free_slots)
                        q = -ENOMEM;
        }
        if (q < 0)
                return begin_failed(ms, q);
        header_write(ms, ms->old_generation + 1);
        /* the segments the store holds now (made at start, before the table) */
        for (int k = 0; k < MS_TIERS; k++)
                for (uint32_t i = 0; i < ms->n_segs[k]; i++)
                        *table_ino(ms, k, i) = ms->stored_ino[k][i];
        list_for_each_safe(jn, jtmp, &r->jobs) {
                Job *j = list_entry(jn, Job, link);

                list_for_each_safe(tn, ttmp, &j->tensors)
                        memstore_note(ms, list_entry(tn, Tensor, job_link));
        }

        /* the new table in, under the other name, then the old one out */
        ms->table_no = ms->old_no ^ 1;
        snprintf(name, sizeof(name), MEMSTORE_FD_PREFIX "table-%u", ms->table_no);
        ms_store_remove(ms, name);
        ms_store_put(ms, name, ms->fd, -1, 0, 0);
        /*
         * Before READY=1 and before any client is served: the segments renewed
         * above and the new table with the service manager, or a kill soon after
         * the start would find the old table there.  It waits on the service
         * manager reading its socket, which it does at once (or on nothing).
         */
        if (!ms_queue_wait(ms, MS_START_WAIT_USEC))
                log_warning("Memory store: the service manager has not taken %zu message(s) in %u s (the new "
                            "table among them): until it has, a kill of tierd loses what is only in memory",
                            ms->n_queue, (unsigned) (MS_START_WAIT_USEC / USEC_PER_SEC));
        old_tables_drop(ms, ms->table_no);
        log_info("Memory store: on (host%s memory is kept in the service manager's fd store across restarts); "
                 "%u tensor(s) put back from the last run's memory", ms->n_segs[MS_VRAM] ? " and emulated VRAM" : "",
                 ms->restored);
        return 0;
}

void memstore_set_faults(MemStore *ms, FaultSet *faults) {
        if (ms)
                ms->faults = faults;
}

void memstore_freeze(MemStore *ms) {
        if (ms)
                ms->frozen = true;
}
