/* SPDX-License-Identifier: MIT */
/* capbound.c: the fewest NVMe and link bytes per step a cyclic iteration plan needs under VRAM and host capacities. */

/*
 * Theory of operation
 *
 * The model is tierd's data path (daemon/engine/op.c ensure_copy(),
 * victim_evict(), advance_drain()), with the job's VRAM and host limits as
 * the capacities and NVMe unbounded.  Per tensor the state is which tiers
 * hold its current version: VRAM, host, NVMe.  A resident VRAM or host copy
 * is always the current version (a write frees the stale copies elsewhere,
 * as tierd does), so occupancy is the sum of the resident tensors' sizes.
 *
 *   - an access in tier X pins the tensor there for its phase; a read (or
 *     read-write) needs the current version in X, a write-only access just
 *     a place (tierd's discard pin: no bytes brought);
 *   - host gets a copy from VRAM (link, VRAM -> host) when VRAM holds it,
 *     else from NVMe (NVMe read);
 *   - VRAM gets a copy only from host (link, host -> VRAM), for a VRAM
 *     access or ahead of one (tierd prefetches into VRAM what a VRAM access
 *     reads next), or parked there: a sole host copy that must leave host
 *     may go up instead of down to NVMe (tierd does not park; a schedule
 *     may); a tensor that is only on NVMe is staged: NVMe -> host, then
 *     host -> VRAM, and the staged host copy may be dropped at once (it is
 *     not the sole copy);
 *   - NVMe gets a copy only from host (NVMe write);
 *   - a copy that is not the only current one is dropped for free (VRAM and
 *     host are an exclusive cache: a VRAM copy needs no host copy);
 *   - dropping the sole VRAM copy drains it to host (link bytes, and it
 *     then takes host room); dropping the sole host copy writes it to NVMe;
 *   - a tensor whose next access is write-only is dead: its copies go for
 *     free and it is never brought back before that write;
 *   - after a phase, every tensor it wrote is valid only where it was written.
 *
 * Relaxation: capacity holds *during* each phase (with everything the phase
 * pins in place) and after every eviction, but data in transit between two
 * phases (a staged copy, a drain passing through host) is not charged room,
 * and phases take no time (the bound is about bytes, not when they move).
 * A real schedule also obeys both, so it needs at least the bytes of the
 * best schedule of this model.
 *
 * capbound_simulate() runs one schedule of the model: accesses in plan
 * order, and when a tier is over its capacity an eviction rule picks the
 * victim among the unpinned copies, by the distance to the copy's next use
 * in that tier (cyclic: the step repeats; a copy that will be stale or dead
 * before its next use there has none) and the weighted cost of dropping it
 * and of bringing it back.  It simulates steps until the state at a step's
 * start repeats: the bytes per step are then the mean over that cycle,
 * exactly the steady state of this schedule.
 *
 * With CB_RULE_UPSTAGE a schedule also moves host copies up ahead of
 * their VRAM reads while VRAM has room: the host room they leave is what
 * the optimizer phases of a training plan need, when the parameters they
 * updated wait in host for the forward pass (8 of 24 NVMe transfers a step
 * of the 8-layer plan held two phases at a time).
 *
 * With CB_RULE_PARK a sole host copy that must leave host goes up to VRAM
 * instead of to NVMe when VRAM has the room (after dropping copies free to
 * drop there): as each optimizer phase of a training plan brings its G and
 * P down from VRAM, the place they leave takes what host must let go (the
 * 8-layer plan: 12 NVMe transfers a step, its proven floor, where the
 * other rules move 16).
 *
 * capbound_min() is the smallest over rules (Belady's farthest next use,
 * next use over cost, free drops first, cheapest first; each with and
 * without upstaging and parking), once weighting only NVMe bytes and
 * once only link bytes: each minimum separately, since
 * max(compute, N/bw_n, L/bw_l) would be a lower bound if N and L were each
 * the least any schedule needs.  They are not: each figure is the cost of a
 * schedule the model allows (the least found), so it can only be at or above
 * the model's true minimum, and the time from it is no bound: Belady's
 * rule is optimal for misses alone, not with write-backs and mixed sizes
 * (both NP-hard in general).  capbound_exact() finds the true minimum by
 * exhaustive search for plans of at most three tensors; the unit tests
 * compare the two there.  capbound_floor() is the other side: bytes every
 * schedule needs, by counting (what cannot fit at some phase, what is
 * written in one tier and read in the other), at or below the true minimum:
 * its bytes, not capbound_min()'s, are what a lower bound on time may use
 * (capbound_lower() in capbound-timed.c).
 */

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "bench/capbound-internal.h"
#include "proto/macro.h"

typedef struct Sim {
        const CbPlan *p;
        uint64_t cap[2], used[2];
        CbRule rule;
        bool inclusive;                 /* CB_RULE_INCLUSIVE */
        bool held2;                     /* CB_RULE_HELD2 */
        bool upstage;                   /* CB_RULE_UPSTAGE */
        bool park;                      /* CB_RULE_PARK */
        uint8_t *tried;                 /* scratch of upstage(), per tensor */
        double w_nvme, w_link;
        uint8_t *st;                    /* B_* per tensor */
        uint8_t *seen;                  /* scratch, per tensor */
        size_t *pin[2];                 /* phase serial + 1 when pinned there */
        size_t serial;                  /* of the phase being run, + 1 */
        size_t phase;
        CbOcc *occ;                       /* every tensor's accesses in step order */
        size_t *occ_start;              /* n_tensors + 1 */
        CbBytes *acc;                   /* the step's bytes */
        uint32_t seed, pct;             /* cb_simulate_log(): pct % of victims by a hash of seed instead */
        const uint8_t *out;             /* cb_simulate_log(): per access, its tensor waits on NVMe after it */
        uint32_t n_evicted;             /* in this phase */
        CbLog *log;                     /* when set, every copy's move is noted (cb_simulate_log()) */
        size_t log_step;                /* the step being noted, from the log's start */
        int log_err;
} Sim;

/* Note a move of @t in the current phase (when a log is kept). */
static void note(Sim *s, uint32_t t, uint8_t kind, unsigned tier) {
        CbLog *l = s->log;

        if (!l || s->log_err)
                return;
        if (l->n == l->cap) {
                size_t nc = l->cap ? l->cap * 2 : 256;
                CbEvent *x = nc > SIZE_MAX / sizeof(CbEvent) ? NULL : realloc(l->ev, nc * sizeof(CbEvent));

                if (!x) {
                        s->log_err = -ENOMEM;
                        return;
                }
                l->ev = x;
                l->cap = nc;
        }
        l->ev[l->n++] = (CbEvent) { .tensor = t, .phase = s->log_step * s->p->n_phases + s->phase, .kind = kind,
                                    .tier = (uint8_t) tier };
}

int cb_plan_check(const CbPlan *p) {
        if (!p || !p->size || !p->start || (!p->acc && p->n_phases > 0) || p->n_phases == 0)
                return -EINVAL;
        if (p->n_tensors == 0 || p->n_tensors > CB_MAX_TENSORS || p->start[0] != 0)
                return -EINVAL;
        for (size_t k = 0; k < p->n_phases; k++)
                if (p->start[k + 1] < p->start[k] || p->start[k + 1] > CB_MAX_ACCESSES)
                        return -EINVAL;
        for (size_t i = 0; i < p->start[p->n_phases]; i++)
                if (p->acc[i].tensor >= p->n_tensors || p->acc[i].tier > CB_HOST ||
                    !(p->acc[i].mode & (CB_READ | CB_WRITE)) || (p->acc[i].mode & ~(CB_READ | CB_WRITE)))
                        return -EINVAL;
        return 0;
}

/* -E2BIG when one phase alone pins more than a tier holds (each tensor counted once per tier). */
static int plan_fits(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap) {
        for (size_t k = 0; k < p->n_phases; k++) {
                uint64_t need[2] = { 0, 0 };

                for (size_t i = p->start[k]; i < p->start[k + 1]; i++) {
                        bool seen = false;

                        for (size_t x = p->start[k]; x < i; x++)
                                if (p->acc[x].tensor == p->acc[i].tensor && p->acc[x].tier == p->acc[i].tier)
                                        seen = true;
                        if (!seen)
                                need[p->acc[i].tier] += p->size[p->acc[i].tensor];
                }
                if (need[CB_VRAM] > vram_cap || need[CB_HOST] > host_cap)
                        return -E2BIG;
        }
        return 0;
}

/*
 * Does @t's VRAM copy have to go before its VRAM read @d phases from now,
 * under any schedule?  Yes when the other tensors the phases in between
 * pin in VRAM add up to more than its room (their stack distance).
 */
static bool vram_reuse_misses(Sim *s, uint32_t t, double d) {
        const CbPlan *p = s->p;
        uint64_t sum = s->p->size[t];
        size_t n = (size_t) d;

        memset(s->seen, 0, p->n_tensors);
        for (size_t k = 1; k < n; k++) {
                size_t ph = (s->phase + k) % p->n_phases;

                for (size_t i = p->start[ph]; i < p->start[ph + 1]; i++) {
                        uint32_t u = p->acc[i].tensor;

                        if (p->acc[i].tier != CB_VRAM || u == t || s->seen[u])
                                continue;
                        s->seen[u] = 1;
                        sum += p->size[u];
                        if (sum > s->cap[CB_VRAM])
                                return true;
                }
        }
        return false;
}

/*
 * The next use of @t's copy in @tier seen from the current phase: its
 * distance in phases (INFINITY: none before the copy goes stale or the
 * tensor dead) and whether the tensor is dead (next access write-only).
 * Accesses of the current phase in the other tier count at distance 0.
 */
static double next_use(Sim *s, uint32_t t, unsigned tier, bool *ret_dead) {
        const CbPlan *p = s->p;
        size_t lo = s->occ_start[t], hi = s->occ_start[t + 1], n = hi - lo, first = lo;
        bool in_vram = s->st[t] & B_VRAM, seen_read = false;

        *ret_dead = false;
        /* the first access at or after the current phase */
        while (first < hi && s->occ[first].phase < s->phase)
                first++;
        for (size_t k = 0; k < 2 * n; k++) {
                size_t idx = lo + (first - lo + k) % n;
                const CbOcc *o = &s->occ[idx];
                bool wrap = (first - lo + k) >= n;
                double d = (double) o->phase + (wrap ? (double) p->n_phases : 0) - (double) s->phase;

                if (d == 0 && o->tier == tier)
                        continue;       /* pinned now: not a candidate anyway */
                if (o->mode == CB_WRITE) {
                        /* overwritten: dead from here if nothing reads it before */
                        *ret_dead = !seen_read;
                        return INFINITY;
                }
                seen_read = true;
                if (o->tier == tier)
                        return d;
                if (tier == CB_VRAM) {
                        /* a host access: the VRAM copy stays current unless it writes */
                        if (o->mode & CB_WRITE)
                                return INFINITY;
                } else {
                        /* a VRAM access: served from VRAM if there, else staged from this host copy */
                        if (!in_vram)
                                return d;
                        if (s->inclusive && (o->mode & CB_READ) && vram_reuse_misses(s, t, d))
                                return d;       /* the VRAM copy cannot last until then */
                        if (o->mode & CB_WRITE)
                                return INFINITY;
                }
        }
        return INFINITY;
}

/* Weighted cost of dropping @t's copy in @tier now, and of bringing it back for its next use. */
static void costs(const Sim *s, uint32_t t, unsigned tier, bool dead, double d, double *ret_drop,
                  double *ret_back) {
        double size = (double) s->p->size[t];
        uint8_t other = tier == CB_VRAM ? (B_HOST | B_NVME) : (B_VRAM | B_NVME);

        *ret_drop = 0;
        if (!dead && !(s->st[t] & other))
                *ret_drop = size * (tier == CB_VRAM ? s->w_link : s->w_nvme);
        *ret_back = 0;
        if (isfinite(d)) {
                if (tier == CB_VRAM)
                        *ret_back = size * s->w_link;
                else
                        *ret_back = size * ((s->st[t] & B_VRAM) ? s->w_link : s->w_nvme);
        }
}

/* Is candidate a (distance @da, drop @xa, back @ba) a better victim than b? */
static bool better(CbRule rule, double da, double xa, double ba, double db, double xb, double bb) {
        switch (rule) {
        case CB_RULE_COST: {
                double sa = xa + ba > 0 ? da / (xa + ba) : INFINITY;
                double sb = xb + bb > 0 ? db / (xb + bb) : INFINITY;

                if (sa != sb)
                        return sa > sb;
                break;
        }
        case CB_RULE_FREE_FIRST:
                if ((xa == 0) != (xb == 0))
                        return xa == 0;
                break;
        case CB_RULE_CHEAPEST:
                if (xa + ba != xb + bb)
                        return xa + ba < xb + bb;
                break;
        default:
                break;
        }
        if (da != db)
                return da > db;
        return xa < xb;
}

static int enforce(Sim *s, unsigned tier);
static bool planned_out(const Sim *s, uint32_t t);

/* Move host's copy of @t up to VRAM, which has the room; the host copy goes. */
static void move_up(Sim *s, uint32_t t) {
        uint64_t size = s->p->size[t];

        s->acc->link_up += (double) size;
        note(s, t, CB_EV_UP, CB_VRAM);
        note(s, t, CB_EV_DROP, CB_HOST);
        s->st[t] = (uint8_t) ((s->st[t] & ~B_HOST) | B_VRAM);
        s->used[CB_HOST] -= size;
        s->used[CB_VRAM] += size;
}

/*
 * CB_RULE_PARK: move host's sole copy of @t up to VRAM instead of writing it
 * down, when VRAM has the room after dropping copies that are free to drop
 * (not the sole one, or dead) and not pinned, the farthest needed first.
 * true when parked.
 */
static bool park(Sim *s, uint32_t t) {
        const CbPlan *p = s->p;
        uint64_t size = p->size[t], freeable = 0;

        if (s->pin[CB_VRAM][t] == s->serial || planned_out(s, t))
                return false;
        for (uint32_t u = 0; u < p->n_tensors; u++)
                if ((s->st[u] & B_VRAM) && s->pin[CB_VRAM][u] != s->serial && (s->st[u] & (B_HOST | B_NVME)))
                        freeable += p->size[u];
        if (s->used[CB_VRAM] + size > s->cap[CB_VRAM] + freeable)
                return false;
        while (s->used[CB_VRAM] + size > s->cap[CB_VRAM]) {
                long v = -1;
                double vd = 0;

                for (uint32_t u = 0; u < p->n_tensors; u++) {
                        bool dead;
                        double d;

                        if (!(s->st[u] & B_VRAM) || s->pin[CB_VRAM][u] == s->serial || !(s->st[u] & (B_HOST | B_NVME)))
                                continue;
                        d = next_use(s, u, CB_VRAM, &dead);
                        if (v < 0 || d > vd) {
                                v = u;
                                vd = d;
                        }
                }
                note(s, (uint32_t) v, CB_EV_DROP, CB_VRAM);
                s->st[v] &= (uint8_t) ~B_VRAM;
                s->used[CB_VRAM] -= p->size[v];
        }
        move_up(s, t);
        return true;
}

/* Drop @t's copy in @tier, writing it down first when it is the sole current one and not dead. */
static int evict(Sim *s, uint32_t t, unsigned tier, bool dead) {
        uint64_t size = s->p->size[t];
        uint8_t other = tier == CB_VRAM ? (B_HOST | B_NVME) : (B_VRAM | B_NVME);
        bool sole = !dead && !(s->st[t] & other);

        if (sole && tier == CB_HOST && s->park && park(s, t))
                return 0;

        if (sole)
                note(s, t, tier == CB_HOST ? CB_EV_WRITE : CB_EV_DRAIN, CB_HOST);
        note(s, t, CB_EV_DROP, tier);
        s->st[t] &= (uint8_t) ~tier_bit(tier);
        s->used[tier] -= size;
        if (!sole)
                return 0;
        if (tier == CB_HOST) {
                s->acc->nvme_write += (double) size;
                s->st[t] |= B_NVME;
                return 0;
        }
        /* drained to host (tierd has no other way down), which may push something out there */
        s->acc->link_down += (double) size;
        s->st[t] |= B_HOST;
        s->used[CB_HOST] += size;
        return enforce(s, CB_HOST);
}

/* Evict until @tier is within its capacity; -E2BIG when everything left there is pinned. */
/* A hash of three numbers (splitmix64's finaliser): the perturbation's dice, the same for the same phase. */
static uint64_t mix3(uint64_t a, uint64_t b, uint64_t c) {
        uint64_t x = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull) * 0xbf58476d1ce4e5b9ull ^ c;

        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
        return x ^ (x >> 31);
}

/* Is @t, not accessed in the current phase, planned to wait on NVMe now (cb_place_gaps())? */
static bool planned_out(const Sim *s, uint32_t t) {
        size_t lo = s->occ_start[t], hi = s->occ_start[t + 1], last = SIZE_MAX;

        if (!s->out || lo == hi)
                return false;
        for (size_t i = lo; i < hi && s->occ[i].phase < s->phase; i++)
                last = i;
        if (last == SIZE_MAX)
                last = hi - 1;  /* its last access of the step before */
        return s->out[s->occ[last].acc];
}

static int enforce(Sim *s, unsigned tier) {
        while (s->used[tier] > s->cap[tier]) {
                long best = -1;
                double bd = 0, bx = 0, bb = 0;
                bool bdead = false;
                int bout = 0;
                /* perturbed: this victim by the dice, from the phase and the count alone (so the schedule settles) */
                bool dice = s->pct && mix3(s->seed, s->phase, s->n_evicted++) % 100 < s->pct;
                uint64_t bh = 0;

                for (uint32_t t = 0; t < s->p->n_tensors; t++) {
                        double d, x, b;
                        int po;
                        bool dead;

                        if (!(s->st[t] & tier_bit(tier)) || s->pin[tier][t] == s->serial)
                                continue;
                        d = next_use(s, t, tier, &dead);
                        costs(s, t, tier, dead, d, &x, &b);
                        if (dice) {
                                uint64_t h = mix3(s->seed, s->phase, t);

                                if (best < 0 || h > bh) {
                                        best = t;
                                        bh = h;
                                        bdead = dead;
                                }
                                continue;
                        }
                        /* with a plan of waits: what is dead first (free), then what it sends to NVMe */
                        po = s->out ? (dead ? 2 : planned_out(s, t) ? 1 : 0) : 0;
                        if (best >= 0 && po != bout) {
                                if (po < bout)
                                        continue;
                        } else if (best >= 0 && !better(s->rule, d, x, b, bd, bx, bb))
                                continue;
                        {
                                bout = po;
                                best = t;
                                bd = d;
                                bx = x;
                                bb = b;
                                bdead = dead;
                        }
                }
                if (best < 0)
                        return -E2BIG;
                int r = evict(s, (uint32_t) best, tier, bdead);
                if (r < 0)
                        return r;
        }
        return 0;
}

static void place(Sim *s, uint32_t t, unsigned tier) {
        s->st[t] |= tier_bit(tier);
        s->used[tier] += s->p->size[t];
}

/* Make access @a of the current phase satisfied; the tiers may be over capacity until the phase's enforce(). */
static void ensure(Sim *s, const CbAccess *a) {
        uint32_t t = a->tensor;
        double size = (double) s->p->size[t];

        if (s->st[t] & tier_bit(a->tier))
                return;
        if (a->mode == CB_WRITE) {
                note(s, t, CB_EV_PLACE, a->tier);
                place(s, t, a->tier);   /* a place, no bytes */
                return;
        }
        if (a->tier == CB_HOST) {
                if (s->st[t] & B_VRAM) {
                        s->acc->link_down += size;
                        note(s, t, CB_EV_DOWN, CB_HOST);
                } else if (s->st[t] & B_NVME) {
                        s->acc->nvme_read += size;
                        note(s, t, CB_EV_READ, CB_HOST);
                } else {
                        note(s, t, CB_EV_PLACE, CB_HOST);       /* never written: zeros, no bytes */
                }
                place(s, t, CB_HOST);
                return;
        }
        if (!(s->st[t] & (B_HOST | B_NVME))) {
                note(s, t, CB_EV_PLACE, CB_VRAM);
                place(s, t, CB_VRAM);   /* zeros */
                return;
        }
        if (!(s->st[t] & B_HOST)) {
                /* staged through host */
                s->acc->nvme_read += size;
                note(s, t, CB_EV_READ, CB_HOST);
                place(s, t, CB_HOST);
        }
        s->acc->link_up += size;
        note(s, t, CB_EV_UP, CB_VRAM);
        place(s, t, CB_VRAM);
        return;
}

/* May access @i of phase @nx be held while phase @k runs: not a read in one tier of what @k writes in another. */
static bool holds_ahead(const CbPlan *p, size_t k, size_t nx, size_t i) {
        const CbAccess *a = &p->acc[i];

        if (nx == k)
                return false;
        for (size_t j = p->start[k]; j < p->start[k + 1]; j++)
                if (p->acc[j].tensor == a->tensor && (p->acc[j].mode & CB_WRITE) && p->acc[j].tier != a->tier)
                        return false;
        return true;
}

/* The first access of @t after phase @k (cyclic; at most one step on), or NULL when it has none. */
static const CbOcc *next_after(const Sim *s, uint32_t t, size_t k, size_t *ret_dist) {
        size_t lo = s->occ_start[t], hi = s->occ_start[t + 1];

        if (lo == hi)
                return NULL;
        for (size_t i = lo; i < hi; i++)
                if (s->occ[i].phase > k) {
                        *ret_dist = s->occ[i].phase - k;
                        return &s->occ[i];
                }
        *ret_dist = s->occ[lo].phase + s->p->n_phases - k;
        return &s->occ[lo];
}

/*
 * CB_RULE_UPSTAGE: move host copies whose next access reads them in VRAM up
 * now, nearest first, while VRAM has room or copies free to drop that are
 * needed later; each leaves host.  Nothing pinned moves or goes.
 */
static void upstage(Sim *s) {
        const CbPlan *p = s->p;

        for (;;) {
                long pick = -1;
                double pick_d = INFINITY;

                for (uint32_t t = 0; t < p->n_tensors; t++) {
                        const CbOcc *o;
                        size_t d;

                        if ((s->st[t] & (B_HOST | B_VRAM)) != B_HOST || s->pin[CB_HOST][t] == s->serial ||
                            s->tried[t])
                                continue;
                        /* the first access at or after the current phase, d - 1 phases on */
                        o = next_after(s, t, (s->phase + p->n_phases - 1) % p->n_phases, &d);
                        if (!o || o->tier != CB_VRAM || !(o->mode & CB_READ) || d <= 1)
                                continue;
                        if ((double) (d - 1) < pick_d) {
                                pick = t;
                                pick_d = (double) (d - 1);
                        }
                }
                if (pick < 0)
                        return;
                s->tried[pick] = 1;     /* considered once per phase */
                /* room: drop free VRAM copies needed later than it, the farthest first */
                while (s->used[CB_VRAM] + p->size[pick] > s->cap[CB_VRAM]) {
                        long v = -1;
                        double vd = 0;

                        for (uint32_t u = 0; u < p->n_tensors; u++) {
                                bool dead;
                                double d;

                                if (!(s->st[u] & B_VRAM) || s->pin[CB_VRAM][u] == s->serial)
                                        continue;
                                d = next_use(s, u, CB_VRAM, &dead);
                                if (!dead && !(s->st[u] & (B_HOST | B_NVME)))
                                        continue;       /* the sole copy: leaving costs a drain */
                                if (!dead && d <= pick_d)
                                        continue;
                                if (dead)
                                        d = INFINITY;
                                if (v < 0 || d > vd) {
                                        v = u;
                                        vd = d;
                                }
                        }
                        if (v < 0)
                                break;
                        note(s, (uint32_t) v, CB_EV_DROP, CB_VRAM);
                        s->st[v] &= (uint8_t) ~B_VRAM;
                        s->used[CB_VRAM] -= p->size[v];
                }
                if (s->used[CB_VRAM] + p->size[pick] > s->cap[CB_VRAM])
                        continue;
                move_up(s, (uint32_t) pick);
        }
}

static int run_phase(Sim *s, size_t k) {
        const CbPlan *p = s->p;
        size_t nx = (k + 1) % p->n_phases;
        int r;

        s->phase = k;
        s->serial++;
        s->n_evicted = 0;
        for (size_t i = p->start[k]; i < p->start[k + 1]; i++)
                s->pin[p->acc[i].tier][p->acc[i].tensor] = s->serial;
        if (s->held2)
                for (size_t i = p->start[nx]; i < p->start[nx + 1]; i++)
                        if (holds_ahead(p, k, nx, i))
                                s->pin[p->acc[i].tier][p->acc[i].tensor] = s->serial;
        if (s->upstage) {
                memset(s->tried, 0, p->n_tensors);
                upstage(s);
        }
        /*
         * Every copy the phase needs first (a staged copy or a host source
         * is still there), and with two phases held the next one's, then
         * each tier back within its capacity: VRAM first, since what it
         * drains takes host room.
         */
        for (size_t i = p->start[k]; i < p->start[k + 1]; i++)
                ensure(s, &p->acc[i]);
        if (s->held2)
                for (size_t i = p->start[nx]; i < p->start[nx + 1]; i++)
                        if (holds_ahead(p, k, nx, i))
                                ensure(s, &p->acc[i]);
        r = enforce(s, CB_VRAM);
        if (r < 0)
                return r;
        r = enforce(s, CB_HOST);
        if (r < 0)
                return r;
        /* the phase's writes: the written copy is the only current one */
        for (size_t i = p->start[k]; i < p->start[k + 1]; i++) {
                const CbAccess *a = &p->acc[i];
                uint8_t keep = tier_bit(a->tier);

                if (!(a->mode & CB_WRITE))
                        continue;
                for (unsigned x = CB_VRAM; x <= CB_HOST; x++)
                        if (!(keep & tier_bit(x)) && (s->st[a->tensor] & tier_bit(x))) {
                                note(s, a->tensor, CB_EV_STALE, x);
                                s->st[a->tensor] &= (uint8_t) ~tier_bit(x);
                                s->used[x] -= p->size[a->tensor];
                        }
                s->st[a->tensor] = keep;
        }
        return 0;
}

int cb_occ_build(const CbPlan *p, CbOcc **ret_occ, size_t **ret_start) {
        size_t n_acc = p->start[p->n_phases], *fill;
        CbOcc *occ = calloc(n_acc ? n_acc : 1, sizeof(CbOcc));
        size_t *start = calloc(p->n_tensors + 1, sizeof(size_t));

        fill = calloc(p->n_tensors, sizeof(size_t));
        if (!occ || !start || !fill) {
                free(occ);
                free(start);
                free(fill);
                return -ENOMEM;
        }
        for (size_t i = 0; i < n_acc; i++)
                start[p->acc[i].tensor + 1]++;
        for (size_t t = 0; t < p->n_tensors; t++)
                start[t + 1] += start[t];
        for (size_t k = 0; k < p->n_phases; k++)
                for (size_t i = p->start[k]; i < p->start[k + 1]; i++) {
                        uint32_t t = p->acc[i].tensor;

                        occ[start[t] + fill[t]++] = (CbOcc) { k, i, p->acc[i].tier, p->acc[i].mode };
                }
        free(fill);
        *ret_occ = occ;
        *ret_start = start;
        return 0;
}

static int occ_build(Sim *s) {
        return cb_occ_build(s->p, &s->occ, &s->occ_start);
}

/*
 * Note one cycle of the settled schedule in @log: the cycle's steps run again
 * from the state that starts it, with every move noted.
 */
static int log_cycle(Sim *s, CbLog *log, unsigned steps) {
        CbBytes scratch = {};
        int r;

        log->st0 = malloc(s->p->n_tensors);
        if (!log->st0)
                return -ENOMEM;
        memcpy(log->st0, s->st, s->p->n_tensors);
        log->steps = steps;
        s->log = log;
        s->acc = &scratch;
        for (s->log_step = 0; s->log_step < steps; s->log_step++)
                for (size_t ph = 0; ph < s->p->n_phases; ph++) {
                        r = run_phase(s, ph);
                        if (r < 0)
                                return r;
                }
        s->log = NULL;
        return s->log_err;
}

static int simulate(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, CbRule rule, double w_nvme,
                    double w_link, uint32_t seed, uint32_t pct, const uint8_t *out, unsigned max_steps, CbBytes *ret,
                    CbLog *log) {
        Sim s = { .p = p, .seed = seed, .pct = pct, .out = out, .cap = { vram_cap, host_cap },
                  .rule = rule & ~(CB_RULE_INCLUSIVE | CB_RULE_HELD2 | CB_RULE_UPSTAGE | CB_RULE_PARK),
                  .inclusive = rule & CB_RULE_INCLUSIVE, .held2 = rule & CB_RULE_HELD2,
                  .upstage = rule & CB_RULE_UPSTAGE, .park = rule & CB_RULE_PARK, .w_nvme = w_nvme, .w_link = w_link };
        _cleanup_free_ uint8_t *hist = NULL;
        _cleanup_free_ CbBytes *steps = NULL;
        size_t n;
        int r;

        if (!ret || s.rule >= CB_RULES || (rule & ~(CB_RULE_INCLUSIVE | CB_RULE_HELD2 | CB_RULE_UPSTAGE | CB_RULE_PARK | 0xf)) || max_steps < 2 ||
            !(w_nvme >= 0) || !(w_link >= 0))
                return -EINVAL;
        r = cb_plan_check(p);
        if (r < 0)
                return r;
        r = plan_fits(p, vram_cap, host_cap);
        if (r < 0)
                return r;
        n = p->n_tensors;
        hist = calloc((size_t) (max_steps + 1) * n, 1);
        steps = calloc(max_steps, sizeof(CbBytes));
        s.st = malloc(n);
        s.seen = malloc(n);
        s.tried = malloc(n);
        s.pin[0] = calloc(n, sizeof(size_t));
        s.pin[1] = calloc(n, sizeof(size_t));
        if (!hist || !steps || !s.st || !s.seen || !s.tried || !s.pin[0] || !s.pin[1]) {
                r = -ENOMEM;
                goto finish;
        }
        r = occ_build(&s);
        if (r < 0)
                goto finish;
        /* every tensor starts on NVMe (its first read costs a read: only the warm-up sees it) */
        memset(s.st, B_NVME, n);
        memcpy(hist, s.st, n);
        for (unsigned k = 0; k < max_steps; k++) {
                s.acc = &steps[k];
                for (size_t ph = 0; ph < p->n_phases; ph++) {
                        r = run_phase(&s, ph);
                        if (r < 0)
                                goto finish;
                }
                memcpy(hist + (size_t) (k + 1) * n, s.st, n);
                for (unsigned j = 0; j <= k; j++) {
                        if (memcmp(hist + (size_t) j * n, s.st, n) != 0)
                                continue;
                        /* the state at the start of step j comes back after step k: a cycle */
                        *ret = (CbBytes) {};
                        for (unsigned x = j; x <= k; x++) {
                                ret->nvme_read += steps[x].nvme_read;
                                ret->nvme_write += steps[x].nvme_write;
                                ret->link_up += steps[x].link_up;
                                ret->link_down += steps[x].link_down;
                        }
                        ret->nvme_read /= (double) (k + 1 - j);
                        ret->nvme_write /= (double) (k + 1 - j);
                        ret->link_up /= (double) (k + 1 - j);
                        ret->link_down /= (double) (k + 1 - j);
                        r = log ? log_cycle(&s, log, k + 1 - j) : 0;
                        goto finish;
                }
        }
        /* no cycle: the mean of the last half */
        *ret = (CbBytes) {};
        for (unsigned x = max_steps / 2; x < max_steps; x++) {
                ret->nvme_read += steps[x].nvme_read / (double) (max_steps - max_steps / 2);
                ret->nvme_write += steps[x].nvme_write / (double) (max_steps - max_steps / 2);
                ret->link_up += steps[x].link_up / (double) (max_steps - max_steps / 2);
                ret->link_down += steps[x].link_down / (double) (max_steps - max_steps / 2);
        }
        r = -ETIME;
finish:
        free(s.st);
        free(s.seen);
        free(s.tried);
        free(s.pin[0]);
        free(s.pin[1]);
        free(s.occ);
        free(s.occ_start);
        return r;
}

int capbound_simulate(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, CbRule rule, double w_nvme,
                      double w_link, unsigned max_steps, CbBytes *ret) {
        return simulate(p, vram_cap, host_cap, rule, w_nvme, w_link, 0, 0, NULL, max_steps, ret, NULL);
}

int cb_simulate_log(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, CbRule rule, double w_nvme,
                    double w_link, uint32_t seed, uint32_t pct, const uint8_t *out, unsigned max_steps, CbBytes *ret,
                    CbLog *log) {
        int r;

        if (!log)
                return -EINVAL;
        *log = (CbLog) {};
        if (pct > 100)
                return -EINVAL;
        r = simulate(p, vram_cap, host_cap, rule, w_nvme, w_link, seed, pct, out, max_steps, ret, log);
        if (r < 0)
                cb_log_free(log);
        return r;
}

void cb_log_free(CbLog *log) {
        free(log->ev);
        free(log->st0);
        *log = (CbLog) {};
}

/* Steps simulated at most before a schedule is taken as settled (its state repeats long before). */
#define SIM_MAX_STEPS 256u

int capbound_min(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, CbBytes *nvme, CbBytes *link) {
        return capbound_min_held(p, vram_cap, host_cap, 1, nvme, link);
}

int capbound_min_held(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, unsigned held, CbBytes *nvme,
                      CbBytes *link) {
        double best_n = INFINITY, best_l = INFINITY;

        if (held != 1 && held != 2)
                return -EINVAL;
        for (unsigned rule = 0; rule < CB_RULE_COMBOS; rule++)
                for (size_t w = 0; w < CB_WEIGHTS; w++) {
                        CbRule ru = cb_rule_nth(rule, held);
                        CbBytes b;
                        int r = capbound_simulate(p, vram_cap, host_cap, ru, cb_weights[w][0], cb_weights[w][1],
                                                  SIM_MAX_STEPS, &b);

                        if (r < 0 && r != -ETIME)
                                return r;
                        if (b.nvme_read + b.nvme_write < best_n) {
                                best_n = b.nvme_read + b.nvme_write;
                                if (nvme)
                                        *nvme = b;
                        }
                        if (b.link_up + b.link_down < best_l) {
                                best_l = b.link_up + b.link_down;
                                if (link)
                                        *link = b;
                        }
                }
        return 0;
}

/* ---- the proven floor ----------------------------------------------------------- */

int capbound_floor(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, CbBytes *ret) {
        Sim s = { .p = p };
        _cleanup_free_ uint8_t *pinned = NULL, *written = NULL;
        double best_nvme = 0, best_read = 0, best_write = 0, cap_vram = 0, up = 0, down = 0;
        int r;

        if (!ret)
                return -EINVAL;
        r = cb_plan_check(p);
        if (r < 0)
                return r;
        r = occ_build(&s);
        pinned = calloc(p->n_tensors, 1);
        written = calloc(p->n_tensors, 1);
        if (r < 0 || !pinned || !written) {
                r = -ENOMEM;
                goto finish;
        }
        for (size_t i = 0; i < p->start[p->n_phases]; i++)
                if (p->acc[i].mode & CB_WRITE)
                        written[p->acc[i].tensor] = 1;

        /* compulsory crossings: a read in one tier of a version written in the other */
        for (uint32_t t = 0; t < p->n_tensors; t++) {
                size_t lo = s.occ_start[t], n = s.occ_start[t + 1] - lo;

                for (size_t w = 0; w < n; w++) {
                        const CbOcc *ow = &s.occ[lo + w];
                        bool crosses = false;

                        if (!(ow->mode & CB_WRITE))
                                continue;
                        /* the reads of this version: until the next write (the same phase's other tier first) */
                        for (size_t k = 1; k <= n; k++) {
                                const CbOcc *o = &s.occ[lo + (w + k) % n];

                                if (k < n && o->phase == ow->phase && o->tier != ow->tier)
                                        continue;       /* same phase: not after the write */
                                if ((o->mode & CB_READ) && o->tier != ow->tier)
                                        crosses = true;
                                if (o->mode & CB_WRITE)
                                        break;
                        }
                        if (crosses) {
                                if (ow->tier == CB_VRAM)
                                        down += (double) p->size[t];
                                else
                                        up += (double) p->size[t];
                        }
                }
        }

        for (size_t k = 0; k < p->n_phases; k++) {
                double live = 0, never_written = 0, in_vram = 0;

                memset(pinned, 0, p->n_tensors);
                for (size_t i = p->start[k]; i < p->start[k + 1]; i++) {
                        uint32_t t = p->acc[i].tensor;

                        if (!pinned[t])
                                live += (double) p->size[t];
                        if (p->acc[i].tier == CB_VRAM && !(pinned[t] & 2))
                                in_vram += (double) p->size[t];
                        pinned[t] |= p->acc[i].tier == CB_VRAM ? 2 : 1;
                }
                for (uint32_t t = 0; t < p->n_tensors; t++) {
                        size_t d;
                        const CbOcc *o;

                        if (pinned[t] || !(o = next_after(&s, t, k, &d)) || !(o->mode & CB_READ))
                                continue;
                        live += (double) p->size[t];
                        if (!written[t])
                                never_written += (double) p->size[t];
                        /* read in VRAM next, and no write in another tier of the same phase first */
                        if (o->tier == CB_VRAM) {
                                bool clobbered = false;

                                for (size_t i = s.occ_start[t]; i < s.occ_start[t + 1]; i++)
                                        if (s.occ[i].phase == o->phase && s.occ[i].tier != CB_VRAM &&
                                            (s.occ[i].mode & CB_WRITE))
                                                clobbered = true;
                                if (!clobbered)
                                        in_vram += (double) p->size[t];
                        }
                }
                {
                        double excess = live - (double) vram_cap - (double) host_cap;
                        double wr = excess - never_written;

                        if (excess > 0 && excess + MAX(wr, 0) > best_nvme) {
                                best_nvme = excess + MAX(wr, 0);
                                best_read = excess;
                                best_write = MAX(wr, 0);
                        }
                }
                cap_vram = MAX(cap_vram, in_vram - (double) vram_cap);
        }
        *ret = (CbBytes) { .nvme_read = best_read, .nvme_write = best_write, .link_up = MAX(up, cap_vram),
                           .link_down = down };
        r = 0;
finish:
        free(s.occ);
        free(s.occ_start);
        return r;
}
