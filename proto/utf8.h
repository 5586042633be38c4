/* SPDX-License-Identifier: MIT */
/* utf8.h: is a byte string well-formed UTF-8 (RFC 3629), and the characters names hold: for tierd, libtier, util. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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
 * names refuse it (and other control characters, utf8_name_flaw()) themselves.
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
 * utf8_control_cp() - whether @cp is a control character, Unicode's Cc: C0
 * (U+0000..U+001F), DEL (U+007F) or C1 (U+0080..U+009F).  A terminal obeys
 * C1 controls as it does the C0 ones (U+009B is CSI, the start of an escape
 * sequence).
 */
static inline bool utf8_control_cp(uint32_t cp) {
        return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f);
}

/*
 * utf8_bidi_cp() - whether @cp is one of Unicode's Bidi_Control characters,
 * the bidirectional format characters: ALM U+061C, LRM and RLM U+200E and
 * U+200F, the embeddings and overrides U+202A..U+202E (LRE, RLE, PDF, LRO,
 * RLO) and the isolates U+2066..U+2069 (LRI, RLI, FSI, PDI).  Printed, they
 * reorder the text after them ("Trojan Source", CVE-2021-42574): a job named
 * "abc<U+202E>gpj.exe" reads "abcexe.jpg", and one in a table row can make
 * the row read as another job's.
 */
static inline bool utf8_bidi_cp(uint32_t cp) {
        return cp == 0x061c || cp == 0x200e || cp == 0x200f || (cp >= 0x202a && cp <= 0x202e) ||
               (cp >= 0x2066 && cp <= 0x2069);
}

/*
 * utf8_unsafe_cp() - whether @cp is a character no job or tensor name holds
 * and printed text escapes (util/escape.c, util/json.c): a control character
 * or a bidirectional format character.  The one rule for both.
 */
static inline bool utf8_unsafe_cp(uint32_t cp) {
        return utf8_control_cp(cp) || utf8_bidi_cp(cp);
}

/* The most bytes utf8_name_flaw() writes, its NUL included. */
#define UTF8_NAME_FLAW_MAX 64

/*
 * utf8_name_flaw() - why the @len bytes at @s (NUL-terminated) are no job or
 * tensor name for the characters they hold, into @buf; NULL: none.  Names
 * are printed (tierctl status, the log, metrics), so they hold no control
 * character ("contains control characters", said first), no bidirectional
 * format character ("contains the bidirectional format character U+202E",
 * the first one) and are UTF-8 ("is not valid UTF-8").  Their length and
 * emptiness are the caller's to judge.
 */
static inline const char *utf8_name_flaw(const char *s, size_t len, char buf[UTF8_NAME_FLAW_MAX]) {
        const uint8_t *p = (const uint8_t *) s, *end = p + len;
        uint32_t bidi = 0;
        bool valid = true;

        while (p < end) {
                uint32_t cp;
                size_t n = utf8_seq(p, (size_t) (end - p), &cp);

                if (n == 0) {
                        valid = false;
                        p++;
                        continue;
                }
                if (utf8_control_cp(cp)) {
                        (void) snprintf(buf, UTF8_NAME_FLAW_MAX, "contains control characters");
                        return buf;
                }
                if (bidi == 0 && utf8_bidi_cp(cp))
                        bidi = cp;
                p += n;
        }
        if (bidi != 0)
                (void) snprintf(buf, UTF8_NAME_FLAW_MAX, "contains the bidirectional format character U+%04X",
                                (unsigned) bidi);
        else if (!valid)
                (void) snprintf(buf, UTF8_NAME_FLAW_MAX, "is not valid UTF-8");
        else
                return NULL;
        return buf;
}
