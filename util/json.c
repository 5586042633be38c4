/* SPDX-License-Identifier: MIT */
/* json.c: a JSON writer that always produces valid JSON, or says why not. */

/*
 * Theory of operation
 *
 * A JsonWriter appends to one malloc()ed buffer that doubles as it fills.
 * Callers write a document as a sequence of calls (begin, key, value, ...,
 * end) without checking each one: the first failure is latched in
 * w->error, every later call does nothing, and json_writer_finish() returns
 * it.  Failures are -ENOMEM (the buffer could not grow, or its size would
 * overflow), -ENOBUFS (containers nested deeper than JSON_DEPTH_MAX) and
 * -EINVAL (a call out of place: a value in an object without a key, a key
 * in an array, an end that does not match its begin, a second top-level
 * value, or finishing before the document is complete).  So a document
 * handed out by json_writer_finish() is always one complete JSON value.
 *
 * Layout: compact, no blanks or newlines.  The writer keeps, per open
 * container, whether it is an object and whether it has a member yet
 * (one bit each in two words, hence the depth limit), and puts the commas
 * and the colon after a key itself.
 *
 * Strings (values and keys alike) are taken as bytes and written as UTF-8:
 *
 *   - '"' and '\\' are escaped; \b \f \n \r \t use their short escapes, the
 *     other control characters are written \u00xx (lowercase hex): those
 *     below U+0020, which RFC 8259 requires, and DEL and the C1 controls
 *     U+0080..U+009F, which it allows, so that a document printed on a
 *     terminal carries none of them raw (U+009B is CSI, which starts an
 *     escape sequence).  So are the bidirectional format characters
 *     (U+061C, U+200E, U+200F, U+202A..U+202E, U+2066..U+2069: "\u202e"),
 *     which reorder the text printed after them (proto/utf8.h
 *     utf8_unsafe_cp(), the rule names follow).  Everything else from U+00A0
 *     up passes through as it is.
 *   - valid UTF-8 sequences are copied unchanged.
 *   - every byte that does not start a valid sequence is written as \ufffd
 *     (U+FFFD REPLACEMENT CHARACTER) and the scan goes on at the next byte:
 *     stray continuation bytes, 0xc0, 0xc1 and 0xf5..0xff, overlong forms,
 *     UTF-16 surrogates (U+D800..U+DFFF), code points above U+10FFFF and
 *     sequences cut short by the end of the string.  "\xe2\x82" (a truncated
 *     euro sign) thus becomes two U+FFFD.
 *
 * So any byte string, a job name from any client included, gives valid
 * JSON, and valid UTF-8 comes back byte for byte from any JSON parser.
 *
 * Numbers never depend on the locale: integers are written in decimal, and
 * printf's decimal point (which LC_NUMERIC may make a comma) is replaced by
 * '.'.  JSON has no NaN or infinity; non-finite doubles are written as null.
 *
 * No global state and no logging: libtier links this file statically.
 */

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/utf8.h"       /* (header only: utf8_seq(), utf8_unsafe_cp()) */
#include "util/json.h"

/* The first allocation: most of our documents are a few hundred bytes. */
#define JSON_BUFFER_MIN 256

static void writer_fail(JsonWriter *w, int error) {
        if (w->error == 0)
                w->error = error;
}

/* Make room for @n more bytes and the NUL; false (error latched) if there is none. */
static bool writer_reserve(JsonWriter *w, size_t n) {
        size_t need, allocated;
        char *b;

        if (w->error < 0)
                return false;
        if (n > SIZE_MAX - 1 - w->len) {
                writer_fail(w, -ENOMEM);
                return false;
        }
        need = w->len + n + 1;
        if (need <= w->allocated)
                return true;

        allocated = w->allocated > 0 ? w->allocated : JSON_BUFFER_MIN;
        while (allocated < need)
                allocated = allocated <= SIZE_MAX / 2 ? allocated * 2 : need;
        b = realloc(w->buf, allocated);
        if (!b) {
                writer_fail(w, -ENOMEM);
                return false;
        }
        w->buf = b;
        w->allocated = allocated;
        return true;
}

static void writer_append(JsonWriter *w, const char *p, size_t n) {
        if (!writer_reserve(w, n))
                return;
        memcpy(w->buf + w->len, p, n);
        w->len += n;
        w->buf[w->len] = '\0';
}

static void writer_puts(JsonWriter *w, const char *s) {
        writer_append(w, s, strlen(s));
}

static void writer_putc(JsonWriter *w, char c) {
        writer_append(w, &c, 1);
}

static uint64_t depth_bit(unsigned depth) {
        return UINT64_C(1) << (depth - 1);
}

static bool in_object(const JsonWriter *w) {
        return w->depth > 0 && (w->objects & depth_bit(w->depth));
}

/*
 * Called before every value: checks that a value may come here and writes
 * the comma that separates it from the one before.  False if it may not.
 */
static bool value_begin(JsonWriter *w) {
        if (w->error < 0)
                return false;

        if (w->depth == 0) {
                if (w->done) {
                        writer_fail(w, -EINVAL);
                        return false;
                }
                return true;
        }

        if (in_object(w)) {
                /* json_key() wrote the comma and the colon */
                if (!w->key) {
                        writer_fail(w, -EINVAL);
                        return false;
                }
                w->key = false;
                return true;
        }

        if (w->nonempty & depth_bit(w->depth))
                writer_putc(w, ',');
        w->nonempty |= depth_bit(w->depth);
        return w->error == 0;
}

/* Called after every complete value. */
static void value_end(JsonWriter *w) {
        if (w->depth == 0)
                w->done = true;
}

/* @n bytes at @s as a quoted, escaped JSON string. */
static void writer_string(JsonWriter *w, const char *s, size_t n) {
        const unsigned char *p = (const unsigned char *) s, *end = p + n;

        writer_putc(w, '"');
        while (p < end && w->error == 0) {
                const unsigned char *run = p;
                char esc[12];   /* \uXXXX: every code point escaped is below U+10000, but not to the compiler */

                /* copy the longest run that needs no escaping in one go */
                while (p < end && *p != '"' && *p != '\\') {
                        uint32_t cp;
                        size_t len = utf8_seq(p, (size_t) (end - p), &cp);

                        if (len == 0 || utf8_unsafe_cp(cp))
                                break;  /* (not UTF-8; controls and bidirectional format characters: escaped) */
                        p += len;
                }
                if (p > run)
                        writer_append(w, (const char *) run, (size_t) (p - run));
                if (p >= end)
                        break;

                switch (*p) {
                case '"':
                        writer_puts(w, "\\\"");
                        break;
                case '\\':
                        writer_puts(w, "\\\\");
                        break;
                case '\b':
                        writer_puts(w, "\\b");
                        break;
                case '\f':
                        writer_puts(w, "\\f");
                        break;
                case '\n':
                        writer_puts(w, "\\n");
                        break;
                case '\r':
                        writer_puts(w, "\\r");
                        break;
                case '\t':
                        writer_puts(w, "\\t");
                        break;
                default: {
                        uint32_t cp;
                        size_t len = utf8_seq(p, (size_t) (end - p), &cp);

                        if (len == 0)
                                writer_puts(w, "\\ufffd");      /* not valid UTF-8 */
                        else {
                                /* a control (C0, DEL, C1) or a bidirectional format character (U+202E) */
                                (void) snprintf(esc, sizeof(esc), "\\u%04x", (unsigned) cp);
                                writer_puts(w, esc);
                                p += len - 1;
                        }
                        break;
                }
                }
                p++;
        }
        writer_putc(w, '"');
}

/*
 * printf's number text with its decimal point made '.', whatever the locale:
 * %g and %f write only digits, '-', '+', 'e' and the radix string (one or
 * more bytes), so any run of other bytes is the radix.
 */
static void writer_number(JsonWriter *w, const char *s) {
        char out[512];
        size_t n = 0;

        for (; *s && n + 1 < sizeof(out); s++) {
                if ((*s >= '0' && *s <= '9') || *s == '-' || *s == '+' || *s == 'e')
                        out[n++] = *s;
                else if (n == 0 || out[n - 1] != '.')
                        out[n++] = '.';
        }
        writer_append(w, out, n);
}

/**
 * json_writer_init() - set up an empty writer.
 * @w: the writer; the same as initializing it with JSON_WRITER_NULL
 */
void json_writer_init(JsonWriter *w) {
        *w = (JsonWriter) JSON_WRITER_NULL;
}

/**
 * json_writer_deinit() - free what @w holds and make it empty again.
 * @w: the writer; may be half-written, failed, or already finished
 *
 * Usable as _cleanup_(json_writer_deinit).
 */
void json_writer_deinit(JsonWriter *w) {
        free(w->buf);
        json_writer_init(w);
}

/**
 * json_writer_finish() - hand the document over.
 * @w:       the writer
 * @ret:     the document, NUL-terminated and malloc()ed; the caller frees it
 * @ret_len: its length without the NUL; may be NULL
 *
 * On success the writer is empty again and can write a new document.
 *
 * Returns 0; or the first error of any earlier call (-ENOMEM, -ENOBUFS,
 * -EINVAL), or -EINVAL if the document is not complete (no value yet, a
 * container still open); the writer then still holds its buffer, for
 * json_writer_deinit().
 */
int json_writer_finish(JsonWriter *w, char **ret, size_t *ret_len) {
        if (w->error < 0)
                return w->error;
        if (!w->done || w->depth > 0 || !w->buf || !ret)
                return -EINVAL;

        if (ret_len)
                *ret_len = w->len;
        *ret = w->buf;
        w->buf = NULL;
        json_writer_deinit(w);
        return 0;
}

static void container_begin(JsonWriter *w, bool object) {
        if (!value_begin(w))
                return;
        if (w->depth >= JSON_DEPTH_MAX) {
                writer_fail(w, -ENOBUFS);
                return;
        }
        w->depth++;
        if (object)
                w->objects |= depth_bit(w->depth);
        else
                w->objects &= ~depth_bit(w->depth);
        w->nonempty &= ~depth_bit(w->depth);
        writer_putc(w, object ? '{' : '[');
}

static void container_end(JsonWriter *w, bool object) {
        if (w->error < 0)
                return;
        if (w->depth == 0 || in_object(w) != object || w->key) {
                writer_fail(w, -EINVAL);
                return;
        }
        writer_putc(w, object ? '}' : ']');
        w->depth--;
        value_end(w);
}

/**
 * json_object_begin() - open an object ('{'), as a value.
 * @w: the writer
 */
void json_object_begin(JsonWriter *w) {
        container_begin(w, true);
}

/**
 * json_object_end() - close the innermost container, which must be an object
 * whose last key has its value.
 * @w: the writer
 */
void json_object_end(JsonWriter *w) {
        container_end(w, true);
}

/**
 * json_array_begin() - open an array ('['), as a value.
 * @w: the writer
 */
void json_array_begin(JsonWriter *w) {
        container_begin(w, false);
}

/**
 * json_array_end() - close the innermost container, which must be an array.
 * @w: the writer
 */
void json_array_end(JsonWriter *w) {
        container_end(w, false);
}

/**
 * json_key() - write the key of the next member of the innermost object.
 * @w:   the writer
 * @key: escaped like json_string(); NULL is -EINVAL
 *
 * The next call must write the member's value.
 */
void json_key(JsonWriter *w, const char *key) {
        if (w->error < 0)
                return;
        if (!key || !in_object(w) || w->key) {
                writer_fail(w, -EINVAL);
                return;
        }
        if (w->nonempty & depth_bit(w->depth))
                writer_putc(w, ',');
        w->nonempty |= depth_bit(w->depth);
        writer_string(w, key, strlen(key));
        writer_putc(w, ':');
        w->key = true;
}

/**
 * json_string() - write a string value.
 * @w: the writer
 * @s: a NUL-terminated byte string, escaped and UTF-8-checked as described
 *     at the top of json.c; NULL writes null
 */
void json_string(JsonWriter *w, const char *s) {
        if (!s) {
                json_null(w);
                return;
        }
        json_stringn(w, s, strlen(s));
}

/**
 * json_stringn() - write the @n bytes at @s as a string value.
 * @w: the writer
 * @s: the bytes, NUL bytes included (written as \u0000); may be NULL if @n is 0
 * @n: their number
 */
void json_stringn(JsonWriter *w, const char *s, size_t n) {
        if (!value_begin(w))
                return;
        writer_string(w, s ? s : "", s ? n : 0);
        value_end(w);
}

/**
 * json_int() - write a signed integer value, in decimal.
 * @w: the writer
 * @v: the value; every int64_t is exact
 *
 * Parsers that read numbers as doubles (JavaScript) lose precision beyond
 * 2^53; JSON itself does not.
 */
void json_int(JsonWriter *w, int64_t v) {
        char buf[24];

        if (!value_begin(w))
                return;
        (void) snprintf(buf, sizeof(buf), "%" PRId64, v);
        writer_puts(w, buf);
        value_end(w);
}

/**
 * json_uint() - write an unsigned integer value, in decimal.
 * @w: the writer
 * @v: the value; every uint64_t is exact
 */
void json_uint(JsonWriter *w, uint64_t v) {
        char buf[24];

        if (!value_begin(w))
                return;
        (void) snprintf(buf, sizeof(buf), "%" PRIu64, v);
        writer_puts(w, buf);
        value_end(w);
}

/**
 * json_double() - write a measurement: 6 significant digits.
 * @w: the writer
 * @v: the value; NaN and infinities are written as null
 *
 * Writes what printf's "%.6g" writes, with '.' as the decimal point in any
 * locale: "0.5", "3.14159", "1e+06", "1.5e-07".  Meant for figures read by
 * people and scripts; exact quantities go through json_int() or json_uint().
 */
void json_double(JsonWriter *w, double v) {
        char buf[64];

        if (!isfinite(v)) {
                json_null(w);
                return;
        }
        if (!value_begin(w))
                return;
        (void) snprintf(buf, sizeof(buf), "%.6g", v);
        writer_number(w, buf);
        value_end(w);
}

/**
 * json_double_fixed() - write a value with at most @decimals decimals.
 * @w:        the writer
 * @v:        the value; NaN and infinities are written as null
 * @decimals: 0 .. JSON_DECIMALS_MAX (larger is taken as JSON_DECIMALS_MAX)
 *
 * Rounds to @decimals places and drops trailing zeros (and a bare decimal
 * point): with 3 decimals, 3723.25 is "3723.25", 2.0 is "2", 0.0004 is "0"
 * (never "-0").  No exponent, so large values are written in full.
 */
void json_double_fixed(JsonWriter *w, double v, unsigned decimals) {
        /* DBL_MAX has 309 integer digits; sign, point and decimals fit as well */
        char buf[400];
        char *int_end;

        if (!isfinite(v)) {
                json_null(w);
                return;
        }
        if (!value_begin(w))
                return;
        if (decimals > JSON_DECIMALS_MAX)
                decimals = JSON_DECIMALS_MAX;
        (void) snprintf(buf, sizeof(buf), "%.*f", (int) decimals, v);

        /* The radix (locale-dependent) is whatever follows the integer digits;
         * trailing zeros go, and the radix with them if no decimal is left. */
        int_end = buf + strspn(buf, "-0123456789");
        if (*int_end != '\0') {
                char *frac = int_end + strcspn(int_end, "0123456789");
                char *e = buf + strlen(buf);

                while (e > frac && e[-1] == '0')
                        e--;
                if (e == frac)
                        e = int_end;
                *e = '\0';
        }
        if (strcmp(buf, "-0") == 0)
                strcpy(buf, "0");
        writer_number(w, buf);
        value_end(w);
}

/**
 * json_bool() - write true or false.
 * @w: the writer
 * @v: the value
 */
void json_bool(JsonWriter *w, bool v) {
        if (!value_begin(w))
                return;
        writer_puts(w, v ? "true" : "false");
        value_end(w);
}

/**
 * json_null() - write null.
 * @w: the writer
 */
void json_null(JsonWriter *w) {
        if (!value_begin(w))
                return;
        writer_puts(w, "null");
        value_end(w);
}
