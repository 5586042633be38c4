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
 * Every key is a row of the table in config-keys.c: section, name, parser,
 * the offset of its field in Config and, for numbers, the accepted range.
 * Parsing a line is a table lookup followed by the row's parser, so adding
 * a key is adding a row.  A key is set at most once per file (in one
 * section, or in the same section opened again): a second line is an error
 * naming both lines, never a silent "last one wins".  A later file (a
 * drop-in) overrides an earlier one's value, except nvme.target, which
 * appends, any number of times (and an empty "target =" drops the targets
 * listed so far, as an empty assignment resets a list in systemd unit
 * files).
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
 * [quota] sections are the exception to the table: there may be several,
 * each one quota rule (daemon/base/quota-rule.c: a target, job, uid, user
 * or group, and some fields), kept in Config.quotas in the order read.  A
 * field is set at most once in a section; a later section of the same
 * target overrides an earlier one field by field.
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

#include "daemon/base/config-private.h"
#include "daemon/base/config.h"
#include "daemon/base/quota-rule.h"
#include "proto/macro.h"
#include "proto/utf8.h"
#include "util/escape.h"
#include "util/size.h"

/* Largest config file read; anything bigger is surely not a config file. */
#define CONFIG_FILE_MAX (1024 * 1024)

int config_error_printf(char **ret, int r, const char *fmt, ...) {
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
                .max_tensors_per_uid = 4 * 65536,     /* four full jobs: some 340 MiB of tierd's memory */
                .max_inflight = 256,
                .max_name = 255,

                .host_capacity = GIB,
                .host_segment_size = 64 * MIB,
                .numa_node = -1,
                .host_job_limit = 512 * MIB,
                .host_uid_share = CONFIG_UID_SHARE_DEFAULT,

                .vram_backend = VRAM_BACKEND_AUTO,
                .vram_capacity = GIB,
                .vram_chunk_size = 64 * MIB,
                .vram_job_limit = 512 * MIB,
                .vram_uid_share = CONFIG_UID_SHARE_DEFAULT,
                .vram_bandwidth = 0,

                .n_targets = 0,
                .nvme_extent_size = MIB,
                .nvme_queue_depth = 64,
                .nvme_checksum_threads = 1,
                .nvme_persist = true,
                .nvme_job_limit = 2 * GIB,
                .nvme_uid_share = CONFIG_UID_SHARE_DEFAULT,
                .nvme_bandwidth = 0,

                .metrics_textfile = strdup(""),
                .metrics_interval_usec = 15 * UINT64_C(1000000),
                .trace_buffer = 64 * 1024,
        };
}

void config_deinit(Config *c) {
        c->socket_path = mfree(c->socket_path);
        c->state_dir = mfree(c->state_dir);
        c->metrics_textfile = mfree(c->metrics_textfile);
        config_clear_targets(c);
        quota_rules_clear(&c->quotas);
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
                return config_error_printf(ret_error, -EINVAL, "%s:%u: [%s] %s", filename, line, section, msg);
        return config_error_printf(ret_error, -EINVAL, "%s:%u: %s", filename, line, msg);
}

/*
 * Where config_parse_text() is: the section, the [quota] section being read,
 * and the line that set each key in this file (0: not set yet), so that a
 * key set twice is refused rather than the last line silently winning.
 */
typedef struct ParseState {
        char *section;
        QuotaRule quota;        /* in [quota]: the rule so far */
        unsigned quota_line;    /* its header's line */
        unsigned quota_field_line[QUOTA_FIELDS];        /* in this [quota] section */
        unsigned key_line[CONFIG_KEYS_MAX];             /* by config_key_index() */
        size_t quota_first;     /* the first of Config.quotas this file added */
        unsigned *quota_lines;  /* the header line of each of them (at most QUOTA_RULES_MAX) */
} ParseState;

/*
 * A key given twice in one file: in one section, or in the same section
 * opened again further down.  Only a later file (a drop-in) overrides a
 * value; [nvme] target is a list, each line adds one.
 */
static int key_once(unsigned *first, const char *filename, unsigned line, const char *section,
                    const char *name, char **ret_error) {
        if (*first != 0)
                return line_error(ret_error, filename, line, section,
                                  "%s: set a second time in this file (first at line %u): remove one of the "
                                  "two lines (a key overrides an earlier value only from a later drop-in file)",
                                  name, *first);
        *first = line;
        return 0;
}

/* In a [quota] section: a field (host, weight...) given twice in it. */
static int quota_field_once(ParseState *st, const char *filename, unsigned line, const char *name,
                            char **ret_error) {
        for (int f = 0; f < QUOTA_FIELDS; f++)
                if (strcmp(name, quota_field_name(f)) == 0) {
                        if (st->quota_field_line[f] != 0)
                                return line_error(ret_error, filename, line, "quota",
                                                  "%s: set a second time in this [quota] section (first at "
                                                  "line %u): remove one of the two lines", name,
                                                  st->quota_field_line[f]);
                        st->quota_field_line[f] = line;
                }
        return 0;
}

/*
 * Two [quota] sections of one file for the same target (uid 1000 and user
 * alice are one) that set the same field: the later won silently, as a key
 * set twice did.  Sections that set different fields of it add up.
 */
static int quota_section_once(Config *c, ParseState *st, const char *filename, char **ret_error) {
        for (size_t i = st->quota_first; i < c->quotas.n; i++) {
                const QuotaRule *o = &c->quotas.rules[i];
                uint32_t both = o->set & st->quota.set;
                char t[128];

                if (!quota_rule_matches(o, st->quota.kind, st->quota.id, st->quota.job))
                        continue;
                if (o->has_owner && st->quota.has_owner) {
                        quota_target_format(st->quota.kind, st->quota.id, st->quota.job, t, sizeof(t));
                        return line_error(ret_error, filename, st->quota_line, "quota",
                                          "owner: set a second time in this file for %s (first by the [quota] "
                                          "section at line %u): remove one of the two lines, or merge the sections",
                                          t, st->quota_lines[i - st->quota_first]);
                }
                if (!both)
                        continue;
                int f = __builtin_ctz(both);
                quota_target_format(st->quota.kind, st->quota.id, st->quota.job, t, sizeof(t));
                return line_error(ret_error, filename, st->quota_field_line[f], "quota",
                                  "%s: set a second time in this file for %s (first by the [quota] section at "
                                  "line %u): remove one of the two lines, or merge the sections", quota_field_name(f), t,
                                  st->quota_lines[i - st->quota_first]);
        }
        return 0;
}

/* A [quota] section ends (another section begins, or the file ends): check it and keep it. */
static int quota_section_end(Config *c, ParseState *st, const char *filename, char **ret_error) {
        _cleanup_free_ char *why = NULL;
        int r;

        if (!st->section || strcmp(st->section, "quota") != 0)
                return 0;
        r = quota_rule_check(&st->quota, &why);
        if (r >= 0) {
                r = quota_section_once(c, st, filename, ret_error);
                if (r < 0) {
                        quota_rule_done(&st->quota);
                        return r;
                }
                size_t k = c->quotas.n - st->quota_first;
                unsigned *lines = realloc(st->quota_lines, (k + 1) * sizeof(*lines));

                if (!lines) {
                        quota_rule_done(&st->quota);
                        return -ENOMEM;
                }
                st->quota_lines = lines;
                lines[k] = st->quota_line;
                r = quota_rules_add(&c->quotas, &st->quota);
                if (r == -E2BIG)
                        return line_error(ret_error, filename, st->quota_line, "quota", "more than %u [quota] sections",
                                          QUOTA_RULES_MAX);
                return r;
        }
        quota_rule_done(&st->quota);
        if (r == -EINVAL)
                return line_error(ret_error, filename, st->quota_line, NULL, "%s", why ? why : "invalid [quota]");
        return r;
}

/*
 * Comments are whole lines: "socket = /run/x.sock # old" would be a socket
 * named "x.sock # old", bound without a word.  Numbers and names refuse the
 * "# ..." as junk anyway; a path (the CONFIG_STRING keys and nvme.target)
 * and a [quota] job name ("job = train # big one" governed a job of that
 * name, never "train") take any byte, so a blank followed by '#' or ';' in a
 * line of a file is refused there as what it surely is.  Only here, not in
 * the key's parser: a path given on the command line (config_set_key()) or a
 * job name set with tierctl quota set (and kept in the quota state file,
 * which is not read through here) has no comments.
 */
static int refuse_inline_comment(const char *value, const char *filename, unsigned line, const char *section,
                                 const char *name, char **ret_error) {
        for (const char *p = value; *p; p++)
                if ((*p == '#' || *p == ';') && p > value && (p[-1] == ' ' || p[-1] == '\t'))
                        return line_error(ret_error, filename, line, section, "%s: '%s' holds a comment: comments "
                                          "are whole lines (a '#' or ';' first), put it on a line of its own",
                                          name, value);
        return 0;
}

static int config_parse_line(Config *c, char *l, const char *filename, unsigned line,
                             ParseState *st, char **ret_error) {
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
                if (!config_section_known(s) && strcmp(s, "quota") != 0)
                        return line_error(ret_error, filename, line, NULL, "unknown section [%s]", s);
                r = quota_section_end(c, st, filename, ret_error);
                if (r < 0)
                        return r;
                s = strdup(s);
                if (!s)
                        return -ENOMEM;
                free(st->section);
                st->section = s;
                /* each [quota] section is one rule */
                st->quota = (QuotaRule) { .kind = QUOTA_DEFAULT };
                st->quota_line = line;
                memset(st->quota_field_line, 0, sizeof(st->quota_field_line));
                return 0;
        }

        eq = strchr(l, '=');
        if (!eq)
                return line_error(ret_error, filename, line, st->section,
                                  "missing '=' in '%s' (expected 'key = value')", l);
        *eq = '\0';
        name = strstrip(l);
        value = strstrip(eq + 1);

        if (name[0] == '\0')
                return line_error(ret_error, filename, line, st->section, "missing key before '='");
        if (!st->section)
                return line_error(ret_error, filename, line, NULL, "%s: key outside of any [section]", name);

        if (strcmp(st->section, "quota") == 0) {
                r = quota_field_once(st, filename, line, name, ret_error);
                if (r < 0)
                        return r;
                if (strcmp(name, "job") == 0) {
                        char flaw[UTF8_NAME_FLAW_MAX];

                        r = refuse_inline_comment(value, filename, line, st->section, name, ret_error);
                        if (r < 0)
                                return r;
                        /*
                         * No job has such a name (rpc.c refuses it), and one an older tierd took is restored
                         * under its escaped text: a rule for it would govern nothing, without a word.  (The
                         * quota state file keeps such names: quota.c renames them, quota-rule.c takes them.)
                         */
                        if (utf8_name_flaw(value, strlen(value), flaw)) {
                                _cleanup_free_ char *e = text_escape_dup(value);

                                return line_error(ret_error, filename, line, st->section, "job: the job name %s, "
                                                  "which no job has; a job an older tierd made under it is "
                                                  "restored under its escaped text, '%s' (cut with a ~hash "
                                                  "where that is too long or taken): write the name tierctl "
                                                  "jobs lists for it", flaw, e ? e : "?");
                        }
                }
                r = quota_rule_set_key(&st->quota, name, value, &why);
                if (r == -EINVAL)
                        return line_error(ret_error, filename, line, st->section, "%s: %s", name,
                                          why ? why : "invalid value");
                return r;
        }

        k = config_key_find(st->section, name);
        if (!k)
                return line_error(ret_error, filename, line, st->section, "%s: unknown key", name);
        if (k->type != CONFIG_TARGETS) {
                r = key_once(&st->key_line[config_key_index(k)], filename, line, st->section, name, ret_error);
                if (r < 0)
                        return r;
        }
        if (k->type == CONFIG_STRING || k->type == CONFIG_TARGETS) {
                r = refuse_inline_comment(value, filename, line, st->section, name, ret_error);
                if (r < 0)
                        return r;
        }

        r = k->parse(c, k, value, (uint8_t *) c + k->offset, &why);
        if (r == -EINVAL)
                return line_error(ret_error, filename, line, st->section, "%s: %s", name,
                                  why ? why : "invalid value");
        return r;
}

int config_set_key(Config *c, const char *section, const char *name, const char *value, const char *origin,
                   char **ret_error) {
        _cleanup_free_ char *why = NULL;
        const ConfigKey *k = config_key_find(section, name);
        int r;

        if (ret_error)
                *ret_error = NULL;
        if (!k)
                return config_error_printf(ret_error, -EINVAL, "%s: [%s] %s: unknown key", origin, section, name);
        r = k->parse(c, k, value, (uint8_t *) c + k->offset, &why);
        if (r == -EINVAL)
                return config_error_printf(ret_error, -EINVAL, "%s: [%s] %s: %s", origin, section, name,
                                           why ? why : "invalid value");
        return r;
}

int config_parse_text(Config *c, const char *text, const char *filename, char **ret_error) {
        _cleanup_free_ char *copy = NULL;
        ParseState st = {};
        char *l, *next;
        unsigned line = 0;
        int r = 0;

        if (ret_error)
                *ret_error = NULL;
        if (!filename)
                filename = "(config)";

        /* invisible in an editor, it made line 1 "missing '=' in '[daemon]'" */
        if (strncmp(text, "\xEF\xBB\xBF", 3) == 0)
                return line_error(ret_error, filename, 1, NULL, "the file starts with a UTF-8 byte order mark "
                                  "(U+FEFF): save it without one");

        copy = strdup(text);
        if (!copy)
                return -ENOMEM;
        st.quota_first = c->quotas.n;

        for (l = copy; l; l = next) {
                next = strchr(l, '\n');
                if (next)
                        *next++ = '\0';
                line++;

                r = config_parse_line(c, l, filename, line, &st, ret_error);
                if (r < 0)
                        break;
        }
        if (r >= 0)
                r = quota_section_end(c, &st, filename, ret_error);
        else if (st.section && strcmp(st.section, "quota") == 0)
                quota_rule_done(&st.quota);
        free(st.section);
        free(st.quota_lines);
        return r;
}

/* ---- files ------------------------------------------------------------ */

/*
 * Read all of @path (at most CONFIG_FILE_MAX bytes) as a string.  -ENOENT for
 * a missing file (or dangling link), -EISDIR for a directory, -EFBIG when too
 * big, -EBADMSG when it contains a NUL byte, -EBADFD for a FIFO, a socket or
 * a block device.  Character devices are fine, so /dev/null (a drop-in linked
 * to it, as systemd masks one) works as "an empty config".  Opened
 * O_NONBLOCK, so neither the open (a FIFO with no writer) nor a read (a
 * terminal, a FIFO) can block: this runs on the event loop at SIGHUP.
 */
static int read_config_file(int dir_fd, const char *path, char **ret) {
        _cleanup_close_ int fd = -1;
        _cleanup_free_ char *buf = NULL;
        size_t size = 0, alloc = 0;
        struct stat st;

        fd = openat(dir_fd, path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0)
                return negative_errno();
        if (fstat(fd, &st) < 0)
                return negative_errno();
        if (S_ISDIR(st.st_mode))
                return -EISDIR;
        if (!S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode))
                return -EBADFD;

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
        case -EBADFD:
                return "not a regular file (a FIFO, socket or block device): refused";
        case -EAGAIN:
                return "a device with nothing to read (a config must be a regular file or /dev/null)";
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
                return config_error_printf(ret_error, r, "%s: %s", display, read_error_reason(r));
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
                struct stat st;

                r = negative_errno();
                /* PATH.d itself a file (say "cat > tierd.conf.d"): its keys would be ignored without a word */
                if (r == -ENOTDIR && stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))
                        return config_error_printf(ret_error, -ENOTDIR, "%s: not a directory: drop-ins are files "
                                                   "NAME.conf in a directory of this name (move the file into one)",
                                                   dir);
                if (r == -ENOENT || r == -ENOTDIR)
                        return 0;
                return config_error_printf(ret_error, r, "%s: %s", dir, strerror(-r));
        }

        n = scandirat(dir_fd, ".", &list, conf_filter, conf_compare);
        if (n < 0) {
                r = negative_errno();
                return config_error_printf(ret_error, r, "%s: %s", dir, strerror(-r));
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
        bool found = true;
        int r;

        if (ret_error)
                *ret_error = NULL;

        config_init(c);

        r = config_apply_file(c, AT_FDCWD, path, path, ret_error);
        if (r == -ENOENT && !must_exist) {
                if (ret_error)
                        *ret_error = mfree(*ret_error);
                found = false;
                r = 0;
        }
        if (r >= 0)
                r = config_apply_dropins(c, path, ret_error);
        if (r < 0) {
                config_deinit(c);
                return r;
        }
        return found;
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
#define finish_error(ret_error, ...) config_error_printf(ret_error, -EINVAL, __VA_ARGS__)

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
                        size_format_exact(s, sizeof(s), t->size);
                        size_format_exact(e, sizeof(e), c->nvme_extent_size);
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

/*
 * tierd replaces the metrics file every interval_sec (rename over it): a
 * mistyped path naming one of its own files (STATE_DIR/quotas, the wear
 * book, a target, tierd.conf) would be replaced without a word.  What
 * node_exporter reads ends in .prom, and none of those do.
 */
static int config_finish_metrics(const Config *c, char **ret_error) {
        const char *p = c->metrics_textfile, *base = strrchr(p, '/');
        size_t n = strlen(p);

        if (n == 0)
                return 0;
        if (n < 6 || strcmp(p + n - 5, ".prom") != 0 || (base && strcmp(base, "/.prom") == 0))
                return finish_error(ret_error,
                                    "[metrics] textfile: '%s' does not end in .prom: node_exporter's textfile "
                                    "collector reads only NAME.prom, and tierd replaces the file every "
                                    "interval_sec (give a file of its own in the collector's directory)", p);
        for (size_t i = 0; i < c->n_targets; i++)
                if (strcmp(c->targets[i].path, p) == 0)
                        return finish_error(ret_error, "[metrics] textfile: '%s' is also an [nvme] target", p);
        return 0;
}

int config_finish(Config *c, char **ret_error) {
        char a[32], b[32];
        int r;

        if (ret_error)
                *ret_error = NULL;

        if (!c->socket_path || !c->state_dir || !c->metrics_textfile)
                return -ENOMEM;

        /* [host] */
        if (c->host_segment_size == 0 || c->host_segment_size % CONFIG_ALIGN != 0) {
                size_format_exact(a, sizeof(a), c->host_segment_size);
                return finish_error(ret_error, "[host] segment_size: %s is not a positive multiple of 4K",
                                    a);
        }
        if (c->host_segment_size > CONFIG_SEGMENT_MAX) {
                size_format_exact(a, sizeof(a), c->host_segment_size);
                return finish_error(ret_error,
                                    "[host] segment_size: %s exceeds 1G (io_uring fixed buffer limit)", a);
        }
        if (c->host_segment_size > c->host_capacity) {
                size_format_exact(a, sizeof(a), c->host_segment_size);
                size_format_exact(b, sizeof(b), c->host_capacity);
                return finish_error(ret_error, "[host] segment_size: %s is larger than capacity %s", a, b);
        }
        if (c->host_capacity % c->host_segment_size != 0) {
                size_format_exact(a, sizeof(a), c->host_capacity);
                size_format_exact(b, sizeof(b), c->host_segment_size);
                return finish_error(ret_error,
                                    "[host] capacity: %s is not a multiple of segment_size %s", a, b);
        }
        if (c->nvme_extent_size != 0 && c->host_segment_size % c->nvme_extent_size != 0) {
                /* an extent is read into, or written from, one place of one segment */
                size_format_exact(a, sizeof(a), c->host_segment_size);
                size_format_exact(b, sizeof(b), c->nvme_extent_size);
                return finish_error(ret_error, "[host] segment_size: %s is not a multiple of [nvme] extent_size %s",
                                    a, b);
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
                size_format_exact(a, sizeof(a), c->vram_chunk_size);
                return finish_error(ret_error, "[vram] chunk_size: %s is not a positive multiple of 4K", a);
        }
        if (c->vram_capacity != 0 && c->vram_chunk_size > c->vram_capacity) {      /* 0: as the device allows */
                size_format_exact(a, sizeof(a), c->vram_chunk_size);
                size_format_exact(b, sizeof(b), c->vram_capacity);
                return finish_error(ret_error, "[vram] chunk_size: %s is larger than capacity %s", a, b);
        }
        if (c->vram_capacity % c->vram_chunk_size != 0) {
                /* the pool is whole chunks: the rest would be dropped without a word */
                size_format_exact(a, sizeof(a), c->vram_capacity);
                size_format_exact(b, sizeof(b), c->vram_chunk_size);
                return finish_error(ret_error, "[vram] capacity: %s is not a multiple of chunk_size %s", a, b);
        }
        if (c->vram_job_limit == 0)
                return finish_error(ret_error, "[vram] job_limit: must be positive");

        /* [nvme] */
        if (!is_power_of_2(c->nvme_extent_size) || c->nvme_extent_size < CONFIG_ALIGN ||
            c->nvme_extent_size > CONFIG_EXTENT_MAX) {
                size_format_exact(a, sizeof(a), c->nvme_extent_size);
                return finish_error(ret_error, "[nvme] extent_size: %s is not a power of two in 4K..64M", a);
        }
        if (c->nvme_queue_depth < 1 || c->nvme_queue_depth > 4096)
                return finish_error(ret_error, "[nvme] queue_depth: %u is out of range (1..4096)",
                                    c->nvme_queue_depth);
        if (c->nvme_job_limit == 0)
                return finish_error(ret_error, "[nvme] job_limit: must be positive");

        r = config_finish_targets(c, ret_error);
        if (r < 0)
                return r;
        return config_finish_metrics(c, ret_error);
}
