/* SPDX-License-Identifier: MIT */
/* size.c: parse and format byte counts. */

/*
 * Theory of operation
 *
 * One syntax for every size tierd and its tools read (size.h spells it out):
 * decimal digits and an optional binary unit, nothing else.  Before this
 * file there were four parsers that disagreed on case and suffixes; the
 * syntax here is their union minus what was ambiguous (a lowercase "b" is
 * bits to many readers, so it is refused rather than guessed).
 *
 * Two ways back to text:
 *
 *   size_format()        for people: binary units with one decimal, rounded to
 *                        the nearest tenth ("1.5 KiB").  The rounding is done on
 *                        integers, so there is no locale decimal point and no
 *                        double-rounding; a value that rounds up to 1024.0 of a
 *                        unit is written as 1.0 of the next one.
 *   size_format_exact()  for tierd.conf and messages about it: the largest unit
 *                        that divides the value exactly ("64M"), else bytes.
 *                        size_parse() reads it back to the same value.
 *
 * Pure functions: no allocation, no global state, nothing logged.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>

#include "util/size.h"

/* Units in order of their power of 1024, starting at 1024^1. */
static const char unit_letters[] = "KMGTPE";
static const char *const unit_names[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };

/* The power of 1024 that @c names (1..6), or 0. */
static unsigned unit_power(char c) {
        if (c >= 'a' && c <= 'z')
                c = (char) (c - 'a' + 'A');
        for (unsigned i = 0; unit_letters[i]; i++)
                if (c == unit_letters[i])
                        return i + 1;
        return 0;
}

/**
 * size_parse() - read a size in the syntax of size.h.
 * @s:   the text; NULL is -EINVAL
 * @ret: the value in bytes, written only on success
 *
 * Returns 0, -EINVAL if @s is not in the syntax, -ERANGE if the value does
 * not fit in 64 bits.
 */
int size_parse(const char *s, uint64_t *ret) {
        const char *p = s;
        unsigned power;
        uint64_t v = 0;
        bool overflow = false;

        if (!s || !ret)
                return -EINVAL;
        if (*p < '0' || *p > '9')
                return -EINVAL;
        for (; *p >= '0' && *p <= '9'; p++) {
                unsigned d = (unsigned) (*p - '0');

                /* keep scanning: "99999999999999999999X" is a syntax error, not a range error */
                if (v > (UINT64_MAX - d) / 10)
                        overflow = true;
                else
                        v = v * 10 + d;
        }

        power = unit_power(*p);
        if (power > 0) {
                p++;
                if (p[0] == 'i' && p[1] == 'B')
                        p += 2;
                else if (p[0] == 'B')
                        p++;
        } else if (*p == 'B')
                p++;
        if (*p != '\0')
                return -EINVAL;

        if (overflow || (power > 0 && v > (UINT64_MAX >> (10 * power))))
                return -ERANGE;
        *ret = v << (10 * power);
        return 0;
}

/**
 * size_format() - a byte count for people, in binary units.
 * @buf:   at least SIZE_FORMAT_MAX bytes (shorter buffers get a truncated string)
 * @size:  size of @buf
 * @bytes: the value
 *
 * Writes "0 B" .. "1023 B" exactly, then one decimal of the largest unit that
 * keeps the value at or above 1.0: "1.0 KiB", "1.5 KiB", "512.0 MiB",
 * "16.0 EiB".  Rounds to the nearest tenth, halves up, and carries into the
 * next unit (1048575 is "1.0 MiB", never "1024.0 KiB").
 *
 * Returns @buf.
 */
char *size_format(char *buf, size_t size, uint64_t bytes) {
        uint64_t d = 1, whole, tenths;
        unsigned i = 0;

        while (i + 1 < sizeof(unit_names) / sizeof(unit_names[0]) && bytes / d >= 1024) {
                d *= 1024;
                i++;
        }
        if (i == 0) {
                (void) snprintf(buf, size, "%" PRIu64 " B", bytes);
                return buf;
        }

        /* remainder * 10 < 10 * 2^60 fits in 64 bits */
        whole = bytes / d;
        tenths = ((bytes % d) * 10 + d / 2) / d;
        if (tenths >= 10) {
                whole++;
                tenths = 0;
        }
        if (whole >= 1024 && i + 1 < sizeof(unit_names) / sizeof(unit_names[0])) {
                /* 1023.95 and more of a unit: that is 1.0 of the next one */
                whole /= 1024;
                i++;
        }
        (void) snprintf(buf, size, "%" PRIu64 ".%" PRIu64 " %s", whole, tenths, unit_names[i]);
        return buf;
}

/**
 * size_format_exact() - a byte count as tierd.conf writes it.
 * @buf:   at least SIZE_FORMAT_MAX bytes (shorter buffers get a truncated string)
 * @size:  size of @buf
 * @bytes: the value
 *
 * Writes the value in the largest unit that divides it exactly ("64M",
 * "3G", "8E"), else in bytes ("0", "1000", "1536").  size_parse() of the
 * result gives @bytes back.
 *
 * Returns @buf.
 */
char *size_format_exact(char *buf, size_t size, uint64_t bytes) {
        for (unsigned power = sizeof(unit_letters) - 1; power > 0; power--) {
                unsigned shift = 10 * power;

                if (bytes != 0 && (bytes & ((UINT64_C(1) << shift) - 1)) == 0) {
                        (void) snprintf(buf, size, "%" PRIu64 "%c", bytes >> shift, unit_letters[power - 1]);
                        return buf;
                }
        }
        (void) snprintf(buf, size, "%" PRIu64, bytes);
        return buf;
}
