/* SPDX-License-Identifier: MIT */
/* config-fixture.h: parsing tierd.conf text in the config unit tests (test-config.c, test-config-syntax.c). */
#pragma once

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/base/config.h"
#include "proto/macro.h"

static inline void config_deinitp(Config *c) {
        config_deinit(c);
}
#define _cleanup_config_ _cleanup_(config_deinitp)

/* Parse @text as "test.conf" into @c (initialised by the caller) and expect success. */
static inline void parse_text_ok(Config *c, const char *text) {
        _cleanup_free_ char *error = NULL;
        int r;

        r = config_parse_text(c, text, "test.conf", &error);
        if (r < 0)
                fail_msg("unexpected error %d: %s", r, error ? error : "(none)");
        assert_null(error);
}

/* Parse @text and expect -EINVAL with a message containing every NULL-terminated needle. */
static inline void parse_fails(const char *text, ...) {
        _cleanup_config_ Config c;
        _cleanup_free_ char *error = NULL;
        const char *needle;
        va_list ap;

        config_init(&c);
        assert_int_equal(config_parse_text(&c, text, "test.conf", &error), -EINVAL);
        assert_non_null(error);

        va_start(ap, text);
        while ((needle = va_arg(ap, const char *)))
                if (!strstr(error, needle))
                        fail_msg("message '%s' lacks '%s'", error, needle);
        va_end(ap);
}
