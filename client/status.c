/* SPDX-License-Identifier: MIT */
/* status.c: render tierd's StatusReply as a table for people or as JSON for programs. */

/*
 * Theory of operation
 *
 * tier_status() fetches a StatusReply and hands it to status_format(),
 * which writes into an open_memstream() buffer.  Both renderers are pure
 * functions of the message, so the unit tests feed them hand-built
 * replies.
 *
 * JSON: one object whose keys are an interface (scripts and tests read
 * them); every job lists usage for all three tiers, zero when tierd sent
 * none.  Strings are escaped per RFC 8259 and bytes that are not valid
 * UTF-8 become U+FFFD, so the output is always valid JSON.  Numbers never
 * go through printf's %f: its decimal point follows the caller's locale.
 *
 * Table: aligned columns with binary-unit sizes; an emulated VRAM backend
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

/* ---- numbers ---------------------------------------------------------------------- */

char *format_bytes(char *buf, size_t size, uint64_t bytes) {
        static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
        uint64_t d = 1, whole, tenths;
        size_t i = 0;

        while (i + 1 < ELEMENTSOF(units) && bytes / d >= 1024) {
                d *= 1024;
                i++;
        }
        if (i == 0) {
                (void) snprintf(buf, size, "%" PRIu64 " B", bytes);
                return buf;
        }
        /* Integer arithmetic: exact, and no locale decimal point. rem * 10 < 10 * 2^60 fits. */
        whole = bytes / d;
        tenths = ((bytes % d) * 10 + d / 2) / d;
        if (tenths >= 10) {
                whole++;
                tenths = 0;
        }
        if (whole >= 1024 && i + 1 < ELEMENTSOF(units)) {
                whole /= 1024;
                i++;
        }
        (void) snprintf(buf, size, "%" PRIu64 ".%" PRIu64 " %s", whole, tenths, units[i]);
        return buf;
}

/* A double as a JSON number with at most 3 decimals, whatever LC_NUMERIC says. */
static void json_double(FILE *f, double v) {
        uint64_t milli, whole, frac;
        bool neg = v < 0;
        char digits[4];
        int n;

        if (v != v || v > 1e15 || v < -1e15) {          /* NaN, or too big for milli-units */
                fputs(v != v ? "0" : neg ? "-1e15" : "1e15", f);
                return;
        }
        milli = (uint64_t) ((neg ? -v : v) * 1000.0 + 0.5);
        if (milli == 0) {
                fputs("0", f);
                return;
        }
        whole = milli / 1000;
        frac = milli % 1000;
        fprintf(f, "%s%" PRIu64, neg ? "-" : "", whole);
        if (frac == 0)
                return;
        n = snprintf(digits, sizeof(digits), "%03" PRIu64, frac);
        while (n > 0 && digits[n - 1] == '0')
                digits[--n] = 0;
        fprintf(f, ".%s", digits);
}

/* Length of the valid UTF-8 sequence at @s (1..4), or 0 if it is not one. */
static size_t utf8_sequence(const unsigned char *s) {
        uint32_t cp;
        size_t n;

        if (s[0] < 0x80)
                return 1;
        if (s[0] >= 0xc2 && s[0] <= 0xdf)
                n = 2, cp = s[0] & 0x1f;
        else if (s[0] >= 0xe0 && s[0] <= 0xef)
                n = 3, cp = s[0] & 0x0f;
        else if (s[0] >= 0xf0 && s[0] <= 0xf4)
                n = 4, cp = s[0] & 0x07;
        else
                return 0;
        for (size_t i = 1; i < n; i++) {
                if ((s[i] & 0xc0) != 0x80)      /* also stops at the NUL */
                        return 0;
                cp = (cp << 6) | (s[i] & 0x3f);
        }
        if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff))
                return 0;                       /* overlong, out of range, or a surrogate */
        return n;
}

static void json_string(FILE *f, const char *s) {
        const unsigned char *p = (const unsigned char *) (s ? s : "");

        fputc('"', f);
        while (*p) {
                size_t n;

                switch (*p) {
                case '"':
                        fputs("\\\"", f);
                        break;
                case '\\':
                        fputs("\\\\", f);
                        break;
                case '\n':
                        fputs("\\n", f);
                        break;
                case '\r':
                        fputs("\\r", f);
                        break;
                case '\t':
                        fputs("\\t", f);
                        break;
                case '\b':
                        fputs("\\b", f);
                        break;
                case '\f':
                        fputs("\\f", f);
                        break;
                default:
                        if (*p < 0x20) {
                                fprintf(f, "\\u%04x", *p);
                                break;
                        }
                        n = utf8_sequence(p);
                        if (n == 0) {
                                fputs("\\ufffd", f);
                                break;
                        }
                        fwrite(p, 1, n, f);
                        p += n;
                        continue;
                }
                p++;
        }
        fputc('"', f);
}

static const char *level_name_or(int tier, const char *fallback) {
        const char *s = tier_level_name(tier);
        return s ? s : fallback;
}

/* ---- JSON ------------------------------------------------------------------------- */

static void json_usage(FILE *f, const Tier__JobStatus *j) {
        fputs("\"usage\":{", f);
        for (int t = 0; t < TIER_LEVEL_MAX; t++) {
                const Tier__JobTierUsage *u = NULL;

                for (size_t i = 0; i < j->n_usage; i++)
                        if (j->usage[i] && (int) j->usage[i]->tier == t)
                                u = j->usage[i];
                fprintf(f, "%s\"%s\":{\"used\":%" PRIu64 ",\"limit\":%" PRIu64 ",\"pinned\":%" PRIu64 "}",
                        t ? "," : "", tier_level_name(t),
                        u ? u->used : 0, u ? u->limit : 0, u ? u->pinned : 0);
        }
        fputc('}', f);
}

static void status_json(FILE *f, const Tier__StatusReply *s) {
        const char *sep;

        fputs("{\"version\":", f);
        json_string(f, s->version);
        fputs(",\"uptime_s\":", f);
        json_double(f, s->uptime_s);
        fprintf(f, ",\"connections\":%" PRIu32, s->connections);
        fputs(",\"policy\":", f);
        json_string(f, s->policy ? s->policy : "");

        fputs(",\"tiers\":[", f);
        sep = "";
        for (size_t i = 0; i < s->n_tiers; i++) {
                const Tier__TierStatus *t = s->tiers[i];

                if (!t)
                        continue;
                fprintf(f, "%s{\"tier\":", sep);
                sep = ",";
                json_string(f, level_name_or((int) t->tier, "unknown"));
                fputs(",\"backend\":", f);
                json_string(f, t->backend);
                fprintf(f, ",\"capacity\":%" PRIu64 ",\"used\":%" PRIu64 ",\"pinned\":%" PRIu64 "}",
                        t->capacity, t->used, t->pinned);
        }

        fputs("],\"links\":[", f);
        sep = "";
        for (size_t i = 0; i < s->n_links; i++) {
                const Tier__LinkStatus *l = s->links[i];

                if (!l)
                        continue;
                fprintf(f, "%s{\"name\":", sep);
                sep = ",";
                json_string(f, l->name);
                fprintf(f, ",\"bytes\":%" PRIu64 ",\"ops\":%" PRIu64 "}", l->bytes, l->ops);
        }

        fputs("],\"targets\":[", f);
        sep = "";
        for (size_t i = 0; i < s->n_targets; i++) {
                const Tier__TargetStatus *t = s->targets[i];

                if (!t)
                        continue;
                fprintf(f, "%s{\"path\":", sep);
                sep = ",";
                json_string(f, t->path);
                fprintf(f, ",\"capacity\":%" PRIu64 ",\"used\":%" PRIu64 ",\"bytes_written\":%" PRIu64
                        ",\"bytes_read\":%" PRIu64 ",\"crc_errors\":%" PRIu64 ",\"io_errors\":%" PRIu64 "}",
                        t->capacity, t->used, t->bytes_written, t->bytes_read, t->crc_errors, t->io_errors);
        }

        fputs("],\"jobs\":[", f);
        sep = "";
        for (size_t i = 0; i < s->n_jobs; i++) {
                const Tier__JobStatus *j = s->jobs[i];

                if (!j)
                        continue;
                fprintf(f, "%s{\"id\":%" PRIu64 ",\"name\":", sep, j->id);
                sep = ",";
                json_string(f, j->name);
                fprintf(f, ",\"uid\":%" PRIu32 ",\"connections\":%" PRIu32 ",\"tensors\":%" PRIu32
                        ",\"linger_left_s\":", j->uid, j->connections, j->tensors);
                json_double(f, j->linger_left_s);
                fprintf(f, ",\"weight\":%" PRIu32 ",", j->weight);
                json_usage(f, j);
                fputs(",\"plans\":[", f);
                for (size_t k = 0; k < j->n_plans; k++) {
                        const Tier__PlanStatus *ps = j->plans[k];

                        fprintf(f, "%s{\"phase\":%" PRIu32 ",\"phases\":%" PRIu32 ",\"iterations\":%" PRIu64
                                ",\"step_s\":", k ? "," : "", ps->phase, ps->phases, ps->iterations);
                        json_double(f, ps->step_s);
                        fputs(",\"stall_s\":", f);
                        json_double(f, ps->stall_s);
                        fputs(",\"step_bytes\":{", f);
                        for (size_t l = 0; l < ps->n_step_links; l++) {
                                fprintf(f, "%s", l ? "," : "");
                                json_string(f, ps->step_links[l]->name);
                                fprintf(f, ":%" PRIu64, ps->step_links[l]->bytes);
                        }
                        fputs("}}", f);
                }
                fputs("]}", f);
        }
        fputs("]}\n", f);
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

static void table_print(FILE *f, const Table *t) {
        size_t width[16] = {};

        if (t->n_cols == 0 || t->n_cols > ELEMENTSOF(width))
                return;
        for (size_t i = 0; i < t->n_cells; i++)
                width[i % t->n_cols] = MAX(width[i % t->n_cols], strlen(t->cells[i]));

        for (size_t i = 0; i < t->n_cells; i++) {
                size_t col = i % t->n_cols;
                bool last = col + 1 == t->n_cols;
                int w = (int) width[col];

                if (t->align[col] == 'r')
                        fprintf(f, "%*s", w, t->cells[i]);
                else if (last)
                        fputs(t->cells[i], f);  /* no trailing blanks */
                else
                        fprintf(f, "%-*s", w, t->cells[i]);
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

static int status_table(FILE *f, const Tier__StatusReply *s) {
        char a[FORMAT_BYTES_MAX], b[FORMAT_BYTES_MAX], c[FORMAT_BYTES_MAX], d[FORMAT_BYTES_MAX];
        char up[32];
        bool emulated = false;
        Table t = {};
        int r = 0;

        format_duration(up, sizeof(up), s->uptime_s);
        fprintf(f, "tierd %s, up %s, %" PRIu32 " connection%s\n", s->version && *s->version ? s->version : "?",
                up, s->connections, s->connections == 1 ? "" : "s");

        /* Tiers */
        fputc('\n', f);
        t = (Table) { .n_cols = 6, .align = "llrrrr" };
        table_cell(&t, "TIER");
        table_cell(&t, "BACKEND");
        table_cell(&t, "CAPACITY");
        table_cell(&t, "USED");
        table_cell(&t, "PINNED");
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
                table_cell(&t, "%s", format_bytes(a, sizeof(a), ts->capacity));
                table_cell(&t, "%s", format_bytes(b, sizeof(b), ts->used));
                table_cell(&t, "%s", format_bytes(c, sizeof(c), ts->pinned));
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
                        table_cell(&t, "%s", format_bytes(a, sizeof(a), l->bytes));
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
                        table_cell(&t, "%s", format_bytes(a, sizeof(a), ts->capacity));
                        table_cell(&t, "%s", format_bytes(b, sizeof(b), ts->used));
                        table_cell(&t, "%s", format_bytes(c, sizeof(c), ts->bytes_written));
                        table_cell(&t, "%s", format_bytes(d, sizeof(d), ts->bytes_read));
                        table_cell(&t, "%" PRIu64, ts->crc_errors);
                        table_cell(&t, "%" PRIu64, ts->io_errors);
                }
                if (t.error < 0)
                        goto finish;
                table_print(f, &t);
                table_done(&t);
        }

        /* Jobs: usage per tier as "used / limit" */
        fputc('\n', f);
        if (s->n_jobs == 0)
                fputs("no jobs\n", f);
        else {
                t = (Table) { .n_cols = 9, .align = "rlrrrrrrr" };
                table_cell(&t, "JOB");
                table_cell(&t, "NAME");
                table_cell(&t, "UID");
                table_cell(&t, "CONN");
                table_cell(&t, "TENSORS");
                table_cell(&t, "VRAM USED/LIMIT");
                table_cell(&t, "HOST USED/LIMIT");
                table_cell(&t, "NVME USED/LIMIT");
                table_cell(&t, "LINGER");
                for (size_t i = 0; i < s->n_jobs; i++) {
                        const Tier__JobStatus *j = s->jobs[i];

                        if (!j)
                                continue;
                        table_cell(&t, "%" PRIu64, j->id);
                        table_cell(&t, "%s", j->name ? j->name : "");
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
                                        table_cell(&t, "%s / -", format_bytes(a, sizeof(a), u->used));
                                else
                                        table_cell(&t, "%s / %s", format_bytes(a, sizeof(a), u->used),
                                                   format_bytes(b, sizeof(b), u->limit));
                        }
                        if (j->linger_left_s > 0) {
                                format_duration(up, sizeof(up), j->linger_left_s);
                                table_cell(&t, "%s", up);
                        } else
                                table_cell(&t, "-");
                }
                if (t.error < 0)
                        goto finish;
                table_print(f, &t);
                table_done(&t);

                /* Plans: where each rank is on the timeline and what a step costs */
                t = (Table) { .n_cols = 9, .align = "llrrrrrrr" };
                table_cell(&t, "PLAN OF");
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

                                table_cell(&t, "%s", j->name ? j->name : "");
                                table_cell(&t, "%" PRIu32 "/%" PRIu32, ps->phase, ps->phases);
                                table_cell(&t, "%" PRIu64, ps->iterations);
                                table_cell(&t, "%.3f s", ps->step_s);
                                table_cell(&t, "%.3f s", ps->stall_s);
                                for (size_t l = 0; l < 4; l++)
                                        table_cell(&t, "%s", l < ps->n_step_links ?
                                                   format_bytes(a, sizeof(a), ps->step_links[l]->bytes) : "-");
                        }
                }
                if (t.n_cells > t.n_cols) {
                        fprintf(f, "\nscheduling policy: %s; per step:\n", s->policy ? s->policy : "?");
                        if (t.error < 0)
                                goto finish;
                        table_print(f, &t);
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
        int r = 0;

        if (!s || !ret || (format != TIER_STATUS_TABLE && format != TIER_STATUS_JSON))
                return -EINVAL;

        f = open_memstream(&buf, &size);
        if (!f)
                return -ENOMEM;
        if (format == TIER_STATUS_JSON)
                status_json(f, s);
        else
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
