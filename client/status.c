/* SPDX-License-Identifier: MIT */
/* status.c: render tierd's StatusReply as a table for people or as JSON for programs. */

/*
 * Theory of operation
 *
 * tier_client_status() fetches a StatusReply and hands it to status_format(),
 * which writes into an open_memstream() buffer.  Both renderers are pure
 * functions of the message, so the unit tests feed them hand-built
 * replies.
 *
 * JSON: one object whose keys are an interface (scripts and tests read
 * them); every job lists usage for all three tiers, zero when tierd sent
 * none.  util/json.c writes it: strings are escaped per RFC 8259 and bytes
 * that are not valid UTF-8 become U+FFFD, so the output is always valid
 * JSON; seconds have at most 3 decimals and a '.' whatever the caller's
 * locale; a non-finite value (which tierd does not send) is null.
 *
 * Table: job names (client-supplied; one an older tierd restored may hold
 * control or bidirectional format characters) and the reasons tierd gives
 * that may name tensors go through util/escape.c's text_escape(): no control
 * or bidirectional format character reaches the terminal.  Aligned columns with binary-unit sizes (util/size.c's size_format(),
 * the same text tierctl writes); an emulated VRAM backend
 * is marked in its row and called out under the table, because numbers
 * from an emulated GPU must never be mistaken for real ones.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tier.h>

#include "client/tier-private.h"
#include "proto/macro.h"
#include "proto/tier.pb-c.h"
#include "util/escape.h"
#include "util/json.h"
#include "util/size.h"

static const char *level_name_or(int tier, const char *fallback) {
        const char *s = tier_level_name(tier);
        return s ? s : fallback;
}

/* protobuf-c leaves unset strings at "", hand-built replies may use NULL: both are "". */
static const char *strempty(const char *s) {
        return s ? s : "";
}

/* ---- JSON ------------------------------------------------------------------------- */

/* Seconds with millisecond resolution: "3723.25", "0". */
#define STATUS_SECONDS_DECIMALS 3

static void json_key_uint(JsonWriter *w, const char *key, uint64_t v) {
        json_key(w, key);
        json_uint(w, v);
}

static void json_key_string(JsonWriter *w, const char *key, const char *v) {
        json_key(w, key);
        json_string(w, strempty(v));
}

static void json_key_seconds(JsonWriter *w, const char *key, double v) {
        json_key(w, key);
        json_double_fixed(w, v, STATUS_SECONDS_DECIMALS);
}

static void json_usage(JsonWriter *w, const Tier__JobStatus *j) {
        json_key(w, "usage");
        json_object_begin(w);
        for (int t = 0; t < TIER_LEVEL_MAX; t++) {
                const Tier__JobTierUsage *u = NULL;

                for (size_t i = 0; i < j->n_usage; i++)
                        if (j->usage[i] && (int) j->usage[i]->tier == t)
                                u = j->usage[i];
                json_key(w, tier_level_name(t));
                json_object_begin(w);
                json_key_uint(w, "used", u ? u->used : 0);
                json_key_uint(w, "limit", u ? u->limit : 0);
                json_key_uint(w, "pinned", u ? u->pinned : 0);
                json_key_uint(w, "tensor_max", u ? u->tensor_max : 0);
                json_key_uint(w, "guarantee", u ? u->guarantee : 0);
                json_key_uint(w, "share", u ? u->share : 0);
                json_key_uint(w, "reserved", u ? u->reserved : 0);
                json_object_end(w);
        }
        json_object_end(w);
}

static void json_plan(JsonWriter *w, const Tier__PlanStatus *ps) {
        json_object_begin(w);
        json_key_uint(w, "rank", ps->rank);
        json_key_uint(w, "connection", ps->connection);
        json_key_uint(w, "phase", ps->phase);
        json_key_uint(w, "phases", ps->phases);
        json_key_uint(w, "iterations", ps->iterations);
        json_key_seconds(w, "step_s", ps->step_s);
        json_key_seconds(w, "stall_s", ps->stall_s);
        json_key_seconds(w, "last_step_s", ps->last_step_s);
        json_key_seconds(w, "stall_total_s", ps->stall_total_s);
        json_key_string(w, "waiting", ps->waiting);
        json_key(w, "step_bytes");
        json_object_begin(w);
        for (size_t l = 0; l < ps->n_step_links; l++)
                json_key_uint(w, strempty(ps->step_links[l]->name), ps->step_links[l]->bytes);
        json_object_end(w);
        json_object_end(w);
}

static void json_job(JsonWriter *w, const Tier__JobStatus *j) {
        json_object_begin(w);
        json_key_uint(w, "id", j->id);
        json_key_string(w, "name", j->name);
        json_key_uint(w, "uid", j->uid);
        json_key_uint(w, "connections", j->connections);
        json_key_uint(w, "tensors", j->tensors);
        json_key(w, "lingering");
        json_bool(w, j->lingering);
        json_key_seconds(w, "linger_left_s", j->linger_left_s);
        json_key_uint(w, "weight", j->weight);
        json_key_uint(w, "nvme_written", j->nvme_written);
        json_key_uint(w, "wear_written", j->wear_written);
        json_key_uint(w, "nvme_host_changed", j->nvme_host_changed);
        json_key_uint(w, "nvme_crc_errors", j->nvme_crc_errors);
        json_key_uint(w, "plan_iterations", j->plan_iterations);
        json_key_seconds(w, "plan_stall_s", j->plan_stall_s);
        json_usage(w, j);
        json_key(w, "moved");
        json_object_begin(w);
        for (size_t l = 0; l < j->n_moved; l++)
                json_key_uint(w, strempty(j->moved[l]->name), j->moved[l]->bytes);
        json_object_end(w);
        json_key(w, "plans");
        json_array_begin(w);
        for (size_t k = 0; k < j->n_plans; k++)
                json_plan(w, j->plans[k]);
        json_array_end(w);
        json_object_end(w);
}

/* "smart": {"device", "data_units_written", ...}, or {"device", "na": REASON} without figures. */
static void json_smart(JsonWriter *w, const Tier__TargetStatus *ts) {
        json_key(w, "smart");
        json_object_begin(w);
        json_key_string(w, "device", ts->smart_device);
        if (!ts->smart) {
                json_key_string(w, "na", ts->smart_na && *ts->smart_na ? ts->smart_na : "not read yet");
        } else {
                json_key_uint(w, "data_units_written", ts->smart->data_units_written);
                json_key_uint(w, "percentage_used", ts->smart->percentage_used);
                json_key_uint(w, "critical_warning", ts->smart->critical_warning);
                json_key_uint(w, "temperature_k", ts->smart->temperature_k);
                json_key_seconds(w, "age_s", ts->smart->age_s);
        }
        json_object_end(w);
}

static void json_sched(JsonWriter *w, const Tier__SchedStatus *s) {
        json_key(w, "sched");
        json_object_begin(w);
        json_key_uint(w, "transfers", s->transfers);
        json_key_uint(w, "ops", s->ops);
        json_key_uint(w, "run_queue", s->run_queue);
        json_key_uint(w, "space_waiters", s->space_waiters);
        json_key_uint(w, "nvme_queued", s->nvme_queued);
        json_key_uint(w, "nvme_in_flight", s->nvme_in_flight);
        json_key_uint(w, "vram_queued", s->vram_queued);
        json_key_uint(w, "vram_in_flight", s->vram_in_flight);
        json_key_uint(w, "engine_runs", s->engine_runs);
        json_object_end(w);
}

/* The whole reply as one JSON object and a newline, malloc()ed into *@ret. */
static int status_json(const Tier__StatusReply *s, char **ret) {
        _cleanup_(json_writer_deinit) JsonWriter w = JSON_WRITER_NULL;
        _cleanup_free_ char *text = NULL;
        size_t len = 0;
        char *t;
        int r;

        json_object_begin(&w);
        json_key_string(&w, "version", s->version);
        json_key_seconds(&w, "uptime_s", s->uptime_s);
        json_key_uint(&w, "connections", s->connections);
        json_key_string(&w, "policy", s->policy);

        json_key(&w, "tiers");
        json_array_begin(&w);
        for (size_t i = 0; i < s->n_tiers; i++) {
                const Tier__TierStatus *ts = s->tiers[i];

                if (!ts)
                        continue;
                json_object_begin(&w);
                json_key_string(&w, "tier", level_name_or((int) ts->tier, "unknown"));
                json_key_string(&w, "backend", ts->backend);
                json_key_uint(&w, "capacity", ts->capacity);
                json_key_uint(&w, "used", ts->used);
                json_key_uint(&w, "pinned", ts->pinned);
                json_key_uint(&w, "segment_size", ts->segment_size);
                json_key_uint(&w, "held", ts->held);
                json_key_uint(&w, "bandwidth", ts->bandwidth);
                json_key_uint(&w, "renewing", ts->renewing);
                json_key_uint(&w, "reserved", ts->reserved);
                json_object_end(&w);
        }
        json_array_end(&w);

        json_key(&w, "links");
        json_array_begin(&w);
        for (size_t i = 0; i < s->n_links; i++) {
                const Tier__LinkStatus *l = s->links[i];

                if (!l)
                        continue;
                json_object_begin(&w);
                json_key_string(&w, "name", l->name);
                json_key_uint(&w, "bytes", l->bytes);
                json_key_uint(&w, "ops", l->ops);
                json_object_end(&w);
        }
        json_array_end(&w);

        json_key(&w, "targets");
        json_array_begin(&w);
        for (size_t i = 0; i < s->n_targets; i++) {
                const Tier__TargetStatus *ts = s->targets[i];

                if (!ts)
                        continue;
                json_object_begin(&w);
                json_key_string(&w, "path", ts->path);
                json_key_uint(&w, "capacity", ts->capacity);
                json_key_uint(&w, "used", ts->used);
                json_key_uint(&w, "bytes_written", ts->bytes_written);
                json_key_uint(&w, "bytes_read", ts->bytes_read);
                json_key_uint(&w, "crc_errors", ts->crc_errors);
                json_key_uint(&w, "io_errors", ts->io_errors);
                json_key_uint(&w, "wear_written", ts->wear_written);
                json_smart(&w, ts);
                json_object_end(&w);
        }
        json_array_end(&w);

        if (s->sched)           /* tierd sends it; replies made by hand may not */
                json_sched(&w, s->sched);

        json_key(&w, "jobs");
        json_array_begin(&w);
        for (size_t i = 0; i < s->n_jobs; i++)
                if (s->jobs[i])
                        json_job(&w, s->jobs[i]);
        json_array_end(&w);
        json_object_end(&w);

        r = json_writer_finish(&w, &text, &len);
        if (r < 0)
                return r;

        /* one line, like the table ends in one */
        t = realloc(text, len + 2);
        if (!t)
                return -ENOMEM;
        text = t;
        text[len] = '\n';
        text[len + 1] = '\0';
        *ret = TAKE_PTR(text);
        return 0;
}

/* ---- table ------------------------------------------------------------------------ */

/* Cells of one table, row-major, the header row first. */
typedef struct Table {
        size_t n_cols;
        const char *align;      /* per column: 'l' or 'r' */
        char **cells;
        size_t n_cells, cap;
        int error;
} Table;

static void table_done(Table *t) {
        for (size_t i = 0; i < t->n_cells; i++)
                free(t->cells[i]);
        free(t->cells);
        *t = (Table) {};
}

_printf_(2, 3)
static void table_cell(Table *t, const char *fmt, ...) {
        va_list ap;
        char *s;
        int r;

        if (t->error < 0)
                return;
        if (t->n_cells == t->cap) {
                size_t cap = MAX(t->cap * 2, (size_t) 32);
                char **a = reallocarray(t->cells, cap, sizeof(char *));

                if (!a) {
                        t->error = -ENOMEM;
                        return;
                }
                t->cells = a;
                t->cap = cap;
        }
        va_start(ap, fmt);
        r = vasprintf(&s, fmt, ap);
        va_end(ap);
        if (r < 0) {
                t->error = -ENOMEM;
                return;
        }
        t->cells[t->n_cells++] = s;
}

/* A cell of client-supplied text (a job's name): text_escape()d, so that no control character reaches a terminal. */
static void table_cell_text(Table *t, const char *s) {
        char *e;

        if (t->error < 0)
                return;
        e = text_escape_dup(s);
        if (!e) {
                t->error = -ENOMEM;
                return;
        }
        table_cell(t, "%s", e);
        free(e);
}

static void table_print(FILE *f, const Table *t) {
        size_t width[16] = {};

        if (t->n_cols == 0 || t->n_cols > ELEMENTSOF(width))
                return;
        for (size_t i = 0; i < t->n_cells; i++)
                width[i % t->n_cols] = MAX(width[i % t->n_cols], text_escape_width(t->cells[i]));

        /* in columns, not bytes: "café" takes 4 (the cells are escaped already: text_escape_fputs() copies them) */
        for (size_t i = 0; i < t->n_cells; i++) {
                size_t col = i % t->n_cols;
                bool last = col + 1 == t->n_cols;

                if (t->align[col] == 'r') {
                        for (size_t k = text_escape_width(t->cells[i]); k < width[col]; k++)
                                fputc(' ', f);
                        fputs(t->cells[i], f);
                } else
                        text_escape_fputs(t->cells[i], f, last ? 0 : width[col]);  /* (the last: no trailing blanks) */
                fputs(last ? "\n" : "  ", f);
        }
}

static void format_duration(char *buf, size_t size, double seconds) {
        uint64_t s = seconds > 0 && seconds < 1e15 ? (uint64_t) seconds : 0;

        if (s >= 86400)
                (void) snprintf(buf, size, "%" PRIu64 "d %02" PRIu64 "h %02" PRIu64 "m",
                                s / 86400, s % 86400 / 3600, s % 3600 / 60);
        else if (s >= 3600)
                (void) snprintf(buf, size, "%" PRIu64 "h %02" PRIu64 "m %02" PRIu64 "s",
                                s / 3600, s % 3600 / 60, s % 60);
        else if (s >= 60)
                (void) snprintf(buf, size, "%" PRIu64 "m %02" PRIu64 "s", s / 60, s % 60);
        else
                (void) snprintf(buf, size, "%" PRIu64 "s", s);
}

/* "12.5%" with integer arithmetic; "-" when there is no capacity. */
static void format_percent(char *buf, size_t size, uint64_t part, uint64_t whole) {
        unsigned __int128 permille;

        if (whole == 0) {
                (void) snprintf(buf, size, "-");
                return;
        }
        permille = ((unsigned __int128) part * 1000 + whole / 2) / whole;
        (void) snprintf(buf, size, "%u.%u%%", (unsigned) (permille / 10), (unsigned) (permille % 10));
}

static bool backend_emulated(const char *backend) {
        return backend && strcmp(backend, "emulated") == 0;
}

/* "  job NAME", the name as text_escape() makes it safe to print. */
static void job_prefix(FILE *f, const Tier__JobStatus *j) {
        fputs("  job ", f);
        text_escape_fputs(strempty(j->name), f, 0);
}

/* Drive wear under the targets: what tierd wrote over restarts, and the drive's own SMART figures. */
static void table_wear(FILE *f, const Tier__StatusReply *s) {
        char a[SIZE_FORMAT_MAX], b[SIZE_FORMAT_MAX];

        fputs("wear:\n", f);
        for (size_t i = 0; i < s->n_targets; i++) {
                const Tier__TargetStatus *ts = s->targets[i];

                if (!ts)
                        continue;
                fprintf(f, "  %s: tierd wrote %s in all; SMART: ", strempty(ts->path),
                        size_format(a, sizeof(a), ts->wear_written));
                if (!ts->smart)
                        fprintf(f, "n/a (%s)\n", ts->smart_na && *ts->smart_na ? ts->smart_na : "not read yet");
                else {
                        unsigned __int128 bytes = (unsigned __int128) ts->smart->data_units_written * 512000u;

                        fprintf(f, "%s written to %s, %u%% of its endurance used, %d C%s\n",
                                size_format(b, sizeof(b), bytes > UINT64_MAX ? UINT64_MAX : (uint64_t) bytes),
                                strempty(ts->smart_device), ts->smart->percentage_used,
                                (int) ts->smart->temperature_k - 273,
                                ts->smart->critical_warning ? ", CRITICAL WARNING" : "");
                }
        }
        for (size_t i = 0; i < s->n_jobs; i++) {
                const Tier__JobStatus *j = s->jobs[i];

                if (j && j->wear_written > 0) {
                        job_prefix(f, j);
                        fprintf(f, ": wrote %s to NVMe in all, %s since it began\n",
                                size_format(a, sizeof(a), j->wear_written), size_format(b, sizeof(b), j->nvme_written));
                }
                if (j && j->nvme_host_changed > 0) {
                        job_prefix(f, j);
                        fprintf(f, ": wrote the host copy of %" PRIu64 " extent(s) while tierd wrote "
                                "them to NVMe (those write-downs failed; the client's doing, not the drive's)\n",
                                j->nvme_host_changed);
                }
                if (j && j->nvme_crc_errors > 0) {
                        job_prefix(f, j);
                        fprintf(f, ": %" PRIu64 " extent(s) of its tensors failed their crc32c when read "
                                "back from NVMe (counted in the target's crc errors too)\n", j->nvme_crc_errors);
                }
        }
}

/* The NVMe room kept for guarantees (nvme_min), and for whom: free room that other jobs' copies do not get. */
static void table_reserved(FILE *f, const Tier__StatusReply *s) {
        char a[SIZE_FORMAT_MAX], b[SIZE_FORMAT_MAX];
        const Tier__TierStatus *nvme = NULL;
        bool any = false;

        for (size_t i = 0; i < s->n_tiers; i++)
                if (s->tiers[i] && s->tiers[i]->tier == TIER__TIER__TIER_NVME)
                        nvme = s->tiers[i];
        if (!nvme || nvme->reserved == 0)
                return;
        fprintf(f, "nvme: %s of the %s free is reserved for the NVMe guarantees (nvme_min) jobs do not use yet; "
                "other jobs' copies get only the rest:", size_format(a, sizeof(a), nvme->reserved),
                size_format(b, sizeof(b), nvme->capacity > nvme->used ? nvme->capacity - nvme->used : 0));
        for (size_t i = 0; i < s->n_jobs; i++) {
                const Tier__JobStatus *j = s->jobs[i];

                for (size_t k = 0; j && k < j->n_usage; k++)
                        if (j->usage[k] && j->usage[k]->tier == TIER__TIER__TIER_NVME && j->usage[k]->reserved > 0) {
                                fprintf(f, "%s ", any ? "," : "");
                                text_escape_fputs(strempty(j->name), f, 0);
                                fprintf(f, " %s", size_format(a, sizeof(a), j->usage[k]->reserved));
                                any = true;
                        }
        }
        fputc('\n', f);
}

static int status_table(FILE *f, const Tier__StatusReply *s) {
        char a[SIZE_FORMAT_MAX], b[SIZE_FORMAT_MAX], c[SIZE_FORMAT_MAX], d[SIZE_FORMAT_MAX];
        char up[32];
        bool emulated = false;
        Table t = {};
        int r = 0;

        format_duration(up, sizeof(up), s->uptime_s);
        fprintf(f, "tierd %s, up %s, %" PRIu32 " connection%s\n", s->version && *s->version ? s->version : "?",
                up, s->connections, s->connections == 1 ? "" : "s");

        /* Tiers */
        fputc('\n', f);
        t = (Table) { .n_cols = 7, .align = "llrrrrr" };
        table_cell(&t, "TIER");
        table_cell(&t, "BACKEND");
        table_cell(&t, "CAPACITY");
        table_cell(&t, "USED");
        table_cell(&t, "PINNED");
        table_cell(&t, "RESERVED");
        table_cell(&t, "USE%%");
        for (size_t i = 0; i < s->n_tiers; i++) {
                const Tier__TierStatus *ts = s->tiers[i];

                if (!ts)
                        continue;
                table_cell(&t, "%s", level_name_or((int) ts->tier, "?"));
                if (backend_emulated(ts->backend)) {
                        emulated = true;
                        table_cell(&t, "%s", "(emulated)");
                } else {
                        table_cell(&t, "%s", ts->backend && *ts->backend ? ts->backend : "-");
                }
                table_cell(&t, "%s", size_format(a, sizeof(a), ts->capacity));
                table_cell(&t, "%s", size_format(b, sizeof(b), ts->used));
                table_cell(&t, "%s", size_format(c, sizeof(c), ts->pinned));
                /* a reservation on NVMe alone: elsewhere a guarantee is a share that reclaim keeps */
                if (ts->tier == TIER__TIER__TIER_NVME)
                        table_cell(&t, "%s", size_format(d, sizeof(d), ts->reserved));
                else
                        table_cell(&t, "-");
                format_percent(d, sizeof(d), ts->used, ts->capacity);
                table_cell(&t, "%s", d);
        }
        if (t.error < 0)
                goto finish;
        table_print(f, &t);
        table_done(&t);
        if (emulated)
                fputs("!! VRAM is EMULATED: host memory stands in for the GPU, no GPU is used.\n"
                      "!! Its sizes and transfer rates say nothing about a real GPU.\n", f);
        table_reserved(f, s);

        /* Links */
        fputc('\n', f);
        if (s->n_links == 0)
                fputs("no link traffic\n", f);
        else {
                t = (Table) { .n_cols = 3, .align = "lrr" };
                table_cell(&t, "LINK");
                table_cell(&t, "BYTES");
                table_cell(&t, "OPS");
                for (size_t i = 0; i < s->n_links; i++) {
                        const Tier__LinkStatus *l = s->links[i];

                        if (!l)
                                continue;
                        table_cell(&t, "%s", l->name ? l->name : "");
                        table_cell(&t, "%s", size_format(a, sizeof(a), l->bytes));
                        table_cell(&t, "%" PRIu64, l->ops);
                }
                if (t.error < 0)
                        goto finish;
                table_print(f, &t);
                table_done(&t);
        }

        /* NVMe targets */
        fputc('\n', f);
        if (s->n_targets == 0)
                fputs("no NVMe targets\n", f);
        else {
                t = (Table) { .n_cols = 7, .align = "lrrrrrr" };
                table_cell(&t, "TARGET");
                table_cell(&t, "CAPACITY");
                table_cell(&t, "USED");
                table_cell(&t, "WRITTEN");
                table_cell(&t, "READ");
                table_cell(&t, "CRC ERR");
                table_cell(&t, "IO ERR");
                for (size_t i = 0; i < s->n_targets; i++) {
                        const Tier__TargetStatus *ts = s->targets[i];

                        if (!ts)
                                continue;
                        table_cell(&t, "%s", ts->path ? ts->path : "");
                        table_cell(&t, "%s", size_format(a, sizeof(a), ts->capacity));
                        table_cell(&t, "%s", size_format(b, sizeof(b), ts->used));
                        table_cell(&t, "%s", size_format(c, sizeof(c), ts->bytes_written));
                        table_cell(&t, "%s", size_format(d, sizeof(d), ts->bytes_read));
                        table_cell(&t, "%" PRIu64, ts->crc_errors);
                        table_cell(&t, "%" PRIu64, ts->io_errors);
                }
                if (t.error < 0)
                        goto finish;
                table_print(f, &t);
                table_done(&t);
                table_wear(f, s);
        }

        /* Jobs: usage per tier as "used / limit" */
        fputc('\n', f);
        if (s->n_jobs == 0)
                fputs("no jobs\n", f);
        else {
                t = (Table) { .n_cols = 10, .align = "rlrrrrrrrr" };
                table_cell(&t, "JOB");
                table_cell(&t, "NAME");
                table_cell(&t, "UID");
                table_cell(&t, "CONN");
                table_cell(&t, "TENSORS");
                table_cell(&t, "VRAM USED/LIMIT");
                table_cell(&t, "HOST USED/LIMIT");
                table_cell(&t, "NVME USED/LIMIT");
                table_cell(&t, "WEIGHT");
                table_cell(&t, "LINGER");
                for (size_t i = 0; i < s->n_jobs; i++) {
                        const Tier__JobStatus *j = s->jobs[i];

                        if (!j)
                                continue;
                        table_cell(&t, "%" PRIu64, j->id);
                        table_cell_text(&t, strempty(j->name));
                        table_cell(&t, "%" PRIu32, j->uid);
                        table_cell(&t, "%" PRIu32, j->connections);
                        table_cell(&t, "%" PRIu32, j->tensors);
                        for (int tier = 0; tier < TIER_LEVEL_MAX; tier++) {
                                const Tier__JobTierUsage *u = NULL;

                                for (size_t k = 0; k < j->n_usage; k++)
                                        if (j->usage[k] && (int) j->usage[k]->tier == tier)
                                                u = j->usage[k];
                                if (!u)
                                        table_cell(&t, "-");
                                else if (u->limit == 0)
                                        table_cell(&t, "%s / -", size_format(a, sizeof(a), u->used));
                                else
                                        table_cell(&t, "%s / %s", size_format(a, sizeof(a), u->used),
                                                   size_format(b, sizeof(b), u->limit));
                        }
                        table_cell(&t, "%" PRIu32, j->weight);
                        if (j->lingering || j->linger_left_s > 0) {
                                format_duration(up, sizeof(up), j->linger_left_s);
                                table_cell(&t, "%s left", up);
                        } else
                                table_cell(&t, "-");
                }
                if (t.error < 0)
                        goto finish;
                table_print(f, &t);
                table_done(&t);

                /* Plans: where each rank is on the timeline and what a step costs */
                t = (Table) { .n_cols = 10, .align = "lrlrrrrrrr" };
                table_cell(&t, "PLAN OF");
                table_cell(&t, "RANK");
                table_cell(&t, "PHASE");
                table_cell(&t, "STEPS");
                table_cell(&t, "STEP");
                table_cell(&t, "STALL/STEP");
                table_cell(&t, "NVME->HOST");
                table_cell(&t, "HOST->NVME");
                table_cell(&t, "HOST->VRAM");
                table_cell(&t, "VRAM->HOST");
                for (size_t i = 0; i < s->n_jobs; i++) {
                        const Tier__JobStatus *j = s->jobs[i];

                        for (size_t k = 0; j && k < j->n_plans; k++) {
                                const Tier__PlanStatus *ps = j->plans[k];

                                table_cell_text(&t, strempty(j->name));
                                table_cell(&t, "%" PRIu32, ps->rank);
                                table_cell(&t, "%" PRIu32 "/%" PRIu32, ps->phase, ps->phases);
                                table_cell(&t, "%" PRIu64, ps->iterations);
                                table_cell(&t, "%.3f s", ps->step_s);
                                table_cell(&t, "%.3f s", ps->stall_s);
                                for (size_t l = 0; l < 4; l++)
                                        table_cell(&t, "%s", l < ps->n_step_links ?
                                                   size_format(a, sizeof(a), ps->step_links[l]->bytes) : "-");
                        }
                }
                if (t.n_cells > t.n_cols) {
                        fprintf(f, "\nscheduling policy: %s; per step:\n", s->policy ? s->policy : "?");
                        if (t.error < 0)
                                goto finish;
                        table_print(f, &t);
                }
                /* a phase held back: why, as the refusal of its pin said */
                for (size_t i = 0; i < s->n_jobs; i++)
                        for (size_t k = 0; s->jobs[i] && k < s->jobs[i]->n_plans; k++)
                                if (s->jobs[i]->plans[k]->waiting && s->jobs[i]->plans[k]->waiting[0]) {
                                        /* (the reason tierd gave may name tensors) */
                                        fputs("plan of ", f);
                                        text_escape_fputs(strempty(s->jobs[i]->name), f, 0);
                                        fprintf(f, ", rank %" PRIu32 ", waits: ", s->jobs[i]->plans[k]->rank);
                                        text_escape_fputs(s->jobs[i]->plans[k]->waiting, f, 0);
                                        fputc('\n', f);
                                }
        }

finish:
        r = t.error;
        table_done(&t);
        return r;
}

/* ---- entry point -------------------------------------------------------------------- */

int status_format(const Tier__StatusReply *s, int format, char **ret) {
        _cleanup_free_ char *buf = NULL;
        size_t size = 0;
        FILE *f;
        int r;

        if (!s || !ret || (format != TIER_STATUS_TABLE && format != TIER_STATUS_JSON))
                return -EINVAL;
        if (format == TIER_STATUS_JSON)
                return status_json(s, ret);

        f = open_memstream(&buf, &size);
        if (!f)
                return -ENOMEM;
        r = status_table(f, s);
        if (ferror(f) && r >= 0)
                r = -ENOMEM;
        if (fclose(f) != 0 && r >= 0)
                r = -ENOMEM;
        if (r < 0)
                return r;

        *ret = TAKE_PTR(buf);
        return 0;
}
