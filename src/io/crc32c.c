/* CRC-32C by slicing-by-8 (io/crc32c.h): eight table lookups per 8 bytes, portable C. The tables
 * are built once (pthread_once), 8 KiB. "123456789" gives 0xE3069283 (the standard check). */
#include "io/crc32c.h"

#include <pthread.h>
#include <string.h>

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void build_tables(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++)
      c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1; /* 0x1EDC6F41 reflected */
    table[0][i] = c;
  }
  for (int s = 1; s < 8; s++)
    for (int i = 0; i < 256; i++)
      table[s][i] = (table[s - 1][i] >> 8) ^ table[0][table[s - 1][i] & 0xFF];
}

uint32_t crc32c_extend(uint32_t crc, const void *p, size_t n) {
  pthread_once(&table_once, build_tables);
  const unsigned char *b = p;
  uint32_t c = ~crc;
  for (; n >= 8; n -= 8, b += 8) {
    uint32_t lo, hi;
    memcpy(&lo, b, 4); /* little-endian hosts, as the safetensors data itself */
    memcpy(&hi, b + 4, 4);
    lo ^= c;
    c = table[7][lo & 0xFF] ^ table[6][lo >> 8 & 0xFF] ^ table[5][lo >> 16 & 0xFF] ^
        table[4][lo >> 24] ^ table[3][hi & 0xFF] ^ table[2][hi >> 8 & 0xFF] ^
        table[1][hi >> 16 & 0xFF] ^ table[0][hi >> 24];
  }
  for (; n; n--, b++)
    c = (c >> 8) ^ table[0][(c ^ *b) & 0xFF];
  return ~c;
}
