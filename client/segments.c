/* SPDX-License-Identifier: MIT */
/* segments.c: the segment cache: mapping tierd's memory, revokes, grants turned into addresses. */

/*
 * Theory of operation
 *
 * Segments are tierd's blocks of tier memory for this job.  "memfd"
 * segments are mapped MAP_SHARED once and cached by id; a new generation
 * for a known id replaces the old mapping.  A grant {segment, generation,
 * offset, length} becomes a pointer into that mapping.  If a grant names a
 * segment we do not hold, GetSegments fetches it.  "cuda" segments (VMM
 * chunks of tierd's GPU, sent as exported fds) are kept as fds until a
 * grant first names them; then libtier loads the CUDA driver (dlopen, once
 * per client: client-cuda.c), imports, maps and caches the chunk by (id,
 * generation), and the grant's device_ptr is that mapping plus the offset.
 * Event.revoke asks for a segment back: its mapping goes and an Ack (a
 * request without a Response) tells tierd so.
 *
 * Segments come in any Response (new_segments, mapped by the transport
 * before the caller sees the Response) and in the answer to GetSegments.
 * A segment that cannot be mapped is left out; it surfaces as an error
 * when a grant names it.  With tier_client_cuda_register_host(), host-tier
 * mappings are also registered with CUDA (cuMemHostRegister), those
 * already held at once and later ones as they come.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <tier.h>

#include "client/client-cuda.h"
#include "client/client-internal.h"
#include "client/tier-private.h"
#include "proto/macro.h"
#include "proto/tier.pb-c.h"

/* Segment ids are small integers handed out per job; bounds the cache array. */
#define CLIENT_SEGMENT_ID_MAX (1u << 20)

void segment_clear(tier_client *c, ClientSegment *s) {
        if (s->host_registered)
                client_cuda_host_unregister(c->cuda, s->ptr);
        if (s->ptr)
                (void) munmap(s->ptr, (size_t) s->size);
        if (s->device_ptr)
                client_cuda_unmap(c->cuda, s->device_ptr, s->size);
        s->fd = safe_close(s->fd);
        *s = (ClientSegment) { .kind = SEGMENT_NONE, .fd = -1 };
}

static int segment_reserve(tier_client *c, size_t n) {
        ClientSegment *a;
        size_t m;

        if (n <= c->n_segments)
                return 0;
        m = MAX(n, MAX(c->n_segments * 2, (size_t) 16));
        m = MIN(m, (size_t) CLIENT_SEGMENT_ID_MAX);
        a = reallocarray(c->segments, m, sizeof(*a));
        if (!a)
                return -ENOMEM;
        for (size_t i = c->n_segments; i < m; i++)
                a[i] = (ClientSegment) { .kind = SEGMENT_NONE, .fd = -1 };
        c->segments = a;
        c->n_segments = m;
        return 0;
}

/**
 * segment_add() - map (or keep) a segment tierd sent.
 * @p: the packet the segment came in; its fd is claimed (and, for memfd, closed)
 */
static int segment_add(tier_client *c, const Tier__Segment *s, Packet *p) {
        _cleanup_close_ int fd = -EBADF;
        ClientSegment n = { .fd = -1 }, *slot;
        struct stat st;
        int r;

        fd = packet_take_fd(p, s->fd_index);
        if (fd < 0)
                return client_error(c, fd, "segment %u names fd %d, which the packet lacks",
                                    s->id, s->fd_index);
        if (s->id >= CLIENT_SEGMENT_ID_MAX || !tier_valid((int) s->tier))
                return client_error(c, -EPROTO, "segment %u (tier %d) is out of range", s->id, (int) s->tier);

        if (s->kind && strcmp(s->kind, "memfd") == 0)
                n.kind = SEGMENT_MEMFD;
        else if (s->kind && strcmp(s->kind, "cuda") == 0)
                n.kind = SEGMENT_CUDA;
        else
                return client_error(c, -EPROTONOSUPPORT, "segment %u has unknown kind \"%s\"",
                                    s->id, s->kind ? s->kind : "");
        n.generation = s->generation;
        n.tier = (int) s->tier;
        n.size = s->size;

        r = segment_reserve(c, (size_t) s->id + 1);
        if (r < 0)
                return r;
        slot = &c->segments[s->id];
        if (slot->kind == n.kind && slot->generation == n.generation)
                return 0;       /* already mapped; the duplicate fd is closed */

        switch (n.kind) {
        case SEGMENT_MEMFD:
                /* Mapping beyond the end of the memfd would SIGBUS on first touch. */
                if (n.size == 0 || n.size > SIZE_MAX)
                        return client_error(c, -EPROTO, "segment %u has bad size %" PRIu64, s->id, n.size);
                if (fstat(fd, &st) < 0)
                        return negative_errno();
                if (st.st_size < 0 || (uint64_t) st.st_size < n.size)
                        return client_error(c, -EPROTO,
                                            "segment %u is %" PRIu64 " bytes but its memfd only %lld",
                                            s->id, n.size, (long long) st.st_size);
                n.ptr = mmap(NULL, (size_t) n.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (n.ptr == MAP_FAILED)
                        return client_error(c, negative_errno(), "cannot map segment %u: %m", s->id);
                /* best effort: unregistered memory still works, only slower for cudaMemcpyAsync */
                if (c->register_host && n.tier == TIER_HOST && c->cuda &&
                    client_cuda_host_register(c->cuda, n.ptr, n.size) >= 0)
                        n.host_registered = true;
                break;
        case SEGMENT_CUDA:
                /* imported when a grant first names it (segment_resolve_grant()): that loads CUDA */
                n.fd = TAKE_FD(fd);
                break;
        case SEGMENT_NONE:
                break;
        }

        /* A new generation replaces the old mapping: tierd reuses an id only once it is unpinned. */
        segment_clear(c, slot);
        *slot = n;
        return 0;
}

/* Map every segment in @segs; a segment that fails stays unmapped and surfaces when a grant names it. */
void segment_add_all(tier_client *c, Tier__Segment **segs, size_t n, Packet *p) {
        for (size_t i = 0; i < n; i++)
                if (segs[i])
                        (void) segment_add(c, segs[i], p);
}

static ClientSegment *segment_find(tier_client *c, uint32_t id, uint32_t generation) {
        if (id >= c->n_segments)
                return NULL;
        if (c->segments[id].kind == SEGMENT_NONE || c->segments[id].generation != generation)
                return NULL;
        return &c->segments[id];
}

/* tierd takes @id back: drop our mapping of that generation (nothing of ours points into it), then ack. */
void segment_revoke(tier_client *c, const Tier__Revoke *rv) {
        if (rv->segment < c->n_segments && c->segments[rv->segment].kind != SEGMENT_NONE &&
            c->segments[rv->segment].generation == rv->generation)
                segment_clear(c, &c->segments[rv->segment]);
        (void) transport_send_ack(c, rv->segment, rv->generation);
}

static int segment_fetch(tier_client *c, uint32_t id) {
        Tier__GetSegments op = TIER__GET_SEGMENTS__INIT;
        Tier__Request req = TIER__REQUEST__INIT;
        Packet p = PACKET_NULL;
        const Tier__Response *resp;
        uint32_t ids[1] = { id };
        int r;

        op.n_ids = 1;
        op.ids = ids;
        req.op_case = TIER__REQUEST__OP_GET_SEGMENTS;
        req.get_segments = &op;
        r = transport_call(c, &req, &p);
        if (r < 0)
                return r;
        resp = p.reply->response;
        if (resp->result_case == TIER__RESPONSE__RESULT_SEGMENTS && resp->segments)
                segment_add_all(c, resp->segments->segments, resp->segments->n_segments, &p);
        packet_done(&p);
        return 0;
}

/* Turn a wire grant into an address, fetching its segment when we lack it. */
int segment_resolve_grant(tier_client *c, const Tier__Grant *g, struct tier_grant *ret) {
        ClientSegment *s;
        int r;

        s = segment_find(c, g->segment, g->generation);
        if (!s) {
                r = segment_fetch(c, g->segment);
                if (r < 0)
                        return r;
                s = segment_find(c, g->segment, g->generation);
                if (!s)
                        return client_error(c, -EPROTO, "tierd granted segment %u generation %u, "
                                            "which it did not send", g->segment, g->generation);
        }
        if (g->offset > s->size || g->length > s->size - g->offset)
                return client_error(c, -EPROTO, "grant [%" PRIu64 ", +%" PRIu64 ") lies outside segment %u "
                                    "of %" PRIu64 " bytes", g->offset, g->length, g->segment, s->size);
        if (s->kind == SEGMENT_CUDA && !s->device_ptr) {
                ClientCuda *cc = client_get_cuda(c);

                if (!cc)
                        return c->cuda_failed;
                r = client_cuda_map(cc, s->fd, s->size, &s->device_ptr);
                if (r < 0)
                        return client_error(c, r, "segment %u: %s", g->segment, client_cuda_error(cc));
                s->fd = safe_close(s->fd);      /* the mapping holds the memory now */
        }

        *ret = (struct tier_grant) {
                .ptr = s->ptr ? (uint8_t *) s->ptr + g->offset : NULL,
                .device_ptr = s->device_ptr ? s->device_ptr + g->offset : 0,
                .length = g->length,
                .segment = g->segment,
                .offset = g->offset,
                .tier = s->tier,
        };
        return 0;
}

_public_ int tier_client_cuda_register_host(tier_client *c) {
        ClientCuda *cc;
        int r, n = 0;

        if (!c)
                return -EINVAL;
        cc = client_get_cuda(c);
        if (!cc)
                return c->cuda_failed;
        c->register_host = true;
        for (size_t i = 0; i < c->n_segments; i++) {
                ClientSegment *s = &c->segments[i];

                if (s->kind != SEGMENT_MEMFD || s->tier != TIER_HOST || s->host_registered)
                        continue;
                r = client_cuda_host_register(cc, s->ptr, s->size);
                if (r < 0)
                        return client_error(c, r, "segment %zu: %s", i, client_cuda_error(cc));
                s->host_registered = true;
                n++;
        }
        return n;
}
