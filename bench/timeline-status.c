/* SPDX-License-Identifier: MIT */
/* timeline-status.c: the link counters bench-timeline reads from tierd's status JSON, with jansson. */

/*
 * Theory of operation
 *
 * The runs measure what tierd moved from its status: tier_client_status() JSON,
 * whose keys are an interface (client/status.c documents them).  It is read
 * with a real parser and the counters are looked up by name, as the tests
 * do (tests/helpers/json.c), so that a new member, another order or a name
 * that looks like a key cannot fool the benchmark:
 *
 *   "links":   [{"name":"nvme->host","bytes":N,...}, ...]   one entry per link
 *   "targets": [{"path":...,"bytes_written":N,"bytes_read":N,...}, ...]
 *   "policy":  "timeline"
 *
 * This file is pure (no I/O, no logging): util/json.h, which bench/common.h
 * includes, names its writer's calls like jansson's, so the two cannot meet
 * in one file.  jansson is for the benchmark alone: tierd, libtier and
 * tierctl never link it.  jansson holds integers as long long: a counter is
 * far below 2^63.
 */

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "bench/timeline-status.h"

/* The non-negative integer member @key of @obj into *@ret; -EBADMSG if there is none. */
static int json_get_u64(const json_t *obj, const char *key, uint64_t *ret) {
        const json_t *v = json_object_get(obj, key);

        if (!json_is_integer(v) || json_integer_value(v) < 0)
                return -EBADMSG;
        *ret = (uint64_t) json_integer_value(v);
        return 0;
}

/* The "bytes" of the entry of @status's "links" array whose "name" is @name. */
static int link_bytes(const json_t *status, const char *name, uint64_t *ret) {
        json_t *l;
        size_t i;

        json_array_foreach(json_object_get(status, "links"), i, l) {
                const char *n = json_string_value(json_object_get(l, "name"));

                if (n && strcmp(n, name) == 0)
                        return json_get_u64(l, "bytes", ret);
        }
        return -EBADMSG;
}

int counters_parse(const char *text, Counters *ret, char *policy, size_t policy_size) {
        json_auto_t *status = NULL;
        Counters k = {};
        json_t *t;
        size_t i;

        status = json_loads(text, 0, NULL);
        if (!status)
                return -EBADMSG;
        if (link_bytes(status, "nvme->host", &k.nvme_read) < 0 || link_bytes(status, "host->nvme", &k.nvme_write) < 0 ||
            link_bytes(status, "host->vram", &k.to_vram) < 0 || link_bytes(status, "vram->host", &k.from_vram) < 0)
                return -EBADMSG;
        /* a target without its counters ends the sum, as one that tierd did not report */
        json_array_foreach(json_object_get(status, "targets"), i, t) {
                uint64_t w, rd;

                if (json_get_u64(t, "bytes_written", &w) < 0 || json_get_u64(t, "bytes_read", &rd) < 0)
                        break;
                k.target_written += w;
                k.target_read += rd;
        }
        if (policy && policy_size > 0) {
                const char *p = json_string_value(json_object_get(status, "policy"));

                (void) snprintf(policy, policy_size, "%s", p ? p : "");
        }
        *ret = k;
        return 0;
}
