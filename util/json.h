/* SPDX-License-Identifier: MIT */
/* json.h: write one JSON document into a growing buffer. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Usage:
 *
 *         _cleanup_(json_writer_deinit) JsonWriter w = JSON_WRITER_NULL;
 *         _cleanup_free_ char *text = NULL;
 *
 *         json_object_begin(&w);
 *         json_key(&w, "name");
 *         json_string(&w, name);          (any bytes: invalid UTF-8 becomes U+FFFD)
 *         json_key(&w, "sizes");
 *         json_array_begin(&w);
 *         json_uint(&w, 1);
 *         json_uint(&w, 2);
 *         json_array_end(&w);
 *         json_object_end(&w);
 *         r = json_writer_finish(&w, &text, NULL);        (the first error, if any)
 *
 * gives {"name":"...","sizes":[1,2]}: no blanks, commas and colons placed by
 * the writer.  Calls after an error do nothing; json_writer_finish() reports
 * the first one.  See json.c for the exact output.
 */

/* Containers nested deeper than this are -ENOBUFS. */
#define JSON_DEPTH_MAX 64

/* Most decimals json_double_fixed() writes: beyond 17 a double has no more digits to give. */
#define JSON_DECIMALS_MAX 17

typedef struct JsonWriter {
        char *buf;              /* malloc()ed, NUL-terminated; NULL until the first byte */
        size_t len;             /* bytes in @buf, NUL not counted */
        size_t allocated;
        int error;              /* the first error, latched */
        unsigned depth;         /* open containers */
        uint64_t objects;       /* bit d: the container at depth d + 1 is an object (else an array) */
        uint64_t nonempty;      /* bit d: the container at depth d + 1 has a member already */
        bool key;               /* a key was written; its value comes next */
        bool done;              /* the top-level value is complete */
} JsonWriter;

#define JSON_WRITER_NULL {}

void json_writer_init(JsonWriter *w);
void json_writer_deinit(JsonWriter *w);
int json_writer_finish(JsonWriter *w, char **ret, size_t *ret_len);

void json_object_begin(JsonWriter *w);
void json_object_end(JsonWriter *w);
void json_array_begin(JsonWriter *w);
void json_array_end(JsonWriter *w);
void json_key(JsonWriter *w, const char *key);

void json_string(JsonWriter *w, const char *s);
void json_stringn(JsonWriter *w, const char *s, size_t n);
void json_int(JsonWriter *w, int64_t v);
void json_uint(JsonWriter *w, uint64_t v);
void json_double(JsonWriter *w, double v);
void json_double_fixed(JsonWriter *w, double v, unsigned decimals);
void json_bool(JsonWriter *w, bool v);
void json_null(JsonWriter *w);
