/* SPDX-License-Identifier: MIT */
/* status.h: the daemon's state as a StatusReply message (tierctl status). */
#pragma once

typedef struct Manager Manager;
typedef struct Tier__StatusReply Tier__StatusReply;

int status_build(Manager *m, Tier__StatusReply **ret);
void status_free(Tier__StatusReply *sr);
