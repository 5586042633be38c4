/* SPDX-License-Identifier: MIT */
/* planhw.c: read the hardware figures tierctl plan can take from `tierctl bench` results and from tierd. */

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/tierctl/jsonget.h"
#include "client/tierctl/planhw.h"
#include "proto/macro.h"

_printf_(3, 4) static int fail(char *err, size_t err_size, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        (void) vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
        return -EINVAL;
}

/* The best non-suspect GB/s of @op over cells of @target ("striped", or NULL: any). */
static double best(const char *doc, size_t cells, const char *op, const char *target) {
        double b = 0;

        for (size_t i = 0; i < cells; i++) {
                char path[64], s[64];
                double g;
                int suspect = 0;

                (void) snprintf(path, sizeof(path), "cells.%zu.op", i);
                if (jget_string(doc, path, s, sizeof(s)) < 0 || strcmp(s, op))
                        continue;
                (void) snprintf(path, sizeof(path), "cells.%zu.target", i);
                if (target && (jget_string(doc, path, s, sizeof(s)) < 0 || strcmp(s, target)))
                        continue;
                (void) snprintf(path, sizeof(path), "cells.%zu.suspect", i);
                (void) jget_bool(doc, path, &suspect);
                (void) snprintf(path, sizeof(path), "cells.%zu.gbps", i);
                if (!suspect && jget_number(doc, path, &g) == 0 && g > b)
                        b = g;
        }
        return b;
}

int planhw_bench(const char *doc, PlanBenchFigures *ret, char *err, size_t err_size) {
        char kind[32];
        double v, rd, wr, last;
        size_t targets, cells;
        const char *over = "striped";

        if (jget_string(doc, "bench", kind, sizeof(kind)) < 0 || strcmp(kind, "storage"))
                return fail(err, err_size, "is not `tierctl bench` results (no \"bench\":\"storage\")");
        if (jget_number(doc, "version", &v) < 0 || v != 1)
                return fail(err, err_size, "has a results version this tierctl does not read (it reads 1)");
        if (jget_length(doc, "targets", &targets) < 0 || targets == 0 || targets > 1024 ||
            jget_length(doc, "cells", &cells) < 0)
                return fail(err, err_size, "has no \"targets\" or no \"cells\"");
        rd = best(doc, cells, "read", over);
        wr = best(doc, cells, "write", over);
        if (rd <= 0 || wr <= 0) {
                over = NULL;            /* one target: no striped cells */
                rd = best(doc, cells, "read", NULL);
                wr = best(doc, cells, "write", NULL);
                targets = 1;
        }
        if (rd <= 0 || wr <= 0)
                return fail(err, err_size, "has no read and write cell that is not suspect");
        *ret = (PlanBenchFigures) { .targets = (unsigned) targets };
        ret->read_gbs = rd / (double) targets;
        ret->write_gbs = wr / (double) targets;
        /* the sustained phase ran on one target, or striped over all */
        if (jget_number(doc, "sustained.gbps_last", &last) == 0 && last > 0) {
                char where[64] = "";

                (void) jget_string(doc, "sustained.target", where, sizeof(where));
                ret->write_gbs = !strcmp(where, "striped") ? last / (double) targets : last;
                ret->write_sustained = true;
        }
        return 0;
}

int planhw_tierd(const char *doc, PlanTierdFigures *ret, char *err, size_t err_size) {
        size_t tiers, targets;
        PlanTierdFigures f = {};

        if (jget_length(doc, "tiers", &tiers) < 0 || jget_length(doc, "targets", &targets) < 0)
                return fail(err, err_size, "tierd's status has no \"tiers\" or \"targets\"");
        for (size_t i = 0; i < tiers; i++) {
                char path[48], name[16], backend[32];
                double cap = 0, bw = 0;

                (void) snprintf(path, sizeof(path), "tiers.%zu.tier", i);
                if (jget_string(doc, path, name, sizeof(name)) < 0)
                        continue;
                (void) snprintf(path, sizeof(path), "tiers.%zu.capacity", i);
                (void) jget_number(doc, path, &cap);
                (void) snprintf(path, sizeof(path), "tiers.%zu.bandwidth", i);
                (void) jget_number(doc, path, &bw);     /* absent from a tierd before it */
                if (!strcmp(name, "vram")) {
                        f.vram_bytes = (uint64_t) cap;
                        f.vram_bandwidth = (uint64_t) bw;
                        (void) snprintf(path, sizeof(path), "tiers.%zu.backend", i);
                        f.vram_emulated = jget_string(doc, path, backend, sizeof(backend)) == 0 &&
                                          !strcmp(backend, "emulated");
                } else if (!strcmp(name, "host"))
                        f.host_bytes = (uint64_t) cap;
                else if (!strcmp(name, "nvme"))
                        f.nvme_bandwidth = (uint64_t) bw;
        }
        f.targets = targets > 1024 ? 1024 : (unsigned) targets;
        *ret = f;
        return 0;
}

char *planhw_bench_default_path(void) {
        const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        char *p = NULL;

        if (x && *x == '/')
                return asprintf(&p, "%s/tierd/bench.json", x) < 0 ? NULL : p;
        if (home && *home == '/')
                return asprintf(&p, "%s/.cache/tierd/bench.json", home) < 0 ? NULL : p;
        return NULL;
}
