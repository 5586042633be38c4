/* SPDX-License-Identifier: MIT */
/* config.c: tierd.conf (+ tierd.conf.d/ drop-ins) parsed into a value struct. */

/*
 * Theory of operation
 *
 * The format is a small ini dialect, specified by the sample
 * systemd/tierd.conf:
 *
 *     # comment            (also "; comment"; whole lines only)
 *     [section]
 *     key = value          (key and value trimmed of blanks)
 *
 * Every key is a row of config_keys[]: section, name, parser, the offset of
 * its field in Config and, for numbers, the accepted range.  Parsing a line
 * is a table lookup followed by the row's parser, so adding a key is adding
 * a row.  A later assignment overrides an earlier one, except nvme.target,
 * which appends (and an empty "target =" drops the targets listed so far,
 * as an empty assignment resets a list in systemd unit files).
 *
 * Anything not understood is an error, not a warning: an unknown section or
 * key, a key outside a section, a value out of range.  A daemon that guesses
 * at a misspelt capacity is worse than one that refuses to start.  Errors
 * come back as -EINVAL plus one malloc'ed message, "FILE:LINE: [section]
 * key: reason", for the caller to log.  Nothing here logs.
 *
 * config_load() reads the main file and then PATH.d/ *.conf in strcmp()
 * order; each file must open its own section.  config_finish() then checks
 * the constraints that span keys (segment and capacity, chunk and VRAM,
 * extent size) and fills derived values: the default target, and target
 * paths made absolute against state_dir.  Its messages have no line: the
 * offending value may come from any of the files.
 *
 * The caller parses into a fresh Config and swaps it in only on success,
 * so a bad reload keeps the running configuration.
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <syslog.h>

#include "daemon/base/config.h"
#include "proto/macro.h"

/* Largest config file read; anything bigger is surely not a config file. */
#define CONFIG_FILE_MAX (1024 * 1024)

#define KIB UINT64_C(1024)
#define MIB (KIB * 1024)
#define GIB (MIB * 1024)

/* linger_sec above a year is a typo, not a policy. */
#define CONFIG_LINGER_SEC_MAX (365u * 24 * 3600)

/* io_uring registered (fixed) buffers are limited to 1 GiB each. */
#define CONFIG_SEGMENT_MAX GIB
/* Direct I/O alignment; also the page size all pools are carved in. */
#define CONFIG_ALIGN 4096u
#define CONFIG_EXTENT_MAX (64 * MIB)

#define CONFIG_DEFAULT_TARGET "nvme0.img"
#define CONFIG_DEFAULT_TARGET_SIZE (4 * GIB)

typedef struct ConfigKey ConfigKey;

static inline void *mfree(void *p) {
        free(p);
        return NULL;
}

/*
 * Parse @value into the field at @field.  On failure return -EINVAL (or
 * -ENOMEM) and, for -EINVAL, a malloc'ed reason in *ret_reason.
 */
typedef int (*ConfigParser)(Config *c, const ConfigKey *k, const char *value, void *field,
                            char **ret_reason);

/* Define a ConfigParser; not every parser needs every argument. */
#define CONFIG_PARSER(name)                                                                     \
        static int name(_unused_ Config *c, _unused_ const ConfigKey *k, const char *value,    \
                        _unused_ void *field, char **ret_reason)

struct ConfigKey {
        const char *section;
        const char *name;
        ConfigParser parse;
        size_t offset;
        uint64_t min, max;      /* inclusive range for numbers and sizes */
};

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

int config_parse_size(const char *s, uint64_t *ret) {
        static const struct {
                char suffix;
                unsigned shift;
        } units[] = {
                { 'K', 10 }, { 'M', 20 }, { 'G', 30 }, { 'T', 40 },
        };
        const char *end;
        unsigned shift = 0;
        uint64_t v = 0;
        int r;

        if (!s)
                return -EINVAL;
        r = parse_digits(s, &v, &end);
        if (r < 0)
                return r;

        for (size_t i = 0; i < ELEMENTSOF(units); i++)
                if (*end == units[i].suffix) {
                        shift = units[i].shift;
                        end++;
                        /* "1G", "1GB", "1GiB" are all 2^30. */
                        if (end[0] == 'i' && end[1] == 'B')
                                end += 2;
                        else if (end[0] == 'B')
                                end++;
                        break;
                }
        if (shift == 0 && *end == 'B')
                end++;          /* "4096B" */
        if (*end != '\0')
                return -EINVAL;

        if (shift > 0 && v > (UINT64_MAX >> shift))
                return -ERANGE;
        *ret = v << shift;
        return 0;
}

/* "64M" for exact multiples, else plain bytes; for messages. */
static void format_size(char *buf, size_t n, uint64_t v) {
        static const char suffix[] = "KMGT";

        for (int i = (int) sizeof(suffix) - 2; i >= 0; i--) {
                unsigned shift = 10 * (unsigned) (i + 1);

                if (v != 0 && (v & ((UINT64_C(1) << shift) - 1)) == 0) {
                        (void) snprintf(buf, n, "%" PRIu64 "%c", v >> shift, suffix[i]);
                        return;
                }
        }
        (void) snprintf(buf, n, "%" PRIu64, v);
}

/*
 * Store a formatted message in *@ret (if @ret is not NULL) and return @r, or
 * -ENOMEM if the message cannot be allocated.
 */
_printf_(3, 4)
static int error_printf(char **ret, int r, const char *fmt, ...) {
        va_list ap;
        int q;

        if (!ret)
                return r;
        va_start(ap, fmt);
        q = vasprintf(ret, fmt, ap);
        va_end(ap);
        if (q < 0) {
                *ret = NULL;
                return -ENOMEM;
        }
        return r;
}

/* A parser's reason for rejecting a value. */
#define reason(ret_reason, ...) error_printf(ret_reason, -EINVAL, __VA_ARGS__)

/* ---- key parsers ------------------------------------------------------ */

static int set_string(char **field, const char *value) {
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
        return set_string(field, value);
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

        if (config_parse_size(value, &v) < 0)
                return reason(ret_reason, "invalid size '%s'", value);
        if (v < k->min || v > k->max) {
                format_size(lo, sizeof(lo), k->min);
                format_size(hi, sizeof(hi), k->max);
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

static void config_clear_targets(Config *c) {
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

        if (colon && config_parse_size(colon + 1, &size) == 0)
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

#define KEY(sec, name, parser, field, lo, hi) \
        { sec, name, parser, offsetof(Config, field), lo, hi }

static const ConfigKey config_keys[] = {
        KEY("daemon", "socket",                  parse_socket_path,   socket_path, 0, 0),
        KEY("daemon", "state_dir",               parse_abs_path,      state_dir, 0, 0),
        KEY("daemon", "log_level",               parse_log_level,     log_level, 0, 0),
        KEY("daemon", "linger_sec",              parse_linger,        linger_usec, 0, CONFIG_LINGER_SEC_MAX),
        KEY("daemon", "max_connections",         parse_unsigned,      max_connections, 1, 65536),
        KEY("daemon", "max_connections_per_uid", parse_unsigned,      max_connections_per_uid, 1, 65536),

        KEY("limits", "max_message",             parse_size_unsigned, max_message, KIB, 16 * MIB),
        KEY("limits", "max_tensors",             parse_unsigned,      max_tensors, 1, 1024 * 1024),
        KEY("limits", "max_inflight",            parse_unsigned,      max_inflight, 1, 65536),
        KEY("limits", "max_name",                parse_unsigned,      max_name, 16, 4096),

        KEY("host",   "capacity",                parse_size,          host_capacity, 1, UINT64_MAX),
        KEY("host",   "segment_size",            parse_size,          host_segment_size, CONFIG_ALIGN, CONFIG_SEGMENT_MAX),
        KEY("host",   "numa_node",               parse_numa_node,     numa_node, 0, 1023),
        KEY("host",   "job_limit",               parse_size,          host_job_limit, 1, UINT64_MAX),

        KEY("vram",   "backend",                 parse_vram_backend,  vram_backend, 0, 0),
        KEY("vram",   "capacity",                parse_size,          vram_capacity, 0, UINT64_MAX),
        KEY("vram",   "chunk_size",              parse_size,          vram_chunk_size, CONFIG_ALIGN, UINT64_MAX),
        KEY("vram",   "job_limit",               parse_size,          vram_job_limit, 1, UINT64_MAX),
        KEY("vram",   "bandwidth",               parse_size,          vram_bandwidth, 0, UINT64_MAX),

        KEY("nvme",   "target",                  parse_target,        targets, 0, 0),
        KEY("nvme",   "extent_size",             parse_size,          nvme_extent_size, CONFIG_ALIGN, CONFIG_EXTENT_MAX),
        KEY("nvme",   "queue_depth",             parse_unsigned,      nvme_queue_depth, 1, 4096),
        KEY("nvme",   "job_limit",               parse_size,          nvme_job_limit, 1, UINT64_MAX),
        KEY("nvme",   "bandwidth",               parse_size,          nvme_bandwidth, 0, UINT64_MAX),

        KEY("sched",  "policy",                  parse_sched_policy,  sched_policy, 0, 0),
        KEY("sched",  "default_weight",          parse_unsigned,      default_weight, 1, 1000),
};

static bool config_section_known(const char *section) {
        for (size_t i = 0; i < ELEMENTSOF(config_keys); i++)
                if (strcmp(config_keys[i].section, section) == 0)
                        return true;
        return false;
}

static const ConfigKey *config_key_find(const char *section, const char *name) {
        for (size_t i = 0; i < ELEMENTSOF(config_keys); i++)
                if (strcmp(config_keys[i].section, section) == 0 && strcmp(config_keys[i].name, name) == 0)
                        return &config_keys[i];
        return NULL;
}

/* ---- lifecycle -------------------------------------------------------- */

void config_init(Config *c) {
        *c = (Config) {
                /* strdup() failure leaves NULL, which config_finish() reports as -ENOMEM. */
                .socket_path = strdup("/run/tierd/tierd.sock"),
                .state_dir = strdup("/var/lib/tierd"),
                .log_level = LOG_INFO,
                .sched_policy = SCHED_POLICY_TIMELINE,
                .default_weight = 1,
                .linger_usec = 30 * UINT64_C(1000000),
                .max_connections = 1024,
                .max_connections_per_uid = 64,

                .max_message = 64 * KIB,
                .max_tensors = 65536,
                .max_inflight = 256,
                .max_name = 255,

                .host_capacity = GIB,
                .host_segment_size = 64 * MIB,
                .numa_node = -1,
                .host_job_limit = 512 * MIB,

                .vram_backend = VRAM_BACKEND_AUTO,
                .vram_capacity = GIB,
                .vram_chunk_size = 64 * MIB,
                .vram_job_limit = 512 * MIB,
                .vram_bandwidth = 0,

                .n_targets = 0,
                .nvme_extent_size = MIB,
                .nvme_queue_depth = 64,
                .nvme_job_limit = 2 * GIB,
                .nvme_bandwidth = 0,
        };
}

void config_deinit(Config *c) {
        c->socket_path = mfree(c->socket_path);
        c->state_dir = mfree(c->state_dir);
        config_clear_targets(c);
}

/* ---- text ------------------------------------------------------------- */

static bool is_blank(char ch) {
        return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\f' || ch == '\v';
}

/* Trim blanks off both ends of @s in place. */
static char *strstrip(char *s) {
        char *e;

        while (is_blank(*s))
                s++;
        e = s + strlen(s);
        while (e > s && is_blank(e[-1]))
                e--;
        *e = '\0';
        return s;
}

_printf_(5, 6)
static int line_error(char **ret_error, const char *filename, unsigned line, const char *section,
                      const char *fmt, ...) {
        _cleanup_free_ char *msg = NULL;
        va_list ap;
        int r;

        if (!ret_error)
                return -EINVAL;

        va_start(ap, fmt);
        r = vasprintf(&msg, fmt, ap);
        va_end(ap);
        if (r < 0)
                return -ENOMEM;

        if (section)
                return error_printf(ret_error, -EINVAL, "%s:%u: [%s] %s", filename, line, section, msg);
        return error_printf(ret_error, -EINVAL, "%s:%u: %s", filename, line, msg);
}

static int config_parse_line(Config *c, char *l, const char *filename, unsigned line,
                             char **section, char **ret_error) {
        _cleanup_free_ char *why = NULL;
        const ConfigKey *k;
        char *eq, *name, *value;
        int r;

        l = strstrip(l);
        if (l[0] == '\0' || l[0] == '#' || l[0] == ';')
                return 0;

        if (l[0] == '[') {
                size_t n = strlen(l);
                char *s;

                if (l[n - 1] != ']')
                        return line_error(ret_error, filename, line, NULL,
                                          "invalid section header '%s'", l);
                l[n - 1] = '\0';
                s = strstrip(l + 1);
                if (!config_section_known(s))
                        return line_error(ret_error, filename, line, NULL, "unknown section [%s]", s);
                s = strdup(s);
                if (!s)
                        return -ENOMEM;
                free(*section);
                *section = s;
                return 0;
        }

        eq = strchr(l, '=');
        if (!eq)
                return line_error(ret_error, filename, line, *section,
                                  "missing '=' in '%s' (expected 'key = value')", l);
        *eq = '\0';
        name = strstrip(l);
        value = strstrip(eq + 1);

        if (name[0] == '\0')
                return line_error(ret_error, filename, line, *section, "missing key before '='");
        if (!*section)
                return line_error(ret_error, filename, line, NULL, "%s: key outside of any [section]", name);

        k = config_key_find(*section, name);
        if (!k)
                return line_error(ret_error, filename, line, *section, "%s: unknown key", name);

        r = k->parse(c, k, value, (uint8_t *) c + k->offset, &why);
        if (r == -EINVAL)
                return line_error(ret_error, filename, line, *section, "%s: %s", name,
                                  why ? why : "invalid value");
        return r;
}

int config_parse_text(Config *c, const char *text, const char *filename, char **ret_error) {
        _cleanup_free_ char *copy = NULL, *section = NULL;
        char *l, *next;
        unsigned line = 0;
        int r;

        if (ret_error)
                *ret_error = NULL;
        if (!filename)
                filename = "(config)";

        copy = strdup(text);
        if (!copy)
                return -ENOMEM;

        for (l = copy; l; l = next) {
                next = strchr(l, '\n');
                if (next)
                        *next++ = '\0';
                line++;

                r = config_parse_line(c, l, filename, line, &section, ret_error);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* ---- files ------------------------------------------------------------ */

/*
 * Read all of @path (at most CONFIG_FILE_MAX bytes) as a string.  -ENOENT for
 * a missing file (or dangling link), -EISDIR for a directory, -EFBIG when too
 * big, -EBADMSG when it contains a NUL byte.  Character devices are fine, so
 * /dev/null works as "an empty config".
 */
static int read_config_file(int dir_fd, const char *path, char **ret) {
        _cleanup_close_ int fd = -1;
        _cleanup_free_ char *buf = NULL;
        size_t size = 0, alloc = 0;
        struct stat st;

        fd = openat(dir_fd, path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return negative_errno();
        if (fstat(fd, &st) < 0)
                return negative_errno();
        if (S_ISDIR(st.st_mode))
                return -EISDIR;

        for (;;) {
                ssize_t n;

                if (alloc - size < 4096) {
                        size_t want = alloc == 0 ? 4096 : alloc * 2;
                        char *p;

                        if (want > CONFIG_FILE_MAX + 1)
                                want = CONFIG_FILE_MAX + 1;
                        p = realloc(buf, want + 1);
                        if (!p)
                                return -ENOMEM;
                        buf = p;
                        alloc = want;
                }

                n = read(fd, buf + size, alloc - size);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return negative_errno();
                }
                if (n == 0)
                        break;
                size += (size_t) n;
                if (size > CONFIG_FILE_MAX)
                        return -EFBIG;
        }

        if (!buf) {
                buf = strdup("");
                if (!buf)
                        return -ENOMEM;
        }
        buf[size] = '\0';
        if (strlen(buf) != size)
                return -EBADMSG;

        *ret = TAKE_PTR(buf);
        return 0;
}

static const char *read_error_reason(int r) {
        switch (r) {
        case -EFBIG:
                return "file too large";
        case -EBADMSG:
                return "file contains a NUL byte";
        default:
                return strerror(-r);
        }
}

/* Read one file and apply it; -errno with *ret_error set. */
static int config_apply_file(Config *c, int dir_fd, const char *name, const char *display,
                             char **ret_error) {
        _cleanup_free_ char *text = NULL;
        int r;

        r = read_config_file(dir_fd, name, &text);
        if (r < 0)
                return error_printf(ret_error, r, "%s: %s", display, read_error_reason(r));
        return config_parse_text(c, text, display, ret_error);
}

static int conf_filter(const struct dirent *de) {
        size_t n = strlen(de->d_name);

        return de->d_name[0] != '.' && n > 5 && strcmp(de->d_name + n - 5, ".conf") == 0;
}

static int conf_compare(const struct dirent **a, const struct dirent **b) {
        return strcmp((*a)->d_name, (*b)->d_name);
}

static int config_apply_dropins(Config *c, const char *path, char **ret_error) {
        _cleanup_free_ char *dir = NULL;
        _cleanup_close_ int dir_fd = -1;
        struct dirent **list = NULL;
        int n, r = 0;

        if (asprintf(&dir, "%s.d", path) < 0)
                return -ENOMEM;

        dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir_fd < 0) {
                if (errno == ENOENT || errno == ENOTDIR)
                        return 0;
                r = negative_errno();
                return error_printf(ret_error, r, "%s: %s", dir, strerror(-r));
        }

        n = scandirat(dir_fd, ".", &list, conf_filter, conf_compare);
        if (n < 0) {
                r = negative_errno();
                return error_printf(ret_error, r, "%s: %s", dir, strerror(-r));
        }

        for (int i = 0; i < n; i++) {
                _cleanup_free_ char *display = NULL;

                if (r >= 0) {
                        if (asprintf(&display, "%s/%s", dir, list[i]->d_name) < 0)
                                r = -ENOMEM;
                        else {
                                r = config_apply_file(c, dir_fd, list[i]->d_name, display, ret_error);
                                /* Gone since scandir(), a dangling link, or a directory
                                 * named *.conf: not a drop-in. */
                                if (r == -ENOENT || r == -EISDIR) {
                                        if (ret_error)
                                                *ret_error = mfree(*ret_error);
                                        r = 0;
                                }
                        }
                }
                free(list[i]);
        }
        free(list);
        return r;
}

int config_load_files(Config *c, const char *path, bool must_exist, char **ret_error) {
        int r;

        if (ret_error)
                *ret_error = NULL;

        config_init(c);

        r = config_apply_file(c, AT_FDCWD, path, path, ret_error);
        if (r == -ENOENT && !must_exist) {
                if (ret_error)
                        *ret_error = mfree(*ret_error);
                r = 0;
        }
        if (r >= 0)
                r = config_apply_dropins(c, path, ret_error);
        if (r < 0) {
                config_deinit(c);
                return r;
        }
        return 0;
}

int config_load(Config *c, const char *path, bool must_exist, char **ret_error) {
        int r;

        r = config_load_files(c, path, must_exist, ret_error);
        if (r < 0)
                return r;
        r = config_finish(c, ret_error);
        if (r < 0) {
                config_deinit(c);
                return r;
        }
        return 0;
}

/* ---- validation ------------------------------------------------------- */

/* A cross-key constraint failed. */
#define finish_error(ret_error, ...) error_printf(ret_error, -EINVAL, __VA_ARGS__)

static bool is_power_of_2(uint64_t v) {
        return v != 0 && (v & (v - 1)) == 0;
}

static int config_finish_targets(Config *c, char **ret_error) {
        if (c->n_targets == 0) {
                c->targets[0] = (ConfigTarget) {
                        .path = strdup(CONFIG_DEFAULT_TARGET),
                        .size = CONFIG_DEFAULT_TARGET_SIZE,
                };
                if (!c->targets[0].path)
                        return -ENOMEM;
                c->n_targets = 1;
        }

        for (size_t i = 0; i < c->n_targets; i++) {
                ConfigTarget *t = &c->targets[i];
                char s[32], e[32];

                if (t->path[0] != '/') {
                        size_t n = strlen(c->state_dir);
                        char *p;

                        while (n > 1 && c->state_dir[n - 1] == '/')
                                n--;
                        if (asprintf(&p, "%.*s/%s", (int) n, c->state_dir, t->path) < 0)
                                return -ENOMEM;
                        free(t->path);
                        t->path = p;
                }

                if (t->size != 0 && t->size < c->nvme_extent_size) {
                        format_size(s, sizeof(s), t->size);
                        format_size(e, sizeof(e), c->nvme_extent_size);
                        return finish_error(ret_error,
                                            "[nvme] target: '%s' size %s is smaller than one extent (%s)",
                                            t->path, s, e);
                }

                for (size_t j = 0; j < i; j++)
                        if (strcmp(c->targets[j].path, t->path) == 0)
                                return finish_error(ret_error, "[nvme] target: duplicate target '%s'",
                                                    t->path);
        }
        return 0;
}

int config_finish(Config *c, char **ret_error) {
        char a[32], b[32];

        if (ret_error)
                *ret_error = NULL;

        if (!c->socket_path || !c->state_dir)
                return -ENOMEM;

        /* [host] */
        if (c->host_segment_size == 0 || c->host_segment_size % CONFIG_ALIGN != 0) {
                format_size(a, sizeof(a), c->host_segment_size);
                return finish_error(ret_error, "[host] segment_size: %s is not a positive multiple of 4K",
                                    a);
        }
        if (c->host_segment_size > CONFIG_SEGMENT_MAX) {
                format_size(a, sizeof(a), c->host_segment_size);
                return finish_error(ret_error,
                                    "[host] segment_size: %s exceeds 1G (io_uring fixed buffer limit)", a);
        }
        if (c->host_segment_size > c->host_capacity) {
                format_size(a, sizeof(a), c->host_segment_size);
                format_size(b, sizeof(b), c->host_capacity);
                return finish_error(ret_error, "[host] segment_size: %s is larger than capacity %s", a, b);
        }
        if (c->host_capacity % c->host_segment_size != 0) {
                format_size(a, sizeof(a), c->host_capacity);
                format_size(b, sizeof(b), c->host_segment_size);
                return finish_error(ret_error,
                                    "[host] capacity: %s is not a multiple of segment_size %s", a, b);
        }
        if (c->host_job_limit == 0)
                return finish_error(ret_error, "[host] job_limit: must be positive");
        if (c->numa_node < -1 || c->numa_node > 1023)
                return finish_error(ret_error, "[host] numa_node: %d is out of range (auto or 0..1023)",
                                    c->numa_node);

        /* [vram] */
        if (c->vram_backend < 0 || c->vram_backend >= _VRAM_BACKEND_MAX)
                return finish_error(ret_error, "[vram] backend: invalid backend %d", (int) c->vram_backend);
        if (c->vram_chunk_size == 0 || c->vram_chunk_size % CONFIG_ALIGN != 0) {
                format_size(a, sizeof(a), c->vram_chunk_size);
                return finish_error(ret_error, "[vram] chunk_size: %s is not a positive multiple of 4K", a);
        }
        if (c->vram_capacity != 0 && c->vram_chunk_size > c->vram_capacity) {      /* 0: as the device allows */
                format_size(a, sizeof(a), c->vram_chunk_size);
                format_size(b, sizeof(b), c->vram_capacity);
                return finish_error(ret_error, "[vram] chunk_size: %s is larger than capacity %s", a, b);
        }
        if (c->vram_job_limit == 0)
                return finish_error(ret_error, "[vram] job_limit: must be positive");

        /* [nvme] */
        if (!is_power_of_2(c->nvme_extent_size) || c->nvme_extent_size < CONFIG_ALIGN ||
            c->nvme_extent_size > CONFIG_EXTENT_MAX) {
                format_size(a, sizeof(a), c->nvme_extent_size);
                return finish_error(ret_error, "[nvme] extent_size: %s is not a power of two in 4K..64M", a);
        }
        if (c->nvme_queue_depth < 1 || c->nvme_queue_depth > 4096)
                return finish_error(ret_error, "[nvme] queue_depth: %u is out of range (1..4096)",
                                    c->nvme_queue_depth);
        if (c->nvme_job_limit == 0)
                return finish_error(ret_error, "[nvme] job_limit: must be positive");

        return config_finish_targets(c, ret_error);
}
