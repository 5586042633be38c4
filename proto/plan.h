/* SPDX-License-Identifier: MIT */
/* plan.h: layout of a plan page, shared by tierd and one client connection. */
#pragma once

#include <stdint.h>

/*
 * Limits on what a plan may make tierd allocate.
 */
#define PLAN_MAX_PHASES 4096
#define PLAN_MAX_ACCESSES 65536
#define PLAN_MAX_SLOTS 16384            /* distinct tensors in one plan */

/* Access modes of a plan entry. */
#define PLAN_READ 1u
#define PLAN_WRITE 2u

/*
 * The page is a memfd mapped MAP_SHARED by both sides and writable by both.
 * The client writes only PlanClientArea; tierd writes everything else and
 * never reads it back (it keeps its own copy of what it needs: the error,
 * each slot's first_piece): every value from the client area is
 * range-checked, and a client that scribbles elsewhere only confuses itself.
 *
 * Marker protocol (tier_phase_enter(k)):
 *   client: phase = k, mark_ns = now; release-store marker = s + 1 << 16 | k;
 *           release-store marker_seq = s + 1;
 *           write 1 to the marker eventfd (tierd wakes up; no reply)
 *   client: wait until ready says marker s + 1 may run, i.e.
 *           ready_seq > s + 1, or ready_seq == s + 1 and ready_phase == k
 *           (sleeping on the connection's wakeup fd, a pipe), or error != 0
 *   tierd:  pins what phase k needs before it sets ready for it (as early as
 *           the policy allows: timeline pins phase k+1 while k runs), and
 *           unpins what the previous marker's phase used once it sees s + 1.
 * ready packs seq and phase: ready = seq << 16 | phase (phase < 2^16).
 *
 * marker packs the marker's seq and phase the same way, in one word: tierd
 * reads marker_seq and then the packed word, and takes the marker from the
 * packed word.  Read from the two fields, a marker can be torn: a client that
 * was ready for marker s + 1 (pinned ahead) may run that phase and write the
 * next marker's phase before tierd has read the first one's, and tierd then
 * read seq s + 1 with phase of marker s + 2; it took that as a client that
 * never entered the phase it pinned ahead, and released that phase's writes
 * clean (lost).  A client that leaves marker 0 (libtier before it wrote it)
 * gets the two fields read as before.
 */
typedef struct PlanClientArea {
        uint64_t marker_seq;    /* number of tier_phase_enter() calls so far */
        uint64_t mark_ns;       /* CLOCK_MONOTONIC of the latest marker */
        uint64_t stall_ns;      /* total time spent waiting in tier_phase_enter() */
        uint32_t phase;         /* phase entered by the latest marker */
        uint32_t pad0;
        uint64_t marker;        /* PLAN_READY(marker_seq, phase) of the latest marker, 0: not written */
        uint64_t reserved[3];
} PlanClientArea;

typedef struct PlanDaemonArea {
        uint64_t ready;         /* seq << 16 | phase: that marker may run */
        int64_t error;          /* != 0: the plan failed (-errno); markers return it */
        uint64_t reserved[6];
} PlanDaemonArea;

/*
 * Where a plan tensor's pinned copy is in one tier (written by tierd before
 * ready).  A copy in one segment: segment, generation, offset.  A copy that
 * spans segments: n_pieces > 1 pieces at pieces[first_piece ..], in the
 * tensor's order; first_piece is fixed for the (slot, tier) when the plan is
 * made (room for as many pieces as the tensor can have there).
 */
typedef struct PlanSlot {
        uint32_t segment;
        uint32_t generation;
        uint64_t offset;
        uint32_t n_pieces;      /* 0 or 1: the fields above say it all */
        uint32_t first_piece;
} PlanSlot;

typedef struct PlanPiece {
        uint32_t segment;
        uint32_t generation;
        uint64_t offset;
        uint64_t length;
} PlanPiece;

typedef struct PlanPage {
        PlanClientArea client;
        PlanDaemonArea daemon;
        /* slots[2 * i + tier] for distinct tensor i (numbered in order of
         * first appearance in the plan), tier 0 = vram, 1 = host; then the
         * pieces (plan_pieces()) */
        PlanSlot slots[];
} PlanPage;

_Static_assert(sizeof(PlanClientArea) == 64, "client area is one cache line");
_Static_assert(sizeof(PlanDaemonArea) == 64, "daemon area is one cache line");

#define PLAN_READY(seq, phase) (((uint64_t) (seq) << 16) | (uint64_t) (phase))
#define PLAN_READY_SEQ(r) ((r) >> 16)
#define PLAN_READY_PHASE(r) ((uint32_t) ((r) & 0xffff))

_Static_assert(sizeof(PlanSlot) == 24 && sizeof(PlanPiece) == 24, "slots and pieces are 24 bytes");
_Static_assert(sizeof(PlanPage) % _Alignof(PlanPiece) == 0 && sizeof(PlanSlot) % _Alignof(PlanPiece) == 0,
               "the pieces after the slots are aligned");

/* The page's pieces, after the slots of @n_slots tensors. */
static inline PlanPiece *plan_pieces(const PlanPage *page, uint32_t n_slots) {
        return (PlanPiece *) (void *) ((uint8_t *) page + sizeof(PlanPage) + (uint64_t) n_slots * 2 * sizeof(PlanSlot));
}

/* Bytes of a page for @n_slots tensors and @n_pieces pieces, in whole pages. */
static inline uint64_t plan_page_size(uint32_t n_slots, uint64_t n_pieces) {
        uint64_t b = sizeof(PlanPage) + (uint64_t) n_slots * 2 * sizeof(PlanSlot) + n_pieces * sizeof(PlanPiece);
        return (b + 4095) / 4096 * 4096;
}
