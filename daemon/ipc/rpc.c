/* SPDX-License-Identifier: MIT */
/* rpc.c: the request layer: decoded requests -> registry, engine and scheduler calls -> replies. */

/*
 * Theory of operation: rpc_dispatch() validates one decoded Request against
 * the connection's state and the limits (names, sizes, tiers, in-flight
 * count), then either answers at once (create, open, stat, unpin, status,
 * a pin of a copy that is already resident) or hands an Op to the engine.
 * An op carries a Pending record that remembers who asked: sync requests are
 * answered when the op completes, async ones at once with a fence (pin: as
 * soon as the destination is reserved, so the grant is known) and their
 * fence is completed on the job's fence page when the op ends (fence.c).
 *
 * This layer does no socket I/O of its own: replies go through conn.c, so
 * a test or a fuzzer can drive it in-process over a socketpair.  Nothing
 * here blocks: the admin group is looked up at start and reload
 * (rpc_resolve_admin_group()), not per request.
 */

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/base/wakeup.h"
#include "daemon/engine/engine.h"
#include "daemon/ipc/commit.h"
#include "daemon/ipc/conn.h"
#include "daemon/ipc/fence.h"
#include "daemon/ipc/held-writes.h"
#include "daemon/ipc/jobctl.h"
#include "daemon/ipc/metrics.h"
#include "daemon/ipc/owner.h"
#include "daemon/ipc/quota-rpc.h"
#include "daemon/ipc/revoke.h"
#include "daemon/ipc/rpc.h"
#include "daemon/ipc/server.h"
#include "daemon/ipc/status.h"
#include "daemon/ipc/trace-rpc.h"
#include "daemon/sched/plan.h"
#include "daemon/sched/sched.h"
#include "daemon/state/book.h"
#include "daemon/state/quota.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/segpool.h"
#include "daemon/tiers/vram.h"
#include "proto/fence.h"
#include "proto/macro.h"
#include "proto/plan.h"
#include "proto/utf8.h"
#include "util/escape.h"
#include "proto/wire.h"
#include "tier.pb-c.h"

/* Largest tensor we accept at all (the host segment size bounds it further). */
#define TENSOR_SIZE_MAX (1ull << 40)

typedef struct Pending {
        Rpc *rpc;
        Conn *conn;
        uint64_t seq;
        uint64_t fence;         /* 0 for sync requests */
        int kind;               /* Request op case */
        bool write_only;        /* a write-only pin */
        bool rw;                /* a pin that may read and write (PinRec.rw) */
        bool replied;
        Op *op;
        List link;              /* Conn.pending */
} Pending;

/* ---- replies -------------------------------------------------------------------- */

/* A request that needs no reply body succeeded (errors: conn_reply_error()). */
static int reply_ok(Conn *c, uint64_t seq) {
        Tier__Response resp = TIER__RESPONSE__INIT;

        resp.seq = seq;
        resp.status = 0;
        resp.error = (char *) "";
        return conn_send_response(c, &resp, NULL, 0, false);
}

/* ---- pins ------------------------------------------------------------------------------ */

static uint32_t piece_wire_id(const CopyPiece *p) {
        return p->seg->pool->id_base + p->seg->id;
}

/* The grant of @t's copy in @tier; a copy that spans segments lists its pieces (@pieces: room for them). */
static void fill_grant(Tier__Grant *g, Tier__GrantPiece *pieces, Tier__GrantPiece **piecep, const Tensor *t,
                       int tier) {
        const Copy *c = &t->copy[tier];

        g->segment = piece_wire_id(&c->pieces[0]);
        g->generation = c->pieces[0].seg->generation;
        g->offset = c->pieces[0].offset;
        g->length = t->size;
        g->tier = (Tier__Tier) tier;
        if (c->n_pieces <= 1)
                return;
        for (uint32_t i = 0; i < c->n_pieces; i++) {
                tier__grant_piece__init(&pieces[i]);
                pieces[i].segment = piece_wire_id(&c->pieces[i]);
                pieces[i].generation = c->pieces[i].seg->generation;
                pieces[i].offset = c->pieces[i].offset;
                pieces[i].length = c->pieces[i].len;
                piecep[i] = &pieces[i];
        }
        g->n_pieces = c->n_pieces;
        g->pieces = piecep;
}

static int reply_pin(Rpc *r, Conn *c, uint64_t seq, Tensor *t, int tier, uint64_t fence) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__PinReply pr = TIER__PIN_REPLY__INIT;
        Tier__Grant g = TIER__GRANT__INIT;
        _cleanup_free_ Tier__GrantPiece *pieces = NULL;
        _cleanup_free_ Tier__GrantPiece **piecep = NULL;
        const Copy *cp = &t->copy[tier];
        uint8_t ev[VRAM_IPC_EVENT_SIZE];

        if (cp->n_pieces > 1) {
                pieces = calloc(cp->n_pieces, sizeof(*pieces));
                piecep = calloc(cp->n_pieces, sizeof(*piecep));
                if (!pieces || !piecep)
                        return conn_reply_error(c, seq, -ENOMEM, "out of memory");
        }
        fill_grant(&g, pieces, piecep, t, tier);
        pr.grant = &g;
        pr.fence = fence;
        /*
         * The copy into VRAM is queued: the client's stream may wait for it on
         * the device.  Only for a copy in one piece made by one copy: the
         * pieces of a larger one, or the copies of one piece split over host
         * pieces or chained from NVMe, go on several streams, and the fence is
         * what says all are done.
         */
        if (fence && tier == LEVEL_VRAM && cp->n_pieces == 1 &&
            vram_copy_event(r->vram, cp->pieces[0].seg, cp->pieces[0].offset, cp->pieces[0].len, ev) > 0)
                pr.ipc_event = (ProtobufCBinaryData) { .len = sizeof(ev), .data = ev };
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_PIN;
        resp.pin = &pr;
        return conn_send_response(c, &resp, NULL, 0, false);
}

static int reply_fence(Conn *c, uint64_t seq, uint64_t fence) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__FenceReply fr = TIER__FENCE_REPLY__INIT;

        fr.fence = fence;
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_FENCE;
        resp.fence = &fr;
        return conn_send_response(c, &resp, NULL, 0, false);
}

/* ---- op callbacks ------------------------------------------------------------------------ */

static void pending_free(Pending *p) {
        list_del(&p->link);
        p->conn->inflight--;
        free(p);
}

static void on_op_reserved(Op *op) {
        Pending *p = op->userdata;
        Conn *c = p->conn;

        /* async pin: the client gets its grant now and waits on the fence for the bytes */
        if (p->fence && !p->replied) {
                if (pin_record(c, op->tensor, op->tier, p->write_only, p->rw) < 0) {
                        /* cannot track it: refuse rather than leak a pin */
                        return;
                }
                tensor_pin_account(op->tensor, op->tier, +1);
                p->replied = true;
                (void) reply_pin(p->rpc, c, p->seq, op->tensor, op->tier, p->fence);
        }
}

static void on_op_complete(Op *op, int status, const char *error) {
        Pending *p = op->userdata;
        Conn *c = p->conn;
        Tensor *t = op->tensor;

        if (p->kind == TIER__REQUEST__OP_PIN) {
                if (status >= 0 && !p->replied) {
                        if (pin_record(c, t, op->tier, p->write_only, p->rw) < 0) {
                                (void) tensor_unpin(t, op->tier, false);
                                status = -ENOMEM;
                                error = "out of memory recording the pin";
                        } else
                                tensor_pin_account(t, op->tier, +1);
                } else if (status < 0 && p->replied) {
                        /* async pin whose data never came: the pin the op held is gone */
                        int f = pin_forget(c, t, op->tier);

                        if (f >= 0)
                                tensor_pin_account(t, op->tier, -1);
                        if (f > 0 && (f & PIN_WRITER))
                                copy_writers(t, op->tier, -1, c->rank);
                }
        }

        if (!p->replied) {
                if (status < 0)
                        (void) conn_reply_error(c, p->seq, status, "%s", error ? error : strerror(-status));
                else if (p->kind == TIER__REQUEST__OP_PIN)
                        (void) reply_pin(p->rpc, c, p->seq, t, op->tier, p->fence);
                else
                        (void) reply_fence(c, p->seq, p->fence);
                p->replied = true;
        }
        if (p->fence)
                fence_complete(c, p->fence, status, error, p->rpc->config->max_inflight);
        pending_free(p);
}

/* ---- validation ------------------------------------------------------------------------------- */

static int check_name(Rpc *r, Conn *c, uint64_t seq, const char *what, const char *name) {
        size_t len = name ? strlen(name) : 0;
        char why[UTF8_NAME_FLAW_MAX];   /* (utf8_name_flaw(): the one rule of names' characters) */

        if (len == 0)
                return conn_reply_error(c, seq, -EINVAL, "%s name is empty", what), -EINVAL;
        if (len > r->config->max_name)
                return conn_reply_error(c, seq, -ENAMETOOLONG, "%s name longer than max_name (%u bytes)", what,
                                        r->config->max_name), -ENAMETOOLONG;
        if (utf8_name_flaw(name, len, why)) {
                /* what to do instead: the name restore_name() (state/book-replay.c) gives one from an older tierd */
                char *e = text_escape_name(name, r->config->max_name, false);     /* (max_name bytes at most) */
                bool say = e && strlen(e) <= CONN_ERROR_MAX / 2;

                (void) conn_reply_error(c, seq, -EINVAL, "%s name %s; a %s an older tierd made under such a name was "
                                        "restored under its escaped text (cut with '~' and a hash when too long or "
                                        "taken; tierd's log names it): %s%s%s", what, why, what, say ? "'" : "",
                                        say ? e : "too long to say here, tierctl lists it", say ? "'" : "");
                free(e);
                return -EINVAL;
        }
        return 0;
}

static Tensor *lookup(Conn *c, uint64_t seq, uint64_t id) {
        Tensor *t = tensor_find(c->job, id);

        if (!t)
                (void) conn_reply_error(c, seq, -ENOENT, "no tensor with id %" PRIu64 " in job '%s'", id, c->job->name);
        return t;
}

static bool tier_ok(int tier) {
        return tier >= 0 && tier < TIERS;
}

/* ---- handlers --------------------------------------------------------------------------------- */

/* Hello on a connection that gets no job: a control connection (status and quotas only). */
static int hello_control(Conn *c, uint64_t seq, Tier__HelloReply *hr) {
        Tier__Response resp = TIER__RESPONSE__INIT;

        c->hello_done = true;
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_HELLO;
        resp.hello = hr;
        return conn_send_response(c, &resp, NULL, 0, false);
}

static int handle_hello(Rpc *r, Conn *c, uint64_t seq, const Tier__Hello *h) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__HelloReply hr = TIER__HELLO_REPLY__INIT;
        Tier__Limits lim = TIER__LIMITS__INIT;
        uint64_t limits[TIERS] = {}, tensor_max[TIERS] = {}, segment_size[TIERS] = {};
        _cleanup_close_ int efd = -1, wake_read = -1;  /* the wakeup pipe: tierd writes, the client reads */
        _cleanup_free_ uint64_t *completed = NULL;
        _cleanup_(held_writes_free) HeldWrites held = {};
        unsigned slot;
        int fds[2];
        bool created = false;
        Job *j;
        int q;

        if (c->hello_done)
                return conn_protocol_error(c, seq, -EPROTO, "Hello sent twice");
        if (h->version < WIRE_PROTOCOL_MIN || h->version > WIRE_PROTOCOL_VERSION) {
                char msg[256];

                if (h->version < WIRE_PROTOCOL_MIN)
                        snprintf(msg, sizeof(msg), "protocol version %u is older than this tierd serves (%u..%u): "
                                 "rebuild the client against libtier.so.%s", h->version, WIRE_PROTOCOL_MIN,
                                 WIRE_PROTOCOL_VERSION, TIERD_SOVERSION);
                else
                        snprintf(msg, sizeof(msg), "protocol version %u is newer than this tierd (it serves %u..%u, "
                                 "tierd %s): upgrade tierd, or use the libtier that came with it", h->version,
                                 WIRE_PROTOCOL_MIN, WIRE_PROTOCOL_VERSION, TIERD_VERSION);
                log_info("Connection %" PRIu64 " (pid " PID_FMT "): %s", c->id, c->pid, msg);
                return conn_protocol_error(c, seq, -EPROTONOSUPPORT, msg);
        }

        lim.max_message = r->config->max_message;
        lim.max_tensors = r->config->max_tensors;
        lim.max_inflight = r->config->max_inflight;
        lim.max_name = r->config->max_name;
        segment_size[LEVEL_VRAM] = r->registry->pools[LEVEL_VRAM]->seg_size;
        segment_size[LEVEL_HOST] = r->registry->pools[LEVEL_HOST]->seg_size;
        segment_size[LEVEL_NVME] = r->nvme->extent_size;
        lim.n_segment_size = TIERS;
        lim.segment_size = segment_size;
        hr.version = h->version;       /* the client's: tierd speaks it */
        hr.limits = &lim;
        hr.vram_backend = (char *) r->vram->ops->name;
        hr.vram_device = r->vram->device;
        hr.fence_page_fd = -1;
        hr.fence_eventfd = -1;

        if (server_count_uid(r->server, c->uid, c) >= r->config->max_connections_per_uid)
                return conn_protocol_error(c, seq, -EUSERS, "too many connections for this uid "
                                           "(max_connections_per_uid)");
        if (!h->job || h->job[0] == 0)
                return hello_control(c, seq, &hr);
        /* (a client holds at most 2 x max_tensors pins, and the grants of two plan phases, 2 tiers each) */
        if (h->n_held_writes > 8 * (size_t) r->config->max_tensors)
                return conn_reply_error(c, seq, -EINVAL, "Hello names %zu held writes, more than a client may hold (%u)",
                                        h->n_held_writes, 8 * r->config->max_tensors);
        if (check_name(r, c, seq, "job", h->job) < 0)
                return 0;

        /*
         * All or nothing: what a failed Hello took is given back, so that the
         * client may send another one (nothing is left to leak or overwrite).
         */
        completed = calloc(r->config->max_inflight, sizeof(uint64_t));
        if (wakeup_new(&efd, &wake_read) < 0 || !completed ||
            (h->says_writes && held_writes_index(h->held_writes, h->n_held_writes, NULL, &held) < 0))
                return conn_reply_error(c, seq, -ENOMEM, "out of resources");
        j = owner_hello_job(r, c, seq, h->job, &created);
        if (!j)
                return 0;
        if (!created) {
                char why[1024] = "";

                /* a lingering job claims its guarantees again: they must still fit (it keeps lingering if not) */
                q = quota_job_attach_check(r->quotas, j, why, sizeof(why));
                if (q < 0)
                        return conn_reply_error(c, seq, q, "cannot attach to job '%s': %s%s", j->name,
                                                why[0] ? why : strerror(-q),
                                                q == -ENOSPC ? "; it keeps its tensors while it lingers: an admin "
                                                "lowers a guarantee with tierctl quota set, or ends another job" : "");
        }
        q = job_fence_slot_get(j, &slot);
        if (q < 0) {
                if (created)
                        job_linger_start(j);
                return conn_reply_error(c, seq, q, "job '%s' has too many connections (%d)", j->name, FENCE_SLOTS);
        }

        if (!created && j->n_conns == 0 && j->n_tensors > 0)
                /* a re-run of a lingering job: say so, it finds its tensors (and its quota) as they were */
                log_job(LOG_INFO, 0, j->name, "Job '%s' resumed: %u tensor(s) kept from its previous run",
                        j->name, j->n_tensors);
        c->job = j;
        c->fence_slot = slot;
        c->efd = TAKE_FD(efd);
        c->fence_completed = TAKE_PTR(completed);
        c->hello_done = true;
        list_add_tail(&j->conns, &c->job_link);
        j->n_conns++;
        job_linger_stop(j);
        c->rank = h->rank;
        /* the memory store's: this rank's clients of before tierd's restart are done writing (and say what) */
        job_release_ghosts(j, h->says_writes, h->rank, held_writes_has, &held);

        for (int i = 0; i < TIERS; i++) {
                limits[i] = j->limit[i];
                tensor_max[i] = job_tensor_max(j, i);
        }
        lim.n_tier_limit = TIERS;
        lim.tier_limit = limits;
        lim.n_tensor_max = TIERS;
        lim.tensor_max = tensor_max;
        hr.job_id = j->id;
        hr.fence_slot = c->fence_slot;
        hr.created = created;
        fds[0] = j->fence_fd;
        hr.fence_page_fd = 0;
        fds[1] = wake_read;             /* (sent, or queued as a dup: ours is closed on return) */
        hr.fence_eventfd = 1;
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_HELLO;
        resp.hello = &hr;
        return conn_send_response(c, &resp, fds, 2, false);
}

static int reply_tensor(Conn *c, uint64_t seq, const Tensor *t) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__TensorInfo ti = TIER__TENSOR_INFO__INIT;

        ti.tensor = t->id;
        ti.size = t->size;
        ti.name = t->name;
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_TENSOR;
        resp.tensor = &ti;
        return conn_send_response(c, &resp, NULL, 0, false);
}

static int handle_create(Rpc *rpc, Conn *c, uint64_t seq, const Tier__Create *cr) {
        uint64_t vmax = job_tensor_max(c->job, LEVEL_VRAM), hmax = job_tensor_max(c->job, LEVEL_HOST);
        Tensor *t;
        int r;

        if (check_name(rpc, c, seq, "tensor", cr->name) < 0)
                return 0;
        if (cr->size == 0 || cr->size > TENSOR_SIZE_MAX)
                return conn_reply_error(c, seq, -EINVAL, "tensor size %" PRIu64 " out of range (1..2^40)", cr->size);
        /* any size, as long as it can be somewhere it is used: host (every transfer passes it) or vram */
        if (ALIGN_UP(cr->size, SEG_UNIT) > MAX(vmax, hmax))
                return conn_reply_error(c, seq, -EFBIG, "a tensor of %" PRIu64 " bytes can never be held for job '%s': "
                                        "the largest it may have is %" PRIu64 " bytes in host and %" PRIu64 " in vram "
                                        "(its limits, or the tiers' capacities)", cr->size, c->job->name, hmax, vmax);
        /* an existing name first: at a bound, Client.tensor()'s create-or-open must still see EEXIST */
        if (tensor_find_name(c->job, cr->name))
                return conn_reply_error(c, seq, -EEXIST, "tensor '%s' already exists in job '%s'", cr->name,
                                        c->job->name);
        if (owner_tensor_room(rpc, c, seq) < 0)
                return 0;
        r = tensor_new(c->job, cr->name, cr->size, &t);
        if (r == -EEXIST)
                return conn_reply_error(c, seq, r, "tensor '%s' already exists in job '%s'", cr->name, c->job->name);
        if (r == -EMFILE)
                return conn_reply_error(c, seq, r, "job '%s' has max_tensors (%u) tensors", c->job->name,
                                        rpc->config->max_tensors);
        if (r < 0)
                return conn_reply_error(c, seq, r, "cannot create tensor: %s", strerror(-r));

        return reply_tensor(c, seq, t);
}

static int handle_open(Rpc *r, Conn *c, uint64_t seq, const Tier__Open *o) {
        Tensor *t;

        if (check_name(r, c, seq, "tensor", o->name) < 0)
                return 0;
        t = tensor_find_name(c->job, o->name);
        if (!t)
                return conn_reply_error(c, seq, -ENOENT, "no tensor '%s' in job '%s'", o->name, c->job->name);
        return reply_tensor(c, seq, t);
}

static int handle_free(Rpc *rpc, Conn *c, uint64_t seq, const Tier__Free *f) {
        Tensor *t = lookup(c, seq, f->tensor);
        int r;

        if (!t)
                return 0;
        r = engine_tensor_free(rpc->engine, t);
        if (r == -EBUSY)
                return conn_reply_error(c, seq, r, "tensor '%s' is pinned, has requests in flight or is named by a plan",
                                        t->name);
        if (r < 0)
                return conn_reply_error(c, seq, r, "cannot free tensor: %s", strerror(-r));
        return reply_ok(c, seq);
}

static int handle_stat(Conn *c, uint64_t seq, const Tier__Stat *st) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__StatReply sr = TIER__STAT_REPLY__INIT;
        Tier__CopyState cs[TIERS], *csp[TIERS];
        Tensor *t = lookup(c, seq, st->tensor);

        if (!t)
                return 0;
        for (int i = 0; i < TIERS; i++) {
                const Copy *cp = &t->copy[i];

                tier__copy_state__init(&cs[i]);
                cs[i].tier = (Tier__Tier) i;
                cs[i].state = (char *) copy_state_to_string(cp->state);
                cs[i].dirty = copy_unsaved(t, i);
                cs[i].pins = cp->pins;
                csp[i] = &cs[i];
        }
        sr.tensor = t->id;
        sr.size = t->size;
        sr.n_copies = TIERS;
        sr.copies = csp;
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_STAT;
        resp.stat = &sr;
        return conn_send_response(c, &resp, NULL, 0, false);
}

static int handle_unpin(Rpc *rpc, Conn *c, uint64_t seq, const Tier__Unpin *u) {
        Tensor *t = lookup(c, seq, u->tensor);
        int tier = (int) u->tier, r;

        if (!t)
                return 0;
        if (!tier_ok(tier))
                return conn_reply_error(c, seq, -EINVAL, "invalid tier %d", tier);
        /* an async pin of it whose bytes are still coming: its op holds that pin until they are there */
        list_for_each_safe(n, tmp, &c->pending) {
                const Pending *p = list_entry(n, Pending, link);

                if (p->kind == TIER__REQUEST__OP_PIN && p->op && p->op->pinned && p->op->tensor == t &&
                    p->op->tier == tier)
                        return conn_reply_error(c, seq, -EBUSY, "tensor '%s' in %s: the bytes of its async pin are "
                                                "still coming: wait for its fence (tier_fence_wait()), then unpin",
                                                t->name, level_to_string(tier));
        }
        if (u->ipc_event.len > 0) {
                const Copy *cp = &t->copy[tier];
                _cleanup_free_ VramRange *ranges = calloc(MAX(cp->n_pieces, 1u), sizeof(*ranges));
                char why[256] = "";

                /* every piece waits for the client's work, or none (a copy's pieces are bounded by its size) */
                r = !ranges ? -ENOMEM : tier == LEVEL_VRAM && cp->pins > 0 && cp->n_pieces > 0 ? 0 : -EINVAL;
                for (uint32_t i = 0; r >= 0 && i < cp->n_pieces; i++)
                        ranges[i] = (VramRange) { cp->pieces[i].seg, cp->pieces[i].offset, cp->pieces[i].len };
                if (r >= 0)
                        r = vram_wait_event(rpc->vram, ranges, cp->n_pieces, u->ipc_event.data, u->ipc_event.len,
                                            why, sizeof(why));
                if (r < 0)
                        return conn_reply_error(c, seq, r, "cannot wait for the client's event on '%s' in %s: %s",
                                                t->name, level_to_string(tier), why[0] ? why : strerror(-r));
        }
        r = pin_forget(c, t, tier);
        if (r < 0)
                return conn_reply_error(c, seq, -ENOENT, "tensor '%s' is not pinned in %s by this connection",
                                        t->name, level_to_string(tier));
        tensor_pin_account(t, tier, -1);
        /* a write-only pin's old bytes were not brought: what is there now is what the client wrote */
        (void) tensor_unpin(t, tier, u->dirty || (r & PIN_WRITE_ONLY));
        if (r & PIN_WRITER)
                copy_writers(t, tier, -1, c->rank);
        if ((u->dirty || (r & PIN_WRITE_ONLY)) && rpc->sched)
                sched_tensor_changed(rpc->sched, t);    /* a held phase's other copy of it is stale now */
        return reply_ok(c, seq);
}

static int submit(Rpc *rpc, Conn *c, uint64_t seq, int kind, Tensor *t, int tier, bool async, bool write_only,
                  bool rw) {
        OpKind ok = kind == TIER__REQUEST__OP_PIN ? OP_PIN :
                    kind == TIER__REQUEST__OP_EVICT ? OP_EVICT : OP_PREFETCH;
        Pending *p;
        int r;

        /* fast path: a pin of a resident copy needs no op (unless its committed data must go to NVMe first) */
        if (ok == OP_PIN && copy_valid(t, tier) && !t->xfer && !((write_only || rw) && tensor_needs_image(t)) &&
            engine_pin_check(rpc->engine, t, tier, NULL, 0) == 0) {     /* (else the op says why not) */
                Copy *cp = &t->copy[tier];
                uint64_t fence = async ? c->next_fence++ : 0;

                if (cp->state == COPY_DRAINING)
                        copy_set_state(t, tier, COPY_RESIDENT);      /* wanted again: keep it */
                /* counted before pin_record(): a writer's pin takes a ghost copy over only beside another pin */
                cp->pins++;
                r = pin_record(c, t, tier, write_only, rw);
                if (r < 0) {
                        cp->pins--;
                        return conn_reply_error(c, seq, r, "out of memory");
                }
                tensor_pin_account(t, tier, +1);
                r = reply_pin(rpc, c, seq, t, tier, fence);
                if (fence)
                        fence_complete(c, fence, 0, NULL, rpc->config->max_inflight);
                return r;
        }

        p = calloc(1, sizeof(*p));
        if (!p)
                return conn_reply_error(c, seq, -ENOMEM, "out of memory");
        p->rpc = rpc;
        p->conn = c;
        p->seq = seq;
        p->kind = kind;
        p->write_only = write_only;
        p->rw = rw;
        p->fence = async ? c->next_fence++ : 0;
        list_add_tail(&c->pending, &p->link);
        c->inflight++;

        r = op_submit(rpc->engine, ok, t, tier, on_op_complete, ok == OP_PIN && async ? on_op_reserved : NULL, p,
                      &p->op);
        if (r >= 0) {
                p->op->discard = write_only;    /* the client overwrites it all: the old bytes need not come */
                p->op->write = write_only || rw;
        }
        if (r < 0) {
                if (p->fence)
                        fence_complete(c, p->fence, r, "out of memory", rpc->config->max_inflight);
                pending_free(p);
                return conn_reply_error(c, seq, r, "out of memory");
        }
        if (async && ok != OP_PIN) {
                p->replied = true;
                return reply_fence(c, seq, p->fence);
        }
        return 0;
}

static int handle_move(Rpc *rpc, Conn *c, uint64_t seq, int kind, uint64_t id, int tier, bool async,
                       unsigned mode) {
        const Config *cf = rpc->config;
        Tensor *t = lookup(c, seq, id);

        if (!t)
                return 0;
        if (!tier_ok(tier))
                return conn_reply_error(c, seq, -EINVAL, "invalid tier %d", tier);
        if (c->inflight >= cf->max_inflight)
                return conn_reply_error(c, seq, -EBUSY, "too many requests in flight on this connection "
                                        "(max_inflight = %u)", cf->max_inflight);
        /* fences complete in any order; tierd remembers at most max_inflight ahead of the oldest */
        if (async && c->next_fence - 1 - c->fence_done >= cf->max_inflight)
                return conn_reply_error(c, seq, -EBUSY, "too many fences outstanding on this connection (max_inflight "
                                        "= %u): wait for fence %" PRIu64 " first", cf->max_inflight,
                                        c->fence_done + 1);
        if (kind == TIER__REQUEST__OP_PIN && c->n_pins + c->inflight >= 2 * (size_t) cf->max_tensors)
                return conn_reply_error(c, seq, -EMFILE, "too many pins on this connection (at most %u, twice max_tensors)",
                                        2 * cf->max_tensors);
        if (kind == TIER__REQUEST__OP_EVICT) {
                if (tier == LEVEL_VRAM)
                        return conn_reply_error(c, seq, -EINVAL, "evict goes down to host or nvme, not vram");
        } else {
                /* pin and prefetch bring a copy up */
                if (tier == LEVEL_NVME)
                        return conn_reply_error(c, seq, -EINVAL, kind == TIER__REQUEST__OP_PIN ?
                                                "tensors are pinned in vram or host, not nvme" :
                                                "prefetch goes up to vram or host, not nvme");
        }
        if (mode & ~(PLAN_READ | PLAN_WRITE))
                return conn_reply_error(c, seq, -EINVAL, "invalid pin mode %u", mode);
        return submit(rpc, c, seq, kind, t, tier, async, kind == TIER__REQUEST__OP_PIN && mode == PLAN_WRITE,
                      kind == TIER__REQUEST__OP_PIN && (mode == 0 || mode == (PLAN_READ | PLAN_WRITE)));
}

/* Segments a connection may ask for again, in all (the message says it): libtier asks only for one a grant
 * names that it lacks. */
#define SEG_ASKED_MAX 4096

static int handle_get_segments(Conn *c, uint64_t seq, const Tier__GetSegments *g) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__SegmentsReply sr = TIER__SEGMENTS_REPLY__INIT;

        /* forget what the client says it lacks, so it is sent again, before any other unsent; a client
         * asking for segments over and over (each answer an fd in flight) is cut off */
        c->seg_asked += g->n_ids;
        if (c->seg_asked > SEG_ASKED_MAX)
                return conn_protocol_error(c, seq, -EPROTO, "more than 4096 segments asked for again on this "
                                           "connection (GetSegments)");
        c->n_seg_want = 0;
        for (size_t i = 0; i < g->n_ids; i++)
                conn_segment_want(c, g->ids[i]);
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_SEGMENTS;
        resp.segments = &sr;
        return conn_send_response(c, &resp, NULL, 0, false);
}

static int handle_status(Rpc *rpc, Conn *c, uint64_t seq) {
        Tier__StatusReply *sr = NULL;
        int r;

        r = status_build(rpc, &sr);
        if (r < 0)
                return conn_reply_error(c, seq, r, "cannot build status: %s", strerror(-r));
        /* the asker does not count itself (tierctl status would always show one connection more) */
        if (sr->connections > 0)
                sr->connections--;
        r = status_send(c, seq, sr);
        status_free(sr);
        return r;
}

/* tier.proto's enum Tier numbers the levels as proto/level.h does */
_Static_assert((int) TIER__TIER__TIER_VRAM == LEVEL_VRAM && (int) TIER__TIER__TIER_HOST == LEVEL_HOST &&
               (int) TIER__TIER__TIER_NVME == LEVEL_NVME, "enum Tier and proto/level.h differ");

int rpc_plan_spec(const Tier__SubmitPlan *sp, PlanSpec *ret) {
        size_t n = 0, i = 0;

        for (size_t k = 0; k < sp->n_phases; k++)
                n += sp->phases[k]->n_accesses;
        *ret = (PlanSpec) { .n_phases = sp->n_phases, .n_acc = n };
        ret->acc = calloc(MAX(n, (size_t) 1), sizeof(PlanSpecAccess));
        if (!ret->acc)
                return -ENOMEM;
        for (size_t k = 0; k < sp->n_phases; k++)
                for (size_t a = 0; a < sp->phases[k]->n_accesses; a++) {
                        const Tier__PlanAccess *ra = sp->phases[k]->accesses[a];

                        ret->acc[i++] = (PlanSpecAccess) {
                                .phase = (uint32_t) k,
                                .tensor = ra->tensor,
                                .tier = (int) ra->tier,
                                .mode = ra->mode,
                        };
                }
        return 0;
}

static int handle_plan(Rpc *rpc, Conn *c, uint64_t seq, const Tier__SubmitPlan *sp) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__PlanReply pr = TIER__PLAN_REPLY__INIT;
        _cleanup_free_ PlanSpecAccess *acc = NULL;
        char error[256] = "";
        PlanSpec spec;
        Plan *p = NULL;
        int fds[2], r;

        if (c->plan)
                return conn_reply_error(c, seq, -EBUSY, "this connection already has a plan (one per rank)");
        r = rpc_plan_spec(sp, &spec);
        if (r < 0)
                return conn_reply_error(c, seq, r, "%s", strerror(-r));
        acc = spec.acc;
        r = sched_plan_new(rpc->sched, c->job, c->efd, &spec, &p, error, sizeof(error));
        if (r < 0)
                return conn_reply_error(c, seq, r, "%s", error[0] ? error : strerror(-r));
        c->plan = p;
        plan_set_owner(p, c->rank, c->id);      /* (its holds start on the loop, after this) */
        pin_plan_attach(c, p);                  /* its refusals name the pins @c holds (sched/selfpin.c) */
        fds[0] = p->page_fd;
        fds[1] = p->marker_fd;
        pr.page_fd = 0;
        pr.page_size = p->page_size;
        pr.marker_fd = 1;
        pr.n_slots = p->n_slots;
        pr.policy = (char *) sched_policy_to_string(rpc->config->sched_policy);
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_PLAN;
        resp.plan = &pr;
        log_job(LOG_INFO, 0, c->job->name, "Job '%s': rank connection %" PRIu64 " submitted a plan of %u phases "
                "over %u tensors", c->job->name, c->id, p->n_phases, p->n_slots);
        return conn_send_response(c, &resp, fds, 2, false);
}

static int handle_end_plan(Conn *c, uint64_t seq) {
        if (!c->plan)
                return conn_reply_error(c, seq, -ENOENT, "this connection has no plan");
        /* its pins go as when the connection closes: as dirty where the plan writes */
        sched_plan_free(c->plan);
        c->plan = NULL;
        log_job(LOG_INFO, 0, c->job->name, "Job '%s': a rank connection ended its plan", c->job->name);
        return reply_ok(c, seq);
}

/* Group whose members may set quotas (besides root). */
#define ADMIN_GROUP "tier-admin"

void rpc_resolve_admin_group(Rpc *rpc) {
        struct group *g;

        errno = 0;
        g = getgrnam(ADMIN_GROUP);
        if (!g && errno != 0 && errno != ENOENT && errno != ESRCH && errno != EBADF && errno != EPERM) {
                /* the database failed, which says nothing of the group: what was known stays */
                if (rpc->have_admin_gid)
                        log_warning_errno(errno, "Cannot look up group '" ADMIN_GROUP "' (the group database "
                                          "failed: %m): keeping gid %u, ignoring", (unsigned) rpc->admin_gid);
                else
                        log_warning_errno(errno, "Cannot look up group '" ADMIN_GROUP "' (the group database "
                                          "failed: %m): only root may set quotas until a reload (systemctl "
                                          "reload tierd) finds it");
                return;
        }
        rpc->have_admin_gid = g != NULL;
        rpc->admin_gid = g ? g->gr_gid : (gid_t) -1;
        if (!g)
                log_debug("No group '" ADMIN_GROUP "': only root may set quotas");
}

/* Root, or a member of the admin group (looked up at start and reload). */
static bool conn_is_admin(const Rpc *rpc, const Conn *c) {
        return c->uid == 0 || (rpc->have_admin_gid && conn_peer_in_group(c, rpc->admin_gid));
}

bool rpc_conn_is_admin(const Rpc *rpc, const Conn *c) {
        return conn_is_admin(rpc, c);
}

int rpc_dispatch(Rpc *rpc, Conn *c, Tier__Request *req) {
        uint64_t seq = req->seq;

        if (!c->hello_done && req->op_case != TIER__REQUEST__OP_HELLO)
                return conn_protocol_error(c, seq, -EPROTO, "the first request must be Hello");
        if (req->op_case != TIER__REQUEST__OP_HELLO && req->op_case != TIER__REQUEST__OP_STATUS &&
            req->op_case != TIER__REQUEST__OP_QUOTA_GET && req->op_case != TIER__REQUEST__OP_QUOTA_SET &&
            req->op_case != TIER__REQUEST__OP_JOB_TENSORS && req->op_case != TIER__REQUEST__OP_JOB_EVICT &&
            req->op_case != TIER__REQUEST__OP_JOB_DETACH && req->op_case != TIER__REQUEST__OP_TRACE_START &&
            req->op_case != TIER__REQUEST__OP_TRACE_STOP && !c->job)
                return conn_reply_error(c, seq, -EPERM, "a control connection may only ask for status, quotas, "
                                        "job control (tensors, evict, detach) and traces");

        /* a phase marker the client wrote before this request is consumed first (tier.h's order) */
        if (c->plan)
                sched_plan_sync(c->plan);

        /*
         * Stopping: a connection still open holds what its client may be writing
         * through (server_reap()); it may let go and look, nothing more.
         */
        if (rpc->registry->stopping && req->op_case != TIER__REQUEST__OP_UNPIN &&
            req->op_case != TIER__REQUEST__OP_END_PLAN && req->op_case != TIER__REQUEST__OP_ACK &&
            req->op_case != TIER__REQUEST__OP_STATUS && req->op_case != TIER__REQUEST__OP_STAT &&
            req->op_case != TIER__REQUEST__OP_GET_SEGMENTS)
                return conn_reply_error(c, seq, -ESHUTDOWN, "tierd is stopping: it only takes pins back now "
                                        "(reconnect once it has started again)");

        switch (req->op_case) {
        case TIER__REQUEST__OP_HELLO:
                return handle_hello(rpc, c, seq, req->hello);
        case TIER__REQUEST__OP_CREATE:
                return handle_create(rpc, c, seq, req->create);
        case TIER__REQUEST__OP_OPEN:
                return handle_open(rpc, c, seq, req->open);
        case TIER__REQUEST__OP_FREE:
                return handle_free(rpc, c, seq, req->free);
        case TIER__REQUEST__OP_STAT:
                return handle_stat(c, seq, req->stat);
        case TIER__REQUEST__OP_PIN:
                return handle_move(rpc, c, seq, req->op_case, req->pin->tensor, (int) req->pin->tier,
                                   req->pin->async, req->pin->mode);
        case TIER__REQUEST__OP_UNPIN:
                return handle_unpin(rpc, c, seq, req->unpin);
        case TIER__REQUEST__OP_EVICT:
                return handle_move(rpc, c, seq, req->op_case, req->evict->tensor, (int) req->evict->tier,
                                   req->evict->async, 0);
        case TIER__REQUEST__OP_PREFETCH:
                return handle_move(rpc, c, seq, req->op_case, req->prefetch->tensor, (int) req->prefetch->tier,
                                   req->prefetch->async, 0);
        case TIER__REQUEST__OP_GET_SEGMENTS:
                return handle_get_segments(c, seq, req->get_segments);
        case TIER__REQUEST__OP_STATUS:
                if (req->status && req->status->prometheus)
                        return metrics_reply(rpc, c, seq);
                return handle_status(rpc, c, seq);
        case TIER__REQUEST__OP_PLAN:
                return handle_plan(rpc, c, seq, req->plan);
        case TIER__REQUEST__OP_END_PLAN:
                return handle_end_plan(c, seq);
        case TIER__REQUEST__OP_COMMIT:
                return commit_request(c, seq, req->commit);
        case TIER__REQUEST__OP_ROLLBACK:
                return rollback_request(rpc, c, seq);
        case TIER__REQUEST__OP_QUOTA_GET:
                return quota_rpc_get(rpc, c, seq, req->quota_get, conn_is_admin(rpc, c));
        case TIER__REQUEST__OP_QUOTA_SET:
                return quota_rpc_set(rpc, c, seq, req->quota_set, conn_is_admin(rpc, c));
        case TIER__REQUEST__OP_JOB_TENSORS:
                return jobctl_tensors(rpc, c, seq, req->job_tensors);
        case TIER__REQUEST__OP_JOB_EVICT:
                return jobctl_evict(rpc, c, seq, req->job_evict);
        case TIER__REQUEST__OP_JOB_DETACH:
                return jobctl_detach(rpc, c, seq, req->job_detach);
        case TIER__REQUEST__OP_TRACE_START:
                return trace_rpc_start(rpc, c, seq, req->trace_start);
        case TIER__REQUEST__OP_TRACE_STOP:
                return trace_rpc_stop(rpc, c, seq);
        case TIER__REQUEST__OP_ACK:
                revoke_ack(rpc->revoke, c, req->ack);  /* no Response: see tier.proto */
                return 0;
        default:
                return conn_reply_error(c, seq, -EOPNOTSUPP, "unknown request (op %d)", (int) req->op_case);
        }
}

/* ---- connection end ------------------------------------------------------------------------------ */


static void tensor_changed(Tensor *t, void *userdata) {
        sched_tensor_changed(userdata, t);
}

void rpc_conn_gone(Rpc *rpc, Conn *c) {
        Job *j = c->job;

        /* the plan's pins go with it (as dirty where the plan writes) */
        sched_plan_free(c->plan);
        c->plan = NULL;
        if (rpc->revoke)
                revoke_conn_gone(rpc->revoke, c);
        jobctl_conn_gone(c);    /* its evict of a job runs on, unanswered */
        rollback_conn_gone(c);  /* its rollback waiting for transfers ends, unanswered */
        trace_rpc_conn_gone(rpc, c);

        list_for_each_safe(n, tmp, &c->pending) {
                Pending *p = list_entry(n, Pending, link);

                int f = -ENOENT;

                if (p->op && p->kind == TIER__REQUEST__OP_PIN && p->replied && p->op->pinned &&
                    (f = pin_forget(c, p->op->tensor, p->op->tier)) >= 0)
                        tensor_pin_account(p->op->tensor, p->op->tier, -1);
                if (f > 0 && (f & PIN_WRITER))
                        copy_writers(p->op->tensor, p->op->tier, -1, c->rank);
                if (p->op)
                        op_cancel(p->op);   /* drops the pin the op held */
                /* an async pin that was granted already holds a pin record: dropped below */
                pending_free(p);
        }
        pin_drop_all(c, rpc->sched ? tensor_changed : NULL, rpc->sched);

        if (!j)
                return;
        list_del(&c->job_link);
        j->n_conns--;
        job_fence_slot_put(j, c->fence_slot);
        c->job = NULL;
        if (j->n_conns == 0 && !rpc->registry->stopping) {
                log_job(LOG_INFO, 0, j->name, "Job '%s' has no connection left, keeping its tensors for %"
                        PRIu64 " s", j->name, rpc->config->linger_usec / 1000000);
                job_linger_start(j);
                /* its guarantees count for no one now: pins refused for the room they kept may fit */
                if (rpc->engine)
                        engine_claims_changed(rpc->engine);
        }
}

/* ---- the server's ops ------------------------------------------------------------------------------ */

static int ops_dispatch(void *userdata, Conn *c, Tier__Request *req) {
        return rpc_dispatch(userdata, c, req);
}

static void ops_conn_gone(void *userdata, Conn *c) {
        rpc_conn_gone(userdata, c);
}

/* What its client may still be writing through: a pin that may write, a request in the engine, a plan's phase. */
static bool ops_holds(void *userdata, const Conn *c) {
        if (!list_empty(&c->pending) || (c->plan && sched_plan_holds(c->plan)))
                return true;
        for (size_t i = 0; i < c->n_pin_slots; i++)     /* (a free slot has neither) */
                if (c->pins[i].write_only || c->pins[i].rw)
                        return true;
        return false;
}

const ServerOps rpc_server_ops = {
        .dispatch = ops_dispatch,
        .conn_gone = ops_conn_gone,
        .holds = ops_holds,
};
