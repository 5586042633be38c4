/* SPDX-License-Identifier: MIT */
/* capbound-timed.c: step times of the model: lower bounds and a schedule's (capbound_planned()). */

/*
 * Theory of operation
 *
 * capbound_min() counts bytes; capbound_time() bounds the step from below.
 * This file gives the other side: a step time that a schedule reaches, so
 * that a gap between tierd and the bound splits into what no placement
 * can avoid and what tierd's execution adds.
 *
 * A placement is one of the model's settled schedules (cb_simulate_log():
 * which copies arrive and leave at each phase, one cycle).  It is executed
 * in continuous time, as a planner that knows the whole cycle would:
 *
 *   - phase k runs compute[k] seconds; it starts when phase k - 1 has ended
 *     and every copy that arrives for it (its first access at or after the
 *     move's phase) is in place;
 *   - a copy leaves (DROP) as soon as its tensor's last access before the
 *     move's phase has ended (the model keeps it until its room is wanted;
 *     nothing uses it meanwhile), a stale one (STALE) when its phase ends;
 *   - a write to NVMe starts as soon as that access has ended too, when the
 *     drive has nothing more urgent (with @defer, cb_timed_log(): not
 *     while a phase runs and a read from NVMe is due within @defer phases,
 *     so that a burst of reads keeps the drive; when no phase runs it goes
 *     as before, so nothing waits on it in a cycle);
 *   - copies arrive in the model's order, each as soon as its tier has
 *     room and its link is free (NVMe for READ, the host link for UP and
 *     DOWN; one transfer at a time on each, at @nvme_bw and @link_bw):
 *     early, into memory the cycle does not use then;
 *   - the moves of one tensor keep the model's order (a staged copy goes up
 *     before its host copy leaves, a write lands before the copy goes);
 *   - a drain (the sole VRAM copy down to host) is the arrival of the host
 *     copy too: the tensor's next phase waits for it to land (until
 *     2026-12-07 it did not: a phase could read in host a copy still on its
 *     way down);
 *   - a copy moves (READ, UP, DOWN) only once the last phase before the
 *     move's that wrote its tensor has ended: its version is final then.
 *     Where the write left a stale copy, that copy's departure (STALE)
 *     waits for the phase too, but where it left none (the sole copy
 *     written), nothing else in the log would; WRITE and DRAIN wait for
 *     the last access anyway.
 *
 * The model charges room only where a phase runs: a copy staged through
 * host on its way up, or drained through it on its way down, takes none
 * here either (a bounce buffer), and when two full tiers swap copies (the
 * arrival first waits for the room the other's departure frees, which
 * waits for its own arrival), the arrival at the head goes over its room
 * for the moment, as the model lets it.  Otherwise arrivals in the model's
 * order cannot wait for each other in a cycle: the room an arrival needs is
 * freed by moves the model made before it or in its phase, and those wait
 * only for phases before the arrival's, which wait only for arrivals
 * earlier in that order; a drain takes host room only up to the head's
 * phase, so that it never takes what an earlier arrival needs.  Several
 * cycles run; the step is the mean of the last ones.  Each rule of the model (held one or two phases)
 * gives one placement, and so does each schedule built for time from the
 * plan of waits (capbound-build.c); capbound_planned() keeps the fastest.
 *
 * What it leaves out: transfers take no CPU, a link's reads and writes
 * share it one at a time, and two jobs sharing a drive are not simulated
 * (bench-timeline gives each its share of the bandwidth).
 */

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "bench/capbound-internal.h"
#include "proto/macro.h"

/* Cycles of the log run, and the ones measured (the last), for a settled step. */
#define TIMED_CYCLES 6u
#define TIMED_MEASURED 3u
#define TIMED_SIM_STEPS 256u

typedef struct Timed {
        const CbPlan *p;
        const CbLog *log;
        const double *compute;
        double bw[2];                   /* NVMe, host link: bytes/s (0: instant) */
        size_t defer;                   /* a write waits while a phase runs and a read is due within this many
                                         * phases (SIZE_MAX: never waits) */
        uint64_t cap[2];
        size_t n_ev, n_all;             /* moves in one cycle, in all cycles */
        size_t n_ph, n_all_ph;          /* phases in one cycle, in all */
        ptrdiff_t *prev;                /* per move of one cycle: the tensor's previous move, as an offset back */
        ptrdiff_t *rel;                 /* per move: the phase (from the move's own) whose end releases it */
        ptrdiff_t *need;                /* per arrival and DRAIN: the phase (from the move's own) that waits for it */
        ptrdiff_t *wrote;               /* per move: the last phase before the move's own that wrote its
                                         * tensor (from the move's own; 0: none) */
        bool *transit;                  /* per move into host and its DROP there in the same phase: staged or
                                         * drained through host (the model charges it no room) */
        double *done;                   /* per move of all cycles: when it was done (NAN: not yet) */
        double *ph_start, *ph_end;      /* per phase of all cycles */
        size_t *gate;                   /* per phase of all cycles: arrivals it still waits for */
} Timed;

static bool is_arrival(uint8_t kind) {
        return kind == CB_EV_PLACE || kind == CB_EV_READ || kind == CB_EV_UP || kind == CB_EV_DOWN;
}

static int ev_link(uint8_t kind) {
        if (kind == CB_EV_READ || kind == CB_EV_WRITE)
                return 0;
        return kind == CB_EV_UP || kind == CB_EV_DOWN || kind == CB_EV_DRAIN ? 1 : -1;
}

/* A move that makes room: after the copy's last use, in any order. */
static bool is_leaving(uint8_t kind) {
        return kind == CB_EV_WRITE || kind == CB_EV_DRAIN;
}

/* How many phases before log phase @ph @t was last accessed (1 .. n_ph), SIZE_MAX: never. */
static size_t since_access(const Timed *tm, uint32_t t, size_t ph) {
        for (size_t d = 1; d <= tm->n_ph; d++)
                if (cb_modes_in(tm->p, t, (ph + tm->n_ph - d % tm->n_ph) % tm->n_ph % tm->p->n_phases))
                        return d;
        return SIZE_MAX;
}

/* How many phases after log phase @ph @t is next accessed (0: in it), SIZE_MAX: never. */
static size_t until_access(const Timed *tm, uint32_t t, size_t ph) {
        for (size_t d = 0; d < tm->n_ph; d++)
                if (cb_modes_in(tm->p, t, (ph + d) % tm->n_ph % tm->p->n_phases))
                        return d;
        return SIZE_MAX;
}

/* How many phases before log phase @ph @t was last written (1 .. n_ph), SIZE_MAX: never. */
static size_t since_write(const Timed *tm, uint32_t t, size_t ph) {
        for (size_t d = 1; d <= tm->n_ph; d++)
                if (cb_modes_in(tm->p, t, (ph + tm->n_ph - d % tm->n_ph) % tm->n_ph % tm->p->n_phases) & CB_WRITE)
                        return d;
        return SIZE_MAX;
}

static int timed_prepare(Timed *tm) {
        const CbLog *l = tm->log;
        size_t *last = calloc(tm->p->n_tensors, sizeof(size_t));

        if (!last)
                return -ENOMEM;
        for (size_t i = 0; i < l->n; i++)
                last[l->ev[i].tensor] = i + 1;
        for (size_t i = 0; i < l->n; i++) {
                const CbEvent *e = &l->ev[i];
                size_t d;

                /* the tensor's move before: in this cycle, or its last of the cycle before */
                tm->prev[i] = (ptrdiff_t) (i + l->n) - (ptrdiff_t) last[e->tensor] + 1;
                if (tm->prev[i] > (ptrdiff_t) l->n)
                        tm->prev[i] -= (ptrdiff_t) l->n;
                last[e->tensor] = i + 1;
                if (e->kind == CB_EV_STALE) {
                        tm->rel[i] = 0;
                } else if (e->kind == CB_EV_DROP || is_leaving(e->kind)) {
                        /* the last access strictly before the move's phase */
                        d = since_access(tm, e->tensor, e->phase);
                        tm->rel[i] = d == SIZE_MAX ? -(ptrdiff_t) tm->n_all_ph : -(ptrdiff_t) d;
                }
                /* a copy that comes to host and leaves it in the same phase: staged or drained through */
                if (e->kind == CB_EV_READ || e->kind == CB_EV_DRAIN || e->kind == CB_EV_DOWN)
                        for (size_t j = i + 1; j < l->n && l->ev[j].phase == e->phase; j++)
                                if (l->ev[j].tensor == e->tensor && l->ev[j].kind == CB_EV_DROP &&
                                    l->ev[j].tier == CB_HOST) {
                                        tm->transit[i] = tm->transit[j] = true;
                                        break;
                                }
                if (is_arrival(e->kind) || e->kind == CB_EV_DRAIN) {
                        d = until_access(tm, e->tensor, e->phase);
                        tm->need[i] = d == SIZE_MAX ? -1 : (ptrdiff_t) d;
                }
                d = since_write(tm, e->tensor, e->phase);
                tm->wrote[i] = d == SIZE_MAX ? 0 : -(ptrdiff_t) d;
        }
        free(last);
        return 0;
}

/* Move @u of all cycles: its log entry and the log phase it belongs to (cycles on). */
static const CbEvent *ev_of(const Timed *tm, size_t u, size_t *ret_phase) {
        const CbEvent *e = &tm->log->ev[u % tm->n_ev];

        *ret_phase = u / tm->n_ev * tm->n_ph + e->phase;
        return e;
}

/*
 * The phase (of all cycles) that arrival or DRAIN @u gates (a drain lands the copy that phase uses), SIZE_MAX:
 * none (another move, or beyond the cycles run).
 */
static size_t gated(const Timed *tm, size_t u) {
        size_t ph;
        const CbEvent *e = ev_of(tm, u, &ph);
        ptrdiff_t need = tm->need[u % tm->n_ev];

        if ((!is_arrival(e->kind) && e->kind != CB_EV_DRAIN) || need < 0 || ph + (size_t) need >= tm->n_all_ph)
                return SIZE_MAX;
        return ph + (size_t) need;
}

/* Has the last phase before move @u's that wrote its tensor ended (or is there none)? */
static bool version_final(const Timed *tm, size_t u, size_t cur) {
        size_t ph;
        ptrdiff_t g;

        (void) ev_of(tm, u, &ph);
        g = (ptrdiff_t) ph + tm->wrote[u % tm->n_ev];
        return tm->wrote[u % tm->n_ev] == 0 || g < 0 || (size_t) g < cur;
}

static bool prev_done(const Timed *tm, size_t u) {
        ptrdiff_t back = tm->prev[u % tm->n_ev];

        return (ptrdiff_t) u < back || !isnan(tm->done[u - (size_t) back]);
}

/* When move @u (DROP, STALE, WRITE, DRAIN) may go: the end of its releasing phase; NAN while that has not ended. */
static double released(const Timed *tm, size_t u, size_t cur) {
        size_t ph;
        ptrdiff_t g;

        (void) ev_of(tm, u, &ph);
        g = (ptrdiff_t) ph + tm->rel[u % tm->n_ev];
        if (g < 0)
                return 0;
        return (size_t) g < cur ? tm->ph_end[g] : NAN;
}

/* May move @u (DROP, STALE, WRITE, DRAIN) go now, room aside: released, its tensor's move before it done, not started? */
static bool release_due(const Timed *tm, size_t u, size_t cur, double now, double *ret_release) {
        double r;

        if (!isnan(tm->done[u]))
                return false;
        r = released(tm, u, cur);
        if (isnan(r) || r > now || !prev_done(tm, u))
                return false;
        *ret_release = r;
        return true;
}

/*
 * Is a read from NVMe among the arrivals from @head that phases up to
 * @cur + tm->defer wait for?  A write then waits while a phase runs: the
 * drive keeps its time for the reads of a burst, and the write goes where
 * no read is due (or, when no phase runs, as before: nothing waits for it
 * in a cycle).
 */
static bool read_due(const Timed *tm, size_t head, size_t cur) {
        if (tm->defer == SIZE_MAX)
                return false;
        for (size_t u = head; u < tm->n_all; u++) {
                size_t ph;
                const CbEvent *e = ev_of(tm, u, &ph);
                size_t g;

                if (ph > cur + tm->defer)
                        return false;
                g = gated(tm, u);
                if (e->kind == CB_EV_READ && isnan(tm->done[u]) && g != SIZE_MAX && g <= cur + tm->defer)
                        return true;
        }
        return false;
}

static int timed_run(Timed *tm, double *ret_step) {
        const CbPlan *p = tm->p;
        double now = 0, busy[2] = { 0, 0 };
        size_t inflight[2] = { SIZE_MAX, SIZE_MAX }, head = 0, head_ph = 0, cur = 0, lo_pending = 0;
        uint64_t used[2] = { 0, 0 };
        bool running = false, force = false, drain_first;

        for (uint32_t t = 0; t < p->n_tensors; t++)
                for (unsigned x = CB_VRAM; x <= CB_HOST; x++)
                        if (tm->log->st0[t] & tier_bit(x))
                                used[x] += p->size[t];
        for (size_t u = 0; u < tm->n_all; u++) {
                tm->done[u] = NAN;
                if (gated(tm, u) != SIZE_MAX)
                        tm->gate[gated(tm, u)]++;
        }

        for (;;) {
                bool progress = true;
                double next = INFINITY;

                while (progress) {
                        progress = false;
                        /* transfers that have landed */
                        for (int k = 0; k < 2; k++) {
                                size_t u = inflight[k];

                                if (u == SIZE_MAX || busy[k] > now)
                                        continue;
                                tm->done[u] = busy[k];
                                inflight[k] = SIZE_MAX;
                                if (gated(tm, u) != SIZE_MAX)
                                        tm->gate[gated(tm, u)]--;
                                progress = true;
                        }
                        /* the phases */
                        if (running && tm->ph_end[cur] <= now) {
                                running = false;
                                cur++;
                                progress = true;
                        }
                        if (!running && cur < tm->n_all_ph && tm->gate[cur] == 0) {
                                tm->ph_start[cur] = now;
                                tm->ph_end[cur] = now + tm->compute[cur % p->n_phases];
                                running = true;
                                progress = true;
                        }
                        /* copies that leave, free */
                        while (lo_pending < tm->n_all && !isnan(tm->done[lo_pending]))
                                lo_pending++;
                        for (size_t u = lo_pending; u < tm->n_all; u++) {
                                size_t ph;
                                const CbEvent *e = ev_of(tm, u, &ph);
                                double r;

                                if ((e->kind != CB_EV_DROP && e->kind != CB_EV_STALE) || !release_due(tm, u, cur, now, &r))
                                        continue;
                                if (!tm->transit[u % tm->n_ev])
                                        used[e->tier] -= p->size[e->tensor];
                                tm->done[u] = now;
                                progress = true;
                        }
                        /*
                         * a drain of an earlier phase than the head's goes first to host room
                         * (the model drained it before that arrival came)
                         */
                        if (head < tm->n_all)
                                (void) ev_of(tm, head, &head_ph);
                        else
                                head_ph = SIZE_MAX;
                        drain_first = false;
                        for (size_t u = lo_pending; u < tm->n_all && !drain_first; u++) {
                                size_t ph;
                                const CbEvent *e = ev_of(tm, u, &ph);
                                double r;

                                if (ph >= head_ph)
                                        break;
                                drain_first = e->kind == CB_EV_DRAIN && !tm->transit[u % tm->n_ev] &&
                                              u != inflight[1] && release_due(tm, u, cur, now, &r);
                        }
                        /* arrivals, in the model's order */
                        while (head < tm->n_all) {
                                size_t ph;
                                const CbEvent *e = ev_of(tm, head, &ph);
                                int k = ev_link(e->kind);
                                bool transit;

                                if (!is_arrival(e->kind)) {
                                        head++;
                                        continue;
                                }
                                transit = tm->transit[head % tm->n_ev];
                                if (!prev_done(tm, head) || (k >= 0 && inflight[k] != SIZE_MAX) ||
                                    (k >= 0 && !version_final(tm, head, cur)) ||
                                    (!transit && e->tier == CB_HOST && drain_first) ||
                                    (!transit && !force && used[e->tier] + p->size[e->tensor] > tm->cap[e->tier]))
                                        break;
                                force = false;
                                if (!transit)
                                        used[e->tier] += p->size[e->tensor];
                                if (k < 0) {
                                        tm->done[head] = now;
                                        if (gated(tm, head) != SIZE_MAX)
                                                tm->gate[gated(tm, head)]--;
                                } else {
                                        inflight[k] = head;
                                        busy[k] = now + (tm->bw[k] > 0 ? (double) p->size[e->tensor] / tm->bw[k] : 0);
                                }
                                head++;
                                progress = true;
                        }
                        /* each link, when no arrival goes: what makes room, released first */
                        if (head < tm->n_all)
                                (void) ev_of(tm, head, &head_ph);
                        else
                                head_ph = SIZE_MAX;
                        for (int k = 0; k < 2; k++) {
                                size_t pick = SIZE_MAX;
                                double pr = INFINITY;

                                if (inflight[k] != SIZE_MAX || (k == 0 && running && read_due(tm, head, cur)))
                                        continue;
                                for (size_t u = lo_pending; u < tm->n_all; u++) {
                                        size_t ph;
                                        const CbEvent *e = ev_of(tm, u, &ph);
                                        double r;

                                        if (!is_leaving(e->kind) || ev_link(e->kind) != k ||
                                            !release_due(tm, u, cur, now, &r) || r >= pr)
                                                continue;
                                        /*
                                         * a drain takes host room: only when there is, and not
                                         * ahead of the phase of the arrivals (that room is theirs)
                                         */
                                        if (e->kind == CB_EV_DRAIN && !tm->transit[u % tm->n_ev] &&
                                            ((!force && used[CB_HOST] + p->size[e->tensor] > tm->cap[CB_HOST]) ||
                                             ph > head_ph))
                                                continue;
                                        pick = u;
                                        pr = r;
                                }
                                if (pick != SIZE_MAX) {
                                        uint32_t t = tm->log->ev[pick % tm->n_ev].tensor;

                                        if (tm->log->ev[pick % tm->n_ev].kind == CB_EV_DRAIN &&
                                            !tm->transit[pick % tm->n_ev]) {
                                                used[CB_HOST] += p->size[t];
                                                force = false;
                                        }
                                        inflight[k] = pick;
                                        busy[k] = now + (tm->bw[k] > 0 ? (double) p->size[t] / tm->bw[k] : 0);
                                        progress = true;
                                }
                        }
                }
                if (cur >= tm->n_all_ph)
                        break;
                for (int k = 0; k < 2; k++)
                        if (inflight[k] != SIZE_MAX)
                                next = MIN(next, busy[k]);
                if (running)
                        next = MIN(next, tm->ph_end[cur]);
                if (!isfinite(next) && !force) {
                        /*
                         * a swap between full tiers: the first move waiting for room
                         * (an earlier drain, else the head) goes over it, as the model lets it
                         */
                        force = true;
                        continue;
                }
                if (!isfinite(next))
                        return -EDEADLK;        /* cannot happen (see the theory): a bug, not a figure */
                now = next;
        }
        *ret_step = (tm->ph_start[tm->n_all_ph - tm->n_ph] - tm->ph_start[tm->n_all_ph - (TIMED_MEASURED + 1) * tm->n_ph]) /
                    ((double) TIMED_MEASURED * (double) tm->log->steps);
        return 0;
}

/* The step time of the schedule noted in @log, executed as the theory says. */
static int timed_step(const CbPlan *p, const CbLog *log, uint64_t vram_cap, uint64_t host_cap, const double *compute,
                      double nvme_bw, double link_bw, size_t defer, double *ret) {
        Timed tm = { .defer = defer, .p = p, .log = log, .compute = compute, .bw = { nvme_bw, link_bw }, .cap = { vram_cap, host_cap },
                     .n_ev = log->n, .n_all = log->n * TIMED_CYCLES, .n_ph = p->n_phases * log->steps,
                     .n_all_ph = p->n_phases * log->steps * TIMED_CYCLES };
        int r = -ENOMEM;

        if (log->n == 0) {
                double s = 0;

                for (size_t k = 0; k < p->n_phases; k++)
                        s += compute[k];
                *ret = s;       /* nothing moves: the compute */
                return 0;
        }
        tm.prev = calloc(tm.n_ev, sizeof(ptrdiff_t));
        tm.rel = calloc(tm.n_ev, sizeof(ptrdiff_t));
        tm.need = calloc(tm.n_ev, sizeof(ptrdiff_t));
        tm.wrote = calloc(tm.n_ev, sizeof(ptrdiff_t));
        tm.transit = calloc(tm.n_ev, sizeof(bool));
        tm.done = calloc(tm.n_all, sizeof(double));
        tm.ph_start = calloc(tm.n_all_ph, sizeof(double));
        tm.ph_end = calloc(tm.n_all_ph, sizeof(double));
        tm.gate = calloc(tm.n_all_ph, sizeof(size_t));
        if (tm.prev && tm.rel && tm.need && tm.wrote && tm.transit && tm.done && tm.ph_start && tm.ph_end && tm.gate) {
                r = timed_prepare(&tm);
                if (r >= 0)
                        r = timed_run(&tm, ret);
        }
        free(tm.prev);
        free(tm.rel);
        free(tm.need);
        free(tm.wrote);
        free(tm.transit);
        free(tm.done);
        free(tm.ph_start);
        free(tm.ph_end);
        free(tm.gate);
        return r;
}

/* Time the schedule of one rule (perturbed by @seed, @pct); keep it in *@ret when faster.  -ETIME: none. */
static int try_one(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, CbRule ru, double w_nvme, double w_link,
                   uint32_t seed, uint32_t pct, const uint8_t *out, const double *compute, double nvme_bw,
                   double link_bw, CbPlanned *ret) {
        CbBytes b;
        CbLog log;
        double step;
        int r;

        r = cb_simulate_log(p, vram_cap, host_cap, ru, w_nvme, w_link, seed, pct, out, TIMED_SIM_STEPS, &b, &log);
        if (r < 0)
                return r;
        r = timed_step(p, &log, vram_cap, host_cap, compute, nvme_bw, link_bw, SIZE_MAX, &step);
        cb_log_free(&log);
        if (r < 0)
                return r;
        if (step < ret->step_s)
                *ret = (CbPlanned) { .step_s = step, .bytes = b, .rule = ru, .w_nvme = w_nvme, .w_link = w_link,
                                     .seed = seed, .pct = pct, .placed = out != NULL };
        return 0;
}

int cb_timed_log(const CbPlan *p, const CbLog *log, uint64_t vram_cap, uint64_t host_cap, const double *compute,
                 double nvme_bw, double link_bw, size_t defer, double *ret) {
        if (!p || !log || !compute || !ret || !(nvme_bw >= 0) || !(link_bw >= 0))
                return -EINVAL;
        return timed_step(p, log, vram_cap, host_cap, compute, nvme_bw, link_bw, defer, ret);
}

/* The bytes per step of @log's moves. */
static CbBytes log_bytes(const CbPlan *p, const CbLog *log) {
        CbBytes b = {};

        for (size_t i = 0; i < log->n; i++) {
                double s = (double) p->size[log->ev[i].tensor] / (double) log->steps;

                switch (log->ev[i].kind) {
                case CB_EV_READ:
                        b.nvme_read += s;
                        break;
                case CB_EV_WRITE:
                        b.nvme_write += s;
                        break;
                case CB_EV_UP:
                        b.link_up += s;
                        break;
                case CB_EV_DOWN:
                case CB_EV_DRAIN:
                        b.link_down += s;
                        break;
                default:
                        break;
                }
        }
        return b;
}

/*
 * Time the schedule built for time (cb_build_log()) from plan of waits @out,
 * @slack bytes of memory kept for reads ahead, writes deferred by @defer
 * phases; keep it in *@ret when faster.  -ENOSPC: no such schedule.
 */
static int try_built(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, unsigned held, const uint8_t *out,
                     uint64_t slack, size_t defer, const double *compute, double nvme_bw, double link_bw,
                     CbPlanned *ret) {
        CbLog log;
        double step;
        int r;

        r = cb_build_log(p, vram_cap, host_cap, held, out, slack, &log);
        if (r < 0)
                return r;
        r = timed_step(p, &log, vram_cap, host_cap, compute, nvme_bw, link_bw, defer, &step);
        if (r >= 0 && step < ret->step_s)
                *ret = (CbPlanned) { .step_s = step, .bytes = log_bytes(p, &log), .placed = true, .built = true,
                                     .slack = slack, .defer = defer };
        cb_log_free(&log);
        return r;
}

/*
 * The schedules built for time: from the plan of waits @out and from one
 * that keeps the waits ending first in the burst of capbound_time()'s
 * window, with no memory or one largest tensor's kept for reads ahead, and
 * writes deferred or not.
 */
static int try_builds(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, unsigned held, const uint8_t *out,
                      const double *compute, double nvme_bw, double link_bw, CbPlanned *best) {
        static const size_t defers[] = { SIZE_MAX, 1 };
        _cleanup_free_ uint8_t *burst_out = NULL;
        uint64_t largest = 0;
        CbTime tb;
        int r;

        r = capbound_time(p, vram_cap, host_cap, compute, nvme_bw, link_bw, &tb);
        if (r == -E2BIG)
                return 0;       /* too large to scan for a burst: no schedules built */
        if (r >= 0)
                r = cb_place_gaps_from(p, vram_cap, host_cap, held, tb.from, &burst_out);
        if (r < 0)
                return r;
        for (size_t t = 0; t < p->n_tensors; t++)
                largest = MAX(largest, p->size[t]);
        for (unsigned g = 0; g < 2; g++)
                for (unsigned sl = 0; sl < 2; sl++)
                        for (size_t d = 0; d < ELEMENTSOF(defers); d++) {
                                r = try_built(p, vram_cap, host_cap, held, g ? burst_out : out, sl ? largest : 0,
                                              defers[d], compute, nvme_bw, link_bw, best);
                                if (r == -ENOSPC || r == -E2BIG)
                                        break;  /* this construction does not fit: the rules' schedules stand */
                                if (r < 0)
                                        return r;
                        }
        return 0;
}

int capbound_planned(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, unsigned held, const double *compute,
                     double nvme_bw, double link_bw, unsigned tries, CbPlanned *ret) {
        static const uint32_t pcts[] = { 5, 10, 20, 30 };
        _cleanup_free_ uint8_t *out = NULL;
        CbPlanned best;
        int r;

        if (!ret || !compute || (held != 1 && held != 2) || !(nvme_bw >= 0) || !(link_bw >= 0))
                return -EINVAL;
        r = cb_plan_check(p);
        if (r < 0)
                return r;
        for (size_t k = 0; k < p->n_phases; k++)
                if (!(compute[k] >= 0) || !isfinite(compute[k]))
                        return -EINVAL;
        best = (CbPlanned) { .step_s = INFINITY };
        r = cb_place_gaps(p, vram_cap, host_cap, held, &out);
        if (r < 0)
                return r;
        for (unsigned placed = 0; placed < 2; placed++)
                for (unsigned rule = 0; rule < CB_RULE_COMBOS; rule++)
                        for (size_t w = 0; w < CB_WEIGHTS; w++) {
                                CbRule ru = cb_rule_nth(rule, held);

                                r = try_one(p, vram_cap, host_cap, ru, cb_weights[w][0], cb_weights[w][1], 0, 0,
                                            placed ? out : NULL, compute, nvme_bw, link_bw, &best);
                                if (r < 0 && r != -ETIME)
                                        return r;       /* -ETIME: no cycle to time */
                        }
        if (!isfinite(best.step_s))
                return -ETIME;
        /* perturbed schedules of the best rule */
        for (unsigned i = 0; i < tries; i++) {
                CbPlanned base = best;

                r = try_one(p, vram_cap, host_cap, base.rule, base.w_nvme, base.w_link, i + 1,
                            pcts[i % ELEMENTSOF(pcts)], base.placed ? out : NULL, compute, nvme_bw, link_bw, &best);
                if (r < 0 && r != -ETIME)
                        return r;
        }
        r = try_builds(p, vram_cap, host_cap, held, out, compute, nvme_bw, link_bw, &best);
        if (r < 0)
                return r;
        *ret = best;
        return 0;
}

/* ---- the time bound (capbound_time()) ------------------------------------------------ */

typedef struct Occs {
        CbOcc *occ;                     /* every tensor's accesses in step order (cb_occ_build()) */
        size_t *occ_start;
} Occs;

/* The modes of @t's first accesses at or after phase @k (cyclic): what it must hold then. */
static uint8_t next_modes_from(const Occs *s, uint32_t t, size_t k) {
        size_t lo = s->occ_start[t], hi = s->occ_start[t + 1], first = SIZE_MAX;
        uint8_t modes = 0;

        for (size_t i = lo; i < hi && first == SIZE_MAX; i++)
                if (s->occ[i].phase >= k)
                        first = s->occ[i].phase;
        if (first == SIZE_MAX && lo < hi)
                first = s->occ[lo].phase;
        for (size_t i = lo; i < hi; i++)
                if (s->occ[i].phase == first)
                        modes |= s->occ[i].mode;
        return modes;
}

int cb_time_args(const CbPlan *p, const double *compute, double nvme_bw, double link_bw, double *ret_total,
                 bool *ret_writes) {
        size_t n;
        double total = 0;
        int r;

        if (!compute || !(nvme_bw >= 0) || !(link_bw >= 0))
                return -EINVAL;
        r = cb_plan_check(p);
        if (r < 0)
                return r;
        n = p->n_phases;
        if ((double) n * (double) p->start[n] > 1e8)
                return -E2BIG;
        for (size_t k = 0; k < n; k++) {
                if (!(compute[k] >= 0))
                        return -EINVAL;
                total += compute[k];
        }
        *ret_total = total;
        /* the writes' part rescans what a window wrote at every phase: only where that stays small */
        *ret_writes = (double) n * (double) n * (double) p->n_tensors <= 1e8;
        return 0;
}

int capbound_time(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, const double *compute, double nvme_bw,
                  double link_bw, CbTime *ret) {
        size_t n = p ? p->n_phases : 0, n_mod;
        Occs s = {};
        _cleanup_free_ uint32_t *stamp = NULL, *mstamp = NULL, *mod = NULL;
        double total = 0, mem = (double) vram_cap + (double) host_cap;
        bool writes;
        int r;

        if (!ret)
                return -EINVAL;
        r = cb_time_args(p, compute, nvme_bw, link_bw, &total, &writes);
        if (r < 0)
                return r;
        *ret = (CbTime) { .step_s = total, .from = SIZE_MAX, .to = SIZE_MAX };
        stamp = calloc(p->n_tensors, sizeof(uint32_t));
        mstamp = calloc(p->n_tensors, sizeof(uint32_t));
        mod = calloc(p->n_tensors, sizeof(uint32_t));
        r = stamp && mstamp && mod ? cb_occ_build(p, &s.occ, &s.occ_start) : -ENOMEM;
        if (r < 0)
                goto finish;

        for (size_t a = 0; a < n; a++) {
                double reads = 0, ups = 0, before = 0;
                uint32_t gen = (uint32_t) a + 1;

                n_mod = 0;
                for (size_t off = 0; off < n; off++) {
                        size_t k = (a + off) % n;
                        double wait, live = 0;

                        /* what phases a .. k - 1 wrote and is still needed when k starts: on NVMe unless held */
                        for (size_t i = 0; writes && i < n_mod; i++) {
                                uint8_t m = next_modes_from(&s, mod[i], k);

                                if (m & CB_READ)
                                        live += (double) p->size[mod[i]];
                        }
                        /* the tensors whose first access since a is in phase k: what that phase reads of them */
                        for (size_t i = p->start[k]; i < p->start[k + 1]; i++) {
                                uint32_t t = p->acc[i].tensor;
                                uint8_t modes = 0, vram_read = 0;

                                if (stamp[t] == gen)
                                        continue;
                                stamp[t] = gen;
                                for (size_t j = i; j < p->start[k + 1]; j++)
                                        if (p->acc[j].tensor == t) {
                                                modes |= p->acc[j].mode;
                                                if (p->acc[j].tier == CB_VRAM && (p->acc[j].mode & CB_READ))
                                                        vram_read = 1;
                                        }
                                if (modes & CB_READ)
                                        reads += (double) p->size[t];
                                if (vram_read)
                                        ups += (double) p->size[t];
                        }
                        /* reads and writes share the drive: both before k starts */
                        wait = MAX(nvme_bw > 0 ? (MAX(reads - mem, 0) + MAX(live - mem, 0)) / nvme_bw : 0,
                                   link_bw > 0 ? (ups - (double) vram_cap) / link_bw : 0);
                        if (wait > before && total + wait - before > ret->step_s) {
                                *ret = (CbTime) { .step_s = total + wait - before, .from = a, .to = k,
                                                  .read_bytes = MAX(reads - mem, 0),
                                                  .write_bytes = MAX(live - mem, 0),
                                                  .up_bytes = MAX(ups - (double) vram_cap, 0) };
                        }
                        before += compute[k];
                        /* phase k's writes count from k + 1 on */
                        for (size_t i = p->start[k]; writes && i < p->start[k + 1]; i++) {
                                uint32_t t = p->acc[i].tensor;

                                if ((p->acc[i].mode & CB_WRITE) && mstamp[t] != gen) {
                                        mstamp[t] = gen;
                                        mod[n_mod++] = t;
                                }
                        }
                }
        }
        r = 0;
finish:
        free(s.occ);
        free(s.occ_start);
        return r;
}

int capbound_lower(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, const double *compute, double nvme_bw,
                   double link_bw, unsigned jobs, CbTime *ret_time, double *ret_s) {
        CbWindow w;
        CbBytes f;
        double s = 0;
        int r;

        if (!ret_time || !ret_s || jobs == 0)
                return -EINVAL;
        r = capbound_time(p, vram_cap, host_cap, compute, nvme_bw, link_bw, ret_time);
        if (r < 0)
                return r;
        /* room, crossings and gaps (capbound-window.c): at or above capbound_time()'s */
        r = capbound_window(p, vram_cap, host_cap, compute, nvme_bw, link_bw, &w);
        if (r < 0)
                return r;
        /* the proven bytes only: capbound_min()'s are a schedule's, above the minimum on some plans */
        r = capbound_floor(p, vram_cap, host_cap, &f);
        if (r < 0)
                return r;
        for (size_t k = 0; k < p->n_phases; k++)
                s += compute[k];
        if (nvme_bw > 0)
                s = MAX(s, (double) jobs * (f.nvme_read + f.nvme_write) / nvme_bw);
        if (link_bw > 0)
                s = MAX(s, (double) jobs * (f.link_up + f.link_down) / link_bw);
        *ret_s = MAX(MAX(ret_time->step_s, w.step_s), s);
        return 0;
}
