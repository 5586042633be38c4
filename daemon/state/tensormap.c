/* SPDX-License-Identifier: MIT */
/* tensormap.c: name -> pointer hash table (open addressing, linear probing). */

/*
 * Theory of operation: FNV-1a hashes, power-of-two table, load factor kept
 * below 1/2, deletion by backward shift (no tombstones).  Keys are borrowed
 * from the values (the tensor's own name).
 */

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/state/tensormap.h"

typedef struct Entry {
        const char *key;
        void *value;
} Entry;

struct TensorMap {
        Entry *e;
        size_t cap;     /* power of two */
        size_t n;
};

static uint64_t hash(const char *s) {
        uint64_t h = 0xcbf29ce484222325ull;

        for (; *s; s++) {
                h ^= (uint8_t) *s;
                h *= 0x100000001b3ull;
        }
        return h;
}

TensorMap *tensormap_new(void) {
        TensorMap *m = calloc(1, sizeof(*m));

        if (!m)
                return NULL;
        m->cap = 16;
        m->e = calloc(m->cap, sizeof(Entry));
        if (!m->e) {
                free(m);
                return NULL;
        }
        return m;
}

TensorMap *tensormap_free(TensorMap *m) {
        if (m)
                free(m->e);
        free(m);
        return NULL;
}

static size_t find_slot(const TensorMap *m, const char *key) {
        size_t i = hash(key) & (m->cap - 1);

        while (m->e[i].key && strcmp(m->e[i].key, key) != 0)
                i = (i + 1) & (m->cap - 1);
        return i;
}

static int grow(TensorMap *m) {
        Entry *old = m->e;
        size_t oldcap = m->cap;

        m->e = calloc(oldcap * 2, sizeof(Entry));
        if (!m->e) {
                m->e = old;
                return -ENOMEM;
        }
        m->cap = oldcap * 2;
        for (size_t i = 0; i < oldcap; i++)
                if (old[i].key)
                        m->e[find_slot(m, old[i].key)] = old[i];
        free(old);
        return 0;
}

int tensormap_put(TensorMap *m, const char *key, void *value) {
        size_t i;

        if ((m->n + 1) * 2 > m->cap) {
                int r = grow(m);
                if (r < 0)
                        return r;
        }
        i = find_slot(m, key);
        if (m->e[i].key)
                return -EEXIST;
        m->e[i] = (Entry) { key, value };
        m->n++;
        return 0;
}

void *tensormap_get(const TensorMap *m, const char *key) {
        size_t i = find_slot(m, key);

        return m->e[i].key ? m->e[i].value : NULL;
}

void *tensormap_remove(TensorMap *m, const char *key) {
        size_t i = find_slot(m, key), j;
        void *v;

        if (!m->e[i].key)
                return NULL;
        v = m->e[i].value;
        m->e[i] = (Entry) {};
        m->n--;
        /* backward-shift the cluster after the hole */
        j = i;
        for (;;) {
                size_t k;

                j = (j + 1) & (m->cap - 1);
                if (!m->e[j].key)
                        break;
                k = hash(m->e[j].key) & (m->cap - 1);
                /* move e[j] into the hole i if its home k is not in (i, j] cyclically */
                if ((j > i && (k <= i || k > j)) || (j < i && (k <= i && k > j))) {
                        m->e[i] = m->e[j];
                        m->e[j] = (Entry) {};
                        i = j;
                }
        }
        return v;
}

size_t tensormap_size(const TensorMap *m) {
        return m->n;
}
