/* SPDX-License-Identifier: MIT */
/* book-fixture.h: jobs and tensors through the NVMe index in the book unit tests (test-book*.c). */
#pragma once

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "daemon/core/manager.h"
#include "daemon/engine/engine.h"
#include "daemon/state/book.h"
#include "daemon/state/registry.h"
#include "tests/unit/fixture.h"

/* A job as a Hello makes it: in the index from its creation on. */
static inline Job *book_fx_job(Manager *m, const char *name) {
        Job *j;

        assert_int_equal(job_new(m->registry, name, 0, &j), 0);
        book_job(m->book, j);
        return j;
}

/* @t whole in host as @v, then written to NVMe (the fence: the op's end). */
static inline void book_fx_written(Manager *m, Tensor *t, uint8_t v) {
        fixture_host_data(m, t, v);
        assert_int_equal(fixture_op(m, OP_EVICT, t, LEVEL_NVME), 0);
        assert_true(copy_valid(t, LEVEL_NVME));
}

/* Read @t into host and check every byte is @v. */
static inline void book_fx_check_bytes(Manager *m, Tensor *t, uint8_t v) {
        assert_non_null(t);
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_HOST), 0);
        for (uint64_t off = 0; off < t->size; off += 4093)
                assert_int_equal(fixture_byte(t, LEVEL_HOST, off), v);
        assert_int_equal(fixture_byte(t, LEVEL_HOST, t->size - 1), v);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, false), 0);
}

/* Tensor @name of job @job (which must exist), or NULL. */
static inline Tensor *book_fx_find(Manager *m, const char *job, const char *name) {
        Job *j = job_find(m->registry, job);

        assert_non_null(j);
        return tensor_find_name(j, name);
}
