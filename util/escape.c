/* SPDX-License-Identifier: MIT */
/* escape.c: client-supplied text made safe to print (see escape.h). */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/utf8.h"       /* (header only: utf8_seq(), utf8_unsafe_cp()) */
#include "util/escape.h"
#include "util/width.h"

size_t text_escape_char(const char *s, char out[TEXT_ESCAPE_CHAR_MAX], size_t *ret_in, size_t *ret_width) {
        const uint8_t *p = (const uint8_t *) s;
        uint32_t cp = 0;
        size_t n = utf8_seq(p, SIZE_MAX, &cp), len;

        if (n == 0) {
                *ret_in = 1;
                len = (size_t) snprintf(out, TEXT_ESCAPE_CHAR_MAX, "\\x%02x", *p);
        } else if (utf8_unsafe_cp(cp)) {
                *ret_in = n;
                len = (size_t) snprintf(out, TEXT_ESCAPE_CHAR_MAX, "\\u%04x", (unsigned) cp);
        } else {
                *ret_in = n;
                memcpy(out, p, n);
                if (ret_width)
                        *ret_width = text_char_width(cp);       /* CJK and emoji 2, combining marks 0 */
                return n;
        }
        if (ret_width)
                *ret_width = len;               /* an escape is ASCII */
        return len;
}

static size_t escape_one(const uint8_t *p, char *out, size_t *ret_in) {
        return text_escape_char((const char *) p, out, ret_in, NULL);
}

char *text_escape(char *buf, size_t size, const char *s) {
        const uint8_t *p = (const uint8_t *) s;
        size_t used = 0;

        while (*p) {
                char one[TEXT_ESCAPE_CHAR_MAX];
                size_t in, len = escape_one(p, one, &in);

                if (len >= size - used)
                        break;
                memcpy(buf + used, one, len);
                used += len;
                p += in;
        }
        buf[used] = '\0';
        return buf;
}

char *text_escape_dup(const char *s) {
        size_t len = strlen(s);
        char *buf;

        if (len > (SIZE_MAX - 1) / TEXT_ESCAPE_GROWTH)
                return NULL;
        buf = malloc(len * TEXT_ESCAPE_GROWTH + 1);
        return buf ? text_escape(buf, len * TEXT_ESCAPE_GROWTH + 1, s) : NULL;
}

size_t text_escape_len(const char *s) {
        size_t n = 0;

        for (const uint8_t *p = (const uint8_t *) s; *p;) {
                char one[TEXT_ESCAPE_CHAR_MAX];
                size_t in;

                n += escape_one(p, one, &in);
                p += in;
        }
        return n;
}

size_t text_escape_width(const char *s) {
        size_t n = 0;

        for (const char *p = s; *p;) {
                char one[TEXT_ESCAPE_CHAR_MAX];
                size_t in, width;

                (void) text_escape_char(p, one, &in, &width);
                n += width;
                p += in;
        }
        return n;
}

void text_escape_fputs(const char *s, FILE *f, size_t pad) {
        size_t n = 0;

        for (const char *p = s; *p;) {
                char one[TEXT_ESCAPE_CHAR_MAX];
                size_t in, width, len = text_escape_char(p, one, &in, &width);

                (void) fwrite(one, 1, len, f);
                n += width;
                p += in;
        }
        for (; n < pad; n++)
                (void) fputc(' ', f);
}

bool text_needs_escape(const char *s) {
        for (const uint8_t *p = (const uint8_t *) s; *p;) {
                uint32_t cp = 0;
                size_t n = utf8_seq(p, SIZE_MAX, &cp);

                if (n == 0 || utf8_unsafe_cp(cp))
                        return true;
                p += n;
        }
        return false;
}

char *text_escape_name(const char *s, size_t max, bool tagged) {
        uint32_t h = 0x811c9dc5;        /* FNV-1a */
        char *e;

        if (max < 16)
                return NULL;
        if (!tagged && text_escape_len(s) <= max)
                return text_escape_dup(s);
        for (const uint8_t *p = (const uint8_t *) s; *p; p++)
                h = (h ^ *p) * 0x01000193;
        e = malloc(max + 1);
        if (!e)
                return NULL;
        text_escape(e, max - TEXT_ESCAPE_NAME_TAG + 1, s);
        (void) snprintf(e + strlen(e), TEXT_ESCAPE_NAME_TAG + 1, "~%08x", (unsigned) h);
        return e;
}
