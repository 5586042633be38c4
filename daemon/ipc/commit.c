/* SPDX-License-Identifier: MIT */
/* commit.c: a job's commit, and its rollback, which waits for the transfers in flight of the job's tensors. */

/*
 * Theory of operation: a commit and a rollback act on every tensor of the
 * connection's job at once (job_commit(), job_rollback(): state/tensor.c).
 * A commit is refused while a tensor is pinned for reading and writing.
 *
 * A rollback is refused (-EBUSY) while a tensor is pinned or a client's
 * request is on one: those are the caller's (or another rank's) to end;
 * such a refusal changes nothing (engine_rollback()).
 * tierd's own work on the job's tensors is not: a process that takes a job
 * over after a crash typically finds tierd writing the lingering job's
 * copies down, to give its room to another job (engine/reclaim.c), or an
 * operator's tierctl evict running.  The rollback does not refuse then:
 *
 *   1. it cancels tierd's own ops on the job's tensors
 *      (engine_cancel_internal()): what they were to write or bring is
 *      what the rollback is about to replace;
 *   2. a transfer one of them started cannot be taken back; while any is
 *      in flight the job is frozen (Job.frozen): its copies are no victims
 *      (copy_evictable(); a pin that needs their room, of the job or of
 *      one it owes room to, engine/reclaim.c, waits for the thaw), and the
 *      scheduler starts no prefetch or
 *      write-behind of it, nor tierctl evict, so no new transfer starts
 *      that a client did not ask for;
 *   3. it tries again every ROLLBACK_POLL_USEC until none is in flight,
 *      then rolls back and answers.  A transfer ends on its own (done or
 *      failed), so the wait ends; if a pin or a request came meanwhile, the
 *      answer is -EBUSY as above.  The connection's going, or tierd's
 *      stop, ends the wait without an answer (the client sees its
 *      connection go) or with -ESHUTDOWN.
 *
 * One rollback per connection waits at a time (a second is -EBUSY); two
 * connections of a job may each wait (the second then finds nothing to
 * roll back).
 */

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <systemd/sd-event.h>

#include "daemon/base/log.h"
#include "daemon/engine/engine.h"
#include "daemon/ipc/commit.h"
#include "daemon/ipc/conn.h"
#include "daemon/ipc/rpc.h"
#include "daemon/sched/plan.h"
#include "daemon/state/registry.h"
#include "proto/macro.h"
#include "tier.pb-c.h"

/* How often a waiting rollback looks whether the job's transfers have ended. */
#define ROLLBACK_POLL_USEC (5 * 1000)

struct RollbackWait {
        Rpc *rpc;
        Conn *conn;
        uint64_t seq;
        Job *job;               /* frozen while this waits */
        sd_event_source *timer;
        uint64_t since;         /* CLOCK_MONOTONIC usec */
};

static int reply_commit(Conn *c, uint64_t seq, const Job *j, unsigned rolled, unsigned lost) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__CommitReply cr = TIER__COMMIT_REPLY__INIT;

        cr.step = j->commit_step;
        cr.rolled_back = rolled;
        cr.lost = lost;
        cr.committed = j->committing;
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_COMMIT;
        resp.commit = &cr;
        return conn_send_response(c, &resp, NULL, 0, false);
}

int commit_request(Conn *c, uint64_t seq, const Tier__JobCommit *jc) {
        Job *j = c->job;
        char why[512];
        int r;

        /* a rollback of another connection waits for transfers: a commit now would make it roll back to itself */
        if (j->frozen)
                return conn_reply_error(c, seq, -EBUSY, "a rollback of job '%s' waits for the transfers in flight of "
                                        "its tensors: commit once it has answered", j->name);
        r = job_commit_refused(j, why, sizeof(why));
        if (r < 0)
                return conn_reply_error(c, seq, r, "%s", why);

        list_for_each_safe(n, tmp, &j->tensors) {
                const Tensor *t = list_entry(n, Tensor, job_link);

                if (t->rw_pins > 0)
                        return conn_reply_error(c, seq, -EBUSY, "tensor '%s' is pinned for reading and writing: a commit "
                                                "takes what each tensor holds, so none may be in the middle of a write "
                                                "(unpin it, or commit after the phase that writes it)", t->name);
                /*
                 * Pinned for writing only, over the version a commit would keep: that copy is being
                 * overwritten (a pin may hand out the valid copy itself), and unless NVMe holds the
                 * version too nothing would be left to roll back to.  Dead or lost: nothing to keep.
                 * Pinned by its plan for a phase that writes it whole: dead by the plan's word (below).
                 */
                if (tensor_writers(t) > 0 && t->version > 0 && !t->dead && !t->lost && !copy_valid(t, LEVEL_NVME) &&
                    !plan_holds_overwrite(t))
                        return conn_reply_error(c, seq, -EBUSY, "tensor '%s' is pinned for writing and what it holds "
                                                "now is in memory only: a commit takes what each tensor holds, and that "
                                                "copy is being overwritten (unpin it, write it to NVMe first with "
                                                "tier_evict(), or commit after the phase that writes it)", t->name);
        }
        job_commit(j, jc->step);
        /*
         * What the plan's holds are overwriting whole is kept as dead, as timeline's
         * plan_drop_dead() would have made it once its last read was over (other
         * policies keep such copies): a rollback makes it dead again, after a restart too.
         */
        list_for_each_safe(n, tmp, &j->tensors) {
                Tensor *t = list_entry(n, Tensor, job_link);

                if (tensor_writers(t) > 0 && !t->dead && plan_holds_overwrite(t))
                        tensor_commit_dead(t, t->plan->rank + 1);       /* (plan_holds_overwrite(): t->plan) */
        }
        log_job(LOG_DEBUG, 0, j->name, "Job '%s': commit %" PRIu64, j->name, jc->step);
        return reply_commit(c, seq, j, 0, 0);
}

/* The wait is over: the job thaws (tierd's own moves may start again), @w goes. */
static void wait_free(RollbackWait *w) {
        Engine *e = w->rpc->engine;

        sd_event_source_disable_unref(w->timer);
        w->job->frozen--;
        w->conn->rollback = NULL;
        free(w);
        engine_wake_space_waiters(e);   /* its copies may be victims again */
        engine_kick(e);
}

/*
 * Roll @c's job back, or say why not; 1 (nothing answered) when a transfer
 * of tierd's own is still in flight, else what the answer returned.
 */
static int rollback_try(Rpc *rpc, Conn *c, uint64_t seq) {
        Job *j = c->job;
        unsigned rolled = 0, lost = 0;
        char why[512] = "";
        int r;

        if (rpc->registry->stopping)
                return conn_reply_error(c, seq, -ESHUTDOWN, "cannot roll job '%s' back: tierd is stopping (roll back "
                                        "once it runs again)", j->name);
        r = engine_rollback(rpc->engine, j, &rolled, &lost, why, sizeof(why));
        if (r == -EAGAIN)
                return 1;
        if (r < 0)
                return conn_reply_error(c, seq, r, "cannot roll job '%s' back: %s", j->name, why);
        log_job(LOG_INFO, 0, j->name, "Job '%s' rolled back to its commit %" PRIu64 ": %u tensor(s) brought back, "
                "%u lost", j->name, j->commit_step, rolled, lost);
        return reply_commit(c, seq, j, rolled, lost);
}

static int on_poll(sd_event_source *s, uint64_t usec, void *userdata) {
        RollbackWait *w = userdata;
        Conn *c = w->conn;
        int r;

        r = rollback_try(w->rpc, c, w->seq);
        if (r == 1) {
                r = sd_event_source_set_time_relative(s, ROLLBACK_POLL_USEC);
                if (r >= 0)
                        r = sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
                if (r >= 0)
                        return 0;
                r = conn_reply_error(c, w->seq, r, "cannot roll job '%s' back: cannot wait for its transfers: %s",
                                     c->job->name, strerror(-r));
        }
        log_job(LOG_INFO, 0, c->job->name, "Job '%s': its rollback waited %.3f s for the transfers of its tensors",
                c->job->name, (double) (usec - w->since) / 1e6);
        wait_free(w);
        if (r < 0)
                conn_abort(c);  /* (could not answer: the connection goes, as for any request) */
        return 0;
}

int rollback_request(Rpc *rpc, Conn *c, uint64_t seq) {
        Job *j = c->job;
        RollbackWait *w;
        int r;

        if (!j->committing)
                return reply_commit(c, seq, j, 0, 0);   /* nothing to go back to: nothing changes */
        if (c->rollback)
                return conn_reply_error(c, seq, -EBUSY, "a rollback of this connection waits already (one at a time)");
        r = rollback_try(rpc, c, seq);
        if (r != 1)
                return r;

        w = calloc(1, sizeof(*w));
        if (!w)
                return conn_reply_error(c, seq, -ENOMEM, "cannot roll job '%s' back: out of memory", j->name);
        *w = (RollbackWait) { .rpc = rpc, .conn = c, .seq = seq, .job = j };
        r = sd_event_now(rpc->engine->event, CLOCK_MONOTONIC, &w->since);
        if (r >= 0)
                r = sd_event_add_time_relative(rpc->engine->event, &w->timer, CLOCK_MONOTONIC, ROLLBACK_POLL_USEC, 0,
                                               on_poll, w);
        if (r < 0) {
                free(w);
                return conn_reply_error(c, seq, r, "cannot roll job '%s' back: cannot wait for its transfers: %s",
                                        j->name, strerror(-r));
        }
        (void) sd_event_source_set_description(w->timer, "rollback-wait");
        j->frozen++;
        c->rollback = w;
        log_job(LOG_INFO, 0, j->name, "Job '%s': its rollback waits for the transfers in flight of its tensors",
                j->name);
        return 0;
}

void rollback_conn_gone(Conn *c) {
        if (!c->rollback)
                return;
        log_job(LOG_INFO, 0, c->job->name, "Job '%s': its rollback ended unanswered: its connection went",
                c->job->name);
        wait_free(c->rollback);
}
