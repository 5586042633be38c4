/* SPDX-License-Identifier: MIT */
/* capbound-window.c: a tighter time-aware bound: room for the burst's reads, and the link's crossings. */

/*
 * Theory of operation
 *
 * capbound_time() takes a window of phases a .. k and counts what must
 * arrive over NVMe (or the link) between the start of phase a and the start
 * of phase k.  capbound_window() adds three things every schedule obeys,
 * each from the same counts, so it is at or above capbound_time():
 *
 *   - room: until phase a has ended, no tensor the window needs has been
 *     used in it, so none of them can have left memory for good.  Every
 *     one the window's reads do not bring back is held from the window's
 *     start to its first use; every one they do bring back is held from
 *     the start of that read (its room) to its use.  So before a ends the
 *     reads have only the room the unread ones leave, and at least the
 *     window's excess (the bytes beyond VRAM + host) must start *after*
 *     phase a ends, and with it the writes of the versions phases a .. k - 1
 *     make (they exist only once their phase ends).  Phase a's compute
 *     then no longer hides any of that: phase k starts at least
 *     (excess + writes) / nvme_bw after a ends.  The model charges no room
 *     to a copy staged through host on its way to VRAM (a bounce buffer):
 *     such reads may run before a ends, and then their bytes still cross
 *     the link after it; the bound takes the split of the excess between
 *     the two that is kindest to the schedule, limited to what the window
 *     first reads in VRAM.
 *   - crossings: a version written in one tier and read in the other
 *     crosses the link after its writing phase ends and before that read
 *     starts (capbound_floor()'s compulsory crossings, here with when).
 *     Those whose write is in phases a - 1 .. k - 1 and whose read is by
 *     phase k fall between the end of phase a - 1 and the start of k,
 *     beside the ups the window's first VRAM reads need beyond VRAM's room
 *     (a tensor phase a - 1 wrote in host is not in VRAM when it ends: its
 *     up is a crossing, and it takes none of that room); those written in
 *     phases a .. k - 1, and the ups beyond VRAM's room by the room argument
 *     above, fall after phase a ends.  Up and down share the link (the
 *     model's executor and tierd's emulated link alike).
 *   - gaps: a version written in phase b - 1 and read in the other tier by
 *     phase b crosses while no phase runs.  The gaps at different phase
 *     boundaries, and a window's excess inside it, are disjoint idle time:
 *     the step is at least its compute, plus the gaps outside the window,
 *     plus the larger of the window's excess and the gaps inside it.
 *
 * With the link at 0 (no bound from it) crossings and gaps count nothing
 * and every staged read is free to run early.  Like capbound_time(), one
 * job's bound with the whole of both links.
 */

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "bench/capbound-internal.h"
#include "proto/macro.h"

/* A compulsory crossing: the version @w writes in one tier, first read in the other @rel phases later. */
typedef struct Cross {
        size_t w, rel;
        double bytes;
} Cross;

/* Every version written in one tier and read in the other (as capbound_floor() counts them), with when. */
static int crossings(const CbPlan *p, const CbOcc *occ, const size_t *occ_start, Cross **ret, size_t *ret_n) {
        size_t n_acc = p->start[p->n_phases], n = 0;
        Cross *x = calloc(n_acc ? n_acc : 1, sizeof(Cross));

        if (!x)
                return -ENOMEM;
        for (uint32_t t = 0; t < p->n_tensors; t++) {
                size_t lo = occ_start[t], m = occ_start[t + 1] - lo;

                for (size_t i = 0; i < m; i++) {
                        const CbOcc *ow = &occ[lo + i];

                        if (!(ow->mode & CB_WRITE))
                                continue;
                        for (size_t j = 1; j <= m; j++) {
                                const CbOcc *o = &occ[lo + (i + j) % m];
                                size_t rel = (o->phase + p->n_phases - ow->phase) % p->n_phases;

                                if (j < m && o->phase == ow->phase && o->tier != ow->tier)
                                        continue;       /* same phase: not after the write */
                                if ((o->mode & CB_READ) && o->tier != ow->tier) {
                                        x[n++] = (Cross) { ow->phase, rel ? rel : p->n_phases, (double) p->size[t] };
                                        break;
                                }
                                if (o->mode & CB_WRITE)
                                        break;
                        }
                }
        }
        *ret = x;
        *ret_n = n;
        return 0;
}

/* Does phase @k write @t in host and not in VRAM (its VRAM copy is stale when @k ends)? */
static bool host_written(const CbPlan *p, uint32_t t, size_t k) {
        bool host = false, vram = false;

        for (size_t i = p->start[k]; i < p->start[k + 1]; i++)
                if (p->acc[i].tensor == t && (p->acc[i].mode & CB_WRITE)) {
                        if (p->acc[i].tier == CB_HOST)
                                host = true;
                        else
                                vram = true;
                }
        return host && !vram;
}

/* The modes of @t's first accesses at or after phase @k (cyclic). */
static uint8_t next_modes(const CbOcc *occ, const size_t *occ_start, uint32_t t, size_t k) {
        size_t lo = occ_start[t], hi = occ_start[t + 1], first = SIZE_MAX;
        uint8_t modes = 0;

        for (size_t i = lo; i < hi && first == SIZE_MAX; i++)
                if (occ[i].phase >= k)
                        first = occ[i].phase;
        if (first == SIZE_MAX && lo < hi)
                first = occ[lo].phase;
        for (size_t i = lo; i < hi; i++)
                if (occ[i].phase == first)
                        modes |= occ[i].mode;
        return modes;
}

/*
 * The least time the NVMe and link need after phase a ends for @excess bytes
 * of reads and @writes of writes, where up to @stageable of the reads may run
 * early into a bounce buffer and then cross the link instead (link_bw 0:
 * instantly).
 */
static double after_end(double excess, double writes, double stageable, double nvme_bw, double link_bw) {
        double e2, lim = MIN(excess, stageable);

        if (!(nvme_bw > 0))
                return 0;
        if (!(link_bw > 0))
                return MAX(excess - lim + writes, 0) / nvme_bw;
        /* max((excess - e2 + writes) / nvme_bw, e2 / link_bw) is least where the two meet */
        e2 = (excess + writes) * link_bw / (nvme_bw + link_bw);
        e2 = MAX(0, MIN(e2, lim));
        return MAX((excess - e2 + writes) / nvme_bw, e2 / link_bw);
}

int capbound_window(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, const double *compute, double nvme_bw,
                    double link_bw, CbWindow *ret) {
        size_t n = p ? p->n_phases : 0, n_mod, n_x = 0;
        CbOcc *occ = NULL;
        size_t *occ_start = NULL;
        Cross *x = NULL;
        _cleanup_free_ uint32_t *stamp = NULL, *mstamp = NULL, *mod = NULL;
        _cleanup_free_ double *gap = NULL;
        double total = 0, gaps = 0, mem = (double) vram_cap + (double) host_cap;
        bool writes;
        int r;

        if (!ret)
                return -EINVAL;
        r = cb_time_args(p, compute, nvme_bw, link_bw, &total, &writes);
        if (r < 0)
                return r;
        *ret = (CbWindow) { .step_s = total, .from = SIZE_MAX, .to = SIZE_MAX };
        stamp = calloc(p->n_tensors, sizeof(uint32_t));
        mstamp = calloc(p->n_tensors, sizeof(uint32_t));
        mod = calloc(p->n_tensors, sizeof(uint32_t));
        gap = calloc(n, sizeof(double));
        r = stamp && mstamp && mod && gap ? cb_occ_build(p, &occ, &occ_start) : -ENOMEM;
        if (r >= 0)
                r = crossings(p, occ, occ_start, &x, &n_x);
        if (r < 0)
                goto finish;
        if ((double) n * (double) n * (double) n_x > 1e8)
                n_x = 0;        /* too many to place in every window: leave the crossings out (a weaker bound) */

        /* gap[b]: what crosses between the end of phase b - 1 and the start of b */
        for (size_t i = 0; link_bw > 0 && i < n_x; i++)
                if (x[i].rel == 1)
                        gap[(x[i].w + 1) % n] += x[i].bytes / link_bw;
        for (size_t b = 0; b < n; b++)
                gaps += gap[b];
        if (total + gaps > ret->step_s)
                *ret = (CbWindow) { .step_s = total + gaps, .from = SIZE_MAX, .to = SIZE_MAX, .gaps_s = gaps };

        for (size_t a = 0; a < n; a++) {
                double reads = 0, ups = 0, forced = 0, c_in = 0, c_after = 0, gin = 0;
                uint32_t gen = (uint32_t) a + 1;
                size_t am1 = (a + n - 1) % n;

                n_mod = 0;
                for (size_t off = 0; off < n; off++) {
                        size_t k = (a + off) % n;
                        double live = 0, cross_t0 = 0, cross_a = 0, ex_r, ex_w, ex_up, w_from, w_after, w_link;
                        double idle_in, idle, bound;
                        bool after;

                        for (size_t i = 0; writes && i < n_mod; i++)
                                if (next_modes(occ, occ_start, mod[i], k) & CB_READ)
                                        live += (double) p->size[mod[i]];
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
                                if (vram_read) {
                                        ups += (double) p->size[t];
                                        if (n_x > 0 && host_written(p, t, am1))
                                                forced += (double) p->size[t];
                                }
                        }
                        /* the crossings inside: written in a - 1 .. k - 1, read by k (offsets from a - 1) */
                        for (size_t i = 0; link_bw > 0 && i < n_x; i++) {
                                size_t dw = (x[i].w + n - am1) % n;

                                if (dw > off || dw + x[i].rel > off + 1)
                                        continue;
                                cross_t0 += x[i].bytes;
                                if (dw >= 1)
                                        cross_a += x[i].bytes;
                        }
                        ex_r = MAX(reads - mem, 0);
                        ex_w = MAX(live - mem, 0);
                        ex_up = MAX(ups - forced - (double) vram_cap, 0);
                        /* from the end of a - 1 (capbound_time()'s counts, and the link's) */
                        w_from = MAX(nvme_bw > 0 ? (ex_r + ex_w) / nvme_bw : 0,
                                     link_bw > 0 ? (ex_up + cross_t0) / link_bw : 0);
                        /* from the end of a: the room argument */
                        w_after = after_end(ex_r, ex_w, ups, nvme_bw, link_bw);
                        w_link = link_bw > 0 ? (ex_up + cross_a) / link_bw : 0;
                        w_after = MAX(w_after, w_link);
                        /*
                         * idle time in [end a - 1, start k] (boundaries a .. k): at least the gaps there,
                         * the excess from its start, and boundary a's gap plus the excess from the end of a
                         */
                        idle_in = gap[a] + gin;
                        idle = MAX(idle_in, w_from - c_in);
                        after = off > 0 && w_after - c_after > gin;
                        if (after)
                                idle = MAX(idle, gap[a] + w_after - c_after);
                        bound = total + gaps - idle_in + idle;
                        if (bound > ret->step_s + 1e-12)
                                *ret = (CbWindow) { .step_s = bound, .from = a, .to = k, .gaps_s = gaps,
                                                    .read_bytes = ex_r, .write_bytes = ex_w,
                                                    .link_bytes = ex_up + cross_t0,
                                                    .after_end = after &&
                                                                 gap[a] + w_after - c_after >= w_from - c_in };
                        c_in += compute[k];
                        if (off > 0)
                                c_after += compute[k];
                        gin += gap[(k + 1) % n];
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
        free(occ);
        free(occ_start);
        free(x);
        return r;
}
