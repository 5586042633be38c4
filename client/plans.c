/* SPDX-License-Identifier: MIT */
/* plans.c: iteration plans: tier_plan_*, and tier_phase_enter() against the shared plan page. */

/*
 * Theory of operation
 *
 * A plan is built in the client (tier_plan_add() only collects entries)
 * and sent once, as SubmitPlan with the entries grouped by phase.  tierd
 * answers with a plan page (a memfd both sides map, layout and marker
 * protocol in proto/plan.h) and a marker eventfd; from then on the plan
 * belongs to the client, one plan per client.  Until then the plan is the
 * caller's, linked into its client like a tensor handle, so that
 * tier_client_free() can detach it: every later call on it but
 * tier_plan_free() fails with -ENOTCONN.
 *
 * tier_phase_enter() costs no round trip: it writes the phase and a new marker
 * seq into the page's client area (release store), kicks the marker
 * eventfd, and waits only until the daemon area's "ready" says that
 * marker may run, sleeping in poll() on the connection's wakeup fd (tierd
 * writes a token after it changes "ready" or "error") and on the socket (events, or tierd gone).  Time spent waiting adds up in
 * stall_ns.
 *
 * Plan tensors are numbered by slot, in order of first appearance, as
 * tierd numbers them; the client keeps them by tensor id (plan_ids), so
 * that every handle of a planned tensor, one opened after the submit too,
 * finds its slot.  tier_phase_grant() reads the slot's segment, generation and
 * offset from the page and resolves that grant through the segment cache,
 * again without a round trip unless the segment is new to us.  It does so
 * only for an access of the phase entered (the last tier_phase_enter()
 * returned 0): tierd writes a slot when it pins the copy for a phase and
 * never clears it, so at other times the slot names where an earlier phase
 * had the copy (room another tensor may have now) or, never written, offset
 * 0 of segment 0.  The client keeps the plan's accesses for this
 * (plan_access: 4 bytes an access, PLAN_MAX_ACCESSES at most).
 */

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <tier.h>

#include "client/client-internal.h"
#include "client/tier-private.h"
#include "proto/macro.h"
#include "proto/plan.h"
#include "proto/tier.pb-c.h"
#include "util/time-util.h"

typedef struct PlanEntry {
        uint32_t phase;
        uint32_t tier;
        uint32_t mode;
        tier_tensor *handle;    /* compared only, until tier_plan_submit() finds it open (with its serial) */
        uint64_t serial;
} PlanEntry;

struct tier_plan {
        tier_client *client;    /* NULL once the client was freed */
        tier_plan *prev, *next; /* in client->plans */
        PlanEntry *entries;
        size_t n, cap;
        uint32_t n_phases;
};

_public_ int tier_plan_new(tier_client *c, tier_plan **ret) {
        tier_plan *p;

        if (!c)
                return -EINVAL;
        if (!ret)
                return client_error(c, -EINVAL, "ret is NULL: there is nowhere to store the plan");
        if (c->control)
                return client_error(c, -EPERM, "a control connection has no job to plan for");
        p = calloc(1, sizeof(*p));
        if (!p)
                return client_error(c, -ENOMEM, "out of memory");
        p->client = c;
        p->next = c->plans;
        if (c->plans)
                c->plans->prev = p;
        c->plans = p;
        *ret = p;
        return 0;
}

_public_ tier_plan *tier_plan_free(tier_plan *p) {
        if (!p)
                return NULL;
        if (p->client) {
                if (p->prev)
                        p->prev->next = p->next;
                else
                        p->client->plans = p->next;
                if (p->next)
                        p->next->prev = p->prev;
        }
        free(p->entries);
        free(p);
        return NULL;
}

void plan_detach_all(tier_client *c) {
        for (tier_plan *p = c->plans, *next; p; p = next) {
                next = p->next;
                p->client = NULL;
                p->prev = p->next = NULL;
        }
        c->plans = NULL;
}

_public_ int tier_plan_add(tier_plan *p, unsigned phase, tier_tensor *t, int tier, int mode) {
        int r;

        if (!p)
                return -EINVAL;
        /* (a plan whose client was freed has no client to keep the text) */
        if (tier != TIER_VRAM && tier != TIER_HOST)
                return p->client ? client_error(p->client, -EINVAL, "a plan accesses tensors in vram or host, "
                                                "not tier %d", tier) : -EINVAL;
        if (mode < TIER_READ || mode > TIER_READ_WRITE)
                return p->client ? client_error(p->client, -EINVAL, "mode %d is not TIER_READ, TIER_WRITE or "
                                                "TIER_READ_WRITE", mode) : -EINVAL;
        if (!p->client)
                return -ENOTCONN;       /* its client was freed */
        if (!t)
                return client_error(p->client, -EINVAL, "the tensor is NULL");
        if (!t->client)
                return client_error(p->client, -ENOTCONN, "tensor '%s' belongs to a client that was freed", t->name);
        if (t->client != p->client)
                return client_error(p->client, -EINVAL, "tensor '%s' belongs to another client than the plan",
                                    t->name);
        r = tensor_check(t);
        if (r < 0)
                return r;
        if (phase >= PLAN_MAX_PHASES)
                return client_error(p->client, -E2BIG, "phase %u: a plan has at most %d phases", phase, PLAN_MAX_PHASES);
        if (p->n >= PLAN_MAX_ACCESSES)
                return client_error(p->client, -E2BIG, "a plan has at most %d accesses", PLAN_MAX_ACCESSES);
        if (p->n == p->cap) {
                size_t cap = p->cap ? p->cap * 2 : 64;
                PlanEntry *e = realloc(p->entries, cap * sizeof(PlanEntry));

                if (!e)
                        return client_error(p->client, -ENOMEM, "out of memory");
                p->entries = e;
                p->cap = cap;
        }
        p->entries[p->n++] = (PlanEntry) {
                .phase = phase, .tier = (uint32_t) tier, .mode = (uint32_t) mode, .handle = t, .serial = t->serial,
        };
        p->n_phases = MAX(p->n_phases, phase + 1);
        return 0;
}

static int plan_id_cmp(const void *a, const void *b) {
        const PlanId *x = a, *y = b;

        if (x->id != y->id)
                return x->id < y->id ? -1 : 1;
        return x->slot < y->slot ? -1 : x->slot > y->slot;
}

static int plan_slot_cmp(const void *a, const void *b) {
        const PlanId *x = a, *y = b;

        return x->slot < y->slot ? -1 : x->slot > y->slot;
}

/*
 * The distinct tensors of @p's entries (sorted by phase), numbered in order
 * of first appearance as tierd numbers them: *@ret (sorted by id), *@ret_n.
 */
static int plan_number_slots(const tier_plan *p, PlanId **ret, uint32_t *ret_n) {
        PlanId *ids;
        size_t n = 0;

        ids = calloc(p->n, sizeof(PlanId));
        if (!ids)
                return -ENOMEM;
        /* each access's tensor with its index, the first of each tensor kept */
        for (size_t i = 0; i < p->n; i++)
                ids[i] = (PlanId) { .id = p->entries[i].handle->id, .slot = (uint32_t) i };
        qsort(ids, p->n, sizeof(PlanId), plan_id_cmp);
        for (size_t i = 0; i < p->n; i++)
                if (n == 0 || ids[n - 1].id != ids[i].id)
                        ids[n++] = ids[i];
        /* in order of first appearance: their slots */
        qsort(ids, n, sizeof(PlanId), plan_slot_cmp);
        for (size_t i = 0; i < n; i++)
                ids[i].slot = (uint32_t) i;
        qsort(ids, n, sizeof(PlanId), plan_id_cmp);
        *ret = ids;
        *ret_n = (uint32_t) n;
        return 0;
}

/* The slot of tensor @id in @ids (@n of them, sorted by id), or -1. */
static int64_t plan_id_find(const PlanId *ids, size_t n, uint64_t id) {
        size_t lo = 0, hi = ids ? n : 0;

        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;

                if (ids[mid].id == id)
                        return ids[mid].slot;
                if (ids[mid].id < id)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return -1;
}

/* The slot of tensor @id in @c's plan, or -1 (none, or one whose slots tierd counted otherwise). */
static int64_t plan_slot_of(const tier_client *c, uint64_t id) {
        return plan_id_find(c->plan_ids, c->plan_slots, id);
}

static int u32_cmp(const void *a, const void *b) {
        uint32_t x = *(const uint32_t *) a, y = *(const uint32_t *) b;

        return x < y ? -1 : x > y;
}

/*
 * The accesses of @p's entries (sorted by phase; their tensors numbered in
 * @ids), kept for tier_phase_grant(): phase k's in *@ret from (*@ret_first)[k]
 * to (*@ret_first)[k + 1], each PLAN_ACCESS(slot, tier, mode), sorted, one
 * per (slot, tier) with the modes merged, as tierd merges them.
 */
static int plan_index_accesses(const tier_plan *p, const PlanId *ids, uint32_t n_ids, uint32_t **ret,
                               uint32_t **ret_first) {
        _cleanup_free_ uint32_t *acc = NULL, *first = NULL;
        size_t i = 0, n = 0;

        acc = calloc(p->n, sizeof(uint32_t));
        first = calloc((size_t) p->n_phases + 1, sizeof(uint32_t));
        if (!acc || !first)
                return -ENOMEM;
        for (uint32_t ph = 0; ph < p->n_phases; ph++) {
                size_t start = n, k = n;

                first[ph] = (uint32_t) start;
                for (; i < p->n && p->entries[i].phase == ph; i++)
                        acc[n++] = PLAN_ACCESS(plan_id_find(ids, n_ids, p->entries[i].handle->id),
                                               p->entries[i].tier, p->entries[i].mode);
                qsort(acc + start, n - start, sizeof(uint32_t), u32_cmp);
                for (size_t j = start; j < n; j++)
                        if (k > start && PLAN_ACCESS_KEY(acc[k - 1]) == PLAN_ACCESS_KEY(acc[j]))
                                acc[k - 1] |= acc[j];
                        else
                                acc[k++] = acc[j];
                n = k;
        }
        first[p->n_phases] = (uint32_t) n;
        *ret = TAKE_PTR(acc);
        *ret_first = TAKE_PTR(first);
        return 0;
}

/* The mode of @phase's access of slot @slot in @tier, 0 when it has none. */
static int plan_access_mode(const tier_client *c, uint32_t phase, uint32_t slot, int tier) {
        uint32_t key = PLAN_ACCESS(slot, tier, 0);
        size_t lo, hi;

        if (!c->plan_access || phase >= c->plan_phases)
                return 0;
        lo = c->plan_phase_first[phase];
        hi = c->plan_phase_first[phase + 1];
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;

                if (PLAN_ACCESS_KEY(c->plan_access[mid]) == key)
                        return PLAN_ACCESS_MODE(c->plan_access[mid]);
                if (PLAN_ACCESS_KEY(c->plan_access[mid]) < key)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return 0;
}

_public_ int tier_plan_submit(tier_plan *p) {
        tier_client *c;
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__SubmitPlan sp = TIER__SUBMIT_PLAN__INIT;
        _cleanup_free_ Tier__PlanPhase *phases = NULL;
        _cleanup_free_ Tier__PlanPhase **phasep = NULL;
        _cleanup_free_ Tier__PlanAccess *acc = NULL;
        _cleanup_free_ Tier__PlanAccess **accp = NULL;
        _cleanup_free_ PlanId *ids = NULL;
        _cleanup_free_ uint32_t *access = NULL, *access_first = NULL;
        Packet pk = PACKET_NULL;
        const Tier__PlanReply *pr;
        int page_fd = -1, marker_fd = -1, r;
        struct stat st;
        void *page;
        uint32_t slots = 0;

        if (!p)
                return -EINVAL;
        c = p->client;
        if (!c)
                return -ENOTCONN;       /* its client was freed */
        if (c->plan_page)
                return client_error(c, -EBUSY, "this client already runs a plan");
        if (p->n == 0)
                return client_error(c, -EINVAL, "the plan is empty");
        /*
         * Each access's handle must still be open (its tensor's id is read now: a
         * reconnect since tier_plan_add() renumbers them), and its tensor there.
         */
        for (size_t i = 0; i < p->n; i++) {
                const tier_tensor *h = NULL;

                for (const tier_tensor *t = c->tensors; t && !h; t = t->next)
                        if (t == p->entries[i].handle && t->serial == p->entries[i].serial)
                                h = t;
                if (!h)
                        return client_error(c, -EINVAL, "the plan's access %zu (phase %u) names a tensor "
                                            "whose handle was closed since tier_plan_add()", i, p->entries[i].phase);
                if (h->gone)
                        return client_error(c, -ESTALE, "the plan's tensor '%s' is gone (tierd restarted without "
                                            "it)", h->name);
        }

        /* sort entries by phase (stable), so each phase's accesses are contiguous */
        {
                PlanEntry *sorted = malloc(p->n * sizeof(PlanEntry));
                size_t k = 0;

                if (!sorted)
                        return client_error(c, -ENOMEM, "out of memory");
                for (uint32_t ph = 0; ph < p->n_phases; ph++)
                        for (size_t i = 0; i < p->n; i++)
                                if (p->entries[i].phase == ph)
                                        sorted[k++] = p->entries[i];
                free(p->entries);
                p->entries = sorted;
                p->cap = p->n;
        }

        r = plan_number_slots(p, &ids, &slots);
        if (r < 0)
                return client_error(c, r, "out of memory");
        r = plan_index_accesses(p, ids, slots, &access, &access_first);
        if (r < 0)
                return client_error(c, r, "out of memory");
        phases = calloc(p->n_phases, sizeof(*phases));
        phasep = calloc(p->n_phases, sizeof(*phasep));
        acc = calloc(p->n, sizeof(*acc));
        accp = calloc(p->n, sizeof(*accp));
        if (!phases || !phasep || !acc || !accp)
                return client_error(c, -ENOMEM, "out of memory");
        for (uint32_t ph = 0; ph < p->n_phases; ph++) {
                tier__plan_phase__init(&phases[ph]);
                phasep[ph] = &phases[ph];
        }
        for (size_t i = 0; i < p->n; i++) {
                PlanEntry *e = &p->entries[i];
                Tier__PlanPhase *ph = &phases[e->phase];

                tier__plan_access__init(&acc[i]);
                acc[i].tensor = e->handle->id;
                acc[i].tier = (Tier__Tier) e->tier;
                acc[i].mode = e->mode;
                accp[i] = &acc[i];
                if (ph->n_accesses == 0)
                        ph->accesses = &accp[i];
                ph->n_accesses++;
        }
        sp.n_phases = p->n_phases;
        sp.phases = phasep;
        req.op_case = TIER__REQUEST__OP_PLAN;
        req.plan = &sp;
        r = transport_call(c, &req, &pk);
        if (r < 0)
                return r;
        pr = pk.reply->response->result_case == TIER__RESPONSE__RESULT_PLAN ? pk.reply->response->plan : NULL;
        if (!pr) {
                packet_done(&pk);
                return client_error(c, -EPROTO, "tierd answered the plan without a result");
        }
        page_fd = packet_take_fd(&pk, pr->page_fd);
        marker_fd = packet_take_fd(&pk, pr->marker_fd);
        /* a memfd shorter than the page it is said to hold would SIGBUS at the first marker */
        if (page_fd >= 0 && marker_fd >= 0 && fstat(page_fd, &st) < 0) {
                r = negative_errno();
                safe_close(page_fd);
                safe_close(marker_fd);
                packet_done(&pk);
                return client_error(c, r, "cannot stat the plan page tierd sent: %s", tier_strerror(r));
        }
        if (page_fd < 0 || marker_fd < 0 || pr->page_size < plan_page_size(pr->n_slots, 0) ||
            pr->page_size > SIZE_MAX || st.st_size < 0 || (uint64_t) st.st_size < pr->page_size) {
                safe_close(page_fd);
                safe_close(marker_fd);
                packet_done(&pk);
                return client_error(c, -EPROTO, "tierd sent a malformed plan reply");
        }
        page = mmap(NULL, pr->page_size, PROT_READ | PROT_WRITE, MAP_SHARED, page_fd, 0);
        safe_close(page_fd);
        if (page == MAP_FAILED) {
                r = -errno;
                safe_close(marker_fd);
                packet_done(&pk);
                return client_error(c, r, "cannot map the plan page: %s", tier_strerror(r));
        }
        c->plan_page = page;
        c->plan_page_size = pr->page_size;
        c->plan_marker_fd = marker_fd;
        c->plan_phases = p->n_phases;
        c->plan_seq = 0;
        c->plan_refused = 0;
        c->plan_slots = pr->n_slots;
        c->plan_entered = false;
        c->plan_access = TAKE_PTR(access);
        c->plan_phase_first = TAKE_PTR(access_first);
        packet_done(&pk);
        if (slots != c->plan_slots)
                return client_error(c, -EPROTO, "tierd counts %u plan tensors, the client %u", c->plan_slots, slots);
        /* slots: distinct tensors in order of first appearance, as tierd numbers them (plan_slots of them) */
        c->plan_ids = TAKE_PTR(ids);
        tier_plan_free(p);
        return 0;
}

/* Forget the submitted plan here: its page, its marker, the tensors' slots. */
void plan_forget(tier_client *c) {
        if (c->plan_page)
                (void) munmap(c->plan_page, c->plan_page_size);
        c->plan_page = NULL;
        c->plan_page_size = 0;
        c->plan_marker_fd = safe_close(c->plan_marker_fd);
        c->plan_slots = 0;
        c->plan_ids = mfree(c->plan_ids);
        c->plan_access = mfree(c->plan_access);
        c->plan_phase_first = mfree(c->plan_phase_first);
        c->plan_phases = 0;
        c->plan_seq = 0;
        c->plan_entered = false;
        c->plan_refused = 0;
}

void plan_phase_refused(tier_client *c, const Tier__PhaseRefused *pr) {
        if (!c->plan_page || pr->seq == 0 || pr->seq > c->plan_seq)
                return;         /* no marker of ours */
        c->plan_refused = pr->seq;
        /* a refusal must fail: a daemon that sends status >= 0 still means an error */
        c->plan_refused_status = pr->status < 0 && pr->status >= -4095 ? pr->status : -EIO;
        (void) snprintf(c->plan_refused_error, sizeof(c->plan_refused_error), "%s",
                        pr->error && *pr->error ? pr->error : tier_strerror(c->plan_refused_status));
}

_public_ int tier_plan_end(tier_client *c) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__EndPlan op = TIER__END_PLAN__INIT;
        Packet pk = PACKET_NULL;
        int r;

        if (!c)
                return -EINVAL;
        if (!c->plan_page)
                return client_error(c, -ENOENT, "this client runs no plan");
        req.op_case = TIER__REQUEST__OP_END_PLAN;
        req.end_plan = &op;
        r = transport_call(c, &req, &pk);
        if (r == -ENOENT)
                plan_forget(c);         /* tierd had none: neither have we now */
        if (r < 0)
                return r;
        packet_done(&pk);
        plan_forget(c);
        held_phase_clear(c);
        return 0;
}

_public_ int tier_phase_enter(tier_client *c, unsigned phase) {
        PlanPage *pg;
        uint64_t seq, one = 1, t0 = 0;
        int r;

        if (!c)
                return -EINVAL;
        r = client_check_fork(c);       /* the plan page and marker are the parent's */
        if (r < 0)
                return r;
        c->plan_entered = false;        /* until tierd says @phase is ready (tier_phase_grant() refuses meanwhile) */
        pg = c->plan_page;
        if (!pg)
                return client_error(c, -EINVAL, "no plan was submitted");
        if (phase >= c->plan_phases)
                return client_error(c, -EINVAL, "phase %u is not in the plan (%u phases)", phase, c->plan_phases);

        /*
         * A connection libtier closed (a request tierd did not answer in time, transport.c) gives no
         * sign in poll(): the phase would be waited for ever.  The error that broke it, or the next tierd.
         */
        if (c->broken < 0)
                return client_reconnect(c, transport_broken(c));

        /*
         * Reconnecting: a tierd that announced its stop gets no marker; the
         * connection goes now, at the phase's end, so that what the phase
         * wrote counts as written (tierd keeps the connection of a client in
         * a phase open for this, and writes everything down once its clients
         * are gone), the next tierd is joined (one recvmsg() that finds
         * nothing, when nothing was announced).
         */
        if (c->reconnect_ms > 0) {
                r = transport_drain(c);
                if (r >= 0)
                        r = c->shutdown ? -ESHUTDOWN : transport_check(c);
                if (r < 0)
                        return client_reconnect(c, r);
        }

        seq = ++c->plan_seq;
        pg->client.phase = phase;
        pg->client.mark_ns = now_ns();
        /* seq and phase in one word first (tierd reads them from it: never torn), then the seq */
        __atomic_store_n(&pg->client.marker, PLAN_READY(seq, phase), __ATOMIC_RELEASE);
        __atomic_store_n(&pg->client.marker_seq, seq, __ATOMIC_RELEASE);
        /*
         * The marker is stored before ready is read, as tierd stores a ready it takes back before
         * it reads the marker (sched_tensor_changed()): one of the two sees the other's store.  A
         * store then a load needs a full fence for that; the system call below happens to be one
         * on every kernel, the C memory model does not say so.
         */
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (write(c->plan_marker_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
                return client_reconnect(c, transport_break(c, -errno, "cannot signal tierd: %s",
                                                           tier_strerror(-errno)));

        for (;;) {
                uint64_t ready = __atomic_load_n(&pg->daemon.ready, __ATOMIC_ACQUIRE);
                int64_t err = __atomic_load_n(&pg->daemon.error, __ATOMIC_ACQUIRE);
                struct pollfd fds[2];

                if (err) {
                        /* a negative errno, else (a value no tierd writes) -EIO: never 0 or positive */
                        int e = err < 0 && err >= -4095 ? (int) err : -EIO;

                        return client_error(c, e, "the plan failed in tierd (see its log): %s", tier_strerror(e));
                }
                /* this phase refused (the plan lives on: the client may unpin and enter again) */
                if (c->plan_refused == seq)
                        return client_error(c, c->plan_refused_status, "tier_phase_enter(%u) refused: %s", phase,
                                            c->plan_refused_error);
                if (PLAN_READY_SEQ(ready) > seq || (PLAN_READY_SEQ(ready) == seq && PLAN_READY_PHASE(ready) == phase))
                        break;
                if (!t0)
                        t0 = now_ns();
                fds[0] = (struct pollfd) { .fd = c->event_fd, .events = POLLIN };
                fds[1] = (struct pollfd) { .fd = c->fd, .events = POLLIN };
                r = poll(fds, 2, 1000);
                if (r < 0 && errno != EINTR)
                        return -errno;
                if (r > 0 && (fds[0].revents & POLLIN))
                        client_wakeup_drain(c);         /* then ready and error are read again */
                if (r > 0 && fds[1].revents) {
                        r = transport_drain(c);
                        if (r >= 0)
                                r = transport_check(c);
                        if (r < 0)
                                return client_reconnect(c, r);    /* tierd went away: the next one? */
                }
        }
        if (t0)
                pg->client.stall_ns += now_ns() - t0;
        c->plan_phase = phase;
        c->plan_entered = true;
        held_phase_end(c);      /* the phases before the one just left are over: tierd has let them go */
        return 0;
}

/*
 * tier_phase_grant() of @t (plan slot @slot) in @tier, which no phase entered
 * holds there: tierd never clears a slot, so it names where an earlier phase
 * had the copy (room another tensor may have now), or nothing (segment 0,
 * offset 0).  Says why, and which phases access it there.
 */
static int plan_grant_refused(tier_client *c, const tier_tensor *t, int tier, uint32_t slot) {
        char which[96] = "";
        size_t len = 0;
        unsigned n = 0;

        for (uint32_t ph = 0; ph < c->plan_phases; ph++)
                if (plan_access_mode(c, ph, slot, tier)) {
                        if (n < 8)
                                len += (size_t) snprintf(which + len, sizeof(which) - len, "%s%u", n ? ", " : "", ph);
                        else if (n == 8)
                                len += (size_t) snprintf(which + len, sizeof(which) - len, ", ...");
                        n++;
                }
        if (n == 0)
                (void) snprintf(which, sizeof(which), "none");
        if (!c->plan_entered)
                return client_error(c, -EINVAL, "phase grant of '%s' in %s: no phase is entered (none was since the "
                                    "plan was submitted, or the last tier_phase_enter() failed); the phases that "
                                    "access it there: %s", t->name, tier_level_name(tier), which);
        return client_error(c, -ENOENT, "phase grant of '%s' in %s: phase %u does not access it there (tierd holds "
                            "no copy of it there for this phase); the phases that do: %s", t->name,
                            tier_level_name(tier), c->plan_phase, which);
}

_public_ int tier_phase_grant(tier_client *c, tier_tensor *t, int tier, struct tier_grant *ret) {
        Tier__Grant g = TIER__GRANT__INIT;
        const PlanSlot *s;
        uint32_t n_pieces, first_piece;
        int64_t slot;
        int r;

        if (!c)
                return -EINVAL;
        r = client_check_fork(c);
        if (r < 0)
                return r;
        if (!ret)
                return client_error(c, -EINVAL, "ret is NULL: there is nowhere to store the grant");
        if (tier != TIER_VRAM && tier != TIER_HOST)
                return client_error(c, -EINVAL, "phase grants are in vram or host, not tier %d", tier);
        if (!t)
                return client_error(c, -EINVAL, "the tensor is NULL");
        if (!t->client)
                return client_error(c, -ENOTCONN, "tensor '%s' belongs to a client that was freed", t->name);
        if (t->client != c)
                return client_error(c, -EINVAL, "tensor '%s' belongs to another client", t->name);
        r = tensor_check(t);
        if (r < 0)
                return r;
        if (!c->plan_page)
                return client_error(c, -EINVAL, "no plan was submitted");
        slot = plan_slot_of(c, t->id);
        if (slot < 0)
                return client_error(c, -ENOENT, "tensor '%s' is not in this client's plan", t->name);
        if (!c->plan_entered || !plan_access_mode(c, c->plan_phase, (uint32_t) slot, tier))
                return plan_grant_refused(c, t, tier, (uint32_t) slot);
        s = &c->plan_page->slots[2 * (uint32_t) slot + (uint32_t) tier];
        /* the page is tierd's to write: each field is read once, then checked and used as read */
        n_pieces = __atomic_load_n(&s->n_pieces, __ATOMIC_ACQUIRE);
        first_piece = __atomic_load_n(&s->first_piece, __ATOMIC_RELAXED);
        if (n_pieces > 1) {
                /* a copy that spans segments: its pieces, past the slots, where tierd put them */
                const PlanPiece *pp = plan_pieces(c->plan_page, c->plan_slots);
                uint64_t room = (c->plan_page_size - (uint64_t) ((const uint8_t *) pp - (const uint8_t *) c->plan_page)) /
                                sizeof(PlanPiece);
                _cleanup_free_ ViewPiece *pieces = NULL;

                if ((uint64_t) first_piece + n_pieces > room)
                        return client_error(c, -EPROTO, "plan slot of '%s' names pieces past its page", t->name);
                pieces = calloc(n_pieces, sizeof(ViewPiece));
                if (!pieces)
                        return client_error(c, -ENOMEM, "out of memory");
                for (uint32_t i = 0; i < n_pieces; i++)
                        pieces[i] = (ViewPiece) {
                                .segment = __atomic_load_n(&pp[first_piece + i].segment, __ATOMIC_RELAXED),
                                .generation = __atomic_load_n(&pp[first_piece + i].generation, __ATOMIC_RELAXED),
                                .offset = __atomic_load_n(&pp[first_piece + i].offset, __ATOMIC_RELAXED),
                                .length = __atomic_load_n(&pp[first_piece + i].length, __ATOMIC_RELAXED),
                        };
                r = segment_resolve(c, t, tier, t->size, pieces, n_pieces, ret);
                if (r >= 0)
                        (void) held_phase_grant(c, t, tier);    /* (unnoted out of memory, as a pin) */
                return r;
        }
        g.segment = __atomic_load_n(&s->segment, __ATOMIC_RELAXED);
        g.generation = __atomic_load_n(&s->generation, __ATOMIC_RELAXED);
        g.offset = __atomic_load_n(&s->offset, __ATOMIC_RELAXED);
        g.length = t->size;
        g.tier = (Tier__Tier) tier;
        r = segment_resolve_grant(c, t, &g, ret);
        if (r >= 0)
                (void) held_phase_grant(c, t, tier);
        return r;
}

_public_ double tier_phase_stall(const tier_client *c) {
        return c && c->plan_page ? (double) c->plan_page->client.stall_ns / 1e9 : 0.0;
}
