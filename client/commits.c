/* SPDX-License-Identifier: MIT */
/* commits.c: a job's commits and rollbacks (tier_job_commit(), tier_job_rollback()). */

/*
 * Theory of operation: a commit is one request; tierd then keeps, for each
 * tensor written after it, the committed version's NVMe image until the
 * next commit (daemon/state/tensor.c), so that a rollback, asked by the
 * process that takes the job over after a crash, brings every tensor back
 * to what it held at the commit.  The step number is the caller's: tierd
 * keeps it with the commit (and in its NVMe index) and returns it.
 */

#include <errno.h>
#include <stddef.h>

#include <tier.h>

#include "client/client-internal.h"
#include "client/tier-private.h"
#include "proto/macro.h"
#include "proto/tier.pb-c.h"

/* The CommitReply of @req's answer into @ret (may be NULL). */
static int commit_call(tier_client *c, Tier__Request *req, struct tier_commit *ret) {
        Packet p = PACKET_NULL;
        const Tier__Response *resp;
        int r;

        r = transport_call(c, req, &p);
        if (r < 0)
                return r;
        resp = p.reply->response;
        if (resp->result_case != TIER__RESPONSE__RESULT_COMMIT || !resp->commit) {
                packet_done(&p);
                return client_error(c, -EPROTO, "tierd answered a commit without a CommitReply");
        }
        if (ret)
                *ret = (struct tier_commit) {
                        .step = resp->commit->step,
                        .rolled_back = resp->commit->rolled_back,
                        .lost = resp->commit->lost,
                        .committed = resp->commit->committed,
                };
        packet_done(&p);
        return 0;
}

_public_ int tier_job_commit(tier_client *c, uint64_t step) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__JobCommit op = TIER__JOB_COMMIT__INIT;

        if (!c)
                return -EINVAL;
        op.step = step;
        req.op_case = TIER__REQUEST__OP_COMMIT;
        req.commit = &op;
        return commit_call(c, &req, NULL);
}

_public_ int tier_job_rollback(tier_client *c, struct tier_commit *ret) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__JobRollback op = TIER__JOB_ROLLBACK__INIT;

        if (!c)
                return -EINVAL;
        if (!ret)
                return client_error(c, -EINVAL, "ret is NULL: tier_job_rollback() needs somewhere to store "
                                    "what it rolled back");
        req.op_case = TIER__REQUEST__OP_ROLLBACK;
        req.rollback = &op;
        return commit_call(c, &req, ret);
}
