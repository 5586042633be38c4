/* SPDX-License-Identifier: MIT */
/* jsonget.c: a JSON walker that finds one value by path and skips the rest. */

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "client/tierctl/jsonget.h"

#define MAX_DEPTH 64

static const char *ws(const char *p) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
                p++;
        return p;
}

/* Past the string starting at @p (at its '"'); NULL when unterminated. */
static const char *skip_string(const char *p) {
        for (p++; *p; p++) {
                if (*p == '\\') {
                        if (!*++p)
                                return NULL;
                } else if (*p == '"')
                        return p + 1;
        }
        return NULL;
}

/* Past the value at @p; NULL when malformed. */
static const char *skip_value(const char *p, unsigned depth) {
        p = ws(p);
        if (depth > MAX_DEPTH)
                return NULL;
        if (*p == '"')
                return skip_string(p);
        if (*p == '{' || *p == '[') {
                char close = *p == '{' ? '}' : ']';

                p = ws(p + 1);
                if (*p == close)
                        return p + 1;
                for (;;) {
                        if (close == '}') {
                                if (*p != '"' || !(p = skip_string(p)))
                                        return NULL;
                                p = ws(p);
                                if (*p++ != ':')
                                        return NULL;
                        }
                        if (!(p = skip_value(p, depth + 1)))
                                return NULL;
                        p = ws(p);
                        if (*p == close)
                                return p + 1;
                        if (*p++ != ',')
                                return NULL;
                        p = ws(p);
                }
        }
        if (!*p || strchr(",}]:", *p))
                return NULL;
        while (*p && !strchr(",}] \t\r\n", *p))
                p++;
        return p;
}

/* The value at @path (components separated by '.'), or NULL. */
static const char *find(const char *doc, const char *path, int *err) {
        const char *p = ws(doc);

        *err = -ENOENT;
        while (*path) {
                size_t n = strcspn(path, ".");

                if (*p == '{') {
                        bool found = false;

                        p = ws(p + 1);
                        while (*p != '}') {
                                const char *k = p, *e;

                                if (*p != '"' || !(e = skip_string(p)))
                                        goto bad;
                                p = ws(e);
                                if (*p++ != ':')
                                        goto bad;
                                p = ws(p);
                                if ((size_t) (e - k - 2) == n && !memcmp(k + 1, path, n)) {
                                        found = true;
                                        break;
                                }
                                if (!(p = skip_value(p, 1)))
                                        goto bad;
                                p = ws(p);
                                if (*p == ',')
                                        p = ws(p + 1);
                                else if (*p != '}')
                                        goto bad;
                        }
                        if (!found)
                                return NULL;
                } else if (*p == '[') {
                        char *end;
                        unsigned long i = strtoul(path, &end, 10);

                        if (end != path + n || n == 0)
                                return NULL;
                        p = ws(p + 1);
                        for (;; i--) {
                                if (*p == ']')
                                        return NULL;
                                if (i == 0)
                                        break;
                                if (!(p = skip_value(p, 1)))
                                        goto bad;
                                p = ws(p);
                                if (*p == ']')
                                        return NULL;    /* fewer elements */
                                if (*p++ != ',')
                                        goto bad;
                                p = ws(p);
                        }
                } else
                        return NULL;
                path += n;
                if (*path == '.')
                        path++;
        }
        return p;
bad:
        *err = -EINVAL;
        return NULL;
}

const char *jget_at(const char *doc, const char *path) {
        int err;

        return find(doc, path, &err);
}

const char *jget_next(const char *elem) {
        const char *p = skip_value(elem, 1);

        if (!p)
                return NULL;
        p = ws(p);
        return *p == ',' ? ws(p + 1) : NULL;
}

static bool is_digit(char c) {
        return c >= '0' && c <= '9';
}

/* Past the JSON number at @p (RFC 8259: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?), or NULL. */
static const char *number_end(const char *p) {
        if (*p == '-')
                p++;
        if (*p == '0')
                p++;
        else if (is_digit(*p))
                while (is_digit(*p))
                        p++;
        else
                return NULL;
        if (*p == '.') {
                if (!is_digit(*++p))
                        return NULL;
                while (is_digit(*p))
                        p++;
        }
        if (*p == 'e' || *p == 'E') {
                p++;
                if (*p == '+' || *p == '-')
                        p++;
                if (!is_digit(*p))
                        return NULL;
                while (is_digit(*p))
                        p++;
        }
        return p;
}

int jget_number(const char *doc, const char *path, double *ret) {
        int err;
        const char *p = find(doc, path, &err), *e;
        char *end;
        double v;

        if (!p)
                return err;
        if (!strncmp(p, "null", 4) && (!p[4] || strchr(",}] \t\r\n", p[4])))
                return -ENODATA;
        /* a JSON number and nothing else up to the next delimiter: no hexadecimal, "12abc", "1.", "+1" */
        e = number_end(p);
        if (!e || (*e && !strchr(",}] \t\r\n", *e)))
                return -EINVAL;
        errno = 0;
        v = strtod(p, &end);
        if (end != e || !isfinite(v))
                return -EINVAL;
        *ret = v;
        return 0;
}

int jget_bool(const char *doc, const char *path, int *ret) {
        int err;
        const char *p = find(doc, path, &err);

        if (!p)
                return err;
        if (!strncmp(p, "true", 4))
                *ret = 1;
        else if (!strncmp(p, "false", 5))
                *ret = 0;
        else
                return !strncmp(p, "null", 4) ? -ENODATA : -EINVAL;
        return 0;
}

int jget_length(const char *doc, const char *path, size_t *ret) {
        int err;
        const char *p = find(doc, path, &err);
        size_t n = 0;
        char close;

        if (!p)
                return err;
        if (*p != '[' && *p != '{')
                return !strncmp(p, "null", 4) ? -ENODATA : -EINVAL;
        close = *p == '{' ? '}' : ']';
        p = ws(p + 1);
        while (*p != close) {
                if (close == '}') {
                        if (*p != '"' || !(p = skip_string(p)))
                                return -EINVAL;
                        p = ws(p);
                        if (*p++ != ':')
                                return -EINVAL;
                }
                if (!(p = skip_value(p, 1)))
                        return -EINVAL;
                n++;
                p = ws(p);
                if (*p == ',')
                        p = ws(p + 1);
                else if (*p != close)
                        return -EINVAL;
        }
        *ret = n;
        return 0;
}

int jget_string(const char *doc, const char *path, char *buf, size_t size) {
        int err;
        const char *p = find(doc, path, &err), *e;
        size_t n = 0;

        if (!p)
                return err;
        if (*p != '"')
                return !strncmp(p, "null", 4) ? -ENODATA : -EINVAL;
        if (!(e = skip_string(p)))
                return -EINVAL;
        for (p++; p < e - 1; p++) {
                if (*p == '\\' && (p[1] == '"' || p[1] == '\\'))
                        p++;
                if (n + 1 >= size)
                        return -ENOSPC;
                buf[n++] = *p;
        }
        if (size == 0)
                return -ENOSPC;
        buf[n] = 0;
        return 0;
}
