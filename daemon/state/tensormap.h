/* SPDX-License-Identifier: MIT */
/* tensormap.h: name -> pointer hash table (open addressing, linear probing). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "proto/macro.h"

typedef struct TensorMap TensorMap;

TensorMap *tensormap_new(void);
TensorMap *tensormap_free(TensorMap *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(TensorMap *, tensormap_free);
/* -EEXIST if present; the key is borrowed and must outlive the entry. */
int tensormap_put(TensorMap *m, const char *key, void *value);
void *tensormap_get(const TensorMap *m, const char *key);
void *tensormap_remove(TensorMap *m, const char *key);
size_t tensormap_size(const TensorMap *m);
/* The map's keyed hash of @key (each map has its own random key); for tests. */
uint64_t tensormap_hash(const TensorMap *m, const char *key);
