/* SPDX-License-Identifier: MIT */
/* instrumented.h: whether a test runs under ASan or valgrind, for the few that cannot (or need not) there. */
#pragma once

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Under valgrind: its preload library is mapped into the process. */
static inline bool test_under_valgrind(void) {
        FILE *f = fopen("/proc/self/maps", "re");
        char line[512];
        bool vg = false;

        if (!f)
                return false;
        while (fgets(line, sizeof(line), f))
                vg = vg || strstr(line, "vgpreload") != NULL;
        fclose(f);
        return vg;
}

/* Built with AddressSanitizer. */
static inline bool test_under_asan(void) {
#if defined(__SANITIZE_ADDRESS__)
        return true;
#else
        return false;
#endif
}
