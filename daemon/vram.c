/* SPDX-License-Identifier: MIT */
/* vram.c: choosing the VRAM backend. */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/config.h"
#include "daemon/log.h"
#include "daemon/vram.h"
#include "proto/macro.h"

int vram_backend_new(const Config *c, sd_event *event, VramBackend **ret, char **ret_error) {
        _cleanup_free_ char *why = NULL;
        int r;

        if (c->vram_backend == VRAM_BACKEND_EMULATED)
                return vram_emul_new(c, event, ret);

        r = vram_cuda_new(c, event, ret, &why);
        if (r >= 0)
                return r;
        if (c->vram_backend == VRAM_BACKEND_CUDA) {
                if (asprintf(ret_error, "[vram] backend = cuda, but no CUDA device: %s",
                             why ? why : strerror(-r)) < 0)
                        *ret_error = NULL;
                return r;
        }
        log_notice("no CUDA device: %s; using the emulated VRAM backend", why ? why : strerror(-r));
        return vram_emul_new(c, event, ret);
}

VramBackend *vram_backend_free(VramBackend *b) {
        if (b)
                b->ops->free(b);
        return NULL;
}
