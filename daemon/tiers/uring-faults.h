/* SPDX-License-Identifier: MIT */
/* uring-faults.h: tierd's hooks into the io_uring queue (util/uring.c): its log, and injected NVMe faults. */
#pragma once

typedef struct FaultSet FaultSet;
typedef struct Uring Uring;

/*
 * uring_faults_attach() - log what goes wrong in @u's submissions, and
 * inject the faults of @f (borrowed; NULL: none, TIERD_TEST_FAULTS) into
 * the requests queued from now on.
 */
void uring_faults_attach(Uring *u, FaultSet *f);
