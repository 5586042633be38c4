/* SPDX-License-Identifier: MIT */
/* rpc.c: decoded requests -> registry and op-engine calls -> responses. */

/*
 * Theory of operation: rpc_dispatch() validates one decoded Request against
 * the connection's state and the limits (names, sizes, tiers, in-flight
 * count), then either answers at once (create, open, stat, unpin, status,
 * a pin of a copy that is already resident) or hands an Op to the mover.
 * An op carries a Pending record that remembers who asked: sync requests are
 * answered when the op completes, async ones at once with a fence (pin: as
 * soon as the destination is reserved, so the grant is known) and their
 * fence is completed on the job's fence page when the op ends.
 *
 * Pins are recorded per connection so that a vanished client's pins are
 * dropped (as dirty: the client may have written before it died, and
 * keeping its bytes is the safe choice).
 */

#include <errno.h>
#include <grp.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/base/log.h"
#include "daemon/core/manager.h"
#include "daemon/engine/mover.h"
#include "daemon/state/registry.h"
#include "daemon/ipc/revoke.h"
#include "daemon/ipc/rpc.h"
#include "daemon/ipc/server.h"
#include "daemon/ipc/status.h"
#include "daemon/sched/timeline.h"
#include "daemon/tiers/tier-nvme.h"
#include "daemon/tiers/vram.h"
#include "proto/fence.h"
#include "proto/plan.h"
#include "proto/macro.h"
#include "proto/wire.h"
#include "tier.pb-c.h"

/* Largest tensor we accept at all (the host segment size bounds it further). */
#define TENSOR_SIZE_MAX (1ull << 40)
/* A status reply bigger than this goes through a memfd. */
#define STATUS_INLINE_MAX (48u << 10)

typedef struct Pending {
        Conn *conn;
        uint64_t seq;
        uint64_t fence;         /* 0 for sync requests */
        int kind;               /* Request op case */
        bool replied;
        Op *op;
        List link;              /* Conn.pending */
} Pending;

/* ---- replies -------------------------------------------------------------------- */

static int reply_status(Conn *c, uint64_t seq, int status, const char *fmt, ...) _printf_(4, 5);
static int reply_status(Conn *c, uint64_t seq, int status, const char *fmt, ...) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        char msg[256] = "";

        if (fmt) {
                va_list ap;

                va_start(ap, fmt);
                vsnprintf(msg, sizeof(msg), fmt, ap);
                va_end(ap);
        }
        resp.seq = seq;
        resp.status = status;
        resp.error = msg;
        return conn_send_response(c, &resp, NULL, 0, false);
}

int rpc_protocol_error(Conn *c, uint64_t seq, int status, const char *msg) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        int r;

        resp.seq = seq;
        resp.status = status;
        resp.error = (char *) msg;
        r = conn_send_response(c, &resp, NULL, 0, true);
        return r < 0 ? r : 0;
}

/* ---- segments ---------------------------------------------------------------------- */

static uint32_t seg_wire_id(const Segment *s) {
        return s->pool->id_base + s->id;
}

size_t rpc_collect_segments(Conn *c, Tier__Segment *segs, Tier__Segment **segp, int *fds, size_t *n_fds, size_t max) {
        Job *j = c->job;
        size_t n = 0;

        for (int tier = 0; tier < TIERS; tier++) {
                list_for_each_safe(node, tmp, &j->segments[tier]) {
                        Segment *s = list_entry(node, Segment, owner_link);
                        uint32_t wid = seg_wire_id(s);

                        if (*n_fds >= max)
                                return n;
                        if (wid < c->n_seg_sent && c->seg_sent[wid] == s->generation + 1)
                                continue;
                        tier__segment__init(&segs[n]);
                        segs[n].id = wid;
                        segs[n].generation = s->generation;
                        segs[n].tier = (Tier__Tier) tier;
                        segs[n].size = s->pool->seg_size;
                        segs[n].fd_index = (int32_t) *n_fds;
                        segs[n].kind = (char *) s->pool->kind;
                        fds[(*n_fds)++] = s->fd;
                        segp[n] = &segs[n];
                        n++;
                }
        }
        return n;
}

void rpc_segments_sent(Conn *c, const Tier__Segment *segs, size_t n) {
        for (size_t i = 0; i < n; i++) {
                uint32_t wid = segs[i].id;

                if (wid >= c->n_seg_sent) {
                        uint32_t cap = MAX(wid + 1, c->n_seg_sent * 2);
                        uint32_t *p = realloc(c->seg_sent, cap * sizeof(uint32_t));

                        if (!p)
                                continue;       /* will be sent again: harmless */
                        memset(p + c->n_seg_sent, 0, (cap - c->n_seg_sent) * sizeof(uint32_t));
                        c->seg_sent = p;
                        c->n_seg_sent = cap;
                }
                c->seg_sent[wid] = segs[i].generation + 1;
        }
}

/* ---- fences --------------------------------------------------------------------------- */

static void fence_complete(Conn *c, uint64_t fence, int status, const char *error) {
        Job *j = c->job;
        bool advanced = false;

        if (status < 0) {
                Tier__Event ev = TIER__EVENT__INIT;
                Tier__FenceFailed ff = TIER__FENCE_FAILED__INIT;

                ff.fence = fence;
                ff.status = status;
                ff.error = (char *) (error ? error : "");
                ev.kind_case = TIER__EVENT__KIND_FENCE_FAILED;
                ev.fence_failed = &ff;
                /* a client that misses this event would wait forever: better closed */
                if (conn_send_event(c, &ev) < 0)
                        conn_abort(c);
                __atomic_add_fetch(&j->fences->failed[c->fence_slot], 1, __ATOMIC_RELEASE);
        }

        if (fence == c->fence_done + 1) {
                c->fence_done = fence;
                advanced = true;
                /* absorb fences that completed out of order */
                for (bool again = true; again;) {
                        again = false;
                        for (size_t i = 0; i < c->n_fence_completed; i++)
                                if (c->fence_completed[i] == c->fence_done + 1) {
                                        c->fence_done++;
                                        c->fence_completed[i] = c->fence_completed[--c->n_fence_completed];
                                        again = true;
                                        break;
                                }
                }
        } else if (c->n_fence_completed < c->manager->config.max_inflight)
                c->fence_completed[c->n_fence_completed++] = fence;

        if (advanced || status < 0) {
                uint64_t one = 1;

                __atomic_store_n(&j->fences->done[c->fence_slot], c->fence_done, __ATOMIC_RELEASE);
                (void) write(c->efd, &one, sizeof(one));
        }
}

/* ---- pins ------------------------------------------------------------------------------ */

static int pin_record(Conn *c, Tensor *t, int tier) {
        if (c->n_pins == c->cap_pins) {
                size_t cap = c->cap_pins ? c->cap_pins * 2 : 16;
                PinRec *p = realloc(c->pins, cap * sizeof(PinRec));

                if (!p)
                        return -ENOMEM;
                c->pins = p;
                c->cap_pins = cap;
        }
        c->pins[c->n_pins++] = (PinRec) { t, tier };
        return 0;
}

static int pin_forget(Conn *c, Tensor *t, int tier) {
        for (size_t i = c->n_pins; i > 0; i--)
                if (c->pins[i - 1].tensor == t && c->pins[i - 1].tier == tier) {
                        c->pins[i - 1] = c->pins[--c->n_pins];
                        return 0;
                }
        return -ENOENT;
}


static void fill_grant(Tier__Grant *g, const Tensor *t, int tier) {
        uint32_t seg, gen;
        uint64_t off;

        copy_grant(t, tier, &seg, &gen, &off);
        g->segment = seg + t->copy[tier].seg->pool->id_base;
        g->generation = gen;
        g->offset = off;
        g->length = t->size;
        g->tier = (Tier__Tier) tier;
}

static int reply_pin(Conn *c, uint64_t seq, Tensor *t, int tier, uint64_t fence) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__PinReply pr = TIER__PIN_REPLY__INIT;
        Tier__Grant g = TIER__GRANT__INIT;
        uint8_t ev[VRAM_IPC_EVENT_SIZE];

        fill_grant(&g, t, tier);
        pr.grant = &g;
        pr.fence = fence;
        /* the copy into VRAM is queued: the client's stream may wait for it on the device */
        if (fence && tier == TIER_VRAM &&
            vram_copy_event(c->manager->vram, t->copy[tier].seg, t->copy[tier].offset, ev) > 0)
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
                if (pin_record(c, op->tensor, op->tier) < 0) {
                        /* cannot track it: refuse rather than leak a pin */
                        return;
                }
                tensor_pin_account(op->tensor, op->tier, +1);
                p->replied = true;
                (void) reply_pin(c, p->seq, op->tensor, op->tier, p->fence);
        }
}

static void on_op_complete(Op *op, int status, const char *error) {
        Pending *p = op->userdata;
        Conn *c = p->conn;
        Tensor *t = op->tensor;

        if (p->kind == TIER__REQUEST__OP_PIN) {
                if (status >= 0 && !p->replied) {
                        if (pin_record(c, t, op->tier) < 0) {
                                (void) tensor_unpin(t, op->tier, false);
                                status = -ENOMEM;
                                error = "out of memory recording the pin";
                        } else
                                tensor_pin_account(t, op->tier, +1);
                } else if (status < 0 && p->replied) {
                        /* async pin whose data never came: the pin the op held is gone */
                        if (pin_forget(c, t, op->tier) >= 0)
                                tensor_pin_account(t, op->tier, -1);
                }
        }

        if (!p->replied) {
                if (status < 0)
                        (void) reply_status(c, p->seq, status, "%s", error ? error : strerror(-status));
                else if (p->kind == TIER__REQUEST__OP_PIN)
                        (void) reply_pin(c, p->seq, t, op->tier, p->fence);
                else
                        (void) reply_fence(c, p->seq, p->fence);
                p->replied = true;
        }
        if (p->fence)
                fence_complete(c, p->fence, status, error);
        pending_free(p);
}

/* ---- validation ------------------------------------------------------------------------------- */

static int check_name(Conn *c, uint64_t seq, const char *what, const char *name) {
        size_t len = name ? strlen(name) : 0;

        if (len == 0)
                return reply_status(c, seq, -EINVAL, "%s name is empty", what), -EINVAL;
        if (len > c->manager->config.max_name)
                return reply_status(c, seq, -ENAMETOOLONG, "%s name longer than max_name (%u bytes)", what,
                                    c->manager->config.max_name), -ENAMETOOLONG;
        for (const unsigned char *s = (const unsigned char *) name; *s; s++)
                if (*s < 0x20 || *s == 0x7f)
                        return reply_status(c, seq, -EINVAL, "%s name contains control characters", what), -EINVAL;
        return 0;
}

static Tensor *lookup(Conn *c, uint64_t seq, uint64_t id) {
        Tensor *t = tensor_find(c->job, id);

        if (!t)
                (void) reply_status(c, seq, -ENOENT, "no tensor with id %" PRIu64 " in job '%s'", id, c->job->name);
        return t;
}

static bool tier_ok(int tier) {
        return tier >= 0 && tier < TIERS;
}

/* ---- handlers --------------------------------------------------------------------------------- */

static void job_linger_start(Job *j);

static int handle_hello(Conn *c, uint64_t seq, const Tier__Hello *h) {
        Manager *m = c->manager;
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__HelloReply hr = TIER__HELLO_REPLY__INIT;
        Tier__Limits lim = TIER__LIMITS__INIT;
        uint64_t limits[TIERS] = {};
        int fds[2];
        size_t n_fds = 0;
        bool created = false;
        Job *j;
        int r;

        if (c->hello_done)
                return rpc_protocol_error(c, seq, -EPROTO, "Hello sent twice");
        if (h->version != TIER_PROTOCOL_VERSION) {
                char msg[128];

                snprintf(msg, sizeof(msg), "protocol version %u not supported (tierd speaks version %u)",
                         h->version, TIER_PROTOCOL_VERSION);
                log_info("Connection %" PRIu64 " (pid " PID_FMT "): %s", c->id, c->pid, msg);
                return rpc_protocol_error(c, seq, -EPROTONOSUPPORT, msg);
        }

        lim.max_message = m->config.max_message;
        lim.max_tensors = m->config.max_tensors;
        lim.max_inflight = m->config.max_inflight;
        lim.max_name = m->config.max_name;
        hr.version = TIER_PROTOCOL_VERSION;
        hr.limits = &lim;
        hr.vram_backend = (char *) m->vram->ops->name;
        hr.vram_device = m->vram->device;
        hr.fence_page_fd = -1;
        hr.fence_eventfd = -1;

        /* connections per uid */
        {
                unsigned n = 0;

                list_for_each_safe(node, tmp, server_conns(m->server)) {
                        Conn *o = list_entry(node, Conn, link);
                        if (o != c && o->uid == c->uid && o->hello_done)
                                n++;
                }
                if (n >= m->config.max_connections_per_uid)
                        return rpc_protocol_error(c, seq, -EUSERS, "too many connections for this uid "
                                                  "(max_connections_per_uid)");
        }

        if (!h->job || h->job[0] == 0) {
                /* control connection: status only */
                c->hello_done = true;
                resp.seq = seq;
                resp.result_case = TIER__RESPONSE__RESULT_HELLO;
                resp.hello = &hr;
                return conn_send_response(c, &resp, NULL, 0, false);
        }

        r = check_name(c, seq, "job", h->job);
        if (r < 0)
                return 0;

        j = job_find(m, h->job);
        if (j) {
                if (j->uid != c->uid && c->uid != 0)
                        return reply_status(c, seq, -EACCES, "job '%s' belongs to uid %u", j->name, (unsigned) j->uid);
        } else {
                unsigned n = 0;

                /* jobs outlive their connections (linger): bound them per uid too */
                list_for_each_safe(node, tmp, &m->jobs)
                        if (list_entry(node, Job, link)->uid == c->uid)
                                n++;
                if (n >= m->config.max_connections_per_uid)
                        return reply_status(c, seq, -EUSERS, "uid %u has %u jobs already (max_connections_per_uid)",
                                            (unsigned) c->uid, n);
                r = job_new(m, h->job, c->uid, &j);
                if (r < 0)
                        return reply_status(c, seq, r, "cannot create job: %s", strerror(-r));
                created = true;
                log_job(LOG_INFO, 0, j->name, "Job '%s' (id %" PRIu64 ") created by uid %u", j->name, j->id,
                        (unsigned) c->uid);
        }

        r = job_fence_slot_get(j, &c->fence_slot);
        if (r < 0) {
                if (created)
                        job_linger_start(j);
                return reply_status(c, seq, r, "job '%s' has too many connections (%d)", j->name, FENCE_SLOTS);
        }
        c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        c->fence_completed = calloc(m->config.max_inflight, sizeof(uint64_t));
        if (c->efd < 0 || !c->fence_completed) {
                job_fence_slot_put(j, c->fence_slot);
                if (created)
                        job_linger_start(j);
                return reply_status(c, seq, -ENOMEM, "out of resources");
        }

        c->job = j;
        c->hello_done = true;
        list_add_tail(&j->conns, &c->job_link);
        j->n_conns++;
        j->linger = sd_event_source_disable_unref(j->linger);
        j->linger_until = 0;

        for (int i = 0; i < TIERS; i++)
                limits[i] = j->limit[i];
        lim.n_tier_limit = TIERS;
        lim.tier_limit = limits;
        hr.job_id = j->id;
        hr.fence_slot = c->fence_slot;
        hr.created = created;
        fds[n_fds] = j->fence_fd;
        hr.fence_page_fd = (int32_t) n_fds++;
        fds[n_fds] = c->efd;
        hr.fence_eventfd = (int32_t) n_fds++;
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_HELLO;
        resp.hello = &hr;
        return conn_send_response(c, &resp, fds, n_fds, false);
}

static int handle_create(Conn *c, uint64_t seq, const Tier__Create *cr) {
        Manager *m = c->manager;
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__TensorInfo ti = TIER__TENSOR_INFO__INIT;
        Tensor *t;
        int r;

        if (check_name(c, seq, "tensor", cr->name) < 0)
                return 0;
        if (cr->size == 0 || cr->size > TENSOR_SIZE_MAX)
                return reply_status(c, seq, -EINVAL, "tensor size %" PRIu64 " out of range (1..2^40)", cr->size);
        if (ALIGN_UP(cr->size, SEG_UNIT) > m->host.pool.seg_size)
                return reply_status(c, seq, -EFBIG, "tensor of %" PRIu64 " bytes does not fit a host segment "
                                    "([host] segment_size = %" PRIu64 ")", cr->size, m->host.pool.seg_size);
        r = tensor_new(c->job, cr->name, cr->size, &t);
        if (r == -EEXIST)
                return reply_status(c, seq, r, "tensor '%s' already exists in job '%s'", cr->name, c->job->name);
        if (r == -EMFILE)
                return reply_status(c, seq, r, "job '%s' has max_tensors (%u) tensors", c->job->name,
                                    m->config.max_tensors);
        if (r < 0)
                return reply_status(c, seq, r, "cannot create tensor: %s", strerror(-r));

        ti.tensor = t->id;
        ti.size = t->size;
        ti.name = t->name;
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_TENSOR;
        resp.tensor = &ti;
        return conn_send_response(c, &resp, NULL, 0, false);
}

static int handle_open(Conn *c, uint64_t seq, const Tier__Open *o) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__TensorInfo ti = TIER__TENSOR_INFO__INIT;
        Tensor *t;

        if (check_name(c, seq, "tensor", o->name) < 0)
                return 0;
        t = tensor_find_name(c->job, o->name);
        if (!t)
                return reply_status(c, seq, -ENOENT, "no tensor '%s' in job '%s'", o->name, c->job->name);
        ti.tensor = t->id;
        ti.size = t->size;
        ti.name = t->name;
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_TENSOR;
        resp.tensor = &ti;
        return conn_send_response(c, &resp, NULL, 0, false);
}

static int handle_free(Conn *c, uint64_t seq, const Tier__Free *f) {
        Tensor *t = lookup(c, seq, f->tensor);
        int r;

        if (!t)
                return 0;
        r = tensor_free(t);
        if (r == -EBUSY)
                return reply_status(c, seq, r, "tensor '%s' is pinned, has requests in flight or is named by a plan",
                                    t->name);
        if (r < 0)
                return reply_status(c, seq, r, "cannot free tensor: %s", strerror(-r));
        return reply_status(c, seq, 0, NULL);
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
                cs[i].dirty = copy_is_sole(t, i) && i != TIER_NVME;
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

static int handle_unpin(Conn *c, uint64_t seq, const Tier__Unpin *u) {
        Tensor *t = lookup(c, seq, u->tensor);
        int tier = (int) u->tier;

        if (!t)
                return 0;
        if (!tier_ok(tier))
                return reply_status(c, seq, -EINVAL, "invalid tier %d", tier);
        if (u->ipc_event.len > 0) {
                int r = tier == TIER_VRAM && t->copy[tier].pins > 0 ?
                        vram_wait_event(c->manager->vram, t->copy[tier].seg, t->copy[tier].offset, t->alloc_size,
                                        u->ipc_event.data, u->ipc_event.len) : -EINVAL;
                if (r < 0)
                        return reply_status(c, seq, r, "cannot wait for the client's event on '%s' in %s: %s",
                                            t->name, tier_to_string(tier), strerror(-r));
        }
        if (pin_forget(c, t, tier) < 0)
                return reply_status(c, seq, -ENOENT, "tensor '%s' is not pinned in %s by this connection",
                                    t->name, tier_to_string(tier));
        tensor_pin_account(t, tier, -1);
        (void) tensor_unpin(t, tier, u->dirty);
        return reply_status(c, seq, 0, NULL);
}

static int submit(Conn *c, uint64_t seq, int kind, Tensor *t, int tier, bool async) {
        Manager *m = c->manager;
        OpKind ok = kind == TIER__REQUEST__OP_PIN ? OP_PIN :
                    kind == TIER__REQUEST__OP_EVICT ? OP_EVICT : OP_PREFETCH;
        Pending *p;
        int r;

        /* fast path: a pin of a resident copy needs no op */
        if (ok == OP_PIN && copy_valid(t, tier) && !t->xfer) {
                Copy *cp = &t->copy[tier];
                uint64_t fence = async ? c->next_fence++ : 0;

                if (cp->state == COPY_DRAINING)
                        cp->state = COPY_RESIDENT;      /* wanted again: keep it */
                r = pin_record(c, t, tier);
                if (r < 0)
                        return reply_status(c, seq, r, "out of memory");
                cp->pins++;
                tensor_pin_account(t, tier, +1);
                r = reply_pin(c, seq, t, tier, fence);
                if (fence)
                        fence_complete(c, fence, 0, NULL);
                return r;
        }

        p = calloc(1, sizeof(*p));
        if (!p)
                return reply_status(c, seq, -ENOMEM, "out of memory");
        p->conn = c;
        p->seq = seq;
        p->kind = kind;
        p->fence = async ? c->next_fence++ : 0;
        list_add_tail(&c->pending, &p->link);
        c->inflight++;

        r = op_submit(m, ok, t, tier, on_op_complete, ok == OP_PIN && async ? on_op_reserved : NULL, p, &p->op);
        if (r < 0) {
                if (p->fence)
                        fence_complete(c, p->fence, r, "out of memory");
                pending_free(p);
                return reply_status(c, seq, r, "out of memory");
        }
        if (async && ok != OP_PIN) {
                p->replied = true;
                return reply_fence(c, seq, p->fence);
        }
        return 0;
}

static int handle_move(Conn *c, uint64_t seq, int kind, uint64_t id, int tier, bool async) {
        Tensor *t = lookup(c, seq, id);
        Manager *m = c->manager;

        if (!t)
                return 0;
        if (!tier_ok(tier))
                return reply_status(c, seq, -EINVAL, "invalid tier %d", tier);
        if (c->inflight >= m->config.max_inflight)
                return reply_status(c, seq, -EBUSY, "too many requests in flight on this connection "
                                    "(max_inflight = %u)", m->config.max_inflight);
        /* fences complete in any order; tierd remembers at most max_inflight ahead of the oldest */
        if (async && c->next_fence - 1 - c->fence_done >= m->config.max_inflight)
                return reply_status(c, seq, -EBUSY, "too many fences outstanding on this connection (max_inflight "
                                    "= %u): wait for fence %" PRIu64 " first", m->config.max_inflight,
                                    c->fence_done + 1);
        if (kind == TIER__REQUEST__OP_PIN && c->n_pins + c->inflight >= 2 * (size_t) m->config.max_tensors)
                return reply_status(c, seq, -EMFILE, "too many pins on this connection (at most %u, twice max_tensors)",
                                    2 * m->config.max_tensors);
        switch (kind) {
        case TIER__REQUEST__OP_PIN:
                if (tier == TIER_NVME)
                        return reply_status(c, seq, -EINVAL, "tensors are pinned in vram or host, not nvme");
                if (tier == TIER_VRAM && t->alloc_size > m->vram->pool.seg_size)
                        return reply_status(c, seq, -EFBIG, "tensor '%s' does not fit a VRAM chunk "
                                            "([vram] chunk_size = %" PRIu64 ")", t->name, m->vram->pool.seg_size);
                break;
        case TIER__REQUEST__OP_PREFETCH:
                if (tier == TIER_NVME)
                        return reply_status(c, seq, -EINVAL, "prefetch goes up to vram or host, not nvme");
                if (tier == TIER_VRAM && t->alloc_size > m->vram->pool.seg_size)
                        return reply_status(c, seq, -EFBIG, "tensor '%s' does not fit a VRAM chunk "
                                            "([vram] chunk_size = %" PRIu64 ")", t->name, m->vram->pool.seg_size);
                break;
        case TIER__REQUEST__OP_EVICT:
                if (tier == TIER_VRAM)
                        return reply_status(c, seq, -EINVAL, "evict goes down to host or nvme, not vram");
                break;
        default:
                break;
        }
        return submit(c, seq, kind, t, tier, async);
}

static int handle_get_segments(Conn *c, uint64_t seq, const Tier__GetSegments *g) {
        Tier__Response resp = TIER__RESPONSE__INIT;

        /* forget what the client says it lacks, so it is sent again */
        for (size_t i = 0; i < g->n_ids; i++)
                if (g->ids[i] < c->n_seg_sent)
                        c->seg_sent[g->ids[i]] = 0;
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_SEGMENTS;
        {
                Tier__SegmentsReply sr = TIER__SEGMENTS_REPLY__INIT;
                resp.segments = &sr;
                return conn_send_response(c, &resp, NULL, 0, false);
        }
}

static int handle_status(Conn *c, uint64_t seq) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__StatusReply *sr = NULL;
        _cleanup_free_ uint8_t *buf = NULL;
        size_t len;
        int r;

        r = status_build(c->manager, &sr);
        if (r < 0)
                return reply_status(c, seq, r, "cannot build status: %s", strerror(-r));
        len = tier__status_reply__get_packed_size(sr);
        resp.seq = seq;
        if (len <= STATUS_INLINE_MAX) {
                resp.result_case = TIER__RESPONSE__RESULT_STATUS_REPLY;
                resp.status_reply = sr;
                r = conn_send_response(c, &resp, NULL, 0, false);
        } else {
                /* large dumps travel as a sealed memfd */
                _cleanup_close_ int fd = memfd_create("tierd-status", MFD_CLOEXEC | MFD_ALLOW_SEALING);

                buf = malloc(len);
                if (fd < 0 || !buf || write(fd, buf, 0) < 0) {
                        status_free(sr);
                        return reply_status(c, seq, -ENOMEM, "cannot build status");
                }
                tier__status_reply__pack(sr, buf);
                if (write(fd, buf, len) != (ssize_t) len ||
                    fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
                        status_free(sr);
                        return reply_status(c, seq, -EIO, "cannot write status memfd");
                }
                resp.result_case = TIER__RESPONSE__RESULT_STATUS_FD;
                resp.status_fd = 0;
                r = conn_send_response(c, &resp, &fd, 1, false);
        }
        status_free(sr);
        return r;
}

static int handle_plan(Conn *c, uint64_t seq, const Tier__SubmitPlan *sp) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__PlanReply pr = TIER__PLAN_REPLY__INIT;
        char error[256] = "";
        Plan *p = NULL;
        int fds[2], r;

        if (c->plan)
                return reply_status(c, seq, -EBUSY, "this connection already has a plan (one per rank)");
        r = plan_new(c, sp, &p, error, sizeof(error));
        if (r < 0)
                return reply_status(c, seq, r, "%s", error[0] ? error : strerror(-r));
        c->plan = p;
        fds[0] = p->page_fd;
        fds[1] = p->marker_fd;
        pr.page_fd = 0;
        pr.page_size = p->page_size;
        pr.marker_fd = 1;
        pr.n_slots = p->n_slots;
        pr.policy = (char *) sched_policy_to_string(c->manager->config.sched_policy);
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_PLAN;
        resp.plan = &pr;
        log_job(LOG_INFO, 0, c->job->name, "Job '%s': rank connection %" PRIu64 " submitted a plan of %u phases "
                "over %u tensors", c->job->name, c->id, p->n_phases, p->n_slots);
        return conn_send_response(c, &resp, fds, 2, false);
}

/* Root, or a member of the group "tier-admin". */
static bool conn_is_admin(Conn *c) {
        gid_t groups[256];
        socklen_t len = sizeof(groups);
        struct group *g;

        if (c->uid == 0)
                return true;
        g = getgrnam("tier-admin");
        if (!g)
                return false;
        if (c->gid == g->gr_gid)
                return true;
        if (getsockopt(c->fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0)
                return false;
        for (size_t i = 0; i < len / sizeof(gid_t); i++)
                if (groups[i] == g->gr_gid)
                        return true;
        return false;
}

static int reply_quota(Conn *c, uint64_t seq, Job *j) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__QuotaReply qr = TIER__QUOTA_REPLY__INIT;
        uint64_t limits[TIERS];

        for (int i = 0; i < TIERS; i++)
                limits[i] = j->limit[i];
        qr.job = j->name;
        qr.n_tier_limit = TIERS;
        qr.tier_limit = limits;
        qr.weight = j->weight;
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_QUOTA;
        resp.quota = &qr;
        return conn_send_response(c, &resp, NULL, 0, false);
}

static int handle_quota_get(Conn *c, uint64_t seq, const Tier__QuotaGet *q) {
        Job *j = q->job && q->job[0] ? job_find(c->manager, q->job) : c->job;

        if (!j)
                return reply_status(c, seq, -ENOENT, "no job '%s'", q->job ? q->job : "");
        return reply_quota(c, seq, j);
}

static int handle_quota_set(Conn *c, uint64_t seq, const Tier__QuotaSet *q) {
        Manager *m = c->manager;
        Job *j;

        if (!conn_is_admin(c))
                return reply_status(c, seq, -EPERM, "setting quotas needs root or membership of group tier-admin");
        j = q->job ? job_find(m, q->job) : NULL;
        if (!j)
                return reply_status(c, seq, -ENOENT, "no job '%s'", q->job ? q->job : "");
        if (q->n_tier_limit != 0 && q->n_tier_limit != TIERS)
                return reply_status(c, seq, -EINVAL, "a quota has one limit per tier (%d)", TIERS);
        if (q->weight > 1000)
                return reply_status(c, seq, -EINVAL, "weight %u out of range (1..1000)", q->weight);
        for (size_t i = 0; i < q->n_tier_limit; i++)
                if (q->tier_limit[i] > 0) {
                        j->limit[i] = q->tier_limit[i];
                        j->limit_set |= (uint8_t) (1u << i);
                        log_job_tier(LOG_INFO, 0, j->name, tier_to_string((int) i), "Job '%s': %s limit set to %"
                                     PRIu64 " bytes", j->name, tier_to_string((int) i), q->tier_limit[i]);
                }
        if (q->weight > 0) {
                j->weight = q->weight;
                log_job(LOG_INFO, 0, j->name, "Job '%s': weight set to %u", j->name, q->weight);
        }
        manager_kick(m);
        return reply_quota(c, seq, j);
}

int rpc_dispatch(Conn *c, Tier__Request *req) {
        uint64_t seq = req->seq;

        if (!c->hello_done && req->op_case != TIER__REQUEST__OP_HELLO)
                return rpc_protocol_error(c, seq, -EPROTO, "the first request must be Hello");
        if (req->op_case != TIER__REQUEST__OP_HELLO && req->op_case != TIER__REQUEST__OP_STATUS &&
            req->op_case != TIER__REQUEST__OP_QUOTA_GET && req->op_case != TIER__REQUEST__OP_QUOTA_SET && !c->job)
                return reply_status(c, seq, -EPERM, "a control connection may only ask for status and quotas");

        switch (req->op_case) {
        case TIER__REQUEST__OP_HELLO:
                return handle_hello(c, seq, req->hello);
        case TIER__REQUEST__OP_CREATE:
                return handle_create(c, seq, req->create);
        case TIER__REQUEST__OP_OPEN:
                return handle_open(c, seq, req->open);
        case TIER__REQUEST__OP_FREE:
                return handle_free(c, seq, req->free);
        case TIER__REQUEST__OP_STAT:
                return handle_stat(c, seq, req->stat);
        case TIER__REQUEST__OP_PIN:
                return handle_move(c, seq, req->op_case, req->pin->tensor, (int) req->pin->tier, req->pin->async);
        case TIER__REQUEST__OP_UNPIN:
                return handle_unpin(c, seq, req->unpin);
        case TIER__REQUEST__OP_EVICT:
                return handle_move(c, seq, req->op_case, req->evict->tensor, (int) req->evict->tier,
                                   req->evict->async);
        case TIER__REQUEST__OP_PREFETCH:
                return handle_move(c, seq, req->op_case, req->prefetch->tensor, (int) req->prefetch->tier,
                                   req->prefetch->async);
        case TIER__REQUEST__OP_GET_SEGMENTS:
                return handle_get_segments(c, seq, req->get_segments);
        case TIER__REQUEST__OP_STATUS:
                return handle_status(c, seq);
        case TIER__REQUEST__OP_PLAN:
                return handle_plan(c, seq, req->plan);
        case TIER__REQUEST__OP_QUOTA_GET:
                return handle_quota_get(c, seq, req->quota_get);
        case TIER__REQUEST__OP_QUOTA_SET:
                return handle_quota_set(c, seq, req->quota_set);
        case TIER__REQUEST__OP_ACK:
                revoke_ack(c, req->ack);        /* no Response: see tier.proto */
                return 0;
        default:
                return reply_status(c, seq, -EOPNOTSUPP, "unknown request (op %d)", (int) req->op_case);
        }
}

/* ---- connection end, linger ------------------------------------------------------------------ */

static int on_linger(sd_event_source *s, uint64_t usec, void *userdata) {
        Job *j = userdata;

        job_destroy(j);
        return 0;
}

static void job_linger_start(Job *j) {
        Manager *m = j->manager;
        uint64_t until = now_usec() + m->config.linger_usec;
        int r;

        if (j->n_conns > 0)
                return;
        j->linger = sd_event_source_disable_unref(j->linger);
        j->linger_until = until;
        r = sd_event_add_time(m->event, &j->linger, CLOCK_MONOTONIC, until, 0, on_linger, j);
        if (r < 0) {
                log_job(LOG_WARNING, r, j->name, "Cannot arm linger timer of job '%s', ending it now: %m", j->name);
                job_destroy(j);
                return;
        }
        (void) sd_event_source_set_description(j->linger, "job-linger");
}

void rpc_conn_gone(Conn *c) {
        Manager *m = c->manager;
        Job *j = c->job;

        /* the plan's pins go with it (as dirty where the plan writes) */
        plan_free(c->plan);
        c->plan = NULL;
        revoke_conn_gone(c);

        list_for_each_safe(n, tmp, &c->pending) {
                Pending *p = list_entry(n, Pending, link);

                if (p->op && p->kind == TIER__REQUEST__OP_PIN && p->replied && p->op->pinned &&
                    pin_forget(c, p->op->tensor, p->op->tier) >= 0)
                        tensor_pin_account(p->op->tensor, p->op->tier, -1);
                if (p->op)
                        op_cancel(p->op);   /* drops the pin the op held */
                /* an async pin that was granted already holds a pin record: dropped below */
                pending_free(p);
        }
        for (size_t i = 0; i < c->n_pins; i++) {
                PinRec *pr = &c->pins[i];

                tensor_pin_account(pr->tensor, pr->tier, -1);
                (void) tensor_unpin(pr->tensor, pr->tier, true);
        }
        c->n_pins = 0;

        if (j) {
                list_del(&c->job_link);
                j->n_conns--;
                job_fence_slot_put(j, c->fence_slot);
                c->job = NULL;
                if (j->n_conns == 0 && !m->stopping) {
                        log_job(LOG_INFO, 0, j->name, "Job '%s' has no connection left, keeping its tensors for %"
                                PRIu64 " s", j->name, m->config.linger_usec / 1000000);
                        job_linger_start(j);
                }
        }
}
