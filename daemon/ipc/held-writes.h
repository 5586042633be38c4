/* SPDX-License-Identifier: MIT */
/* held-writes.h: a Hello's held writes, sorted once so that each copy a Hello decides is looked up. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Tensor Tensor;
typedef struct Tier__HeldWrite Tier__HeldWrite;

/* Hello.held_writes sorted by (tier, tensor name), those without a name left out; borrowed from the Hello. */
typedef struct HeldWrites {
        const Tier__HeldWrite **w;
        size_t n;
        uint64_t *steps;        /* where to count the entries compared, sorting and looking up, or NULL (tests) */
} HeldWrites;

/*
 * held_writes_index() - sort the @n writes @w (at most the Hello's bound,
 * 8 x max_tensors, which handle_hello() checked) into @ret, counting into
 * @steps (or NULL).  -ENOMEM (nothing allocated then).  Free with held_writes_free().
 */
int held_writes_index(Tier__HeldWrite *const *w, size_t n, uint64_t *steps, HeldWrites *ret);
/* Does @userdata (a HeldWrites) name @t in @tier?  (job_release_ghosts()'s @held.) */
bool held_writes_has(const Tensor *t, int tier, void *userdata);
void held_writes_free(HeldWrites *hw);
