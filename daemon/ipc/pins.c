/* SPDX-License-Identifier: MIT */
/* pins.c: the pins a connection holds, indexed by tensor and tier. */

/*
 * Theory of operation: pins are recorded per connection so that a vanished
 * client's pins are dropped (as dirty: the client may have written before
 * it died, and keeping its bytes is the safe choice).  A connection may
 * hold up to twice [limits] max_tensors pins, and each Unpin forgets one,
 * so finding it must not walk them all: a scan was quadratic work on the
 * loop for a client that unpins in the order it pinned (65536 pins: 6.6 s
 * of unpins, against 1.4 s in the reverse order).
 *
 * Conn.pins is an array of slots; a freed slot (tensor NULL) is chained
 * into a free list (Conn.free_pin and PinRec.next: slot + 1, 0 ends it) and reused, so a record never moves.  The
 * pins of one tensor in one tier form a chain through PinRec.next, latest
 * first, whose head an open-addressing table keyed by (tensor, tier) holds
 * (Conn.pin_keys: linear probing, at most half full, entries shifted back
 * on removal, no tombstones).  pin_forget() forgets the latest pin of the
 * pair, in constant time on average.  The keys are tierd's own pointers,
 * which a client does not choose.
 */

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "daemon/ipc/conn.h"
#include "daemon/ipc/fence.h"
#include "daemon/state/registry.h"

static uint32_t key_hash(const Tensor *t, int tier, uint32_t mask) {
        uint64_t x = ((uint64_t) (uintptr_t) t ^ (uint64_t) tier) * UINT64_C(0x9e3779b97f4a7c15);

        return (uint32_t) (x >> 32) & mask;
}

/* The entry of (@t, @tier), or the empty one where it would go. */
static PinKey *key_find(Conn *c, const Tensor *t, int tier) {
        uint32_t mask = c->cap_pin_keys - 1;

        for (uint32_t i = key_hash(t, tier, mask);; i = (i + 1) & mask) {
                PinKey *k = &c->pin_keys[i];

                c->pin_steps++;
                if (!k->tensor || (k->tensor == t && k->tier == tier))
                        return k;
        }
}

static int keys_grow(Conn *c) {
        uint32_t cap = c->cap_pin_keys ? c->cap_pin_keys * 2 : 16;
        PinKey *old = c->pin_keys, *n;
        uint32_t old_cap = c->cap_pin_keys;

        if (cap < c->cap_pin_keys)
                return -ENOMEM;
        n = calloc(cap, sizeof(PinKey));
        if (!n)
                return -ENOMEM;
        c->pin_keys = n;
        c->cap_pin_keys = cap;
        for (uint32_t i = 0; i < old_cap; i++)
                if (old[i].tensor)
                        *key_find(c, old[i].tensor, old[i].tier) = old[i];
        free(old);
        return 0;
}

/* Remove entry @k, shifting back the ones after it that probed past it (no tombstones). */
static void key_remove(Conn *c, PinKey *k) {
        uint32_t mask = c->cap_pin_keys - 1, hole = (uint32_t) (k - c->pin_keys);

        for (uint32_t i = (hole + 1) & mask; c->pin_keys[i].tensor; i = (i + 1) & mask) {
                uint32_t home = key_hash(c->pin_keys[i].tensor, c->pin_keys[i].tier, mask);

                /* it may move to the hole if the hole lies on its probe path, from home to i */
                if (((i - home) & mask) >= ((i - hole) & mask)) {
                        c->pin_keys[hole] = c->pin_keys[i];
                        hole = i;
                }
        }
        c->pin_keys[hole] = (PinKey) {};
        c->n_pin_keys--;
}

int pin_record(Conn *c, Tensor *t, int tier, bool write_only, bool rw) {
        PinKey *k;
        uint32_t slot;

        if (2 * ((size_t) c->n_pin_keys + 1) > c->cap_pin_keys && keys_grow(c) < 0)
                return -ENOMEM;
        if (c->free_pin == 0) {
                if (c->n_pin_slots == c->cap_pins) {
                        size_t cap = c->cap_pins ? c->cap_pins * 2 : 16;
                        PinRec *p = cap < PIN_NONE ? realloc(c->pins, cap * sizeof(PinRec)) : NULL;

                        if (!p)
                                return -ENOMEM;
                        c->pins = p;
                        c->cap_pins = cap;
                }
                slot = c->n_pin_slots++;
        } else {
                slot = c->free_pin - 1;
                c->free_pin = c->pins[slot].next;
        }
        k = key_find(c, t, tier);
        if (!k->tensor) {
                *k = (PinKey) { t, tier, PIN_NONE };
                c->n_pin_keys++;
        }
        c->pins[slot] = (PinRec) { t, tier, write_only, rw, k->head };
        k->head = slot;
        c->n_pins++;
        if (rw)
                t->rw_pins++;
        if (write_only || rw) {
                copy_writers(t, tier, +1, c->rank);
        }
        return 0;
}

int pin_forget(Conn *c, Tensor *t, int tier) {
        PinKey *k;
        PinRec *p;
        uint32_t slot;
        int flags;

        if (c->n_pin_keys == 0)
                return -ENOENT;
        k = key_find(c, t, tier);
        if (!k->tensor)
                return -ENOENT;
        slot = k->head;
        p = &c->pins[slot];
        flags = (p->write_only ? PIN_WRITE_ONLY : 0) | (p->write_only || p->rw ? PIN_WRITER : 0);
        if (p->rw)
                t->rw_pins--;
        k->head = p->next;
        if (k->head == PIN_NONE)
                key_remove(c, k);
        *p = (PinRec) { .next = c->free_pin };
        c->free_pin = slot + 1;
        c->n_pins--;
        return flags;
}

void pin_drop_all(Conn *c, void (*changed)(Tensor *t, void *userdata), void *userdata) {
        for (uint32_t i = 0; i < c->n_pin_slots; i++) {
                PinRec *pr = &c->pins[i];

                if (!pr->tensor)
                        continue;
                tensor_pin_account(pr->tensor, pr->tier, -1);
                if (pr->rw)
                        pr->tensor->rw_pins--;
                /* one that may have written: dirty (the client said nothing); a read-only one: clean */
                (void) tensor_unpin(pr->tensor, pr->tier, pr->write_only || pr->rw);
                if (pr->write_only || pr->rw) {
                        copy_writers(pr->tensor, pr->tier, -1, c->rank);
                        if (changed)
                                changed(pr->tensor, userdata);
                }
        }
        pins_free(c);
}

void pins_free(Conn *c) {
        free(c->pins);
        free(c->pin_keys);
        c->pins = NULL;
        c->pin_keys = NULL;
        c->n_pins = c->cap_pins = 0;
        c->n_pin_slots = c->n_pin_keys = c->cap_pin_keys = 0;
        c->free_pin = 0;
}
