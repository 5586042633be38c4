/* SPDX-License-Identifier: MIT */
/* owner.c: what one uid may have: the job a Hello names (found, or made for it), and its tensors in all. */

/*
 * Theory of operation: a job belongs to the uid whose Hello made it; only
 * that uid, root and group tier-admin attach to it (jobctl.c's requests
 * on a whole job are judged alike).  What a uid makes tierd keep is
 * bounded per uid, not only per job or per connection, since one uid may
 * have many jobs, lingering ones included: its jobs by
 * max_connections_per_uid (owner_hello_job()), and the tensors of all of
 * them by [limits] max_tensors_per_uid (owner_tensor_room(), at Create;
 * a tensor counts for its job's uid, whoever attached to create it).
 * A tensor with no copy costs no bytes of any quota, yet tierd keeps its
 * record (some 1.3 KiB with a long name) and writes it to the NVMe index:
 * with max_tensors per job alone, one uid's 64 jobs of 65536 tensors each
 * made tierd hold some 5 GiB, and the index grow by over 1 GiB, for every
 * user.  A job restored from the NVMe index is not held to it (nothing is
 * dropped for a bound lowered since); its uid creates no more until it is
 * under it again.  A job name whose quota rule names an owner ([quota]
 * owner =) is that uid's alone: anyone else's Hello is refused before the
 * job exists, even root's, so that no one takes the name's guarantee and
 * locks its owner out (without an owner the first Hello has the name).
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/ipc/conn.h"
#include "daemon/ipc/owner.h"
#include "daemon/ipc/quota-rpc.h"
#include "daemon/ipc/rpc.h"
#include "daemon/state/book.h"
#include "daemon/state/quota.h"
#include "daemon/state/registry.h"

Job *owner_hello_job(Rpc *r, Conn *c, uint64_t seq, const char *name, bool *ret_created) {
        char why[1024] = "";
        Job *j;
        unsigned n = 0;
        uint32_t owner;
        int q;

        j = job_find(r->registry, name);
        if (j) {
                if (j->uid != c->uid && !rpc_conn_is_admin(r, c)) {
                        log_job(LOG_NOTICE, 0, j->name, "Denied: uid %u (pid " PID_FMT ") may not attach to job "
                                "'%s' of uid %u", (unsigned) c->uid, c->pid, j->name, (unsigned) j->uid);
                        /* a name is the first Hello's: say what to do when another uid took it first */
                        (void) conn_reply_error(c, seq, -EACCES, "job '%s' belongs to uid %u: uid %u (pid " PID_FMT
                                                ") may not attach to it (only its owner, root and group tier-admin "
                                                "may); use another job name, or have uid %u or an admin end it "
                                                "(tierctl detach; tierctl jobs shows it)", j->name, (unsigned) j->uid,
                                                (unsigned) c->uid, c->pid, (unsigned) j->uid);
                        return NULL;
                }
                *ret_created = false;
                return j;
        }
        /* a name whose quota rule has an owner is that uid's alone: refused before the job exists */
        if (quota_job_owner(r->config, &r->quotas->runtime, name, &owner) && owner != (uint32_t) c->uid) {
                log_job(LOG_NOTICE, 0, name, "Denied: uid %u (pid " PID_FMT ") may not create job '%s': its quota "
                        "rule has owner uid %" PRIu32, (unsigned) c->uid, c->pid, name, owner);
                (void) conn_reply_error(c, seq, -EACCES, "job name '%s' belongs to uid %" PRIu32 " ([quota] job = %s "
                                        "has owner = %" PRIu32 "): uid %u (pid " PID_FMT ") may not create it; use "
                                        "another job name, or have an admin change the rule's owner (tierd.conf, "
                                        "then a reload)", name, owner, name, owner, (unsigned) c->uid, c->pid);
                return NULL;
        }
        /* jobs outlive their connections (linger): bound them per uid too */
        list_for_each_safe(node, tmp, &r->registry->jobs)
                if (list_entry(node, Job, link)->uid == c->uid)
                        n++;
        if (n >= r->config->max_connections_per_uid) {
                (void) conn_reply_error(c, seq, -EUSERS, "uid %u has %u jobs already (max_connections_per_uid)",
                                        (unsigned) c->uid, n);
                return NULL;
        }
        q = job_new(r->registry, name, c->uid, &j);
        if (q < 0) {
                (void) conn_reply_error(c, seq, q, "cannot create job: %s", strerror(-q));
                return NULL;
        }
        log_job(LOG_INFO, 0, j->name, "Job '%s' (id %" PRIu64 ") created by uid %u", j->name, j->id, (unsigned) c->uid);
        /* its quota: of its name, its uid, its groups or the default (logged with where each value comes from) */
        q = quota_rpc_job_created(r, c, j, why, sizeof(why));
        if (q < 0) {
                log_job(LOG_NOTICE, 0, j->name, "Job '%s' refused: %s", j->name, why[0] ? why : strerror(-q));
                (void) conn_reply_error(c, seq, q, "cannot create job '%s': %s%s", j->name, why[0] ? why : strerror(-q),
                                        q == -ENOSPC ? "; an admin lowers a guarantee with tierctl quota set "
                                                   "(tierctl quota get JOB shows where each value comes from)" : "");
                job_destroy(j);
                return NULL;
        }
        book_job(r->registry->book, j);         /* in the NVMe index from now on: its tensors survive tierd */
        *ret_created = true;
        return j;
}

unsigned owner_uid_tensors(const Registry *r, uid_t uid) {
        unsigned n = 0;

        list_for_each_safe(node, tmp, &r->jobs) {
                const Job *j = list_entry(node, Job, link);

                if (j->uid == uid)
                        n += j->n_tensors;
        }
        return n;
}

int owner_tensor_room(Rpc *rpc, Conn *c, uint64_t seq) {
        /* the job's uid, not the connection's: root or tier-admin attached to another uid's job adds to its jobs */
        uid_t uid = c->job->uid;
        unsigned n = owner_uid_tensors(rpc->registry, uid), max = rpc->config->max_tensors_per_uid;

        if (n < max)
                return 0;
        (void) conn_reply_error(c, seq, -EMFILE, "uid %u has %u tensors in its jobs (lingering ones included), "
                                "[limits] max_tensors_per_uid (%u): free some, or end a job it no longer needs "
                                "(tierctl detach JOB)", (unsigned) uid, n, max);
        return -EMFILE;
}
