/* SPDX-License-Identifier: MIT */
/* fault.h: injected NVMe and VRAM link faults for tests (TIERD_TEST_FAULTS), off unless it is set. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

typedef enum FaultKind {
        FAULT_READ_EIO,         /* a read attempt fails with -EIO (not submitted) */
        FAULT_WRITE_EIO,        /* a write attempt fails with -EIO (not submitted) */
        FAULT_READ_SHORT,       /* a read attempt is submitted for half its length (aligned): a real short read */
        FAULT_WRITE_SHORT,      /* the same for a write */
        FAULT_WRITE_ENOSPC,     /* a write attempt fails with -ENOSPC (not submitted) */
        FAULT_BITFLIP,          /* after a write completed, one bit of what it wrote is flipped in the file */
        FAULT_DELAY,            /* a completion is handed on @ms milliseconds late */
        FAULT_VANISH,           /* the target is gone: this and every later request to it fails with -ENODEV */
        FAULT_VRAM_H2D_EIO,     /* an emulated host -> VRAM copy is reported failed (-EIO) */
        FAULT_VRAM_D2H_EIO,     /* an emulated VRAM -> host copy is reported failed (-EIO) */
        FAULT_INDEX_KILL,       /* tierd SIGKILLs itself at a step of an NVMe index update (state/book.c) */
        FAULT_INDEX_TORN,       /* an NVMe index record is written half, then tierd SIGKILLs itself */
        FAULT_STORE_KILL,       /* tierd SIGKILLs itself in a memory-store record write (state/memstore.c) */
        FAULT_STORE_TABLE,      /* the memory store cannot make its table at start (state/memstore.c: -EMFILE) */
        _FAULT_KIND_MAX,
} FaultKind;

#define FAULT_RULES_MAX 16
#define FAULT_TARGET_ANY UINT32_MAX

typedef struct FaultRule {
        FaultKind kind;
        uint32_t target;        /* target index (configuration order), or FAULT_TARGET_ANY */
        char job[64];           /* only requests for this job's tensors; "" for all */
        uint64_t every;         /* fire on every @every-th matching attempt (1: each) */
        uint64_t after;         /* let this many matching attempts pass first */
        uint64_t count;         /* fire at most this often (0: no limit) */
        uint64_t ms;            /* FAULT_DELAY: how late */
        uint64_t seen;          /* matching attempts so far */
        uint64_t fired;         /* times fired */
} FaultRule;

typedef struct FaultSet {
        FaultRule rules[FAULT_RULES_MAX];
        unsigned n_rules;
        uint64_t gone;          /* bit per target index (< 64) that vanished */
} FaultSet;

/*
 * fault_set_parse() - parse @spec: rules separated by ';', each
 * "KIND[:key=value,...]" with KIND one of nvme-read-eio, nvme-write-eio,
 * nvme-read-short, nvme-write-short, nvme-write-enospc, nvme-bitflip,
 * nvme-delay, nvme-vanish, vram-h2d-eio, vram-d2h-eio, index-kill, index-torn, store-kill, store-table and keys
 * every=N, after=N, count=N, target=N, job=NAME, ms=N (target= only for nvme-* kinds; index-* count the
 * steps of NVMe index updates, every kind of step for index-kill, record writes for index-torn;
 * store-kill two points per memory-store record write: halfway through it, and after it, before the
 * record it replaces is freed; store-table fails the making of the memory store's table at start).
 * Returns 0, or -EINVAL with a message in @err.
 */
int fault_set_parse(const char *spec, FaultSet *ret, char *err, size_t err_size);

const char *fault_kind_to_string(FaultKind k);

/* Bit i set: rule i may fire for requests of job @job (NULL: no job). */
uint32_t fault_job_mask(const FaultSet *f, const char *job);

/*
 * fault_fire() - one attempt of kind @kind to target @target by a request
 * whose job mask is @mask: the rule that fires for it, or NULL.
 */
FaultRule *fault_fire(FaultSet *f, FaultKind kind, uint32_t mask, uint32_t target);

/* Has target @target vanished (a FAULT_VANISH rule fired for it)? */
bool fault_target_gone(const FaultSet *f, uint32_t target);
