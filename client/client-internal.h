/* SPDX-License-Identifier: MIT */
/* client-internal.h: libtier's own types and what its files share with each other (never installed). */
#pragma once

/*
 * libtier is split by concern: client.c (tier_client_new/free and the
 * handshake), transport.c (packets, calls, events), segments.c (the
 * segment cache, grants), tensors.c (handles, pins, evictions,
 * prefetches), fences.c (the fence page, waiting), plans.c, control.c
 * (status and quotas), commits.c, reconnect.c (after tierd restarted), held.c
 * (the grants it holds that may write, for the Hello of a reconnect),
 * names.c (error texts, tier names), client-cuda.c
 * (the CUDA driver) and status.c (rendering a status reply).  The last two
 * declare their functions in client-cuda.h and tier-private.h.
 */

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include <tier.h>

#include "client/client-cuda.h"
#include "proto/macro.h"
#include "proto/tier.pb-c.h"
#include "proto/utf8.h"
#include "proto/wire.h"

typedef struct FencePage FencePage;
typedef struct PlanPage PlanPage;

/* Largest packet tierd sends inline; bigger status dumps come as an fd. */
#define CLIENT_RECV_BUFFER (1024u * 1024u)
/* Failed fences remembered per client; older failures are forgotten. */
#define CLIENT_FAILURES_MAX 256u
/* Room for one error text: a socket path plus the daemon's reason. */
#define CLIENT_ERROR_MAX 512
/* Fences whose PinReply carried tierd's copy event, remembered for tier_fence_stream_wait(). */
#define CLIENT_FENCE_EVENTS 64

typedef enum SegmentKind {
        SEGMENT_NONE = 0,       /* slot unused */
        SEGMENT_MEMFD,
        SEGMENT_CUDA,
} SegmentKind;

typedef struct ClientSegment {
        SegmentKind kind;
        uint32_t generation;
        int tier;
        uint64_t size;
        void *ptr;              /* memfd: MAP_SHARED mapping of @size bytes; cuda: NULL */
        int fd;                 /* cuda: the exported handle until it is imported; else -1 */
        uint64_t device_ptr;    /* cuda: where it is mapped once imported, else 0 */
        bool host_registered;   /* memfd of the host tier registered with CUDA */
        uint64_t cu_handle;     /* cuda: the imported allocation, kept to map pieces of it into views */
} ClientSegment;

/* One piece of a copy that spans segments, as a grant or a plan slot names it. */
typedef struct ViewPiece {
        uint32_t segment;
        uint32_t generation;
        uint64_t offset;
        uint64_t length;
} ViewPiece;

/*
 * A tensor's copy in one tier that spans segments, seen as one range: an
 * address range reserved for the tensor, with each piece mapped in place:
 * memfd pieces by mremap() of our mapping of their segment; cuda pieces by
 * cuMemMap() of their whole chunk (the driver maps no part of an
 * allocation), chunk i at device_base + i * stride, which is why tierd puts
 * every piece of a spanning VRAM copy at offset 0 of its chunk
 * (SegPool.map_whole).  Kept per tensor handle and tier, and mapped anew
 * only when the pieces change.
 */
typedef struct ClientView {
        void *base;             /* memfd: the reserved range, or NULL */
        uint64_t device_base;   /* cuda: the reserved device range, or 0 */
        uint64_t size;          /* bytes reserved */
        ViewPiece *pieces;      /* what is mapped there now, in order */
        uint32_t n_pieces;
        uint32_t n_mapped;      /* cuda: pieces mapped so far (each is unmapped on its own) */
        uint64_t stride;        /* cuda: the chunk size, each piece's whole chunk is mapped at a multiple */
} ClientView;

typedef struct FenceEvent {
        tier_fence fence;
        uint8_t handle[CLIENT_CUDA_EVENT_SIZE];
} FenceEvent;

/*
 * A grant this client holds that may write (held.c): a pin's, from its
 * answer to its unpin, or one of the plan phase it is in, from
 * tier_phase_grant() until the phase after the next is entered.  What a reconnecting Hello names
 * (tierd keeps a write-only pin's copy across its restart only for a
 * client that says it got the grant).
 */
typedef struct ClientHeld {
        tier_tensor *t;         /* its handle, or NULL once the handle closed (tierd holds the pin, the phase
                                 * its hold, still) */
        uint64_t id;            /* the tensor's, as tierd numbers it on this connection */
        char *name;             /* once the handle closed: its name, ours */
        int tier;
        bool write;             /* (a read pin is kept too: an unpin takes the last pin of its tensor and tier) */
        bool phase;             /* a plan phase's grant, not a pin */
        uint64_t phase_seq;     /* the marker of the phase it was granted in */
        bool used;              /* a free slot is not */
        uint32_t next;          /* slot + 1 of the entry added before it with its key (a free one: the next
                                 * free slot + 1); 0 ends it */
        uint32_t t_prev, t_next; /* slot + 1 of its neighbours among its handle's entries (tier_tensor.held) */
        uint32_t p_prev, p_next; /* a phase grant: among the phase grants (tier_client.held_phase) */
} ClientHeld;

/* A tensor of the submitted plan: its id (as tierd numbers it on this connection) and its slot. */
typedef struct PlanId {
        uint64_t id;
        uint32_t slot;
} PlanId;

/* One access of the submitted plan, packed: its tensor's slot (< PLAN_MAX_SLOTS), tier (vram, host) and mode. */
#define PLAN_ACCESS(slot, tier, mode) ((uint32_t) (slot) << 3 | (uint32_t) (tier) << 2 | (uint32_t) (mode))
#define PLAN_ACCESS_KEY(a) ((a) & ~UINT32_C(3))        /* slot and tier */
#define PLAN_ACCESS_MODE(a) ((int) ((a) & 3u))

typedef struct FenceFailure {
        tier_fence fence;
        int status;             /* < 0 */
} FenceFailure;

struct tier_client {
        unsigned long forks;            /* the fork()s seen when it was made: in a fork()'s child every call
                                         * refuses (client.c, client_forked()) */
        int fd;                         /* the connection; O_NONBLOCK, CLOEXEC */
        int event_fd;                   /* wakeups from tierd (fences, plan phases): a pipe's read end, or -1 */
        const FencePage *fence_page;    /* the job's fence page, or NULL (control connection) */
        uint32_t fence_slot;
        tier_fence fence_max;           /* highest fence tierd has handed out */
        uint64_t fence_tag;             /* in the top bits of every fence the caller sees (fence_out()) */
        uint64_t failed_base;           /* failed[slot] at the handshake */
        uint64_t failed_events;         /* FenceFailed events received since */
        bool fences_frozen;             /* the slot is no longer ours (fence_freeze()): read frozen_*, not the page */
        uint64_t frozen_done, frozen_failed;

        uint64_t seq;                   /* of the last request sent */
        int broken;                     /* < 0 once the connection is unusable */
        char broken_reason[CLIENT_ERROR_MAX];   /* why, as transport_break() was told */
        bool shutdown;                  /* tierd announced its shutdown */
        char shutdown_reason[CLIENT_ERROR_MAX / 2];
        bool control;                   /* no job: status only */
        int timeout_ms;                 /* a request's answer must come within (tier_client_set_timeout()); 0: none */
        bool timed_out;                 /* the connection was closed for want of an answer (since the last Hello) */

        uint64_t job_id;
        uint32_t max_message;
        uint32_t max_name;
        uint64_t limit[TIER_LEVEL_MAX];
        uint64_t tensor_max[TIER_LEVEL_MAX];    /* largest tensor the job may have there */
        uint64_t segment_size[TIER_LEVEL_MAX];  /* segment, chunk, extent */
        char *vram_backend;
        char *vram_device;              /* PCI bus id of tierd's GPU, "" when not cuda */

        ClientCuda *cuda;               /* the CUDA driver, once needed */
        int cuda_failed;                /* < 0 once loading it failed (not tried again, but for -ENOMEM) */
        int seg_error;                  /* < 0: why segment seg_error_id could not be mapped (the last failure) */
        uint32_t seg_error_id;
        char cuda_why[CLIENT_ERROR_MAX / 2];
        bool register_host;             /* register host-tier segments with CUDA as they come */
        FenceEvent fence_events[CLIENT_FENCE_EVENTS];   /* ring */
        uint64_t n_fence_events;

        ClientSegment *segments;        /* indexed by segment id */
        size_t n_segments;

        FenceFailure failures[CLIENT_FAILURES_MAX];     /* ring, newest at n_failures - 1 */
        uint64_t n_failures;

        tier_tensor *tensors;           /* open handles, invalidated by tier_client_free() */
        tier_plan *plans;               /* plans not yet submitted, detached by tier_client_free() */
        uint64_t handle_serial;         /* the last tier_tensor.serial handed out */

        uint8_t *rbuf;                  /* CLIENT_RECV_BUFFER bytes */
        char last_error[CLIENT_ERROR_MAX];

        /*
         * Reconnecting (reconnect.c, tier_client_set_reconnect()): where and as
         * whom we connected; the mappings of before a restart, kept until the
         * client is freed (the caller may still read through old grants); the
         * fences of before are numbered up to fence_floor, and tierd's
         * fences of this connection are ours less fence_offset.
         */
        char *socket_path;
        char *job;
        unsigned rank;
        int reconnect_ms;               /* 0: off */
        bool reconnecting;
        /* why the connection went, kept over reconnect attempts that gave up until one works: what
         * they say, once (not each attempt's message wrapped in the next's) */
        char gone_why[CLIENT_ERROR_MAX];
        bool gone_timed_out;            /* it went for want of an answer (timed_out): tierd did not restart */
        unsigned restarts;              /* tierd restarts this client lived through */
        ClientSegment *retired;
        size_t n_retired;
        ClientView *retired_views;
        size_t n_retired_views;
        tier_fence fence_offset, fence_floor;
        int floor_error;                /* fences up to fence_floor: -ERESTART (a tierd came back), or the error
                                         * that broke the connection (none did yet); 0: -ERESTART */

        /* grants held (held.c) */
        ClientHeld *held;               /* slots [0, n_held_slots); an entry never moves */
        size_t n_held, cap_held;        /* entries held; slots allocated */
        uint32_t n_held_slots, free_held; /* free slots chained from free_held (slot + 1; 0: none) */
        uint32_t *held_keys;            /* index by (id, tier, phase): slot + 1 of the latest entry, 0: empty */
        uint32_t n_held_keys, cap_held_keys;
        uint32_t held_phase;            /* slot + 1 of the first phase grant (ClientHeld.p_next), 0: none */
        uint64_t held_steps;            /* index entries, chain links and entries walked (for the tests) */

        /* the submitted plan */
        PlanPage *plan_page;
        uint64_t plan_page_size;
        int plan_marker_fd;
        uint32_t plan_slots;
        PlanId *plan_ids;               /* its tensors, plan_slots of them, sorted by id: any handle's slot */
        uint32_t plan_phases;
        uint32_t *plan_access;          /* its accesses, phase by phase, each PLAN_ACCESS(slot, tier, mode):
                                         * sorted within a phase, one per (slot, tier), the modes merged */
        uint32_t *plan_phase_first;     /* phase k's are plan_access[plan_phase_first[k] .. [k + 1]) */
        uint64_t plan_seq;
        bool plan_entered;              /* the last tier_phase_enter() returned 0: plan_phase is held */
        uint32_t plan_phase;
        uint64_t plan_refused;          /* the marker seq tierd refused last (Event.phase_refused), 0: none */
        int plan_refused_status;
        char plan_refused_error[CLIENT_ERROR_MAX];
};

struct tier_tensor {
        bool gone;                      /* tierd restarted without it: every call fails with -ESTALE */
        tier_client *client;            /* NULL once the client was freed */
        tier_tensor *prev, *next;       /* in client->tensors */
        uint64_t id;
        uint64_t size;
        uint64_t serial;                /* this handle's number in its client (never reused): plans.c */
        char *name;
        ClientView views[2];            /* per tier (vram, host): a copy that spans segments */
        uint32_t held;                  /* held.c: slot + 1 of its first entry (ClientHeld.t_next), 0: none */
};

/* One received packet: the unpacked Reply and the fds that came with it. */
typedef struct Packet {
        Tier__Reply *reply;
        int fds[WIRE_MAX_FDS];
        size_t n_fds;
} Packet;

#define PACKET_NULL { .reply = NULL, .n_fds = 0 }

static inline bool tier_valid(int tier) {
        return tier >= 0 && tier < TIER_LEVEL_MAX;
}

/* Names of jobs and tensors: non-empty UTF-8 text without control or bidirectional format characters. */
static inline bool name_valid(const char *s) {
        char why[UTF8_NAME_FLAW_MAX];

        return s && *s && !utf8_name_flaw(s, strlen(s), why);
}

/*
 * name_refusal() - why @name ("" or NULL included), which name_valid()
 * refused, is no @what ("job" or "tensor") name, into @buf: the escaped text
 * a @what an older tierd made under it was restored under (util/escape.c, as
 * tierd's own refusal says it), when that is at most NAME_REFUSAL_SAY bytes;
 * a longer one is not said (nor cut: a cut name is no job's).  The client
 * does not know tierd's max_name, so not whether the name was cut with a
 * hash: tierctl lists what it was restored under.  Returns -EINVAL.
 */
#define NAME_REFUSAL_SAY (CLIENT_ERROR_MAX / 2)
int name_refusal(char *buf, size_t size, const char *what, const char *name);

/* ---- client.c ---------------------------------------------------------------------- */

/* Set @c's last_error from @fmt and return @r: "return client_error(c, -EINVAL, ...);". */
_printf_(3, 4)
int client_error(tier_client *c, int r, const char *fmt, ...);

/* The CUDA driver of @c, loaded on first use; NULL with last_error set when it cannot be. */
ClientCuda *client_get_cuda(tier_client *c);
/* Is this process the child of a fork() of the one that made @c (its connection and pages are the parent's)? */
bool client_forked(const tier_client *c);
/* 0, or -EBADF (last_error set) in the child of a fork(): nothing may reach tierd or the parent's pages. */
int client_check_fork(tier_client *c);

/* ---- transport.c ------------------------------------------------------------------- */

/* Close the fds of @p that no message claimed and free its Reply. */
void packet_done(Packet *p);
/* Claim the fd a message names by index; each fd may be claimed once. */
int packet_take_fd(Packet *p, int32_t index);

/* Connect @c->fd to the socket at @path, non-blocking from then on. */
int transport_connect(tier_client *c, const char *path);
/* The connection is unusable from now on; every later request returns @r. */
_printf_(3, 4)
int transport_break(tier_client *c, int r, const char *fmt, ...);
/* Can a request be sent now?  0, or why not (last_error set). */
int transport_check(tier_client *c);
/* The connection is broken: c->broken, last_error set to why. */
int transport_broken(tier_client *c);
/* Handle every packet already queued on the socket, without blocking. */
int transport_drain(tier_client *c);
/* Tell tierd a revoked segment is unmapped (an Ack: no Response, so this never waits). */
int transport_send_ack(tier_client *c, uint32_t segment, uint32_t generation);
/* Send @req (its seq is set here) and wait for its Response, in @ret on success. */
int transport_call(tier_client *c, Tier__Request *req, Packet *ret);
/* A Response must carry the result its request asks for; else -EPROTO, @p done with. */
int transport_expect(tier_client *c, Packet *p, Tier__Response__ResultCase want, const char *what);

/* ---- client.c (more) ---------------------------------------------------------------- */

/* Say Hello as @job, rank @rank on @c's new connection and take what the answer holds. */
int client_hello(tier_client *c, const char *job, unsigned rank);
/* Forget the plan (page, marker, slots): tierd has none for this connection. */
void plan_forget(tier_client *c);
/* @c goes: its unsubmitted plans outlive it, and every later call on them fails with -ENOTCONN. */
void plan_detach_all(tier_client *c);
/* Open tensor @name: its id (and size), without a handle. */
int tensor_open_raw(tier_client *c, const char *name, uint64_t *ret_id, uint64_t *ret_size);

/* tierd refused the phase of a marker (Event.phase_refused): tier_phase_enter() of it fails so. */
void plan_phase_refused(tier_client *c, const Tier__PhaseRefused *pr);

/* ---- held.c -------------------------------------------------------------------------- */

/* A pin of @t in @tier (that may write: @write) was granted; -ENOMEM (nothing noted). */
int held_pin(tier_client *c, tier_tensor *t, int tier, bool write);
/* An unpin of @t in @tier was sent: the last pin of its tensor there goes. */
void held_unpin(tier_client *c, const tier_tensor *t, int tier);
/* tier_phase_grant() of @t in @tier in the current phase; -ENOMEM (nothing noted). */
int held_phase_grant(tier_client *c, tier_tensor *t, int tier);
/*
 * The next phase was entered: the grants of the phases before the one just
 * left go (tierd may still hold the one just left: a phase pinned ahead can
 * be ready before tierd has read the marker that ends the one before).
 */
void held_phase_end(tier_client *c);
/* The plan ended: every phase grant goes. */
void held_phase_clear(tier_client *c);
/*
 * Handle @t closes: its pins and phase grants, which tierd keeps (until the
 * unpin, the phase's end, or the connection's), are kept by name; -ENOMEM
 * (then forgotten).
 */
int held_forget_tensor(tier_client *c, tier_tensor *t);
/* Every grant goes (the connection they were for is gone, and a Hello named them). */
void held_clear(tier_client *c);
/* The writes held, as a Hello names them (*@ret: malloc'ed array of malloc'ed entries, @ret_n). */
int held_writes(const tier_client *c, Tier__HeldWrite ***ret, size_t *ret_n);
void held_writes_free(Tier__HeldWrite **w, size_t n);

/* ---- reconnect.c ------------------------------------------------------------------- */

/*
 * client_reconnect() - the connection broke with @r (tierd went away):
 * with reconnecting on, connect again, say Hello as before and open every
 * tensor handle again; -ERESTART when that worked (the caller's request is
 * not retried: it may or may not have happened), else @r.
 */
int client_reconnect(tier_client *c, int r);
/* Is @r what a connection to a tierd that went away fails with? */
static inline bool client_gone(int r) {
        return r == -ECONNRESET || r == -ESHUTDOWN || r == -EPIPE || r == -ENOTCONN;
}

/* ---- control.c --------------------------------------------------------------------- */

/*
 * Ask tierd for its status and hand the reply to @use(@userdata) (inline in
 * the packet, or read from the memfd tierd sent for a big one).
 */
int status_fetch(tier_client *c, int (*use)(const Tier__StatusReply *, void *), void *userdata);

/* ---- segments.c -------------------------------------------------------------------- */

/* Unmap @s (or close its fd) and mark its slot unused. */
void segment_clear(tier_client *c, ClientSegment *s);
/* Map every segment in @segs, claiming their fds from @p. */
void segment_add_all(tier_client *c, Tier__Segment **segs, size_t n, Packet *p);
/* tierd takes a segment back: drop our mapping, then ack. */
void segment_revoke(tier_client *c, const Tier__Revoke *rv);
/*
 * segment_resolve() - turn a copy of @t in @tier (@pieces, in order: one for
 * a copy in one segment) into an address, fetching segments we lack; a copy
 * that spans segments is mapped as one range (@t's view of the tier).
 * @length: the tensor's size
 */
int segment_resolve(tier_client *c, tier_tensor *t, int tier, uint64_t length, const ViewPiece *pieces, size_t n,
                    struct tier_grant *ret);
/* The same for a wire grant. */
int segment_resolve_grant(tier_client *c, tier_tensor *t, const Tier__Grant *g, struct tier_grant *ret);
/* Unmap a view (tensor closed, client freed, a piece's segment revoked). */
void view_clear(tier_client *c, ClientView *v);

/* ---- tensors.c --------------------------------------------------------------------- */

/* 0 when @t is a handle whose client still exists; -EINVAL, -ENOTCONN. */
int tensor_check(const tier_tensor *t);

/* ---- fences.c ---------------------------------------------------------------------- */

/* Map the fence page tierd sent in HelloReply (@fd borrowed). */
int fence_map_page(tier_client *c, int fd);
/* Where a fence the caller sees carries its client's tag. */
#define CLIENT_FENCE_TAG_SHIFT 48
#define CLIENT_FENCE_TAG_MASK (UINT64_C(0xffff) << CLIENT_FENCE_TAG_SHIFT)
/* A tag for a new client: 1..0xffff in the top bits, the process's clients in turn. */
uint64_t fence_new_tag(void);
/* The fence the caller sees for libtier's fence @f (0 stays 0). */
tier_fence fence_out(const tier_client *c, tier_fence f);
/* 8-byte tokens client_wakeup_drain() reads at once from the wakeup fd. */
#define CLIENT_WAKEUP_TOKENS 64
/* Take the tokens waiting on the wakeup fd (after poll() said POLLIN), then look at the pages again. */
void client_wakeup_drain(tier_client *c);
/*
 * libtier closed the connection while tierd lives on (transport.c, a timeout): once tierd sees it end,
 * the connection's slot of the job's page is free for the job's next connection, whose fences would
 * read as this client's.  What the slot says now is all this client will know of its fences.
 */
void fence_freeze(tier_client *c);
/* tier_fence_done() and tier_fence_wait() of an untagged fence. */
int fence_done(tier_client *c, tier_fence f);
int fence_wait(tier_client *c, tier_fence f, int timeout_ms);
/* tierd handed out @f: tier_fence_done() accepts fences up to the highest seen. */
void fence_saw(tier_client *c, tier_fence f);
/* Remember that @fence failed with @status (< 0), as a FenceFailed event said. */
void fence_record_failure(tier_client *c, tier_fence fence, int status);
/* Keep tierd's copy event of @fence (PinReply.ipc_event) for tier_fence_stream_wait(). */
void fence_add_event(tier_client *c, tier_fence fence, const uint8_t handle[CLIENT_CUDA_EVENT_SIZE]);
