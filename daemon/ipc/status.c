/* SPDX-License-Identifier: MIT */
/* status.c: the daemon's state as a StatusReply message (tierctl status). */

/*
 * Theory of operation: a snapshot built on demand from the books (the
 * registry), the engine's link counters, the NVMe targets and each job's
 * plans (Job.plans).  Everything is allocated in one arena-like pass and
 * freed with status_free(); strings point into daemon-owned memory that
 * outlives the reply (it is packed before the handler returns).  A reply
 * too large for one packet travels as a sealed memfd (status_reply()).
 */

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/base/config.h"
#include "daemon/engine/engine.h"
#include "daemon/ipc/conn.h"
#include "daemon/ipc/rpc.h"
#include "daemon/ipc/server.h"
#include "daemon/ipc/status.h"
#include "daemon/sched/plan.h"
#include "daemon/state/registry.h"
#include "daemon/state/wear.h"
#include "daemon/tiers/segpool.h"
#include "daemon/tiers/tier-nvme.h"
#include "daemon/tiers/vram.h"
#include "proto/macro.h"
#include "tier.pb-c.h"
#include "util/time-util.h"
#include "util/uring.h"

/* A status reply bigger than this goes through a memfd. */
#define STATUS_INLINE_MAX (48u << 10)

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
        Tier__LinkStatus *jlinks;
        Tier__LinkStatus **jlinkp;
        Tier__SmartStatus *smart;
        Tier__SchedStatus sched;
} StatusBuf;

/* How old a target's SMART figures may be before a status reads them again (an ioctl per drive). */
#define STATUS_SMART_MAX_AGE_USEC (10ull * 1000000ull)

static unsigned list_length(const List *l) {
        unsigned n = 0;

        list_for_each_safe(node, tmp, l)
                n++;
        return n;
}

/* The transfer engine and its queues now. */
static void sched_status(const Rpc *r, Tier__SchedStatus *s) {
        const Engine *e = r->engine;
        unsigned queued = 0, inflight = 0;

        tier__sched_status__init(s);
        s->transfers = e->n_xfers;
        s->engine_runs = e->runs;
        s->ops = list_length(&e->ops);
        s->run_queue = list_length(&e->run_queue);
        s->space_waiters = list_length(&e->space_waiters);
        if (e->uring)
                uring_counts(e->uring, &queued, &inflight);
        s->nvme_queued = queued;
        s->nvme_in_flight = inflight;
        for (int d = 0; d < 2; d++) {
                s->vram_queued += list_length(&e->vlink.waiting[d]);
                s->vram_in_flight += e->vlink.active[d];
        }
}

/* Bytes of the pool's segments that jobs hold (their tensors take `used` of it). */
static uint64_t held_bytes(const SegPool *p) {
        uint64_t n = 0;

        for (uint32_t i = 0; i < p->n_segs; i++)
                if (p->segs[i].owner)
                        n += p->seg_size;
        return n;
}

/* Plans of all jobs together (each plan is one rank's connection). */
static size_t count_plans(const Registry *reg) {
        size_t n = 0;

        list_for_each_safe(node, tmp, &reg->jobs) {
                Job *j = list_entry(node, Job, link);

                list_for_each_safe(pn, ptmp, &j->plans)
                        n++;
        }
        return n;
}

int status_build(const Rpc *r, Tier__StatusReply **ret) {
        const Registry *reg = r->registry;
        const Engine *e = r->engine;
        NvmeTier *n = r->nvme;
        size_t ji = 0, np = 0, n_plans = count_plans(reg);
        StatusBuf *b;

        b = calloc(1, sizeof(*b));
        if (!b)
                return -ENOMEM;
        b->targets = calloc(n->n_targets, sizeof(Tier__TargetStatus));
        b->targetp = calloc(n->n_targets, sizeof(void *));
        b->smart = calloc(n->n_targets, sizeof(Tier__SmartStatus));
        b->jobs = calloc(reg->n_jobs + 1, sizeof(Tier__JobStatus));
        b->jobp = calloc(reg->n_jobs + 1, sizeof(void *));
        b->usage = calloc((reg->n_jobs + 1) * TIERS, sizeof(Tier__JobTierUsage));
        b->usagep = calloc((reg->n_jobs + 1) * TIERS, sizeof(void *));
        b->plans = calloc(n_plans + 1, sizeof(Tier__PlanStatus));
        b->planp = calloc(n_plans + 1, sizeof(void *));
        b->plinks = calloc((n_plans + 1) * _LINK_MAX, sizeof(Tier__LinkStatus));
        b->plinkp = calloc((n_plans + 1) * _LINK_MAX, sizeof(void *));
        b->jlinks = calloc((reg->n_jobs + 1) * _LINK_MAX, sizeof(Tier__LinkStatus));
        b->jlinkp = calloc((reg->n_jobs + 1) * _LINK_MAX, sizeof(void *));
        if (!b->targets || !b->targetp || !b->smart || !b->jobs || !b->jobp || !b->usage || !b->usagep ||
            !b->plans || !b->planp || !b->plinks || !b->plinkp || !b->jlinks || !b->jlinkp) {
                status_free(&b->sr);
                return -ENOMEM;
        }

        tier__status_reply__init(&b->sr);
        b->sr.version = (char *) TIERD_VERSION;
        b->sr.uptime_s = (double) (now_usec() - r->start_usec) / 1e6;
        b->sr.connections = server_n_conns(r->server);
        b->sr.policy = (char *) sched_policy_to_string(r->config->sched_policy);

        for (int i = 0; i < TIERS; i++) {
                Tier__TierStatus *t = &b->tiers[i];

                tier__tier_status__init(t);
                t->tier = (Tier__Tier) i;
                t->backend = (char *) (i == LEVEL_VRAM ? r->vram->ops->name : i == LEVEL_HOST ? "memfd" : "o_direct");
                t->capacity = reg->capacity[i];
                t->used = reg->used[i];
                t->pinned = reg->pinned[i];
                t->segment_size = i == LEVEL_NVME ? n->extent_size : reg->pools[i]->seg_size;
                t->held = i == LEVEL_NVME ? reg->used[i] : held_bytes(reg->pools[i]);
                t->bandwidth = i == LEVEL_VRAM ? r->config->vram_bandwidth :
                               i == LEVEL_NVME ? r->config->nvme_bandwidth : 0;
                t->renewing = i == LEVEL_NVME ? 0 : reg->pools[i]->n_renewing;
                t->reserved = i == LEVEL_NVME ? nvme_kept(reg, NULL, NULL, 0) : 0;
                b->tierp[i] = t;
        }
        b->sr.n_tiers = TIERS;
        b->sr.tiers = b->tierp;

        for (int i = 0; i < _LINK_MAX; i++) {
                Tier__LinkStatus *l = &b->links[i];

                tier__link_status__init(l);
                l->name = (char *) link_to_string((LinkDir) i);
                l->bytes = e->links[i].bytes;
                l->ops = e->links[i].ops;
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
                t->wear_written = tg->wear_base + tg->bytes_written;
                nvme_smart_refresh(tg, now_usec(), STATUS_SMART_MAX_AGE_USEC);
                t->smart_device = tg->smart_ctrl;
                t->smart_na = tg->smart_na;
                if (!tg->smart_na[0]) {
                        Tier__SmartStatus *s = &b->smart[i];

                        tier__smart_status__init(s);
                        s->data_units_written = tg->smart.data_units_written;
                        s->percentage_used = tg->smart.percentage_used;
                        s->critical_warning = tg->smart.critical_warning;
                        s->temperature_k = tg->smart.temperature_k;
                        s->age_s = (double) (now_usec() - tg->smart_usec) / 1e6;
                        t->smart = s;
                }
                b->targetp[i] = t;
        }
        b->sr.n_targets = n->n_targets;
        b->sr.targets = b->targetp;
        sched_status(r, &b->sched);
        b->sr.sched = &b->sched;

        list_for_each_safe(node, tmp, &reg->jobs) {
                Job *j = list_entry(node, Job, link);
                Tier__JobStatus *js = &b->jobs[ji];

                if (ji >= reg->n_jobs)
                        break;
                tier__job_status__init(js);
                js->id = j->id;
                js->name = j->name;
                js->uid = (uint32_t) j->uid;
                js->connections = j->n_conns;
                js->lingering = j->n_conns == 0 && j->linger_until > 0;
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
                        u->tensor_max = job_tensor_max(j, i);
                        u->guarantee = j->guarantee[i];
                        u->reserved = i == LEVEL_NVME && job_claims_room(j) ? nvme_unused_guarantee(j) : 0;
                        u->share = i == LEVEL_NVME ? j->limit[i] : engine_job_share(e, j, i);
                        b->usagep[ji * TIERS + (size_t) i] = u;
                }
                js->n_usage = TIERS;
                js->usage = &b->usagep[ji * TIERS];
                js->weight = j->weight;
                js->nvme_written = j->nvme_written;
                js->nvme_host_changed = j->nvme_host_changed;
                js->nvme_crc_errors = j->nvme_crc_errors;
                js->plan_iterations = j->plan_iterations;
                js->plan_stall_s = (double) j->plan_stall_ns / 1e9;
                js->wear_written = wear_job_written(reg->wear, reg, j);
                for (int l = 0; l < _LINK_MAX; l++) {
                        Tier__LinkStatus *ls = &b->jlinks[ji * _LINK_MAX + (size_t) l];

                        tier__link_status__init(ls);
                        ls->name = (char *) link_to_string((LinkDir) l);
                        ls->bytes = j->link_bytes[l];
                        b->jlinkp[ji * _LINK_MAX + (size_t) l] = ls;
                }
                js->n_moved = _LINK_MAX;
                js->moved = &b->jlinkp[ji * _LINK_MAX];
                /* the plans of its ranks */
                list_for_each_safe(pn, ptmp, &j->plans) {
                        Plan *p = list_entry(pn, Plan, job_link);
                        Tier__PlanStatus *ps;
                        PlanStats st;

                        if (np >= n_plans)
                                break;
                        ps = &b->plans[np];
                        tier__plan_status__init(ps);
                        plan_stats(p, &st);
                        ps->phase = st.phase;
                        ps->phases = st.phases;
                        ps->iterations = st.iterations;
                        ps->step_s = st.step_s;
                        ps->stall_s = st.stall_s;
                        ps->last_step_s = st.last_step_s;
                        ps->stall_total_s = st.stall_total_s;
                        ps->rank = p->rank;
                        ps->connection = p->conn_id;
                        ps->rank_shared = p->rank_shared;
                        ps->waiting = (char *) (plan_waiting(p) ? plan_waiting(p) : "");
                        for (int l = 0; l < _LINK_MAX; l++) {
                                Tier__LinkStatus *ls = &b->plinks[np * _LINK_MAX + (size_t) l];

                                tier__link_status__init(ls);
                                ls->name = (char *) link_to_string((LinkDir) l);
                                ls->bytes = p->last_step_links[l];
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
        free(b->smart);
        free(b->jobs);
        free(b->jobp);
        free(b->usage);
        free(b->usagep);
        free(b->plans);
        free(b->planp);
        free(b->plinks);
        free(b->plinkp);
        free(b->jlinks);
        free(b->jlinkp);
        free(b);
}

/* @sr packed into a sealed memfd; the fd, or -errno. */
static int status_to_memfd(const Tier__StatusReply *sr) {
        _cleanup_close_ int fd = memfd_create("tierd-status", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        _cleanup_free_ uint8_t *buf = NULL;
        size_t len = tier__status_reply__get_packed_size(sr);

        if (fd < 0)
                return negative_errno();
        buf = malloc(len ? len : 1);
        if (!buf)
                return -ENOMEM;
        tier__status_reply__pack(sr, buf);
        if (write(fd, buf, len) != (ssize_t) len)
                return -EIO;
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
                return negative_errno();
        return TAKE_FD(fd);
}

int status_send(Conn *c, uint64_t seq, Tier__StatusReply *sr) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        _cleanup_close_ int fd = -1;

        resp.seq = seq;
        if (tier__status_reply__get_packed_size(sr) <= STATUS_INLINE_MAX) {
                resp.result_case = TIER__RESPONSE__RESULT_STATUS_REPLY;
                resp.status_reply = sr;
                return conn_send_response(c, &resp, NULL, 0, false);
        }
        /* large dumps travel as a sealed memfd */
        fd = status_to_memfd(sr);
        if (fd < 0) {
                resp.status = fd;
                resp.error = (char *) "cannot write the status into a memfd";
                return conn_send_response(c, &resp, NULL, 0, false);
        }
        resp.result_case = TIER__RESPONSE__RESULT_STATUS_FD;
        resp.status_fd = 0;
        return conn_send_response(c, &resp, &fd, 1, false);
}
