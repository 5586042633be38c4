/* SPDX-License-Identifier: MIT */
/* metrics.h: the daemon's status in the Prometheus text exposition format. */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef struct Conn Conn;
typedef struct Rpc Rpc;
typedef struct Tier__StatusReply Tier__StatusReply;

/*
 * metrics_render() - @sr as Prometheus text (exposition format 0.0.4), a
 * pure function of the message: malloc()ed, NUL-terminated, ends with a
 * newline; its length in *@ret_len.
 */
int metrics_render(const Tier__StatusReply *sr, char **ret, size_t *ret_len);

/* status_build() of @r, rendered. */
int metrics_build(const Rpc *r, char **ret, size_t *ret_len);

/*
 * metrics_reply() - answer request @seq of @c (StatusRequest.prometheus)
 * with the text: inline (Response.metrics_text), or as a sealed memfd
 * (Response.metrics_fd) when it is too large for one packet.  Returns what
 * sending returned.
 */
int metrics_reply(const Rpc *r, Conn *c, uint64_t seq);
