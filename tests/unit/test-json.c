/* SPDX-License-Identifier: MIT */
/* test-json.c: util/json.h: escaping, UTF-8 repair, numbers, structure, errors. */

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "proto/macro.h"
#include "proto/utf8.h"
#include "util/escape.h"
#include "util/json.h"

/* The document @w holds, which must be complete; the caller frees it. */
static char *finish(JsonWriter *w) {
        char *text = NULL;
        size_t len = 0;

        assert_int_equal(json_writer_finish(w, &text, &len), 0);
        assert_non_null(text);
        assert_int_equal(len, strlen(text));
        return text;
}

/* @n bytes at @s as a JSON string value equal @want. */
static void assert_stringn(const char *s, size_t n, const char *want) {
        _cleanup_(json_writer_deinit) JsonWriter w = JSON_WRITER_NULL;
        _cleanup_free_ char *text = NULL;

        json_stringn(&w, s, n);
        text = finish(&w);
        assert_string_equal(text, want);
}

static void assert_string(const char *s, const char *want) {
        assert_stringn(s, strlen(s), want);
}

/* ---- strings ------------------------------------------------------------------------ */

static void test_escape_controls(void **state) {
        static const char *const want[0x20] = {
                "\\u0000", "\\u0001", "\\u0002", "\\u0003", "\\u0004", "\\u0005", "\\u0006", "\\u0007",
                "\\b",     "\\t",     "\\n",     "\\u000b", "\\f",     "\\r",     "\\u000e", "\\u000f",
                "\\u0010", "\\u0011", "\\u0012", "\\u0013", "\\u0014", "\\u0015", "\\u0016", "\\u0017",
                "\\u0018", "\\u0019", "\\u001a", "\\u001b", "\\u001c", "\\u001d", "\\u001e", "\\u001f",
        };

        for (unsigned c = 0; c < 0x20; c++) {
                char in[3] = { 'a', (char) c, 'z' }, out[16];

                (void) snprintf(out, sizeof(out), "\"a%sz\"", want[c]);
                assert_stringn(in, sizeof(in), out);
        }

        /* all of them in one string, NUL included */
        {
                char in[0x20], out[0x20 * 6 + 3];
                size_t n = 0;

                out[n++] = '"';
                for (unsigned c = 0; c < 0x20; c++) {
                        in[c] = (char) c;
                        memcpy(out + n, want[c], strlen(want[c]));
                        n += strlen(want[c]);
                }
                out[n++] = '"';
                out[n] = 0;
                assert_stringn(in, sizeof(in), out);
        }
}

static void test_escape_quotes(void **state) {
        assert_string("", "\"\"");
        assert_string("plain text", "\"plain text\"");
        assert_string("\"", "\"\\\"\"");
        assert_string("\\", "\"\\\\\"");
        assert_string("a\"b\\c\"", "\"a\\\"b\\\\c\\\"\"");
        assert_string("\\u0041", "\"\\\\u0041\"");
        /* not escaped: '/', the rest of printable ASCII */
        assert_string("a/b~ !#", "\"a/b~ !#\"");
}

/*
 * Every control character is escaped, DEL and the C1 controls (U+0080..U+009F)
 * included, though RFC 8259 would allow them raw: a document printed on a
 * terminal carries none (U+009B is CSI).  A parser gets the exact string back.
 */
static void test_escape_del_c1(void **state) {
        assert_string("a\x7f" "b", "\"a\\u007fb\"");
        assert_string("\xc2\x80", "\"\\u0080\"");
        assert_string("evil\xc2\x9b" "31mRED", "\"evil\\u009b31mRED\"");
        assert_string("\xc2\x9f\xc2\xa0", "\"\\u009f\xc2\xa0\"");   /* U+00A0 is no control */
        assert_string("\x1b[31m", "\"\\u001b[31m\"");
        /* a lone 0xc2 is not C1: it is no UTF-8 at all */
        assert_string("\xc2" "a", "\"\\ufffda\"");
}

/*
 * The bidirectional format characters (Unicode's Bidi_Control: U+061C,
 * U+200E, U+200F, U+202A..U+202E, U+2066..U+2069) are escaped as the controls
 * are, in JSON and in text output (util/escape.c): printed raw, a job named
 * "abc<U+202E>gpj.exe" reads "abcexe.jpg" (they were copied as they are).
 * Their neighbours (U+061B, ZWJ U+200D, U+2010, U+202F, U+2065, U+206A) are text.
 */
static void test_escape_bidi(void **state) {
        static const struct {
                const char *raw, *esc;
        } bidi[] = {
                { "\xd8\x9c", "\\u061c" },      { "\xe2\x80\x8e", "\\u200e" }, { "\xe2\x80\x8f", "\\u200f" },
                { "\xe2\x80\xaa", "\\u202a" }, { "\xe2\x80\xab", "\\u202b" }, { "\xe2\x80\xac", "\\u202c" },
                { "\xe2\x80\xad", "\\u202d" }, { "\xe2\x80\xae", "\\u202e" }, { "\xe2\x81\xa6", "\\u2066" },
                { "\xe2\x81\xa7", "\\u2067" }, { "\xe2\x81\xa8", "\\u2068" }, { "\xe2\x81\xa9", "\\u2069" },
        };
        static const char *const text[] = {
                "\xd8\x9b", "\xe2\x80\x8d", "\xe2\x80\x90", "\xe2\x80\xaf", "\xe2\x81\xa5", "\xe2\x81\xaa",
        };
        char in[32], want[32], buf[32];

        for (size_t i = 0; i < ELEMENTSOF(bidi); i++) {
                (void) snprintf(in, sizeof(in), "a%sb", bidi[i].raw);
                (void) snprintf(want, sizeof(want), "\"a%sb\"", bidi[i].esc);
                assert_string(in, want);
                (void) snprintf(want, sizeof(want), "a%sb", bidi[i].esc);
                assert_string_equal(text_escape(buf, sizeof(buf), in), want);
                assert_true(text_needs_escape(in));
                assert_int_equal(text_escape_len(in), 8);
                assert_int_equal(text_escape_width(in), 8);
        }
        for (size_t i = 0; i < ELEMENTSOF(text); i++) {
                (void) snprintf(in, sizeof(in), "a%sb", text[i]);
                (void) snprintf(want, sizeof(want), "\"a%sb\"", text[i]);
                assert_string(in, want);
                assert_string_equal(text_escape(buf, sizeof(buf), in), in);
                assert_false(text_needs_escape(in));
        }
        assert_string("abc\xe2\x80\xae" "gpj.exe", "\"abc\\u202egpj.exe\"");
        assert_string_equal(text_escape(buf, sizeof(buf), "abc\xe2\x80\xae" "gpj.exe"), "abc\\u202egpj.exe");
        /* cut short: never inside the escape */
        assert_string_equal(text_escape(buf, 7, "ab\xe2\x80\xae"), "ab");
}

/*
 * utf8_name_flaw(), the one rule of names (tierd, libtier, tierctl): controls
 * said first, then the first bidirectional format character by its code
 * point, then bytes that are not UTF-8.
 */
static void test_name_flaw(void **state) {
        static const struct {
                const char *name, *why;
        } cases[] = {
                { "job-1 caf\xc3\xa9 \xe5\xad\xa6", NULL },
                { "a\xe2\x80\x8d" "b\xe2\x81\xaa", NULL },                     /* ZWJ, U+206A: text */
                { "a\tb", "contains control characters" },
                { "evil\xc2\x9b" "31m", "contains control characters" },
                { "abc\xe2\x80\xae" "gpj.exe", "contains the bidirectional format character U+202E" },
                { "\xd8\x9c" "a\xe2\x80\xae", "contains the bidirectional format character U+061C" },
                { "a\xe2\x81\xa9", "contains the bidirectional format character U+2069" },
                { "\xff\xe2\x80\x8f", "contains the bidirectional format character U+200F" },
                { "\xe2\x80\xae\x7f", "contains control characters" },
                { "a\xff", "is not valid UTF-8" },
                { "a\xe2\x80", "is not valid UTF-8" },
        };
        char buf[UTF8_NAME_FLAW_MAX];

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                const char *why = utf8_name_flaw(cases[i].name, strlen(cases[i].name), buf);

                if (cases[i].why)
                        assert_string_equal(why, cases[i].why);
                else
                        assert_null(why);
        }
}

/*
 * util/escape.c, for text output: controls (C0, DEL, C1) as \u00xx, bytes
 * not UTF-8 as \xNN, valid non-ASCII text as it is; a short buffer cuts
 * between escapes and characters, never inside one.
 */
static void test_text_escape(void **state) {
        static const struct {
                const char *in, *out;
        } cases[] = {
                { "", "" },
                { "plain job-1 a\\b", "plain job-1 a\\b" },
                { "evil\xc2\x9b" "31mRED", "evil\\u009b31mRED" },
                { "\x1b[2J\x07\x7f\t\n", "\\u001b[2J\\u0007\\u007f\\u0009\\u000a" },
                { "\xc2\x80\xc2\x9f\xc2\xa0", "\\u0080\\u009f\xc2\xa0" },
                { "caf\xc3\xa9 \xe5\xad\xa6 \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe5\xad\xa6 \xf0\x9f\x98\x80" },
                { "a\xff\xc2" "b\xe2\x82", "a\\xff\\xc2" "b\\xe2\\x82" },
                { "\xed\xa0\x80", "\\xed\\xa0\\x80" },         /* a surrogate */
        };
        char buf[64];
        char *dup;

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                assert_string_equal(text_escape(buf, sizeof(buf), cases[i].in), cases[i].out);
                dup = text_escape_dup(cases[i].in);
                assert_non_null(dup);
                assert_string_equal(dup, cases[i].out);
                free(dup);
                assert_int_equal(text_needs_escape(cases[i].in), strcmp(cases[i].in, cases[i].out) != 0);
                assert_int_equal(text_escape_len(cases[i].in), strlen(cases[i].out));
        }
        /* cut short: whole escapes and characters only */
        assert_string_equal(text_escape(buf, 6, "ab\xc2\x9b"), "ab");
        assert_string_equal(text_escape(buf, 9, "ab\xc2\x9b"), "ab\\u009b");
        assert_string_equal(text_escape(buf, 4, "a\xf0\x9f\x98\x80"), "a");
        assert_string_equal(text_escape(buf, 1, "abc"), "");
}

/*
 * text_escape_width(): the columns of the escaped text on a terminal, not its
 * bytes (nor its characters: CJK and emoji take 2, a combining mark 0);
 * text_escape_fputs() pads to that.
 */
static void test_text_escape_width(void **state) {
        char *out = NULL;
        size_t size = 0;
        FILE *f;

        assert_int_equal(text_escape_width(""), 0);
        assert_int_equal(text_escape_width("abcd"), 4);
        assert_int_equal(text_escape_width("caf\xc3\xa9"), 4);                   /* é: 2 bytes, 1 column */
        assert_int_equal(text_escape_width("\xe5\xad\xa6\xe7\xbf\x92"), 4);  /* CJK: 2 per character */
        assert_int_equal(text_escape_width("\xf0\x9f\x98\x80!"), 3);           /* U+1F600 emoji: 2 */
        assert_int_equal(text_escape_width("\xef\xbc\xa1"), 2);                 /* U+FF21 fullwidth A */
        assert_int_equal(text_escape_width("e\xcc\x81"), 1);                    /* e + U+0301 combining */
        assert_int_equal(text_escape_width("\xea\xb0\x80\xe2\x80\x8d"), 2);  /* Hangul syllable, ZWJ 0 */
        assert_int_equal(text_escape_width("\xe2\x94\x80\xc2\xa0"), 2);       /* box drawing, NBSP: 1 */
        assert_int_equal(text_escape_width("a\xc2\x9b" "b"), 8);                 /* a\u009bb */
        assert_int_equal(text_escape_width("a\xff"), 5);                         /* a\xff */
        f = open_memstream(&out, &size);
        assert_non_null(f);
        text_escape_fputs("caf\xc3\xa9", f, 6);
        fputc('|', f);
        text_escape_fputs("\x1b", f, 8);
        fputc('|', f);
        text_escape_fputs("toolong", f, 2);
        assert_int_equal(fclose(f), 0);
        assert_string_equal(out, "caf\xc3\xa9  |\\u001b  |toolong");
        free(out);
}

/* Valid UTF-8 passes through byte for byte, at the edges of each length. */
static void test_utf8_valid(void **state) {
        static const char *const valid[] = {
                "\xc2\xa0",             /* U+00A0, the smallest 2-byte one not a C1 control */
                "\xc3\xa9",             /* é */
                "\xdf\xbf",             /* U+07FF */
                "\xe0\xa0\x80",         /* U+0800, smallest 3-byte */
                "\xe2\x82\xac",         /* € */
                "\xed\x9f\xbf",         /* U+D7FF, just below the surrogates */
                "\xee\x80\x80",         /* U+E000, just above them */
                "\xef\xbf\xbd",         /* U+FFFD itself */
                "\xef\xbf\xbf",         /* U+FFFF */
                "\xf0\x90\x80\x80",     /* U+10000, smallest 4-byte */
                "\xf0\x9f\x98\x80",     /* 😀 */
                "\xf4\x8f\xbf\xbf",     /* U+10FFFF, the last code point */
                "job-\xe5\xad\xa6\xe7\xbf\x92-\xce\xb1\xce\xb2",
        };

        for (size_t i = 0; i < ELEMENTSOF(valid); i++) {
                char want[64];

                (void) snprintf(want, sizeof(want), "\"%s\"", valid[i]);
                assert_string(valid[i], want);
        }
}

/* Every byte that does not start a valid sequence becomes one U+FFFD. */
static void test_utf8_invalid(void **state) {
        static const struct {
                const char *in, *out;
        } cases[] = {
                /* stray continuation bytes */
                { "\x80", "\\ufffd" },
                { "\xbf", "\\ufffd" },
                { "a\x80\x80z", "a\\ufffd\\ufffdz" },
                /* bytes that never occur in UTF-8 */
                { "\xc0", "\\ufffd" },
                { "\xc1", "\\ufffd" },
                { "\xf5", "\\ufffd" },
                { "\xfe", "\\ufffd" },
                { "\xff", "\\ufffd" },
                /* overlong forms */
                { "\xc0\xaf", "\\ufffd\\ufffd" },                       /* '/' in 2 bytes */
                { "\xc1\xbf", "\\ufffd\\ufffd" },
                { "\xe0\x80\xaf", "\\ufffd\\ufffd\\ufffd" },            /* '/' in 3 */
                { "\xe0\x9f\xbf", "\\ufffd\\ufffd\\ufffd" },            /* U+07FF in 3 */
                { "\xf0\x80\x80\xaf", "\\ufffd\\ufffd\\ufffd\\ufffd" }, /* '/' in 4 */
                { "\xf0\x8f\xbf\xbf", "\\ufffd\\ufffd\\ufffd\\ufffd" }, /* U+FFFF in 4 */
                /* UTF-16 surrogates */
                { "\xed\xa0\x80", "\\ufffd\\ufffd\\ufffd" },            /* U+D800 */
                { "\xed\xbf\xbf", "\\ufffd\\ufffd\\ufffd" },            /* U+DFFF */
                { "\xed\xa0\xbd\xed\xb8\x80", "\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd" }, /* a CESU-8 pair */
                /* beyond U+10FFFF */
                { "\xf4\x90\x80\x80", "\\ufffd\\ufffd\\ufffd\\ufffd" }, /* U+110000 */
                { "\xf7\xbf\xbf\xbf", "\\ufffd\\ufffd\\ufffd\\ufffd" },
                /* truncated: at the end, before ASCII, before another lead byte, before a quote */
                { "\xe2\x82", "\\ufffd\\ufffd" },
                { "\xf0\x9f\x98", "\\ufffd\\ufffd\\ufffd" },
                { "\xc3", "\\ufffd" },
                { "\xe2\x82z", "\\ufffd\\ufffdz" },
                { "\xe2\xc3\xa9", "\\ufffd\xc3\xa9" },
                { "\xc3\"", "\\ufffd\\\"" },
                /* the test string of test-client.c */
                { "\x80|\xe2\x82|\xc0\xaf|\xed\xa0\x80|\xff",
                  "\\ufffd|\\ufffd\\ufffd|\\ufffd\\ufffd|\\ufffd\\ufffd\\ufffd|\\ufffd" },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                char want[128];

                (void) snprintf(want, sizeof(want), "\"%s\"", cases[i].out);
                assert_string(cases[i].in, want);
        }

        /* cut short by a NUL inside a counted string */
        assert_stringn("\xe2\x00\x82", 3, "\"\\ufffd\\u0000\\ufffd\"");
        /* cut short by the count, though the bytes after it would complete it */
        assert_stringn("\xe2\x82\xac", 2, "\"\\ufffd\\ufffd\"");
}

static void test_string_null_and_keys(void **state) {
        _cleanup_(json_writer_deinit) JsonWriter w = JSON_WRITER_NULL;
        _cleanup_free_ char *text = NULL;

        json_object_begin(&w);
        json_key(&w, "null");
        json_string(&w, NULL);
        json_key(&w, "ke\"y\n\xff");
        json_stringn(&w, NULL, 0);
        json_object_end(&w);
        text = finish(&w);
        assert_string_equal(text, "{\"null\":null,\"ke\\\"y\\n\\ufffd\":\"\"}");
}

/* A long string: the buffer grows past its first size many times over. */
static void test_string_long(void **state) {
        _cleanup_(json_writer_deinit) JsonWriter w = JSON_WRITER_NULL;
        _cleanup_free_ char *in = NULL, *text = NULL;
        size_t n = 1 << 20;

        in = malloc(n + 1);
        assert_non_null(in);
        for (size_t i = 0; i < n; i++)
                in[i] = i % 1000 == 999 ? '\n' : 'a' + (char) (i % 26);
        in[n] = 0;
        json_string(&w, in);
        text = finish(&w);
        assert_int_equal(strlen(text), n + n / 1000 + 2);
        assert_int_equal(text[0], '"');
        assert_memory_equal(text + 1, in, 999);
        assert_memory_equal(text + 1000, "\\n", 2);
}

/* ---- numbers ---------------------------------------------------------------------------- */

/* What @write writes through the JsonWriter *w it is given equals @want. */
#define assert_value(write, want)                                                       \
        do {                                                                            \
                _cleanup_(json_writer_deinit) JsonWriter _w = JSON_WRITER_NULL;         \
                _cleanup_free_ char *_t = NULL;                                         \
                JsonWriter *w = &_w;                                                    \
                                                                                        \
                write;                                                                  \
                _t = finish(w);                                                         \
                assert_string_equal(_t, want);                                          \
        } while (0)

static void test_integers(void **state) {
        assert_value(json_uint(w, 0), "0");
        assert_value(json_uint(w, 42), "42");
        assert_value(json_uint(w, UINT64_MAX), "18446744073709551615");
        assert_value(json_int(w, 0), "0");
        assert_value(json_int(w, -1), "-1");
        assert_value(json_int(w, INT64_MAX), "9223372036854775807");
        assert_value(json_int(w, INT64_MIN), "-9223372036854775808");
}

static void test_doubles(void **state) {
        assert_value(json_double(w, 0), "0");
        assert_value(json_double(w, 0.5), "0.5");
        assert_value(json_double(w, -2.25), "-2.25");
        assert_value(json_double(w, 3.14159265), "3.14159");
        assert_value(json_double(w, 1e6), "1e+06");
        assert_value(json_double(w, 123456.0), "123456");
        assert_value(json_double(w, 1.5e-7), "1.5e-07");
        assert_value(json_double(w, NAN), "null");
        assert_value(json_double(w, INFINITY), "null");
        assert_value(json_double(w, -INFINITY), "null");

        assert_value(json_double_fixed(w, 0, 3), "0");
        assert_value(json_double_fixed(w, 3723.25, 3), "3723.25");
        assert_value(json_double_fixed(w, 12.5, 3), "12.5");
        assert_value(json_double_fixed(w, 2.0, 3), "2");
        assert_value(json_double_fixed(w, 0.0004, 3), "0");
        assert_value(json_double_fixed(w, -0.0004, 3), "0");
        assert_value(json_double_fixed(w, 0.0006, 3), "0.001");
        assert_value(json_double_fixed(w, -1.5, 3), "-1.5");
        assert_value(json_double_fixed(w, 100.0, 3), "100");
        assert_value(json_double_fixed(w, 1e20, 3), "100000000000000000000");
        assert_value(json_double_fixed(w, 2.7, 0), "3");
        assert_value(json_double_fixed(w, 0.1, 30), "0.10000000000000001");
        assert_value(json_double_fixed(w, -1.7976931348623157e308, 3), "-1797693134862315708145274237317043567980"
                     "705675258449965989174768031572607800285387605895586327668781715404589535143824642343213"
                     "268894641827684675467035375169860499105765512820762454900903893289440758685084551339423"
                     "045832369032229481658085593321233482747978262041447231687381771809192998812504040261841"
                     "24858368");
        assert_value(json_double_fixed(w, NAN, 3), "null");
        assert_value(json_double_fixed(w, -INFINITY, 3), "null");
}

/* Decimal points stay '.', whatever LC_NUMERIC says (where such a locale is installed). */
static void test_doubles_locale(void **state) {
        static const char *const locales[] = { "de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8" };
        const char *used = NULL;

        for (size_t i = 0; i < ELEMENTSOF(locales) && !used; i++)
                if (setlocale(LC_NUMERIC, locales[i]))
                        used = locales[i];
        if (!used)
                skip();
        assert_value(json_double(w, 0.5), "0.5");
        assert_value(json_double_fixed(w, 3723.25, 3), "3723.25");
        assert_value(json_double_fixed(w, 2.0, 3), "2");
        (void) setlocale(LC_NUMERIC, "C");
}

static void test_literals(void **state) {
        assert_value(json_bool(w, true), "true");
        assert_value(json_bool(w, false), "false");
        assert_value(json_null(w), "null");
        assert_value(json_string(w, "x"), "\"x\"");
        assert_value((json_object_begin(w), json_object_end(w)), "{}");
        assert_value((json_array_begin(w), json_array_end(w)), "[]");
}

/* ---- structure -------------------------------------------------------------------------- */

static void test_nested(void **state) {
        _cleanup_(json_writer_deinit) JsonWriter w = JSON_WRITER_NULL;
        _cleanup_free_ char *text = NULL;

        json_object_begin(&w);
        json_key(&w, "a");
        json_array_begin(&w);
        json_uint(&w, 1);
        json_object_begin(&w);
        json_key(&w, "b");
        json_array_begin(&w);
        json_array_end(&w);
        json_key(&w, "c");
        json_null(&w);
        json_object_end(&w);
        json_array_begin(&w);
        json_array_end(&w);
        json_string(&w, "s");
        json_array_end(&w);
        json_key(&w, "d");
        json_object_begin(&w);
        json_object_end(&w);
        json_key(&w, "e");
        json_array_begin(&w);
        json_array_begin(&w);
        json_array_begin(&w);
        json_bool(&w, false);
        json_array_end(&w);
        json_array_end(&w);
        json_double(&w, 0.25);
        json_array_end(&w);
        json_object_end(&w);
        text = finish(&w);
        assert_string_equal(text, "{\"a\":[1,{\"b\":[],\"c\":null},[],\"s\"],\"d\":{},\"e\":[[[false]],0.25]}");
}

/* Nesting up to JSON_DEPTH_MAX works, one more is -ENOBUFS. */
static void test_depth(void **state) {
        _cleanup_(json_writer_deinit) JsonWriter w = JSON_WRITER_NULL;
        _cleanup_free_ char *text = NULL;
        char *p;

        for (unsigned i = 0; i < JSON_DEPTH_MAX; i++) {
                if (i % 2) {
                        json_object_begin(&w);
                        json_key(&w, "k");
                } else
                        json_array_begin(&w);
        }
        json_uint(&w, 7);
        for (unsigned i = JSON_DEPTH_MAX; i > 0; i--) {
                if ((i - 1) % 2)
                        json_object_end(&w);
                else
                        json_array_end(&w);
        }
        text = finish(&w);
        p = strstr(text, "7");
        assert_non_null(p);
        assert_int_equal(strlen(p + 1), JSON_DEPTH_MAX);

        for (unsigned i = 0; i <= JSON_DEPTH_MAX; i++)
                json_array_begin(&w);
        assert_int_equal(json_writer_finish(&w, &p, NULL), -ENOBUFS);
}

static void test_misuse(void **state) {
        static const struct {
                const char *what;
                int error;
        } want[] = {
                { "nothing written", -EINVAL },
                { "value in an object without a key", -EINVAL },
                { "key in an array", -EINVAL },
                { "key at the top", -EINVAL },
                { "two keys in a row", -EINVAL },
                { "key without a value", -EINVAL },
                { "end of array closing an object", -EINVAL },
                { "end of object closing an array", -EINVAL },
                { "end with nothing open", -EINVAL },
                { "container left open", -EINVAL },
                { "two top-level values", -EINVAL },
                { "NULL key", -EINVAL },
        };

        for (size_t i = 0; i < ELEMENTSOF(want); i++) {
                _cleanup_(json_writer_deinit) JsonWriter w = JSON_WRITER_NULL;
                char *text = NULL;

                switch (i) {
                case 0:
                        break;
                case 1:
                        json_object_begin(&w);
                        json_uint(&w, 1);
                        json_object_end(&w);
                        break;
                case 2:
                        json_array_begin(&w);
                        json_key(&w, "k");
                        json_uint(&w, 1);
                        json_array_end(&w);
                        break;
                case 3:
                        json_key(&w, "k");
                        json_uint(&w, 1);
                        break;
                case 4:
                        json_object_begin(&w);
                        json_key(&w, "a");
                        json_key(&w, "b");
                        json_uint(&w, 1);
                        json_object_end(&w);
                        break;
                case 5:
                        json_object_begin(&w);
                        json_key(&w, "a");
                        json_object_end(&w);
                        break;
                case 6:
                        json_object_begin(&w);
                        json_array_end(&w);
                        break;
                case 7:
                        json_array_begin(&w);
                        json_object_end(&w);
                        break;
                case 8:
                        json_array_end(&w);
                        break;
                case 9:
                        json_object_begin(&w);
                        json_key(&w, "a");
                        json_array_begin(&w);
                        json_array_end(&w);
                        break;
                case 10:
                        json_uint(&w, 1);
                        json_uint(&w, 2);
                        break;
                case 11:
                        json_object_begin(&w);
                        json_key(&w, NULL);
                        json_uint(&w, 1);
                        json_object_end(&w);
                        break;
                }
                if (json_writer_finish(&w, &text, NULL) != want[i].error)
                        fail_msg("%s: not %d", want[i].what, want[i].error);
                assert_null(text);
        }
}

/* The first error sticks; later calls change nothing; finishing resets the writer. */
static void test_error_latch(void **state) {
        _cleanup_(json_writer_deinit) JsonWriter w = JSON_WRITER_NULL;
        _cleanup_free_ char *text = NULL, *again = NULL;
        size_t len;

        json_array_begin(&w);
        json_uint(&w, 1);
        json_key(&w, "k");              /* -EINVAL */
        len = w.len;
        json_uint(&w, 2);
        json_array_end(&w);
        json_array_end(&w);
        assert_int_equal(w.len, len);
        assert_int_equal(json_writer_finish(&w, &text, NULL), -EINVAL);
        assert_int_equal(json_writer_finish(&w, &text, NULL), -EINVAL);
        assert_null(text);

        json_writer_deinit(&w);
        json_uint(&w, 5);
        text = finish(&w);
        assert_string_equal(text, "5");

        /* finish left it empty: a second document */
        assert_null(w.buf);
        json_writer_init(&w);
        json_string(&w, "again");
        again = finish(&w);
        assert_string_equal(again, "\"again\"");
}

/* ---- against a real parser ------------------------------------------------------------- */

/* Python's json module accepts the document; every string in it is valid Unicode. */
static void test_python_parses(void **state) {
        static const char python[] = "/usr/bin/python3";
        _cleanup_(json_writer_deinit) JsonWriter w = JSON_WRITER_NULL;
        _cleanup_free_ char *text = NULL;
        uint64_t x = UINT64_C(0x2545f4914f6cdd1d);
        char cmd[512];
        FILE *f;
        int status;

        if (access(python, X_OK) < 0)
                skip();

        /* 2000 strings of random bytes (all 256 values, NUL included), as keys and as values */
        json_object_begin(&w);
        for (unsigned i = 0; i < 2000; i++) {
                unsigned char s[64];
                size_t n;
                char key[80];

                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                n = x % sizeof(s);
                for (size_t k = 0; k < n; k++) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        /* favour bytes that make multi-byte sequences, valid or not */
                        s[k] = (unsigned char) (x % 3 == 0 ? 0x80 | (x >> 8) : x >> 16);
                }
                (void) snprintf(key, sizeof(key), "%u-%.*s", i, (int) (n < 8 ? n : 8), (const char *) s);
                json_key(&w, key);
                json_array_begin(&w);
                json_stringn(&w, (const char *) s, n);
                json_int(&w, -(int64_t) i);
                json_double(&w, (double) i / 7);
                json_double_fixed(&w, (double) i / 7, 3);
                json_bool(&w, i % 2);
                json_null(&w);
                json_array_end(&w);
        }
        json_object_end(&w);
        text = finish(&w);

        (void) snprintf(cmd, sizeof(cmd),
                        "%s -c 'import json,sys\n"
                        "d = json.load(sys.stdin)\n"
                        "assert len(d) == 2000\n"
                        "for k, v in d.items():\n"
                        "    k.encode(\"utf-8\"); v[0].encode(\"utf-8\")\n"
                        "    assert v[5] is None\n'", python);
        f = popen(cmd, "w");
        assert_non_null(f);
        assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
        status = pclose(f);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_escape_controls),
                cmocka_unit_test(test_escape_quotes),
                cmocka_unit_test(test_escape_del_c1),
                cmocka_unit_test(test_escape_bidi),
                cmocka_unit_test(test_name_flaw),
                cmocka_unit_test(test_text_escape),
                cmocka_unit_test(test_text_escape_width),
                cmocka_unit_test(test_utf8_valid),
                cmocka_unit_test(test_utf8_invalid),
                cmocka_unit_test(test_string_null_and_keys),
                cmocka_unit_test(test_string_long),
                cmocka_unit_test(test_integers),
                cmocka_unit_test(test_doubles),
                cmocka_unit_test(test_doubles_locale),
                cmocka_unit_test(test_literals),
                cmocka_unit_test(test_nested),
                cmocka_unit_test(test_depth),
                cmocka_unit_test(test_misuse),
                cmocka_unit_test(test_error_latch),
                cmocka_unit_test(test_python_parses),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
