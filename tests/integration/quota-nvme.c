/* SPDX-License-Identifier: MIT */
/* quota-nvme.c: NVMe guarantees (nvme_min, room kept free) against a real tierd; part of test-quota. */

#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <tier.h>

#include "tests/integration/test-quota.h"

/* valgrind maps no tensor over two host segments (mremap with an old size of 0, as test-large says) */
static bool under_valgrind(void) {
        const char *p = getenv("LD_PRELOAD");

        return p && strstr(p, "vgpreload");
}

/* Write 16M tensor @name of @c in host and evict it to NVMe: the evict's status. */
static int to_nvme(tier_client *c, const char *name) {
        struct tier_grant g;
        tier_tensor *t;
        int r;

        assert_int_equal(tier_tensor_create(c, name, 16 * MiB, &t), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_WRITE, &g), 0);
        memset(g.ptr, 0x5a, 16 * MiB);
        assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
        r = tier_evict(t, TIER_NVME);
        tier_tensor_close(t);
        return r;
}

/*
 * An NVMe guarantee is room kept free (NVMe copies are never taken back): 'nvA' had nvme_min 128M of the
 * 256M target, 'nvB' filled all of it, and 'nvA''s first eviction to NVMe failed, "no room left".
 */
void test_nvme_min_kept(void **state) {
        tier_client *a, *b;
        char name[16], *err = NULL;

        if (!is_root("test_nvme_min_kept"))
                skip();
        if (under_valgrind()) {
                print_message("skipped: valgrind cannot map a tensor that spans segments (16M tensors, 4M segments)\n");
                skip();
        }
        assert_int_equal(tierctl(NULL, NULL, "quota set nvA --nvme-min 128M"), 0);
        a = connect_job("nvA");
        b = connect_job("nvB");
        for (int i = 0; i < 8; i++) {
                (void) snprintf(name, sizeof(name), "b%d", i);
                assert_int_equal(to_nvme(b, name), 0);
        }
        assert_int_equal(to_nvme(b, "b8"), -ENOSPC);
        assert_contains(tier_client_last_error(b), "the NVMe room left (128.0 MiB free of 256.0 MiB) is kept, "
                                                   "128.0 MiB of it, for the guaranteed minimum (nvme_min) of "
                                                   "'nvA' (128.0 MiB, 0 B of it used)");
        for (int i = 0; i < 8; i++) {
                (void) snprintf(name, sizeof(name), "a%d", i);
                assert_int_equal(to_nvme(a, name), 0);
        }
        /* a claim on more than is free is refused, naming who holds the rest */
        assert_int_equal(tierctl(NULL, &err, "quota set nvA --nvme-min 144M"), 1);
        assert_contains(err, "nvme guarantees not used yet would need 16.0 MiB, but only 0 B of the nvme tier's "
                             "256.0 MiB is free");
        assert_contains(err, "the rest holds the data of job 'nvB' 128.0 MiB");
        free(err);
        tier_client_free(a);
        tier_client_free(b);
}

/* Write @body as drop-in 50-nvme.conf and reload: the READY=1 that ends the reload (it says a refusal). */
static const char *reload_with(const char *body) {
        int i;

        assert_int_equal(test_daemon_write_config(&daemon_, "50-nvme.conf", body), 0);
        assert_int_equal(kill(daemon_.pid, SIGHUP), 0);
        i = test_daemon_wait_notify(&daemon_, "READY=1", 10000);
        assert_true(i >= 0);
        return daemon_.notes[i].text;
}

/*
 * The NVMe room free now is checked at a reload for the guarantees as they apply, the run-time rules
 * over tierd.conf's.  'nvR' had nvme_min 128M in tierd.conf, lowered to 0 by tierctl quota set, and
 * 'nvF' filled the room: every later reload, whatever it changed, was refused, 'nvR' counted with
 * tierd.conf's 128M.  And a reload giving a guarantee that fit the room free with the file's rules
 * alone, not with the run-time ones, was applied with a warning: the room promised twice.
 */
void test_nvme_min_reload(void **state) {
        tier_client *a, *b, *c, *f;
        struct tier_quota q;
        const char *note;
        char name[16];

        if (!is_root("test_nvme_min_reload"))
                skip();
        if (under_valgrind()) {
                print_message("skipped: valgrind cannot map a tensor that spans segments (16M tensors, 4M segments)\n");
                skip();
        }
        assert_null(strstr(reload_with("[quota]\njob = nvR\nnvme_min = 128M\n"), "refused"));
        assert_int_equal(tierctl(NULL, NULL, "quota set nvR --nvme-min 0"), 0);
        a = connect_job("nvR");
        f = connect_job("nvF");
        for (int i = 0; i < 12; i++) {
                (void) snprintf(name, sizeof(name), "f%d", i);
                assert_int_equal(to_nvme(f, name), 0);
        }
        /* 64M free: an unrelated change reloads */
        note = reload_with("[quota]\njob = nvR\nnvme_min = 128M\n[quota]\njob = nvO\nhost = 12M\n");
        if (strstr(note, "refused"))
                fail_msg("%s", note);
        assert_int_equal(tier_quota_get(a, TIER_QUOTA_JOB, 0, "nvO", &q), 0);
        assert_int_equal(q.max[TIER_HOST], 12 * MiB);

        /* 'nvB' is given 32M of it at run time, then tierd.conf 'nvC' 48M: 80M */
        b = connect_job("nvB");
        c = connect_job("nvC");
        assert_int_equal(tierctl(NULL, NULL, "quota set nvB --nvme-min 32M"), 0);
        note = reload_with("[quota]\njob = nvC\nnvme_min = 48M\n");
        if (!strstr(note, "last reload refused: [quota]: nvme guarantees not used yet would need 80.0 MiB, but "
                          "only 64.0 MiB of the nvme tier's 256.0 MiB is free"))
                fail_msg("%s", note);
        assert_int_equal(tier_quota_get(a, TIER_QUOTA_JOB, 0, "nvC", &q), 0);
        assert_int_equal(q.min[TIER_NVME], 0);
        assert_int_equal(tierctl(NULL, NULL, "quota set nvO --host 8M"), 0);
        tier_client_free(c);
        tier_client_free(a);
        tier_client_free(b);
        tier_client_free(f);
}
