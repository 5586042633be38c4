/* SPDX-License-Identifier: MIT */
/*
 * tables.c: tierctl's text tables of jobs, tensors and quotas (see tables.h).
 *
 * Job and tensor names are the clients' and the reasons tierd gives may quote
 * them: a tierd older than the name checks (or restored from its NVMe index
 * by one) may send names with control or bidirectional format characters.
 * They are printed through util/escape.c (controls as \u00xx, bidirectional
 * format characters as \u202e and the like, bytes that are not UTF-8 as \xNN) and
 * their columns are padded in the columns a terminal gives them, not bytes
 * ("café" takes 4, a CJK character or an emoji 2: util/width.c).
 */

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <tier.h>

#include "client/tierctl/tables.h"
#include "util/escape.h"
#include "util/size.h"

static const char *const copy_state_names[] = { "absent", "filling", "resident", "draining" };

const char *copy_state_name(int s) {
        return s >= 0 && s < (int) (sizeof(copy_state_names) / sizeof(copy_state_names[0])) ?
                copy_state_names[s] : "unknown";
}

const char *tensor_state_name(int state) {
        switch (state) {
        case TIER_TENSOR_DATA:
                return "data";
        case TIER_TENSOR_UNWRITTEN:
                return "unwritten";
        case TIER_TENSOR_DEAD:
                return "dead";
        case TIER_TENSOR_LOST:
                return "lost";
        default:
                return NULL;
        }
}

/* "resident", "resident (stale)", "-" for an absent copy. */
static const char *copy_cell(char *buf, size_t size, const struct tier_copy_info *cp) {
        if (cp->state == TIER_COPY_ABSENT)
                return "-";
        (void) snprintf(buf, size, "%s%s", copy_state_name(cp->state), cp->valid ? "" : " (stale)");
        return buf;
}

void jobs_table(FILE *f, const struct tier_job_info *jobs, size_t n) {
        size_t w = 4;

        if (n == 0) {
                fputs("no jobs\n", f);
                return;
        }
        for (size_t i = 0; i < n; i++)
                if (text_escape_width(jobs[i].name) > w)
                        w = text_escape_width(jobs[i].name);
        text_escape_fputs("NAME", f, w);
        fprintf(f, "  %6s  %6s  %4s  %-12s  %7s  %10s  %10s  %10s  %6s\n", "ID", "UID", "CONN",
                "LINGER", "TENSORS", "VRAM", "HOST", "NVME", "WEIGHT");
        for (size_t i = 0; i < n; i++) {
                const struct tier_job_info *j = &jobs[i];
                char linger[32] = "-";

                if (j->lingering)
                        (void) snprintf(linger, sizeof(linger), "%.1fs left", j->linger_left_s);
                text_escape_fputs(j->name, f, w);
                fprintf(f, "  %6" PRIu64 "  %6u  %4u  %-12s  %7u  %10s  %10s  %10s  %6u\n", j->id,
                        j->uid, j->connections, linger, j->tensors, FORMAT_SIZE(j->used[TIER_VRAM]),
                        FORMAT_SIZE(j->used[TIER_HOST]), FORMAT_SIZE(j->used[TIER_NVME]), j->weight);
        }
}

void tensors_table(FILE *f, const char *job, const struct tier_tensor_info *v, size_t n, uint64_t min) {
        size_t shown = 0, lost = 0, w = 4;

        for (size_t i = 0; i < n; i++)
                if (v[i].size >= min && text_escape_width(v[i].name) > w)
                        w = text_escape_width(v[i].name);
        for (size_t i = 0; i < n; i++) {
                const struct tier_tensor_info *t = &v[i];
                char a[32], b[32], c[32], last[32] = "never", dirty[16] = "";
                unsigned pins = 0;

                if (t->size < min)
                        continue;
                if (shown++ == 0) {
                        text_escape_fputs("NAME", f, w);
                        fprintf(f, "  %10s  %-18s  %-18s  %-18s  %4s  %-9s  %-9s  %s\n", "SIZE", "VRAM",
                                "HOST", "NVME", "PINS", "DIRTY", "DATA", "LAST USE");
                }
                /* the copies whose newest data NVMe lacks: "host", "vram+host" */
                for (int k = 0; k < TIER_LEVEL_MAX; k++) {
                        pins += t->copy[k].pins;
                        if (t->copy[k].dirty)
                                (void) snprintf(dirty + strlen(dirty), sizeof(dirty) - strlen(dirty), "%s%s",
                                                dirty[0] ? "+" : "", tier_level_name(k));
                }
                if (t->used)
                        (void) snprintf(last, sizeof(last), "%.1fs ago", t->idle_s);
                text_escape_fputs(t->name, f, w);
                fprintf(f, "  %10s  %-18s  %-18s  %-18s  %4u  %-9s  %-9s  %s\n", FORMAT_SIZE(t->size),
                        copy_cell(a, sizeof(a), &t->copy[TIER_VRAM]), copy_cell(b, sizeof(b), &t->copy[TIER_HOST]),
                        copy_cell(c, sizeof(c), &t->copy[TIER_NVME]), pins, dirty[0] ? dirty : "-",
                        tensor_state_name(t->state) ? tensor_state_name(t->state) : "-", last);
                lost += t->state == TIER_TENSOR_LOST;
        }
        if (shown == 0) {
                fputs("job '", f);
                text_escape_fputs(job, f, 0);
                fprintf(f, "' has no tensors%s\n", min > 0 ? " of that size" : "");
        }
        /* why, under the table: the reads of a lost tensor fail until it is written whole */
        for (size_t i = 0; lost > 0 && i < n; i++)
                if (v[i].size >= min && v[i].state == TIER_TENSOR_LOST) {
                        text_escape_fputs(v[i].name, f, 0);
                        fputs(" is lost: ", f);
                        text_escape_fputs(v[i].lost_why ? v[i].lost_why : "tierd did not say why", f, 0);
                        fputs("; its reads fail (ENODATA) until it is written whole\n", f);
                }
}

size_t quota_name_width(char *const *names, size_t n) {
        size_t w = 3;

        for (size_t i = 0; i < n; i++)
                if (names[i] && text_escape_width(names[i]) > w)
                        w = text_escape_width(names[i]);
        return w;
}

void quota_print_header(FILE *f, size_t name_width) {
        text_escape_fputs("JOB", f, name_width);
        fprintf(f, "  %10s  %10s  %10s  %10s  %10s  %10s  %6s\n", "VRAM", "HOST", "NVME",
                "VRAM-MIN", "HOST-MIN", "NVME-MIN", "WEIGHT");
}

void quota_print_row(FILE *f, size_t name_width, const char *job, const struct tier_quota *q) {
        text_escape_fputs(job, f, name_width);
        fprintf(f, "  %10s  %10s  %10s  %10s  %10s  %10s  %6u\n",
                FORMAT_SIZE(q->max[TIER_VRAM]), FORMAT_SIZE(q->max[TIER_HOST]), FORMAT_SIZE(q->max[TIER_NVME]),
                FORMAT_SIZE(q->min[TIER_VRAM]), FORMAT_SIZE(q->min[TIER_HOST]), FORMAT_SIZE(q->min[TIER_NVME]),
                q->weight);
}

const char *reason_text(char *buf, size_t size, const char *reason, int r) {
        return text_escape(buf, size, reason && *reason ? reason : tier_strerror(r));
}
