/* SPDX-License-Identifier: MIT */
/* jobctl.c: tierctl's requests on a whole job: list its tensors, evict it, detach it. */

/*
 * Theory of operation: an operator (tierctl tensors|evict|detach) names a
 * job; these handlers act on all of it from any connection, a control one
 * included.  A job belongs to the uid that created it: that uid, root and
 * members of group tier-admin may use these requests; anyone else is
 * refused, with the peer's uid and pid in tierd's log and in the reply.
 *
 * tensors: one page of the job's tensors per reply, bounded both in count
 * (JOBCTL_TENSORS_PAGE_MAX) and in packed bytes (JOBCTL_TENSORS_PAGE_BYTES);
 * the client asks again from the next offset.  Each page is a snapshot: a
 * job that changes between pages may list a tensor twice or not at all.  The
 * connection remembers where its last page ended (Conn.list_*: the job, the
 * next offset and the id of the tensor there), and a page asked for at that
 * offset starts there while that tensor lives: walking from the start to the
 * offset for each page made a listing quadratic in the job's tensors.
 *
 * evict: one OP_EVICT per tensor that has a copy above the target tier and
 * no pin there (pinned ones are skipped and counted); the engine writes a
 * sole copy down first, then drops the copies above.  A JobEvict record
 * counts the ops still running and sums what they did; the reply goes when
 * the last one ends.  The ops are marked internal: the job's own client may
 * still free its tensors (engine_tensor_free() cancels them), and a job
 * that ends meanwhile cancels them (engine_cancel_job()); a cancelled op
 * counts as failed.  The asking connection may go before the reply: the
 * ops run on and the record is freed by the last one.  One evict of a job
 * runs at a time (Rpc.evicts), so that what a client can make tierd queue
 * is bounded by the jobs, not by how often it asks: an operator who asks
 * again after the asker went (tierctl evict interrupted, run again) joins
 * the one running to that tier and gets its reply, counting what it did
 * before too; any other ask while one runs is -EBUSY, naming who asked it.
 *
 * detach: the job's connections get a Shutdown event naming who detached
 * it, are let go of their job at once (rpc_conn_gone(): plans, pins and
 * requests go) and are closed once that event is written; then the job
 * ends as if its linger ran out (job_destroy()).
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/engine/engine.h"
#include "daemon/ipc/conn.h"
#include "daemon/ipc/jobctl.h"
#include "daemon/ipc/rpc.h"
#include "daemon/state/registry.h"
#include "proto/macro.h"
#include "tier.pb-c.h"
#include "util/time-util.h"

struct JobEvict {
        List link;              /* in Rpc.evicts */
        Conn *conn;             /* who asked; NULL once it is gone */
        uint64_t seq;
        pid_t pid;              /* who asked first (the peer's pid), for a refusal's message */
        uint64_t job_id;        /* the job's (Job.id: a job of the same name made later is another) */
        char *job;              /* its name, for the reply (the job may end first) */
        int tier;
        unsigned left;          /* ops still running */
        unsigned evicted, pinned, failed;
        uint64_t bytes_written, bytes_dropped, pinned_bytes;
        char error[256];        /* the first failure */
};

/* One op of a JobEvict and what it does when it succeeds. */
typedef struct EvictPart {
        JobEvict *ev;
        uint64_t write, drop;
} EvictPart;

/*
 * The job @name that @c may act on (@what: "list the tensors of", ...), or
 * NULL after a reply saying why (*@ret_r: what the handler returns).
 */
static Job *job_for(Rpc *rpc, Conn *c, uint64_t seq, const char *name, const char *what, int *ret_r) {
        Job *j;

        if (!name || !*name) {
                *ret_r = conn_reply_error(c, seq, -EINVAL, "no job named (give a job name)");
                return NULL;
        }
        j = job_find(rpc->registry, name);
        /*
         * as tier_client_new() and tier_quota_get() say: no new job can have such a name (one restored
         * from the NVMe index after a restart with a smaller max_name has it still: found above)
         */
        if (!j && strlen(name) > rpc->config->max_name) {
                *ret_r = conn_reply_error(c, seq, -ENAMETOOLONG, "job name longer than max_name (%u bytes)",
                                          rpc->config->max_name);
                return NULL;
        }
        if (!j) {
                *ret_r = conn_reply_error(c, seq, -ENOENT, "no job '%s' (tierctl jobs lists them)", name);
                return NULL;
        }
        if (c->uid != j->uid && !rpc_conn_is_admin(rpc, c)) {
                log_job(LOG_NOTICE, 0, j->name, "Denied: uid %u (pid " PID_FMT ") may not %s job '%s' of uid %u",
                        (unsigned) c->uid, c->pid, what, j->name, (unsigned) j->uid);
                *ret_r = conn_reply_error(c, seq, -EACCES, "permission denied: uid %u (pid " PID_FMT ") may not %s job "
                                          "'%s', which belongs to uid %u (only its owner, root and group tier-admin may)",
                                          (unsigned) c->uid, c->pid, what, j->name, (unsigned) j->uid);
                return NULL;
        }
        return j;
}

/* ---- tensors ----------------------------------------------------------------------------- */

typedef struct TensorsPage {
        Tier__TensorEntry entry;
        Tier__CopyState cs[TIERS];
        Tier__CopyState *csp[TIERS];
} TensorsPage;

static void entry_fill(TensorsPage *e, const Tensor *t, uint64_t now) {
        uint64_t last = 0;

        tier__tensor_entry__init(&e->entry);
        e->entry.tensor = t->id;
        e->entry.name = t->name;
        e->entry.size = t->size;
        for (int i = 0; i < TIERS; i++) {
                const Copy *cp = &t->copy[i];

                tier__copy_state__init(&e->cs[i]);
                e->cs[i].tier = (Tier__Tier) i;
                e->cs[i].state = (char *) copy_state_to_string(cp->state);
                e->cs[i].valid = copy_valid(t, i);
                e->cs[i].dirty = copy_unsaved(t, i);
                e->cs[i].pins = cp->pins;
                e->csp[i] = &e->cs[i];
                if (cp->last_use > last)
                        last = cp->last_use;
        }
        e->entry.n_copies = TIERS;
        e->entry.copies = e->csp;
        /* lost first: a tensor can be both (dead again after a ghost's pin, its rank not known: no read) */
        if (t->lost) {
                e->entry.state = (char *) "lost";
                e->entry.lost_why = (char *) tensor_lost_reason(t);
        } else if (t->dead)
                e->entry.state = (char *) "dead";
        else if (t->version == 0)
                e->entry.state = (char *) "unwritten";
        else
                e->entry.state = (char *) "data";
        e->entry.used = last > 0;
        e->entry.idle_s = last > 0 && now > last ? (double) (now - last) / 1e6 : 0;
}

List *jobctl_page_start(Conn *c, Job *j, uint32_t offset) {
        List *node;
        uint32_t i = 0;
        Tensor *t;

        if (offset > 0 && c->list_job == j->id && c->list_offset == offset &&
            (t = tensor_find(j, c->list_next)) != NULL) {
                c->list_steps++;
                return &t->job_link;
        }
        for (node = j->tensors.next; node != &j->tensors; node = node->next) {
                c->list_steps++;
                if (list_entry(node, Tensor, job_link)->doomed)
                        continue;
                if (i++ == offset)
                        break;
        }
        return node;
}

int jobctl_tensors(Rpc *rpc, Conn *c, uint64_t seq, const Tier__JobTensors *q) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__TensorsReply tr = TIER__TENSORS_REPLY__INIT;
        _cleanup_free_ TensorsPage *page = NULL;
        _cleanup_free_ Tier__TensorEntry **ep = NULL;
        uint32_t max = q->limit == 0 || q->limit > JOBCTL_TENSORS_PAGE_MAX ? JOBCTL_TENSORS_PAGE_MAX : q->limit;
        uint64_t now = now_usec();
        size_t n = 0, bytes = 0;
        List *node;
        int r = 0;
        Job *j;

        j = job_for(rpc, c, seq, q->job, "list the tensors of", &r);
        if (!j)
                return r;
        page = calloc(max, sizeof(*page));
        ep = calloc(max, sizeof(*ep));
        if (!page || !ep)
                return conn_reply_error(c, seq, -ENOMEM, "out of memory");

        /* the page starts where the connection's last one ended: no walk from the start (quadratic) */
        for (node = jobctl_page_start(c, j, q->offset); node != &j->tensors; node = node->next) {
                const Tensor *t = list_entry(node, Tensor, job_link);
                size_t sz;

                c->list_steps++;
                if (t->doomed)
                        continue;
                if (n >= max)
                        break;
                entry_fill(&page[n], t, now);
                sz = tier__tensor_entry__get_packed_size(&page[n].entry) + 8;
                /* at least one entry per page, however long its name */
                if (n > 0 && bytes + sz > JOBCTL_TENSORS_PAGE_BYTES)
                        break;
                bytes += sz;
                ep[n] = &page[n].entry;
                n++;
        }
        /* the next page starts at @node's tensor (none: a walk, which finds the end) */
        c->list_job = node != &j->tensors ? j->id : 0;
        c->list_offset = q->offset + (uint32_t) n;
        c->list_next = node != &j->tensors ? list_entry(node, Tensor, job_link)->id : 0;
        tr.job = j->name;
        tr.total = j->n_tensors;
        tr.offset = q->offset;
        tr.n_tensors = n;
        tr.tensors = ep;
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_TENSORS;
        resp.tensors = &tr;
        return conn_send_response(c, &resp, NULL, 0, false);
}

/* ---- evict ----------------------------------------------------------------------------- */

static void evict_reply(JobEvict *ev) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__EvictReply er = TIER__EVICT_REPLY__INIT;

        er.job = ev->job;
        er.tier = (Tier__Tier) ev->tier;
        er.evicted = ev->evicted;
        er.bytes_written = ev->bytes_written;
        er.bytes_dropped = ev->bytes_dropped;
        er.pinned = ev->pinned;
        er.pinned_bytes = ev->pinned_bytes;
        er.failed = ev->failed;
        er.error = ev->error;
        resp.seq = ev->seq;
        resp.result_case = TIER__RESPONSE__RESULT_EVICT;
        resp.evict = &er;
        (void) conn_send_response(ev->conn, &resp, NULL, 0, false);
}

/* One op fewer: the last one answers (when the asker is still there) and frees the record. */
static void evict_put(JobEvict *ev) {
        if (--ev->left > 0)
                return;
        if (ev->conn) {
                log_job(LOG_INFO, 0, ev->job, "Job '%s' evicted to %s for pid " PID_FMT ": %u tensor(s), %" PRIu64
                        " bytes written down, %" PRIu64 " dropped, %u pinned skipped, %u failed", ev->job,
                        level_to_string(ev->tier), ev->conn->pid, ev->evicted, ev->bytes_written,
                        ev->bytes_dropped, ev->pinned, ev->failed);
                evict_reply(ev);
                ev->conn->evict = NULL;
        }
        list_del(&ev->link);
        free(ev->job);
        free(ev);
}

static void evict_failed(JobEvict *ev, const char *tensor, const char *error) {
        ev->failed++;
        if (!ev->error[0])
                (void) snprintf(ev->error, sizeof(ev->error), "tensor '%s': %s", tensor, error);
}

static void on_evict_complete(Op *op, int status, const char *error) {
        EvictPart *p = op->userdata;
        JobEvict *ev = p->ev;

        if (status >= 0) {
                ev->evicted++;
                ev->bytes_written += p->write;
                ev->bytes_dropped += p->drop;
        } else if (status == -EBUSY) {
                /* pinned since we looked */
                ev->pinned++;
                ev->pinned_bytes += op->tensor->size;
        } else
                evict_failed(ev, op->tensor->name, error ? error : strerror(-status));
        free(p);
        evict_put(ev);
}

static void on_evict_cancelled(Op *op) {
        EvictPart *p = op->userdata;
        JobEvict *ev = p->ev;

        evict_failed(ev, op->tensor->name, "cancelled (the tensor was freed, its job ended or rolled back)");
        free(p);
        evict_put(ev);
}

/* Submit the evict of @t to @ev->tier, or count it as pinned; 0 when there is nothing to do. */
static int evict_one(Rpc *rpc, JobEvict *ev, Tensor *t) {
        int tier = ev->tier;
        bool above = false, pinned = false, below = t->version == 0 || t->dead;
        EvictPart *p;
        Op *op;
        int r;

        for (int i = 0; i < tier; i++) {
                above = above || t->copy[i].state != COPY_ABSENT;
                pinned = pinned || t->copy[i].pins > 0;
        }
        if (!above)
                return 0;
        if (pinned || t->job->frozen) {
                /* (a rollback of the job waits for its transfers: counted as pinned, left alone) */
                ev->pinned++;
                ev->pinned_bytes += t->size;
                return 0;
        }
        p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;
        p->ev = ev;
        for (int i = tier; i < TIERS; i++)
                below = below || copy_valid(t, i);
        p->write = below ? 0 : t->size;
        for (int i = 0; i < tier; i++)
                if (t->copy[i].state != COPY_ABSENT)
                        p->drop += t->size;
        r = op_submit(rpc->engine, OP_EVICT, t, tier, on_evict_complete, NULL, p, &op);
        if (r < 0) {
                free(p);
                return r;
        }
        op->internal = true;            /* the job's own client may still free the tensor */
        op->cancelled = on_evict_cancelled;
        ev->left++;
        return 1;
}

int jobctl_evict(Rpc *rpc, Conn *c, uint64_t seq, const Tier__JobEvict *q) {
        JobEvict *ev;
        int tier = (int) q->tier, r = 0;
        Job *j;

        j = job_for(rpc, c, seq, q->job, "evict", &r);
        if (!j)
                return r;
        if (tier != LEVEL_HOST && tier != LEVEL_NVME)
                return conn_reply_error(c, seq, -EINVAL, "a job is evicted down to host or nvme, not %s",
                                        tier == LEVEL_VRAM ? "vram" : "an unknown tier");
        if (c->evict)
                return conn_reply_error(c, seq, -EBUSY, "this connection is evicting a job already (one at a time)");
        list_for_each_safe(node, tmp, &rpc->evicts) {
                ev = list_entry(node, JobEvict, link);
                if (ev->job_id != j->id)
                        continue;
                if (ev->conn || ev->tier != tier)
                        return conn_reply_error(c, seq, -EBUSY, "job '%s' is being evicted to %s already, asked by "
                                                "pid " PID_FMT "%s (one evict of a job at a time): wait for it to "
                                                "end, then ask again", j->name, level_to_string(ev->tier), ev->pid,
                                                ev->conn ? "" : ", which has gone (it ends on its own)");
                /* its asker went: this one gets its reply (its counts since it began) */
                log_job(LOG_INFO, 0, j->name, "Job '%s': uid %u (pid " PID_FMT ") joins its evict to %s running "
                        "for pid " PID_FMT " (gone)", j->name, (unsigned) c->uid, c->pid, level_to_string(tier),
                        ev->pid);
                ev->conn = c;
                ev->seq = seq;
                c->evict = ev;
                return 0;
        }
        ev = calloc(1, sizeof(*ev));
        if (ev)
                ev->job = strdup(j->name);
        if (!ev || !ev->job) {
                free(ev);
                return conn_reply_error(c, seq, -ENOMEM, "out of memory");
        }
        ev->conn = c;
        ev->seq = seq;
        ev->pid = c->pid;
        ev->job_id = j->id;
        ev->tier = tier;
        list_add_tail(&rpc->evicts, &ev->link);
        ev->left = 1;           /* ours, dropped below: no op can answer before all are submitted */
        c->evict = ev;
        log_job(LOG_INFO, 0, j->name, "Job '%s': uid %u (pid " PID_FMT ") evicts it to %s", j->name,
                (unsigned) c->uid, c->pid, level_to_string(tier));
        list_for_each_safe(node, tmp, &j->tensors) {
                Tensor *t = list_entry(node, Tensor, job_link);

                if (t->doomed)
                        continue;
                r = evict_one(rpc, ev, t);
                if (r < 0)
                        evict_failed(ev, t->name, strerror(-r));
        }
        evict_put(ev);
        return 0;
}

void jobctl_conn_gone(Conn *c) {
        if (c->evict)
                c->evict->conn = NULL;
        c->evict = NULL;
}

/* ---- detach ----------------------------------------------------------------------------- */

int jobctl_detach(Rpc *rpc, Conn *c, uint64_t seq, const Tier__JobDetach *q) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__DetachReply dr = TIER__DETACH_REPLY__INIT;
        Tier__Event ev = TIER__EVENT__INIT;
        Tier__Shutdown sh = TIER__SHUTDOWN__INIT;
        _cleanup_free_ char *name = NULL;
        uint64_t freed[TIERS];
        char reason[256];
        int r = 0;
        Job *j;

        j = job_for(rpc, c, seq, q->job, "detach", &r);
        if (!j)
                return r;
        if (c->job == j)
                return conn_reply_error(c, seq, -EBUSY, "this connection belongs to job '%s': detach it from another "
                                        "one (tierctl detach), or close the job's connections", j->name);
        name = strdup(j->name);
        if (!name)
                return conn_reply_error(c, seq, -ENOMEM, "out of memory");

        dr.job = name;
        dr.job_id = j->id;
        dr.connections = j->n_conns;
        dr.tensors = j->n_tensors;
        for (int i = 0; i < TIERS; i++)
                freed[i] = j->used[i];
        dr.n_freed = TIERS;
        dr.freed = freed;

        log_job(LOG_NOTICE, 0, j->name, "Job '%s' (id %" PRIu64 ") detached by uid %u (pid " PID_FMT "): closing "
                "its %u connection(s), freeing %u tensor(s)", j->name, j->id, (unsigned) c->uid, c->pid,
                j->n_conns, j->n_tensors);
        (void) snprintf(reason, sizeof(reason), "job '%s' was detached by uid %u (pid " PID_FMT ", tierctl detach): "
                        "its tensors are gone", j->name, (unsigned) c->uid, c->pid);
        sh.reason = reason;
        ev.kind_case = TIER__EVENT__KIND_SHUTDOWN;
        ev.shutdown = &sh;
        /*
         * The job is looked up again for each connection: the last one's going starts its linger, and a
         * linger timer that cannot be armed ends the job there (a list walk would read it freed).
         */
        while ((j = job_find(rpc->registry, name)) && !list_empty(&j->conns)) {
                Conn *jc = list_entry(j->conns.next, Conn, job_link);

                (void) conn_send_event(jc, &ev);
                /* off its job now (plan, pins, requests); the socket closes once the event is written */
                rpc_conn_gone(rpc, jc);
                conn_shutdown(jc);
        }
        /* rpc_conn_gone() of the last one started its linger: end it now */
        if (j)
                job_destroy(j);

        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_DETACH;
        resp.detach = &dr;
        return conn_send_response(c, &resp, NULL, 0, false);
}
