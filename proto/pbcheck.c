/* SPDX-License-Identifier: MIT */
/* pbcheck.c: refuse a protobuf message whose string fields are not text. */

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "proto/pbcheck.h"
#include "proto/utf8.h"

#define PB_DEPTH_MAX 32

/* A varint at *p (< end): false when it runs past @end or past 10 bytes. */
static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *ret) {
        uint64_t v = 0;

        for (unsigned shift = 0; shift < 70; shift += 7) {
                uint8_t b;

                if (*p >= end)
                        return false;
                b = *(*p)++;
                v |= (uint64_t) (b & 0x7f) << shift;
                if (!(b & 0x80)) {
                        *ret = v;
                        return true;
                }
        }
        return false;
}

static int check(const ProtobufCMessageDescriptor *desc, const uint8_t *p, const uint8_t *end, unsigned depth,
                 char *why, size_t why_size) {
        if (depth > PB_DEPTH_MAX) {
                if (why)
                        (void) snprintf(why, why_size, "messages nested deeper than %d", PB_DEPTH_MAX);
                return -EBADMSG;
        }
        while (p < end) {
                uint64_t key, n;
                const ProtobufCFieldDescriptor *f;

                if (!read_varint(&p, end, &key))
                        return 0;
                switch (key & 7) {
                case 0:
                        if (!read_varint(&p, end, &n))
                                return 0;
                        continue;
                case 1:
                        if (end - p < 8)
                                return 0;
                        p += 8;
                        continue;
                case 5:
                        if (end - p < 4)
                                return 0;
                        p += 4;
                        continue;
                case 2:
                        break;
                default:
                        return 0;       /* groups, or not protobuf: the unpacker refuses it */
                }
                if (!read_varint(&p, end, &n) || n > (uint64_t) (end - p))
                        return 0;
                f = key >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(desc, (unsigned) (key >> 3)) : NULL;
                if (f && f->type == PROTOBUF_C_TYPE_STRING) {
                        const char *what = memchr(p, '\0', n) ? "contains a NUL byte" :
                                           !utf8_valid((const char *) p, n) ? "is not valid UTF-8" : NULL;

                        if (what) {
                                if (why)
                                        (void) snprintf(why, why_size, "%s.%s %s", desc->short_name, f->name, what);
                                return -EINVAL;
                        }
                } else if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
                        int r = check(f->descriptor, p, p + n, depth + 1, why, why_size);

                        if (r < 0)
                                return r;
                }
                p += n;
        }
        return 0;
}

int pb_check_strings(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len, char *why,
                     size_t why_size) {
        if (why && why_size)
                why[0] = '\0';
        return check(desc, buf, buf + len, 0, why, why_size);
}
