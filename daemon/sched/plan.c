/* SPDX-License-Identifier: MIT */
/* plan.c: a rank's iteration plan: validation, indexes, the shared page, markers and predictions. */

/*
 * Theory of operation.
 *
 * A connection (one rank) may submit an iteration plan: a cyclic list of
 * phases, each naming the tensors it touches, the tier it needs them in
 * and how (read, write).  plan_new() checks it against the job and numbers
 * the distinct tensors ("slots") in order of first appearance, as the
 * client does.  Everything it does is linear in the size of the request,
 * which [limits] and PLAN_MAX_* bound: duplicate accesses within a phase
 * are merged through a per-slot stamp, not by searching the phase.
 *
 * Two indexes make the scheduler's questions cheap: per slot and tier
 * class, the phases that use it (next use: Belady's rule, predictions),
 * and per slot every phase that touches it with its access modes (is the
 * next access a write-only one?) and where its accesses sit in that phase
 * (is a read of it in the current phase still to pin?: asked of every
 * candidate victim, so it must not walk the phase).
 *
 * The rank marks phase boundaries through a shared page (proto/plan.h):
 * it writes the marker and kicks an eventfd, which costs no round trip,
 * and waits only when tierd has not yet said that the phase may run
 * (plan_set_ready()).  From the marker timestamps tierd learns each
 * phase's duration (an exponential moving average), which turns every
 * plan into a prediction of when each future access happens
 * (plan_predict()): the shared timeline the scheduler (sched.c) plans on.
 * The client's area of the page is untrusted: sequence numbers that do not
 * advance are ignored, a phase the plan does not have fails the plan, and
 * timestamps are clamped between the last marker and now.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include "daemon/base/level.h"
#include "daemon/base/log.h"
#include "daemon/base/wakeup.h"
#include "daemon/engine/engine.h"
#include "daemon/sched/plan.h"
#include "daemon/sched/sched.h"
#include "daemon/state/registry.h"
#include "daemon/state/tensormap.h"
#include "daemon/tiers/segpool.h"
#include "proto/macro.h"
#include "proto/plan.h"
#include "util/time-util.h"

/* A phase whose duration is not known yet is assumed to take this long. */
#define DEFAULT_PHASE_NS (1000000ull)
/* Weight of a new sample in a phase's moving average (1/4). */
#define EMA_SHIFT 2

static int errf(char *error, size_t size, int r, const char *fmt, ...) _printf_(4, 5);
static int errf(char *error, size_t size, int r, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(error, size, fmt, ap);
        va_end(ap);
        return r;
}

/* ---- indexes ---------------------------------------------------------------------------- */

/* Bytes the union of phases @a and @b pins in @tier (uses @mark, one byte per slot, left zeroed). */
static uint64_t phases_bytes(const Plan *p, uint32_t a, uint32_t b, int tier, uint8_t *mark) {
        uint32_t list[2] = { a, b };
        int n = a == b ? 1 : 2;
        uint64_t bytes = 0;

        for (int k = 0; k < n; k++) {
                const PlanPhase *ph = &p->phases[list[k]];

                for (uint32_t i = 0; i < ph->n_acc; i++)
                        if (ph->acc[i].tier == tier && !mark[ph->acc[i].slot]) {
                                mark[ph->acc[i].slot] = 1;
                                bytes += ph->acc[i].tensor->alloc_size;
                        }
        }
        for (int k = 0; k < n; k++) {
                const PlanPhase *ph = &p->phases[list[k]];

                for (uint32_t i = 0; i < ph->n_acc; i++)
                        mark[ph->acc[i].slot] = 0;
        }
        return bytes;
}

static bool use_in_class(const PlanAcc *a, int c) {
        return c == USE_ANY || (c == USE_VRAM ? a->tier == LEVEL_VRAM : a->tier == LEVEL_HOST);
}

/*
 * Build a CSR index over the slots: for each slot, the phases (ascending,
 * each once) with an access in class @c (-1: any access), with @modes
 * the union of their access modes, and with @where the index of the slot's
 * access in each tier there (Plan.acc_where).  @last is scratch of n_slots entries.
 */
static int build_index(Plan *p, int c, uint32_t *last, uint32_t **ret_off, uint32_t **ret_phase, uint8_t **ret_modes,
                       uint32_t **ret_where) {
        _cleanup_free_ uint32_t *pos = NULL;
        uint32_t *off, *phase, *where = NULL;
        uint8_t *modes = NULL;

        off = calloc(p->n_slots + 1, sizeof(uint32_t));
        *ret_off = off;
        if (!off)
                return -ENOMEM;
        memset(last, 0xff, p->n_slots * sizeof(uint32_t));
        for (uint32_t k = 0; k < p->n_phases; k++)
                for (uint32_t i = 0; i < p->phases[k].n_acc; i++) {
                        PlanAcc *a = &p->phases[k].acc[i];

                        if ((c >= 0 && !use_in_class(a, c)) || last[a->slot] == k)
                                continue;
                        last[a->slot] = k;
                        off[a->slot + 1]++;
                }
        for (uint32_t s = 0; s < p->n_slots; s++)
                off[s + 1] += off[s];

        phase = malloc((off[p->n_slots] + 1) * sizeof(uint32_t));
        *ret_phase = phase;
        if (ret_modes) {
                modes = calloc(off[p->n_slots] + 1, 1);
                *ret_modes = modes;
        }
        if (ret_where) {
                where = malloc(2 * ((size_t) off[p->n_slots] + 1) * sizeof(uint32_t));
                *ret_where = where;
                if (where)
                        memset(where, 0xff, 2 * ((size_t) off[p->n_slots] + 1) * sizeof(uint32_t));
        }
        pos = malloc((p->n_slots + 1) * sizeof(uint32_t));
        if (!phase || !pos || (ret_modes && !modes) || (ret_where && !where))
                return -ENOMEM;
        memcpy(pos, off, (p->n_slots + 1) * sizeof(uint32_t));
        memset(last, 0xff, p->n_slots * sizeof(uint32_t));
        for (uint32_t k = 0; k < p->n_phases; k++)
                for (uint32_t i = 0; i < p->phases[k].n_acc; i++) {
                        PlanAcc *a = &p->phases[k].acc[i];

                        if (c >= 0 && !use_in_class(a, c))
                                continue;
                        if (last[a->slot] != k) {
                                last[a->slot] = k;
                                phase[pos[a->slot]++] = k;
                        }
                        if (modes)
                                modes[pos[a->slot] - 1] |= a->mode;
                        if (where)
                                where[2 * (pos[a->slot] - 1) + (a->tier == LEVEL_HOST)] = i;
                }
        return 0;
}

static int build_indexes(Plan *p) {
        _cleanup_free_ uint32_t *last = malloc((p->n_slots + 1) * sizeof(uint32_t));
        int r;

        if (!last)
                return -ENOMEM;
        for (int c = 0; c < _USE_MAX; c++) {
                r = build_index(p, c, last, &p->use_off[c], &p->use_phase[c], NULL, NULL);
                if (r < 0)
                        return r;
        }
        return build_index(p, -1, last, &p->acc_off, &p->acc_phase, &p->acc_mode, &p->acc_where);
}

/* ---- creation and end ------------------------------------------------------------------------ */

/*
 * Read the accesses of @spec into @p: look up each tensor, check tier, mode
 * and size, number the distinct tensors, merge duplicate accesses (same
 * tensor and tier in one phase).  Linear: slots come from a hash map and
 * duplicates are found through a per (slot, tier) stamp.
 */
static int plan_read_phases(Plan *p, const PlanSpec *spec, char *error, size_t esize) {
        _cleanup_(tensormap_freep) TensorMap *seen = tensormap_new();
        /* per (slot, tier): the phase (+1) that has an access to it, and that access's index */
        _cleanup_free_ uint32_t *stamp = calloc(2 * (size_t) MAX(p->n_acc, 1u), sizeof(uint32_t));
        _cleanup_free_ uint32_t *where = calloc(2 * (size_t) MAX(p->n_acc, 1u), sizeof(uint32_t));
        Job *j = p->job;
        uint32_t n_acc = 0;
        size_t i = 0;
        int r;

        if (!seen || !stamp || !where)
                return -ENOMEM;
        for (uint32_t k = 0; k < p->n_phases; k++) {
                PlanPhase *ph = &p->phases[k];

                ph->acc = &p->acc_storage[n_acc];
                for (; i < spec->n_acc && spec->acc[i].phase == k; i++) {
                        const PlanSpecAccess *ra = &spec->acc[i];
                        Tensor *t = tensor_find(j, ra->tensor);
                        uintptr_t slot;
                        size_t key;

                        if (!t)
                                return errf(error, esize, -ENOENT, "phase %u names tensor id %" PRIu64
                                            " that job '%s' does not have", k, ra->tensor, j->name);
                        if (ra->tier != LEVEL_VRAM && ra->tier != LEVEL_HOST)
                                return errf(error, esize, -EINVAL, "phase %u: tensor '%s' must be needed in vram or "
                                            "host", k, t->name);
                        if (ra->mode == 0 || (ra->mode & ~(PLAN_READ | PLAN_WRITE)))
                                return errf(error, esize, -EINVAL, "phase %u: tensor '%s': invalid access mode %u",
                                            k, t->name, ra->mode);
                        slot = (uintptr_t) tensormap_get(seen, t->name);
                        if (slot == 0) {
                                if (p->n_slots >= PLAN_MAX_SLOTS)
                                        return errf(error, esize, -E2BIG, "plan names more than %d tensors",
                                                    PLAN_MAX_SLOTS);
                                p->slots[p->n_slots] = t;
                                slot = ++p->n_slots;
                                r = tensormap_put(seen, t->name, (void *) slot);
                                if (r < 0)
                                        return r;
                        }
                        key = 2 * (slot - 1) + (ra->tier == LEVEL_HOST);
                        if (stamp[key] == k + 1) {
                                ph->acc[where[key]].mode |= (uint8_t) ra->mode;
                                continue;
                        }
                        stamp[key] = k + 1;
                        where[key] = ph->n_acc;
                        ph->acc[ph->n_acc++] = (PlanAcc) {
                                .tensor = t, .slot = (uint32_t) slot - 1, .tier = (uint8_t) ra->tier,
                                .mode = (uint8_t) ra->mode,
                        };
                        n_acc++;
                }
        }
        return 0;
}

/* Does one phase (two consecutive ones when @pairs) fit the job's limits in each tier? */
static int plan_check_quota(Plan *p, bool pairs, char *error, size_t esize) {
        _cleanup_free_ uint8_t *mark = calloc(p->n_slots + 1, 1);
        Job *j = p->job;

        if (!mark)
                return -ENOMEM;
        pairs = pairs && p->n_phases > 1;
        for (uint32_t k = 0; k < p->n_phases; k++)
                for (int tier = LEVEL_VRAM; tier <= LEVEL_HOST; tier++) {
                        uint32_t k2 = pairs ? (k + 1) % p->n_phases : k;
                        uint64_t b = phases_bytes(p, k, k2, tier, mark);

                        if (b <= j->limit[tier])
                                continue;
                        if (pairs)
                                return errf(error, esize, -ENOSPC,
                                            "phases %u and %u together pin %" PRIu64 " bytes of %s, more than "
                                            "job '%s' may use there (%" PRIu64 "; the timeline policy pins "
                                            "the next phase while one runs)",
                                            k, k2, b, level_to_string(tier), j->name, j->limit[tier]);
                        return errf(error, esize, -ENOSPC,
                                    "phase %u pins %" PRIu64 " bytes of %s, more than job '%s' may "
                                    "use there (%" PRIu64 ")", k, b, level_to_string(tier), j->name, j->limit[tier]);
                }
        return 0;
}

/* Pieces a copy of @t can have in a tier of @seg_size segments: 0 when it fits one (the slot says it all). */
static uint32_t pieces_cap(const Tensor *t, uint64_t seg_size) {
        return t->alloc_size > seg_size ? (uint32_t) (t->alloc_size / seg_size) + 1 : 0;
}

/* The shared page (memfd, size sealed), with room for every slot's pieces, and the marker eventfd. */
static int plan_make_page(Plan *p) {
        SegPool **pools = p->sched->registry->pools;
        uint64_t n_pieces = 0;

        for (uint32_t i = 0; i < p->n_slots; i++)
                for (int tier = LEVEL_VRAM; tier <= LEVEL_HOST; tier++)
                        n_pieces += pieces_cap(p->slots[i], pools[tier]->seg_size);
        p->page_size = plan_page_size(p->n_slots, n_pieces);
        p->page_fd = memfd_create("tierd-plan", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (p->page_fd < 0 || ftruncate(p->page_fd, (off_t) p->page_size) < 0 ||
            fcntl(p->page_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
                return negative_errno();
        p->page = mmap(NULL, p->page_size, PROT_READ | PROT_WRITE, MAP_SHARED, p->page_fd, 0);
        if (p->page == MAP_FAILED) {
                p->page = NULL;
                return negative_errno();
        }
        p->marker_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (p->marker_fd < 0)
                return negative_errno();
        /*
         * each (slot, tier) gets its own stretch of the pieces, kept here: the client may write the
         * page's copy, which plan_slot_publish() only ever writes
         */
        p->first_piece = calloc(2 * (size_t) MAX(p->n_slots, 1u), sizeof(uint32_t));
        if (!p->first_piece)
                return -ENOMEM;
        n_pieces = 0;
        for (uint32_t i = 0; i < p->n_slots; i++)
                for (int tier = LEVEL_VRAM; tier <= LEVEL_HOST; tier++) {
                        p->first_piece[2 * i + (uint32_t) tier] = (uint32_t) n_pieces;
                        p->page->slots[2 * i + (uint32_t) tier].first_piece = (uint32_t) n_pieces;
                        n_pieces += pieces_cap(p->slots[i], pools[tier]->seg_size);
                }
        return 0;
}

int plan_new(Sched *s, Job *j, int efd, const PlanSpec *spec, bool pairs, Plan **ret, char *error,
             size_t esize) {
        uint32_t n_acc = 0, max_acc = 0, run = 0;
        Plan *p;
        int r;

        if (spec->n_phases == 0)
                return errf(error, esize, -EINVAL, "a plan needs at least one phase");
        if (spec->n_phases > PLAN_MAX_PHASES)
                return errf(error, esize, -E2BIG, "plan has %zu phases (at most %d)", spec->n_phases, PLAN_MAX_PHASES);
        if (spec->n_acc > PLAN_MAX_ACCESSES)
                return errf(error, esize, -E2BIG, "plan has more than %d accesses", PLAN_MAX_ACCESSES);
        /* accesses per phase; the phases in order (the translator's duty, checked all the same) */
        for (size_t i = 0; i < spec->n_acc; i++) {
                if (spec->acc[i].phase >= spec->n_phases || (i > 0 && spec->acc[i].phase < spec->acc[i - 1].phase))
                        return errf(error, esize, -EINVAL, "plan access %zu: phase %u out of order", i,
                                    spec->acc[i].phase);
                run = i > 0 && spec->acc[i].phase == spec->acc[i - 1].phase ? run + 1 : 1;
                max_acc = MAX(max_acc, run);
        }
        n_acc = (uint32_t) spec->n_acc;

        p = calloc(1, sizeof(Plan));
        if (!p)
                return -ENOMEM;
        p->sched = s;
        p->job = j;
        p->efd = efd;
        p->page_fd = p->marker_fd = -1;
        p->cur = UINT32_MAX;
        list_init(&p->link);
        list_init(&p->job_link);
        p->n_phases = (uint32_t) spec->n_phases;
        p->n_acc = n_acc;
        p->max_acc = MAX(max_acc, 1u);
        p->phases = calloc(p->n_phases, sizeof(PlanPhase));
        p->acc_storage = calloc(MAX(n_acc, 1u), sizeof(PlanAcc));
        p->slots = calloc(MAX(n_acc, 1u), sizeof(Tensor *));
        p->pred = calloc(p->n_phases + 1, sizeof(uint64_t));
        p->wmark = calloc(MAX(n_acc, 1u), 1);
        p->sim_avail = calloc(p->n_phases + 1, sizeof(uint64_t));
        p->sim_stamp = calloc(MAX(n_acc, 1u), sizeof(uint32_t));
        p->move_step = calloc(2 * (size_t) MAX(n_acc, 1u), sizeof(uint64_t));
        p->move_used = calloc(2 * (size_t) MAX(n_acc, 1u), sizeof(bool));
        p->move_refetch = calloc(2 * (size_t) MAX(n_acc, 1u), sizeof(uint16_t));
        r = p->phases && p->acc_storage && p->slots && p->pred && p->wmark && p->sim_avail && p->sim_stamp &&
            p->move_step && p->move_used && p->move_refetch ? 0 : -ENOMEM;
        for (int h = 0; h < 2; h++) {
                p->hs[h].pinned = calloc(p->max_acc, sizeof(bool));
                p->hs[h].ops = calloc(p->max_acc, sizeof(Op *));
                p->hs[h].ctx = calloc(p->max_acc, sizeof(PinCtx));
                p->hs[h].blocked = calloc(p->max_acc, sizeof(uint64_t));
                if (!p->hs[h].pinned || !p->hs[h].ops || !p->hs[h].ctx || !p->hs[h].blocked)
                        r = -ENOMEM;
        }
        if (r >= 0)
                r = plan_read_phases(p, spec, error, esize);
        if (r >= 0)
                r = plan_check_quota(p, pairs, error, esize);
        if (r >= 0)
                r = build_indexes(p);
        if (r >= 0)
                r = plan_make_page(p);
        if (r < 0) {
                plan_free(p);
                return r;
        }
        *ret = p;
        return 0;
}

void plan_free(Plan *p) {
        if (!p)
                return;
        sd_event_source_disable_unref(p->marker_source);
        safe_close(p->marker_fd);
        if (p->page)
                munmap(p->page, p->page_size);
        safe_close(p->page_fd);
        for (int h = 0; h < 2; h++) {
                free(p->hs[h].pinned);
                free(p->hs[h].ops);
                free(p->hs[h].ctx);
                free(p->hs[h].blocked);
        }
        for (int c = 0; c < _USE_MAX; c++) {
                free(p->use_off[c]);
                free(p->use_phase[c]);
        }
        free(p->acc_off);
        free(p->acc_phase);
        free(p->acc_mode);
        free(p->acc_where);
        free(p->pred);
        free(p->wmark);
        free(p->sim_avail);
        free(p->sim_stamp);
        free(p->move_step);
        free(p->move_used);
        free(p->move_refetch);
        free(p->phases);
        free(p->acc_storage);
        free(p->slots);
        free(p->first_piece);
        free(p);
}

/* ---- predictions -------------------------------------------------------------------------- */

uint64_t plan_phase_ns(const Plan *p, uint32_t ph) {
        return p->phases[ph].samples ? p->phases[ph].ema_ns : DEFAULT_PHASE_NS;
}

void plan_predict(Plan *p, uint64_t now) {
        uint32_t cur = plan_cur(p);
        uint64_t t;

        t = p->cur == UINT32_MAX ? now : MAX(p->cur_mark_ns, now - MIN(now, plan_phase_ns(p, cur)));
        p->pred[0] = t;
        for (uint32_t n = 1; n <= p->n_phases; n++) {
                t += plan_phase_ns(p, (cur + n - 1) % p->n_phases);
                p->pred[n] = MAX(t, now);
        }
}

/* Is access @i of the current phase @ph a read in class @c still to pin (@held: hold 0 is that phase's)? */
static bool cur_access_pending(const Plan *p, const PlanPhase *ph, bool held, uint32_t i, int c) {
        const PlanAcc *a = &ph->acc[i];

        return (a->mode & PLAN_READ) && use_in_class(a, c) && !(held && i < p->max_acc && p->hs[0].pinned[i]);
}

bool plan_cur_read_pending_walk(const Plan *p, const Tensor *t, int c) {
        const PlanPhase *ph;
        bool held;

        if (p->cur >= p->n_phases)
                return false;
        ph = &p->phases[p->cur];
        held = p->hold[0].active && p->hold[0].phase == p->cur;
        for (uint32_t i = 0; i < ph->n_acc; i++)
                if (ph->acc[i].tensor == t && cur_access_pending(p, ph, held, i, c))
                        return true;
        return false;
}

/*
 * Asked of every candidate victim in each choice (sched_next_access_overwrites(),
 * victim_next_use()), so it looks at @t's own accesses in the current phase only
 * (Plan.acc_where, found by a binary search of the phases touching its slot):
 * a walk of the whole phase for each made a choice cost its copies times the
 * phase's accesses (40960 copies, a phase of 2048: tens of milliseconds).
 */
bool plan_cur_read_pending(const Plan *p, const Tensor *t, int c) {
        const PlanPhase *ph;
        uint32_t s = t->plan_slot, lo, hi;
        bool held;

        if (p->cur >= p->n_phases)
                return false;
        ph = &p->phases[p->cur];
        held = p->hold[0].active && p->hold[0].phase == p->cur;
        if (s >= p->n_slots || p->slots[s] != t) {
                /* not a tensor of @p's own (plan.h): its accesses, if any, by a walk of the phase */
                p->sched->pending_looks += ph->n_acc;
                return plan_cur_read_pending_walk(p, t, c);
        }
        lo = p->acc_off[s];
        hi = p->acc_off[s + 1];
        while (lo < hi) {
                uint32_t mid = lo + (hi - lo) / 2;

                if (p->acc_phase[mid] < p->cur)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        if (lo == p->acc_off[s + 1] || p->acc_phase[lo] != p->cur)
                return false;
        for (uint32_t k = 0; k < 2; k++) {
                uint32_t i = p->acc_where[2 * lo + k];

                p->sched->pending_looks++;
                if (i != UINT32_MAX && cur_access_pending(p, ph, held, i, c))
                        return true;
        }
        return false;
}

uint64_t plan_next_use_class(const Plan *p, const Tensor *t, int c) {
        uint32_t s = t->plan_slot, lo = p->use_off[c][s], hi = p->use_off[c][s + 1];
        uint32_t cur = plan_cur(p), best = UINT32_MAX;

        if (lo == hi)
                return UINT64_MAX;
        for (uint32_t i = lo; i < hi; i++) {
                uint32_t n = (p->use_phase[c][i] + p->n_phases - cur) % p->n_phases;

                /* the current phase's use counts when it still has to pin it (else it is served already) */
                if (n == 0 && !(p->use_phase[c][i] == p->cur && plan_cur_read_pending(p, t, c)))
                        n = p->n_phases;
                best = MIN(best, n);
        }
        return p->pred[best];
}

uint64_t plan_next_use(const Plan *p, const Tensor *t, int tier) {
        return plan_next_use_class(p, t, tier == LEVEL_VRAM ? USE_VRAM : USE_ANY);
}

uint8_t plan_next_access_mode(const Plan *p, const Tensor *t, uint32_t from, bool inclusive) {
        uint32_t s = t->plan_slot, best = UINT32_MAX;
        uint8_t mode = 0;

        for (uint32_t i = p->acc_off[s]; i < p->acc_off[s + 1]; i++) {
                uint32_t n = (p->acc_phase[i] + p->n_phases - from) % p->n_phases;

                if (n == 0 && !inclusive)
                        n = p->n_phases;
                if (n < best) {
                        best = n;
                        mode = p->acc_mode[i];
                }
        }
        return mode;
}

/* ---- the page ---------------------------------------------------------------------------------- */

static void plan_wake(Plan *p) {
        wakeup_kick(p->efd);
}

void plan_set_ready(Plan *p, uint64_t seq, uint32_t phase) {
        __atomic_store_n(&p->page->daemon.ready, PLAN_READY(seq, phase), __ATOMIC_RELEASE);
        plan_wake(p);
}

void plan_set_error(Plan *p, int error, const char *what) {
        if (p->error)
                return;
        log_job(LOG_ERR, 0, p->job->name, "Plan of job '%s' failed: %s", p->job->name, what);
        p->error = error;
        __atomic_store_n(&p->page->daemon.error, (int64_t) error, __ATOMIC_RELEASE);
        plan_wake(p);
}

void plan_slot_publish(Plan *p, const PlanAcc *a) {
        const Copy *c = &a->tensor->copy[a->tier];
        PlanSlot *s;
        PlanPiece *pieces;

        /* (by this plan's slot of it: another plan naming the tensor first has it in Tensor.plan_slot) */
        if (a->tier > LEVEL_HOST || c->n_pieces == 0)
                return;
        s = &p->page->slots[2 * a->slot + (uint32_t) a->tier];
        s->segment = c->pieces[0].seg->pool->id_base + c->pieces[0].seg->id;
        s->generation = c->pieces[0].seg->generation;
        s->offset = c->pieces[0].offset;
        s->n_pieces = c->n_pieces > 1 ? c->n_pieces : 0;
        /* where the pieces go is ours, never the page's (the client may have written it): said again */
        s->first_piece = p->first_piece[2 * a->slot + (uint32_t) a->tier];
        if (c->n_pieces <= 1)
                return;
        /* a copy has at most alloc_size / seg_size + 1 pieces, the room plan_make_page() left */
        pieces = plan_pieces(p->page, p->n_slots) + p->first_piece[2 * a->slot + (uint32_t) a->tier];
        for (uint32_t i = 0; i < c->n_pieces; i++)
                pieces[i] = (PlanPiece) {
                        .segment = c->pieces[i].seg->pool->id_base + c->pieces[i].seg->id,
                        .generation = c->pieces[i].seg->generation,
                        .offset = c->pieces[i].offset,
                        .length = c->pieces[i].len,
                };
}

void plan_peek_marker(const Plan *p, uint64_t *ret_seq, uint32_t *ret_phase) {
        uint64_t seq, packed;

        seq = __atomic_load_n(&p->page->client.marker_seq, __ATOMIC_ACQUIRE);
        /*
         * The packed word holds this marker's seq and phase or a newer one's
         * (stored before the seq); the two fields may be torn (plan.h).  A
         * client that does not write it (0), or writes one behind its seq,
         * gets the fields.
         */
        packed = __atomic_load_n(&p->page->client.marker, __ATOMIC_ACQUIRE);
        if (packed != 0 && PLAN_READY_SEQ(packed) >= seq) {
                *ret_seq = PLAN_READY_SEQ(packed);
                *ret_phase = PLAN_READY_PHASE(packed);
        } else {
                *ret_seq = seq;
                *ret_phase = __atomic_load_n(&p->page->client.phase, __ATOMIC_RELAXED);
        }
}

int plan_read_marker(Plan *p, uint64_t now, uint64_t *ret_seq, uint32_t *ret_phase, uint64_t *ret_mark) {
        uint64_t v, seq, mark;
        uint32_t phase;

        /*
         * Never blocking, whatever the fd's flags say: the client shares its open file description
         * and may clear O_NONBLOCK (a plain read() then waited for its next marker with the loop, and
         * every job, stopped).  RWF_NOWAIT is per call (eventfd: Linux 5.12).  No read() where the
         * kernel lacks it: tierd refuses such a kernel at start (core/kernel.c).
         */
        (void) preadv2(p->marker_fd, &(struct iovec) { .iov_base = &v, .iov_len = sizeof(v) }, 1, -1, RWF_NOWAIT);
        plan_peek_marker(p, &seq, &phase);
        if (seq <= p->seq)
                return -EAGAIN;
        mark = __atomic_load_n(&p->page->client.mark_ns, __ATOMIC_RELAXED);
        if (phase >= p->n_phases)
                return -EINVAL;
        /* the client's clock reading is only a hint: keep it between the last marker and now */
        if (mark > now || mark < p->cur_mark_ns)
                mark = now;
        *ret_seq = seq;
        *ret_phase = phase;
        *ret_mark = mark;
        return 0;
}

/* A new iteration starts at @now: the figures of the one that ended. */
static void plan_iteration(Plan *p, uint64_t now) {
        Job *j = p->job;
        uint64_t stall = __atomic_load_n(&p->page->client.stall_ns, __ATOMIC_ACQUIRE);

        if (p->iter_start_ns) {
                /*
                 * stall_ns is the client's number: its waits in this step each began after a marker of
                 * the step and ended by now (one at a time), so no more than the time since the step
                 * began counts (2^64 - 1, then 0, then 2^64 - 1 again wrapped the job's counter round)
                 */
                uint64_t real = now_ns(), waited = stall >= p->iter_stall_ns ? stall - p->iter_stall_ns : 0;

                waited = MIN(waited, real > p->iter_start_ns ? real - p->iter_start_ns : 0);
                p->iterations++;
                p->last_step_s = (double) (now - p->iter_start_ns) / 1e9;
                p->last_stall_s = (double) waited / 1e9;
                /* the job's counters: they go on across its plans (a plan's own figures start at 0) */
                j->plan_iterations++;
                j->plan_stall_ns = j->plan_stall_ns + waited < j->plan_stall_ns ? UINT64_MAX :
                        j->plan_stall_ns + waited;
                for (int i = 0; i < _LINK_MAX; i++)
                        p->last_step_links[i] = j->link_bytes[i] - p->iter_links[i];
                log_debug("sched: job '%s' (weight %u) step %" PRIu64 ": %.3f s, stall %.3f s, NVMe read %" PRIu64
                          " write %" PRIu64 ", vram link %" PRIu64 " bytes; so far: moves repeated in a step %" PRIu64
                          " (evicted before use %" PRIu64 "), prefetches not admitted %" PRIu64, j->name, j->weight,
                          p->iterations, p->last_step_s, p->last_stall_s, p->last_step_links[LINK_NVME_TO_HOST],
                          p->last_step_links[LINK_HOST_TO_NVME],
                          p->last_step_links[LINK_HOST_TO_VRAM] + p->last_step_links[LINK_VRAM_TO_HOST],
                          p->moves_repeated, p->moves_refetched, p->admit_refused);
        }
        p->iter_start_ns = now;
        p->iter_stall_ns = stall;
        for (int i = 0; i < _LINK_MAX; i++)
                p->iter_links[i] = j->link_bytes[i];
}

void plan_learn(Plan *p, uint64_t seq, uint32_t phase, uint64_t mark) {
        uint32_t prev = p->cur;

        /* the duration of the phase that just ended, when the markers were consecutive */
        if (prev != UINT32_MAX && seq == p->seq + 1) {
                PlanPhase *ph = &p->phases[prev];
                uint64_t d = mark - p->cur_mark_ns;

                if (ph->samples++ == 0)
                        ph->ema_ns = d;
                else
                        ph->ema_ns = ph->ema_ns - (ph->ema_ns >> EMA_SHIFT) + (d >> EMA_SHIFT);
        }
        if (prev == UINT32_MAX || phase <= prev)
                plan_iteration(p, mark);
}

void plan_set_owner(Plan *p, uint32_t rank, uint64_t conn_id) {
        p->rank = rank;
        p->conn_id = conn_id;
        p->rank_shared = false;
        list_for_each_safe(node, tmp, &p->job->plans) {
                const Plan *q = list_entry(node, Plan, job_link);

                if (q != p && q->rank == rank)
                        p->rank_shared = true;
        }
}

void plan_stats(const Plan *p, PlanStats *ret) {
        uint64_t step = 0;

        for (uint32_t k = 0; k < p->n_phases; k++)
                step += plan_phase_ns(p, k);
        *ret = (PlanStats) {
                .phase = p->cur == UINT32_MAX ? 0 : p->cur,
                .phases = p->n_phases,
                .iterations = p->iterations,
                .step_s = (double) step / 1e9,
                .stall_s = p->last_stall_s,
                .last_step_s = p->last_step_s,
                /* the client's own counter (its page): a number to show, never trusted for anything else */
                .stall_total_s = (double) __atomic_load_n(&p->page->client.stall_ns, __ATOMIC_ACQUIRE) / 1e9,
        };
}

void plan_release_after_use(Plan *p, uint32_t done_phase, uint32_t next_phase) {
        PlanPhase *d = &p->phases[done_phase], *nx = &p->phases[next_phase];

        /* ondemand: nothing is cached; what the finished phase used goes back down */
        for (uint32_t i = 0; i < d->n_acc; i++) {
                Tensor *t = d->acc[i].tensor;
                bool again = false;

                for (uint32_t k = 0; k < nx->n_acc; k++)
                        if (nx->acc[k].tensor == t)
                                again = true;
                if (!again && t->op_refs == 0 && t->copy[LEVEL_VRAM].pins == 0 && t->copy[LEVEL_HOST].pins == 0 &&
                    !t->job->frozen) {
                        Op *op = NULL;

                        if (op_submit(p->sched->engine, OP_EVICT, t, LEVEL_NVME, NULL, NULL, NULL, &op) >= 0)
                                op->internal = true;    /* no client waits: freeing the tensor cancels it */
                }
        }
}

/* Append to @buf (@size bytes, *@len used) what fits of @fmt; "..." ends it once it is full. */
static void append(char *buf, size_t size, size_t *len, const char *fmt, ...) _printf_(4, 5);
static void append(char *buf, size_t size, size_t *len, const char *fmt, ...) {
        va_list ap;
        int n;

        if (*len + 4 >= size)
                return;
        va_start(ap, fmt);
        n = vsnprintf(buf + *len, size - 4 - *len, fmt, ap);
        va_end(ap);
        if (n < 0)
                return;
        if ((size_t) n >= size - 4 - *len) {
                memcpy(buf + size - 4, "...", 4);       /* and full: nothing more is appended */
                *len = size - 1;
                return;
        }
        *len += (size_t) n;
}

void plan_log_residency(const Plan *p) {
        char buf[1024] = "";
        size_t len = 0;

        if (log_get_level() < LOG_DEBUG)
                return;
        for (int tier = LEVEL_VRAM; tier < TIERS; tier++) {
                append(buf, sizeof(buf), &len, " %s:", level_to_string(tier));
                for (uint32_t i = 0; i < p->n_slots; i++) {
                        const Tensor *t = p->slots[i];

                        if (t && copy_valid(t, tier))
                                append(buf, sizeof(buf), &len, " %s%s", t->name,
                                       tier != LEVEL_NVME && copy_is_sole(t, tier) ? "*" : "");
                }
        }
        log_debug("sched: job '%s' phase %u starts with%s", p->job->name, plan_cur(p), buf);
}

/*
 * After @done_phase (the phase just released), drop every copy of the
 * tensors it used whose next planned access overwrites them whole: they are
 * dead, and keeping them would only take room (and Belady would rank them by
 * that overwrite as if it were a read).  Only tensors this plan alone names,
 * and nothing pinned, moving or in use by an op.
 */
void plan_drop_dead(Plan *p, uint32_t done_phase) {
        PlanPhase *d = &p->phases[done_phase];

        for (uint32_t i = 0; i < d->n_acc; i++) {
                Tensor *t = d->acc[i].tensor;
                /*
                 * (not the version its job committed, unless committed dead: a rollback finds the
                 * tensor at that version and keeps it, copies and all; its next write makes the
                 * image first, tensor_needs_image())
                 */
                bool kept = t->job->committing && !t->commit_dead && t->version == t->commit_version;
                bool busy = t->xfer || t->op_refs > 0 || t->sched_op || t->plan != p || t->plan_refs != 1 || kept;

                for (int tier = 0; tier < TIERS && !busy; tier++)
                        busy = t->copy[tier].pins > 0;
                /* from the phase the client is in now (it may have skipped some), that one included */
                if (busy || t->dead || plan_next_access_mode(p, t, p->cur, true) != PLAN_WRITE)
                        continue;
                t->dead = true;
                t->dead_rank = p->rank + 1;     /* a read of it now fails, not zeros (op.c) */
                for (int tier = 0; tier < TIERS; tier++)
                        copy_free(t, tier);
                log_debug("sched: '%s' of job '%s' is dead until its next write: copies dropped", t->name,
                          p->job->name);
        }
}

/*
 * Tell the other plans what @p's holds just unpinned as written (Tensor.sched_changed), as a
 * client's write is told: another plan's hold ahead may have been said ready on an older copy
 * of it in another tier (invariant 1).  Only once the release is over: sched_tensor_changed()
 * itself consumes markers and releases and pins holds.
 */
void plan_notify_written(Plan *p) {
        for (uint32_t i = 0; i < p->n_slots; i++) {
                Tensor *t = p->slots[i];

                if (t->sched_changed) {
                        t->sched_changed = false;
                        sched_tensor_changed(p->sched, t);
                }
        }
}

bool plan_holds_overwrite(const Tensor *t) {
        const Plan *p = t->plan;
        unsigned n = 0;

        /* dead only within one plan (invariant 7): another plan naming it may read it meanwhile */
        if (!p || t->rw_pins > 0 || t->plan_refs != 1)
                return false;
        for (int h = 0; h < 2; h++) {
                const PlanPhase *ph;

                if (!p->hold[h].active)
                        continue;
                ph = &p->phases[p->hold[h].phase];
                for (uint32_t i = 0; i < ph->n_acc; i++)
                        if (ph->acc[i].tensor == t && ph->acc[i].mode == PLAN_WRITE && p->hs[h].pinned[i])
                                n++;
        }
        return n > 0 && n == tensor_writers(t);
}

/*
 * Does phase @phase alone fit, in @tier, its job's limit and every total the
 * job is held to?  Then a pin refused -EDQUOT (a total full) may yet be
 * granted once the other jobs under the total let go of what they pin; else
 * it never will and the plan fails.
 */
bool plan_phase_fits_totals(const Plan *p, uint32_t phase, int tier) {
        const PlanPhase *ph = &p->phases[phase];
        const Job *j = p->job;
        uint64_t bytes = 0;

        for (uint32_t i = 0; i < ph->n_acc; i++)
                if (ph->acc[i].tier == tier)
                        bytes += ph->acc[i].tensor->alloc_size;
        if (bytes > j->limit[tier])
                return false;
        for (unsigned i = 0; i < j->n_totals; i++)
                if (j->totals[i].total[tier] > 0 && bytes > j->totals[i].total[tier])
                        return false;
        return true;
}

bool plan_pin_waits(Plan *p, int h, const PlanAcc *a, int status, const char *error, bool kept) {
        PlanHold *hold = &p->hold[h];
        const PlanPhase *ph = &p->phases[hold->phase];
        const char *lvl = level_to_string(a->tier);
        char what[768];
        uint64_t bytes = 0;

        if (!error)
                error = strerror(-status);
        if (status == -EAGAIN && kept) {
                for (uint32_t i = 0; i < ph->n_acc; i++)
                        if (ph->acc[i].tier == a->tier)
                                bytes += ph->acc[i].tensor->alloc_size;
                if (engine_pins_fit_kept(p->sched->engine, p->job, a->tier, bytes, what, sizeof(what)) < 0) {
                        size_t len = strlen(what);

                        /* waiting would hang the rank for as long as those jobs run */
                        (void) snprintf(what + len, sizeof(what) - len, ": phase %" PRIu32 " (tensor '%s' refused)",
                                        hold->phase, a->tensor->name);
                        plan_set_error(p, -ENOSPC, what);
                        return false;
                }
                if (plan_self_pinned(p, h, a))
                        return true;    /* room its own client pins: refused in the pass, not waited for */
                if (!hold->kept_said)
                        log_job(LOG_WARNING, 0, p->job->name, "Phase %" PRIu32 " of job '%s' waits for room in %s "
                                "kept for other jobs' guarantees until they unpin or end: %s", hold->phase,
                                p->job->name, lvl, error);
                hold->kept_said = true;
        } else if ((status == -ENOSPC || status == -EAGAIN ||
                    (status == -EDQUOT && plan_phase_fits_totals(p, hold->phase, a->tier))) &&
                   plan_self_pinned(p, h, a))
                return true;            /* room its own client pins: refused in the pass, not waited for */
        else if (status == -EDQUOT && plan_phase_fits_totals(p, hold->phase, a->tier))
                log_debug("sched: job '%s' waits for room under a total for '%s' in %s: %s", p->job->name,
                          a->tensor->name, lvl, error);
        else if (status != -ENOSPC && status != -EAGAIN && status != -EBUSY) {
                (void) snprintf(what, sizeof(what), "cannot bring tensor '%s' to %s: %s", a->tensor->name, lvl,
                                error);
                plan_set_error(p, status, what);
                return false;
        }
        /* no room now, a stale copy still pinned, or a total full of what other jobs pin */
        if (status == -EAGAIN)
                log_debug("sched: job '%s' waits for room for '%s' in %s: %s", p->job->name, a->tensor->name, lvl,
                          error);
        (void) snprintf(p->waiting, sizeof(p->waiting), "phase %" PRIu32 ", tensor '%s' in %s: %s", hold->phase,
                        a->tensor->name, lvl, error);
        p->waiting_seq = hold->seq;
        return true;
}

const char *plan_waiting(const Plan *p) {
        const PlanHold *hold = &p->hold[0];     /* the marker's phase: its rank waits for it (not one pinned ahead) */

        if (!hold->active || hold->ready_sent || hold->refused || hold->seq != p->waiting_seq || !p->waiting[0])
                return NULL;
        for (uint32_t i = 0; i < p->phases[hold->phase].n_acc; i++)
                if (!p->hs[0].pinned[i] && p->hs[0].blocked[i] == p->sched->epoch)
                        return p->waiting;
        return NULL;
}
