/* SPDX-License-Identifier: MIT */
/* fault.c: injected NVMe and VRAM link faults for tests (TIERD_TEST_FAULTS), off unless it is set. */

/*
 * Theory of operation: tierd's tests must show what happens when a drive
 * fails, and real drives do not fail on request.  So the I/O path (uring.c,
 * and the emulated VRAM backend for its copies: vram-emul.c) asks a
 * FaultSet, parsed once at start from the environment variable
 * TIERD_TEST_FAULTS (core/manager.c; the service unit unsets it), whether
 * an attempt should fail, be cut short, be corrupted on the medium, come back
 * late, or find its target gone.  Each rule counts the attempts it matches
 * (kind, target, job) and fires on every @every-th one after the first
 * @after, at most @count times.  Without the variable the set is empty and
 * every check is one comparison.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/tiers/fault.h"
#include "proto/macro.h"

#define streq(a, b) (strcmp((a), (b)) == 0)

static const char *const kind_names[_FAULT_KIND_MAX] = {
        [FAULT_READ_EIO] = "nvme-read-eio",
        [FAULT_WRITE_EIO] = "nvme-write-eio",
        [FAULT_READ_SHORT] = "nvme-read-short",
        [FAULT_WRITE_SHORT] = "nvme-write-short",
        [FAULT_WRITE_ENOSPC] = "nvme-write-enospc",
        [FAULT_BITFLIP] = "nvme-bitflip",
        [FAULT_DELAY] = "nvme-delay",
        [FAULT_VANISH] = "nvme-vanish",
        [FAULT_VRAM_H2D_EIO] = "vram-h2d-eio",
        [FAULT_VRAM_D2H_EIO] = "vram-d2h-eio",
        [FAULT_INDEX_KILL] = "index-kill",
        [FAULT_INDEX_TORN] = "index-torn",
        [FAULT_STORE_KILL] = "store-kill",
        [FAULT_STORE_TABLE] = "store-table",
};

const char *fault_kind_to_string(FaultKind k) {
        return k < _FAULT_KIND_MAX ? kind_names[k] : "?";
}

static int parse_u64(const char *s, uint64_t max, uint64_t *ret) {
        char *end;
        unsigned long long v;

        if (*s < '0' || *s > '9')
                return -EINVAL;
        errno = 0;
        v = strtoull(s, &end, 10);
        if (errno || *end || v > max)
                return -EINVAL;
        *ret = v;
        return 0;
}

static int parse_option(FaultRule *r, char *opt, char *err, size_t err_size) {
        char *eq = strchr(opt, '=');
        const char *key = opt, *val;
        uint64_t v = 0;

        if (!eq) {
                snprintf(err, err_size, "option '%s' has no '=VALUE'", opt);
                return -EINVAL;
        }
        *eq = 0;
        val = eq + 1;
        if (streq(key, "job")) {
                if (!*val || strlen(val) >= sizeof(r->job)) {
                        snprintf(err, err_size, "job name '%s' is empty or too long", val);
                        return -EINVAL;
                }
                strcpy(r->job, val);
                return 0;
        }
        if (parse_u64(val, UINT32_MAX - 1, &v) < 0) {
                snprintf(err, err_size, "value '%s' of '%s' is not a number below 2^32", val, key);
                return -EINVAL;
        }
        if (streq(key, "every") && v > 0)
                r->every = v;
        else if (streq(key, "after"))
                r->after = v;
        else if (streq(key, "count"))
                r->count = v;
        else if (streq(key, "target") && v < 64)
                r->target = (uint32_t) v;
        else if (streq(key, "ms") && v <= 60000)
                r->ms = v;
        else {
                snprintf(err, err_size,
                         "unknown option '%s' or value '%s' out of range (every=N>0, after=N, count=N, "
                         "target=N<64, job=NAME, ms=N<=60000)", key, val);
                return -EINVAL;
        }
        return 0;
}

static int parse_rule(FaultSet *f, char *text, char *err, size_t err_size) {
        char *colon = strchr(text, ':'), *opts = NULL, *save = NULL;
        FaultRule *r;
        int k;

        if (colon) {
                *colon = 0;
                opts = colon + 1;
        }
        for (k = 0; k < _FAULT_KIND_MAX; k++)
                if (streq(text, kind_names[k]))
                        break;
        if (k == _FAULT_KIND_MAX) {
                snprintf(err, err_size, "unknown fault kind '%s'", text);
                return -EINVAL;
        }
        if (f->n_rules >= FAULT_RULES_MAX) {
                snprintf(err, err_size, "more than %d rules", FAULT_RULES_MAX);
                return -EINVAL;
        }
        r = &f->rules[f->n_rules];
        *r = (FaultRule) { .kind = (FaultKind) k, .target = FAULT_TARGET_ANY, .every = 1, .ms = 100 };
        for (char *o = opts ? strtok_r(opts, ",", &save) : NULL; o; o = strtok_r(NULL, ",", &save)) {
                int e = parse_option(r, o, err, err_size);

                if (e < 0)
                        return e;
        }
        if (r->target != FAULT_TARGET_ANY && (r->kind == FAULT_VRAM_H2D_EIO || r->kind == FAULT_VRAM_D2H_EIO ||
                                              r->kind == FAULT_INDEX_KILL || r->kind == FAULT_INDEX_TORN ||
                                              r->kind == FAULT_STORE_KILL || r->kind == FAULT_STORE_TABLE)) {
                snprintf(err, err_size, "'%s' takes no target= (only nvme-* faults have one)", text);
                return -EINVAL;
        }
        f->n_rules++;
        return 0;
}

int fault_set_parse(const char *spec, FaultSet *ret, char *err, size_t err_size) {
        char *copy, *save = NULL;
        int r = 0;

        *ret = (FaultSet) {};
        copy = strdup(spec);
        if (!copy) {
                snprintf(err, err_size, "out of memory");
                return -ENOMEM;
        }
        for (char *t = strtok_r(copy, ";", &save); t; t = strtok_r(NULL, ";", &save)) {
                r = parse_rule(ret, t, err, err_size);
                if (r < 0)
                        break;
        }
        free(copy);
        if (r < 0)
                *ret = (FaultSet) {};
        return r;
}

uint32_t fault_job_mask(const FaultSet *f, const char *job) {
        uint32_t m = 0;

        for (unsigned i = 0; f && i < f->n_rules; i++)
                if (!f->rules[i].job[0] || (job && streq(job, f->rules[i].job)))
                        m |= 1u << i;
        return m;
}

FaultRule *fault_fire(FaultSet *f, FaultKind kind, uint32_t mask, uint32_t target) {
        for (unsigned i = 0; f && i < f->n_rules; i++) {
                FaultRule *r = &f->rules[i];

                if (r->kind != kind || !(mask & (1u << i)) || (r->target != FAULT_TARGET_ANY && r->target != target))
                        continue;
                if (r->count && r->fired >= r->count)
                        continue;
                if (r->seen++ < r->after || (r->seen - r->after) % r->every != 0)
                        continue;
                r->fired++;
                if (kind == FAULT_VANISH && target < 64)
                        f->gone |= 1ull << target;
                return r;
        }
        return NULL;
}

bool fault_target_gone(const FaultSet *f, uint32_t target) {
        return f && target < 64 && (f->gone & (1ull << target));
}
