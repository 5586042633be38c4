/* SPDX-License-Identifier: MIT */
/* capbound-exact.c: the true least bytes per step of capbound.c's model by exhaustive search, for tiny plans. */

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "bench/capbound-internal.h"
#include "proto/macro.h"

/* ---- exhaustive search (tiny plans) ----------------------------------------------- */

/*
 * cost[a][b]: the least bytes of the resource counted (link or NVMe) that
 * turn copy set a into a superset of b (extra copies are dropped for free),
 * per byte of the tensor; INFINITY when b cannot be reached (no copy to
 * start from).  Edges: host from VRAM (link) or NVMe (NVMe), VRAM from host
 * (link), NVMe from host (NVMe), as tierd moves them: host reads VRAM's
 * copy when there is one, NVMe gets only a host copy that VRAM does not
 * also hold (a drain or clean of a sole copy), and without @host_access
 * (the phase does not read the tensor in host) host gets a copy from VRAM
 * only when it is the sole one (a drain: tierd drops a clean VRAM copy, it
 * never demotes it).
 */
static void exact_costs(int what, bool host_access, double cost[8][8]) {
        double lk = what == 1 ? 1 : 0, nv = what == 0 ? 1 : 0;

        for (unsigned a = 0; a < 8; a++)
                for (unsigned b = 0; b < 8; b++) {
                        /* the VRAM copy goes in this move: host and NVMe may take it as the sole one */
                        bool leaving = !(b & B_VRAM);
                        double dist[8];
                        bool done[8] = {};

                        for (unsigned x = 0; x < 8; x++)
                                dist[x] = INFINITY;
                        dist[a] = 0;
                        for (;;) {
                                int u = -1;

                                for (unsigned x = 0; x < 8; x++)
                                        if (!done[x] && isfinite(dist[x]) && (u < 0 || dist[x] < dist[u]))
                                                u = (int) x;
                                if (u < 0)
                                        break;
                                done[u] = true;
                                if ((u & B_VRAM) && (host_access || !(u & B_NVME)))
                                        dist[u | B_HOST] = fmin(dist[u | B_HOST], dist[u] + lk);
                                /* tierd reads VRAM's copy when there is one */
                                if ((u & B_NVME) && !(u & B_VRAM))
                                        dist[u | B_HOST] = fmin(dist[u | B_HOST], dist[u] + nv);
                                if (u & B_HOST) {
                                        dist[u | B_VRAM] = fmin(dist[u | B_VRAM], dist[u] + lk);
                                        /* tierd writes down only a sole copy */
                                        if (!(u & B_VRAM) || leaving)
                                                dist[u | B_NVME] = fmin(dist[u | B_NVME], dist[u] + nv);
                                }
                        }
                        cost[a][b] = INFINITY;
                        for (unsigned x = 0; x < 8; x++)
                                if ((x & b) == b)
                                        cost[a][b] = fmin(cost[a][b], dist[x]);
                }
}

/* Is the first access of tensor @t after phase @k (cyclic) a read in VRAM? */
static bool vram_read_next(const CbPlan *p, size_t t, size_t k) {
        for (size_t n = 1; n <= p->n_phases; n++) {
                size_t ph = (k + n) % p->n_phases;

                for (size_t i = p->start[ph]; i < p->start[ph + 1]; i++)
                        if (p->acc[i].tensor == t)
                                return p->acc[i].tier == CB_VRAM && (p->acc[i].mode & CB_READ);
        }
        return false;
}

int capbound_exact(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, int what, unsigned steps, double *ret) {
        double cost[2][8][8];
        _cleanup_free_ double *d = NULL, *nd = NULL, *total = NULL;
        size_t n, n_states;
        int r;

        if (!ret || (what != 0 && what != 1) || steps < 4)
                return -EINVAL;
        r = cb_plan_check(p);
        if (r < 0)
                return r;
        if (p->n_tensors > 3)
                return -E2BIG;
        n = p->n_tensors;
        n_states = (size_t) 1 << (3 * n);
        exact_costs(what, false, cost[0]);
        exact_costs(what, true, cost[1]);
        d = malloc(n_states * sizeof(double));
        nd = malloc(n_states * sizeof(double));
        total = calloc(steps + 1, sizeof(double));
        if (!d || !nd || !total)
                return -ENOMEM;
        for (size_t x = 0; x < n_states; x++)
                d[x] = INFINITY;
        {
                size_t init = 0;

                for (size_t t = 0; t < n; t++)
                        init |= (size_t) B_NVME << (3 * t);
                d[init] = 0;
        }
        for (unsigned step = 0; step < steps; step++) {
                for (size_t k = 0; k < p->n_phases; k++) {
                        for (size_t y = 0; y < n_states; y++)
                                nd[y] = INFINITY;
                        for (size_t y = 0; y < n_states; y++) {
                                uint64_t use[2] = { 0, 0 };
                                bool ok = true;

                                /* y: the copies during phase k; within capacity, and holding what it needs */
                                for (size_t t = 0; t < n; t++) {
                                        unsigned bits = (y >> (3 * t)) & 7;

                                        if (bits & B_VRAM)
                                                use[0] += p->size[t];
                                        if (bits & B_HOST)
                                                use[1] += p->size[t];
                                }
                                if (use[0] > vram_cap || use[1] > host_cap)
                                        continue;
                                for (size_t i = p->start[k]; i < p->start[k + 1]; i++)
                                        if (!(((y >> (3 * p->acc[i].tensor)) & 7) & tier_bit(p->acc[i].tier)))
                                                ok = false;
                                if (!ok)
                                        continue;
                                for (size_t x = 0; x < n_states; x++) {
                                        double c = d[x];

                                        if (!isfinite(c))
                                                continue;
                                        for (size_t t = 0; t < n && isfinite(c); t++) {
                                                unsigned a = (x >> (3 * t)) & 7, b = (y >> (3 * t)) & 7;
                                                uint8_t wonly = 0, need = 0, vram_use = 0, host_use = 0;

                                                for (size_t i = p->start[k]; i < p->start[k + 1]; i++)
                                                        if (p->acc[i].tensor == t) {
                                                                if (p->acc[i].tier == CB_VRAM)
                                                                        vram_use = 1;
                                                                else if (p->acc[i].mode & CB_READ)
                                                                        host_use = 1;
                                                                if (p->acc[i].mode == CB_WRITE)
                                                                        wonly |= tier_bit(p->acc[i].tier);
                                                                else
                                                                        need |= tier_bit(p->acc[i].tier);
                                                        }
                                                /* a current NVMe copy stays (tierd frees it only when stale) */
                                                if ((a & B_NVME) && !(b & B_NVME)) {
                                                        c = INFINITY;
                                                        break;
                                                }
                                                /*
                                                 * a copy goes up to VRAM for a VRAM access, ahead of a VRAM read,
                                                 * or parked there (the host copy then goes: CB_RULE_PARK)
                                                 */
                                                if ((b & B_VRAM) && !(a & B_VRAM) && !vram_use &&
                                                    !vram_read_next(p, t, k) && (b & B_HOST)) {
                                                        c = INFINITY;
                                                        break;
                                                }
                                                /* a write-only place costs nothing and needs no bytes */
                                                wonly &= (uint8_t) ~need;
                                                b &= ~(unsigned) wonly;
                                                if (b)
                                                        c += cost[host_use][a][b] * (double) p->size[t];
                                        }
                                        if (c < nd[y])
                                                nd[y] = c;
                                }
                        }
                        /* the phase's writes */
                        for (size_t y = 0; y < n_states; y++)
                                d[y] = INFINITY;
                        for (size_t y = 0; y < n_states; y++) {
                                size_t z = y;

                                if (!isfinite(nd[y]))
                                        continue;
                                for (size_t i = p->start[k]; i < p->start[k + 1]; i++)
                                        if (p->acc[i].mode & CB_WRITE) {
                                                size_t sh = 3 * p->acc[i].tensor;

                                                z = (z & ~((size_t) 7 << sh)) | ((size_t) tier_bit(p->acc[i].tier) << sh);
                                        }
                                if (nd[y] < d[z])
                                        d[z] = nd[y];
                        }
                }
                total[step + 1] = INFINITY;
                for (size_t y = 0; y < n_states; y++)
                        total[step + 1] = fmin(total[step + 1], d[y]);
                if (!isfinite(total[step + 1]))
                        return -E2BIG;
        }
        /* the increments settle into a cycle: its mean, else the mean of the second half */
        for (unsigned per = 1; per <= steps / 4; per++) {
                bool same = true;

                for (unsigned k = steps - per; k > steps - 2 * per; k--)
                        if (total[k + 1] - total[k] != total[k + 1 - per] - total[k - per])
                                same = false;
                for (unsigned k = steps; k > steps / 2 + per; k--)
                        if (total[k] - total[k - 1] != total[k - per] - total[k - per - 1])
                                same = false;
                if (same) {
                        *ret = (total[steps] - total[steps - per]) / (double) per;
                        return 0;
                }
        }
        *ret = (total[steps] - total[steps / 2]) / (double) (steps - steps / 2);
        return 0;
}
