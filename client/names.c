/* SPDX-License-Identifier: MIT */
/* names.c: the texts of libtier: error codes and tier names. */

/*
 * Theory of operation
 *
 * Every libtier call returns a negative errno; tier_strerror() is the one
 * place that turns one into text, for callers and for libtier's own error
 * messages.  It must be safe from any thread, so it never uses strerror()
 * (whose buffer is shared): glibc's strerrordesc_np() returns static text,
 * and elsewhere %m formats into a thread-local buffer.
 *
 * Tier names ("vram", "host", "nvme") are what tierctl, tierd's
 * configuration and its status output spell; the table is indexed by the
 * TIER_* constants of tier.h.  Link names ("nvme->host", ...) are those of
 * the status's link counters, indexed by TIER_LINK_*.
 *
 * A job or tensor name libtier refuses (name_refusal()) is said as tierd
 * says one: escaped, as what an older tierd's job was restored under.
 */

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include <tier.h>

#include "client/client-internal.h"
#include "client/tier-private.h"
#include "util/escape.h"

static const char *const level_names[TIER_LEVEL_MAX] = {
        [TIER_VRAM] = "vram",
        [TIER_HOST] = "host",
        [TIER_NVME] = "nvme",
};

_public_ const char *tier_strerror(int err) {
        static _Thread_local char buf[48];
        const char *s = NULL;
        int e;

        if (err == 0)
                return "Success";
        e = err == INT_MIN ? INT_MAX : err < 0 ? -err : err;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
        s = strerrordesc_np(e);         /* static text: thread-safe, unlike strerror() */
#else
        {
                /* %m formats into our thread-local buffer, so it is thread-safe too. */
                int saved = errno;

                errno = e;
                (void) snprintf(buf, sizeof(buf), "%m");
                errno = saved;
                s = buf;
        }
#endif
        if (s)
                return s;
        (void) snprintf(buf, sizeof(buf), "Unknown error %d", err);
        return buf;
}

_public_ const char *tier_level_name(int tier) {
        return tier_valid(tier) ? level_names[tier] : NULL;
}

static const char *const link_names[TIER_LINKS] = {
        [TIER_LINK_NVME_TO_HOST] = "nvme->host",
        [TIER_LINK_HOST_TO_NVME] = "host->nvme",
        [TIER_LINK_HOST_TO_VRAM] = "host->vram",
        [TIER_LINK_VRAM_TO_HOST] = "vram->host",
};

_public_ const char *tier_link_name(int link) {
        return link >= 0 && link < TIER_LINKS ? link_names[link] : NULL;
}

_public_ int tier_level_from_name(const char *s) {
        if (!s)
                return -EINVAL;
        for (int i = 0; i < TIER_LEVEL_MAX; i++)
                if (strcmp(s, level_names[i]) == 0)
                        return i;
        return -EINVAL;
}

int name_refusal(char *buf, size_t size, const char *what, const char *name) {
        char e[NAME_REFUSAL_SAY + 1], why[UTF8_NAME_FLAW_MAX];
        const char *flaw;
        bool say;

        if (!name || !*name) {
                (void) snprintf(buf, size, "%s name is empty", what);
                return -EINVAL;
        }
        flaw = utf8_name_flaw(name, strlen(name), why);
        say = text_escape_len(name) <= NAME_REFUSAL_SAY;
        if (say)
                (void) text_escape(e, sizeof(e), name);
        (void) snprintf(buf, size, "%s name %s; a %s an older tierd made under such a name was restored under its "
                        "escaped text, %s%s%s (%s lists the name it was restored under, if any)", what,
                        flaw ? flaw : "is not valid UTF-8", what,
                        say ? "'" : "", say ? e : "too long to say here", say ? "'" : "",
                        strcmp(what, "job") == 0 ? "tierctl jobs" : "tierctl tensors JOB");
        return -EINVAL;
}
