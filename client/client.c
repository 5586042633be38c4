/* SPDX-License-Identifier: MIT */
/* client.c: libtier's client lifecycle: tier_client_new() and its handshake, tier_client_free(). */

/*
 * Theory of operation
 *
 * tier_client_new() connects (transport.c) and sends Hello, the request
 * that must come first.  The HelloReply brings the job id, tierd's limits
 * (largest request and name, the job's limit per tier), the VRAM backend
 * and its GPU's PCI bus id, and, for a job's connection, the fence page
 * and the wakeup fd (fences.c).  An empty job name makes a control
 * connection: no fences and no plans, only status and quotas (control.c).
 *
 * Every failure on a client leaves its own text in the client's
 * last_error (client_error()), argument checks included, so that no call
 * reports an earlier one's reason (tier_client_new(3), NOTES);
 * transport_call() clears it when a request goes out.  A failed tier_client_new() has no client to keep it,
 * so its text is kept per thread, for tier_client_last_error(NULL).
 *
 * The CUDA driver is loaded only once something needs it
 * (client_get_cuda()): a grant into a "cuda" segment, tier_fence_stream_wait(),
 * tier_unpin_after(), host registration.  A failure to load it is
 * remembered and not retried.
 *
 * A client belongs to the process that made it (c->forks: the forks seen
 * then, counted by a pthread_atfork() child handler, so that the check
 * costs no system call on the fence paths).  In the child of
 * a fork() the connection, the wakeup fd and the fence and plan pages are
 * shared with the parent, and tierd cannot tell the two apart: a request
 * from the child would unpin or free what the parent holds, and each
 * would read the other's replies.  So every call that reaches tierd or
 * those pages refuses there with -EBADF (client_check_fork(), from
 * transport.c and the calls that touch the pages), and tier_client_free()
 * and tier_tensor_close() only unmap and close the child's copies,
 * leaving the CUDA driver's state (the parent's) alone.
 *
 * tier_client_free() copes with a half-made client (tier_client_new()
 * frees it that way on failure).  Tensor handles and plans not yet
 * submitted outlive their client: they are invalidated, and the user still
 * closes (frees) them.
 */

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <tier.h>

#include "client/client-cuda.h"
#include "client/client-internal.h"
#include "client/tier-private.h"
#include "proto/fence.h"
#include "proto/macro.h"
#include "proto/tier.pb-c.h"

/* Request size limit until HelloReply.limits.max_message tells the real one. */
#define CLIENT_DEFAULT_MAX_MESSAGE (64u * 1024u)

/* Why the last tier_client_new() of this thread failed (there is no client to ask). */
static _Thread_local char new_error[CLIENT_ERROR_MAX];

_printf_(3, 4)
int client_error(tier_client *c, int r, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        (void) vsnprintf(c->last_error, sizeof(c->last_error), fmt, ap);
        va_end(ap);
        return r;
}

/*
 * The CUDA driver of @c, loaded on first use; NULL with last_error set when it cannot be.  A failure
 * is kept (no driver, no visible GPU: loading again would fail alike), but for lack of memory
 * (-ENOMEM), which may pass: the next call tries again.
 */
ClientCuda *client_get_cuda(tier_client *c) {
        int r;

        if (c->cuda)
                return c->cuda;
        if (c->cuda_failed == 0 || c->cuda_failed == -ENOMEM) {
                r = client_cuda_new(&c->cuda, c->vram_device, c->cuda_why, sizeof(c->cuda_why));
                c->cuda_failed = r < 0 ? r : 0;
        }
        if (!c->cuda)
                (void) client_error(c, c->cuda_failed, "CUDA cannot be used in this process: %s", c->cuda_why);
        return c->cuda;
}

/* fork()s this process image went through since the first tier_client_new() (its child handler) */
static unsigned long fork_count;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void) {
        __atomic_add_fetch(&fork_count, 1, __ATOMIC_RELAXED);
}

static void fork_watch(void) {
        (void) pthread_atfork(NULL, NULL, on_fork_child);
}

bool client_forked(const tier_client *c) {
        return c->forks != __atomic_load_n(&fork_count, __ATOMIC_RELAXED);
}

int client_check_fork(tier_client *c) {
        if (!client_forked(c))
                return 0;
        return client_error(c, -EBADF, "this tier_client was made before fork() and cannot be used in the child "
                            "(the parent holds its connection): call tier_client_new() in the child");
}

_public_ tier_client *tier_client_free(tier_client *c) {
        if (!c)
                return NULL;
        /* a fork()'s child: the CUDA driver's state is the parent's; it is left, not released */
        if (client_forked(c))
                c->cuda = NULL;

        /* Handles outlive the client: they are invalidated, and the user still closes them. */
        for (tier_tensor *t = c->tensors, *next; t; t = next) {
                next = t->next;
                for (int tier = 0; tier < 2; tier++)
                        view_clear(c, &t->views[tier]);
                t->client = NULL;
                t->prev = t->next = NULL;
        }
        plan_detach_all(c);
        for (size_t i = 0; i < c->n_segments; i++)
                segment_clear(c, &c->segments[i]);
        free(c->segments);
        /* what a restart left mapped (reconnect.c) */
        for (size_t i = 0; i < c->n_retired_views; i++)
                view_clear(c, &c->retired_views[i]);
        free(c->retired_views);
        for (size_t i = 0; i < c->n_retired; i++)
                segment_clear(c, &c->retired[i]);
        free(c->retired);
        free(c->socket_path);
        free(c->job);
        c->cuda = client_cuda_free(c->cuda);
        if (c->fence_page)
                (void) munmap((void *) c->fence_page, sizeof(FencePage));
        if (c->plan_page)
                (void) munmap(c->plan_page, c->plan_page_size);
        free(c->plan_ids);
        free(c->plan_access);
        free(c->plan_phase_first);
        safe_close(c->plan_marker_fd);
        safe_close(c->event_fd);
        safe_close(c->fd);
        free(c->vram_backend);
        free(c->vram_device);
        free(c->rbuf);
        held_clear(c);
        free(c->held);
        free(c);
        return NULL;
}

DEFINE_TRIVIAL_CLEANUP_FUNC(tier_client *, tier_client_free);

int client_hello(tier_client *c, const char *job, unsigned rank) {
        Tier__Hello hello = TIER__HELLO__INIT;
        Tier__Request req = TIER__REQUEST__INIT;
        Packet p = PACKET_NULL;
        const Tier__HelloReply *hr;
        const Tier__Limits *lim;
        int r;

        hello.version = TIER_PROTOCOL_VERSION;
        hello.job = (char *) job;
        hello.rank = rank;
        /* after a restart: the writes this client got the grant of (held.c); none on a first Hello */
        hello.says_writes = true;
        r = held_writes(c, &hello.held_writes, &hello.n_held_writes);
        if (r < 0)
                return client_error(c, r, "out of memory");
        req.op_case = TIER__REQUEST__OP_HELLO;
        req.hello = &hello;

        r = transport_call(c, &req, &p);
        held_writes_free(hello.held_writes, hello.n_held_writes);
        if (r == -EPROTONOSUPPORT) {
                /* tierd's words say why; a tierd before 1.0 did not say which side is newer */
                char why[CLIENT_ERROR_MAX];

                (void) snprintf(why, sizeof(why), "%s", c->last_error);
                return client_error(c, r, "%s (this libtier speaks protocol version %u, libtier.so.%s)", why,
                                    TIER_PROTOCOL_VERSION, TIERD_SOVERSION);
        }
        if (r < 0)
                return r;
        r = transport_expect(c, &p, TIER__RESPONSE__RESULT_HELLO, "hello");
        if (r < 0)
                return r;
        hr = p.reply->response->hello;

        /* tierd answers in the client's version or refuses (libtier(3), COMPATIBILITY) */
        if (hr->version < TIER_PROTOCOL_VERSION) {
                r = client_error(c, -EPROTONOSUPPORT, "tierd speaks protocol version %u, older than this "
                                 "libtier's %u: upgrade tierd, or use the libtier that came with it",
                                 hr->version, TIER_PROTOCOL_VERSION);
                goto finish;
        }
        if (hr->version > TIER_PROTOCOL_VERSION) {
                r = client_error(c, -EPROTONOSUPPORT, "tierd answered in protocol version %u, newer than this "
                                 "libtier's %u, instead of in the client's: upgrade libtier to tierd's",
                                 hr->version, TIER_PROTOCOL_VERSION);
                goto finish;
        }

        c->job_id = hr->job_id;
        lim = hr->limits;
        if (lim) {
                if (lim->max_message > 0)
                        c->max_message = lim->max_message;
                c->max_name = lim->max_name;
                for (size_t i = 0; i < MIN(lim->n_tier_limit, (size_t) TIER_LEVEL_MAX); i++)
                        c->limit[i] = lim->tier_limit[i];
                for (size_t i = 0; i < MIN(lim->n_tensor_max, (size_t) TIER_LEVEL_MAX); i++)
                        c->tensor_max[i] = lim->tensor_max[i];
                for (size_t i = 0; i < MIN(lim->n_segment_size, (size_t) TIER_LEVEL_MAX); i++)
                        c->segment_size[i] = lim->segment_size[i];
        }

        c->vram_backend = strdup(hr->vram_backend ? hr->vram_backend : "");
        c->vram_device = strdup(hr->vram_device ? hr->vram_device : "");
        if (!c->vram_backend || !c->vram_device) {
                r = client_error(c, -ENOMEM, "out of memory copying tierd's hello");
                goto finish;
        }

        /* A control connection has no fences; whatever fds tierd sent are closed below. */
        if (!c->control) {
                if (hr->fence_page_fd >= 0) {
                        _cleanup_close_ int fd = packet_take_fd(&p, hr->fence_page_fd);

                        if (fd < 0) {
                                r = client_error(c, fd, "hello names fence page fd %d, which the packet lacks",
                                                 hr->fence_page_fd);
                                goto finish;
                        }
                        if (hr->fence_slot >= FENCE_SLOTS) {
                                r = client_error(c, -EPROTO, "fence slot %u is out of range", hr->fence_slot);
                                goto finish;
                        }
                        r = fence_map_page(c, fd);
                        if (r < 0)
                                goto finish;
                        c->fence_slot = hr->fence_slot;
                        c->failed_base = __atomic_load_n(&c->fence_page->failed[c->fence_slot],
                                                         __ATOMIC_ACQUIRE);
                }
                if (hr->fence_eventfd >= 0) {
                        c->event_fd = packet_take_fd(&p, hr->fence_eventfd);
                        if (c->event_fd < 0) {
                                r = client_error(c, c->event_fd,
                                                 "hello names wakeup fd %d, which the packet lacks",
                                                 hr->fence_eventfd);
                                goto finish;
                        }
                }
        }
        r = 0;
finish:
        packet_done(&p);
        return r;
}

_public_ int tier_client_new(const char *socket_path, const char *job, unsigned rank, tier_client **ret) {
        _cleanup_(tier_client_freep) tier_client *c = NULL;
        const char *path;
        int r;

        new_error[0] = 0;
        if (!ret) {
                (void) snprintf(new_error, sizeof(new_error), "ret is NULL: there is nowhere to store the client");
                return -EINVAL;
        }
        if (!job)
                job = "";
        if (*job && !name_valid(job))
                return name_refusal(new_error, sizeof(new_error), "job", job);

        path = socket_path && *socket_path ? socket_path : secure_getenv("TIER_SOCKET");
        if (!path || !*path)
                path = TIERD_DEFAULT_SOCKET;

        c = calloc(1, sizeof(*c));
        if (!c)
                goto nomem;
        (void) pthread_once(&fork_once, fork_watch);
        c->forks = __atomic_load_n(&fork_count, __ATOMIC_RELAXED);
        c->fd = -1;
        c->event_fd = -1;
        c->fence_tag = fence_new_tag();
        c->plan_marker_fd = -1;
        c->max_message = CLIENT_DEFAULT_MAX_MESSAGE;
        c->control = !*job;
        c->rbuf = malloc(CLIENT_RECV_BUFFER);
        if (!c->rbuf)
                goto nomem;

        c->socket_path = strdup(path);
        c->job = strdup(job);
        c->rank = rank;
        if (!c->socket_path || !c->job)
                goto nomem;
        r = transport_connect(c, path);
        if (r >= 0)
                r = client_hello(c, job, rank);
        if (r < 0) {
                (void) snprintf(new_error, sizeof(new_error), "%s",
                                c->last_error[0] ? c->last_error : tier_strerror(r));
                return r;
        }

        *ret = TAKE_PTR(c);
        return 0;

nomem:
        (void) snprintf(new_error, sizeof(new_error), "out of memory");
        return -ENOMEM;
}

_public_ const char *tier_client_last_error(const tier_client *c) {
        return c ? c->last_error : new_error;
}

_public_ const char *tier_client_vram_backend(const tier_client *c) {
        return c && c->vram_backend ? c->vram_backend : "";
}

_public_ const char *tier_client_vram_device(const tier_client *c) {
        return c && c->vram_device ? c->vram_device : "";
}

_public_ uint64_t tier_client_limit(const tier_client *c, int tier) {
        if (!c || !tier_valid(tier))
                return 0;
        return c->limit[tier];
}

_public_ uint64_t tier_client_tensor_max(const tier_client *c, int tier) {
        return c && tier_valid(tier) ? c->tensor_max[tier] : 0;
}

_public_ uint64_t tier_client_segment_size(const tier_client *c, int tier) {
        return c && tier_valid(tier) ? c->segment_size[tier] : 0;
}

_public_ int tier_client_fd(const tier_client *c) {
        if (!c)
                return -EINVAL;
        if (client_forked(c))
                return -EBADF;          /* the parent's connection */
        if (c->fd >= 0)
                return c->fd;
        /* closed after tierd went and did not come back (reconnect.c): the error that broke it */
        return c->broken < 0 ? c->broken : -ENOTCONN;
}
