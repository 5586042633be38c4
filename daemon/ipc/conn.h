/* SPDX-License-Identifier: MIT */
/* conn.h: one client connection: reading packets, the out-queue, replies with the job's new segments. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/macro.h"
#include "proto/wire.h"
#include "util/list.h"

typedef struct Job Job;
typedef struct JobEvict JobEvict;
typedef struct Plan Plan;
typedef struct RollbackWait RollbackWait;
typedef struct Server Server;
typedef struct Tensor Tensor;
typedef struct Tier__Event Tier__Event;
typedef struct Tier__Response Tier__Response;
typedef struct sd_event_source sd_event_source;

/* A pin this connection holds (fence.c): dropped, as dirty, when the connection goes. */
typedef struct PinRec {
        Tensor *tensor;
        int tier;
        bool write_only;        /* a write-only pin: its unpin is dirty whatever the client says */
        bool rw;                /* a pin that may read and write (counted in Tensor.rw_pins) */
        uint32_t next;          /* the connection's pin of the same tensor and tier recorded before it
                                 * (PIN_NONE: none), or in a free slot (tensor NULL) the next one + 1 */
} PinRec;

#define PIN_NONE UINT32_MAX

/* Conn.pin_keys: where a connection's pins of one tensor in one tier start (pins.c). */
typedef struct PinKey {
        Tensor *tensor;         /* NULL: an empty entry */
        int tier;
        uint32_t head;          /* its latest pin, in Conn.pins */
} PinKey;

typedef struct OutPacket {
        List link;
        size_t len;
        int fds[WIRE_MAX_FDS];
        size_t n_fds;
        bool close_after;
        uint8_t data[];
} OutPacket;

typedef struct Conn {
        Server *server;
        List link;              /* Server.conns */
        int fd;
        sd_event_source *io;
        uid_t uid;
        gid_t gid;
        pid_t pid;
        uint64_t id;
        bool hello_done;
        bool closing;           /* flush the queue, then close */
        bool broken;            /* lost an event it must see: closed at the next chance */
        sd_event_source *abort_source;

        /* what the request layer (rpc.c, fence.c) keeps per connection */
        Job *job;               /* NULL for a control connection */
        uint32_t rank;          /* its Hello's */
        List job_link;          /* Job.conns */
        unsigned fence_slot;
        int efd;                /* write end of the wakeup pipe (base/wakeup.c); the client has the read end */
        uint64_t next_fence;
        uint64_t fence_done;
        uint64_t *fence_completed;      /* completed fences above fence_done */
        size_t n_fence_completed;
        List pending;           /* rpc.c Pending.link: requests still in the op engine */
        unsigned inflight;
        Plan *plan;             /* iteration plan of this rank, or NULL */
        JobEvict *evict;        /* jobctl.c: its evict of a job, running, or NULL */
        RollbackWait *rollback; /* commit.c: its rollback waiting for the job's transfers, or NULL */
        PinRec *pins;           /* pins.c: slots [0, n_pin_slots), free ones (tensor NULL) chained from
                                 * free_pin (the first one + 1; 0: none) */
        size_t n_pins, cap_pins;        /* pins held; slots allocated */
        uint32_t n_pin_slots, free_pin;
        PinKey *pin_keys;       /* pins.c: an open-addressing index by tensor and tier */
        uint32_t n_pin_keys, cap_pin_keys;
        uint64_t pin_steps;     /* pins.c: entries pin_forget() looked at, in all (for the tests) */
        /* jobctl.c: where its last JobTensors page ended, so the next one starts there (no walk) */
        uint64_t list_job;      /* the job's id (0: none) */
        uint32_t list_offset;   /* the offset the next page asks for */
        uint64_t list_next;     /* the id of the tensor it starts with */
        uint64_t list_steps;    /* tensors JobTensors walked past or listed, in all (for the tests) */

        uint32_t *seg_sent;     /* per wire segment id: generation+1 already sent */
        uint32_t n_seg_sent;
        uint32_t seg_want[16];  /* wire ids the client asked for (GetSegments): sent first, then the rest */
        uint32_t n_seg_want;

        List outq;              /* OutPacket.link */
        unsigned n_outq;
        size_t outq_bytes;
        size_t outq_fds;        /* fds in them */
        uint64_t outq_file_bytes;       /* bytes of the files made for replies it may not have read yet */
        uint64_t seg_asked;     /* segments asked for again (GetSegments), bounded: each resend is an fd */
} Conn;

/*
 * conn_new() - a connection on the accepted socket @fd (consumed, also on
 * failure) from the peer @uid/@gid/@pid, watched for requests.
 */
int conn_new(Server *s, int fd, uid_t uid, gid_t gid, pid_t pid, Conn **ret);
/* Close at once: the request layer forgets it (ServerOps.conn_gone), then the socket goes. */
void conn_close(Conn *c);
/* Close @c once the current handler returns (safe from any callback). */
void conn_abort(Conn *c);
/* Read no more requests; write what is queued, then close. */
void conn_shutdown(Conn *c);

/*
 * conn_send_response() - pack and send @resp, or queue it when the socket
 * is full; @fds are borrowed (dup'ed into the queue).  A successful reply
 * on a job connection also carries the job's segments the client has not
 * been sent (Response.new_segments, their fds beside).  @close_after:
 * close once sent (protocol errors).
 */
int conn_send_response(Conn *c, Tier__Response *resp, const int *fds, size_t n_fds, bool close_after);
int conn_send_event(Conn *c, Tier__Event *ev);
/* Reply with an error and close the connection once it is sent. */
int conn_protocol_error(Conn *c, uint64_t seq, int status, const char *msg);
/*
 * conn_reply_error() - reply to request @seq with @status (-errno) and the
 * message @fmt formats, cut at CONN_ERROR_MAX - 1 bytes; the connection stays.
 */
#define CONN_ERROR_MAX 1024
int conn_reply_error(Conn *c, uint64_t seq, int status, const char *fmt, ...) _printf_(4, 5);

/* Was @c sent this generation of the segment known to clients as @wire_id? */
bool conn_segment_known(const Conn *c, uint32_t wire_id, uint32_t generation);
/* Forget that @c was sent segment @wire_id: the next reply sends it again. */
void conn_segment_forget(Conn *c, uint32_t wire_id);
/* Forget @wire_id, and send it before any other unsent segment in the next reply (GetSegments). */
void conn_segment_want(Conn *c, uint32_t wire_id);
/* Is the peer a member of group @gid (its primary group or a supplementary one, SO_PEERGROUPS)? */
bool conn_peer_in_group(const Conn *c, gid_t gid);
/*
 * The peer's supplementary groups, all of them (SO_PEERGROUPS): their
 * number, the list malloc'ed in *@ret (0 and nothing when the kernel keeps
 * none or cannot say), or -errno.
 */
int conn_peer_groups(const Conn *c, gid_t **ret);
