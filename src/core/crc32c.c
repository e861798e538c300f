/* crc32c.c — CRC-32C a byte at a time from a 256-entry table. Its users
 * (TFRecord framing of a few hundred bytes per training step) need no
 * faster path. */
#include "core/crc32c.h"

#include <pthread.h>

/* table[b]: the CRC register after shifting byte b through it */
static uint32_t table[256];

static void init_table(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        table[b] = c;
    }
}

uint32_t ft_crc32c(uint32_t crc, const void *p, size_t n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init_table);
    const unsigned char *s = p;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ s[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}
