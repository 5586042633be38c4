/* SPDX-License-Identifier: MIT */
/* list.h: intrusive circular doubly-linked lists. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

typedef struct List {
        struct List *prev, *next;
} List;

#define LIST_INIT(name) { &(name), &(name) }

static inline void list_init(List *l) {
        l->prev = l->next = l;
}

static inline bool list_empty(const List *l) {
        return l->next == l;
}

/* A node that was list_init()ed or list_del()ed is "unlinked". */
static inline bool list_linked(const List *n) {
        return n->next != n && n->next != NULL;
}

static inline void list_add_tail(List *head, List *n) {
        n->prev = head->prev;
        n->next = head;
        head->prev->next = n;
        head->prev = n;
}

static inline void list_del(List *n) {
        if (!n->next)
                return;
        n->prev->next = n->next;
        n->next->prev = n->prev;
        n->prev = n->next = n;
}

/* Move every node of @from to the tail of @to. */
static inline void list_splice_tail(List *to, List *from) {
        if (list_empty(from))
                return;
        from->next->prev = to->prev;
        to->prev->next = from->next;
        from->prev->next = to;
        to->prev = from->prev;
        list_init(from);
}

#define list_entry(ptr, type, member) ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

#define list_for_each_safe(pos, tmp, head) \
        for (List *pos = (head)->next, *tmp = pos->next; pos != (head); pos = tmp, tmp = pos->next)
