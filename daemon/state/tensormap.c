/* SPDX-License-Identifier: MIT */
/* tensormap.c: name -> pointer hash table (open addressing, linear probing). */

/*
 * Theory of operation: names are chosen by clients, so the hash is keyed:
 * SipHash-1-3 with a random 128-bit key per map (getrandom()), so that no
 * client can pick names that collide into one long probe sequence and make
 * every lookup in the event loop linear.  Power-of-two table, load factor
 * kept below 1/2, deletion by backward shift (no tombstones).  Keys are
 * borrowed from the values (the tensor's own name).
 */

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "daemon/state/tensormap.h"

typedef struct Entry {
        const char *key;
        void *value;
} Entry;

struct TensorMap {
        Entry *e;
        size_t cap;     /* power of two */
        size_t n;
        uint64_t k0, k1; /* the hash key */
};

/* ---- SipHash-1-3 (Aumasson, Bernstein), keyed per map ---------------------------------------- */

static inline uint64_t rotl(uint64_t x, unsigned b) {
        return (x << b) | (x >> (64 - b));
}

#define SIPROUND(v0, v1, v2, v3)                                                        \
        do {                                                                            \
                v0 += v1; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32);               \
                v2 += v3; v3 = rotl(v3, 16); v3 ^= v2;                                  \
                v0 += v3; v3 = rotl(v3, 21); v3 ^= v0;                                  \
                v2 += v1; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32);               \
        } while (0)

static uint64_t siphash13(uint64_t k0, uint64_t k1, const uint8_t *in, size_t len) {
        uint64_t v0 = 0x736f6d6570736575ull ^ k0, v1 = 0x646f72616e646f6dull ^ k1;
        uint64_t v2 = 0x6c7967656e657261ull ^ k0, v3 = 0x7465646279746573ull ^ k1;
        uint64_t b = (uint64_t) len << 56, m;
        size_t i;

        for (i = 0; i + 8 <= len; i += 8) {
                memcpy(&m, in + i, 8);          /* little endian assumed: x86-64, arm64 */
                v3 ^= m;
                SIPROUND(v0, v1, v2, v3);
                v0 ^= m;
        }
        for (size_t k = 0; i + k < len; k++)
                b |= (uint64_t) in[i + k] << (8 * k);
        v3 ^= b;
        SIPROUND(v0, v1, v2, v3);
        v0 ^= b;
        v2 ^= 0xff;
        for (int r = 0; r < 3; r++)
                SIPROUND(v0, v1, v2, v3);
        return v0 ^ v1 ^ v2 ^ v3;
}

uint64_t tensormap_hash(const TensorMap *m, const char *key) {
        return siphash13(m->k0, m->k1, (const uint8_t *) key, strlen(key));
}

static uint64_t hash(const TensorMap *m, const char *key) {
        return tensormap_hash(m, key);
}

/* A random key; without entropy yet (early boot), one that still differs per map and run. */
static void map_seed(TensorMap *m) {
        uint64_t k[2];
        struct timespec ts;

        if (getrandom(k, sizeof(k), GRND_INSECURE) == (ssize_t) sizeof(k) ||
            getrandom(k, sizeof(k), GRND_NONBLOCK) == (ssize_t) sizeof(k)) {
                m->k0 = k[0];
                m->k1 = k[1];
                return;
        }
        clock_gettime(CLOCK_MONOTONIC, &ts);
        m->k0 = (uint64_t) ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t) (uintptr_t) m;
        m->k1 = (uint64_t) ts.tv_sec * 0xc2b2ae3d27d4eb4full ^ (uint64_t) getpid();
}

TensorMap *tensormap_new(void) {
        TensorMap *m = calloc(1, sizeof(*m));

        if (!m)
                return NULL;
        map_seed(m);
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
        size_t i = hash(m, key) & (m->cap - 1);

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
                k = hash(m, m->e[j].key) & (m->cap - 1);
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
