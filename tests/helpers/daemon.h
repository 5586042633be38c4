/* SPDX-License-Identifier: MIT */
/* daemon.h: the old name of tests/helpers/harness.h, kept for bench/bench-vram-cuda.c. */
#pragma once

/* Include "tests/helpers/harness.h" instead; this file goes once nothing includes it. */
#include "tests/helpers/harness.h"
