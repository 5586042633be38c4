/* SPDX-License-Identifier: MIT */
/* vram.c: choosing the VRAM backend, and the calls every backend answers (optional ones included). */

/*
 * Theory of operation: a VRAM backend is a segment pool plus VramBackendOps.
 * vram_backend_new() picks one from [vram] backend (auto: cuda when a device
 * works, else emulated, the reason logged once).  The vram_*() wrappers here
 * give each optional op its meaning when a backend lacks it: no host
 * registration or copy events (emulated), no throttle (cuda), nothing to
 * stop.  The engine, the host pool and the request layer call only these.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/tiers/vram.h"
#include "proto/macro.h"

int vram_backend_device_new(const Config *c, sd_event *event, VramBackend **ret, char **ret_error) {
        _cleanup_free_ char *why = NULL;
        int r;

        *ret = NULL;
        if (c->vram_backend == VRAM_BACKEND_EMULATED)
                return 0;

        r = vram_cuda_new(c, event, ret, &why);
        if (r >= 0) {
                log_info("VRAM backend: %s", (*ret)->description);
                return 1;
        }
        if (c->vram_backend == VRAM_BACKEND_CUDA) {
                if (asprintf(ret_error, "[vram] backend = cuda, but no CUDA device: %s",
                             why ? why : strerror(-r)) < 0)
                        *ret_error = NULL;
                return r;
        }
        log_notice("no CUDA device: %s; using the emulated VRAM backend", why ? why : strerror(-r));
        return 0;
}

int vram_backend_new(const Config *c, sd_event *event, VramBackend **ret, char **ret_error) {
        int r;

        r = vram_backend_device_new(c, event, ret, ret_error);
        if (r != 0)
                return MIN(r, 0);
        return vram_emul_new(c, event, ret);
}

VramBackend *vram_backend_free(VramBackend *b) {
        if (b)
                b->ops->free(b);
        return NULL;
}

bool vram_backend_stop(VramBackend *b) {
        return !b || !b->ops->stop || b->ops->stop(b);
}

const char *vram_zero_why(int r) {
        if (r == -EBUSY)
                return "an event its job's client gave at an unpin (tier_unpin_after()) is still pending on that "
                       "VRAM: pin again once the client's stream has passed that event";
        return strerror(-r);
}

int vram_numa_node(const VramBackend *b) {
        return b ? b->numa_node : -1;
}

int vram_set_bandwidth(VramBackend *b, uint64_t bandwidth) {
        if (!b || !b->ops->set_bandwidth)
                return -EOPNOTSUPP;
        return b->ops->set_bandwidth(b, bandwidth);
}

int vram_host_register(VramBackend *b, Segment *seg) {
        if (!b || !b->ops->host_register)
                return 0;
        return b->ops->host_register(b, seg->map, seg->pool->seg_size);
}

void vram_host_unregister(VramBackend *b, Segment *seg) {
        if (b && b->ops->host_unregister && seg->map)
                b->ops->host_unregister(b, seg->map);
}

int vram_copy_event(VramBackend *b, const Segment *seg, uint64_t offset, uint64_t len,
                    uint8_t ret[VRAM_IPC_EVENT_SIZE]) {
        if (!b || !seg || !b->ops->copy_event)
                return 0;
        return b->ops->copy_event(b, seg, offset, len, ret);
}

int vram_wait_event(VramBackend *b, const VramRange *ranges, size_t n, const void *handle, size_t size,
                    char *ret_why, size_t why_size) {
        if (ret_why && why_size > 0)
                ret_why[0] = 0;
        if (!b->ops->wait_event)
                return -EOPNOTSUPP;
        if (n == 0)
                return -EINVAL;
        for (size_t i = 0; i < n; i++) {
                const VramRange *g = &ranges[i];

                if (!g->seg || g->len == 0 || g->offset > g->seg->pool->seg_size ||
                    g->len > g->seg->pool->seg_size - g->offset || g->seg->owner != ranges[0].seg->owner)
                        return -EINVAL;
        }
        return b->ops->wait_event(b, ranges, n, handle, size, ret_why, why_size);
}
