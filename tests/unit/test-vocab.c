/* SPDX-License-Identifier: MIT */
/* test-vocab.c: the wire's numbers (proto/) and libtier's public ones (<tier.h>) agree. */

/*
 * tierd speaks proto/'s names (proto/level.h, proto/wire.h, proto/plan.h)
 * and never includes <tier.h>; libtier hands the same numbers to its users
 * under public names.  This file is where both are seen together: the
 * checks are made by the compiler, the test itself only says so.
 */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <tier.h>

#include "daemon/base/quota-rule.h"
#include "proto/level.h"
#include "proto/plan.h"
#include "proto/wire.h"
#include "tier.pb-c.h"

/* enums of different types: compared as the ints they are on the wire */
#define SAME(a, b) ((int) (a) == (int) (b))

/* tier levels: proto/level.h, the public enum and tier.proto's enum Tier */
_Static_assert(SAME(LEVEL_VRAM, TIER_VRAM), "LEVEL_VRAM");
_Static_assert(SAME(LEVEL_HOST, TIER_HOST), "LEVEL_HOST");
_Static_assert(SAME(LEVEL_NVME, TIER_NVME), "LEVEL_NVME");
_Static_assert(SAME(_LEVEL_MAX, TIER_LEVEL_MAX), "_LEVEL_MAX");
_Static_assert(SAME(LEVEL_VRAM, TIER__TIER__TIER_VRAM), "wire TIER_VRAM");
_Static_assert(SAME(LEVEL_HOST, TIER__TIER__TIER_HOST), "wire TIER_HOST");
_Static_assert(SAME(LEVEL_NVME, TIER__TIER__TIER_NVME), "wire TIER_NVME");

/* links (the link field of a trace record, the link arrays of the status) */
_Static_assert(SAME(LINK_NVME_TO_HOST, TIER_LINK_NVME_TO_HOST), "LINK_NVME_TO_HOST");
_Static_assert(SAME(LINK_HOST_TO_NVME, TIER_LINK_HOST_TO_NVME), "LINK_HOST_TO_NVME");
_Static_assert(SAME(LINK_HOST_TO_VRAM, TIER_LINK_HOST_TO_VRAM), "LINK_HOST_TO_VRAM");
_Static_assert(SAME(LINK_VRAM_TO_HOST, TIER_LINK_VRAM_TO_HOST), "LINK_VRAM_TO_HOST");
_Static_assert(SAME(_LINK_MAX, TIER_LINKS), "_LINK_MAX");

/* the protocol version of Hello */
_Static_assert(SAME(WIRE_PROTOCOL_VERSION, TIER_PROTOCOL_VERSION), "WIRE_PROTOCOL_VERSION");

/* access modes of a plan entry */
_Static_assert(SAME(PLAN_READ, TIER_READ), "PLAN_READ");
_Static_assert(SAME(PLAN_WRITE, TIER_WRITE), "PLAN_WRITE");
_Static_assert(SAME(PLAN_READ | PLAN_WRITE, TIER_READ_WRITE), "PLAN_READ | PLAN_WRITE");

/* the kind of a QuotaGet / QuotaSet */
_Static_assert(SAME(QUOTA_JOB, TIER_QUOTA_JOB), "QUOTA_JOB");
_Static_assert(SAME(QUOTA_UID, TIER_QUOTA_UID), "QUOTA_UID");
_Static_assert(SAME(QUOTA_GROUP, TIER_QUOTA_GROUP), "QUOTA_GROUP");
_Static_assert(SAME(QUOTA_DEFAULT, TIER_QUOTA_DEFAULT), "QUOTA_DEFAULT");

static void test_vocab_agrees(void **state) {
        /* the checks above ran at compile time */
        assert_int_equal(LEVEL_NVME, TIER_NVME);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_vocab_agrees),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
