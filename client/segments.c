/* SPDX-License-Identifier: MIT */
/* segments.c: the segment cache: mapping tierd's memory, revokes, grants turned into addresses. */

/*
 * Theory of operation
 *
 * Segments are tierd's blocks of tier memory for this job.  "memfd"
 * segments are mapped MAP_SHARED once and cached by id; a new generation
 * for a known id replaces the old mapping.  A grant {segment, generation,
 * offset, length} becomes a pointer into that mapping, once it is checked to
 * lie inside the segment and to be as long as the tensor (a buggy tierd
 * must not send the job's writes elsewhere).  If a grant names a
 * segment we do not hold, GetSegments fetches it.  "cuda" segments (VMM
 * chunks of tierd's GPU, sent as exported fds) are kept as fds until a
 * grant first names them; then libtier loads the CUDA driver (dlopen, once
 * per client: client-cuda.c), imports, maps and caches the chunk by (id,
 * generation), and the grant's device_ptr is that mapping plus the offset.
 * Event.revoke asks for a segment back: its mapping goes and an Ack (a
 * request without a Response) tells tierd so.
 *
 * A copy larger than a segment comes in pieces (whole segments and a tail),
 * and the caller sees it as one range all the same: libtier reserves an
 * address range per tensor handle and tier (its ClientView) and maps each
 * piece in place, memfd pieces by mremap() of our MAP_SHARED mapping of
 * their segment (old size 0: a second mapping of the same pages, no fd
 * needed), cuda pieces by cuMemMap() of their imported chunk.  The view is
 * mapped anew only when the pieces change (a pin after the tensor moved),
 * and goes when its tensor is closed, the client freed, or a piece's
 * segment revoked.
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
#include <unistd.h>

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
                client_cuda_unmap(c->cuda, s->device_ptr, s->size, s->cu_handle);
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
                return client_error(c, r, "out of memory taking segment %u", s->id);
        slot = &c->segments[s->id];
        if (slot->kind == n.kind && slot->generation == n.generation)
                return 0;       /* already mapped; the duplicate fd is closed */

        switch (n.kind) {
        case SEGMENT_MEMFD:
                /* Mapping beyond the end of the memfd would SIGBUS on first touch. */
                if (n.size == 0 || n.size > SIZE_MAX)
                        return client_error(c, -EPROTO, "segment %u has bad size %" PRIu64, s->id, n.size);
                if (fstat(fd, &st) < 0)
                        return client_error(c, negative_errno(), "cannot stat segment %u: %m", s->id);
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
                if (segs[i]) {
                        int r = segment_add(c, segs[i], p);

                        /* kept, so that a grant naming it says why (out of address space), not "not sent" */
                        if (r < 0) {
                                c->seg_error = r;
                                c->seg_error_id = segs[i]->id;
                        }
                }
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
        /* views that map a piece of it go first: they hold its memory too */
        for (tier_tensor *t = c->tensors; t; t = t->next)
                for (int tier = 0; tier < 2; tier++) {
                        ClientView *v = &t->views[tier];

                        for (uint32_t i = 0; i < v->n_pieces; i++)
                                if (v->pieces[i].segment == rv->segment && v->pieces[i].generation == rv->generation) {
                                        view_clear(c, v);
                                        break;
                                }
                }
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

/* The segment a piece names, fetched when we lack it, and checked to hold the piece. */
static int piece_segment(tier_client *c, const ViewPiece *p, ClientSegment **ret) {
        ClientSegment *s;
        int r;

        s = segment_find(c, p->segment, p->generation);
        if (!s) {
                c->seg_error = 0;
                r = segment_fetch(c, p->segment);
                if (r < 0)
                        return r;
                s = segment_find(c, p->segment, p->generation);
                if (!s && c->seg_error < 0 && c->seg_error_id == p->segment)
                        return c->seg_error;    /* it came, and could not be mapped: the message says why */
                if (!s)
                        return client_error(c, -EPROTO, "tierd granted segment %u generation %u, "
                                            "which it did not send", p->segment, p->generation);
        }
        if (p->offset > s->size || p->length > s->size - p->offset)
                return client_error(c, -EPROTO, "grant [%" PRIu64 ", +%" PRIu64 ") lies outside segment %u "
                                    "of %" PRIu64 " bytes", p->offset, p->length, p->segment, s->size);
        if (s->kind == SEGMENT_CUDA && !s->device_ptr) {
                ClientCuda *cc = client_get_cuda(c);

                if (!cc)
                        return c->cuda_failed;
                r = client_cuda_map(cc, s->fd, s->size, &s->device_ptr, &s->cu_handle);
                if (r < 0)
                        return client_error(c, r, "segment %u: %s", p->segment, client_cuda_error(cc));
                s->fd = safe_close(s->fd);      /* the handle holds the memory now */
        }
        *ret = s;
        return 0;
}

void view_clear(tier_client *c, ClientView *v) {
        if (v->base)
                (void) munmap(v->base, (size_t) v->size);
        /* (in a fork()'s child the CUDA driver's state is the parent's: left alone) */
        if (v->device_base && c && c->cuda && !client_forked(c)) {
                uint64_t pos = 0;

                for (uint32_t i = 0; i < v->n_mapped; i++) {
                        client_cuda_view_unmap(c->cuda, v->device_base + pos, v->stride);
                        pos += v->stride;
                }
                client_cuda_view_free(c->cuda, v->device_base, v->size);
        }
        free(v->pieces);
        *v = (ClientView) {};
}

static bool view_is(const ClientView *v, const ViewPiece *pieces, size_t n) {
        return v->n_pieces == n && v->pieces && memcmp(v->pieces, pieces, n * sizeof(ViewPiece)) == 0 &&
                (v->base || v->device_base);
}

/* Map @pieces one after the other into @v (the view of one tensor's copy in one tier). */
static int view_map(tier_client *c, ClientView *v, const ViewPiece *pieces, size_t n, ClientSegment **segs) {
        uint64_t total = 0, pos = 0;
        bool cuda = segs[0]->kind == SEGMENT_CUDA;
        int r;

        for (size_t i = 0; i < n; i++) {
                if (segs[i]->kind != segs[0]->kind || (!cuda && (pieces[i].offset % 4096 || pieces[i].length % 4096)))
                        return client_error(c, -EPROTO, "piece %zu of a grant (segment %u) cannot be mapped after "
                                            "the others", i, pieces[i].segment);
                total += pieces[i].length;
        }
        view_clear(c, v);
        v->pieces = calloc(n, sizeof(ViewPiece));
        if (!v->pieces)
                return client_error(c, -ENOMEM, "out of memory");
        if (cuda) {
                ClientCuda *cc = client_get_cuda(c);

                if (!cc)
                        return c->cuda_failed;
                /* whole chunks side by side: every piece at offset 0, all but the last a whole chunk */
                for (size_t i = 0; i < n; i++)
                        if (pieces[i].offset != 0 || segs[i]->size != segs[0]->size ||
                            (i + 1 < n && pieces[i].length != segs[i]->size)) {
                                r = client_error(c, -EPROTO, "piece %zu of a VRAM grant (segment %u, [%" PRIu64
                                                 ", +%" PRIu64 ")) is not at the start of its chunk or leaves "
                                                 "a gap: the GPU maps only whole chunks", i, pieces[i].segment,
                                                 pieces[i].offset, pieces[i].length);
                                goto fail;
                        }
                v->stride = segs[0]->size;
                r = client_cuda_view_new(cc, n * v->stride, &v->device_base, &v->size);
                if (r < 0)
                        goto fail_cuda;
                for (size_t i = 0; i < n; i++) {
                        r = client_cuda_view_map(cc, v->device_base + pos, segs[i]->cu_handle, 0, v->stride);
                        if (r < 0)
                                goto fail_cuda;
                        v->pieces[i] = pieces[i];
                        v->n_mapped++;
                        pos += v->stride;
                }
        } else {
                v->size = total;
                v->base = mmap(NULL, (size_t) total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
                if (v->base == MAP_FAILED) {
                        v->base = NULL;
                        r = client_error(c, negative_errno(), "cannot reserve %" PRIu64 " bytes of address space: %m",
                                         total);
                        goto fail;
                }
                for (size_t i = 0; i < n; i++) {
                        void *at = mremap((uint8_t *) segs[i]->ptr + pieces[i].offset, 0, (size_t) pieces[i].length,
                                          MREMAP_MAYMOVE | MREMAP_FIXED, (uint8_t *) v->base + pos);

                        if (at == MAP_FAILED) {
                                r = client_error(c, negative_errno(), "cannot map piece %zu of segment %u in place: %m",
                                                 i, pieces[i].segment);
                                goto fail;
                        }
                        pos += pieces[i].length;
                }
        }
        memcpy(v->pieces, pieces, n * sizeof(ViewPiece));
        v->n_pieces = (uint32_t) n;
        return 0;
fail_cuda:
        if (r < 0 && c->cuda)
                r = client_error(c, r, "%s", client_cuda_error(c->cuda));
fail:
        view_clear(c, v);
        return r;
}

int segment_resolve(tier_client *c, tier_tensor *t, int tier, uint64_t length, const ViewPiece *pieces, size_t n,
                    struct tier_grant *ret) {
        _cleanup_free_ ClientSegment **segs = NULL;
        _cleanup_free_ size_t *at = NULL;
        uint64_t total = 0;
        ClientView *v;
        int r;

        if (n == 0)
                return client_error(c, -EPROTO, "tierd granted a copy of no pieces");
        segs = calloc(n, sizeof(ClientSegment *));
        at = calloc(n, sizeof(size_t));
        if (!segs || !at)
                return client_error(c, -ENOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) {
                ClientSegment *seg = NULL;

                r = piece_segment(c, &pieces[i], &seg);
                if (r < 0)
                        return r;
                at[i] = (size_t) (seg - c->segments);
                total += pieces[i].length;
        }
        /* only now the pointers: a later piece's segment, fetched, may have moved the array (segment_reserve()) */
        for (size_t i = 0; i < n; i++)
                segs[i] = &c->segments[at[i]];
        if (n > 1 && total < length)
                return client_error(c, -EPROTO, "a grant of %" PRIu64 " bytes in pieces for a tensor of %" PRIu64,
                                    total, length);
        if (n == 1) {
                if (pieces[0].length < length)
                        return client_error(c, -EPROTO, "a grant of %" PRIu64 " bytes for a tensor of %" PRIu64,
                                            pieces[0].length, length);
                *ret = (struct tier_grant) {
                        .ptr = segs[0]->ptr ? (uint8_t *) segs[0]->ptr + pieces[0].offset : NULL,
                        .device_ptr = segs[0]->device_ptr ? segs[0]->device_ptr + pieces[0].offset : 0,
                        .length = length,
                        .segment = pieces[0].segment,
                        .offset = pieces[0].offset,
                        .tier = segs[0]->tier,
                };
                return 0;
        }
        if (!t || (tier != TIER_VRAM && tier != TIER_HOST))
                return client_error(c, -EPROTO, "a copy in %zu pieces outside vram and host", n);
        v = &t->views[tier];
        if (!view_is(v, pieces, n)) {
                r = view_map(c, v, pieces, n, segs);
                if (r < 0)
                        return r;
        }
        *ret = (struct tier_grant) {
                .ptr = v->base,
                .device_ptr = v->device_base,
                .length = length,
                .segment = pieces[0].segment,
                .offset = pieces[0].offset,
                .tier = segs[0]->tier,
        };
        return 0;
}

int segment_resolve_grant(tier_client *c, tier_tensor *t, const Tier__Grant *g, struct tier_grant *ret) {
        _cleanup_free_ ViewPiece *pieces = NULL;

        /*
         * The job will touch the tensor's size from the grant's address (tier.h: length is the
         * tensor's size): a grant of any other length from a buggy tierd would send it past the
         * mapping, or over another tensor's bytes.
         */
        if (t && g->length != t->size)
                return client_error(c, -EPROTO, "tierd granted %" PRIu64 " bytes for tensor '%s' of %" PRIu64 " bytes",
                                    g->length, t->name, t->size);
        if (g->n_pieces <= 1) {
                ViewPiece one = {
                        .segment = g->segment, .generation = g->generation, .offset = g->offset, .length = g->length,
                };

                return segment_resolve(c, t, (int) g->tier, g->length, &one, 1, ret);
        }
        pieces = calloc(g->n_pieces, sizeof(ViewPiece));
        if (!pieces)
                return client_error(c, -ENOMEM, "out of memory");
        for (size_t i = 0; i < g->n_pieces; i++)
                pieces[i] = (ViewPiece) {
                        .segment = g->pieces[i]->segment,
                        .generation = g->pieces[i]->generation,
                        .offset = g->pieces[i]->offset,
                        .length = g->pieces[i]->length,
                };
        return segment_resolve(c, t, (int) g->tier, g->length, pieces, g->n_pieces, ret);
}

_public_ int tier_client_cuda_register_host(tier_client *c) {
        ClientCuda *cc;
        int r, n = 0;

        if (!c)
                return -EINVAL;
        r = client_check_fork(c);
        if (r < 0)
                return r;
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
