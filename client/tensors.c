/* SPDX-License-Identifier: MIT */
/* tensors.c: tensor handles, and what a handle asks of tierd: pins, evictions, prefetches. */

/*
 * Theory of operation
 *
 * A tier_tensor is a handle on one of the job's tensors, made by
 * tier_tensor_create() or tier_tensor_open() from tierd's TensorInfo.
 * Handles are linked into their client, so that tier_client_free() can
 * invalidate them: a handle outlives its client, every call on it then
 * fails with -ENOTCONN (tensor_check()), and the user still closes it.
 * tier_tensor_destroy() frees the tensor in tierd and only then the handle.
 *
 * tier_pin() and tier_pin_async() ask tierd for a copy in a tier and turn
 * the grant that comes back into an address through the segment cache
 * (segment_resolve_grant()).  A synchronous pin is answered once the data
 * is there, but a fence that comes with it is waited for all the same; an
 * asynchronous pin hands the fence to the caller.  Should resolving the
 * grant fail, tierd still holds a pin the caller never sees, so it is
 * given back at once, keeping the first error's text.
 *
 * tier_unpin_after() releases a VRAM pin only once GPU work queued on a
 * stream is done: it records a CUDA interprocess event on that stream and
 * sends it with the Unpin, for tierd's copies to wait on.
 *
 * Evictions and prefetches have the shape of a pin without a grant:
 * {tensor, tier, async} answered with a fence (tensor_move()).
 */

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <tier.h>

#include "client/client-cuda.h"
#include "client/client-internal.h"
#include "client/tier-private.h"
#include "proto/macro.h"
#include "proto/tier.pb-c.h"

int tensor_check(const tier_tensor *t) {
        if (!t)
                return -EINVAL;
        if (!t->client)
                return -ENOTCONN;       /* its client was freed */
        if (t->gone)
                return client_error(t->client, -ESTALE, "tensor '%s' does not exist in tierd since it restarted",
                                    t->name);
        return 0;
}

int tensor_open_raw(tier_client *c, const char *name, uint64_t *ret_id, uint64_t *ret_size) {
        Tier__Open op = TIER__OPEN__INIT;
        Tier__Request req = TIER__REQUEST__INIT;
        Packet p = PACKET_NULL;
        int r;

        op.name = (char *) name;
        req.op_case = TIER__REQUEST__OP_OPEN;
        req.open = &op;
        r = transport_call(c, &req, &p);
        if (r < 0)
                return r;
        r = transport_expect(c, &p, TIER__RESPONSE__RESULT_TENSOR, "a tensor request");
        if (r < 0)
                return r;
        *ret_id = p.reply->response->tensor->tensor;
        if (ret_size)
                *ret_size = p.reply->response->tensor->size;
        packet_done(&p);
        return 0;
}

static int tensor_check_name(tier_client *c, const char *name) {
        size_t len;

        if (!name_valid(name))
                return name_refusal(c->last_error, sizeof(c->last_error), "tensor", name);
        len = strlen(name);
        if (c->max_name > 0 && len > c->max_name)
                return client_error(c, -ENAMETOOLONG, "tensor name is %zu bytes, tierd allows %u",
                                    len, c->max_name);
        return 0;
}

/* Turn a TensorInfo answer into a handle. */
static int tensor_from_reply(tier_client *c, Packet *p, const char *name, tier_tensor **ret) {
        const Tier__TensorInfo *ti;
        tier_tensor *t;
        int r;

        r = transport_expect(c, p, TIER__RESPONSE__RESULT_TENSOR, "a tensor request");
        if (r < 0)
                return r;
        ti = p->reply->response->tensor;

        t = calloc(1, sizeof(*t));
        if (!t) {
                packet_done(p);
                return client_error(c, -ENOMEM, "out of memory");
        }
        t->id = ti->tensor;
        t->size = ti->size;
        t->name = strdup(ti->name && *ti->name ? ti->name : name);
        packet_done(p);
        if (!t->name) {
                free(t);
                return client_error(c, -ENOMEM, "out of memory");
        }

        t->client = c;
        t->serial = ++c->handle_serial;
        t->next = c->tensors;
        if (c->tensors)
                c->tensors->prev = t;
        c->tensors = t;
        *ret = t;
        return 0;
}

_public_ int tier_tensor_create(tier_client *c, const char *name, uint64_t size, tier_tensor **ret) {
        Tier__Create op = TIER__CREATE__INIT;
        Tier__Request req = TIER__REQUEST__INIT;
        Packet p = PACKET_NULL;
        int r;

        if (!c)
                return -EINVAL;
        if (!ret)
                return client_error(c, -EINVAL, "ret is NULL: there is nowhere to store the tensor handle");
        r = tensor_check_name(c, name);
        if (r < 0)
                return r;
        if (size == 0)
                return client_error(c, -EINVAL, "tensor size must not be 0");

        op.name = (char *) name;
        op.size = size;
        req.op_case = TIER__REQUEST__OP_CREATE;
        req.create = &op;
        r = transport_call(c, &req, &p);
        if (r < 0)
                return r;
        return tensor_from_reply(c, &p, name, ret);
}

_public_ int tier_tensor_open(tier_client *c, const char *name, tier_tensor **ret) {
        Tier__Open op = TIER__OPEN__INIT;
        Tier__Request req = TIER__REQUEST__INIT;
        Packet p = PACKET_NULL;
        int r;

        if (!c)
                return -EINVAL;
        if (!ret)
                return client_error(c, -EINVAL, "ret is NULL: there is nowhere to store the tensor handle");
        r = tensor_check_name(c, name);
        if (r < 0)
                return r;

        op.name = (char *) name;
        req.op_case = TIER__REQUEST__OP_OPEN;
        req.open = &op;
        r = transport_call(c, &req, &p);
        if (r < 0)
                return r;
        return tensor_from_reply(c, &p, name, ret);
}

_public_ tier_tensor *tier_tensor_close(tier_tensor *t) {
        if (!t)
                return NULL;
        for (int tier = 0; tier < 2; tier++)
                view_clear(t->client, &t->views[tier]);
        if (t->client) {
                (void) held_forget_tensor(t->client, t);        /* (out of memory: its grants go unnamed) */
                if (t->prev)
                        t->prev->next = t->next;
                else
                        t->client->tensors = t->next;
                if (t->next)
                        t->next->prev = t->prev;
        }
        free(t->name);
        free(t);
        return NULL;
}

_public_ int tier_tensor_destroy(tier_tensor *t) {
        Tier__Free op = TIER__FREE__INIT;
        Tier__Request req = TIER__REQUEST__INIT;
        Packet p = PACKET_NULL;
        int r;

        r = tensor_check(t);
        if (r < 0)
                return r;
        op.tensor = t->id;
        req.op_case = TIER__REQUEST__OP_FREE;
        req.free = &op;
        r = transport_call(t->client, &req, &p);
        if (r < 0)
                return r;       /* the handle stays valid */
        packet_done(&p);
        tier_tensor_close(t);
        return 0;
}

_public_ uint64_t tier_tensor_size(const tier_tensor *t) {
        return t ? t->size : 0;
}

_public_ const char *tier_tensor_name(const tier_tensor *t) {
        return t ? t->name : NULL;
}

static int copy_state_from_string(const char *s) {
        static const char *const states[] = { "absent", "filling", "resident", "draining" };

        for (size_t i = 0; s && i < ELEMENTSOF(states); i++)
                if (strcmp(s, states[i]) == 0)
                        return (int) i;
        return -EPROTO;
}

_public_ int tier_tensor_stat(tier_tensor *t, struct tier_stat *ret) {
        Tier__Stat op = TIER__STAT__INIT;
        Tier__Request req = TIER__REQUEST__INIT;
        Packet p = PACKET_NULL;
        const Tier__StatReply *sr;
        struct tier_stat st = {};
        tier_client *c;
        int r;

        r = tensor_check(t);
        if (r < 0)
                return r;
        if (!ret)
                return client_error(t->client, -EINVAL, "ret is NULL: there is nowhere to store the stat");
        c = t->client;

        op.tensor = t->id;
        req.op_case = TIER__REQUEST__OP_STAT;
        req.stat = &op;
        r = transport_call(c, &req, &p);
        if (r < 0)
                return r;
        r = transport_expect(c, &p, TIER__RESPONSE__RESULT_STAT, "stat");
        if (r < 0)
                return r;
        sr = p.reply->response->stat;

        st.size = sr->size ? sr->size : t->size;
        for (size_t i = 0; i < sr->n_copies; i++) {
                const Tier__CopyState *cs = sr->copies[i];
                int state;

                if (!cs || !tier_valid((int) cs->tier))
                        continue;
                state = copy_state_from_string(cs->state);
                if (state < 0) {
                        r = client_error(c, state, "tierd reported unknown copy state \"%s\"",
                                         cs->state ? cs->state : "");
                        packet_done(&p);
                        return r;
                }
                st.state[cs->tier] = state;
                st.dirty[cs->tier] = !!cs->dirty;
                st.pins[cs->tier] = cs->pins;
        }
        packet_done(&p);
        *ret = st;
        return 0;
}

/* @event: NULL, or an interprocess event handle tierd's copies of the tensor wait for. */
static int tensor_unpin(tier_tensor *t, int tier, int dirty, const uint8_t *event) {
        Tier__Unpin op = TIER__UNPIN__INIT;
        Tier__Request req = TIER__REQUEST__INIT;
        Packet p = PACKET_NULL;
        int r;

        op.tensor = t->id;
        op.tier = (Tier__Tier) tier;
        op.dirty = !!dirty;
        if (event)
                op.ipc_event = (ProtobufCBinaryData) { .len = CLIENT_CUDA_EVENT_SIZE, .data = (uint8_t *) event };
        req.op_case = TIER__REQUEST__OP_UNPIN;
        req.unpin = &op;
        r = transport_call(t->client, &req, &p);
        if (r < 0)
                return r;
        packet_done(&p);
        return 0;
}

static int tensor_pin(tier_tensor *t, int tier, int mode, bool async, struct tier_grant *ret,
                      tier_fence *ret_fence) {
        Tier__Pin op = TIER__PIN__INIT;
        Tier__Request req = TIER__REQUEST__INIT;
        Packet p = PACKET_NULL;
        struct tier_grant g;
        tier_client *c;
        tier_fence fence;
        int r;

        r = tensor_check(t);
        if (r < 0)
                return r;
        c = t->client;
        if (!tier_valid(tier))
                return client_error(c, -EINVAL, "%d is not a tier", tier);
        if (mode < TIER_READ || mode > TIER_READ_WRITE)
                return client_error(c, -EINVAL, "mode %d is not TIER_READ, TIER_WRITE or TIER_READ_WRITE", mode);
        if (!ret)
                return client_error(c, -EINVAL, "ret is NULL: there is nowhere to store the grant");
        if (async && !ret_fence)
                return client_error(c, -EINVAL, "ret_fence is NULL: there is nowhere to store the fence");

        op.tensor = t->id;
        op.tier = (Tier__Tier) tier;
        op.async = async;
        op.mode = (uint32_t) mode;
        req.op_case = TIER__REQUEST__OP_PIN;
        req.pin = &op;
        r = transport_call(c, &req, &p);
        if (r < 0)
                return r;
        r = transport_expect(c, &p, TIER__RESPONSE__RESULT_PIN, "pin");
        if (r < 0)
                return r;
        if (!p.reply->response->pin->grant) {
                packet_done(&p);
                r = client_error(c, -EPROTO, "tierd answered pin without a grant");
                goto unpin;
        }
        fence = p.reply->response->pin->fence;
        if (fence)
                fence += c->fence_offset;       /* numbered after the fences of before a restart */
        if (fence & CLIENT_FENCE_TAG_MASK) {
                packet_done(&p);
                r = client_error(c, -EPROTO, "tierd's fence number %" PRIu64 " runs into the client's tag bits", fence);
                goto unpin;
        }
        if (fence && p.reply->response->pin->ipc_event.len == CLIENT_CUDA_EVENT_SIZE)
                fence_add_event(c, fence, p.reply->response->pin->ipc_event.data);
        fence_saw(c, fence);
        /* the grant's pieces live in the packet: resolved before it goes */
        r = segment_resolve_grant(c, t, p.reply->response->pin->grant, &g);
        packet_done(&p);
        if (r < 0)
                goto unpin;

        /* A synchronous pin is answered when the data is there; wait anyway if tierd gave a fence. */
        if (!async && fence != 0) {
                r = fence_wait(c, fence, -1);
                if (r < 0)
                        goto unpin;
                fence = 0;
        }

        *ret = g;
        if (ret_fence)
                *ret_fence = fence_out(c, fence);
        /* (out of memory, it goes unnoted: a restart of tierd would then take a write-only one back) */
        (void) held_pin(c, t, tier, (mode & TIER_WRITE) != 0);
        return 0;

unpin: {
        /* tierd holds a pin the caller will never see: give it back (best effort, keep the first error). */
        char saved[CLIENT_ERROR_MAX];

        memcpy(saved, c->last_error, sizeof(saved));
        (void) tensor_unpin(t, tier, 0, NULL);
        memcpy(c->last_error, saved, sizeof(saved));
        return r;
}
}

_public_ int tier_pin(tier_tensor *t, int tier, int mode, struct tier_grant *ret) {
        return tensor_pin(t, tier, mode, false, ret, NULL);
}

_public_ int tier_pin_async(tier_tensor *t, int tier, int mode, struct tier_grant *ret, tier_fence *ret_fence) {
        return tensor_pin(t, tier, mode, true, ret, ret_fence);
}

_public_ int tier_unpin(tier_tensor *t, int tier, int dirty) {
        int r;

        r = tensor_check(t);
        if (r < 0)
                return r;
        if (!tier_valid(tier))
                return client_error(t->client, -EINVAL, "%d is not a tier", tier);
        if (tier == TIER_NVME)  /* never pinned (tier_pin(3)): a wrong argument, not a missing pin */
                return client_error(t->client, -EINVAL, "tensors are pinned in vram or host, not nvme");
        r = tensor_unpin(t, tier, dirty, NULL);
        if (r >= 0 || r == -ERESTART)   /* (refused: tierd holds it still; after a restart the list is new) */
                held_unpin(t->client, t, tier);
        return r;
}

_public_ int tier_unpin_after(tier_tensor *t, int tier, int dirty, void *stream) {
        uint8_t event[CLIENT_CUDA_EVENT_SIZE];
        ClientCuda *cc;
        int r;

        r = tensor_check(t);
        if (r < 0)
                return r;
        if (tier != TIER_VRAM)
                return client_error(t->client, -EINVAL, "only VRAM pins can be released after GPU work");
        if (!t->client->vram_backend) {
                /* no connection (a reconnect timed out): the next tierd's backend is unknown until joined */
                r = transport_check(t->client);
                return client_reconnect(t->client, r < 0 ? r : -ENOTCONN);
        }
        if (strcmp(t->client->vram_backend, "cuda") != 0)
                return client_error(t->client, -EOPNOTSUPP, "tierd's VRAM backend is \"%s\", not cuda",
                                    t->client->vram_backend);
        cc = client_get_cuda(t->client);
        if (!cc)
                return t->client->cuda_failed;
        r = client_cuda_record(cc, stream, event);
        if (r < 0)
                return client_error(t->client, r, "%s", client_cuda_error(cc));
        r = tensor_unpin(t, tier, dirty, event);
        if (r >= 0 || r == -ERESTART)
                held_unpin(t->client, t, tier);
        return r;
}

/* Evict and prefetch share a shape: {tensor, tier, async} -> FenceReply. */
static int tensor_move(tier_tensor *t, int tier, bool evict, bool async, tier_fence *ret_fence) {
        Tier__Evict ev = TIER__EVICT__INIT;
        Tier__Prefetch pf = TIER__PREFETCH__INIT;
        Tier__Request req = TIER__REQUEST__INIT;
        Packet p = PACKET_NULL;
        tier_client *c;
        tier_fence fence;
        int r;

        r = tensor_check(t);
        if (r < 0)
                return r;
        c = t->client;
        if (!tier_valid(tier))
                return client_error(c, -EINVAL, "%d is not a tier", tier);
        if (async && !ret_fence)
                return client_error(c, -EINVAL, "ret_fence is NULL: there is nowhere to store the fence");

        if (evict) {
                ev.tensor = t->id;
                ev.tier = (Tier__Tier) tier;
                ev.async = async;
                req.op_case = TIER__REQUEST__OP_EVICT;
                req.evict = &ev;
        } else {
                pf.tensor = t->id;
                pf.tier = (Tier__Tier) tier;
                pf.async = async;
                req.op_case = TIER__REQUEST__OP_PREFETCH;
                req.prefetch = &pf;
        }
        r = transport_call(c, &req, &p);
        if (r < 0)
                return r;
        /* A fence of 0 needs no body: accept a Response without a result as "done". */
        fence = p.reply->response->result_case == TIER__RESPONSE__RESULT_FENCE && p.reply->response->fence ?
                p.reply->response->fence->fence : 0;
        if (fence)
                fence += c->fence_offset;       /* numbered after the fences of before a restart */
        packet_done(&p);
        if (fence & CLIENT_FENCE_TAG_MASK)
                return client_error(c, -EPROTO, "tierd's fence number %" PRIu64 " runs into the client's tag bits",
                                    fence);
        fence_saw(c, fence);

        if (!async) {
                return fence != 0 ? fence_wait(c, fence, -1) : 0;
        }
        *ret_fence = fence_out(c, fence);
        return 0;
}

_public_ int tier_evict(tier_tensor *t, int tier) {
        return tensor_move(t, tier, true, false, NULL);
}

_public_ int tier_evict_async(tier_tensor *t, int tier, tier_fence *ret_fence) {
        return tensor_move(t, tier, true, true, ret_fence);
}

_public_ int tier_prefetch(tier_tensor *t, int tier) {
        return tensor_move(t, tier, false, false, NULL);
}

_public_ int tier_prefetch_async(tier_tensor *t, int tier, tier_fence *ret_fence) {
        return tensor_move(t, tier, false, true, ret_fence);
}
