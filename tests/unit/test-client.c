/* SPDX-License-Identifier: MIT */
/* test-client.c: unit tests of libtier that need no daemon. */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cmocka.h>

#include <tier.h>

#include "client/client-internal.h"
#include "client/tier-private.h"
#include "proto/tier.pb-c.h"
#include "tests/unit/screen-columns.h"

/* ---- names and error texts ---------------------------------------------------------- */

static void test_strerror(void **state) {
        assert_string_equal(tier_strerror(-ENOENT), "No such file or directory");
        assert_string_equal(tier_strerror(ENOENT), "No such file or directory");
        assert_string_equal(tier_strerror(-ESHUTDOWN), "Cannot send after transport endpoint shutdown");
        assert_string_equal(tier_strerror(0), "Success");
        assert_non_null(strstr(tier_strerror(-123456), "Unknown error"));
        assert_non_null(strstr(tier_strerror(-123456), "-123456"));
        assert_non_null(tier_strerror(INT_MIN));
}

static void test_level_names(void **state) {
        assert_string_equal(tier_level_name(TIER_VRAM), "vram");
        assert_string_equal(tier_level_name(TIER_HOST), "host");
        assert_string_equal(tier_level_name(TIER_NVME), "nvme");
        assert_null(tier_level_name(-1));
        assert_null(tier_level_name(TIER_LEVEL_MAX));

        for (int i = 0; i < TIER_LEVEL_MAX; i++)
                assert_int_equal(tier_level_from_name(tier_level_name(i)), i);
        assert_int_equal(tier_level_from_name("VRAM"), -EINVAL);
        assert_int_equal(tier_level_from_name(""), -EINVAL);
        assert_int_equal(tier_level_from_name("hostx"), -EINVAL);
        assert_int_equal(tier_level_from_name(NULL), -EINVAL);
}

/* ---- argument checks ------------------------------------------------------------------ */

static void test_einval(void **state) {
        tier_client *c = NULL;
        struct tier_grant g;
        struct tier_stat st;
        tier_tensor *t = NULL;
        tier_fence f;
        char *text;

        assert_int_equal(tier_client_new("/nonexistent", "job", 0, NULL), -EINVAL);
        /* a C1 control (U+009B, a terminal's CSI) is refused before connecting, as C0 ones are (was -ENOENT) */
        assert_int_equal(tier_client_new("/nonexistent", "evil\xc2\x9b" "31m", 0, &c), -EINVAL);
        assert_int_equal(tier_client_new("/nonexistent", "caf\xc3\xa9", 0, &c), -ENOENT);
        assert_null(c);
        assert_null(tier_client_free(NULL));
        assert_string_equal(tier_client_vram_backend(NULL), "");
        assert_int_equal(tier_client_limit(NULL, TIER_HOST), 0);
        assert_int_equal(tier_client_fd(NULL), -EINVAL);

        assert_int_equal(tier_tensor_create(NULL, "x", 1, &t), -EINVAL);
        assert_int_equal(tier_tensor_open(NULL, "x", &t), -EINVAL);
        assert_int_equal(tier_tensor_destroy(NULL), -EINVAL);
        assert_null(tier_tensor_close(NULL));
        assert_int_equal(tier_tensor_size(NULL), 0);
        assert_null(tier_tensor_name(NULL));
        assert_int_equal(tier_tensor_stat(NULL, &st), -EINVAL);

        assert_int_equal(tier_pin(NULL, TIER_HOST, TIER_READ_WRITE, &g), -EINVAL);
        assert_int_equal(tier_pin_async(NULL, TIER_HOST, TIER_READ_WRITE, &g, &f), -EINVAL);
        assert_int_equal(tier_unpin(NULL, TIER_HOST, 0), -EINVAL);
        assert_int_equal(tier_evict(NULL, TIER_NVME), -EINVAL);
        assert_int_equal(tier_evict_async(NULL, TIER_NVME, &f), -EINVAL);
        assert_int_equal(tier_prefetch(NULL, TIER_HOST), -EINVAL);
        assert_int_equal(tier_prefetch_async(NULL, TIER_HOST, &f), -EINVAL);

        assert_int_equal(tier_fence_done(NULL, 1), -EINVAL);
        assert_int_equal(tier_fence_wait(NULL, 1, 0), -EINVAL);
        assert_int_equal(tier_client_status(NULL, TIER_STATUS_JSON, &text), -EINVAL);
}

static void test_connect_fails(void **state) {
        tier_client *c = NULL;
        char path[200];

        assert_int_equal(tier_client_new("/nonexistent/tierd.sock", "job", 0, &c), -ENOENT);
        assert_null(c);
        assert_string_equal(tier_client_last_error(NULL),
                            "cannot connect to /nonexistent/tierd.sock: No such file or directory "
                            "(is tierd running?)");

        /* $TIER_SOCKET is used when no path is given */
        assert_int_equal(setenv("TIER_SOCKET", "/nonexistent/env.sock", 1), 0);
        assert_int_equal(tier_client_new(NULL, NULL, 0, &c), -ENOENT);
        assert_non_null(strstr(tier_client_last_error(NULL), "/nonexistent/env.sock"));
        assert_int_equal(unsetenv("TIER_SOCKET"), 0);

        memset(path, 'x', sizeof(path) - 1);
        path[0] = '/';
        path[sizeof(path) - 1] = 0;
        assert_int_equal(tier_client_new(path, "job", 0, &c), -ENAMETOOLONG);

        /* job names are text: checked before connecting */
        assert_int_equal(tier_client_new("/nonexistent/tierd.sock", "bad\njob", 0, &c), -EINVAL);
        assert_non_null(strstr(tier_client_last_error(NULL), "job name"));
        assert_null(c);
}

/*
 * A name with control characters, or not UTF-8, is refused before anything
 * reaches tierd, saying the escaped text a job or tensor an older tierd made
 * under it was restored under (util/escape.c, as tierd's own refusal says
 * it): it said only that the name was refused.  One too long to say in
 * last_error (CLIENT_ERROR_MAX) is not cut: a cut name is no job's.
 */
static void test_name_refusal_says_escaped_name(void **state) {
        tier_client c = { .fd = -1, .event_fd = -1 }, *p = NULL;
        struct tier_tensor_info *info = NULL;
        tier_tensor *t = NULL;
        size_t n = 0;
        char longname[301];

        assert_int_equal(tier_client_new("/nonexistent", "evil\xc2\x9b" "31m", 0, &p), -EINVAL);
        assert_string_equal(tier_client_last_error(NULL),
                            "job name contains control characters; a job an older tierd made under such a name was "
                            "restored under its escaped text, 'evil\\u009b31m' (tierctl jobs lists the name it was "
                            "restored under, if any)");
        /* a bidirectional format character, named by its code point (it was taken: -ENOENT, no tierd) */
        assert_int_equal(tier_client_new("/nonexistent", "abc\xe2\x80\xae" "gpj.exe", 0, &p), -EINVAL);
        assert_string_equal(tier_client_last_error(NULL),
                            "job name contains the bidirectional format character U+202E; a job an older tierd made "
                            "under such a name was restored under its escaped text, 'abc\\u202egpj.exe' (tierctl jobs "
                            "lists the name it was restored under, if any)");
        assert_int_equal(tier_tensor_create(&c, "w\xe2\x81\xa9", 1, &t), -EINVAL);
        assert_non_null(strstr(tier_client_last_error(&c), "tensor name contains the bidirectional format character "
                                                          "U+2069; "));
        assert_non_null(strstr(tier_client_last_error(&c), ", 'w\\u2069' (tierctl tensors JOB"));
        assert_int_equal(tier_client_new("/nonexistent", "a\xff" "b", 0, &p), -EINVAL);
        assert_non_null(strstr(tier_client_last_error(NULL), "job name is not valid UTF-8; "));
        assert_non_null(strstr(tier_client_last_error(NULL), ", 'a\\xffb' (tierctl jobs"));

        assert_int_equal(tier_tensor_create(&c, "w\x1b[2J", 1, &t), -EINVAL);
        assert_string_equal(tier_client_last_error(&c),
                            "tensor name contains control characters; a tensor an older tierd made under such a name "
                            "was restored under its escaped text, 'w\\u001b[2J' (tierctl tensors JOB lists the name "
                            "it was restored under, if any)");
        assert_int_equal(tier_tensor_open(&c, "", &t), -EINVAL);
        assert_string_equal(tier_client_last_error(&c), "tensor name is empty");
        assert_int_equal(tier_job_tensors(&c, "j\x7f", &info, &n), -EINVAL);
        assert_non_null(strstr(tier_client_last_error(&c), "job name contains control characters; "));
        assert_non_null(strstr(tier_client_last_error(&c), ", 'j\\u007f' (tierctl jobs"));

        /* 1800 bytes escaped: not said, nor cut */
        memset(longname, '\x01', sizeof(longname) - 1);
        longname[sizeof(longname) - 1] = 0;
        assert_int_equal(tier_tensor_open(&c, longname, &t), -EINVAL);
        assert_non_null(strstr(tier_client_last_error(&c), "its escaped text, too long to say here (tierctl tensors"));
        assert_null(strstr(tier_client_last_error(&c), "\\u0001"));
        assert_null(p);
        assert_null(t);
        assert_null(info);
}

/* ---- status formatting ---------------------------------------------------------------- */

/* A StatusReply on the stack, with room for the test's entries. */
typedef struct FakeStatus {
        Tier__StatusReply s;
        Tier__TierStatus tiers[3], *tiers_p[3];
        Tier__LinkStatus links[2], *links_p[2];
        Tier__TargetStatus target, *target_p[1];
        Tier__JobStatus jobs[2], *jobs_p[2];
        Tier__JobTierUsage usage[2], *usage_p[2];
} FakeStatus;

static void fake_status(FakeStatus *f, const char *vram_backend) {
        static const char *const backends[] = { NULL, "memfd", "file" };

        tier__status_reply__init(&f->s);
        f->s.version = (char *) "0.1.0";
        f->s.uptime_s = 3723.25;
        f->s.connections = 2;

        for (int i = 0; i < 3; i++) {
                tier__tier_status__init(&f->tiers[i]);
                f->tiers[i].tier = (Tier__Tier) i;
                f->tiers[i].backend = (char *) (i == 0 ? vram_backend : backends[i]);
                f->tiers_p[i] = &f->tiers[i];
        }
        f->tiers[0].capacity = 8ull << 30;
        f->tiers[0].used = 512ull << 20;
        f->tiers[0].pinned = 256ull << 20;
        f->tiers[0].bandwidth = 1000000000;    /* [vram] bandwidth */
        f->tiers[1].capacity = 64ull << 30;
        f->tiers[1].used = 16ull << 30;
        f->tiers[2].capacity = 2ull << 40;
        f->tiers[2].used = 100ull << 30;
        f->s.n_tiers = 3;
        f->s.tiers = f->tiers_p;

        tier__link_status__init(&f->links[0]);
        f->links[0].name = (char *) "host->nvme";
        f->links[0].bytes = 1ull << 30;
        f->links[0].ops = 64;
        tier__link_status__init(&f->links[1]);
        f->links[1].name = (char *) "nvme->host";
        f->links[1].bytes = 3ull << 29;
        f->links[1].ops = 96;
        f->links_p[0] = &f->links[0];
        f->links_p[1] = &f->links[1];
        f->s.n_links = 2;
        f->s.links = f->links_p;

        tier__target_status__init(&f->target);
        f->target.path = (char *) "/dev/nvme0n1";
        f->target.capacity = 2ull << 40;
        f->target.used = 100ull << 30;
        f->target.bytes_written = 5ull << 30;
        f->target.bytes_read = 7ull << 30;
        f->target.crc_errors = 1;
        f->target.io_errors = 2;
        f->target_p[0] = &f->target;
        f->s.n_targets = 1;
        f->s.targets = f->target_p;

        for (int i = 0; i < 2; i++) {
                tier__job_tier_usage__init(&f->usage[i]);
                f->usage_p[i] = &f->usage[i];
        }
        f->usage[0].tier = TIER__TIER__TIER_HOST;
        f->usage[0].used = 1ull << 30;
        f->usage[0].limit = 4ull << 30;
        f->usage[0].pinned = 1ull << 20;
        f->usage[1].tier = TIER__TIER__TIER_NVME;
        f->usage[1].used = 3ull << 30;
        f->usage[1].limit = 0;

        tier__job_status__init(&f->jobs[0]);
        f->jobs[0].id = 1;
        f->jobs[0].name = (char *) "llama";
        f->jobs[0].uid = 1000;
        f->jobs[0].connections = 2;
        f->jobs[0].tensors = 300;
        f->jobs[0].n_usage = 2;
        f->jobs[0].usage = f->usage_p;
        f->jobs[0].n_moved = 2;
        f->jobs[0].moved = f->links_p;          /* this job moved all there was */
        f->jobs[0].plan_iterations = 7;         /* its ranks' steps, all its plans */
        f->jobs[0].plan_stall_s = 1.5;
        tier__job_status__init(&f->jobs[1]);
        f->jobs[1].id = 2;
        f->jobs[1].name = (char *) "idle";
        f->jobs[1].uid = 0;
        f->jobs[1].linger_left_s = 12.5;
        f->jobs[1].lingering = 1;
        f->jobs[1].nvme_host_changed = 3;       /* it wrote its tensors while tierd wrote them to NVMe */
        f->jobs[1].nvme_crc_errors = 2;         /* its tensors failed their checksums when read back */
        f->jobs_p[0] = &f->jobs[0];
        f->jobs_p[1] = &f->jobs[1];
        f->s.n_jobs = 2;
        f->s.jobs = f->jobs_p;
}

static void test_status_json(void **state) {
        FakeStatus f;
        char *out = NULL;

        fake_status(&f, "emulated");
        assert_int_equal(status_format(&f.s, TIER_STATUS_JSON, &out), 0);
        assert_string_equal(out,
                "{\"version\":\"0.1.0\",\"uptime_s\":3723.25,\"connections\":2,\"policy\":\"\","
                "\"tiers\":["
                "{\"tier\":\"vram\",\"backend\":\"emulated\",\"capacity\":8589934592,\"used\":536870912,"
                "\"pinned\":268435456,\"segment_size\":0,\"held\":0,\"bandwidth\":1000000000,\"renewing\":0,\"reserved\":0},"
                "{\"tier\":\"host\",\"backend\":\"memfd\",\"capacity\":68719476736,\"used\":17179869184,"
                "\"pinned\":0,\"segment_size\":0,\"held\":0,\"bandwidth\":0,\"renewing\":0,\"reserved\":0},"
                "{\"tier\":\"nvme\",\"backend\":\"file\",\"capacity\":2199023255552,\"used\":107374182400,"
                "\"pinned\":0,\"segment_size\":0,\"held\":0,\"bandwidth\":0,\"renewing\":0,\"reserved\":0}],"
                "\"links\":["
                "{\"name\":\"host->nvme\",\"bytes\":1073741824,\"ops\":64},"
                "{\"name\":\"nvme->host\",\"bytes\":1610612736,\"ops\":96}],"
                "\"targets\":["
                "{\"path\":\"/dev/nvme0n1\",\"capacity\":2199023255552,\"used\":107374182400,"
                "\"bytes_written\":5368709120,\"bytes_read\":7516192768,\"crc_errors\":1,\"io_errors\":2,"
                "\"wear_written\":0,\"smart\":{\"device\":\"\",\"na\":\"not read yet\"}}],"
                "\"jobs\":["
                "{\"id\":1,\"name\":\"llama\",\"uid\":1000,\"connections\":2,\"tensors\":300,\"lingering\":false,\"linger_left_s\":0,\"weight\":0,"
                "\"nvme_written\":0,\"wear_written\":0,\"nvme_host_changed\":0,\"nvme_crc_errors\":0,"
                "\"plan_iterations\":7,\"plan_stall_s\":1.5,"
                "\"usage\":{\"vram\":{\"used\":0,\"limit\":0,\"pinned\":0,\"tensor_max\":0,\"guarantee\":0,\"share\":0,\"reserved\":0},"
                "\"host\":{\"used\":1073741824,\"limit\":4294967296,\"pinned\":1048576,\"tensor_max\":0,\"guarantee\":0,\"share\":0,\"reserved\":0},"
                "\"nvme\":{\"used\":3221225472,\"limit\":0,\"pinned\":0,\"tensor_max\":0,\"guarantee\":0,\"share\":0,\"reserved\":0}},"
                "\"moved\":{\"host->nvme\":1073741824,\"nvme->host\":1610612736},\"plans\":[]},"
                "{\"id\":2,\"name\":\"idle\",\"uid\":0,\"connections\":0,\"tensors\":0,\"lingering\":true,\"linger_left_s\":12.5,\"weight\":0,"
                "\"nvme_written\":0,\"wear_written\":0,\"nvme_host_changed\":3,\"nvme_crc_errors\":2,"
                "\"plan_iterations\":0,\"plan_stall_s\":0,"
                "\"usage\":{\"vram\":{\"used\":0,\"limit\":0,\"pinned\":0,\"tensor_max\":0,\"guarantee\":0,\"share\":0,\"reserved\":0},"
                "\"host\":{\"used\":0,\"limit\":0,\"pinned\":0,\"tensor_max\":0,\"guarantee\":0,\"share\":0,\"reserved\":0},"
                "\"nvme\":{\"used\":0,\"limit\":0,\"pinned\":0,\"tensor_max\":0,\"guarantee\":0,\"share\":0,\"reserved\":0}},\"moved\":{},\"plans\":[]}]}\n");
        free(out);
}

static void test_status_json_empty(void **state) {
        Tier__StatusReply s = TIER__STATUS_REPLY__INIT;
        char *out = NULL;

        assert_int_equal(status_format(&s, TIER_STATUS_JSON, &out), 0);
        assert_string_equal(out, "{\"version\":\"\",\"uptime_s\":0,\"connections\":0,\"policy\":\"\","
                                 "\"tiers\":[],\"links\":[],\"targets\":[],\"jobs\":[]}\n");
        free(out);
}

static void test_status_json_escaping(void **state) {
        Tier__StatusReply s = TIER__STATUS_REPLY__INIT;
        char *out = NULL;

        /* quote, backslash, control characters, valid UTF-8 (é, €, 😀), then invalid bytes:
         * a stray continuation byte, a truncated sequence, an overlong '/', a surrogate, 0xff */
        s.version = (char *) "a\"b\\c\nd\te\x01\x1f\x7f|\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80|"
                             "\x80|\xe2\x82|\xc0\xaf|\xed\xa0\x80|\xff";
        s.uptime_s = 0.0004;
        assert_int_equal(status_format(&s, TIER_STATUS_JSON, &out), 0);
        assert_string_equal(out,
                "{\"version\":\"a\\\"b\\\\c\\nd\\te\\u0001\\u001f\\u007f|\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80|"
                "\\ufffd|\\ufffd\\ufffd|\\ufffd\\ufffd|\\ufffd\\ufffd\\ufffd|\\ufffd\","
                "\"uptime_s\":0,\"connections\":0,\"policy\":\"\",\"tiers\":[],\"links\":[],\"targets\":[],\"jobs\":[]}\n");
        free(out);
}

/* Seconds: at most 3 decimals, in full however large; non-finite (never sent by tierd) is null. */
static void test_status_json_numbers(void **state) {
        Tier__StatusReply s = TIER__STATUS_REPLY__INIT;
        char *out = NULL;

        s.uptime_s = 1e16 + 2;
        assert_int_equal(status_format(&s, TIER_STATUS_JSON, &out), 0);
        assert_non_null(strstr(out, "\"uptime_s\":10000000000000002,"));
        free(out);

        s.uptime_s = -0.0004;
        assert_int_equal(status_format(&s, TIER_STATUS_JSON, &out), 0);
        assert_non_null(strstr(out, "\"uptime_s\":0,"));
        free(out);

        s.uptime_s = 0.0125;
        assert_int_equal(status_format(&s, TIER_STATUS_JSON, &out), 0);
        assert_non_null(strstr(out, "\"uptime_s\":0.013,"));
        free(out);

        s.uptime_s = NAN;
        assert_int_equal(status_format(&s, TIER_STATUS_JSON, &out), 0);
        assert_non_null(strstr(out, "\"uptime_s\":null,"));
        free(out);
}

/* The lines of the block that starts with @header, up to the next empty line. */
static size_t block_lines(const char *text, const char *header, char lines[][256], size_t max) {
        const char *p = strstr(text, header);
        size_t n = 0;

        assert_non_null(p);
        while (*p && *p != '\n' && n < max) {
                const char *e = strchr(p, '\n');

                assert_non_null(e);
                assert_true((size_t) (e - p) < 256);
                memcpy(lines[n], p, (size_t) (e - p));
                lines[n][e - p] = 0;
                n++;
                p = e + 1;
        }
        return n;
}

static void test_status_table(void **state) {
        char lines[8][256];
        FakeStatus f;
        char *out = NULL;
        size_t n;

        fake_status(&f, "emulated");
        assert_int_equal(status_format(&f.s, TIER_STATUS_TABLE, &out), 0);

        assert_non_null(strstr(out, "tierd 0.1.0, up 1h 02m 03s, 2 connections\n"));
        assert_non_null(strstr(out, "512.0 MiB"));
        assert_non_null(strstr(out, "(emulated)"));
        assert_non_null(strstr(out, "EMULATED"));
        assert_non_null(strstr(out, "/dev/nvme0n1"));
        assert_non_null(strstr(out, "1.0 GiB / 4.0 GiB"));
        assert_non_null(strstr(out, "3.0 GiB / -"));
        assert_non_null(strstr(out, "12s left"));      /* the lingering job */
        assert_non_null(strstr(out, " WEIGHT "));
        assert_non_null(strstr(out, "  job idle: wrote the host copy of 3 extent(s) while tierd wrote them to "
                                    "NVMe (those write-downs failed; the client's doing, not the drive's)\n"));
        assert_non_null(strstr(out, "  job idle: 2 extent(s) of its tensors failed their crc32c when read back "
                                    "from NVMe (counted in the target's crc errors too)\n"));

        /* Tier rows end in a right-aligned column: aligned rows have equal length. */
        n = block_lines(out, "TIER ", lines, 8);
        assert_int_equal(n, 6);         /* header, 3 tiers, 2 warning lines */
        assert_int_equal(strlen(lines[1]), strlen(lines[0]));
        assert_int_equal(strlen(lines[2]), strlen(lines[0]));
        assert_int_equal(strlen(lines[3]), strlen(lines[0]));
        /* right-aligned: a value ends where its header ends */
        assert_int_equal(strstr(lines[0], "CAPACITY") - lines[0] + strlen("CAPACITY"),
                         strstr(lines[1], "8.0 GiB") - lines[1] + strlen("8.0 GiB"));
        assert_non_null(strstr(lines[1], "vram  (emulated)"));
        assert_non_null(strstr(lines[1], "6.3%"));

        n = block_lines(out, "JOB ", lines, 8);
        assert_int_equal(n, 3);
        assert_int_equal(strlen(lines[1]), strlen(lines[0]));
        assert_int_equal(strlen(lines[2]), strlen(lines[0]));
        free(out);

        /* A real GPU backend is not flagged. */
        fake_status(&f, "cuda");
        assert_int_equal(status_format(&f.s, TIER_STATUS_TABLE, &out), 0);
        assert_null(strstr(out, "emulated"));
        assert_null(strstr(out, "EMULATED"));
        assert_non_null(strstr(out, "vram  cuda"));
        free(out);
}

/*
 * The NVMe room kept for guarantees (nvme_min): an operator saw free NVMe room in the table while other
 * jobs' placements failed naming guarantees.  Shown per tier (RESERVED, --json "reserved"), and per job.
 */
static void test_status_reserved(void **state) {
        char lines[8][256];
        FakeStatus f;
        char *out = NULL;
        size_t n;

        fake_status(&f, "cuda");
        f.tiers[2].reserved = 96ull << 20;
        f.usage[1].reserved = 96ull << 20;     /* llama's unused nvme_min */
        assert_int_equal(status_format(&f.s, TIER_STATUS_JSON, &out), 0);
        assert_non_null(strstr(out, "\"tier\":\"nvme\",\"backend\":\"file\",\"capacity\":2199023255552,"
                                    "\"used\":107374182400,\"pinned\":0,\"segment_size\":0,\"held\":0,"
                                    "\"bandwidth\":0,\"renewing\":0,\"reserved\":100663296}"));
        assert_non_null(strstr(out, "\"nvme\":{\"used\":3221225472,\"limit\":0,\"pinned\":0,\"tensor_max\":0,"
                                    "\"guarantee\":0,\"share\":0,\"reserved\":100663296}"));
        free(out);

        assert_int_equal(status_format(&f.s, TIER_STATUS_TABLE, &out), 0);
        n = block_lines(out, "TIER ", lines, 8);
        assert_int_equal(n, 5);         /* header, 3 tiers, the reservation */
        assert_non_null(strstr(lines[0], " RESERVED "));
        /* right-aligned under its header; "-" where a guarantee is no reservation */
        assert_int_equal(strstr(lines[0], "RESERVED") - lines[0] + strlen("RESERVED"),
                         strstr(lines[3], "96.0 MiB") - lines[3] + strlen("96.0 MiB"));
        assert_int_equal(strstr(lines[0], "RESERVED") - lines[0] + strlen("RESERVED"),
                         strstr(lines[1], "-  ") - lines[1] + 1);
        assert_string_equal(lines[4], "nvme: 96.0 MiB of the 1.9 TiB free is reserved for the NVMe guarantees "
                                      "(nvme_min) jobs do not use yet; other jobs' copies get only the rest: "
                                      "llama 96.0 MiB");
        free(out);

        /* nothing reserved: no line, and the column says 0 B */
        f.tiers[2].reserved = 0;
        assert_int_equal(status_format(&f.s, TIER_STATUS_TABLE, &out), 0);
        assert_null(strstr(out, "is reserved"));
        n = block_lines(out, "TIER ", lines, 8);
        assert_int_equal(n, 4);
        assert_non_null(strstr(lines[3], " 0 B "));
        free(out);
}

/*
 * A job name with control characters (one an older tierd restored from the
 * NVMe index: C1, or C0) never reaches the output raw: escaped in the table,
 * its wear and reservation lines, and in the JSON; valid non-ASCII names are
 * printed as they are.
 */
static void test_status_escapes_names(void **state) {
        static const char evil[] = "evil\xc2\x9b" "31m\x1b[2J\x7f";
        static const char cafe[] = "caf\xc3\xa9-\xe5\xad\xa6-\xf0\x9f\x98\x80";
        FakeStatus f;
        char *out = NULL;

        fake_status(&f, "emulated");
        f.jobs[0].name = (char *) evil;
        f.jobs[0].nvme_crc_errors = 1;
        f.jobs[1].name = (char *) cafe;
        f.tiers[2].reserved = 96ull << 20;
        f.usage[1].reserved = 96ull << 20;
        for (int k = 0; k < 2; k++) {
                assert_int_equal(status_format(&f.s, k ? TIER_STATUS_JSON : TIER_STATUS_TABLE, &out), 0);
                assert_null(strchr(out, '\x1b'));
                assert_null(strchr(out, '\x7f'));
                assert_null(strstr(out, "\xc2\x9b"));
                assert_non_null(strstr(out, "evil\\u009b31m\\u001b[2J\\u007f"));
                assert_non_null(strstr(out, cafe));
                if (!k) {
                        assert_non_null(strstr(out, "\n  job evil\\u009b31m\\u001b[2J\\u007f: 1 extent(s)"));
                        assert_non_null(strstr(out, "the rest: evil\\u009b31m\\u001b[2J\\u007f 96.0 MiB\n"));
                        assert_non_null(strstr(out, "\n  job caf\xc3\xa9-"));
                }
                free(out);
        }
}

/*
 * A job name with bidirectional format characters (from an older tierd: U+202E RLO, U+2066 LRI) is escaped in
 * the table and the JSON as controls are: printed raw, "abc<RLO>gpj.exe" reads "abcexe.jpg" and reorders the
 * rest of its row.
 */
static void test_status_escapes_bidi_names(void **state) {
        FakeStatus f;
        char *out = NULL;

        fake_status(&f, "emulated");
        f.jobs[0].name = (char *) "abc\xe2\x80\xae" "gpj.exe";
        f.jobs[1].name = (char *) "\xe2\x81\xa6" "b";
        for (int k = 0; k < 2; k++) {
                assert_int_equal(status_format(&f.s, k ? TIER_STATUS_JSON : TIER_STATUS_TABLE, &out), 0);
                assert_null(strstr(out, "\xe2\x80\xae"));
                assert_null(strstr(out, "\xe2\x81\xa6"));
                assert_non_null(strstr(out, "abc\\u202egpj.exe"));
                assert_non_null(strstr(out, "\\u2066b"));
                free(out);
        }
}

/* The display column (on a terminal: screen-columns.h) where @what starts on the first line of @out that holds @line. */
static size_t column_of(const char *out, const char *line, const char *what) {
        const char *l = strstr(out, line), *w;
        size_t col = 0;

        assert_non_null(l);
        while (l > out && l[-1] != '\n')
                l--;
        w = strstr(l, what);
        assert_non_null(w);
        col = screen_columns(l, w);
        return col;
}

/* Table columns are counted on the screen: a non-ASCII, wide or escaped name does not push its row's cells right. */
static void test_status_table_aligned(void **state) {
        FakeStatus f;
        char *out = NULL;

        fake_status(&f, "memfd");
        f.jobs[0].name = (char *) "caf\xc3\xa9-\xe5\xad\xa6\xe7\xbf\x92";  /* 7 characters, 9 columns, 11 bytes */
        f.jobs[0].uid = 4242;
        f.jobs[1].name = (char *) "abcdefgh";
        f.jobs[1].uid = 4343;
        assert_int_equal(status_format(&f.s, TIER_STATUS_TABLE, &out), 0);
        assert_int_equal(column_of(out, "  1  caf\xc3\xa9-", "4242"), column_of(out, "  2  abcdefgh", "4343"));
        free(out);
        f.jobs[1].name = (char *) "ab\x1b" "c";                           /* "ab\u001bc": 9 columns */
        assert_int_equal(status_format(&f.s, TIER_STATUS_TABLE, &out), 0);
        assert_int_equal(column_of(out, "  1  caf\xc3\xa9-", "4242"), column_of(out, "  2  ab\\u001bc", "4343"));
        free(out);
}

static void test_status_table_empty(void **state) {
        Tier__StatusReply s = TIER__STATUS_REPLY__INIT;
        char *out = NULL;

        assert_int_equal(status_format(&s, TIER_STATUS_TABLE, &out), 0);
        assert_non_null(strstr(out, "no jobs\n"));
        assert_non_null(strstr(out, "no NVMe targets\n"));
        free(out);
}

static void test_status_format_einval(void **state) {
        Tier__StatusReply s = TIER__STATUS_REPLY__INIT;
        char *out = NULL;

        assert_int_equal(status_format(NULL, TIER_STATUS_JSON, &out), -EINVAL);
        assert_int_equal(status_format(&s, 2, &out), -EINVAL);
        assert_int_equal(status_format(&s, -1, &out), -EINVAL);
        assert_int_equal(status_format(&s, TIER_STATUS_JSON, NULL), -EINVAL);
        assert_null(out);
}

/* ---- the write grants a reconnecting Hello names (held.c) ---------------------------------- */

/* How many writes held_writes() names now, and whether @name (in @tier) is one. */
static size_t named(const tier_client *c, const char *name, int tier, bool *ret_found) {
        Tier__HeldWrite **w = NULL;
        size_t n = 0;

        assert_int_equal(held_writes(c, &w, &n), 0);
        *ret_found = false;
        for (size_t i = 0; i < n; i++)
                *ret_found = *ret_found || (strcmp(w[i]->tensor, name) == 0 && (int) w[i]->tier == tier);
        held_writes_free(w, n);
        return n;
}

static void test_held_writes(void **state) {
        tier_client c = { .fd = -1 };
        tier_tensor a = { .id = 1, .name = (char *) "a" }, a2 = { .id = 1, .name = (char *) "a" };
        tier_tensor b = { .id = 2, .name = (char *) "b" };
        bool found;

        (void) state;
        /* pins: a write pin and a read pin of one tensor; an unpin takes the last one (by id, any handle) */
        assert_int_equal(held_pin(&c, &a, TIER_HOST, true), 0);
        assert_int_equal(held_pin(&c, &a, TIER_HOST, false), 0);
        assert_int_equal(named(&c, "a", TIER_HOST, &found), 1);
        assert_true(found);
        held_unpin(&c, &a2, TIER_HOST);
        assert_int_equal(named(&c, "a", TIER_HOST, &found), 1);
        held_unpin(&c, &a, TIER_HOST);
        assert_int_equal(named(&c, "a", TIER_HOST, &found), 0);

        /* a plan phase's grants: named through the next phase (tierd may hold it still), not after */
        c.plan_seq = 5;
        assert_int_equal(held_phase_grant(&c, &b, TIER_VRAM), 0);
        assert_int_equal(held_phase_grant(&c, &b, TIER_VRAM), 0);     /* once */
        c.plan_seq = 6;
        held_phase_end(&c);
        assert_int_equal(named(&c, "b", TIER_VRAM, &found), 1);
        assert_true(found);
        c.plan_seq = 7;
        held_phase_end(&c);
        assert_int_equal(named(&c, "b", TIER_VRAM, &found), 0);

        /* a handle that closes: its pins and phase grants stay named (tierd keeps them: test_held_closed_handle) */
        assert_int_equal(held_pin(&c, &b, TIER_HOST, true), 0);
        assert_int_equal(held_phase_grant(&c, &b, TIER_VRAM), 0);
        assert_int_equal(held_phase_grant(&c, &a, TIER_HOST), 0);
        assert_int_equal(held_forget_tensor(&c, &b), 0);
        assert_int_equal(named(&c, "b", TIER_HOST, &found), 3);
        assert_true(found);
        assert_int_equal(named(&c, "b", TIER_VRAM, &found), 3);
        assert_true(found);
        held_unpin(&c, &b, TIER_HOST);          /* (by id: through another handle of it) */
        assert_int_equal(named(&c, "a", TIER_HOST, &found), 2);
        /* a plan that ends, a reconnect: forgotten */
        held_phase_clear(&c);
        assert_int_equal(named(&c, "a", TIER_HOST, &found), 0);
        assert_int_equal(held_pin(&c, &a, TIER_VRAM, true), 0);
        assert_int_equal(held_pin(&c, &b, TIER_VRAM, true), 0);
        assert_int_equal(held_forget_tensor(&c, &b), 0);
        held_clear(&c);
        assert_int_equal(named(&c, "a", TIER_VRAM, &found), 0);
        free(c.held);
}

/*
 * An unpin finds its entry through an index (held.c): a scan of every entry held, and a memmove to close
 * the gap, made unpinning N pins in the order they were pinned quadratic.  The work is counted
 * (tier_client.held_steps), not timed; the latest pin of a tensor and tier still goes first.
 */
static void test_held_unpin_by_index(void **state) {
        enum { N = 8192 };
        tier_client c = { .fd = -1 };
        tier_tensor *t = calloc(N, sizeof(tier_tensor));
        tier_tensor a = { .id = N + 1, .name = (char *) "a" };
        bool found;

        (void) state;
        assert_non_null(t);
        for (int i = 0; i < N; i++) {
                t[i] = (tier_tensor) { .id = (uint64_t) i + 1, .name = (char *) "t" };
                assert_int_equal(held_pin(&c, &t[i], TIER_HOST, i % 2 == 0), 0);
        }
        assert_int_equal(held_pin(&c, &a, TIER_VRAM, true), 0);
        assert_int_equal(held_pin(&c, &a, TIER_VRAM, false), 0);
        c.held_steps = 0;
        for (int i = 0; i < N; i++)
                held_unpin(&c, &t[i], TIER_HOST);
        assert_true(c.held_steps <= 4 * (uint64_t) N);      /* (a scan: about N^2 / 2) */
        assert_int_equal(c.n_held, 2);
        held_unpin(&c, &a, TIER_VRAM);                  /* the read pin, the latest */
        assert_int_equal(named(&c, "a", TIER_VRAM, &found), 1);
        assert_true(found);
        assert_int_equal(held_pin(&c, &t[5], TIER_HOST, true), 0);    /* a freed slot again */
        held_unpin(&c, &a, TIER_VRAM);
        held_unpin(&c, &a, TIER_VRAM);                  /* none left: nothing */
        assert_int_equal(named(&c, "t", TIER_HOST, &found), 1);
        held_unpin(&c, &t[5], TIER_HOST);
        assert_int_equal(c.n_held, 0);
        held_clear(&c);
        free(c.held);
        free(t);
}

/*
 * A phase grant whose handle closed is named still, until its phase is over:
 * tierd keeps the phase's hold whatever became of the handle, and a Hello
 * that left the write out had the copy, a write-only pin's, put back as it
 * was before the phase (zeros).  It was forgotten at the close.
 */
static void test_held_closed_handle(void **state) {
        tier_client c = { .fd = -1 };
        tier_tensor t = { .id = 3, .name = (char *) "t" }, t2 = { .id = 3, .name = (char *) "t" };
        tier_tensor u = { .id = 4, .name = (char *) "u" };
        bool found;

        (void) state;
        c.plan_seq = 1;
        assert_int_equal(held_phase_grant(&c, &t, TIER_HOST), 0);
        assert_int_equal(held_forget_tensor(&c, &t), 0);
        assert_int_equal(named(&c, "t", TIER_HOST, &found), 1);
        assert_true(found);
        /* granted again, through another handle of it: one entry still */
        assert_int_equal(held_phase_grant(&c, &t2, TIER_HOST), 0);
        assert_int_equal(named(&c, "t", TIER_HOST, &found), 1);
        assert_int_equal(held_forget_tensor(&c, &t2), 0);
        assert_int_equal(named(&c, "t", TIER_HOST, &found), 1);
        /* over once the phase after the next is entered, as any phase grant */
        c.plan_seq = 2;
        held_phase_end(&c);
        assert_int_equal(named(&c, "t", TIER_HOST, &found), 1);
        c.plan_seq = 3;
        held_phase_end(&c);
        assert_int_equal(named(&c, "t", TIER_HOST, &found), 0);
        /* and at the plan's end; a handle whose tensor is gone names nothing */
        assert_int_equal(held_phase_grant(&c, &t, TIER_HOST), 0);
        assert_int_equal(held_forget_tensor(&c, &t), 0);
        held_phase_clear(&c);
        assert_int_equal(named(&c, "t", TIER_HOST, &found), 0);
        u.gone = true;
        assert_int_equal(held_phase_grant(&c, &u, TIER_VRAM), 0);
        assert_int_equal(held_forget_tensor(&c, &u), 0);
        assert_int_equal(c.n_held, 0);
        held_clear(&c);
        free(c.held);
}

/*
 * A handle's close walks its own entries (tier_tensor.held) and a phase's end the phase grants
 * (tier_client.held_phase), not every entry held: each walked all of them, so closing N handles, or
 * entering N phases, while N pins are held was quadratic.  Counted (tier_client.held_steps), not timed.
 */
static void test_held_close_walks_its_own(void **state) {
        enum { N = 8192, P = 64 };
        tier_client c = { .fd = -1 };
        tier_tensor *t = calloc(N, sizeof(tier_tensor)), *p = calloc(P, sizeof(tier_tensor));
        tier_tensor a = { .id = N + P + 1, .name = (char *) "a" }, b = { .id = N + P + 2, .name = (char *) "b" };
        bool found;

        (void) state;
        assert_true(t && p);
        for (int i = 0; i < N; i++) {
                t[i] = (tier_tensor) { .id = (uint64_t) i + 1, .name = (char *) "t" };
                assert_int_equal(held_pin(&c, &t[i], TIER_HOST, true), 0);
        }
        c.plan_seq = 1;
        for (int i = 0; i < P; i++) {
                p[i] = (tier_tensor) { .id = (uint64_t) N + i + 1, .name = (char *) "p" };
                assert_int_equal(held_phase_grant(&c, &p[i], TIER_VRAM), 0);
        }
        c.held_steps = 0;
        /* N phases entered: the grants of phase 1 are named through phase 2, gone at 3 */
        for (int i = 0; i < N; i++) {
                c.plan_seq++;
                held_phase_end(&c);
                assert_int_equal(c.n_held, N + (i == 0 ? P : 0));
        }
        assert_true(c.held_steps <= 2 * (uint64_t) N);      /* (the scan: about N^2) */
        c.held_steps = 0;
        /* N handles closed: their pins are named still, by name; a gone tensor's go */
        for (int i = 0; i < N; i++) {
                t[i].gone = i % 2;
                assert_int_equal(held_forget_tensor(&c, &t[i]), 0);
        }
        assert_true(c.held_steps <= 2 * (uint64_t) N);      /* (the scan: about N^2 / 2) */
        assert_int_equal(c.n_held, N / 2);
        assert_int_equal(named(&c, "t", TIER_HOST, &found), N / 2);
        assert_true(found);

        /* a handle's entries of both kinds and tiers go at its close, another handle's stay */
        held_clear(&c);
        c.plan_seq = 1;
        assert_int_equal(held_pin(&c, &a, TIER_HOST, true), 0);
        assert_int_equal(held_pin(&c, &b, TIER_HOST, true), 0);
        assert_int_equal(held_pin(&c, &a, TIER_VRAM, false), 0);
        assert_int_equal(held_phase_grant(&c, &a, TIER_VRAM), 0);
        a.gone = true;
        assert_int_equal(held_forget_tensor(&c, &a), 0);
        assert_int_equal(c.n_held, 1);
        assert_int_equal(named(&c, "b", TIER_HOST, &found), 1);
        assert_true(found);
        /* after a reconnect's clear, a handle's list of before is no more: b's new entry is not a's */
        held_clear(&c);
        a.gone = false;
        assert_int_equal(held_pin(&c, &a, TIER_HOST, true), 0);
        held_clear(&c);
        assert_int_equal(held_pin(&c, &b, TIER_HOST, true), 0);
        assert_int_equal(held_forget_tensor(&c, &a), 0);
        assert_ptr_equal(c.held[0].t, &b);
        assert_int_equal(held_forget_tensor(&c, &b), 0);
        assert_null(c.held[0].t);
        assert_int_equal(named(&c, "b", TIER_HOST, &found), 1);
        held_clear(&c);
        free(c.held);
        free(p);
        free(t);
}

/* ---- the wakeup fd ---------------------------------------------------------------------- */

/*
 * client_wakeup_drain() takes every token waiting on the wakeup pipe in one
 * read: before, a read took one 8-byte token, and each further token cost the
 * waiter another round of poll(), read and page check.  An older tierd's
 * eventfd is still cleared by it.
 */
static void test_wakeup_drain(void **state) {
        tier_client c = { .fd = -1, .event_fd = -1 };   /* (no fork since: .forks 0, as tier_client_new() makes it) */
        struct pollfd pfd = { .events = POLLIN };
        uint64_t token = 1;
        int p[2], unread = -1;

        (void) state;
        assert_int_equal(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
        c.event_fd = p[0];
        for (int i = 0; i < 5; i++)
                assert_int_equal(write(p[1], &token, sizeof(token)), (ssize_t) sizeof(token));
        client_wakeup_drain(&c);
        assert_int_equal(ioctl(p[0], FIONREAD, &unread), 0);
        assert_int_equal(unread, 0);
        close(p[0]);
        close(p[1]);

        c.event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        assert_true(c.event_fd >= 0);
        assert_int_equal(eventfd_write(c.event_fd, 3), 0);
        client_wakeup_drain(&c);
        pfd.fd = c.event_fd;
        assert_int_equal(poll(&pfd, 1, 0), 0);
        close(c.event_fd);

        c.event_fd = -1;                /* no wakeup fd (a control connection): nothing to read */
        client_wakeup_drain(&c);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_strerror),
                cmocka_unit_test(test_level_names),
                cmocka_unit_test(test_einval),
                cmocka_unit_test(test_connect_fails),
                cmocka_unit_test(test_name_refusal_says_escaped_name),
                cmocka_unit_test(test_status_json),
                cmocka_unit_test(test_status_json_empty),
                cmocka_unit_test(test_status_json_escaping),
                cmocka_unit_test(test_status_json_numbers),
                cmocka_unit_test(test_status_table),
                cmocka_unit_test(test_status_table_empty),
                cmocka_unit_test(test_status_escapes_names),
                cmocka_unit_test(test_status_escapes_bidi_names),
                cmocka_unit_test(test_status_table_aligned),
                cmocka_unit_test(test_status_reserved),
                cmocka_unit_test(test_status_format_einval),
                cmocka_unit_test(test_held_writes),
                cmocka_unit_test(test_held_closed_handle),
                cmocka_unit_test(test_held_unpin_by_index),
                cmocka_unit_test(test_held_close_walks_its_own),
                cmocka_unit_test(test_wakeup_drain),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
