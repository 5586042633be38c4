/* SPDX-License-Identifier: MIT */
/* timeline-plan.c: bench-timeline's iteration plan: the synthetic one, or one read from a file (--plan). */

/*
 * Theory of operation
 *
 * A plan is tensors (name, size) and phases, each a kind (forward,
 * backward, optimizer: which of --fwd-us, --bwd-us, --opt-us stands for
 * its compute) and its accesses (tensor, tier, mode) in order.  The job
 * (timeline-job.c) creates the tensors, submits the plan to tierd, and in
 * every phase checks what an access reads and stamps what it writes; the
 * capacity-aware bound (capbound.c) reads the same arrays.
 *
 * The synthetic plan is built here; a file plan comes from
 * bench/torch_plan.py, which traces tier.torch's own phases for the example
 * language model.  The file is read with jansson, every value checked and
 * bounded: this file does not include bench/common.h, whose util/json.h
 * names its writer's calls like jansson's.
 */

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tier.h>

#include "bench/timeline-plan.h"
#include "proto/macro.h"

static TlPlan *plan_alloc(size_t n_tensors, size_t n_phases, size_t n_acc) {
        TlPlan *p = calloc(1, sizeof(*p));

        if (!p)
                return NULL;
        p->n_tensors = n_tensors;
        p->n_phases = n_phases;
        p->names = calloc(n_tensors, sizeof(char *));
        p->size = calloc(n_tensors, sizeof(uint64_t));
        p->kind = calloc(n_phases, sizeof(TlKind));
        p->start = calloc(n_phases + 1, sizeof(size_t));
        p->acc = calloc(n_acc ? n_acc : 1, sizeof(CbAccess));
        if (!p->names || !p->size || !p->kind || !p->start || !p->acc)
                return tl_plan_free(p);
        return p;
}

TlPlan *tl_plan_free(TlPlan *p) {
        if (!p)
                return NULL;
        for (size_t i = 0; p->names && i < p->n_tensors; i++)
                free(p->names[i]);
        free(p->names);
        free(p->name);
        free(p->size);
        free(p->kind);
        free(p->start);
        free(p->acc);
        free(p);
        return NULL;
}

int tl_plan_synthetic(size_t layers, uint64_t ps, uint64_t gs, uint64_t os, TlPlan **ret) {
        size_t L = layers, n = 0;
        TlPlan *p;

        if (L == 0)
                return -EINVAL;
        p = plan_alloc(3 * L, 3 * L, 6 * L);
        if (!p || !(p->name = strdup("synthetic")))
                goto oom;
        for (size_t i = 0; i < L; i++) {
                static const char prefix[3] = { 'P', 'G', 'O' };

                for (size_t k = 0; k < 3; k++)
                        if (asprintf(&p->names[3 * i + k], "%c%zu", prefix[k], i) < 0) {
                                p->names[3 * i + k] = NULL;
                                goto oom;
                        }
                p->size[3 * i] = ps;
                p->size[3 * i + 1] = gs;
                p->size[3 * i + 2] = os;
        }
        for (size_t i = 0; i < L; i++) {
                p->kind[i] = TL_FWD;
                p->start[i] = n;
                p->acc[n++] = (CbAccess) { (uint32_t) (3 * i), TIER_VRAM, TIER_READ };
        }
        for (size_t i = 0; i < L; i++) {
                size_t b = L - 1 - i;   /* backward runs the layers in reverse */

                p->kind[L + i] = TL_BWD;
                p->start[L + i] = n;
                p->acc[n++] = (CbAccess) { (uint32_t) (3 * b), TIER_VRAM, TIER_READ };
                p->acc[n++] = (CbAccess) { (uint32_t) (3 * b + 1), TIER_VRAM, TIER_WRITE };
        }
        for (size_t i = 0; i < L; i++) {
                p->kind[2 * L + i] = TL_OPT;
                p->start[2 * L + i] = n;
                p->acc[n++] = (CbAccess) { (uint32_t) (3 * i + 1), TIER_HOST, TIER_READ };
                p->acc[n++] = (CbAccess) { (uint32_t) (3 * i + 2), TIER_HOST, TIER_READ_WRITE };
                p->acc[n++] = (CbAccess) { (uint32_t) (3 * i), TIER_HOST, TIER_READ_WRITE };
        }
        p->start[3 * L] = n;
        *ret = p;
        return 0;
oom:
        tl_plan_free(p);
        return -ENOMEM;
}

_printf_(3, 4) static int bad(char *err, size_t size, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        (void) vsnprintf(err, size, fmt, ap);
        va_end(ap);
        return -EBADMSG;
}

int tl_plan_load(const char *path, TlPlan **ret, char *err, size_t err_size) {
        json_error_t jerr;
        json_t *root, *tensors, *phases, *name;
        TlPlan *p = NULL;
        size_t n_acc = 0, n = 0;
        int r;

        root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
        if (!root) {
                FILE *f = fopen(path, "re");

                if (!f)
                        return bad(err, err_size, "cannot read %s: %s", path, strerror(errno));
                fclose(f);
                return bad(err, err_size, "%s is not JSON: line %d: %s", path, jerr.line, jerr.text);
        }
        tensors = json_object_get(root, "tensors");
        phases = json_object_get(root, "phases");
        name = json_object_get(root, "name");
        if (!json_is_array(tensors) || !json_is_array(phases) || json_array_size(tensors) == 0 ||
            json_array_size(phases) == 0) {
                r = bad(err, err_size, "%s: a plan needs non-empty \"tensors\" and \"phases\" arrays", path);
                goto finish;
        }
        if (json_array_size(tensors) > CB_MAX_TENSORS || json_array_size(phases) > TL_MAX_PHASES) {
                r = bad(err, err_size, "%s: more than %u tensors or %u phases", path, CB_MAX_TENSORS, TL_MAX_PHASES);
                goto finish;
        }
        for (size_t k = 0; k < json_array_size(phases); k++) {
                json_t *a = json_object_get(json_array_get(phases, k), "access");

                if (!json_is_array(a) || json_array_size(a) == 0) {
                        r = bad(err, err_size, "%s: phase %zu has no \"access\" array", path, k);
                        goto finish;
                }
                n_acc += json_array_size(a);
        }
        if (n_acc > CB_MAX_ACCESSES) {
                r = bad(err, err_size, "%s: more than %u accesses", path, CB_MAX_ACCESSES);
                goto finish;
        }
        p = plan_alloc(json_array_size(tensors), json_array_size(phases), n_acc);
        if (!p || !(p->name = strdup(json_is_string(name) ? json_string_value(name) : "file"))) {
                r = -ENOMEM;
                goto finish;
        }
        for (size_t i = 0; i < p->n_tensors; i++) {
                json_t *t = json_array_get(tensors, i), *tn = json_object_get(t, "name"),
                       *ts = json_object_get(t, "size");

                if (!json_is_string(tn) || !json_is_integer(ts) || json_integer_value(ts) < 8 ||
                    json_integer_value(ts) % 8 || (uint64_t) json_integer_value(ts) > TL_MAX_TENSOR_SIZE ||
                    strlen(json_string_value(tn)) == 0 || strlen(json_string_value(tn)) > 200) {
                        r = bad(err, err_size, "%s: tensor %zu needs a \"name\" (1 to 200 characters) and a "
                                "\"size\" (a multiple of 8, at most %llu bytes)", path, i,
                                (unsigned long long) TL_MAX_TENSOR_SIZE);
                        goto finish;
                }
                p->names[i] = strdup(json_string_value(tn));
                if (!p->names[i]) {
                        r = -ENOMEM;
                        goto finish;
                }
                p->size[i] = (uint64_t) json_integer_value(ts);
        }
        for (size_t k = 0; k < p->n_phases; k++) {
                json_t *ph = json_array_get(phases, k), *a = json_object_get(ph, "access");
                const char *kind = json_string_value(json_object_get(ph, "kind"));

                if (!kind || strlen(kind) != 1 || !strchr("fbo", kind[0])) {
                        r = bad(err, err_size, "%s: phase %zu: \"kind\" must be \"f\", \"b\" or \"o\"", path, k);
                        goto finish;
                }
                p->kind[k] = kind[0] == 'f' ? TL_FWD : kind[0] == 'b' ? TL_BWD : TL_OPT;
                if (json_array_size(json_object_get(ph, "write_down")) > 0) {
                        r = bad(err, err_size, "%s: phase %zu has write-downs (tier.torch's placements B and C), "
                                "which bench-timeline does not run: write the plan with --placement A", path, k);
                        goto finish;
                }
                p->start[k] = n;
                for (size_t x = 0; x < json_array_size(a); x++) {
                        json_t *e = json_array_get(a, x);
                        json_t *et = json_array_get(e, 0);
                        const char *tier = json_string_value(json_array_get(e, 1));
                        const char *mode = json_string_value(json_array_get(e, 2));
                        CbAccess c = {};

                        if (!json_is_array(e) || json_array_size(e) != 3 || !json_is_integer(et) ||
                            json_integer_value(et) < 0 || (size_t) json_integer_value(et) >= p->n_tensors ||
                            !tier || !mode || (strcmp(tier, "vram") && strcmp(tier, "host")) ||
                            (strcmp(mode, "r") && strcmp(mode, "w") && strcmp(mode, "rw"))) {
                                r = bad(err, err_size, "%s: phase %zu access %zu must be [TENSOR, \"vram\"|\"host\", "
                                        "\"r\"|\"w\"|\"rw\"] with TENSOR an index into \"tensors\"", path, k, x);
                                goto finish;
                        }
                        c.tensor = (uint32_t) json_integer_value(et);
                        c.tier = strcmp(tier, "vram") == 0 ? TIER_VRAM : TIER_HOST;
                        c.mode = strcmp(mode, "r") == 0 ? TIER_READ : strcmp(mode, "w") == 0 ? TIER_WRITE :
                                 TIER_READ_WRITE;
                        for (size_t y = p->start[k]; y < n; y++)
                                if (p->acc[y].tensor == c.tensor && p->acc[y].tier == c.tier) {
                                        r = bad(err, err_size, "%s: phase %zu names tensor %u in one tier twice",
                                                path, k, c.tensor);
                                        goto finish;
                                }
                        p->acc[n++] = c;
                }
        }
        p->start[p->n_phases] = n;
        *ret = p;
        p = NULL;
        r = 0;
finish:
        tl_plan_free(p);
        json_decref(root);
        return r;
}

CbPlan tl_plan_cb(const TlPlan *p) {
        return (CbPlan) { p->n_tensors, p->size, p->n_phases, p->start, p->acc };
}

uint64_t tl_plan_bytes(const TlPlan *p) {
        uint64_t sum = 0;

        for (size_t i = 0; i < p->n_tensors; i++)
                sum += p->size[i];
        return sum;
}
