/* SPDX-License-Identifier: MIT */
/* utf8.h: is a byte string well-formed UTF-8 (RFC 3629), for names tierd and libtier take. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * utf8_seq() - the well-formed UTF-8 sequence at @p, of at most @avail bytes:
 * its length in bytes, its code point in *@ret_cp; 0 where none starts there
 * (a continuation byte first, 0xc0/0xc1 (overlong), 0xf5.., a truncated
 * sequence, an overlong form, a surrogate U+D800..U+DFFF, above U+10FFFF).
 * For a NUL-terminated string @avail may be SIZE_MAX: a NUL is no
 * continuation byte, so the scan stops there.
 */
static inline size_t utf8_seq(const uint8_t *p, size_t avail, uint32_t *ret_cp) {
        uint8_t c = *p;
        uint32_t cp, min;
        size_t n;

        if (c < 0x80) {
                *ret_cp = c;
                return 1;
        }
        if (c >= 0xc2 && c <= 0xdf) {
                n = 1;
                cp = c & 0x1f;
                min = 0x80;
        } else if (c >= 0xe0 && c <= 0xef) {
                n = 2;
                cp = c & 0x0f;
                min = 0x800;
        } else if (c >= 0xf0 && c <= 0xf4) {
                n = 3;
                cp = c & 0x07;
                min = 0x10000;
        } else
                return 0;
        if (avail <= n)
                return 0;
        for (size_t i = 1; i <= n; i++) {
                if ((p[i] & 0xc0) != 0x80)
                        return 0;
                cp = cp << 6 | (p[i] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
                return 0;
        *ret_cp = cp;
        return n + 1;
}

/*
 * utf8_valid() - whether the @len bytes at @s are well-formed UTF-8 (each a
 * sequence utf8_seq() takes).  A NUL byte is valid UTF-8; callers that take
 * names refuse it (and other control characters, utf8_control()) themselves.
 */
static inline bool utf8_valid(const char *s, size_t len) {
        const uint8_t *p = (const uint8_t *) s, *end = p + len;

        while (p < end) {
                uint32_t cp;
                size_t n = utf8_seq(p, (size_t) (end - p), &cp);

                if (n == 0)
                        return false;
                p += n;
        }
        return true;
}

/*
 * utf8_control() - whether the NUL-terminated @s holds a control character,
 * Unicode's Cc: C0 (U+0001..U+001F), DEL (U+007F) or C1 (U+0080..U+009F, in
 * UTF-8 the bytes 0xc2 0x80..0xc2 0x9f).  Names of jobs and tensors hold none:
 * they are printed (tierctl status), and a terminal may obey a C1 control as
 * it does the C0 ones (U+009B is CSI, the start of an escape sequence).
 */
static inline bool utf8_control(const char *s) {
        for (const uint8_t *p = (const uint8_t *) s; *p; p++)
                if (*p < 0x20 || *p == 0x7f || (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f))
                        return true;
        return false;
}
