/* SPDX-License-Identifier: MIT */
/* metrics.c: the daemon's status in the Prometheus text exposition format. */

/*
 * Theory of operation: the metrics are the status (status.c's StatusReply,
 * the same snapshot `tierctl status --json` shows) written as the
 * Prometheus text exposition format, version 0.0.4: for each metric family
 * a "# HELP" and a "# TYPE" line, then its samples, one a line, families
 * never interleaved.  Names start with "tierd_", carry their base unit
 * (_bytes, _seconds, _ratio, _celsius) and counters end in "_total"; label
 * values are escaped (backslash, double quote, newline), so any job name or
 * path is safe.  A job is labelled job_name, not job: "job" and "instance"
 * are the labels Prometheus itself sets on every scraped series.  A counter
 * never goes down while tierd lives: a job's are labelled job_id as well
 * (job_labels()), and a plan's figures, which start again with each plan,
 * are gauges beside the job's counters of all its plans.
 *
 * Two ways out: a client asks with StatusRequest.prometheus (tierctl status
 * --prometheus; metrics_reply()), or tierd writes the text to a file for
 * node_exporter's textfile collector ([metrics] textfile, core/monitor.c).
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/ipc/conn.h"
#include "daemon/ipc/metrics.h"
#include "daemon/ipc/status.h"
#include "util/escape.h"
#include "proto/macro.h"
#include "tier.pb-c.h"

/* Text larger than this goes through a memfd (a packet holds max_message, at least 1 KiB... 64 KiB by default). */
#define METRICS_INLINE_MAX (48u << 10)

static const char *const tier_names[] = { "vram", "host", "nvme" };

static const char *tier_name(Tier__Tier t) {
        return (unsigned) t < ELEMENTSOF(tier_names) ? tier_names[t] : "unknown";
}

static const char *str(const char *s) {
        return s ? s : "";
}

/* The uint64_t field at byte @offset of a status record (offsetof of a uint64_t member). */
static uint64_t field_u64(const void *base, size_t offset) {
        uint64_t v;

        memcpy(&v, (const uint8_t *) base + offset, sizeof(v));
        return v;
}

static void family(FILE *f, const char *name, const char *type, const char *help) {
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/*
 * A label value between double quotes, escaped as the format requires (\\,
 * \" and \n, its only escapes).  It must be UTF-8 and should hold no other
 * control character: those and the bidirectional format characters (from a
 * name an older tierd let in) and bytes that are not UTF-8 are written as
 * util/escape.c's text, backslash escaped: the
 * value reads back as "evil\u009b31m", the name tierd restores such a job
 * under (and tierctl prints).
 */
static void label_value(FILE *f, const char *v) {
        fputc('"', f);
        while (*v) {
                char one[TEXT_ESCAPE_CHAR_MAX];
                size_t in, len;

                if (*v == '\\' || *v == '"' || *v == '\n') {
                        fputs(*v == '\\' ? "\\\\" : *v == '"' ? "\\\"" : "\\n", f);
                        v++;
                        continue;
                }
                len = text_escape_char(v, one, &in, NULL);
                for (size_t k = 0; k < len; k++) {
                        if (one[k] == '\\')
                                fputc('\\', f);     /* the escape's own backslash */
                        fputc(one[k], f);
                }
                v += in;
        }
        fputc('"', f);
}

/* NAME{k="v",...}: @labels are key, value pairs ending with NULL. */
static void series(FILE *f, const char *name, const char *const *labels) {
        fputs(name, f);
        if (labels && labels[0]) {
                fputc('{', f);
                for (size_t i = 0; labels[i]; i += 2) {
                        fprintf(f, "%s%s=", i ? "," : "", labels[i]);
                        label_value(f, str(labels[i + 1]));
                }
                fputc('}', f);
        }
}

static void sample_u64(FILE *f, const char *name, const char *const *labels, uint64_t v) {
        series(f, name, labels);
        fprintf(f, " %" PRIu64 "\n", v);
}

static void sample_double(FILE *f, const char *name, const char *const *labels, double v) {
        series(f, name, labels);
        if (isnan(v))
                fputs(" NaN\n", f);
        else if (isinf(v))
                fputs(v > 0 ? " +Inf\n" : " -Inf\n", f);
        else
                fprintf(f, " %.9g\n", v);
}

#define LABELS(...) ((const char *const[]) { __VA_ARGS__, NULL })

static void render_daemon(FILE *f, const Tier__StatusReply *s) {
        family(f, "tierd_build_info", "gauge", "tierd's version and scheduling policy (always 1).");
        sample_u64(f, "tierd_build_info", LABELS("version", str(s->version), "policy", str(s->policy)), 1);
        family(f, "tierd_uptime_seconds", "gauge", "Seconds since tierd started.");
        sample_double(f, "tierd_uptime_seconds", NULL, s->uptime_s);
        family(f, "tierd_connections", "gauge", "Client connections, not counting the tierctl that asks (the same as its status shows).");
        sample_u64(f, "tierd_connections", NULL, s->connections);
}

static void render_tiers(FILE *f, const Tier__StatusReply *s) {
        static const struct {
                const char *name, *help;
                size_t offset;
        } fields[] = {
                { "tierd_tier_capacity_bytes", "Bytes the tier holds.", offsetof(Tier__TierStatus, capacity) },
                { "tierd_tier_used_bytes", "Bytes of the tier that tensors take.", offsetof(Tier__TierStatus, used) },
                { "tierd_tier_pinned_bytes", "Bytes of the tier that pinned tensors take.",
                  offsetof(Tier__TierStatus, pinned) },
                { "tierd_tier_held_bytes", "Bytes of the tier's segments that jobs hold.",
                  offsetof(Tier__TierStatus, held) },
                { "tierd_tier_segment_size_bytes", "The unit jobs get the tier's memory in.",
                  offsetof(Tier__TierStatus, segment_size) },
                { "tierd_tier_reserved_bytes", "Free bytes of the tier kept for the guarantees jobs do not use yet "
                  "(nvme_min; 0 on the other tiers).", offsetof(Tier__TierStatus, reserved) },
        };

        family(f, "tierd_tier_info", "gauge", "The backend of each tier (always 1).");
        for (size_t i = 0; i < s->n_tiers; i++)
                if (s->tiers[i])
                        sample_u64(f, "tierd_tier_info",
                                   LABELS("tier", tier_name(s->tiers[i]->tier), "backend", str(s->tiers[i]->backend)), 1);
        for (size_t k = 0; k < ELEMENTSOF(fields); k++) {
                family(f, fields[k].name, "gauge", fields[k].help);
                for (size_t i = 0; i < s->n_tiers; i++)
                        if (s->tiers[i])
                                sample_u64(f, fields[k].name, LABELS("tier", tier_name(s->tiers[i]->tier)),
                                           field_u64(s->tiers[i], fields[k].offset));
        }
}

static void render_links(FILE *f, const Tier__StatusReply *s) {
        family(f, "tierd_link_moved_bytes_total", "counter",
               "Bytes moved over each link since tierd started: transfers that succeeded, tensor sizes rounded up to 4 KiB.");
        for (size_t i = 0; i < s->n_links; i++)
                if (s->links[i])
                        sample_u64(f, "tierd_link_moved_bytes_total", LABELS("link", str(s->links[i]->name)),
                                   s->links[i]->bytes);
        family(f, "tierd_link_transfers_total", "counter",
               "Transfers over each link that succeeded since tierd started.");
        for (size_t i = 0; i < s->n_links; i++)
                if (s->links[i])
                        sample_u64(f, "tierd_link_transfers_total", LABELS("link", str(s->links[i]->name)),
                                   s->links[i]->ops);
}

static void render_targets(FILE *f, const Tier__StatusReply *s) {
        static const struct {
                const char *name, *type, *help;
                size_t offset;
        } fields[] = {
                { "tierd_target_capacity_bytes", "gauge", "Usable bytes of the NVMe target.",
                  offsetof(Tier__TargetStatus, capacity) },
                { "tierd_target_used_bytes", "gauge", "Bytes of the NVMe target that tensors take.",
                  offsetof(Tier__TargetStatus, used) },
                { "tierd_target_read_bytes_total", "counter", "Bytes read from the NVMe target since tierd started.",
                  offsetof(Tier__TargetStatus, bytes_read) },
                { "tierd_target_written_bytes_total", "counter",
                  "Bytes written to the NVMe target since tierd started.", offsetof(Tier__TargetStatus, bytes_written) },
                { "tierd_target_crc_errors_total", "counter",
                  "Extents read back from the NVMe target whose crc32c did not match. A client that writes its tensor "
                  "during a write-down is counted in tierd_job_nvme_host_changed_total instead, unless it put the "
                  "bytes back before tierd checked them (tierd_job_nvme_crc_errors_total says whose tensors fail).",
                  offsetof(Tier__TargetStatus, crc_errors) },
                { "tierd_target_io_errors_total", "counter", "I/O requests to the NVMe target that failed.",
                  offsetof(Tier__TargetStatus, io_errors) },
                { "tierd_target_wear_written_bytes_total", "counter",
                  "Bytes tierd wrote to the NVMe target, kept across restarts (the state directory's wear file).",
                  offsetof(Tier__TargetStatus, wear_written) },
        };

        for (size_t k = 0; k < ELEMENTSOF(fields); k++) {
                family(f, fields[k].name, fields[k].type, fields[k].help);
                for (size_t i = 0; i < s->n_targets; i++)
                        if (s->targets[i])
                                sample_u64(f, fields[k].name, LABELS("target", str(s->targets[i]->path)),
                                           field_u64(s->targets[i], fields[k].offset));
        }

        family(f, "tierd_target_smart_available", "gauge",
               "1 if the drive under the target gave its SMART log; 0 and the reason if not.");
        for (size_t i = 0; i < s->n_targets; i++) {
                const Tier__TargetStatus *t = s->targets[i];

                if (t)
                        sample_u64(f, "tierd_target_smart_available",
                                   LABELS("target", str(t->path), "device", str(t->smart_device),
                                          "reason", str(t->smart_na)), t->smart ? 1 : 0);
        }
        family(f, "tierd_target_smart_written_bytes_total", "counter",
               "The drive's Data Units Written (SMART) in bytes: everything written to it, by anyone.");
        for (size_t i = 0; i < s->n_targets; i++) {
                const Tier__TargetStatus *t = s->targets[i];
                uint64_t units = t && t->smart ? t->smart->data_units_written : 0;

                if (t && t->smart)
                        sample_u64(f, "tierd_target_smart_written_bytes_total",
                                   LABELS("target", str(t->path), "device", str(t->smart_device)),
                                   units > UINT64_MAX / 512000 ? UINT64_MAX : units * 512000);
        }
        family(f, "tierd_target_smart_endurance_used_ratio", "gauge",
               "The drive's Percentage Used (SMART) / 100: its rated endurance used; may exceed 1.");
        for (size_t i = 0; i < s->n_targets; i++) {
                const Tier__TargetStatus *t = s->targets[i];

                if (t && t->smart)
                        sample_double(f, "tierd_target_smart_endurance_used_ratio",
                                      LABELS("target", str(t->path), "device", str(t->smart_device)),
                                      t->smart->percentage_used / 100.0);
        }
        family(f, "tierd_target_smart_critical_warning", "gauge", "The drive's Critical Warning bits (SMART); 0: none.");
        for (size_t i = 0; i < s->n_targets; i++) {
                const Tier__TargetStatus *t = s->targets[i];

                if (t && t->smart)
                        sample_u64(f, "tierd_target_smart_critical_warning",
                                   LABELS("target", str(t->path), "device", str(t->smart_device)),
                                   t->smart->critical_warning);
        }
        family(f, "tierd_target_smart_temperature_celsius", "gauge", "The drive's composite temperature (SMART).");
        for (size_t i = 0; i < s->n_targets; i++) {
                const Tier__TargetStatus *t = s->targets[i];

                if (t && t->smart)
                        sample_double(f, "tierd_target_smart_temperature_celsius",
                                      LABELS("target", str(t->path), "device", str(t->smart_device)),
                                      (double) t->smart->temperature_k - 273.15);
        }
}

static const Tier__JobTierUsage *job_usage(const Tier__JobStatus *j, size_t tier) {
        for (size_t i = 0; i < j->n_usage; i++)
                if (j->usage[i] && (size_t) j->usage[i]->tier == tier)
                        return j->usage[i];
        return NULL;
}

/*
 * A job's counters count for the job object, from 0 when it begins: they
 * are labelled job_name and job_id (unique while tierd lives, as in
 * tierd_job_info), so that a job that ends and another of its name that
 * begins are two series, not one that goes down.  (Its wear counts under
 * the name, earlier jobs included: job_name alone.)
 */
typedef struct JobLabels {
        char id[24];
        const char *kv[7];
} JobLabels;

/* @key, @value: one more pair (NULL: none). */
static const char *const *job_labels(JobLabels *jl, const Tier__JobStatus *j, const char *key, const char *value) {
        size_t n = 0;

        (void) snprintf(jl->id, sizeof(jl->id), "%" PRIu64, j->id);
        jl->kv[n++] = "job_name";
        jl->kv[n++] = str(j->name);
        jl->kv[n++] = "job_id";
        jl->kv[n++] = jl->id;
        if (key) {
                jl->kv[n++] = key;
                jl->kv[n++] = str(value);
        }
        jl->kv[n] = NULL;
        return jl->kv;
}

static void render_jobs(FILE *f, const Tier__StatusReply *s) {
        static const struct {
                const char *name, *help;
                size_t offset;
        } usage[] = {
                { "tierd_job_used_bytes", "Bytes the job's tensors take in the tier.", offsetof(Tier__JobTierUsage, used) },
                { "tierd_job_limit_bytes", "The job's limit in the tier.", offsetof(Tier__JobTierUsage, limit) },
                { "tierd_job_pinned_bytes", "Bytes of the job's pinned tensors in the tier.",
                  offsetof(Tier__JobTierUsage, pinned) },
        };
        char id[32], uid[16];
        JobLabels jl;

        family(f, "tierd_job_info", "gauge", "A job tierd has now: its id and owner (always 1).");
        for (size_t i = 0; i < s->n_jobs; i++) {
                const Tier__JobStatus *j = s->jobs[i];

                if (!j)
                        continue;
                (void) snprintf(id, sizeof(id), "%" PRIu64, j->id);
                (void) snprintf(uid, sizeof(uid), "%" PRIu32, j->uid);
                sample_u64(f, "tierd_job_info", LABELS("job_name", str(j->name), "job_id", id, "uid", uid), 1);
        }
#define JOB_SCALAR(NAME, TYPE, HELP, EXPR, SAMPLE)                                              \
        family(f, NAME, TYPE, HELP);                                                            \
        for (size_t i = 0; i < s->n_jobs; i++) {                                                \
                const Tier__JobStatus *j = s->jobs[i];                                          \
                if (j)                                                                          \
                        SAMPLE(f, NAME, LABELS("job_name", str(j->name)), EXPR);                \
        }
        /* a counter of one job object: labelled with its id too (job_labels()) */
#define JOB_COUNTER(NAME, HELP, EXPR, SAMPLE)                                                   \
        family(f, NAME, "counter", HELP);                                                       \
        for (size_t i = 0; i < s->n_jobs; i++) {                                                \
                const Tier__JobStatus *j = s->jobs[i];                                          \
                if (j)                                                                          \
                        SAMPLE(f, NAME, job_labels(&jl, j, NULL, NULL), EXPR);                   \
        }
        JOB_SCALAR("tierd_job_connections", "gauge", "The job's connections (ranks).", j->connections, sample_u64)
        JOB_SCALAR("tierd_job_tensors", "gauge", "The job's tensors.", j->tensors, sample_u64)
        JOB_SCALAR("tierd_job_weight", "gauge", "The job's bandwidth weight.", j->weight, sample_u64)
        JOB_SCALAR("tierd_job_linger_remaining_seconds", "gauge",
                   "Seconds a job without connections is kept before it ends; 0 while connected.",
                   j->linger_left_s, sample_double)
        JOB_COUNTER("tierd_job_nvme_written_bytes_total",
                    "Bytes written to NVMe for the job since it began (or tierd started).", j->nvme_written, sample_u64)
        JOB_SCALAR("tierd_job_wear_written_bytes_total", "counter",
                   "Bytes written to NVMe under the job's name, earlier runs and restarts of tierd included.",
                   j->wear_written, sample_u64)
        JOB_COUNTER("tierd_job_nvme_host_changed_total",
                   "Extents whose host copy the job wrote while tierd wrote them to NVMe: each failed its write-down. "
                   "The client's doing, not the drive's (not in tierd_target_crc_errors_total).",
                   j->nvme_host_changed, sample_u64)
        JOB_COUNTER("tierd_job_nvme_crc_errors_total",
                   "The job's extents read back from NVMe whose crc32c did not match, each also counted in its "
                   "target's tierd_target_crc_errors_total: errors of one job alone point at its writes, not the drive.",
                   j->nvme_crc_errors, sample_u64)
        JOB_COUNTER("tierd_job_plan_iterations_total",
                   "Steps the job's ranks completed in their plans since it began, the plans they ended and "
                   "submitted again included (tierd_plan_iterations is one plan's).", j->plan_iterations, sample_u64)
        JOB_COUNTER("tierd_job_plan_stall_seconds_total",
                   "Time the job's ranks waited for data in those steps since it began (tierd_plan_stall_seconds "
                   "is one plan's).", j->plan_stall_s, sample_double)
#undef JOB_SCALAR
#undef JOB_COUNTER

        for (size_t k = 0; k < ELEMENTSOF(usage); k++) {
                family(f, usage[k].name, "gauge", usage[k].help);
                for (size_t i = 0; i < s->n_jobs; i++)
                        for (size_t t = 0; s->jobs[i] && t < ELEMENTSOF(tier_names); t++) {
                                const Tier__JobTierUsage *u = job_usage(s->jobs[i], t);

                                sample_u64(f, usage[k].name, LABELS("job_name", str(s->jobs[i]->name), "tier", tier_names[t]),
                                           u ? field_u64(u, usage[k].offset) : 0);
                        }
        }
        family(f, "tierd_job_moved_bytes_total", "counter",
               "Bytes moved for the job over each link since it began (or tierd started).");
        for (size_t i = 0; i < s->n_jobs; i++)
                for (size_t l = 0; s->jobs[i] && l < s->jobs[i]->n_moved; l++)
                        sample_u64(f, "tierd_job_moved_bytes_total",
                                   job_labels(&jl, s->jobs[i], "link", s->jobs[i]->moved[l]->name),
                                   s->jobs[i]->moved[l]->bytes);
}

/*
 * A plan's labels: its job and its rank, so that a series stays the rank's
 * when other ranks come and go.  A plan submitted while another plan of the
 * job had its rank (two clients may say the same rank) also carries its
 * connection's id, decided once (PlanStatus.rank_shared): no two series of a
 * family have the same labels, and none changes while its plan lives.
 */
typedef struct PlanLabels {
        char rank[24], conn[24];
        const char *kv[11];
} PlanLabels;

/* @key, @value: one more pair (NULL: none). */
static const char *const *plan_labels(PlanLabels *pl, const Tier__JobStatus *j, const Tier__PlanStatus *ps,
                                      const char *key, const char *value) {
        const char **labels = pl->kv;
        size_t n = 0;

        (void) snprintf(pl->rank, sizeof(pl->rank), "%" PRIu32, ps->rank);
        (void) snprintf(pl->conn, sizeof(pl->conn), "%" PRIu64, ps->connection);
        labels[n++] = "job_name";
        labels[n++] = str(j->name);
        labels[n++] = "rank";
        labels[n++] = pl->rank;
        if (ps->rank_shared) {
                labels[n++] = "connection";
                labels[n++] = pl->conn;
        }
        if (key) {
                labels[n++] = key;
                labels[n++] = str(value);
        }
        labels[n] = NULL;
        return labels;
}

/* Plans: one per rank (connection), labelled with the job and the rank (plan_labels()). */
static void render_plans(FILE *f, const Tier__StatusReply *s) {
        static const struct {
                const char *name, *type, *help;
                int what;
        } fields[] = {
                { "tierd_plan_phase", "gauge", "The phase the rank is in.", 0 },
                { "tierd_plan_phases", "gauge", "Phases in the rank's plan (one training step).", 1 },
                { "tierd_plan_iterations", "gauge",
                  "Steps the rank completed in its plan: 0 again when it submits another (the job's counter is "
                  "tierd_job_plan_iterations_total).", 2 },
                { "tierd_plan_step_seconds", "gauge", "Learned step time: the sum of the phases' averages.", 3 },
                { "tierd_plan_last_step_seconds", "gauge", "How long the rank's last step took.", 4 },
                { "tierd_plan_last_stall_seconds", "gauge", "Time the rank waited for data in its last step.", 5 },
                { "tierd_plan_stall_seconds", "gauge",
                  "Time the rank waited for data since its plan began, as its client counts it: 0 again with "
                  "another plan (the job's counter is tierd_job_plan_stall_seconds_total).", 6 },
        };
        PlanLabels pl;

        for (size_t k = 0; k < ELEMENTSOF(fields); k++) {
                family(f, fields[k].name, fields[k].type, fields[k].help);
                for (size_t i = 0; i < s->n_jobs; i++)
                        for (size_t p = 0; s->jobs[i] && p < s->jobs[i]->n_plans; p++) {
                                const Tier__PlanStatus *ps = s->jobs[i]->plans[p];
                                const char *const *labels = plan_labels(&pl, s->jobs[i], ps, NULL, NULL);

                                switch (fields[k].what) {
                                case 0: sample_u64(f, fields[k].name, labels, ps->phase); break;
                                case 1: sample_u64(f, fields[k].name, labels, ps->phases); break;
                                case 2: sample_u64(f, fields[k].name, labels, ps->iterations); break;
                                case 3: sample_double(f, fields[k].name, labels, ps->step_s); break;
                                case 4: sample_double(f, fields[k].name, labels, ps->last_step_s); break;
                                case 5: sample_double(f, fields[k].name, labels, ps->stall_s); break;
                                default: sample_double(f, fields[k].name, labels, ps->stall_total_s); break;
                                }
                        }
        }
        family(f, "tierd_plan_last_step_moved_bytes", "gauge", "Bytes moved for the rank's job over each link in its last step.");
        for (size_t i = 0; i < s->n_jobs; i++)
                for (size_t p = 0; s->jobs[i] && p < s->jobs[i]->n_plans; p++) {
                        const Tier__PlanStatus *ps = s->jobs[i]->plans[p];

                        for (size_t l = 0; l < ps->n_step_links; l++)
                                sample_u64(f, "tierd_plan_last_step_moved_bytes",
                                           plan_labels(&pl, s->jobs[i], ps, "link", ps->step_links[l]->name),
                                           ps->step_links[l]->bytes);
                }
}

static void render_sched(FILE *f, const Tier__StatusReply *s) {
        const Tier__SchedStatus *q = s->sched;

        if (!q)
                return;         /* a reply built without it (tests) */
        family(f, "tierd_sched_transfers_in_flight", "gauge",
               "Transfers between tiers in flight (or waiting for the VRAM link).");
        sample_u64(f, "tierd_sched_transfers_in_flight", NULL, q->transfers);
        family(f, "tierd_sched_ops", "gauge", "Requests being served: pins, evictions, prefetches, write-backs.");
        sample_u64(f, "tierd_sched_ops", NULL, q->ops);
        family(f, "tierd_sched_queue_length", "gauge", "Entries waiting in each queue.");
        sample_u64(f, "tierd_sched_queue_length", LABELS("queue", "run"), q->run_queue);
        sample_u64(f, "tierd_sched_queue_length", LABELS("queue", "space"), q->space_waiters);
        sample_u64(f, "tierd_sched_queue_length", LABELS("queue", "nvme"), q->nvme_queued);
        sample_u64(f, "tierd_sched_queue_length", LABELS("queue", "vram"), q->vram_queued);
        family(f, "tierd_sched_requests_in_flight", "gauge", "Requests with the kernel (NVMe) or the VRAM backend.");
        sample_u64(f, "tierd_sched_requests_in_flight", LABELS("link", "nvme"), q->nvme_in_flight);
        sample_u64(f, "tierd_sched_requests_in_flight", LABELS("link", "vram"), q->vram_in_flight);
        family(f, "tierd_engine_runs_total", "counter",
               "Runs of the op engine and the scheduler's pass since tierd started (a waiting tierd does not run).");
        sample_u64(f, "tierd_engine_runs_total", NULL, q->engine_runs);
}

int metrics_render(const Tier__StatusReply *sr, char **ret, size_t *ret_len) {
        _cleanup_free_ char *buf = NULL;
        size_t size = 0;
        FILE *f;
        int r = 0;

        if (!sr || !ret)
                return -EINVAL;
        f = open_memstream(&buf, &size);
        if (!f)
                return -ENOMEM;
        render_daemon(f, sr);
        render_tiers(f, sr);
        render_links(f, sr);
        render_targets(f, sr);
        render_jobs(f, sr);
        render_plans(f, sr);
        render_sched(f, sr);
        if (ferror(f))
                r = -ENOMEM;
        if (fclose(f) != 0 && r >= 0)
                r = -ENOMEM;
        if (r < 0)
                return r;
        if (ret_len)
                *ret_len = size;
        *ret = TAKE_PTR(buf);
        return 0;
}

int metrics_build(const Rpc *r, char **ret, size_t *ret_len) {
        Tier__StatusReply *sr = NULL;
        int q;

        q = status_build(r, &sr);
        if (q < 0)
                return q;
        q = metrics_render(sr, ret, ret_len);
        status_free(sr);
        return q;
}

/* @len bytes of @text in a sealed memfd; the fd, or -errno. */
static int text_to_memfd(const char *text, size_t len) {
        _cleanup_close_ int fd = memfd_create("tierd-metrics", MFD_CLOEXEC | MFD_ALLOW_SEALING);

        if (fd < 0)
                return negative_errno();
        if (write(fd, text, len) != (ssize_t) len)
                return -EIO;
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
                return negative_errno();
        return TAKE_FD(fd);
}

int metrics_reply(const Rpc *r, Conn *c, uint64_t seq) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__StatusReply *sr = NULL;
        _cleanup_free_ char *text = NULL;
        _cleanup_close_ int fd = -1;
        size_t len = 0;
        int q;

        resp.seq = seq;
        q = status_build(r, &sr);
        if (q >= 0) {
                /* the asker does not count itself, as in its status (rpc.c handle_status()) */
                if (sr->connections > 0)
                        sr->connections--;
                q = metrics_render(sr, &text, &len);
                status_free(sr);
        }
        if (q < 0) {
                resp.status = q;
                resp.error = (char *) "cannot build the metrics";
                return conn_send_response(c, &resp, NULL, 0, false);
        }
        if (len <= METRICS_INLINE_MAX) {
                resp.result_case = TIER__RESPONSE__RESULT_METRICS_TEXT;
                resp.metrics_text = text;
                return conn_send_response(c, &resp, NULL, 0, false);
        }
        fd = text_to_memfd(text, len);
        if (fd < 0) {
                resp.status = fd;
                resp.error = (char *) "cannot write the metrics into a memfd";
                return conn_send_response(c, &resp, NULL, 0, false);
        }
        resp.result_case = TIER__RESPONSE__RESULT_METRICS_FD;
        resp.metrics_fd = 0;
        return conn_send_response(c, &resp, &fd, 1, false);
}
