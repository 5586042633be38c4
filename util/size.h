/* SPDX-License-Identifier: MIT */
/* size.h: byte counts as people and tierd.conf write them. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/*
 * The one size syntax of tierd.conf, tierctl, the benchmarks and the examples:
 *
 *     SIZE   = DIGITS [ UNIT [ "B" | "iB" ] | "B" ]
 *     DIGITS = one or more of 0-9
 *     UNIT   = K | M | G | T | P | E, either case, for 1024^1 .. 1024^6
 *
 * so "4096", "4096B", "64K", "64k", "64KB", "64KiB", "1G", "1GiB" and "2t" are
 * accepted, and "1G" == "1GB" == "1GiB" == 1073741824 (a "B" after a unit never
 * means a power of 1000).  Refused (-EINVAL): the empty string, a sign, blanks
 * anywhere, a fraction ("1.5G"), a base prefix, a lowercase "b" ("1Gb" reads as
 * bits), "iB" without a unit ("4iB"), and anything after the suffix.  Values
 * that do not fit in 64 bits (digits or digits times unit) are -ERANGE.  "0" is
 * accepted: callers that need a positive size check that themselves.
 */

/* Room for what size_format() and size_format_exact() write, NUL included
 * ("18446744073709551615 B" is 23 bytes). */
#define SIZE_FORMAT_MAX 32

int size_parse(const char *s, uint64_t *ret);

char *size_format(char *buf, size_t size, uint64_t bytes);
char *size_format_exact(char *buf, size_t size, uint64_t bytes);

/* Format into a buffer that lives until the end of the enclosing block, e.g. as a printf() argument. */
#define FORMAT_SIZE(bytes) size_format((char[SIZE_FORMAT_MAX]) {}, SIZE_FORMAT_MAX, (bytes))
#define FORMAT_SIZE_EXACT(bytes) size_format_exact((char[SIZE_FORMAT_MAX]) {}, SIZE_FORMAT_MAX, (bytes))
