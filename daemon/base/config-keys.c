/* SPDX-License-Identifier: MIT */
/* config-keys.c: the keys of tierd.conf: their parsers, ranges and liveness, and their values as text. */

/*
 * Theory of operation: every key is a row of config_keys[]: section, name,
 * parser, value type, the offset of its field in Config, the accepted range
 * and whether a reload applies it.  Parsing a line (config.c) is a table
 * lookup followed by the row's parser, so adding a key is adding a row.
 * The same table spells values back as tierd.conf writes them
 * (config_value_format()), compares two configurations key by key and
 * copies live keys, which is all a reload needs (daemon/core/reload.c), and
 * prints a whole configuration (tierd --check-config).
 */

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <syslog.h>

#include "daemon/base/config-private.h"
#include "daemon/base/config.h"
#include "proto/macro.h"
#include "util/size.h"

/* Define a ConfigParser; not every parser needs every argument. */
#define CONFIG_PARSER(name)                                                                     \
        static int name(_unused_ Config *c, _unused_ const ConfigKey *k, const char *value,    \
                        _unused_ void *field, char **ret_reason)


static const char *const vram_backend_table[_VRAM_BACKEND_MAX] = {
        [VRAM_BACKEND_AUTO] = "auto",
        [VRAM_BACKEND_EMULATED] = "emulated",
        [VRAM_BACKEND_CUDA] = "cuda",
};

static const struct {
        const char *name;
        int level;
} log_level_table[] = {
        { "err",     LOG_ERR },
        { "warning", LOG_WARNING },
        { "notice",  LOG_NOTICE },
        { "info",    LOG_INFO },
        { "debug",   LOG_DEBUG },
};

static const char *const sched_policy_names[_SCHED_POLICY_MAX] = {
        [SCHED_POLICY_TIMELINE] = "timeline",
        [SCHED_POLICY_LRU] = "lru",
        [SCHED_POLICY_ONDEMAND] = "ondemand",
};

const char *sched_policy_to_string(SchedPolicyKind p) {
        return p >= 0 && p < _SCHED_POLICY_MAX ? sched_policy_names[p] : NULL;
}

SchedPolicyKind sched_policy_from_string(const char *s) {
        for (int i = 0; s && i < _SCHED_POLICY_MAX; i++)
                if (strcmp(sched_policy_names[i], s) == 0)
                        return (SchedPolicyKind) i;
        return _SCHED_POLICY_INVALID;
}

const char *vram_backend_to_string(VramBackendKind k) {
        if (k < 0 || k >= _VRAM_BACKEND_MAX)
                return NULL;
        return vram_backend_table[k];
}

VramBackendKind vram_backend_from_string(const char *s) {
        if (!s)
                return _VRAM_BACKEND_INVALID;
        for (int k = 0; k < _VRAM_BACKEND_MAX; k++)
                if (strcmp(s, vram_backend_table[k]) == 0)
                        return (VramBackendKind) k;
        return _VRAM_BACKEND_INVALID;
}

/* ---- scalar parsers --------------------------------------------------- */

/* Decimal digits only: no sign, no blanks, no base prefix.  Sets *@end past them. */
static int parse_digits(const char *s, uint64_t *ret, const char **end) {
        uint64_t v = 0;
        const char *p = s;

        if (*p < '0' || *p > '9')
                return -EINVAL;
        for (; *p >= '0' && *p <= '9'; p++) {
                unsigned d = (unsigned) (*p - '0');

                if (v > (UINT64_MAX - d) / 10)
                        return -ERANGE;
                v = v * 10 + d;
        }
        *ret = v;
        *end = p;
        return 0;
}

static int parse_uint64(const char *s, uint64_t *ret) {
        const char *end;
        uint64_t v = 0;
        int r;

        r = parse_digits(s, &v, &end);
        if (r < 0)
                return r;
        if (*end != '\0')
                return -EINVAL;
        *ret = v;
        return 0;
}



/* A parser's reason for rejecting a value. */
#define reason(ret_reason, ...) config_error_printf(ret_reason, -EINVAL, __VA_ARGS__)

/* ---- key parsers ------------------------------------------------------ */

int config_set_string(char **field, const char *value) {
        char *s = strdup(value);

        if (!s)
                return -ENOMEM;
        free(*field);
        *field = s;
        return 0;
}

CONFIG_PARSER(parse_abs_path) {
        if (value[0] != '/')
                return reason(ret_reason, "'%s' is not an absolute path", value);
        return config_set_string(field, value);
}

/* An absolute path, or "" for none. */
CONFIG_PARSER(parse_opt_abs_path) {
        if (value[0] == '\0')
                return config_set_string(field, value);
        return parse_abs_path(c, k, value, field, ret_reason);
}

CONFIG_PARSER(parse_socket_path) {
        const size_t max = sizeof(((struct sockaddr_un *) NULL)->sun_path) - 1;

        if (strlen(value) > max)
                return reason(ret_reason, "'%s' is too long for a socket path (at most %zu bytes)",
                              value, max);
        return parse_abs_path(c, k, value, field, ret_reason);
}

CONFIG_PARSER(parse_log_level) {
        for (size_t i = 0; i < ELEMENTSOF(log_level_table); i++)
                if (strcmp(value, log_level_table[i].name) == 0) {
                        *(int *) field = log_level_table[i].level;
                        return 0;
                }
        return reason(ret_reason, "invalid log level '%s' (expected err, warning, notice, info or debug)",
                      value);
}

/* A number in [k->min, k->max]; *@ret. */
static int parse_ranged(const ConfigKey *k, const char *value, uint64_t *ret, char **ret_reason) {
        uint64_t v = 0;

        if (parse_uint64(value, &v) < 0)
                return reason(ret_reason, "invalid number '%s'", value);
        if (v < k->min || v > k->max)
                return reason(ret_reason, "%" PRIu64 " is out of range (%" PRIu64 "..%" PRIu64 ")",
                              v, k->min, k->max);
        *ret = v;
        return 0;
}

CONFIG_PARSER(parse_unsigned) {
        uint64_t v = 0;
        int r;

        r = parse_ranged(k, value, &v, ret_reason);
        if (r < 0)
                return r;
        *(unsigned *) field = (unsigned) v;
        return 0;
}

CONFIG_PARSER(parse_linger) {
        uint64_t v = 0;
        int r;

        r = parse_ranged(k, value, &v, ret_reason);
        if (r < 0)
                return r;
        *(uint64_t *) field = v * UINT64_C(1000000);
        return 0;
}

/* A size in [k->min, k->max]; *@ret. */
static int parse_size_ranged(const ConfigKey *k, const char *value, uint64_t *ret, char **ret_reason) {
        char lo[32], hi[32];
        uint64_t v = 0;

        if (size_parse(value, &v) < 0)
                return reason(ret_reason, "invalid size '%s'", value);
        if (v < k->min || v > k->max) {
                size_format_exact(lo, sizeof(lo), k->min);
                size_format_exact(hi, sizeof(hi), k->max);
                if (k->max == UINT64_MAX)
                        return reason(ret_reason, "size '%s' is too small (at least %s)", value, lo);
                return reason(ret_reason, "size '%s' is out of range (%s..%s)", value, lo, hi);
        }
        *ret = v;
        return 0;
}

CONFIG_PARSER(parse_size) {
        return parse_size_ranged(k, value, field, ret_reason);
}

CONFIG_PARSER(parse_size_unsigned) {
        uint64_t v = 0;
        int r;

        r = parse_size_ranged(k, value, &v, ret_reason);
        if (r < 0)
                return r;
        *(unsigned *) field = (unsigned) v;
        return 0;
}

CONFIG_PARSER(parse_numa_node) {
        uint64_t v = 0;
        int r;

        if (strcmp(value, "auto") == 0) {
                *(int *) field = -1;
                return 0;
        }
        r = parse_ranged(k, value, &v, ret_reason);
        if (r < 0)
                return r;
        *(int *) field = (int) v;
        return 0;
}

CONFIG_PARSER(parse_vram_backend) {
        VramBackendKind b = vram_backend_from_string(value);

        if (b < 0)
                return reason(ret_reason, "invalid backend '%s' (expected auto, emulated or cuda)", value);
        *(VramBackendKind *) field = b;
        return 0;
}

CONFIG_PARSER(parse_sched_policy) {
        SchedPolicyKind p = sched_policy_from_string(value);

        if (p < 0)
                return reason(ret_reason, "invalid policy '%s' (expected timeline, lru or ondemand)", value);
        *(SchedPolicyKind *) field = p;
        return 0;
}

CONFIG_PARSER(parse_bool) {
        static const char *const yes[] = { "yes", "true", "on", "1" }, *const no[] = { "no", "false", "off", "0" };

        for (size_t i = 0; i < ELEMENTSOF(yes); i++) {
                if (strcmp(value, yes[i]) == 0) {
                        *(bool *) field = true;
                        return 0;
                }
                if (strcmp(value, no[i]) == 0) {
                        *(bool *) field = false;
                        return 0;
                }
        }
        return reason(ret_reason, "invalid value '%s' (expected yes or no)", value);
}

void config_clear_targets(Config *c) {
        for (size_t i = 0; i < c->n_targets; i++)
                c->targets[i].path = mfree(c->targets[i].path);
        c->n_targets = 0;
}

/* "PATH[:SIZE]": split at the last ':' only if what follows is a size, so "a:b" is a path. */
CONFIG_PARSER(parse_target) {
        const char *colon = strrchr(value, ':');
        _cleanup_free_ char *path = NULL;
        uint64_t size = 0;

        if (value[0] == '\0') {
                config_clear_targets(c);
                return 0;
        }
        if (colon && size_parse(colon + 1, &size) == 0)
                path = strndup(value, (size_t) (colon - value));
        else {
                size = 0;
                path = strdup(value);
        }
        if (!path)
                return -ENOMEM;
        if (path[0] == '\0')
                return reason(ret_reason, "empty path in '%s'", value);

        for (size_t i = 0; i < c->n_targets; i++)
                if (strcmp(c->targets[i].path, path) == 0)
                        return reason(ret_reason, "duplicate target '%s'", path);
        if (c->n_targets >= CONFIG_MAX_TARGETS)
                return reason(ret_reason, "too many targets (at most %d)", CONFIG_MAX_TARGETS);

        c->targets[c->n_targets++] = (ConfigTarget) {
                .path = TAKE_PTR(path),
                .size = size,
        };
        return 0;
}

/*
 * Every key of tierd.conf(5), in its order there: section, name, parser,
 * value type (for formatting and comparing), field, range and whether a
 * reload applies it (live) or it needs a restart.  Restart keys set up
 * something once: the listener, the state directory, pools allocated,
 * locked and registered with io_uring, targets opened and laid out, the
 * ring, the backend, limits told to clients at their handshake, and the
 * policy (plans in flight keep the holds their policy built).  Live keys
 * are read where they are used: at accept, the handshake, job creation, a
 * connection's end (linger), or applied by the reload (log level, the
 * default job limits, the bandwidth throttles).
 */
#define KEY(sec, name, parser, type, field, lo, hi, live) \
        { sec, name, parser, type, offsetof(Config, field), sizeof(((Config *) NULL)->field), lo, hi, live }

static const ConfigKey config_keys[] = {
        KEY("daemon", "socket",                  parse_socket_path,   CONFIG_STRING,        socket_path, 0, 0, false),
        KEY("daemon", "state_dir",               parse_abs_path,      CONFIG_STRING,        state_dir, 0, 0, false),
        KEY("daemon", "log_level",               parse_log_level,     CONFIG_LOG_LEVEL,     log_level, 0, 0, true),
        KEY("daemon", "linger_sec",              parse_linger,        CONFIG_SECONDS,       linger_usec, 0, CONFIG_LINGER_SEC_MAX, true),
        KEY("daemon", "max_connections",         parse_unsigned,      CONFIG_UNSIGNED,      max_connections, 1, 65536, true),
        KEY("daemon", "max_connections_per_uid", parse_unsigned,      CONFIG_UNSIGNED,      max_connections_per_uid, 1, 65536, true),

        KEY("limits", "max_message",             parse_size_unsigned, CONFIG_UNSIGNED_SIZE, max_message, KIB, 16 * MIB, false),
        KEY("limits", "max_tensors",             parse_unsigned,      CONFIG_UNSIGNED,      max_tensors, 1, 1024 * 1024, false),
        KEY("limits", "max_tensors_per_uid",     parse_unsigned,      CONFIG_UNSIGNED,      max_tensors_per_uid, 1, 64 * 1024 * 1024, true),
        KEY("limits", "max_inflight",            parse_unsigned,      CONFIG_UNSIGNED,      max_inflight, 1, 65536, false),
        KEY("limits", "max_name",                parse_unsigned,      CONFIG_UNSIGNED,      max_name, 16, 4096, false),

        KEY("host",   "capacity",                parse_size,          CONFIG_SIZE,          host_capacity, 1, UINT64_MAX, false),
        KEY("host",   "segment_size",            parse_size,          CONFIG_SIZE,          host_segment_size, CONFIG_ALIGN, CONFIG_SEGMENT_MAX, false),
        KEY("host",   "numa_node",               parse_numa_node,     CONFIG_NUMA_NODE,     numa_node, 0, 1023, false),
        KEY("host",   "job_limit",               parse_size,          CONFIG_SIZE,          host_job_limit, 1, UINT64_MAX, true),
        KEY("host",   "uid_share",               parse_unsigned,      CONFIG_UNSIGNED,      host_uid_share, 0, 100, true),

        KEY("vram",   "backend",                 parse_vram_backend,  CONFIG_BACKEND,       vram_backend, 0, 0, false),
        KEY("vram",   "capacity",                parse_size,          CONFIG_SIZE,          vram_capacity, 0, UINT64_MAX, false),
        KEY("vram",   "chunk_size",              parse_size,          CONFIG_SIZE,          vram_chunk_size, CONFIG_ALIGN, UINT64_MAX, false),
        KEY("vram",   "job_limit",               parse_size,          CONFIG_SIZE,          vram_job_limit, 1, UINT64_MAX, true),
        KEY("vram",   "uid_share",               parse_unsigned,      CONFIG_UNSIGNED,      vram_uid_share, 0, 100, true),
        KEY("vram",   "bandwidth",               parse_size,          CONFIG_SIZE,          vram_bandwidth, 0, UINT64_MAX, true),

        KEY("nvme",   "target",                  parse_target,        CONFIG_TARGETS,       targets, 0, 0, false),
        KEY("nvme",   "extent_size",             parse_size,          CONFIG_SIZE,          nvme_extent_size, CONFIG_ALIGN, CONFIG_EXTENT_MAX, false),
        KEY("nvme",   "queue_depth",             parse_unsigned,      CONFIG_UNSIGNED,      nvme_queue_depth, 1, 4096, false),
        KEY("nvme",   "checksum_threads",        parse_unsigned,      CONFIG_UNSIGNED,      nvme_checksum_threads, 0, 16, false),
        KEY("nvme",   "job_limit",               parse_size,          CONFIG_SIZE,          nvme_job_limit, 1, UINT64_MAX, true),
        KEY("nvme",   "uid_share",               parse_unsigned,      CONFIG_UNSIGNED,      nvme_uid_share, 0, 100, true),
        KEY("nvme",   "bandwidth",               parse_size,          CONFIG_SIZE,          nvme_bandwidth, 0, UINT64_MAX, true),
        KEY("nvme",   "persist",                 parse_bool,          CONFIG_BOOL,          nvme_persist, 0, 0, false),

        KEY("sched",  "policy",                  parse_sched_policy,  CONFIG_POLICY,        sched_policy, 0, 0, false),
        KEY("sched",  "default_weight",          parse_unsigned,      CONFIG_UNSIGNED,      default_weight, 1, 1000, true),

        KEY("metrics", "textfile",               parse_opt_abs_path,  CONFIG_STRING,        metrics_textfile, 0, 0, false),
        KEY("metrics", "interval_sec",           parse_linger,        CONFIG_SECONDS,       metrics_interval_usec, 1, 86400, false),

        /* records a trace holds (160 bytes each); the maximum is TRACE_BUFFER_MAX (engine/trace.h) */
        KEY("trace",  "buffer",                  parse_unsigned,      CONFIG_UNSIGNED,      trace_buffer, 1, 1024 * 1024, true),
};

_Static_assert(ELEMENTSOF(config_keys) <= CONFIG_KEYS_MAX, "raise CONFIG_KEYS_MAX");

size_t config_key_index(const ConfigKey *k) {
        return (size_t) (k - config_keys);
}

const ConfigKey *config_key_at(size_t i) {
        return i < ELEMENTSOF(config_keys) ? &config_keys[i] : NULL;
}

bool config_section_known(const char *section) {
        for (size_t i = 0; i < ELEMENTSOF(config_keys); i++)
                if (strcmp(config_keys[i].section, section) == 0)
                        return true;
        return false;
}

const ConfigKey *config_key_find(const char *section, const char *name) {
        for (size_t i = 0; i < ELEMENTSOF(config_keys); i++)
                if (strcmp(config_keys[i].section, section) == 0 && strcmp(config_keys[i].name, name) == 0)
                        return &config_keys[i];
        return NULL;
}

/* ---- keys as values: formatting, comparing, copying (reload, --check-config) -------------------- */

bool config_value_equal(const ConfigKey *k, const Config *a, const Config *b) {
        const void *fa = (const uint8_t *) a + k->offset, *fb = (const uint8_t *) b + k->offset;

        switch (k->type) {
        case CONFIG_STRING:
                return strcmp(*(char *const *) fa, *(char *const *) fb) == 0;
        case CONFIG_TARGETS:
                if (a->n_targets != b->n_targets)
                        return false;
                for (size_t i = 0; i < a->n_targets; i++)
                        if (strcmp(a->targets[i].path, b->targets[i].path) != 0 ||
                            a->targets[i].size != b->targets[i].size)
                                return false;
                return true;
        default:
                return memcmp(fa, fb, k->size) == 0;    /* scalars */
        }
}

int config_value_copy(const ConfigKey *k, Config *to, const Config *from) {
        if (k->type == CONFIG_STRING || k->type == CONFIG_TARGETS)
                return -EOPNOTSUPP;     /* owned memory: not a live key */
        memcpy((uint8_t *) to + k->offset, (const uint8_t *) from + k->offset, k->size);
        return 0;
}

/* "PATH:SIZE, PATH:SIZE": every target; "(its size)" for a target whose size is its device's or file's. */
static char *format_targets(const Config *c, const char *separator) {
        size_t len = 1;
        char buf[32], *s, *p;

        for (size_t i = 0; i < c->n_targets; i++)
                len += strlen(c->targets[i].path) + strlen(separator) + 32;
        s = p = malloc(len);
        if (!s)
                return NULL;
        *p = '\0';
        for (size_t i = 0; i < c->n_targets; i++) {
                size_format_exact(buf, sizeof(buf), c->targets[i].size);
                p += sprintf(p, "%s%s%s%s", i ? separator : "", c->targets[i].path,
                             c->targets[i].size ? ":" : "", c->targets[i].size ? buf : "");
        }
        return s;
}

char *config_value_format(const ConfigKey *k, const Config *c) {
        const void *field = (const uint8_t *) c + k->offset;
        char buf[64];
        const char *name;

        switch (k->type) {
        case CONFIG_STRING:
                return strdup(*(char *const *) field);
        case CONFIG_UNSIGNED:
                (void) snprintf(buf, sizeof(buf), "%u", *(const unsigned *) field);
                break;
        case CONFIG_UNSIGNED_SIZE:
                size_format_exact(buf, sizeof(buf), *(const unsigned *) field);
                break;
        case CONFIG_SIZE:
                size_format_exact(buf, sizeof(buf), *(const uint64_t *) field);
                break;
        case CONFIG_SECONDS:
                (void) snprintf(buf, sizeof(buf), "%" PRIu64, *(const uint64_t *) field / 1000000);
                break;
        case CONFIG_NUMA_NODE:
                if (*(const int *) field < 0)
                        return strdup("auto");
                (void) snprintf(buf, sizeof(buf), "%d", *(const int *) field);
                break;
        case CONFIG_LOG_LEVEL:
                name = "?";
                for (size_t i = 0; i < ELEMENTSOF(log_level_table); i++)
                        if (log_level_table[i].level == *(const int *) field)
                                name = log_level_table[i].name;
                return strdup(name);
        case CONFIG_BACKEND:
                name = vram_backend_to_string(*(const VramBackendKind *) field);
                return strdup(name ? name : "?");
        case CONFIG_POLICY:
                name = sched_policy_to_string(*(const SchedPolicyKind *) field);
                return strdup(name ? name : "?");
        case CONFIG_TARGETS:
                return format_targets(c, ", ");
        case CONFIG_BOOL:
                return strdup(*(const bool *) field ? "yes" : "no");
        default:
                return strdup("?");
        }
        return strdup(buf);
}

int config_print(FILE *f, const Config *c) {
        const char *section = NULL;

        for (size_t i = 0; i < ELEMENTSOF(config_keys); i++) {
                const ConfigKey *k = &config_keys[i];
                _cleanup_free_ char *v = NULL;

                if (!section || strcmp(section, k->section) != 0) {
                        fprintf(f, "%s[%s]\n", section ? "\n" : "", k->section);
                        section = k->section;
                }
                if (k->type == CONFIG_TARGETS) {
                        v = format_targets(c, "\ntarget = ");
                        if (!v)
                                return -ENOMEM;
                        fprintf(f, "target = %s\n", v);
                        continue;
                }
                v = config_value_format(k, c);
                if (!v)
                        return -ENOMEM;
                fprintf(f, "%s = %s\n", k->name, v);
        }
        if (c->quotas.n > 0) {
                _cleanup_free_ char *q = quota_rules_format(&c->quotas);

                if (!q)
                        return -ENOMEM;
                fprintf(f, "\n%s", q);
        }
        return fflush(f) == 0 ? 0 : -EIO;
}
