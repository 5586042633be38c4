/* SPDX-License-Identifier: MIT */
/* planfile.c: reading an iteration plan file for tierctl plan's replay (the format is in planfile.h). */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/tierctl/jsonget.h"
#include "client/tierctl/planfile.h"

static int fail(char *err, size_t err_size, int r, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t err_size, int r, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        (void) vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
        return r;
}

void plan_file_done(PlanFile *f) {
        free((void *) f->plan.size);
        free((void *) f->plan.start);
        free((void *) f->plan.acc);
        free((void *) f->plan.down_start);
        free((void *) f->plan.down);
        free(f->kind);
        *f = (PlanFile) {};
}

static int get_count(const char *doc, const char *path, size_t max, size_t *ret, char *err, size_t err_size) {
        int r = jget_length(doc, path, ret);

        if (r < 0)
                return fail(err, err_size, -EINVAL, "\"%s\" is %s", path,
                            r == -ENOENT ? "missing" : "not an array");
        if (*ret < 1 || *ret > max)
                return fail(err, err_size, -EINVAL, "\"%s\" has %zu entries, not 1 to %zu", path, *ret, max);
        return 0;
}

/* The tensor index at @at in @doc (@path: its whole path, for the message): 0 to @n_t - 1. */
static int get_tensor(const char *doc, const char *at, const char *path, size_t n_t, uint32_t *ret, char *err,
                      size_t err_size) {
        double t;

        if (jget_number(doc, at, &t) < 0 || t < 0 || t >= (double) n_t || t != floor(t))
                return fail(err, err_size, -EINVAL, "\"%s\" is not a tensor index (0 to %zu)", path, n_t - 1);
        *ret = (uint32_t) t;
        return 0;
}

int plan_file_parse(const char *doc, PlanFile *ret, char *err, size_t err_size) {
        PlanFile f = {};
        double *size = NULL;
        size_t *start = NULL, *down_start = NULL, n_acc = 0, n_down = 0, n_t, n_p;
        PlanSimAccess *acc = NULL;
        uint32_t *down = NULL;
        char path[96], s[16];
        const char *el, *ph, *ae;
        int r;

        if ((r = get_count(doc, "tensors", PLAN_SIM_MAX_TENSORS, &n_t, err, err_size)) < 0 ||
            (r = get_count(doc, "phases", PLAN_SIM_MAX_PHASES, &n_p, err, err_size)) < 0)
                return r;
        if (jget_string(doc, "name", f.name, sizeof(f.name)) < 0)
                snprintf(f.name, sizeof(f.name), "unnamed");
        size = calloc(n_t, sizeof(*size));
        start = calloc(n_p + 1, sizeof(*start));
        f.kind = calloc(n_p, sizeof(*f.kind));
        if (!size || !start || !f.kind) {
                r = fail(err, err_size, -ENOMEM, "out of memory");
                goto out;
        }
        /* (cursors: each element found once, not by its index from the start: a plan of 12288 phases took minutes) */
        el = jget_at(doc, "tensors.0");
        for (size_t i = 0; i < n_t; i++, el = el ? jget_next(el) : NULL) {
                snprintf(path, sizeof(path), "tensors.%zu.size", i);
                if (!el || jget_number(el, "size", &size[i]) < 0 || !(size[i] >= 0 && size[i] <= 0x1p50) ||
                    size[i] != floor(size[i])) {
                        r = fail(err, err_size, -EINVAL, "\"%s\" is not a size in bytes", path);
                        goto out;
                }
        }
        ph = jget_at(doc, "phases.0");
        for (size_t p = 0; p < n_p; p++, ph = ph ? jget_next(ph) : NULL) {
                size_t n;

                snprintf(path, sizeof(path), "phases.%zu.access", p);
                r = ph ? jget_length(ph, "access", &n) : -EINVAL;
                if (r < 0 || n > 3 * (size_t) PLAN_SIM_MAX_TENSORS) {
                        r = fail(err, err_size, -EINVAL, "\"%s\" is not a list of accesses", path);
                        goto out;
                }
                n_acc += n;
                /* optional: what the client writes down to NVMe on entering the phase */
                snprintf(path, sizeof(path), "phases.%zu.write_down", p);
                r = jget_length(ph, "write_down", &n);
                if (r == -ENOENT)
                        continue;
                if (r < 0 || n > (size_t) PLAN_SIM_MAX_TENSORS) {
                        r = fail(err, err_size, -EINVAL, "\"%s\" is not a list of tensor indices", path);
                        goto out;
                }
                n_down += n;
        }
        if (n_down > 3 * (size_t) PLAN_SIM_MAX_TENSORS) {
                r = fail(err, err_size, -EINVAL, "the plan has %zu write-downs, more than %u", n_down,
                         3 * PLAN_SIM_MAX_TENSORS);
                goto out;
        }
        if (n_acc > 3 * (size_t) PLAN_SIM_MAX_TENSORS) {
                r = fail(err, err_size, -EINVAL, "the plan has %zu accesses, more than %u", n_acc,
                         3 * PLAN_SIM_MAX_TENSORS);
                goto out;
        }
        acc = calloc(n_acc ? n_acc : 1, sizeof(*acc));
        down_start = n_down ? calloc(n_p + 1, sizeof(*down_start)) : NULL;
        down = n_down ? calloc(n_down, sizeof(*down)) : NULL;
        if (!acc || (n_down && (!down_start || !down))) {
                r = fail(err, err_size, -ENOMEM, "out of memory");
                goto out;
        }
        n_acc = 0;
        n_down = 0;
        ph = jget_at(doc, "phases.0");
        for (size_t p = 0; p < n_p && ph; p++, ph = jget_next(ph)) {
                size_t n = 0;

                start[p] = n_acc;
                snprintf(path, sizeof(path), "phases.%zu.kind", p);
                if (jget_string(ph, "kind", s, sizeof(s)) < 0 || strlen(s) != 1 || !strchr("fbo", s[0])) {
                        r = fail(err, err_size, -EINVAL, "\"%s\" is not \"f\", \"b\" or \"o\"", path);
                        goto out;
                }
                f.kind[p] = s[0] == 'f' ? PLAN_FILE_FWD : s[0] == 'b' ? PLAN_FILE_BWD : PLAN_FILE_OPT;
                (void) jget_length(ph, "access", &n);
                ae = jget_at(ph, "access.0");
                for (size_t k = 0; k < n; k++, ae = ae ? jget_next(ae) : NULL) {
                        PlanSimAccess *a = &acc[n_acc++];

                        snprintf(path, sizeof(path), "phases.%zu.access.%zu.0", p, k);
                        if ((r = get_tensor(ae ? ae : "", "0", path, n_t, &a->tensor, err, err_size)) < 0)
                                goto out;
                        snprintf(path, sizeof(path), "phases.%zu.access.%zu.1", p, k);
                        if (!ae || jget_string(ae, "1", s, sizeof(s)) < 0 || (strcmp(s, "vram") && strcmp(s, "host"))) {
                                r = fail(err, err_size, -EINVAL, "\"%s\" is not \"vram\" or \"host\"", path);
                                goto out;
                        }
                        a->tier = s[0] == 'v' ? 0 : 1;
                        snprintf(path, sizeof(path), "phases.%zu.access.%zu.2", p, k);
                        if (jget_string(ae, "2", s, sizeof(s)) < 0 ||
                            (strcmp(s, "r") && strcmp(s, "w") && strcmp(s, "rw"))) {
                                r = fail(err, err_size, -EINVAL, "\"%s\" is not \"r\", \"w\" or \"rw\"", path);
                                goto out;
                        }
                        a->mode = (uint8_t) ((strchr(s, 'r') ? PLAN_SIM_READ : 0) | (strchr(s, 'w') ? PLAN_SIM_WRITE : 0));
                }
                if (!down_start)
                        continue;
                down_start[p] = n_down;
                if (jget_length(ph, "write_down", &n) < 0)
                        n = 0;
                el = jget_at(ph, "write_down.0");
                for (size_t k = 0; k < n; k++, el = el ? jget_next(el) : NULL) {
                        snprintf(path, sizeof(path), "phases.%zu.write_down.%zu", p, k);
                        if ((r = get_tensor(el ? el : "", "", path, n_t, &down[n_down++], err, err_size)) < 0)
                                goto out;
                }
        }
        start[n_p] = n_acc;
        if (down_start)
                down_start[n_p] = n_down;
        f.plan = (PlanSimPlan) { .n_tensors = n_t, .size = size, .n_phases = n_p, .start = start, .acc = acc,
                                 .down_start = down_start, .down = down };
        *ret = f;
        return 0;
out:
        free(size);
        free(start);
        free(acc);
        free(down_start);
        free(down);
        free(f.kind);
        return r;
}

int plan_file_load(const char *path, PlanFile *ret, char *err, size_t err_size) {
        char *doc = NULL, sub[200];
        size_t len = 0;
        int fd, r;

        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return fail(err, err_size, -errno, "cannot read --plan %s: %s", path, strerror(errno));
        doc = malloc(PLAN_FILE_MAX_BYTES + 1);
        if (!doc) {
                close(fd);
                return fail(err, err_size, -ENOMEM, "out of memory");
        }
        for (;;) {
                ssize_t n = read(fd, doc + len, PLAN_FILE_MAX_BYTES + 1 - len);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0) {
                        r = fail(err, err_size, -errno, "cannot read --plan %s: %s", path, strerror(errno));
                        goto out;
                }
                if (n == 0)
                        break;
                len += (size_t) n;
                if (len > PLAN_FILE_MAX_BYTES) {
                        r = fail(err, err_size, -EFBIG, "--plan %s is larger than %u MiB", path,
                                 PLAN_FILE_MAX_BYTES >> 20);
                        goto out;
                }
        }
        doc[len] = 0;
        r = plan_file_parse(doc, ret, sub, sizeof(sub));
        if (r < 0)
                (void) fail(err, err_size, r, "--plan %s: %s (the format is bench/torch_plan.py's)", path, sub);
out:
        free(doc);
        close(fd);
        return r;
}
