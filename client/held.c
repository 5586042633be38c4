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
#include <stdlib.h>
#include <string.h>

#include "client/client-internal.h"

static int held_add(tier_client *c, ClientHeld h) {
        if (c->n_held == c->cap_held) {
                size_t cap = c->cap_held ? c->cap_held * 2 : 16;
                ClientHeld *x = reallocarray(c->held, cap, sizeof(ClientHeld));

                if (!x)
                        return -ENOMEM;
                c->held = x;
                c->cap_held = cap;
        }
        c->held[c->n_held++] = h;
        return 0;
}

static void held_del(tier_client *c, size_t i) {
        free(c->held[i].name);
        memmove(c->held + i, c->held + i + 1, (c->n_held - i - 1) * sizeof(ClientHeld));
        c->n_held--;
}

int held_pin(tier_client *c, tier_tensor *t, int tier, bool write) {
        return held_add(c, (ClientHeld) { .t = t, .id = t->id, .tier = tier, .write = write });
}

void held_unpin(tier_client *c, const tier_tensor *t, int tier) {
        for (size_t i = c->n_held; i > 0; i--) {
                const ClientHeld *h = &c->held[i - 1];

                if (!h->phase && h->tier == tier && h->id == t->id) {
                        held_del(c, i - 1);
                        return;
                }
        }
}

int held_phase_grant(tier_client *c, tier_tensor *t, int tier) {
        /* by id: one entry per tensor and tier, whichever handle (one closed since included) got the grant */
        for (size_t i = 0; i < c->n_held; i++)
                if (c->held[i].phase && c->held[i].id == t->id && c->held[i].tier == tier) {
                        c->held[i].phase_seq = c->plan_seq;
                        return 0;
                }
        return held_add(c, (ClientHeld) { .t = t, .id = t->id, .tier = tier, .write = true, .phase = true,
                                          .phase_seq = c->plan_seq });
}

void held_phase_end(tier_client *c) {
        for (size_t i = c->n_held; i > 0; i--)
                if (c->held[i - 1].phase && c->held[i - 1].phase_seq + 1 < c->plan_seq)
                        held_del(c, i - 1);
}

void held_phase_clear(tier_client *c) {
        for (size_t i = c->n_held; i > 0; i--)
                if (c->held[i - 1].phase)
                        held_del(c, i - 1);
}

int held_forget_tensor(tier_client *c, const tier_tensor *t) {
        int r = 0;

        for (size_t i = c->n_held; i > 0; i--) {
                ClientHeld *h = &c->held[i - 1];

                if (h->t != t)
                        continue;
                /* a pin's or a phase grant's: tierd holds either until its unpin or its phase's end */
                if (!t->gone) {
                        h->name = strdup(t->name);
                        if (h->name) {
                                h->t = NULL;
                                continue;
                        }
                        r = -ENOMEM;
                }
                held_del(c, i - 1);
        }
        return r;
}

void held_clear(tier_client *c) {
        for (size_t i = 0; i < c->n_held; i++)
                free(c->held[i].name);
        c->n_held = 0;
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
        for (size_t i = 0; i < c->n_held; i++) {
                const ClientHeld *h = &c->held[i];

                if (!h->write || (h->t && h->t->gone))
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
