/* SPDX-License-Identifier: MIT */
/* crc32c.h: CRC-32C (Castagnoli), hardware-accelerated where the CPU has it. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Continue a CRC-32C over @len bytes; start with crc = 0.  crc32c(0, "123456789", 9) == 0xe3069283. */
uint32_t crc32c(uint32_t crc, const void *buf, size_t len);
/* Portable table implementation (used by tests to cross-check the fast path). */
uint32_t crc32c_sw(uint32_t crc, const void *buf, size_t len);
