/* SPDX-License-Identifier: MIT */
/* server.h: the listening socket, accepting connections (SO_PEERCRED), the set of connections. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "util/list.h"

typedef struct Config Config;
typedef struct Conn Conn;
typedef struct Server Server;
typedef struct Tier__Request Tier__Request;
typedef struct sd_event sd_event;
typedef struct sd_event_source sd_event_source;

/*
 * What the server hands to the request layer (rpc.c registers these), so
 * that framing and connections never call up into message semantics.
 */
typedef struct ServerOps {
        /* One decoded request of @c.  < 0: close the connection. */
        int (*dispatch)(void *userdata, Conn *c, Tier__Request *req);
        /* @c is closing: release everything it holds (its socket is still open). */
        void (*conn_gone)(void *userdata, Conn *c);
        /*
         * Does @c hold what its client may still be writing through (a pin that
         * may write, a request in the engine, a phase of its plan)?  A stop
         * leaves such a connection open until it lets go (server_reap()).
         */
        bool (*holds)(void *userdata, const Conn *c);
} ServerOps;

struct Server {
        sd_event *event;
        const Config *config;   /* borrowed: limits read at each use */
        const ServerOps *ops;
        void *userdata;
        int listen_fd;
        sd_event_source *listen_source;
        sd_event_source *accept_retry;  /* out of fds (EMFILE): accepting again in a moment, not in a busy loop */
        char *bound_path;       /* unlinked on exit when we bound it */
        List conns;             /* Conn.link */
        bool stopping;          /* server_stop() ran */
        bool out_of_fds;        /* the last accept() found no fd (said once until one is accepted) */
        unsigned n_conns;
        uint64_t next_conn_id;
        /*
         * One receive buffer of [limits] max_message bytes for every connection:
         * a packet is read and decoded (protobuf-c copies what it keeps) before
         * the next read, so none needs its own (64 KiB each, by default, which
         * with connection churn left the heap fragmented and its RSS growing).
         */
        uint8_t *rbuf;
        size_t rbuf_size;
};

int server_new(sd_event *event, const Config *config, const ServerOps *ops, void *userdata, Server **ret);
/* Closes every connection (ServerOps.conn_gone runs for each). */
Server *server_free(Server *s);
/*
 * server_listen() - serve on an inherited socket (@inherited_fd >= 0,
 * consumed) or bind @path (a stale socket there is removed only when no
 * daemon answers on it; -EEXIST if something not a socket is there).
 */
int server_listen(Server *s, int inherited_fd, const char *path);
/*
 * server_check_listen() - the checks of server_listen() that need no
 * Server, for a start to run before it makes anything: an inherited socket
 * (not consumed) is SOCK_SEQPACKET; at @path no other daemon answers and
 * nothing but a socket lies (a stale socket is removed).  0 or -errno,
 * logged.
 */
int server_check_listen(int inherited_fd, const char *path);
unsigned server_n_conns(const Server *s);
/* Connections of @uid past their Hello, @except not counted. */
unsigned server_count_uid(const Server *s, uid_t uid, const Conn *except);
/*
 * server_stop() - accept no more connections; send Event.shutdown(@reason)
 * to every client, then let each read what is queued for it and close it:
 * at once where it holds nothing (ServerOps.holds), else once it lets go
 * (server_reap()), so that what it writes through its pins is in memory
 * before the stop writes it down.
 */
void server_stop(Server *s, const char *reason);
/* While stopping: close the connections that hold nothing any more. */
void server_reap(Server *s);
/*
 * server_reap() of one connection: after each request it dispatches while
 * stopping (conn.c), so that a client that has just let go has the
 * connection closed before any request it sends next is read.
 */
void server_reap_conn(Server *s, Conn *c);
