/* SPDX-License-Identifier: MIT */
/* pbcheck.h: refuse a protobuf message whose string fields are not text. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>

/*
 * pb_check_strings() - walk the @len encoded bytes at @buf as a message of
 * @desc and check every string field, in nested messages too: a NUL byte
 * or bytes that are not UTF-8 make it -EINVAL, with @why (may be NULL) set
 * to "Create.name contains a NUL byte" or "... is not valid UTF-8".
 * protobuf-c hands a string field out as a C string, so without this
 * check "bad\0name" would reach tierd as "bad".  Encodings this walk cannot
 * follow (a truncated field, a group) are left to the unpacker, which
 * refuses them: 0 then, as for a message that passes.  Nesting deeper than
 * 32 messages is -EBADMSG.
 */
int pb_check_strings(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len, char *why,
                     size_t why_size);
