/* SPDX-License-Identifier: MIT */
/* status.c: the daemon's state as a StatusReply message (tierctl status). */

/*
 * Theory of operation: a snapshot built on demand from the manager's
 * counters.  Everything is allocated in one arena-like pass and freed with
 * status_free(); strings point into daemon-owned memory that outlives the
 * reply (it is packed before the handler returns).
 */

#include <errno.h>
#include <stdlib.h>

#include "daemon/core/manager.h"
#include "daemon/ipc/server.h"
#include "daemon/ipc/status.h"
#include "daemon/sched/timeline.h"
#include "daemon/tiers/tier-nvme.h"
#include "daemon/tiers/vram.h"
#include "proto/macro.h"
#include "tier.pb-c.h"

typedef struct StatusBuf {
        Tier__StatusReply sr;
        Tier__TierStatus tiers[TIERS];
        Tier__TierStatus *tierp[TIERS];
        Tier__LinkStatus links[_LINK_MAX];
        Tier__LinkStatus *linkp[_LINK_MAX];
        Tier__TargetStatus *targets;
        Tier__TargetStatus **targetp;
        Tier__JobStatus *jobs;
        Tier__JobStatus **jobp;
        Tier__JobTierUsage *usage;
        Tier__JobTierUsage **usagep;
        Tier__PlanStatus *plans;
        Tier__PlanStatus **planp;
        Tier__LinkStatus *plinks;
        Tier__LinkStatus **plinkp;
} StatusBuf;

int status_build(Manager *m, Tier__StatusReply **ret) {
        StatusBuf *b;
        NvmeTier *n = m->nvme;
        size_t ji = 0, np = 0;

        b = calloc(1, sizeof(*b));
        if (!b)
                return -ENOMEM;
        b->targets = calloc(n->n_targets, sizeof(Tier__TargetStatus));
        b->targetp = calloc(n->n_targets, sizeof(void *));
        b->jobs = calloc(m->n_jobs + 1, sizeof(Tier__JobStatus));
        b->jobp = calloc(m->n_jobs + 1, sizeof(void *));
        b->usage = calloc((m->n_jobs + 1) * TIERS, sizeof(Tier__JobTierUsage));
        b->usagep = calloc((m->n_jobs + 1) * TIERS, sizeof(void *));
        {
                unsigned n_conns = server_n_conns(m->server) + 1;

                b->plans = calloc(n_conns, sizeof(Tier__PlanStatus));
                b->planp = calloc(n_conns, sizeof(void *));
                b->plinks = calloc(n_conns * _LINK_MAX, sizeof(Tier__LinkStatus));
                b->plinkp = calloc(n_conns * _LINK_MAX, sizeof(void *));
        }
        if (!b->targets || !b->targetp || !b->jobs || !b->jobp || !b->usage || !b->usagep ||
            !b->plans || !b->planp || !b->plinks || !b->plinkp) {
                status_free(&b->sr);
                return -ENOMEM;
        }

        tier__status_reply__init(&b->sr);
        b->sr.version = (char *) TIERD_VERSION;
        b->sr.uptime_s = (double) (now_usec() - m->start_usec) / 1e6;
        b->sr.connections = server_n_conns(m->server);
        b->sr.policy = (char *) sched_policy_to_string(m->config.sched_policy);

        for (int i = 0; i < TIERS; i++) {
                Tier__TierStatus *t = &b->tiers[i];

                tier__tier_status__init(t);
                t->tier = (Tier__Tier) i;
                t->backend = (char *) (i == TIER_VRAM ? m->vram->ops->name : i == TIER_HOST ? "memfd" : "o_direct");
                t->capacity = m->capacity[i];
                t->used = m->used[i];
                t->pinned = m->pinned[i];
                b->tierp[i] = t;
        }
        b->sr.n_tiers = TIERS;
        b->sr.tiers = b->tierp;

        for (int i = 0; i < _LINK_MAX; i++) {
                Tier__LinkStatus *l = &b->links[i];

                tier__link_status__init(l);
                l->name = (char *) link_name((LinkDir) i);
                l->bytes = m->links[i].bytes;
                l->ops = m->links[i].ops;
                b->linkp[i] = l;
        }
        b->sr.n_links = _LINK_MAX;
        b->sr.links = b->linkp;

        for (unsigned i = 0; i < n->n_targets; i++) {
                Tier__TargetStatus *t = &b->targets[i];
                NvmeTarget *tg = &n->targets[i];

                tier__target_status__init(t);
                t->path = tg->path;
                t->capacity = tg->size;
                t->used = (tg->extents.n_units - tg->extents.n_free) * n->extent_size;
                t->bytes_written = tg->bytes_written;
                t->bytes_read = tg->bytes_read;
                t->crc_errors = tg->crc_errors;
                t->io_errors = tg->io_errors;
                b->targetp[i] = t;
        }
        b->sr.n_targets = n->n_targets;
        b->sr.targets = b->targetp;

        list_for_each_safe(node, tmp, &m->jobs) {
                Job *j = list_entry(node, Job, link);
                Tier__JobStatus *js = &b->jobs[ji];

                if (ji >= m->n_jobs)
                        break;
                tier__job_status__init(js);
                js->id = j->id;
                js->name = j->name;
                js->uid = (uint32_t) j->uid;
                js->connections = j->n_conns;
                js->tensors = j->n_tensors;
                if (j->linger_until > 0) {
                        uint64_t now = now_usec();
                        js->linger_left_s = j->linger_until > now ? (double) (j->linger_until - now) / 1e6 : 0;
                }
                for (int i = 0; i < TIERS; i++) {
                        Tier__JobTierUsage *u = &b->usage[ji * TIERS + (size_t) i];

                        tier__job_tier_usage__init(u);
                        u->tier = (Tier__Tier) i;
                        u->used = j->used[i];
                        u->limit = j->limit[i];
                        u->pinned = j->pinned[i];
                        b->usagep[ji * TIERS + (size_t) i] = u;
                }
                js->n_usage = TIERS;
                js->usage = &b->usagep[ji * TIERS];
                js->weight = j->weight;
                /* the plans of its ranks */
                                list_for_each_safe(cn, ctmp, server_conns(m->server)) {
                        Conn *c = list_entry(cn, Conn, link);
                        Tier__PlanStatus *ps;

                        if (c->job != j || !c->plan || np >= server_n_conns(m->server))
                                continue;
                        ps = &b->plans[np];
                        tier__plan_status__init(ps);
                        plan_status(c->plan, ps);
                        for (int l = 0; l < _LINK_MAX; l++) {
                                Tier__LinkStatus *ls = &b->plinks[np * _LINK_MAX + (size_t) l];

                                tier__link_status__init(ls);
                                ls->name = (char *) link_name((LinkDir) l);
                                ls->bytes = c->plan->last_step_links[l];
                                b->plinkp[np * _LINK_MAX + (size_t) l] = ls;
                        }
                        ps->n_step_links = _LINK_MAX;
                        ps->step_links = &b->plinkp[np * _LINK_MAX];
                        b->planp[np] = ps;
                        if (js->n_plans == 0)
                                js->plans = &b->planp[np];
                        js->n_plans++;
                        np++;
                }
                b->jobp[ji] = js;
                ji++;
        }
        b->sr.n_jobs = ji;
        b->sr.jobs = b->jobp;

        *ret = &b->sr;
        return 0;
}

void status_free(Tier__StatusReply *sr) {
        StatusBuf *b;

        if (!sr)
                return;
        b = container_of(sr, StatusBuf, sr);
        free(b->targets);
        free(b->targetp);
        free(b->jobs);
        free(b->jobp);
        free(b->usage);
        free(b->usagep);
        free(b->plans);
        free(b->planp);
        free(b->plinks);
        free(b->plinkp);
        free(b);
}
