/* SPDX-License-Identifier: MIT */
/* jobs.c: job control for tierctl: list jobs and a job's tensors, evict a job, detach it. */

/*
 * Theory of operation
 *
 * tier_job_list() reads the jobs out of tierd's status (status_fetch()).  The
 * others are one request each (JobTensors, JobEvict, JobDetach), which
 * tierd answers on a control connection as on a job's; tierd decides who
 * may (the job's uid, root, group tier-admin) and says why not.
 *
 * The lists come back as one malloc()ed block: the array of entries, then
 * their names, so that one free() releases everything.  tier_job_tensors()
 * asks page after page (tierd bounds each reply) and gives up beyond
 * CLIENT_JOB_TENSORS_MAX entries, the most tierd's max_tensors allows.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <tier.h>

#include "client/client-internal.h"
#include "client/tier-private.h"
#include "proto/macro.h"
#include "proto/tier.pb-c.h"

/* Tensors one listing holds at most: tierd's largest max_tensors. */
#define CLIENT_JOB_TENSORS_MAX (1024u * 1024u)

/* Entries of @size bytes each plus their names (@names_len bytes, NULs included) in one block. */
static void *block_new(size_t n, size_t size, size_t names_len) {
        if (n > SIZE_MAX / size || names_len > SIZE_MAX - n * size - 1)
                return NULL;
        return calloc(1, n * size + names_len + 1);
}

/* ---- jobs ---------------------------------------------------------------------------- */

typedef struct JobsOut {
        tier_client *client;
        struct tier_job_info *jobs;
        size_t n;
} JobsOut;

static const Tier__JobTierUsage *usage_of(const Tier__JobStatus *j, int tier) {
        for (size_t i = 0; i < j->n_usage; i++)
                if (j->usage[i] && (int) j->usage[i]->tier == tier)
                        return j->usage[i];
        return NULL;
}

static int use_jobs(const Tier__StatusReply *sr, void *userdata) {
        JobsOut *o = userdata;
        size_t names = 0, n = 0;
        char *p;

        for (size_t i = 0; i < sr->n_jobs; i++)
                if (sr->jobs[i]) {
                        names += strlen(sr->jobs[i]->name ? sr->jobs[i]->name : "") + 1;
                        n++;
                }
        o->jobs = block_new(n, sizeof(struct tier_job_info), names);
        if (!o->jobs)
                return client_error(o->client, -ENOMEM, "out of memory listing %zu jobs", n);
        p = (char *) (o->jobs + n);
        for (size_t i = 0; i < sr->n_jobs; i++) {
                const Tier__JobStatus *j = sr->jobs[i];
                struct tier_job_info *ji = &o->jobs[o->n];
                const char *name = j && j->name ? j->name : "";

                if (!j)
                        continue;
                ji->id = j->id;
                ji->name = strcpy(p, name);
                p += strlen(name) + 1;
                ji->uid = j->uid;
                ji->connections = j->connections;
                ji->tensors = j->tensors;
                ji->weight = j->weight;
                ji->lingering = j->lingering;
                ji->linger_left_s = j->linger_left_s;
                for (int t = 0; t < TIER_LEVEL_MAX; t++) {
                        const Tier__JobTierUsage *u = usage_of(j, t);

                        ji->used[t] = u ? u->used : 0;
                        ji->limit[t] = u ? u->limit : 0;
                        ji->pinned[t] = u ? u->pinned : 0;
                }
                o->n++;
        }
        return 0;
}

_public_ int tier_job_list(tier_client *c, struct tier_job_info **ret, size_t *ret_n) {
        JobsOut o = { .client = c };
        int r;

        if (!c)
                return -EINVAL;
        if (!ret || !ret_n)
                return client_error(c, -EINVAL, "ret or ret_n is NULL: there is nowhere to store the jobs");
        r = status_fetch(c, use_jobs, &o);
        if (r < 0) {
                free(o.jobs);
                return r;
        }
        *ret = o.jobs;
        *ret_n = o.n;
        return 0;
}

/* ---- a job's tensors ------------------------------------------------------------------- */

static int check_job(tier_client *c, const char *job) {
        if (!c)
                return -EINVAL;
        if (!job || !name_valid(job))
                return name_refusal(c->last_error, sizeof(c->last_error), "job", job);
        return 0;
}

static int copy_state_from_string(const char *s) {
        static const char *const names[] = { "absent", "filling", "resident", "draining" };

        for (int i = 0; i < (int) ELEMENTSOF(names); i++)
                if (s && strcmp(s, names[i]) == 0)
                        return i;
        return -1;
}

/* TensorEntry.state: TIER_TENSOR_UNKNOWN for none (an older tierd) or one this libtier does not know. */
static int tensor_state_from_string(const char *s) {
        static const char *const names[] = {
                [TIER_TENSOR_DATA] = "data",
                [TIER_TENSOR_UNWRITTEN] = "unwritten",
                [TIER_TENSOR_DEAD] = "dead",
                [TIER_TENSOR_LOST] = "lost",
        };

        for (int i = TIER_TENSOR_DATA; i < (int) ELEMENTSOF(names); i++)
                if (s && strcmp(s, names[i]) == 0)
                        return i;
        return TIER_TENSOR_UNKNOWN;
}

typedef struct TensorList {
        struct tier_tensor_info *v;     /* names strdup()ed, until packed */
        size_t n, cap;
        size_t names;
} TensorList;

static void tensor_list_done(TensorList *l) {
        for (size_t i = 0; i < l->n; i++) {
                free((char *) l->v[i].name);
                free((char *) l->v[i].lost_why);
        }
        free(l->v);
        *l = (TensorList) {};
}

/* The longest name taken from tierd (its max_name is at most 4095 bytes). */
#define CLIENT_NAME_BYTES_MAX 4096

static int tensor_list_add(TensorList *l, const Tier__TensorEntry *e) {
        struct tier_tensor_info *ti;

        if (l->n == l->cap) {
                size_t cap = l->cap ? l->cap * 2 : 64;
                struct tier_tensor_info *v = reallocarray(l->v, cap, sizeof(*v));

                if (!v)
                        return -ENOMEM;
                l->v = v;
                l->cap = cap;
        }
        ti = &l->v[l->n];
        memset(ti, 0, sizeof(*ti));
        ti->name = strndup(e->name ? e->name : "", CLIENT_NAME_BYTES_MAX);
        if (!ti->name)
                return -ENOMEM;
        ti->id = e->tensor;
        ti->size = e->size;
        ti->used = e->used;
        ti->idle_s = e->idle_s;
        ti->state = tensor_state_from_string(e->state);
        if (ti->state == TIER_TENSOR_LOST) {
                ti->lost_why = strndup(e->lost_why && *e->lost_why ? e->lost_why : "tierd did not say why",
                                       CLIENT_NAME_BYTES_MAX);
                if (!ti->lost_why) {
                        free((char *) ti->name);
                        return -ENOMEM;
                }
                l->names += strlen(ti->lost_why) + 1;
        }
        for (int t = 0; t < TIER_LEVEL_MAX; t++)
                ti->copy[t].state = -1;
        for (size_t k = 0; k < e->n_copies && k < TIER_LEVEL_MAX; k++) {
                const Tier__CopyState *cs = e->copies[k];

                if (!cs || (int) cs->tier < 0 || (int) cs->tier >= TIER_LEVEL_MAX)
                        continue;
                ti->copy[cs->tier].state = copy_state_from_string(cs->state);
                ti->copy[cs->tier].valid = cs->valid;
                ti->copy[cs->tier].dirty = cs->dirty;
                ti->copy[cs->tier].pins = cs->pins;
        }
        l->names += strlen(ti->name) + 1;
        l->n++;
        return 0;
}

/* The list packed into one block, the names after the entries. */
static int tensor_list_pack(TensorList *l, struct tier_tensor_info **ret) {
        struct tier_tensor_info *b = block_new(l->n, sizeof(*b), l->names);
        char *p;

        if (!b)
                return -ENOMEM;
        p = (char *) (b + l->n);
        for (size_t i = 0; i < l->n; i++) {
                b[i] = l->v[i];
                b[i].name = strcpy(p, l->v[i].name);
                p += strlen(p) + 1;
                if (l->v[i].lost_why) {
                        b[i].lost_why = strcpy(p, l->v[i].lost_why);
                        p += strlen(p) + 1;
                }
        }
        *ret = b;
        return 0;
}

_public_ int tier_job_tensors(tier_client *c, const char *job, struct tier_tensor_info **ret, size_t *ret_n) {
        TensorList l = {};
        uint32_t offset = 0;
        int r;

        r = check_job(c, job);
        if (r < 0)
                return r;
        if (!ret || !ret_n)
                return client_error(c, -EINVAL, "ret or ret_n is NULL: there is nowhere to store the tensors");
        for (;;) {
                Tier__Request req = TIER__REQUEST__INIT;
                Tier__JobTensors q = TIER__JOB_TENSORS__INIT;
                Packet p = PACKET_NULL;
                const Tier__TensorsReply *tr;

                q.job = (char *) job;
                q.offset = offset;
                req.op_case = TIER__REQUEST__OP_JOB_TENSORS;
                req.job_tensors = &q;
                r = transport_call(c, &req, &p);
                if (r < 0)
                        goto fail;
                r = transport_expect(c, &p, TIER__RESPONSE__RESULT_TENSORS, "the tensors request");
                if (r < 0)
                        goto fail;
                tr = p.reply->response->tensors;
                if (!tr || tr->offset != offset) {
                        packet_done(&p);
                        r = client_error(c, -EPROTO, "tierd answered the tensors request with a wrong page");
                        goto fail;
                }
                for (size_t i = 0; i < tr->n_tensors && r >= 0; i++)
                        r = tr->tensors[i] ? tensor_list_add(&l, tr->tensors[i]) : 0;
                offset += (uint32_t) tr->n_tensors;
                /* done when tierd has nothing more (the job may have shrunk meanwhile) */
                bool done = tr->n_tensors == 0 || offset >= tr->total;
                packet_done(&p);
                if (r < 0) {
                        r = client_error(c, r, "out of memory listing the tensors of job '%s'", job);
                        goto fail;
                }
                if (l.n > CLIENT_JOB_TENSORS_MAX) {
                        r = client_error(c, -EFBIG, "job '%s' lists more than %u tensors", job,
                                         CLIENT_JOB_TENSORS_MAX);
                        goto fail;
                }
                /* names are bounded each (no tierd allows longer ones) and together: a tierd that sends
                 * pages of long names does not make the client hold without end */
                if (l.names > (size_t) CLIENT_JOB_TENSORS_MAX * 64) {
                        r = client_error(c, -EFBIG, "job '%s' lists more than %zu bytes of tensor names", job,
                                         (size_t) CLIENT_JOB_TENSORS_MAX * 64);
                        goto fail;
                }
                if (done)
                        break;
        }
        r = tensor_list_pack(&l, ret);
        if (r < 0) {
                r = client_error(c, r, "out of memory listing the %zu tensors of job '%s'", l.n, job);
                goto fail;
        }
        *ret_n = l.n;
        tensor_list_done(&l);
        return 0;
fail:
        tensor_list_done(&l);
        return r;
}

/* ---- evict, detach ---------------------------------------------------------------------- */

_public_ int tier_job_evict(tier_client *c, const char *job, int tier, struct tier_evict_result *ret) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__JobEvict q = TIER__JOB_EVICT__INIT;
        const Tier__EvictReply *er;
        Packet p = PACKET_NULL;
        int r;

        r = check_job(c, job);
        if (r < 0)
                return r;
        if (tier != TIER_HOST && tier != TIER_NVME)
                return client_error(c, -EINVAL, "a job is evicted down to host or nvme");
        q.job = (char *) job;
        q.tier = (Tier__Tier) tier;
        req.op_case = TIER__REQUEST__OP_JOB_EVICT;
        req.job_evict = &q;
        r = transport_call(c, &req, &p);
        if (r < 0)
                return r;
        r = transport_expect(c, &p, TIER__RESPONSE__RESULT_EVICT, "the evict request");
        if (r < 0)
                return r;
        er = p.reply->response->evict;
        if (ret) {
                memset(ret, 0, sizeof(*ret));
                ret->evicted = er->evicted;
                ret->pinned = er->pinned;
                ret->failed = er->failed;
                ret->bytes_written = er->bytes_written;
                ret->bytes_dropped = er->bytes_dropped;
                ret->pinned_bytes = er->pinned_bytes;
        }
        if (er->failed > 0)
                (void) client_error(c, 0, "%u tensor(s) failed, the first: %s", er->failed,
                                    er->error && *er->error ? er->error : "no reason given");
        packet_done(&p);
        return 0;
}

_public_ int tier_job_detach(tier_client *c, const char *job, struct tier_detach_result *ret) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__JobDetach q = TIER__JOB_DETACH__INIT;
        const Tier__DetachReply *dr;
        Packet p = PACKET_NULL;
        int r;

        r = check_job(c, job);
        if (r < 0)
                return r;
        q.job = (char *) job;
        req.op_case = TIER__REQUEST__OP_JOB_DETACH;
        req.job_detach = &q;
        r = transport_call(c, &req, &p);
        if (r < 0)
                return r;
        r = transport_expect(c, &p, TIER__RESPONSE__RESULT_DETACH, "the detach request");
        if (r < 0)
                return r;
        dr = p.reply->response->detach;
        if (ret) {
                memset(ret, 0, sizeof(*ret));
                ret->job_id = dr->job_id;
                ret->connections = dr->connections;
                ret->tensors = dr->tensors;
                for (size_t i = 0; i < dr->n_freed && i < TIER_LEVEL_MAX; i++)
                        ret->freed[i] = dr->freed[i];
        }
        packet_done(&p);
        return 0;
}
