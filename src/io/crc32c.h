/* CRC-32C (Castagnoli, the polynomial iSCSI, ext4 and Python's google-crc32c use; reflected,
 * initial value and final XOR 0xFFFFFFFF): a checkpoint's data section checksum. */
#ifndef LUTRA_IO_CRC32C_H
#define LUTRA_IO_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* crc of the bytes so far (0 before the first) extended by p[0..n) */
uint32_t crc32c_extend(uint32_t crc, const void *p, size_t n);

#endif
