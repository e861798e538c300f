/* crc32c.h — CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), as
 * iSCSI, ext4 and TensorFlow's TFRecord framing use it. */
#ifndef FT_CRC32C_H
#define FT_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC-32C of n bytes at p, continuing from crc (0 to start):
 * ft_crc32c(0, "123456789", 9) == 0xe3069283. */
uint32_t ft_crc32c(uint32_t crc, const void *p, size_t n);

#endif
