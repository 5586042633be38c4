/* SPDX-License-Identifier: MIT */
/* capbound-place.c: which waits between a tensor's uses go to NVMe, planned for the whole cycle (a min-cost flow). */

/*
 * Theory of operation
 *
 * The model's rules pick victims one at a time, by the next use (Belady)
 * and the cost of dropping; on a training plan they stream more tensors
 * than the cycle needs (the 8-layer plan: 16 NVMe transfers a step where 12
 * do) and stream them at bad moments.  Here the choice is made for the
 * whole cycle at once, from the plan alone.
 *
 * Every tensor waits between two uses: from its access in phase a to its
 * next in phase b, through phases a + 1 .. b - 1 (a gap).  A gap is kept
 * in memory (VRAM or host, pooled: the link is not what this weighs) or
 * spent on NVMe, which costs the read back (when b reads) and the write
 * down (when the version the gap holds was written in the plan: pessimistic
 * when one version spans several gaps, whose write the first one pays).  A
 * gap before a write-only access is dead and costs nothing.  The tensors a
 * phase pins (and, holding two, the next phase's) take their room there
 * whatever is chosen.  Keeping gaps is then weighted interval packing: at
 * most the memory left at each phase, the most bytes saved; as a flow,
 * exact: one unit of flow per byte of memory runs along the phases, a kept
 * gap carries its bytes over the phases it spans, and the pinned bytes of a
 * phase must stay on the chain there (a lower bound, by a cost that
 * outweighs every saving).  Min-cost flow by successive shortest paths.
 * Among gaps that save the same, the shorter is kept (a cost of one per
 * phase spanned, below a byte saved): a long wait on NVMe leaves the most
 * time for its write and read.
 *
 * The cycle repeats: three steps are laid out, and the middle one's choice
 * is the plan's.  A tensor whose gap is kept wholly keeps it; one kept in
 * part (sizes differ) goes out.  capbound.c then runs the model with these
 * choices first among the victims (cb_simulate_log()'s @out).
 */

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bench/capbound-internal.h"
#include "proto/macro.h"

#define PLACE_CYCLES 3u
/* The cost of a pinned byte off the chain: more than every gap's saving together. */
#define PINNED_COST (INT64_C(1) << 40)
/* A byte saved weighs this many phases spanned. */
#define SAVED_WEIGHT (INT64_C(1) << 20)

typedef struct Edge {
        uint32_t to;
        uint64_t cap;                   /* residual */
        int64_t cost;                   /* per byte */
        uint32_t rev;                   /* index of the reverse edge in the node to's list */
} Edge;

typedef struct Graph {
        size_t n;
        Edge **e;
        size_t *ne, *ce;
} Graph;

static int add_edge1(Graph *g, uint32_t from, Edge e) {
        if (g->ne[from] == g->ce[from]) {
                size_t nc = g->ce[from] ? g->ce[from] * 2 : 4;
                Edge *x = realloc(g->e[from], nc * sizeof(Edge));

                if (!x)
                        return -ENOMEM;
                g->e[from] = x;
                g->ce[from] = nc;
        }
        g->e[from][g->ne[from]++] = e;
        return 0;
}

/* An edge and its reverse; *@ret_idx (may be NULL) gets its index in @from's list. */
static int add_edge(Graph *g, uint32_t from, uint32_t to, uint64_t cap, int64_t cost, size_t *ret_idx) {
        size_t i = g->ne[from], j = g->ne[to];
        int r;

        r = add_edge1(g, from, (Edge) { to, cap, cost, (uint32_t) j });
        if (r < 0)
                return r;
        r = add_edge1(g, to, (Edge) { from, 0, -cost, (uint32_t) i });
        if (r < 0)
                return r;
        if (ret_idx)
                *ret_idx = i;
        return 0;
}

static void graph_free(Graph *g) {
        for (size_t i = 0; g->e && i < g->n; i++)
                free(g->e[i]);
        free(g->e);
        free(g->ne);
        free(g->ce);
}

/* Send @amount from node 0 to node n - 1 at least cost (Bellman-Ford on the residual graph each time). */
static int min_cost_flow(Graph *g, uint64_t amount) {
        int64_t *dist = calloc(g->n, sizeof(int64_t));
        uint32_t *pv = calloc(g->n, sizeof(uint32_t)), *pe = calloc(g->n, sizeof(uint32_t));
        int r = 0;

        if (!dist || !pv || !pe) {
                r = -ENOMEM;
                goto finish;
        }
        while (amount > 0) {
                bool changed = true;
                uint64_t push = amount;

                for (size_t i = 0; i < g->n; i++)
                        dist[i] = INT64_MAX;
                dist[0] = 0;
                for (size_t round = 0; changed && round < g->n; round++) {
                        changed = false;
                        for (uint32_t v = 0; v < g->n; v++) {
                                if (dist[v] == INT64_MAX)
                                        continue;
                                for (uint32_t k = 0; k < g->ne[v]; k++) {
                                        Edge *e = &g->e[v][k];

                                        if (e->cap == 0 || dist[v] + e->cost >= dist[e->to])
                                                continue;
                                        dist[e->to] = dist[v] + e->cost;
                                        pv[e->to] = v;
                                        pe[e->to] = k;
                                        changed = true;
                                }
                        }
                }
                if (dist[g->n - 1] == INT64_MAX) {
                        r = -E2BIG;     /* the memory cannot carry the pinned bytes */
                        goto finish;
                }
                for (uint32_t v = (uint32_t) g->n - 1; v != 0; v = pv[v])
                        push = MIN(push, g->e[pv[v]][pe[v]].cap);
                for (uint32_t v = (uint32_t) g->n - 1; v != 0; v = pv[v]) {
                        Edge *e = &g->e[pv[v]][pe[v]];

                        e->cap -= push;
                        g->e[e->to][e->rev].cap += push;
                }
                amount -= push;
        }
finish:
        free(dist);
        free(pv);
        free(pe);
        return r;
}

int cb_place_gaps(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, unsigned held, uint8_t **ret_out) {
        return cb_place_gaps_from(p, vram_cap, host_cap, held, SIZE_MAX, ret_out);
}

int cb_place_gaps_from(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, unsigned held, size_t burst,
                       uint8_t **ret_out) {
        size_t n = p ? p->n_phases : 0, np = PLACE_CYCLES * n;
        int64_t per_phase = 1;
        uint64_t mem = vram_cap + host_cap;
        _cleanup_free_ uint64_t *pinned = NULL;
        _cleanup_free_ size_t *gap_edge = NULL, *gap_from = NULL;
        _cleanup_free_ uint8_t *seen = NULL, *written = NULL;
        uint8_t *out = NULL;
        Graph g = { .n = np + 1 };
        int r;

        if (!ret_out || (held != 1 && held != 2))
                return -EINVAL;
        r = cb_plan_check(p);
        if (r < 0)
                return r;
        if (burst >= n || (int64_t) n * (int64_t) n * 4 >= SAVED_WEIGHT)
                burst = SIZE_MAX;       /* no burst, or too many phases to weigh where a gap ends */
        else
                per_phase = (int64_t) n;        /* a phase spanned outweighs every end's place in the burst */
        pinned = calloc(n, sizeof(uint64_t));
        seen = calloc(p->n_tensors, 1);
        written = calloc(p->n_tensors, 1);
        /* per access of the middle step: its gap's edge (SIZE_MAX: none) in its node's list */
        gap_edge = malloc((p->start[n] ? p->start[n] : 1) * sizeof(size_t));
        gap_from = malloc((p->start[n] ? p->start[n] : 1) * sizeof(size_t));
        out = calloc(p->start[n] ? p->start[n] : 1, 1);
        g.e = calloc(g.n, sizeof(Edge *));
        g.ne = calloc(g.n, sizeof(size_t));
        g.ce = calloc(g.n, sizeof(size_t));
        if (!pinned || !seen || !written || !gap_edge || !gap_from || !out || !g.e || !g.ne || !g.ce) {
                r = -ENOMEM;
                goto finish;
        }
        /* what each phase pins (each tensor once per tier), with two held the next phase's too */
        for (size_t k = 0; k < n; k++) {
                memset(seen, 0, p->n_tensors);
                for (size_t h = 0; h < held; h++) {
                        size_t q = (k + h) % n;

                        for (size_t i = p->start[q]; i < p->start[q + 1]; i++) {
                                uint8_t bit = tier_bit(p->acc[i].tier);

                                if (seen[p->acc[i].tensor] & bit)
                                        continue;
                                seen[p->acc[i].tensor] |= bit;
                                pinned[k] += p->size[p->acc[i].tensor];
                        }
                }
                if (pinned[k] > mem) {
                        r = -E2BIG;
                        goto finish;
                }
        }
        for (size_t i = 0; i < p->start[n]; i++)
                if (p->acc[i].mode & CB_WRITE)
                        written[p->acc[i].tensor] = 1;
        /* the chain: the pinned bytes must stay on it, the rest of memory may */
        for (size_t x = 0; x < np; x++) {
                r = add_edge(&g, (uint32_t) x, (uint32_t) (x + 1), pinned[x % n], -PINNED_COST, NULL);
                if (r >= 0 && mem > pinned[x % n])
                        r = add_edge(&g, (uint32_t) x, (uint32_t) (x + 1), mem - pinned[x % n], 0, NULL);
                if (r < 0)
                        goto finish;
        }
        /* the gaps: from each access to the tensor's next (cyclic), over the steps laid out */
        for (size_t i = 0; i < p->start[n]; i++)
                gap_edge[i] = SIZE_MAX;
        for (size_t c = 0; c < PLACE_CYCLES; c++)
                for (size_t k = 0; k < n; k++)
                        for (size_t i = p->start[k]; i < p->start[k + 1]; i++) {
                                uint32_t t = p->acc[i].tensor;
                                size_t d, first = i;
                                uint8_t m;
                                int64_t saved, cost;
                                ptrdiff_t a, b;

                                /* one gap per tensor and phase: from its first access there */
                                for (size_t j = p->start[k]; j < i; j++)
                                        if (p->acc[j].tensor == t)
                                                first = j;
                                if (first != i)
                                        continue;
                                for (d = 1; d <= n && !cb_modes_in(p, t, (k + d) % n); d++)
                                        ;
                                m = cb_modes_in(p, t, (k + d) % n);
                                if (d == 1 || m == CB_WRITE)
                                        continue;       /* no phase between, or dead: nothing to keep */
                                /*
                                 * the version the gap holds was written in the plan when the tensor is
                                 * written anywhere in the step (the last write before is in the cycle)
                                 */
                                saved = (m & CB_READ ? 1 : 0) + (written[t] ? 1 : 0);
                                if (saved == 0)
                                        continue;
                                a = (ptrdiff_t) (c * n + k + 1);
                                b = a + (ptrdiff_t) d - 1;      /* the node after its last phase between */
                                if (b > (ptrdiff_t) np)
                                        b = (ptrdiff_t) np;
                                if (a >= b)
                                        continue;       /* begins after the steps laid out */
                                cost = -saved * SAVED_WEIGHT + (int64_t) (d - 1) * per_phase;
                                if (burst != SIZE_MAX)
                                        cost += (int64_t) ((k + d + n - burst) % n);
                                r = add_edge(&g, (uint32_t) a, (uint32_t) b, p->size[t], cost,
                                             c == 1 ? &gap_edge[i] : NULL);
                                if (r < 0)
                                        goto finish;
                                if (c == 1)
                                        gap_from[i] = (size_t) a;
                                /* the first step's gaps that began in the step before */
                                if (c == 0 && (ptrdiff_t) (k + d) > (ptrdiff_t) n) {
                                        r = add_edge(&g, 0, (uint32_t) (k + d - n), p->size[t], cost, NULL);
                                        if (r < 0)
                                                goto finish;
                                }
                        }
        r = min_cost_flow(&g, mem);
        if (r < 0)
                goto finish;
        /* the middle step: a gap kept wholly stays; the others go to NVMe */
        for (size_t k = 0; k < n; k++)
                for (size_t i = p->start[k]; i < p->start[k + 1]; i++) {
                        uint32_t t = p->acc[i].tensor;
                        size_t first = i;

                        for (size_t j = p->start[k]; j < i; j++)
                                if (p->acc[j].tensor == t)
                                        first = j;
                        if (gap_edge[first] == SIZE_MAX)
                                continue;
                        out[i] = g.e[gap_from[first]][gap_edge[first]].cap != 0;
                }
        *ret_out = out;
        out = NULL;
        r = 0;
finish:
        free(out);
        graph_free(&g);
        return r;
}
