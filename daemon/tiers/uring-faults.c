/* SPDX-License-Identifier: MIT */
/* uring-faults.c: tierd's hooks into the io_uring queue (util/uring.c): its log, and injected NVMe faults. */

/*
 * Theory of operation: util/uring.c runs the ring for tierd and for
 * tierctl bench, logs nothing and knows nothing of fault.h; it asks its
 * UringHooks.  tierd's hooks log a failed submission and, when
 * TIERD_TEST_FAULTS is set, decide the faults of each attempt (fault.h):
 * fail it (a target gone, nvme-vanish, read/write EIO, write ENOSPC), cut
 * it short, flip a bit on the medium behind a completed write, or hold a
 * completion back.  Each injected fault is logged ("Injected fault ..."):
 * the tests look for these messages.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/base/log.h"
#include "daemon/tiers/fault.h"
#include "daemon/tiers/uring-faults.h"
#include "util/uring.h"

static void on_submit_failed(Uring *u, int error, unsigned ready, unsigned in_a_row, void *userdata) {
        if (in_a_row == 1)
                log_warning_errno(error, "io_uring_submit() failed with %u request(s) ready, retrying: %m",
                                  ready);
        else
                log_warning_errno(error, "io_uring_submit() failed %u times in a row, %u request(s) ready, "
                                  "retrying: %m", in_a_row, ready);
}

static uint32_t on_fault_mask(Uring *u, const char *job, void *userdata) {
        return fault_job_mask(userdata, job);
}

/* Fail this attempt of @req with @res (@rule NULL: its target is gone). */
static int inject(const UringReq *req, int res, const FaultRule *rule) {
        log_warning("Injected fault %s: %s of %u bytes at offset %" PRIu64 " of target %u fails with %s.",
                    rule ? fault_kind_to_string(rule->kind) : "nvme-vanish (target gone)",
                    req->op == URING_READ ? "read" : "write", req->len - req->done, req->offset + req->done,
                    req->file_index, strerror(-res));
        return res;
}

static int on_fault_submit(Uring *u, const UringReq *req, void *userdata) {
        FaultSet *f = userdata;
        bool rd = req->op == URING_READ;
        FaultRule *rule;

        if (fault_target_gone(f, req->file_index))
                return inject(req, -ENODEV, NULL);
        if ((rule = fault_fire(f, FAULT_VANISH, req->fault_mask, req->file_index)))
                return inject(req, -ENODEV, rule);
        if ((rule = fault_fire(f, rd ? FAULT_READ_EIO : FAULT_WRITE_EIO, req->fault_mask, req->file_index)))
                return inject(req, -EIO, rule);
        if (!rd && (rule = fault_fire(f, FAULT_WRITE_ENOSPC, req->fault_mask, req->file_index)))
                return inject(req, -ENOSPC, rule);
        return 0;
}

/* Half of @len (O_DIRECT aligned) when cut short. */
static unsigned on_fault_short(Uring *u, const UringReq *req, unsigned len, void *userdata) {
        FaultKind k = req->op == URING_READ ? FAULT_READ_SHORT : FAULT_WRITE_SHORT;

        if (len < 8192 || !fault_fire(userdata, k, req->fault_mask, req->file_index))
                return len;
        log_warning("Injected fault %s: %u of %u bytes at offset %" PRIu64 " of target %u submitted.",
                    fault_kind_to_string(k), (len / 2) & ~4095u, len, req->offset + req->done, req->file_index);
        return (len / 2) & ~4095u;
}

/* Flip one bit of the first block the write of @req just put at @off: the crc32c was taken before. */
static void flip_bit(Uring *u, const UringReq *req, uint64_t off) {
        uint64_t blk = off & ~(uint64_t) 4095;
        int fd = uring_file(u, req->file_index);
        void *buf = NULL;

        if (fd < 0 || posix_memalign(&buf, 4096, 4096) != 0)
                return;
        if (pread(fd, buf, 4096, (off_t) blk) == 4096) {
                ((uint8_t *) buf)[off - blk] ^= 0x10;
                if (pwrite(fd, buf, 4096, (off_t) blk) == 4096)
                        log_warning("Injected fault nvme-bitflip: flipped bit 4 of the byte at offset %" PRIu64
                                    " of target %u after the write completed.", off, req->file_index);
        }
        free(buf);
}

/* Corrupt what the attempt wrote, or hold its completion back? */
static bool on_fault_cqe(Uring *u, const UringReq *req, int res, uint64_t *ret_ms, void *userdata) {
        FaultSet *f = userdata;
        FaultRule *rule;

        if (req->op == URING_WRITE && res > 0 && fault_fire(f, FAULT_BITFLIP, req->fault_mask, req->file_index))
                flip_bit(u, req, req->offset + req->done);
        rule = fault_fire(f, FAULT_DELAY, req->fault_mask, req->file_index);
        if (!rule)
                return false;
        log_warning("Injected fault nvme-delay: the completion of a %s at offset %" PRIu64
                    " of target %u is handed on %" PRIu64 " ms late.",
                    req->op == URING_READ ? "read" : "write", req->offset + req->done, req->file_index, rule->ms);
        *ret_ms = rule->ms;
        return true;
}

static const UringHooks hooks_log = {
        .submit_failed = on_submit_failed,
};

static const UringHooks hooks_faults = {
        .submit_failed = on_submit_failed,
        .fault_mask = on_fault_mask,
        .fault_submit = on_fault_submit,
        .fault_short = on_fault_short,
        .fault_cqe = on_fault_cqe,
};

void uring_faults_attach(Uring *u, FaultSet *f) {
        uring_set_hooks(u, f ? &hooks_faults : &hooks_log, f);
}
