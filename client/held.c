/* SPDX-License-Identifier: MIT */
/* held.c: the grants a client holds that may write, for the Hello that follows a restart of tierd. */

/*
 * Theory of operation: tierd records in its memory store which copies a
 * client holds for writing, from just before their grant goes out, so that
 * what a client wrote through a grant survives tierd's death (the client
 * keeps writing until its next call finds tierd gone).  For a copy a
 * write-only pin reserved, that record alone cannot tell a grant the client
 * got (and wrote through) from one tierd's death cut off before it arrived:
 * the reserved room then holds whatever it held.  So the client keeps the
 * list here, and the Hello of a reconnect (reconnect.c) names the writes in
 * it; tierd keeps such a copy as written only where its rank names it, and
 * otherwise puts the tensor back as it was before (or says it is lost).
 *
 * The list mirrors tierd's pins of the connection: a pin's entry from its
 * answer to its unpin (an unpin takes the last pin of its tensor and tier,
 * as tierd does; a pin through one handle unpinned through another of the
 * same tensor matches by id), and an entry per tensor and tier that
 * tier_phase_grant() gave in the plan phase the client is in and in the one
 * before it (tierd may hold that one still: a phase it pinned ahead can be
 * ready before it has read the marker that ends the one before), until the
 * plan ends.  A handle closed meanwhile keeps its entries, by name: tierd
 * holds the pin, and the phase's hold, whatever became of the handle (the
 * client may have written through the grant before it closed it).  Erring
 * means naming a write that did not happen, which keeps the copy as tierd
 * always did, never the other way.
 */

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client/client-internal.h"

static uint32_t key_hash(uint64_t id, int tier, bool phase, uint32_t mask) {
        uint64_t x = (id ^ ((uint64_t) tier << 1 | phase) << 59) * UINT64_C(0x9e3779b97f4a7c15);

        return (uint32_t) (x >> 32) & mask;
}

/* The index entry of (@id, @tier, @phase), or the empty one where it would go; the table has room. */
static uint32_t *key_find(tier_client *c, uint64_t id, int tier, bool phase) {
        uint32_t mask = c->cap_held_keys - 1;

        for (uint32_t i = key_hash(id, tier, phase, mask);; i = (i + 1) & mask) {
                uint32_t *k = &c->held_keys[i];
                const ClientHeld *h = *k ? &c->held[*k - 1] : NULL;

                c->held_steps++;
                if (!h || (h->id == id && h->tier == tier && h->phase == phase))
                        return k;
        }
}

/* Room in the index for one key more (at most half full). */
static int keys_reserve(tier_client *c) {
        uint32_t cap = c->cap_held_keys ? c->cap_held_keys * 2 : 16, old_cap = c->cap_held_keys, *old = c->held_keys;

        if ((c->n_held_keys + 1) * 2 <= c->cap_held_keys)
                return 0;
        if (cap < c->cap_held_keys)
                return -ENOMEM;
        c->held_keys = calloc(cap, sizeof(uint32_t));
        if (!c->held_keys) {
                c->held_keys = old;
                return -ENOMEM;
        }
        c->cap_held_keys = cap;
        for (uint32_t i = 0; i < old_cap; i++)
                if (old[i]) {
                        const ClientHeld *h = &c->held[old[i] - 1];

                        *key_find(c, h->id, h->tier, h->phase) = old[i];
                }
        free(old);
        return 0;
}

/* Remove index entry @k, shifting back the ones after it that probed past it (no tombstones). */
static void key_remove(tier_client *c, uint32_t *k) {
        uint32_t mask = c->cap_held_keys - 1, hole = (uint32_t) (k - c->held_keys);

        for (uint32_t i = (hole + 1) & mask; c->held_keys[i]; i = (i + 1) & mask) {
                const ClientHeld *h = &c->held[c->held_keys[i] - 1];
                uint32_t home = key_hash(h->id, h->tier, h->phase, mask);

                /* it may move to the hole if the hole lies on its probe path, from home to i */
                if (((i - home) & mask) >= ((i - hole) & mask)) {
                        c->held_keys[hole] = c->held_keys[i];
                        hole = i;
                }
        }
        c->held_keys[hole] = 0;
        c->n_held_keys--;
}

/*
 * Two doubly linked lists through the slots (slot + 1, 0 ends them): a
 * handle's entries from tier_tensor.held (ClientHeld.t_prev/t_next), so a
 * close walks its own, not all; the phase grants from
 * tier_client.held_phase (p_prev/p_next), so a phase's end walks those, not
 * the pins too.
 */
static void link_add(tier_client *c, uint32_t *head, uint32_t slot, bool phase) {
        ClientHeld *h = &c->held[slot];

        if (phase) {
                h->p_prev = 0;
                h->p_next = *head;
                if (*head)
                        c->held[*head - 1].p_prev = slot + 1;
        } else {
                h->t_prev = 0;
                h->t_next = *head;
                if (*head)
                        c->held[*head - 1].t_prev = slot + 1;
        }
        *head = slot + 1;
}

static void link_del(tier_client *c, uint32_t *head, uint32_t slot, bool phase) {
        ClientHeld *h = &c->held[slot];
        uint32_t prev = phase ? h->p_prev : h->t_prev, next = phase ? h->p_next : h->t_next;

        if (prev)
                *(phase ? &c->held[prev - 1].p_next : &c->held[prev - 1].t_next) = next;
        else
                *head = next;
        if (next)
                *(phase ? &c->held[next - 1].p_prev : &c->held[next - 1].t_prev) = prev;
}

/*
 * The entries sit in slots that never move (a freed one is chained into a
 * free list and reused); those of one tensor id, tier and kind (pin or phase
 * grant) form a chain through ClientHeld.next, latest first, whose head an
 * open-addressing table holds (held_keys: linear probing, at most half full).
 * An unpin finds its entry in constant time on average: a scan of all of
 * them (and a memmove to close the gap) made unpinning N pins quadratic.
 */
static int held_add(tier_client *c, ClientHeld h) {
        uint32_t slot, *k;

        if (keys_reserve(c) < 0)
                return -ENOMEM;
        if (c->free_held) {
                slot = c->free_held - 1;
                c->free_held = c->held[slot].next;
        } else {
                if (c->n_held_slots == c->cap_held) {
                        size_t cap = c->cap_held ? c->cap_held * 2 : 16;
                        ClientHeld *x;

                        if (cap > UINT32_MAX - 1)
                                return -ENOMEM;
                        x = reallocarray(c->held, cap, sizeof(ClientHeld));
                        if (!x)
                                return -ENOMEM;
                        c->held = x;
                        c->cap_held = cap;
                }
                slot = c->n_held_slots++;
        }
        k = key_find(c, h.id, h.tier, h.phase);
        if (!*k)
                c->n_held_keys++;
        h.used = true;
        h.next = *k;
        c->held[slot] = h;
        *k = slot + 1;
        link_add(c, &h.t->held, slot, false);
        if (h.phase)
                link_add(c, &c->held_phase, slot, true);
        c->n_held++;
        return 0;
}

/* Forget the entry in @slot: out of its key's chain (the head, but for a closed handle's), its slot freed. */
static void held_del(tier_client *c, uint32_t slot) {
        ClientHeld *h = &c->held[slot];
        uint32_t *k = key_find(c, h->id, h->tier, h->phase), *link = k;

        while (*link != slot + 1) {
                c->held_steps++;
                link = &c->held[*link - 1].next;
        }
        *link = h->next;
        if (!*k)
                key_remove(c, k);
        if (h->t)
                link_del(c, &h->t->held, slot, false);
        if (h->phase)
                link_del(c, &c->held_phase, slot, true);
        free(h->name);
        *h = (ClientHeld) { .next = c->free_held };
        c->free_held = slot + 1;
        c->n_held--;
}

int held_pin(tier_client *c, tier_tensor *t, int tier, bool write) {
        return held_add(c, (ClientHeld) { .t = t, .id = t->id, .tier = tier, .write = write });
}

void held_unpin(tier_client *c, const tier_tensor *t, int tier) {
        uint32_t *k;

        if (c->n_held == 0)
                return;
        k = key_find(c, t->id, tier, false);
        if (*k)
                held_del(c, *k - 1);    /* the latest pin of the tensor in the tier */
}

int held_phase_grant(tier_client *c, tier_tensor *t, int tier) {
        uint32_t *k = c->n_held > 0 ? key_find(c, t->id, tier, true) : NULL;

        /* by id: one entry per tensor and tier, whichever handle (one closed since included) got the grant */
        if (k && *k) {
                c->held[*k - 1].phase_seq = c->plan_seq;
                return 0;
        }
        return held_add(c, (ClientHeld) { .t = t, .id = t->id, .tier = tier, .write = true, .phase = true,
                                          .phase_seq = c->plan_seq });
}

void held_phase_end(tier_client *c) {
        for (uint32_t i = c->held_phase, next; i; i = next) {
                next = c->held[i - 1].p_next;
                c->held_steps++;
                if (c->held[i - 1].phase_seq + 1 < c->plan_seq)
                        held_del(c, i - 1);
        }
}

void held_phase_clear(tier_client *c) {
        while (c->held_phase) {
                c->held_steps++;
                held_del(c, c->held_phase - 1);
        }
}

int held_forget_tensor(tier_client *c, tier_tensor *t) {
        int r = 0;

        while (t->held) {
                uint32_t i = t->held - 1;
                ClientHeld *h = &c->held[i];

                c->held_steps++;
                /* a pin's or a phase grant's: tierd holds either until its unpin or its phase's end */
                if (!t->gone) {
                        h->name = strdup(t->name);
                        if (h->name) {
                                link_del(c, &t->held, i, false);
                                h->t = NULL;
                                continue;
                        }
                        r = -ENOMEM;
                }
                held_del(c, i);
        }
        return r;
}

void held_clear(tier_client *c) {
        for (uint32_t i = 0; i < c->n_held_slots; i++)
                if (c->held[i].used) {
                        free(c->held[i].name);
                        if (c->held[i].t)
                                c->held[i].t->held = 0;
                }
        c->n_held = 0;
        c->held_phase = 0;
        c->n_held_slots = 0;
        c->free_held = 0;
        free(c->held_keys);
        c->held_keys = NULL;
        c->n_held_keys = c->cap_held_keys = 0;
}

void held_writes_free(Tier__HeldWrite **w, size_t n) {
        for (size_t i = 0; i < n; i++)
                free(w[i]);
        free(w);
}

int held_writes(const tier_client *c, Tier__HeldWrite ***ret, size_t *ret_n) {
        Tier__HeldWrite **w;
        size_t n = 0;

        *ret = NULL;
        *ret_n = 0;
        if (c->n_held == 0)
                return 0;
        w = calloc(c->n_held, sizeof(*w));
        if (!w)
                return -ENOMEM;
        for (uint32_t i = 0; i < c->n_held_slots; i++) {
                const ClientHeld *h = &c->held[i];

                if (!h->used || !h->write || (h->t && h->t->gone))
                        continue;
                w[n] = malloc(sizeof(Tier__HeldWrite));
                if (!w[n]) {
                        held_writes_free(w, n);
                        return -ENOMEM;
                }
                tier__held_write__init(w[n]);
                w[n]->tensor = h->t ? h->t->name : h->name;
                w[n]->tier = (Tier__Tier) h->tier;
                n++;
        }
        *ret = w;
        *ret_n = n;
        return 0;
}
