/* SPDX-License-Identifier: MIT */
/* wear.c: bytes written to NVMe per job name and per target, kept across restarts. */

/*
 * Theory of operation: flash wears with the bytes written to it, and an
 * operator sharing drives wants to know whose jobs wrote them, over the
 * drives' life, not since tierd last started.  The engine counts the bytes
 * of every NVMe write as it completes, on the target (NvmeTarget.
 * bytes_written) and on the job (Job.nvme_written).  This book adds what
 * came before: per target path, the bytes written before this start
 * (NvmeTarget.wear_base, set by wear_load()); per job name, the bytes that
 * earlier jobs of that name wrote (a job that ends adds its bytes to the
 * book, wear_job_end(), once its last transfer ended).  A total is base +
 * since; a job's (wear_job_written()) also has the bytes of the jobs of its
 * name still ending, not yet in the book.
 *
 * The file (STATE_DIR/wear) is text, one entry a line:
 *
 *     tierd-wear 1
 *     target /var/lib/tierd/nvme0.img 123456789
 *     job train-7b 4096
 *
 * names percent-escaped (bytes below '!', above '~', and '%' as %XX), so
 * any job name fits on a line.  It is written atomically (statefile.c) at
 * an interval and at a clean stop, and read at start; a file that does not
 * parse is set aside as wear.corrupt and the book starts empty, said in the
 * log in words.  The book is bounded: WEAR_JOBS_MAX job names (the name
 * with the fewest bytes goes first) and WEAR_TARGETS_MAX targets.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/statefile.h"
#include "daemon/state/registry.h"
#include "daemon/state/wear.h"
#include "daemon/tiers/tier-nvme.h"
#include "proto/macro.h"
#include "util/escape.h"

#define WEAR_MAGIC "tierd-wear 1"

int wear_new(const char *state_dir, Wear **ret) {
        Wear *w = calloc(1, sizeof(*w));

        if (!w)
                return -ENOMEM;
        if (asprintf(&w->path, "%s/" WEAR_FILE, state_dir) < 0) {
                free(w);
                return -ENOMEM;
        }
        *ret = w;
        return 0;
}

static void entries_free(WearEntry *e, size_t n) {
        for (size_t i = 0; i < n; i++)
                free(e[i].name);
        free(e);
}

Wear *wear_free(Wear *w) {
        if (!w)
                return NULL;
        entries_free(w->targets, w->n_targets);
        entries_free(w->jobs, w->n_jobs);
        free(w->path);
        free(w);
        return NULL;
}

static WearEntry *entry_find(WearEntry *e, size_t n, const char *name) {
        for (size_t i = 0; i < n; i++)
                if (strcmp(e[i].name, name) == 0)
                        return &e[i];
        return NULL;
}

static uint64_t add_sat(uint64_t a, uint64_t b) {
        return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/*
 * Add @bytes to entry @name of (*@e, *@n), making it if needed.  When the
 * array holds @max entries, the one with the fewest bytes is dropped first
 * (if it has fewer than @bytes; else the new one is): *@forgot is set.
 */
static int entry_add(WearEntry **e, size_t *n, size_t max, const char *name, uint64_t bytes, bool *forgot) {
        WearEntry *x = entry_find(*e, *n, name), *a;
        size_t least = 0;
        char *s;

        if (x) {
                x->bytes = add_sat(x->bytes, bytes);
                return 0;
        }
        if (*n >= max) {
                for (size_t i = 1; i < *n; i++)
                        if ((*e)[i].bytes < (*e)[least].bytes)
                                least = i;
                *forgot = true;
                if ((*e)[least].bytes >= bytes)
                        return 0;
                s = strdup(name);
                if (!s)
                        return -ENOMEM;
                free((*e)[least].name);
                (*e)[least] = (WearEntry) { s, bytes };
                return 0;
        }
        s = strdup(name);
        if (!s)
                return -ENOMEM;
        a = reallocarray(*e, *n + 1, sizeof(WearEntry));
        if (!a) {
                free(s);
                return -ENOMEM;
        }
        *e = a;
        (*e)[(*n)++] = (WearEntry) { s, bytes };
        return 0;
}

uint64_t wear_job_base(const Wear *w, const char *name) {
        const WearEntry *x;

        if (!w)
                return 0;
        x = entry_find(w->jobs, w->n_jobs, name);
        return x ? x->bytes : 0;
}

uint64_t wear_job_written(const Wear *w, const Registry *reg, const Job *j) {
        uint64_t sum = add_sat(wear_job_base(w, j->name), j->nvme_written);

        list_for_each_safe(node, tmp, &reg->dying_jobs) {
                const Job *d = list_entry(node, const Job, link);

                if (d != j && strcmp(d->name, j->name) == 0)
                        sum = add_sat(sum, d->nvme_written);
        }
        return sum;
}

void wear_job_end(Wear *w, const Job *j) {
        if (!w || j->nvme_written == 0)
                return;
        /* -ENOMEM loses this job's bytes from the book; its targets still count them */
        (void) entry_add(&w->jobs, &w->n_jobs, WEAR_JOBS_MAX, j->name, j->nvme_written, &w->forgot);
}

/* ---- the file ------------------------------------------------------------------------ */

static int hexval(char c) {
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'A' && c <= 'F')
                return c - 'A' + 10;
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        return -1;
}

/* Undo percent-escaping of @s (in place); -EINVAL on a bad escape or an escaped NUL. */
static int unescape(char *s) {
        char *o = s;

        for (; *s; s++) {
                int hi, lo;

                if (*s != '%') {
                        *o++ = *s;
                        continue;
                }
                hi = hexval(s[1]);
                lo = hi < 0 ? -1 : hexval(s[2]);
                if (lo < 0 || (hi == 0 && lo == 0))
                        return -EINVAL;
                *o++ = (char) (hi << 4 | lo);
                s += 2;
        }
        *o = '\0';
        return 0;
}

static void escape(FILE *f, const char *s) {
        for (const unsigned char *p = (const unsigned char *) s; *p; p++)
                if (*p <= ' ' || *p > '~' || *p == '%')
                        fprintf(f, "%%%02X", *p);
                else
                        fputc(*p, f);
}

static int parse_u64(const char *s, uint64_t *ret) {
        uint64_t v = 0;

        if (!*s)
                return -EINVAL;
        for (; *s; s++) {
                unsigned d;

                if (*s < '0' || *s > '9')
                        return -EINVAL;
                d = (unsigned) (*s - '0');
                if (v > (UINT64_MAX - d) / 10)
                        return -ERANGE;
                v = v * 10 + d;
        }
        *ret = v;
        return 0;
}

int wear_parse(Wear *w, const char *text, char *ret_why, size_t why_size) {
        _cleanup_free_ char *copy = strdup(text);
        char *line, *save = NULL;
        unsigned lineno = 0;
        bool magic = false;
        int r;

        if (!copy)
                return -ENOMEM;
        if (text[0] == '\0' || text[strlen(text) - 1] != '\n') {
                (void) snprintf(ret_why, why_size, "it does not end with a newline (cut short?)");
                return -EBADMSG;
        }
        for (line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                char kind[8], *name, *num;
                uint64_t bytes = 0;

                lineno++;
                if (!magic) {
                        if (strcmp(line, WEAR_MAGIC) != 0) {
                                (void) snprintf(ret_why, why_size, "line 1 is not \"" WEAR_MAGIC "\"");
                                return -EBADMSG;
                        }
                        magic = true;
                        continue;
                }
                name = strchr(line, ' ');
                num = name ? strchr(name + 1, ' ') : NULL;
                if (!name || !num || strchr(num + 1, ' ') || (size_t) (name - line) >= sizeof(kind)) {
                        (void) snprintf(ret_why, why_size, "line %u is not \"target|job NAME BYTES\"", lineno);
                        return -EBADMSG;
                }
                (void) snprintf(kind, sizeof(kind), "%.*s", (int) (name - line), line);
                *num++ = '\0';
                name++;
                if (unescape(name) < 0 || !*name) {
                        (void) snprintf(ret_why, why_size, "line %u has a bad name", lineno);
                        return -EBADMSG;
                }
                if (parse_u64(num, &bytes) < 0) {
                        (void) snprintf(ret_why, why_size, "line %u: '%s' is not a byte count", lineno, num);
                        return -EBADMSG;
                }
                if (strcmp(kind, "target") == 0)
                        r = entry_add(&w->targets, &w->n_targets, WEAR_TARGETS_MAX, name, bytes, &w->forgot);
                else if (strcmp(kind, "job") == 0)
                        r = entry_add(&w->jobs, &w->n_jobs, WEAR_JOBS_MAX, name, bytes, &w->forgot);
                else {
                        (void) snprintf(ret_why, why_size, "line %u: unknown kind '%s'", lineno, kind);
                        return -EBADMSG;
                }
                if (r < 0)
                        return r;
        }
        if (!magic) {
                (void) snprintf(ret_why, why_size, "it is empty");
                return -EBADMSG;
        }
        return 0;
}

/* Each job of @list, live or dying, with its bytes since start added to the entry of its name. */
static int jobs_merge(WearEntry **e, size_t *n, const List *list, bool *forgot) {
        list_for_each_safe(node, tmp, list) {
                const Job *j = list_entry(node, const Job, link);
                int r;

                if (j->nvme_written == 0)
                        continue;
                r = entry_add(e, n, WEAR_JOBS_MAX, j->name, j->nvme_written, forgot);
                if (r < 0)
                        return r;
        }
        return 0;
}

int wear_format(const Wear *w, const NvmeTier *nvme, const Registry *reg, char **ret) {
        _cleanup_free_ char *buf = NULL;
        WearEntry *targets = NULL, *jobs = NULL;
        size_t n_targets = 0, n_jobs = 0, size = 0;
        bool forgot = false;
        FILE *f = NULL;
        int r = 0;

        /* copies: the book itself changes only when jobs end */
        for (size_t i = 0; r >= 0 && i < w->n_targets; i++)
                r = entry_add(&targets, &n_targets, WEAR_TARGETS_MAX, w->targets[i].name, w->targets[i].bytes, &forgot);
        for (size_t i = 0; r >= 0 && i < w->n_jobs; i++)
                r = entry_add(&jobs, &n_jobs, WEAR_JOBS_MAX, w->jobs[i].name, w->jobs[i].bytes, &forgot);
        for (unsigned i = 0; r >= 0 && nvme && i < nvme->n_targets; i++) {
                const NvmeTarget *tg = &nvme->targets[i];

                /* a target's entry is its base; what it wrote since goes on top */
                if (entry_find(targets, n_targets, tg->path))
                        entry_find(targets, n_targets, tg->path)->bytes = add_sat(tg->wear_base, tg->bytes_written);
                else
                        r = entry_add(&targets, &n_targets, WEAR_TARGETS_MAX, tg->path,
                                      add_sat(tg->wear_base, tg->bytes_written), &forgot);
        }
        if (r >= 0 && reg)
                r = jobs_merge(&jobs, &n_jobs, &reg->jobs, &forgot);
        if (r >= 0 && reg)
                r = jobs_merge(&jobs, &n_jobs, &reg->dying_jobs, &forgot);
        if (r >= 0) {
                f = open_memstream(&buf, &size);
                if (!f)
                        r = -ENOMEM;
        }
        if (r >= 0) {
                fputs(WEAR_MAGIC "\n", f);
                for (size_t i = 0; i < n_targets; i++) {
                        fputs("target ", f);
                        escape(f, targets[i].name);
                        fprintf(f, " %" PRIu64 "\n", targets[i].bytes);
                }
                for (size_t i = 0; i < n_jobs; i++) {
                        fputs("job ", f);
                        escape(f, jobs[i].name);
                        fprintf(f, " %" PRIu64 "\n", jobs[i].bytes);
                }
                if (ferror(f))
                        r = -ENOMEM;
                if (fclose(f) != 0 && r >= 0)
                        r = -ENOMEM;
        }
        entries_free(targets, n_targets);
        entries_free(jobs, n_jobs);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(buf);
        return 0;
}

int wear_load(Wear *w, NvmeTier *nvme, char *ret_why, size_t why_size) {
        _cleanup_free_ char *text = NULL;
        char aside[4200];
        size_t len = 0;
        int r;

        r = statefile_read(w->path, WEAR_FILE_MAX, &text, &len);
        if (r == -ENOENT)
                return 1;
        if (r == -EFBIG || r == -EINVAL) {
                (void) snprintf(ret_why, why_size, "%s", r == -EFBIG ? "it is larger than 64 MiB" :
                                "it is not a regular file");
                goto corrupt;
        }
        if (r < 0) {
                (void) snprintf(ret_why, why_size, "cannot read %s: %s", w->path, strerror(-r));
                return r;
        }
        if (strlen(text) != len) {
                /* parsed up to the NUL, the entries after it would be lost without a word */
                (void) snprintf(ret_why, why_size, "it contains a NUL byte");
                goto corrupt;
        }
        r = wear_parse(w, text, ret_why, why_size);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                goto corrupt;
        for (unsigned i = 0; nvme && i < nvme->n_targets; i++) {
                const WearEntry *x = entry_find(w->targets, w->n_targets, nvme->targets[i].path);

                nvme->targets[i].wear_base = x ? x->bytes : 0;
        }
        return 0;

corrupt:
        /* start empty, keep the bad file for a person */
        entries_free(w->targets, w->n_targets);
        entries_free(w->jobs, w->n_jobs);
        w->targets = w->jobs = NULL;
        w->n_targets = w->n_jobs = 0;
        r = statefile_set_aside(w->path, aside, sizeof(aside));
        if (r < 0)
                (void) snprintf(ret_why + strlen(ret_why), why_size - strlen(ret_why),
                                "; it could not be set aside (%s) and will be overwritten", strerror(-r));
        else
                (void) snprintf(ret_why + strlen(ret_why), why_size - strlen(ret_why),
                                "; it was kept as %s", aside);
        return 2;
}

int wear_save(const Wear *w, const NvmeTier *nvme, const Registry *reg) {
        _cleanup_free_ char *text = NULL;
        int r;

        r = wear_format(w, nvme, reg, &text);
        if (r < 0)
                return r;
        return statefile_write(w->path, text, strlen(text), 0644);
}

/* ---- names an older tierd took ------------------------------------------------------------ */

/* Entry @i of the jobs goes into entry @now's (made if need be; @now taken over): one entry fewer or renamed. */
static int rename_entry(Wear *w, size_t i, char *now) {
        WearEntry *x = entry_find(w->jobs, w->n_jobs, now);

        if (!x) {
                free(w->jobs[i].name);
                w->jobs[i].name = now;
                return 0;
        }
        x->bytes = add_sat(x->bytes, w->jobs[i].bytes);
        free(w->jobs[i].name);
        free(now);
        w->jobs[i] = w->jobs[--w->n_jobs];
        return 0;
}

int wear_job_rename(Wear *w, const char *was, const char *now) {
        WearEntry *x = w ? entry_find(w->jobs, w->n_jobs, was) : NULL;
        char *copy;

        if (!x)
                return 0;
        copy = strdup(now);
        if (!copy)
                return -ENOMEM;
        return rename_entry(w, (size_t) (x - w->jobs), copy);
}

int wear_rename_old(Wear *w, size_t max_name) {
        int n = 0;

        for (size_t i = 0; w && i < w->n_jobs;) {
                char *e = NULL;

                if (!text_needs_escape(w->jobs[i].name)) {
                        i++;
                        continue;
                }
                /*
                 * Its escaped text, else with a hash when an entry has that.  A job restored under the
                 * escaped text is the one this name became (an earlier start restored it so and was
                 * killed before the book was saved, or was a tierd before the names followed): its wear.
                 */
                for (int tagged = 0; tagged < 2; tagged++) {
                        free(e);
                        e = text_escape_name(w->jobs[i].name, max_name, tagged);
                        if (!e)
                                return -ENOMEM;
                        if (!entry_find(w->jobs, w->n_jobs, e))
                                break;
                }
                /* (renamed: entry i needs no escape now; merged: entry i is another one) */
                (void) rename_entry(w, i, e);
                n++;
        }
        return n;
}
