/* SPDX-License-Identifier: MIT */
/* capbound.h: the fewest NVMe and link bytes per step a cyclic iteration plan needs under VRAM and host capacities. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Tiers and modes of an access, as in the plan (VRAM above host; NVMe below both, unbounded). */
#define CB_VRAM 0u
#define CB_HOST 1u
#define CB_READ 1u
#define CB_WRITE 2u

/* Most tensors and accesses per phase a plan may have here: bounded work and memory. */
#define CB_MAX_TENSORS 4096u
#define CB_MAX_ACCESSES 65536u

typedef struct CbAccess {
        uint32_t tensor;                /* index into CbPlan.size */
        uint8_t tier;                   /* CB_VRAM or CB_HOST */
        uint8_t mode;                   /* CB_READ, CB_WRITE or both */
} CbAccess;

/*
 * One step of the plan: phase k's accesses are acc[start[k]] up to
 * acc[start[k + 1]]; the step repeats for ever.
 */
typedef struct CbPlan {
        size_t n_tensors;
        const uint64_t *size;           /* bytes of each tensor */
        size_t n_phases;
        const size_t *start;            /* n_phases + 1 entries */
        const CbAccess *acc;
} CbPlan;

/* Bytes per step in steady state (a mean over the cycle the simulation settles in). */
typedef struct CbBytes {
        double nvme_read;               /* NVMe -> host */
        double nvme_write;              /* host -> NVMe */
        double link_up;                 /* host -> VRAM */
        double link_down;               /* VRAM -> host */
} CbBytes;

/* Eviction rules of one simulated schedule (capbound_min() tries them all). */
typedef enum CbRule {
        CB_RULE_FARTHEST,       /* Belady: the farthest next use; cheaper drop on a tie */
        CB_RULE_COST,           /* next use / (cost of dropping + cost of bringing back) */
        CB_RULE_FREE_FIRST,     /* any copy that is free to drop first (farthest), then Belady */
        CB_RULE_CHEAPEST,       /* the least cost of dropping and bringing back; farthest on a tie */
        CB_RULES,
        /*
         * or'ed in: a host copy's next use counts a VRAM read even while VRAM
         * holds the tensor when the VRAM copy cannot last until then (the
         * other tensors pinned in VRAM in between exceed its room)
         */
        CB_RULE_INCLUSIVE = 0x10,
        /*
         * or'ed in: hold two phases at a time, as tierd's timeline policy does:
         * while phase k runs, phase k + 1's accesses are pinned too (and brought
         * in), except a read in one tier of what phase k writes in another
         */
        CB_RULE_HELD2 = 0x20,
        /*
         * or'ed in: at the start of every phase a host copy whose next access is a
         * VRAM read moves up (the nearest first) when VRAM has room, after dropping
         * there what is free to drop (not the sole copy, or dead) and needed later
         * than it; the host copy goes (tierd's prefetch into VRAM ahead of a VRAM
         * access; the host copy is then the first victim there)
         */
        CB_RULE_UPSTAGE = 0x40,
        /*
         * or'ed in: a sole host copy that would be written down to make host
         * room moves up to VRAM instead (parked) when VRAM has the room after
         * dropping copies free to drop there; with a plan of waits
         * (capbound_planned()) only the copies it keeps in memory
         */
        CB_RULE_PARK = 0x80,
} CbRule;

/*
 * capbound_simulate() - one schedule for @p under capacities @vram_cap and
 * @host_cap (bytes; NVMe unbounded): tierd's data path with eviction rule
 * @rule, whose costs weigh an NVMe byte @w_nvme and a link byte @w_link.
 * Simulates steps until the state at a step's start repeats (at most
 * @max_steps) and stores the bytes per step of that cycle in *@ret.
 * -EINVAL for a malformed plan, -E2BIG when one phase's accesses in a tier
 * exceed its capacity (no schedule exists), -ENOMEM, -ETIME when no cycle
 * was found in @max_steps steps (*@ret then holds the mean of the last half).
 */
int capbound_simulate(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, CbRule rule, double w_nvme,
                      double w_link, unsigned max_steps, CbBytes *ret);

/*
 * capbound_min() - the fewest bytes per step found: every rule, once
 * minimising NVMe bytes and once link bytes.  Each is the cost of a schedule
 * the model allows, so at or above the true minimum (capbound_exact() finds
 * fewer on a few tiny plans): the least found, not a lower bound; for one,
 * capbound_floor() and capbound_lower().  *@nvme gets the NVMe-minimising
 * schedule's bytes (nvme_read + nvme_write smallest), *@link the
 * link-minimising one's (link_up + link_down smallest); each may be NULL.
 * Errors as capbound_simulate() (-ETIME is not an error here: the mean is used).
 */
int capbound_min(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, CbBytes *nvme, CbBytes *link);

/*
 * capbound_min_held() - capbound_min() with @held phases pinned at a time:
 * 1 is capbound_min(), 2 the schedules that hold the next phase while one
 * runs (CB_RULE_HELD2), as tierd's timeline policy does.  What the second
 * costs over the first is the price of that design, not of a schedule.
 * -EINVAL for another @held; -E2BIG also when two consecutive phases do not fit.
 */
int capbound_min_held(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, unsigned held, CbBytes *nvme,
                      CbBytes *link);

/*
 * capbound_floor() - bytes per step that every schedule of the model needs,
 * proven, not simulated (so at or below capbound_min()'s, often well
 * below):
 *   NVMe: at any phase the tensors it pins, and those not pinned whose
 *   next access reads them, that do not fit VRAM and host together are on
 *   NVMe only and are read back within a step (nvme_read); of them, all but
 *   those never written must have been written there within the step
 *   (nvme_write); the phase with the most such bytes counts;
 *   link: a read in one tier of a version written in the other crosses
 *   the link once (host -> VRAM: link_up, VRAM -> host: link_down), and at
 *   any phase the tensors pinned in VRAM or read there next (no write in
 *   between) beyond VRAM's room come up again (link_up when more).
 * -EINVAL for a malformed plan, -ENOMEM.
 */
int capbound_floor(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, CbBytes *ret);

/* A lower bound on the step time from when bytes can move, not only how many (capbound_time()). */
typedef struct CbTime {
        double step_s;                  /* the bound: at least the compute of a step */
        size_t from, to;                /* the window that gives it: phases from .. to (cyclic); from == to == SIZE_MAX:
                                         * none beats the compute */
        double read_bytes;              /* NVMe bytes that must arrive within it (beyond memory's room at its start) */
        double write_bytes;             /* NVMe bytes written in it that must leave within it (beyond room at its end) */
        double up_bytes;                /* host -> VRAM bytes likewise (beyond VRAM's room) */
} CbTime;

/*
 * capbound_time() - a lower bound on the time of one step of @p under
 * capacities @vram_cap and @host_cap, with @compute[k] seconds of compute in
 * phase k, NVMe reads at @nvme_bw bytes/s and host -> VRAM copies at @link_bw
 * bytes/s (0: no bound from that link), proven, not simulated:
 *   at the start of a phase a, VRAM and host hold at most vram_cap +
 *   host_cap bytes.  Every tensor that some phase from a to k reads before
 *   writing (its first access in that window reads it) must be in memory at
 *   its phase, so all of them beyond that room arrive from NVMe after a
 *   starts and before k starts, one read after another: phase k starts at
 *   least (bytes - vram_cap - host_cap) / nvme_bw after a, however long the
 *   compute of a .. k - 1 is.  And what a .. k - 1 write that is read again
 *   later (not overwritten first) must be in memory or on NVMe when k
 *   starts: beyond that room it is written to NVMe within the window too,
 *   on the same drive.  Likewise the tensors read in VRAM first beyond
 *   vram_cap cross the link.  The step is then at least its compute plus the
 *   largest excess of such a wait over the compute of the phases it spans,
 *   over every window (a, k).
 * Where the least bytes a step needs (capbound_floor()) fill the links only
 * on average, this bound sees a burst: the optimizer's reads that no memory
 * can take before the backward pass ends.  It and the floor's bytes over
 * the links are both lower bounds, and capbound_lower() takes the larger;
 * capbound_min()'s bytes are not one (the least found, a heuristic).
 * -EINVAL for a malformed plan or a negative compute, -E2BIG for a plan too
 * large to scan (n_phases x accesses over 10^8), -ENOMEM.  Past n_phases^2 x
 * n_tensors of 10^8 the writes are left out (a weaker bound, still one).
 * Reads and writes share @nvme_bw, as they share a drive.
 */
int capbound_time(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, const double *compute, double nvme_bw,
                  double link_bw, CbTime *ret);

/* capbound_window()'s bound and what gives it. */
typedef struct CbWindow {
        double step_s;                  /* the bound: at least capbound_time()'s */
        size_t from, to;                /* the window that gives it (SIZE_MAX: none beats compute + gaps) */
        double gaps_s;                  /* idle time at phase boundaries: crossings no phase can overlap */
        double read_bytes;              /* NVMe bytes beyond memory's room the window must read */
        double write_bytes;             /* and write (versions it makes that memory cannot hold at its end) */
        double link_bytes;              /* link bytes it must move (crossings, ups beyond VRAM's room) */
        bool after_end;                 /* they are counted from the end of its first phase (the room argument) */
} CbWindow;

/*
 * capbound_window() - a lower bound on a step of @p, at or above
 * capbound_time()'s (same arguments), proven, not simulated
 * (bench/capbound-window.c): capbound_time()'s windows, and
 *   - room: until a window's first phase ends, none of the tensors it needs
 *     has been used, so none has left memory: the reads beyond memory's room,
 *     and the writes of the versions the window makes, all happen after
 *     that phase ends (the part of the reads staged through host on to VRAM,
 *     which the model charges no room, may cross the link then instead);
 *   - crossings: a version written in one tier and read in the other
 *     crosses the link between the end of its writing phase and the start
 *     of that read: those inside a window load the link there, beside the
 *     ups beyond VRAM's room (up and down share the link);
 *   - gaps: a crossing whose read is in the phase right after its write
 *     runs while no phase does: idle time, added to the step outside the
 *     window that gives the bound.
 * Errors as capbound_time().  The crossings are left out past n_phases^2 x
 * their number of 10^8 (a weaker bound, still one).
 */
int capbound_window(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, const double *compute, double nvme_bw,
                    double link_bw, CbWindow *ret);

/*
 * capbound_lower() - the best lower bound on a step of @jobs jobs of @p known
 * here, each under capacities @vram_cap and @host_cap, sharing links of
 * @nvme_bw and @link_bw bytes/s (0: no bound from that link): the larger of
 * capbound_window() for one job (at best both links whole during its
 * burst; capbound_time()'s window in *@ret_time, which may be below it) and
 * max(compute, @jobs x capbound_floor()'s NVMe bytes / @nvme_bw, @jobs x its
 * link bytes / @link_bw).  Only proven terms:
 * capbound_min()'s bytes do not enter.  Errors as capbound_time(), and
 * -EINVAL for @jobs 0.
 */
int capbound_lower(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, const double *compute, double nvme_bw,
                   double link_bw, unsigned jobs, CbTime *ret_time, double *ret_s);

/* A step time a schedule of the model reaches (capbound_planned()). */
typedef struct CbPlanned {
        double step_s;                  /* the fastest step found */
        CbBytes bytes;                  /* that schedule's bytes per step */
        CbRule rule;                    /* and how the model made its placement */
        double w_nvme, w_link;
        uint32_t seed, pct;             /* its perturbation (0, 0: none) */
        bool placed;                    /* its victims follow the cycle's plan of waits (capbound-place.c) first */
        bool built;                     /* built for time from the plan of waits (capbound-build.c), not by a rule */
        uint64_t slack;                 /* built: memory kept for reads ahead (bytes) */
        size_t defer;                   /* built: writes wait while a read is due within this many phases
                                         * (SIZE_MAX: never) */
} CbPlanned;

/*
 * capbound_planned() - the fastest step found for @p by timing the model's
 * schedules (every rule of capbound_min_held(@held)) as a planner that knows
 * the whole cycle would execute them (capbound-timed.c): each copy leaves as
 * soon as its last use before the model drops it is over, arrives as early
 * as its tier has room (in the model's order), on links of @nvme_bw and
 * @link_bw bytes/s (0: instant), one transfer at a time each; a phase runs
 * @compute[k] seconds once what it needs is in place.  An upper end beside
 * capbound_time()'s lower one: a schedule this fast exists in the model.
 * Then @tries perturbed schedules of the best rule (a few victims in a
 * hundred chosen by a seeded hash instead: cb_simulate_log()), a random
 * search for placements that time better than the fewest bytes; then the
 * schedules built for time from the plan of waits (capbound-build.c: what
 * waits where is laid out phase by phase, a copy sent to NVMe stays in
 * memory while there is room, its write waits for the burst's reads).
 * -EINVAL, -E2BIG (a phase does not fit), -ENOMEM, -ETIME when no rule's
 * schedule settles in a cycle.
 */
int capbound_planned(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, unsigned held, const double *compute,
                     double nvme_bw, double link_bw, unsigned tries, CbPlanned *ret);

/*
 * capbound_exact() - the true minimum per step by exhaustive search over the
 * same model, for tiny plans only (@p->n_tensors <= 3): minimises
 * resource @what (0: NVMe bytes, 1: link bytes) over @steps steps and
 * returns the mean of the second half in *@ret.  Exponential: for tests.
 * -E2BIG for a larger plan, -EINVAL, -ENOMEM.
 */
int capbound_exact(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, int what, unsigned steps, double *ret);
