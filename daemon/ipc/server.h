/* SPDX-License-Identifier: MIT */
/* server.h: the listening socket, connections, SO_PEERCRED, packet I/O. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <systemd/sd-event.h>

#include "daemon/base/list.h"

typedef struct Manager Manager;
typedef struct Job Job;
typedef struct Tensor Tensor;
typedef struct Server Server;
typedef struct Tier__Response Tier__Response;

typedef struct PinRec {
        Tensor *tensor;
        int tier;
} PinRec;

typedef struct OutPacket {
        List link;
        size_t len;
        int fds[16];
        size_t n_fds;
        bool close_after;
        uint8_t data[];
} OutPacket;

typedef struct Conn {
        Server *server;
        Manager *manager;
        List link;              /* Server.conns */
        int fd;
        sd_event_source *io;
        uid_t uid;
        gid_t gid;
        pid_t pid;
        uint64_t id;
        bool hello_done;
        bool closing;           /* flush the queue, then close */

        Job *job;               /* NULL for a control connection */
        List job_link;          /* Job.conns */
        unsigned fence_slot;
        int efd;                /* wakeup eventfd, shared with the client */
        uint64_t next_fence;
        uint64_t fence_done;
        uint64_t *fence_completed;      /* completed fences above fence_done */
        size_t n_fence_completed;

        List pending;           /* Pending.link: requests still in the op engine */
        unsigned inflight;

        struct Plan *plan;      /* iteration plan of this rank, or NULL */
        bool broken;            /* lost an event it must see: closed at the next chance */
        sd_event_source *abort_source;

        PinRec *pins;
        size_t n_pins, cap_pins;

        uint32_t *seg_sent;     /* per wire segment id: generation+1 already sent */
        uint32_t n_seg_sent;

        List outq;              /* OutPacket.link */
        unsigned n_outq;
        size_t outq_bytes;
        uint8_t *rbuf;
        size_t rbuf_size;
} Conn;

int server_new(Manager *m, Server **ret);
Server *server_free(Server *s);
/* Listen on an inherited socket (consumed) or bind @path. */
int server_listen(Server *s, int inherited_fd, const char *path);
unsigned server_n_conns(const Server *s);
/* Tell every client the daemon is going away (Event.shutdown). */
void server_broadcast_shutdown(Server *s, const char *reason);
List *server_conns(Server *s);

/*
 * conn_send_response() - pack and queue @resp; @fds are borrowed (dup'ed
 * into the queue when the socket is full).  Attaches segments the client
 * has not seen yet.  @close_after: close once sent (protocol errors).
 */
int conn_send_response(Conn *c, Tier__Response *resp, const int *fds, size_t n_fds, bool close_after);
void conn_close(Conn *c);
/* Close @c once the current handler returns (safe from any callback). */
void conn_abort(Conn *c);
typedef struct Tier__Event Tier__Event;
int conn_send_event(Conn *c, Tier__Event *ev);
