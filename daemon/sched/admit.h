/* SPDX-License-Identifier: MIT */
/* admit.h: admission of prefetches by simulated occupancy, the lookahead horizon, moves per step. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Plan Plan;
typedef struct Sched Sched;
typedef struct SchedCand SchedCand;
typedef struct Tensor Tensor;

/*
 * plan_window() - how far ahead prefetching may reach by bytes: for vram
 * and host, the largest n such that every tensor phases cur..cur+n touch
 * there fits the job's limit at once (Plan.window), and need[]: the bytes
 * these phases and the first one that does not fit bring in (write-behind
 * makes room for them).
 */
void plan_window(Plan *p);
/* NVMe read bandwidth the lookahead counts on: [nvme] bandwidth x targets, else a typical drive's. */
uint64_t admit_nvme_bw(const Sched *s);
/*
 * sched_admit() - may prefetch @c be issued now?  Only if it survives
 * until its use (admit_survives(); a vram one that would not may
 * be staged in host instead: @c->tier changes).  A refusal is logged and
 * marks the tensor blocked until something moves (Sched.epoch).
 */
bool sched_admit(Sched *s, SchedCand *c);

/*
 * admit_survives() - would a copy of @t brought into @tier now (or there
 * already) stay there until phase cur+@ahead of @p uses it?  Simulates the job's occupancy of
 * @tier phase by phase up to then, from the plan's known future: what each
 * phase needs there that is not there, which copies become victims
 * (Belady's order weighed by the cost of dropping, as victim.c ranks them)
 * after their last use before that phase, which are dropped as dead.  If a
 * phase before @ahead needs room that only evicting @t could give, @t would
 * be read twice: false, with @why saying which phase and how short.
 */
bool admit_survives(Plan *p, Tensor *t, int tier, uint32_t ahead, char *why, size_t why_size);

/*
 * admit_early_room() - may an early read of @t into host (beyond the host
 * window, for deadline @deadline) take its room?  Not when the engine's
 * victims for it (sched_victim_order()) would include a copy that must be
 * read back from NVMe before the horizon's phase (Plan.horizon_ns): that
 * only moves a read within the burst and adds a write.  Free room, dead
 * copies, host duplicates of valid VRAM copies and copies next used after
 * the horizon are taken.  false with @why.
 */
bool admit_early_room(Plan *p, Tensor *t, uint64_t deadline, char *why, size_t why_size);

/*
 * admit_evicted() - will @t's copy in @tier (there now) be evicted before
 * its next use, by the same simulation?  Then a dirty one is worth writing
 * down early, while NVMe is idle (write-behind), since it goes anyway.
 * Monotone in the victim order among one plan's sole copies: one the replay
 * keeps (a copy needed later, evicted first) has every one after it in that
 * order kept too -- their replays end sooner, with at least the same room
 * (the kept one goes before them) -- so write_behind() stops at it instead
 * of replaying each of the others (N replays of O(N) each, per pass).
 */
bool admit_evicted(Plan *p, Tensor *t, int tier);

/*
 * admit_horizon() - how many phases ahead the reads must look from @now:
 * the farthest phase k whose NVMe reads, added to those of the phases
 * before it and read back to back at @bw bytes/s from now, would not be
 * done by its predicted start.  Reads that take longer than the phases
 * before their deadline are so started early, across phase boundaries
 * (the optimizer's reads during backward), however many phases that is.
 * Call after plan_window(): the bytes those reads bring into host beyond
 * the host window are added to need[] (write-behind makes room for them).
 */
uint32_t admit_horizon(Plan *p, uint64_t now, uint64_t bw);

/* Why a move of a tensor into a tier repeats within a step (moves_check()), for the debug log. */
typedef enum MoveWhy {
        MOVE_FIRST,             /* its first move into that tier this step */
        MOVE_DEMAND,            /* a pin: the phase needs it now */
        MOVE_REUSE,             /* its last move there served a use, and it was evicted after it */
        MOVE_REFETCH,           /* a prefetch whose copy of this step was evicted before its use (counted) */
} MoveWhy;

/* Classify a move of @t into @tier (@pin: a hold's pin, else a prefetch) against the step's moves so far. */
MoveWhy moves_check(Plan *p, const Tensor *t, int tier, bool pin);
/* Record a move of @t into @tier (for this step); @used: the copy serves a pin already. */
void moves_note(Plan *p, const Tensor *t, int tier, bool used);
/* A prefetch of @t into @tier landed: noted (and logged, with its reason, when it repeats a move of this step). */
void moves_landed(Plan *p, const Tensor *t, int tier);
/* A hold pinned @t's copy in @tier: the copy moved there served a use. */
void moves_used(Plan *p, const Tensor *t, int tier);
const char *move_why_to_string(MoveWhy w);
