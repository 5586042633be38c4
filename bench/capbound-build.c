/* SPDX-License-Identifier: MIT */
/* capbound-build.c: a schedule built for time from the plan of waits (cb_build_log()), not by eviction rules. */

/*
 * Theory of operation
 *
 * The model's rules evict lazily, when a tier's room is wanted; with a
 * plan of waits (capbound-place.c) they evict its planned copies first,
 * and so write them where the room is wanted: in the optimizer's burst of
 * reads.  Here the schedule is laid out phase by phase from the plan
 * instead, in three passes:
 *
 *   - what is in memory (VRAM or host) during each phase: what it pins
 *     (holding two, the next phase's accesses too), and every wait the
 *     plan keeps; a wait it sends to NVMe stays on after its last access
 *     while memory has the room (less @slack bytes, kept for reads ahead),
 *     the latest used first, so that its write can wait for an idle drive
 *     (the executor's deferred writes) instead of making room in a burst;
 *   - which tier each copy waits in: where it is pinned, else where it
 *     waited the phase before, else where it is used next; a tier over its
 *     room sends the copies used next in the other tier, then the farthest
 *     used, over the link (host to VRAM only while VRAM has room); then a
 *     copy waiting in the tier it is not used in next moves there while
 *     that tier has room, the soonest needed first (VRAM prefetch, parking);
 *   - the moves between consecutive phases, with the copies' versions:
 *     what arrives (PLACE for a write-only use, READ from NVMe, UP, DOWN,
 *     staged NVMe -> host -> VRAM), what leaves (a sole current copy not
 *     dead written down first: WRITE, or DRAIN then WRITE from VRAM), what a
 *     phase's write makes stale.  A use that finds no current copy to copy
 *     from is a bug here (-EPROTO), not a schedule.
 *
 * The moves are the log of cb_simulate_log() (one step, from its start
 * state after a step of warm-up), so capbound-timed.c's executor times them
 * under the model's constraints: capacity per tier, one transfer per link
 * at a time, a phase waits for what it uses.  A tier assignment that does
 * not fit (sizes that fill neither tier exactly) is -ENOSPC: no schedule
 * from this construction, the rules' still stand.
 */

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "bench/capbound-internal.h"
#include "proto/macro.h"

/* Tier assignment passes over the cyclic step, and steps of moves before the logged one. */
#define BUILD_PASSES 4u
#define BUILD_WARMUP 2u

typedef struct Build {
        const CbPlan *p;
        size_t n, nt;
        uint64_t cap[2];
        CbOcc *occ;
        size_t *os;
        uint8_t *pin;                   /* n x nt: tier bits pinned in phase k */
        uint8_t *mem;                   /* n x nt: in memory during phase k (1: pinned or kept, 2: stayed on) */
        uint8_t *res;                   /* n x nt: tier bits holding a copy during phase k */
        CbLog *log;
} Build;

#define AT(b, k, t) ((k) * (b)->nt + (t))

/* @t's first access at or after phase @k (cyclic) and how far it is (0: in @k); NULL when it has none. */
static const CbOcc *next_at(const Build *b, uint32_t t, size_t k, size_t *ret_d) {
        size_t lo = b->os[t], hi = b->os[t + 1];

        if (lo == hi)
                return NULL;
        for (size_t i = lo; i < hi; i++)
                if (b->occ[i].phase >= k) {
                        *ret_d = b->occ[i].phase - k;
                        return &b->occ[i];
                }
        *ret_d = b->occ[lo].phase + b->n - k;
        return &b->occ[lo];
}

/* The modes and tier bits of @t's accesses in the phase of occurrence @o. */
static void phase_of(const Build *b, uint32_t t, const CbOcc *o, uint8_t *ret_modes, uint8_t *ret_tiers) {
        *ret_modes = 0;
        *ret_tiers = 0;
        for (size_t i = b->os[t]; i < b->os[t + 1]; i++)
                if (b->occ[i].phase == o->phase) {
                        *ret_modes |= b->occ[i].mode;
                        *ret_tiers |= tier_bit(b->occ[i].tier);
                }
}

/* Is @t's next access after phase @k (not in it) write-only: nothing to keep after @k? */
static bool dead_after(const Build *b, uint32_t t, size_t k, size_t *ret_d, uint8_t *ret_tiers) {
        const CbOcc *o = next_at(b, t, (k + 1) % b->n, ret_d);
        uint8_t m;

        (*ret_d)++;
        if (!o)
                return true;
        phase_of(b, t, o, &m, ret_tiers);
        return m == CB_WRITE;
}

static uint64_t phase_bytes(const Build *b, size_t k) {
        uint64_t s = 0;

        for (uint32_t t = 0; t < b->nt; t++)
                if (b->pin[AT(b, k, t)])
                        s += b->p->size[t] * (unsigned) __builtin_popcount(b->pin[AT(b, k, t)]);
                else if (b->mem[AT(b, k, t)])
                        s += b->p->size[t];
        return s;
}

/* What each phase pins, and what is in memory: pinned, kept by the plan, or staying on while there is room. */
static void build_memory(Build *b, const uint8_t *out, unsigned held, uint64_t slack) {
        const CbPlan *p = b->p;
        uint64_t room = b->cap[0] + b->cap[1] > slack ? b->cap[0] + b->cap[1] - slack : 0;

        for (size_t k = 0; k < b->n; k++) {
                size_t nx = (k + 1) % b->n;

                for (size_t i = p->start[k]; i < p->start[k + 1]; i++)
                        b->pin[AT(b, k, p->acc[i].tensor)] |= tier_bit(p->acc[i].tier);
                for (size_t i = p->start[nx]; held == 2 && nx != k && i < p->start[nx + 1]; i++) {
                        bool defer = false;

                        /* a read in one tier of what phase k writes in the other waits (as in capbound.c) */
                        for (size_t j = p->start[k]; j < p->start[k + 1]; j++)
                                if (p->acc[j].tensor == p->acc[i].tensor && (p->acc[j].mode & CB_WRITE) &&
                                    p->acc[j].tier != p->acc[i].tier)
                                        defer = true;
                        if (!defer)
                                b->pin[AT(b, k, p->acc[i].tensor)] |= tier_bit(p->acc[i].tier);
                }
        }
        /* the waits the plan keeps: from the phase after an access to the phase before the next */
        for (uint32_t t = 0; t < b->nt; t++)
                for (size_t i = b->os[t]; i < b->os[t + 1]; i++) {
                        size_t k = b->occ[i].phase, d;
                        uint8_t tiers;

                        if (i > b->os[t] && b->occ[i - 1].phase == k)
                                continue;
                        if (dead_after(b, t, k, &d, &tiers) || out[b->occ[i].acc])
                                continue;
                        for (size_t e = 1; e < d; e++)
                                b->mem[AT(b, (k + e) % b->n, t)] = 1;
                }
        for (size_t k = 0; k < b->n; k++)
                for (uint32_t t = 0; t < b->nt; t++)
                        if (b->pin[AT(b, k, t)])
                                b->mem[AT(b, k, t)] = 1;
        /* a wait sent to NVMe stays on while there is room, the latest used first (twice round: cyclic) */
        for (size_t kk = 1; kk < 2 * b->n; kk++) {
                size_t k = kk % b->n, pk = (kk - 1) % b->n;
                uint64_t used = phase_bytes(b, k);

                for (size_t since = 1; since < b->n; since++)
                        for (uint32_t t = 0; t < b->nt; t++) {
                                size_t d;
                                uint8_t tiers;
                                size_t last = (k + b->n - since) % b->n;

                                if (b->mem[AT(b, k, t)] || !b->mem[AT(b, pk, t)] || !b->pin[AT(b, last, t)] ||
                                    used + p->size[t] > room)
                                        continue;
                                /* accessed @since phases ago, nothing since, still live */
                                if (dead_after(b, t, last, &d, &tiers) || d <= since)
                                        continue;
                                {
                                        bool between = false;

                                        for (size_t e = 1; e < since; e++)
                                                if (b->pin[AT(b, (last + e) % b->n, t)])
                                                        between = true;
                                        if (between)
                                                continue;
                                }
                                b->mem[AT(b, k, t)] = 2;
                                used += p->size[t];
                        }
        }
}

/* The tier @t is used in next after phase @k (VRAM when both), and how far. */
static unsigned next_tier(const Build *b, uint32_t t, size_t k, size_t *ret_d) {
        uint8_t tiers = 0;

        (void) dead_after(b, t, k, ret_d, &tiers);
        return tiers & B_VRAM ? CB_VRAM : CB_HOST;
}

/* Move a waiting copy out of @from until it is within its room; -ENOSPC when it cannot be. */
static int relieve(Build *b, size_t k, uint64_t used[2], unsigned from) {
        unsigned to = from == CB_VRAM ? CB_HOST : CB_VRAM;

        while (used[from] > b->cap[from]) {
                long best = -1;
                size_t bd = 0;
                bool bother = false;

                for (uint32_t t = 0; t < b->nt; t++) {
                        size_t d;
                        bool other;

                        if (b->pin[AT(b, k, t)] || b->res[AT(b, k, t)] != tier_bit(from))
                                continue;
                        if (from == CB_HOST && used[to] + b->p->size[t] > b->cap[to])
                                continue;       /* VRAM takes only what it has room for */
                        other = next_tier(b, t, k, &d) == to;
                        if (best >= 0 && (other < bother || (other == bother && d <= bd)))
                                continue;
                        best = t;
                        bd = d;
                        bother = other;
                }
                if (best < 0)
                        return -ENOSPC;
                b->res[AT(b, k, best)] = tier_bit(to);
                used[from] -= b->p->size[best];
                used[to] += b->p->size[best];
        }
        return 0;
}

static int assign_phase(Build *b, size_t k, size_t pk) {
        uint64_t used[2] = { 0, 0 };
        int r;

        for (uint32_t t = 0; t < b->nt; t++) {
                uint8_t pin = b->pin[AT(b, k, t)], prev = b->res[AT(b, pk, t)], r8;
                size_t d;

                if (!b->mem[AT(b, k, t)])
                        r8 = 0;
                else if (pin)
                        r8 = pin;
                else if (prev == B_VRAM || prev == B_HOST)
                        r8 = prev;
                else
                        r8 = tier_bit(next_tier(b, t, k, &d));
                b->res[AT(b, k, t)] = r8;
                for (unsigned x = CB_VRAM; x <= CB_HOST; x++)
                        if (r8 & tier_bit(x))
                                used[x] += b->p->size[t];
        }
        r = relieve(b, k, used, CB_VRAM);
        if (r >= 0)
                r = relieve(b, k, used, CB_HOST);
        if (r < 0)
                return r;
        /* a copy waiting where it is not used next moves there while there is room, the soonest needed first */
        for (;;) {
                long best = -1;
                size_t bd = 0;
                unsigned bto = 0;

                for (uint32_t t = 0; t < b->nt; t++) {
                        size_t d;
                        unsigned to;

                        if (b->pin[AT(b, k, t)] || !b->res[AT(b, k, t)])
                                continue;
                        to = next_tier(b, t, k, &d);
                        if (b->res[AT(b, k, t)] == tier_bit(to) || used[to] + b->p->size[t] > b->cap[to] ||
                            (best >= 0 && d >= bd))
                                continue;
                        best = t;
                        bd = d;
                        bto = to;
                }
                if (best < 0)
                        return 0;
                used[bto] += b->p->size[best];
                used[bto == CB_VRAM ? CB_HOST : CB_VRAM] -= b->p->size[best];
                b->res[AT(b, k, best)] = tier_bit(bto);
        }
}

static int note(Build *b, bool logging, uint32_t t, size_t k, uint8_t kind, unsigned tier) {
        CbLog *l = b->log;

        if (!logging)
                return 0;
        if (l->n == l->cap) {
                size_t cap = l->cap ? 2 * l->cap : 64;
                CbEvent *ev = reallocarray(l->ev, cap, sizeof(CbEvent));

                if (!ev)
                        return -ENOMEM;
                l->ev = ev;
                l->cap = cap;
        }
        l->ev[l->n++] = (CbEvent) { .tensor = t, .phase = (uint32_t) k, .kind = kind, .tier = (uint8_t) tier };
        return 0;
}

/* The moves into phase @k's placement from @cur (current copies: B_VRAM, B_HOST, B_NVME), then its writes. */

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;

        return x < y ? -1 : x > y;
}

static int moves(Build *b, size_t k, uint8_t *cur, uint64_t *order, bool logging) {
        const CbPlan *p = b->p;
        int r = 0;

        /*
         * the order of arrivals: copies moving down out of VRAM first (their
         * room is what VRAM's arrivals wait for), then the soonest needed
         */
        for (uint32_t t = 0; t < b->nt; t++) {
                size_t d = 0;
                bool down = cur[t] == B_VRAM && b->res[AT(b, k, t)] == B_HOST;
                bool read = !(cur[t] & (B_VRAM | B_HOST)) && b->res[AT(b, k, t)] == B_HOST;
                uint64_t cls = read ? 0 : down ? 1 : 2;

                (void) next_at(b, t, k, &d);
                order[t] = (cls << 61) | ((uint64_t) MIN(d, (size_t) 1 << 30) << 32) | t;
        }
        qsort(order, b->nt, sizeof(uint64_t), cmp_u64);
        for (uint32_t i = 0; i < b->nt && r >= 0; i++) {
                uint32_t t = (uint32_t) order[i];
                uint8_t want = b->res[AT(b, k, t)], m, tiers, c = cur[t];
                size_t d;
                const CbOcc *o = next_at(b, t, k, &d);
                bool wonly;

                if (!o)
                        continue;
                phase_of(b, t, o, &m, &tiers);
                wonly = m == CB_WRITE;  /* the next use overwrites: no version to keep or bring */
                for (unsigned x = CB_VRAM; x <= CB_HOST && r >= 0; x++) {
                        uint8_t bit = tier_bit(x), other = x == CB_VRAM ? B_HOST : B_VRAM;

                        if (!(want & bit) || (c & bit))
                                continue;
                        if (wonly) {
                                r = note(b, logging, t, k, CB_EV_PLACE, x);
                        } else if (c & other) {
                                r = note(b, logging, t, k, x == CB_VRAM ? CB_EV_UP : CB_EV_DOWN, x);
                                if (r >= 0 && !(want & other)) {
                                        r = note(b, logging, t, k, CB_EV_DROP, x == CB_VRAM ? CB_HOST : CB_VRAM);
                                        c &= (uint8_t) ~other;
                                }
                        } else if (c & B_NVME) {
                                r = note(b, logging, t, k, CB_EV_READ, CB_HOST);
                                if (r >= 0 && x == CB_VRAM) {
                                        r = note(b, logging, t, k, CB_EV_UP, CB_VRAM);
                                        if (r >= 0 && !(want & B_HOST))
                                                r = note(b, logging, t, k, CB_EV_DROP, CB_HOST);
                                        else
                                                c |= B_HOST;
                                }
                        } else {
                                return -EPROTO; /* no current copy to bring: a bug of the construction */
                        }
                        c |= bit;
                }
                /* what leaves: a sole current copy that is not dead is written down first */
                for (unsigned x = CB_VRAM; x <= CB_HOST && r >= 0; x++) {
                        uint8_t bit = tier_bit(x);
                        bool sole;

                        if (!(c & bit) || (want & bit))
                                continue;
                        sole = !wonly && !(c & ~bit & (B_VRAM | B_HOST | B_NVME));
                        if (sole && x == CB_VRAM) {
                                r = note(b, logging, t, k, CB_EV_DRAIN, CB_HOST);
                                if (r >= 0)
                                        r = note(b, logging, t, k, CB_EV_DROP, CB_VRAM);
                                if (r >= 0)
                                        r = note(b, logging, t, k, CB_EV_WRITE, CB_HOST);
                                if (r >= 0)
                                        r = note(b, logging, t, k, CB_EV_DROP, CB_HOST);
                                c |= B_NVME;
                        } else {
                                if (sole)
                                        r = note(b, logging, t, k, CB_EV_WRITE, CB_HOST);
                                if (r >= 0)
                                        r = note(b, logging, t, k, CB_EV_DROP, x);
                                if (sole)
                                        c |= B_NVME;
                        }
                        c &= (uint8_t) ~bit;
                }
                cur[t] = c;
        }
        /* the phase's writes: the written copy is the only current one */
        for (size_t i = p->start[k]; i < p->start[k + 1] && r >= 0; i++) {
                uint32_t t = p->acc[i].tensor;
                uint8_t keep = tier_bit(p->acc[i].tier), gone;

                if (!(p->acc[i].mode & CB_WRITE))
                        continue;
                gone = cur[t] & (uint8_t) ~keep & (B_VRAM | B_HOST);
                for (unsigned x = CB_VRAM; x <= CB_HOST && r >= 0; x++)
                        if (gone & tier_bit(x))
                                r = note(b, logging, t, k, CB_EV_STALE, x);
                cur[t] = keep;
        }
        return r;
}

int cb_build_log(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, unsigned held, const uint8_t *out,
                 uint64_t slack, CbLog *log) {
        Build b = { .p = p, .cap = { vram_cap, host_cap }, .log = log };
        _cleanup_free_ uint8_t *cur = NULL;
        _cleanup_free_ uint64_t *order = NULL;
        int r;

        if (!log || !out || (held != 1 && held != 2))
                return -EINVAL;
        *log = (CbLog) {};
        r = cb_plan_check(p);
        if (r < 0)
                return r;
        b.n = p->n_phases;
        b.nt = p->n_tensors;
        if (b.n == 0 || b.n > 512 || (double) b.n * (double) b.nt > 1e7)
                return -E2BIG;
        r = cb_occ_build(p, &b.occ, &b.os);
        if (r < 0)
                return r;
        b.pin = calloc(b.n * b.nt, 1);
        b.mem = calloc(b.n * b.nt, 1);
        b.res = calloc(b.n * b.nt, 1);
        cur = calloc(b.nt, 1);
        order = calloc(b.nt, sizeof(uint64_t));
        log->st0 = malloc(b.nt);
        if (!b.pin || !b.mem || !b.res || !cur || !order || !log->st0) {
                r = -ENOMEM;
                goto finish;
        }
        build_memory(&b, out, held, slack);
        for (size_t k = 0; k < b.n; k++)
                for (unsigned x = CB_VRAM; x <= CB_HOST; x++) {
                        uint64_t s = 0;

                        for (uint32_t t = 0; t < b.nt; t++)
                                if (b.pin[AT(&b, k, t)] & tier_bit(x))
                                        s += p->size[t];
                        if (s > b.cap[x]) {
                                r = -E2BIG;     /* a phase does not fit */
                                goto finish;
                        }
                }
        for (size_t pass = 0; pass < BUILD_PASSES * b.n; pass++) {
                r = assign_phase(&b, pass % b.n, (pass + b.n - 1) % b.n);
                if (r < 0)
                        goto finish;
        }
        /* moves: warm-up steps from everything on NVMe, then the logged one; its start state must come back */
        for (uint32_t t = 0; t < b.nt; t++)
                cur[t] = B_NVME;
        for (unsigned s = 0; s <= BUILD_WARMUP; s++) {
                if (s == BUILD_WARMUP)
                        memcpy(log->st0, cur, b.nt);
                for (size_t k = 0; k < b.n; k++) {
                        r = moves(&b, k, cur, order, s == BUILD_WARMUP);
                        if (r < 0)
                                goto finish;
                }
        }
        if (memcmp(log->st0, cur, b.nt) != 0) {
                r = -EPROTO;    /* the placement is cyclic, so the copies must be too */
                goto finish;
        }
        log->steps = 1;
        r = 0;
finish:
        free(b.occ);
        free(b.os);
        free(b.pin);
        free(b.mem);
        free(b.res);
        if (r < 0)
                cb_log_free(log);
        return r;
}
