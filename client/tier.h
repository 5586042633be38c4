/* SPDX-License-Identifier: MIT */
/* tier.h: libtier, the client library of tierd (the only installed header). */
#ifndef TIER_H
#define TIER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Conventions: every function that can fail returns 0 (or a non-negative
 * value) on success and a negative errno-style code on failure; errno is
 * never the only carrier of an error.  tier_strerror() turns a code into
 * text, and tier_client_last_error() gives the daemon's reason for the
 * most recent failed request when there was one.
 *
 * A tier_client is one connection to tierd, i.e. one rank of one job.
 * It is not thread-safe: use one per thread, or lock around it.
 *
 * fork(): a client belongs to the process that made it.  In the child,
 * every call on the parent's clients (and their tensors, plans and fences)
 * that would reach tierd or the shared pages fails with -EBADF, sending
 * nothing; tier_tensor_close(), tier_plan_free() and tier_client_free()
 * there only unmap and close the child's copies, so the parent's pins,
 * tensors and connection stay.  Grants mapped before the fork() still show
 * the parent's tensors.  Make a new client in the child.
 *
 * Once tierd announces its shutdown, requests fail with -ESHUTDOWN; once
 * the connection is lost, with -ECONNRESET (or the error that broke it).
 *
 * ABI (libtier.so.1, symbol versions LIBTIER_1.0 and LIBTIER_1.1): names are
 * tier_OBJECT_VERB (client, tensor, fence, plan, phase, quota, job, trace,
 * level, link; a getter's verb is its noun: tier_tensor_size()), except the
 * data path on a tensor, tier_pin(), tier_unpin(), tier_evict(),
 * tier_prefetch() and their _async forms, and tier_strerror() after libc's
 * strerror().  Output parameters
 * come last.  Every struct that crosses the ABI ends in reserved space and
 * sizes its per-tier and per-link arrays by TIER_LEVEL_SLOTS and
 * TIER_LINK_SLOTS, not by the levels and links in use today: a later 1.x
 * fills reserved space or slots that read as 0 here.  A struct passed in
 * must have its reserved space and unused slots zeroed (= {0}, = {} in
 * C++, or memset): libtier refuses anything else with -EINVAL, so a field
 * added later can never be mistaken for garbage.  A new function comes with a new version
 * node (LIBTIER_1.1, ...); a changed one means a new soname.
 */

/*
 * Marks the anonymous struct and union of struct tier_tensor_info (ISO C from
 * C11 on, an extension in C99 and C++) so that tier.h compiles clean with
 * -pedantic there too.
 */
#if defined(__GNUC__)
#define TIER_EXTENSION __extension__
#else
#define TIER_EXTENSION
#endif

/* The wire protocol spoken with tierd (see libtier(3), COMPATIBILITY). */
#define TIER_PROTOCOL_VERSION 2

/* Where tensors live.  Lower numbers are closer to the GPU. */
enum tier_level {
        TIER_VRAM = 0,
        TIER_HOST = 1,
        TIER_NVME = 2,
        TIER_LEVEL_MAX = 3      /* levels in use */
};

/* Room for levels and links in the arrays of the ABI's structs; slots past those in use are 0. */
#define TIER_LEVEL_SLOTS 8
#define TIER_LINK_SLOTS 8

typedef struct tier_client tier_client;
typedef struct tier_tensor tier_tensor;
typedef uint64_t tier_fence;

/* A grant: a pinned copy of a tensor, mapped into this process. */
struct tier_grant {
        void *ptr;              /* host address (memfd tiers); NULL for device memory */
        uint64_t device_ptr;    /* device address (cuda VRAM tier, a CUdeviceptr in the primary
                                 * context of tierd's GPU); 0 otherwise */
        uint64_t length;        /* bytes, equal to the tensor's size */
        uint32_t segment;       /* segment id inside the job */
        uint64_t offset;        /* offset inside the segment */
        int tier;               /* enum tier_level */
        uint32_t reserved[7];
};

struct tier_stat {
        uint64_t size;
        /* per tier (index enum tier_level): 0 absent, 1 filling, 2 resident, 3 draining */
        int state[TIER_LEVEL_SLOTS];
        int dirty[TIER_LEVEL_SLOTS];
        unsigned pins[TIER_LEVEL_SLOTS];
        uint64_t reserved[4];
};

/**
 * tier_client_new() - connect to tierd and join (or create) a job.
 * @socket: socket path, or NULL for $TIER_SOCKET, else /run/tierd/tierd.sock
 * @job:    job name (1..max_name bytes of UTF-8, no control characters); NULL or "" for a control
 *          connection: status, quotas, job control and traces, but no tensors of its own
 * @rank:   this process's rank inside the job (informational)
 * @ret:    the new client
 *
 * On failure *@ret is left alone and tier_client_last_error(NULL) says why,
 * e.g. "cannot connect to /run/tierd/tierd.sock: No such file or directory
 * (is tierd running?)" or the daemon's reason for refusing the job.
 */
int tier_client_new(const char *socket, const char *job, unsigned rank, tier_client **ret);
/*
 * Close the connection (tierd drops its pins) and unmap everything.  Tensor
 * handles still open are not freed but invalidated: their operations return
 * -ENOTCONN, tier_tensor_name()/_size() keep working, and each must still be
 * released with tier_tensor_close().  Takes NULL; returns NULL.
 */
tier_client *tier_client_free(tier_client *c);

/*
 * Reason text for the last failed call on @c (the daemon's when it gave one),
 * or "".  With @c NULL: why the last tier_client_new() of this thread failed.
 * A call refused for its own arguments (-EINVAL before any request) sets
 * its own reason too, naming the argument; only a call given no client to
 * keep it (a NULL client, tensor or plan) leaves the text as it was.
 */
const char *tier_client_last_error(const tier_client *c);

/*
 * Reconnecting, opt-in (off by default): a call that finds tierd gone (its
 * connection closed; after tierd announced its stop, at the next
 * tier_phase_enter(), or when tierd refuses a request) waits up to @timeout_ms
 * for a tierd to answer on the same socket, connects, joins the same job
 * as the same rank and opens every tensor handle again by name, then fails
 * with -ERESTART ("tierd restarted, handles re-established"): the call may
 * or may not have happened before tierd went, and is not repeated.  What
 * the connection held is gone: pins (pin again), the plan (submit it
 * again), phases, and fences (tier_fence_wait() on one of before fails with
 * -ERESTART).  Any call that talks to tierd may return -ERESTART;
 * tier_phase_enter() and tier_fence_wait() too.  Mappings of old grants stay mapped
 * until the client is freed.  A handle whose tensor the new tierd lacks
 * fails with -ESTALE.  tier_client_restarts(): how many times this client
 * connected again (restarts, and connections closed for a timeout:
 * tier_client_set_timeout()).  A control connection does not reconnect (-EINVAL).
 */
int tier_client_set_reconnect(tier_client *c, int timeout_ms);
unsigned tier_client_restarts(const tier_client *c);

/*
 * Opt-in (LIBTIER_1.1): every request of @c must be answered within
 * @timeout_ms milliseconds (0, the default: no limit; < 0: -EINVAL).  A
 * call with no answer in time fails with -ETIMEDOUT and closes the
 * connection (a late answer could not be told from the next one's): later
 * calls fail with -ECONNRESET, or reconnect (tier_client_set_reconnect()).
 * Waits for tierd's work are not answers and are not bounded by it:
 * tier_fence_wait() (its own timeout), tier_fence_stream_wait(),
 * tier_phase_enter().  tier_client_set_timeout(3) has the details.
 */
int tier_client_set_timeout(tier_client *c, int timeout_ms);

/* Name of the VRAM backend ("emulated" or "cuda") */
const char *tier_client_vram_backend(const tier_client *c);
/* PCI bus id of tierd's GPU ("0000:3b:00.0") with the cuda backend, else "": where device_ptrs live */
const char *tier_client_vram_device(const tier_client *c);
/* The job's byte limit in @tier, or 0 when unknown */
uint64_t tier_client_limit(const tier_client *c, int tier);
/*
 * The largest tensor the job may have in @tier: its limit there, or the
 * tier's capacity when that is smaller (0 when unknown).  A tensor may be of
 * any size up to that: one larger than a segment spans several and is still
 * mapped as one range.
 */
uint64_t tier_client_tensor_max(const tier_client *c, int tier);
/* The unit tierd hands memory out in, in @tier: host segment, VRAM chunk, NVMe extent (0 when unknown). */
uint64_t tier_client_segment_size(const tier_client *c, int tier);
/* The connection's socket fd (to poll for events); borrowed */
int tier_client_fd(const tier_client *c);

/* The links tierd moves bytes over, as its status counts them. */
enum {
        TIER_LINK_NVME_TO_HOST = 0,
        TIER_LINK_HOST_TO_NVME = 1,
        TIER_LINK_HOST_TO_VRAM = 2,
        TIER_LINK_VRAM_TO_HOST = 3,
        TIER_LINKS = 4,         /* links in use */
};
/*
 * Bytes tierd has moved for this client's job over each link since the job
 * began (@ret[TIER_LINK_*]; the slots past TIER_LINKS are 0), as tierd
 * counts them: what a pass of a training step really cost is the
 * difference of two calls.  One status request; 0 or -errno.
 */
int tier_client_moved(tier_client *c, uint64_t ret[TIER_LINK_SLOTS]);

/* Create a tensor of @size bytes (contents start as zeros). */
int tier_tensor_create(tier_client *c, const char *name, uint64_t size, tier_tensor **ret);
/* Open an existing tensor of the job by name (e.g. made by another rank). */
int tier_tensor_open(tier_client *c, const char *name, tier_tensor **ret);
/* Destroy the tensor in tierd and free the handle; -EBUSY while it is pinned, has
 * requests in flight or a plan names it.  On failure the handle stays valid. */
int tier_tensor_destroy(tier_tensor *t);
/* Free the local handle only; the tensor stays in tierd. */
tier_tensor *tier_tensor_close(tier_tensor *t);
uint64_t tier_tensor_size(const tier_tensor *t);
const char *tier_tensor_name(const tier_tensor *t);
int tier_tensor_stat(tier_tensor *t, struct tier_stat *ret);

/* What a caller will do with a tensor's bytes (tier_pin(), tier_plan_add()). */
enum tier_access {
        TIER_READ = 1,
        TIER_WRITE = 2,
        TIER_READ_WRITE = 3,
};

/*
 * Pin a resident copy in @tier (bringing it there first) and map it.  The
 * grant's ptr (or device_ptr) stays valid until the matching tier_unpin().
 * @mode: TIER_READ, TIER_WRITE or TIER_READ_WRITE.  TIER_WRITE alone
 * promises to overwrite the whole tensor before reading it: tierd reserves
 * the copy and does not bring the old bytes (no NVMe read for a tensor that
 * lives there); until written, they read as anything.  tierd counts the
 * unpin of such a pin as dirty, whatever it says.  With the cuda VRAM backend a VRAM grant has ptr NULL and
 * device_ptr set: the first one loads the CUDA driver (libcuda.so.1, never
 * linked) and maps tierd's chunk on tierd's GPU; without a usable CUDA in
 * this process it fails with -ENODEV and the reason in
 * tier_client_last_error().
 */
int tier_pin(tier_tensor *t, int tier, int mode, struct tier_grant *ret);
/* Asynchronous pin: the grant is valid at once, the bytes once @ret_fence is done. */
int tier_pin_async(tier_tensor *t, int tier, int mode, struct tier_grant *ret, tier_fence *ret_fence);
/* Drop one pin; @dirty says the client wrote the copy. */
int tier_unpin(tier_tensor *t, int tier, int dirty);
/* Make @tier (or a lower tier) hold the only copy: copies above it are dropped. */
int tier_evict(tier_tensor *t, int tier);
int tier_evict_async(tier_tensor *t, int tier, tier_fence *ret_fence);
/* Bring a copy up to @tier without pinning it. */
int tier_prefetch(tier_tensor *t, int tier);
int tier_prefetch_async(tier_tensor *t, int tier, tier_fence *ret_fence);

/*
 * Fences are numbered per client, and each carries its client's tag in
 * its top 16 bits: one passed to another client than the one that
 * returned it, or never handed out (a control connection hands out
 * none), is -EINVAL.  Fence 0 is always done.
 *
 * 1 if @f is done, 0 if not, < 0 if it failed (the failure's status, e.g.
 * -EIO; tier_client_last_error() has tierd's reason) or never will be
 * (tierd went away before it was done: -ECONNRESET, -EPIPE, -ESHUTDOWN; a
 * client that reconnects joins the next tierd, tier_client_set_reconnect(),
 * waiting for it up to its timeout, and gets -ERESTART).
 * Never makes a system call when the fence completed without error.
 */
int tier_fence_done(tier_client *c, tier_fence f);
/* Wait for @f; @timeout_ms < 0 waits forever.  0 when done, -ETIMEDOUT on
 * timeout, the fence's status if it failed; when tierd goes away, the error
 * that broke the connection (-ECONNRESET, -EPIPE, -ESHUTDOWN; -ERESTART
 * with reconnecting on). */
int tier_fence_wait(tier_client *c, tier_fence f, int timeout_ms);

/*
 * Handle whatever tierd sent that no call has read yet, without blocking:
 * failed fences, a shutdown, and revokes (tierd takes back an empty VRAM
 * chunk of the job; libtier unmaps it and acknowledges).  A client that
 * talks to tierd seldom should call this when tier_client_fd() is readable:
 * a revoke not answered within its timeout (5 s) costs the connection.
 * Returns 0, -ESHUTDOWN once tierd announced its shutdown, or the error
 * that broke the connection.
 */
int tier_client_process(tier_client *c);

/* ---- CUDA (the cuda VRAM backend) ------------------------------------------- */

/*
 * Stream-ordered completion: make @stream (a CUstream or cudaStream_t of
 * tierd's GPU, in the primary context; NULL: the legacy default stream)
 * wait for fence @f of an async pin into VRAM, so that kernels queued
 * after it see the data, without blocking this thread.  When tierd sent no
 * event for @f (its copy was not yet queued when it answered, or the fence
 * is not a VRAM pin's) this waits for @f on the host like tier_fence_wait().
 * Returns 0, or the fence's error if it is known to have failed already;
 * a copy that fails later still completes the stream's wait, so check the
 * fence (tier_fence_done()) before trusting the data.
 */
int tier_fence_stream_wait(tier_client *c, tier_fence f, void *stream);

/*
 * tier_unpin() for a VRAM pin whose tensor kernels queued on @stream still
 * write: records an interprocess event on @stream and passes it with the
 * unpin, so tierd copies the tensor out (evict, write-back) only after that
 * work.  Needs the cuda backend (-EOPNOTSUPP otherwise).  On failure the
 * pin is kept.
 */
int tier_unpin_after(tier_tensor *t, int tier, int dirty, void *stream);

/*
 * Register this client's host-tier segments with CUDA (cuMemHostRegister),
 * those mapped now and those that come later, so cudaMemcpyAsync from and
 * to host grants runs at full speed without staging.  Opt-in because it
 * loads the CUDA driver and pins the pages in this process too.  Returns
 * the number of segments registered now, or -errno (-ENODEV: no CUDA here).
 */
int tier_client_cuda_register_host(tier_client *c);

/* Status of the whole daemon, formatted (caller frees *ret with free()). */
enum {
        TIER_STATUS_TABLE = 0,  /* human-readable table */
        TIER_STATUS_JSON = 1,   /* one JSON object */
        TIER_STATUS_PROMETHEUS = 2, /* Prometheus text exposition format 0.0.4, rendered by tierd */
};
int tier_client_status(tier_client *c, int format, char **ret);

/* ---- iteration plans (the shared scheduling timeline) ---------------------- */

/*
 * A plan is the cyclic list of phases one training step goes through
 * (forward of each layer, backward, optimizer...), each naming the tensors
 * it touches, the tier it needs them in and how.  tierd learns how long
 * each phase takes and moves data ahead of time so that tier_phase_enter()
 * rarely waits.  One plan per client (rank).
 */
typedef struct tier_plan tier_plan;

int tier_plan_new(tier_client *c, tier_plan **ret);
/* Free a plan that was not submitted (a submitted plan belongs to its client). */
tier_plan *tier_plan_free(tier_plan *p);
/* Phase @phase (counted from 0; phases form a cycle) needs @t in @tier (TIER_VRAM or TIER_HOST). */
int tier_plan_add(tier_plan *p, unsigned phase, tier_tensor *t, int tier, int mode);
/*
 * Send the plan.  tierd refuses one that cannot run within the job's quota
 * (-ENOSPC, with the phases and bytes in tier_client_last_error()).  On
 * success the plan belongs to the client and @p must not be used again.
 */
int tier_plan_submit(tier_plan *p);
/*
 * Enter phase @phase: what the previous phase used is released (written
 * tensors as dirty) and what @phase needs is pinned.  Costs a shared-memory
 * write and one eventfd write; waits only while tierd is still bringing
 * data.  Returns 0, the plan's error, -EINVAL without a plan or for a
 * phase it lacks, or the connection's error (-ERESTART included); -ENOSPC
 * when tierd refuses the phase because it can never be pinned while this
 * client's own pins (tier_pin(), outside the plan) stay (too many bytes, or
 * room they leave only in runs too short; in host, too, for a tensor
 * read in VRAM whose data is only on NVMe: it comes up through host):
 * nothing else could free that room, and the client waits here
 * (tier_client_last_error() names the pins).  The plan lives on: unpin them, and enter a phase again.  The phase change comes before
 * every request this client sends after tier_phase_enter() returns: tierd handles
 * the marker first, so such a request (an evict of what only the previous
 * phase needed, say) never finds the previous phase's pins.
 */
int tier_phase_enter(tier_client *c, unsigned phase);
/*
 * End the plan: what its current phase pinned is released (as dirty where
 * the plan writes), its tensors may be freed again, and the client may
 * submit another.  -ENOENT if it runs none.
 */
int tier_plan_end(tier_client *c);
/*
 * Where @t, pinned in @tier for the current phase, is mapped: only for an access
 * of the phase the last tier_phase_enter() entered (-EINVAL when it failed,
 * -ENOENT for a tensor and tier the phase does not access).
 */
int tier_phase_grant(tier_client *c, tier_tensor *t, int tier, struct tier_grant *ret);
/* Seconds this client has waited in tier_phase_enter() under its current plan (0 without one). */
double tier_phase_stall(const tier_client *c);

/* ---- quotas ------------------------------------------------------------------ */

/*
 * Quotas of job names, uids and groups, with guaranteed minima.
 * A job's quota resolves field by field along job name > uid > group >
 * default; each value says where it comes from ("uid 1000", "job 'x'",
 * "group 27", "default"; " (tierd.conf)" for a rule of the configuration).
 */
enum {
        TIER_QUOTA_JOB = 0,                     /* a job name, whether a job of that name runs or not */
        TIER_QUOTA_UID = 1,
        TIER_QUOTA_GROUP = 2,
        TIER_QUOTA_DEFAULT = 3,                 /* read only: tierd.conf's job_limit and default_weight */
};

#define TIER_QUOTA_FROM_MAX 288                 /* room for "job 'NAME' (tierd.conf)" with a 255-byte name */

struct tier_quota {
        uint64_t max[TIER_LEVEL_SLOTS];         /* bytes per tier; on set: 0 = unchanged */
        uint64_t min[TIER_LEVEL_SLOTS];         /* guaranteed bytes per tier; on set: those in min_set apply */
        unsigned min_set;                       /* on set: bits 1 << tier of min[] to apply (a min of 0 is a value) */
        unsigned weight;                        /* share of the links, 1..1000; on set: 0 = unchanged */
        int clear;                              /* on set: first drop what was set at run time for the target */
        int running;                            /* on get, TIER_QUOTA_JOB: a job of that name runs now */
        char max_from[TIER_LEVEL_SLOTS][TIER_QUOTA_FROM_MAX];   /* on get: where each value comes from */
        char min_from[TIER_LEVEL_SLOTS][TIER_QUOTA_FROM_MAX];
        char weight_from[TIER_QUOTA_FROM_MAX];
        char warning[512];                      /* after a set: tierd's warning (a max below a job's use), or "" */
        uint64_t reserved[8];
};

/*
 * tier_quota_get() - the quota of a target: @kind TIER_QUOTA_JOB with
 * @job (NULL or "": the client's own job), TIER_QUOTA_UID or
 * TIER_QUOTA_GROUP with @id, or TIER_QUOTA_DEFAULT.  Anyone may read the
 * default, a job name that does not run, and their own jobs, uid and
 * groups; the rest needs root or group tier-admin (-EPERM).
 */
int tier_quota_get(tier_client *c, int kind, uint32_t id, const char *job, struct tier_quota *ret);
/*
 * tier_quota_set() - set the fields of @q (see struct tier_quota) for a
 * target as above (not the default), kept by tierd across restarts and
 * applied at once to the running jobs it governs.  Needs root or group
 * tier-admin.  @ret (may be NULL): the target's quota afterwards, with
 * tierd's warning if any.  The fields that are only read on get
 * (running, *_from, warning) are ignored on set.
 */
int tier_quota_set(tier_client *c, int kind, uint32_t id, const char *job, const struct tier_quota *q,
                   struct tier_quota *ret);

/*
 * The totals of a uid or a group: the bytes of each tier that all its jobs
 * together (lingering ones included) may use, beside each job's own
 * maximum.  A uid without one of its own gets tierd.conf's [host|vram|nvme]
 * uid_share of the tier, unless its jobs' creator is root or in group
 * tier-admin.
 */
struct tier_quota_total {
        uint64_t total[TIER_LEVEL_SLOTS];       /* bytes per tier; 0: no total */
        uint64_t used[TIER_LEVEL_SLOTS];        /* on get: what its jobs use now */
        char from[TIER_LEVEL_SLOTS][TIER_QUOTA_FROM_MAX]; /* on get: "uid 1000", "uid_share", "none", ... */
        uint64_t reserved[4];
};

/*
 * tier_quota_total_get() - the totals of @kind TIER_QUOTA_UID or
 * TIER_QUOTA_GROUP @id (read as tier_quota_get() reads).
 * tier_quota_total_set() - set the totals of the tiers in @total_set (bits
 * 1 << tier) to @total[tier] (0: none, which also lifts the uid_share;
 * the slots past TIER_LEVEL_MAX must be 0),
 * kept across restarts like every quota; needs root or group tier-admin.
 * @ret (may be NULL): the totals afterwards.
 */
int tier_quota_total_get(tier_client *c, int kind, uint32_t id, struct tier_quota_total *ret);
int tier_quota_total_set(tier_client *c, int kind, uint32_t id, const uint64_t total[TIER_LEVEL_SLOTS],
                         unsigned total_set, struct tier_quota_total *ret);

/* ---- job control (tierctl) ----------------------------------------------------------- */

/*
 * These act on any job by name, from any connection (a control one too).
 * tier_job_list() lists every job; the others are allowed to the job's uid,
 * root and members of group tier-admin (-EACCES otherwise, with the reason
 * in tier_client_last_error()); -ENOENT when there is no such job.
 */

enum tier_copy_state {
        TIER_COPY_ABSENT = 0,
        TIER_COPY_FILLING = 1,          /* space reserved, data on its way */
        TIER_COPY_RESIDENT = 2,
        TIER_COPY_DRAINING = 3,         /* being written down, then dropped */
};

struct tier_job_info {
        uint64_t id;
        const char *name;               /* inside the block tier_job_list() returned */
        unsigned uid;                   /* of the process that created it: its owner */
        unsigned connections;
        unsigned tensors;
        unsigned weight;
        int lingering;                  /* no connection: it ends in linger_left_s */
        double linger_left_s;
        uint64_t used[TIER_LEVEL_SLOTS];
        uint64_t limit[TIER_LEVEL_SLOTS];
        uint64_t pinned[TIER_LEVEL_SLOTS];
        uint64_t reserved[4];
};

/* Every job: *@ret is one malloc()ed block (free() it) of *@ret_n entries.  One round trip. */
int tier_job_list(tier_client *c, struct tier_job_info **ret, size_t *ret_n);

struct tier_copy_info {
        int state;                      /* enum tier_copy_state */
        int valid;                      /* holds the newest data; a resident copy that is not is stale */
        int dirty;                      /* holds the newest data, which NVMe lacks */
        unsigned pins;
        uint32_t reserved[4];
};

/* What a listed tensor's data is (struct tier_tensor_info.state). */
enum tier_tensor_state {
        TIER_TENSOR_UNKNOWN = 0,        /* not said (a tierd older than libtier) */
        TIER_TENSOR_DATA = 1,           /* written: its valid copies hold its data */
        TIER_TENSOR_UNWRITTEN = 2,      /* never written: it reads as zeros */
        TIER_TENSOR_DEAD = 3,           /* its bytes dropped: its next access (a plan's) overwrites it whole */
        TIER_TENSOR_LOST = 4,           /* its newest data is gone: reads fail -ENODATA until it is written whole */
};

struct tier_tensor_info {
        uint64_t id;
        const char *name;               /* inside the block tier_job_tensors() returned */
        uint64_t size;
        struct tier_copy_info copy[TIER_LEVEL_SLOTS];
        int used;                       /* 0: no copy was ever used */
        double idle_s;                  /* seconds since a copy was last used */
        TIER_EXTENSION union {          /* the reserved space of libtier 1.0, the layout unchanged */
                TIER_EXTENSION struct {
                        int state;              /* enum tier_tensor_state */
                        const char *lost_why;   /* TIER_TENSOR_LOST: why, inside the block; else NULL */
                };
                uint64_t reserved[4];
        };
};

/*
 * The tensors of @job: *@ret is one malloc()ed block (free() it) of *@ret_n
 * entries.  One round trip per page of up to 1024 tensors; a job that
 * changes meanwhile may list a tensor twice or not at all.
 */
int tier_job_tensors(tier_client *c, const char *job, struct tier_tensor_info **ret, size_t *ret_n);

struct tier_evict_result {
        unsigned evicted;               /* tensors whose copies above the tier were dropped */
        unsigned pinned;                /* tensors skipped: pinned above the tier */
        unsigned failed;                /* the first failure's reason is in tier_client_last_error() */
        uint64_t bytes_written;         /* written down first (copies that were the only valid one) */
        uint64_t bytes_dropped;         /* of the copies dropped */
        uint64_t pinned_bytes;
        uint64_t reserved[4];
};

/*
 * Write every unpinned copy of @job above @tier (TIER_HOST or TIER_NVME)
 * down to it and drop them; waits until that is done.  Returns 0 also when
 * some tensors failed (@ret->failed).
 */
int tier_job_evict(tier_client *c, const char *job, int tier, struct tier_evict_result *ret);

struct tier_detach_result {
        uint64_t job_id;
        unsigned connections;           /* connections tierd closed */
        unsigned tensors;               /* tensors freed */
        uint64_t freed[TIER_LEVEL_SLOTS]; /* bytes the job held per tier */
        uint64_t reserved[4];
};

/* End @job now: tierd closes its connections (saying why) and frees all it holds. */
int tier_job_detach(tier_client *c, const char *job, struct tier_detach_result *ret);

/*
 * Commits, for a job that must come back as it was after a crash of its
 * process: tier_job_commit() says that what every tensor of the job holds
 * now (as of its last dirty unpin) is its committed state; from then on
 * tierd keeps, for each tensor written again, that version's image on NVMe
 * until the next commit (writing it there first where it lay in memory
 * only: the pin that writes it waits for that).  tier_job_rollback(), by
 * the process that takes the job over, brings every tensor written since
 * the last commit back to it (zeros for one that was never written then).
 * @step is the caller's number for the commit; a rollback returns the last
 * one.  A commit fails with -EBUSY while a tensor of the job is pinned for
 * reading and writing (commit between the phases that write), or is held
 * for a rank of before a tierd restart that has not attached again; a
 * rollback while one is pinned at all.  Both are a round trip; a commit also frees
 * the images of the commit before it.
 */
struct tier_commit {
        uint64_t step;          /* the last commit's step */
        unsigned rolled_back;   /* tensors brought back (tier_job_rollback()) */
        unsigned lost;          /* tensors with nothing to go back to: reads fail with -ENODATA */
        int committed;          /* the job has made a commit (0: a rollback found none and changed nothing) */
        uint32_t reserved[7];
};
int tier_job_commit(tier_client *c, uint64_t step);
int tier_job_rollback(tier_client *c, struct tier_commit *ret);

/*
 * Tracing (root or group tier-admin; one trace at a time in tierd).
 * tier_trace_start() makes tierd record every transfer, plan phase, stall
 * and scheduler decision for @seconds (0: 3600, the most) into a buffer of
 * @buffer records (0: tierd.conf's [trace] buffer); -EBUSY while another
 * trace exists.  The trace belongs to @c: it ends when @c closes.
 * tier_trace_stop() stops it and returns the records in *@ret (free with
 * tier_trace_free()).  tier_trace_write_json() writes them to @fd as Chrome
 * Trace Event Format JSON (ui.perfetto.dev, chrome://tracing).
 */
typedef struct tier_trace tier_trace;

int tier_trace_start(tier_client *c, unsigned seconds, unsigned buffer);
int tier_trace_stop(tier_client *c, tier_trace **ret);
/* Records kept, and records tierd dropped because its buffer was full. */
size_t tier_trace_records(const tier_trace *t);
uint64_t tier_trace_dropped(const tier_trace *t);
/* Bytes moved over @link (TIER_LINK_*) while it recorded: as tierd's counters say, as the transfer records add up. */
uint64_t tier_trace_link_bytes(const tier_trace *t, int link);
uint64_t tier_trace_traced_bytes(const tier_trace *t, int link);
/* Write the trace as Chrome Trace Event Format JSON to @fd (borrowed); 0 or -errno. */
int tier_trace_write_json(const tier_trace *t, int fd);
tier_trace *tier_trace_free(tier_trace *t);

/* Text for an error code, given as -errno or errno; thread-safe, never NULL. */
const char *tier_strerror(int err);
/* "vram", "host", "nvme"; NULL for anything else. */
const char *tier_level_name(int tier);
/* "nvme->host", "host->nvme", "host->vram", "vram->host" (TIER_LINK_*); NULL for anything else. */
const char *tier_link_name(int link);
/* Parse "vram", "host", "nvme"; -EINVAL otherwise. */
int tier_level_from_name(const char *s);

#ifdef __cplusplus
}
#endif
#endif
