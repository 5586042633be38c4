/* SPDX-License-Identifier: MIT */
/* json.c: read tierd's JSON status (tierctl --json status, tier_client_status()) with jansson. */

/*
 * The status JSON is an interface (client/status.c documents it): tests
 * read it with a real parser and look members up by name, so that a new
 * member, another order or a job whose name looks like a key cannot fool
 * them.  Only the tests link jansson; tierd, libtier and tierctl do not.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/macro.h"
#include "tests/helpers/harness.h"
#include "tests/helpers/json.h"

json_t *test_json_parse(const char *text) {
        json_error_t e;
        json_t *j;

        if (!text)
                return NULL;
        j = json_loads(text, 0, &e);
        if (!j)
                fprintf(stderr, "not JSON (line %d, column %d: %s):\n%s\n", e.line, e.column, e.text, text);
        return j;
}

json_t *test_daemon_status(const TestDaemon *d) {
        _cleanup_free_ char *text = test_daemon_tierctl_json(d);

        return test_json_parse(text);
}

json_t *test_json_job(const json_t *status, const char *name) {
        json_t *job;
        size_t i;

        json_array_foreach(json_object_get(status, "jobs"), i, job) {
                const char *n = json_string_value(json_object_get(job, "name"));

                if (n && strcmp(n, name) == 0)
                        return job;
        }
        return NULL;
}

/* The integer member @key of @obj, or -1. */
static long long get_int(const json_t *obj, const char *key) {
        const json_t *v = json_object_get(obj, key);

        return json_is_integer(v) ? (long long) json_integer_value(v) : -1;
}

long long test_json_job_tier(const json_t *status, const char *job, const char *tier, const char *field) {
        const json_t *j = test_json_job(status, job);

        return j ? get_int(json_object_get(json_object_get(j, "usage"), tier), field) : -1;
}

long long test_json_tier(const json_t *status, const char *tier, const char *field) {
        json_t *t;
        size_t i;

        json_array_foreach(json_object_get(status, "tiers"), i, t) {
                const char *name = json_string_value(json_object_get(t, "tier"));

                if (name && strcmp(name, tier) == 0)
                        return get_int(t, field);
        }
        return -1;
}

unsigned long long test_json_sum(const json_t *json, const char *key) {
        unsigned long long sum = 0;
        const char *k;
        json_t *v;
        size_t i;

        if (json_is_object(json))
                json_object_foreach((json_t *) json, k, v) {
                        if (strcmp(k, key) == 0 && json_is_integer(v))
                                sum += (unsigned long long) json_integer_value(v);
                        else
                                sum += test_json_sum(v, key);
                }
        else if (json_is_array(json))
                json_array_foreach(json, i, v)
                        sum += test_json_sum(v, key);
        return sum;
}
