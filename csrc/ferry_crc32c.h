/* CRC32C (Castagnoli) for Ferry's C accelerators (wal/_accel.c, checkpoint/_pageaccel.c):
 * one implementation, included by both (each extension gets its own static copy).
 *
 * SSE4.2 crc32 instructions when the CPU has them (checked at run time; the function
 * is compiled for SSE4.2 by a target attribute, the rest of the module is not), else a
 * slicing-by-8 table. Long buffers run three interleaved streams, which hides the
 * instruction's 3-cycle latency; the streams' registers are joined by "appending
 * zeros" to the earlier ones, a linear operator on the 32-bit register precomputed as
 * four 256-entry tables (the method of Mark Adler's crc32c.c).
 *
 *   ferry_crc_init()              once, at module import
 *   ferry_crc32c(value, p, n)     == crc32c.crc32c(p[:n], value) (finished, chainable)
 *   ferry_crc_update(reg, p, n)   the raw register (the caller inverts before/after)
 *   ferry_crc_hw_available        the CPU has SSE4.2
 *   ferry_crc_use_hw              the hardware path is on (tests turn it off)
 */
#ifndef FERRY_CRC32C_H
#define FERRY_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define FERRY_CRC_X86 1
#else
#define FERRY_CRC_X86 0
#endif

#define FERRY_CRC_POLY 0x82F63B78u     /* reflected */
#define FERRY_CRC_LONG 1024            /* bytes per stream: long, then short rounds */
#define FERRY_CRC_SHORT 128

static uint32_t ferry_crc_table[8][256];
static uint32_t ferry_crc_long[4][256], ferry_crc_short[4][256];
static int ferry_crc_hw_available = 0;
static int ferry_crc_use_hw = 0;

static inline uint32_t ferry_crc_rd32(const uint8_t *p)
{
    uint32_t w;
    memcpy(&w, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap32(w);
#endif
    return w;
}

static uint32_t ferry_crc_sw(uint32_t c, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = ferry_crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t lo = c ^ ferry_crc_rd32(p), hi = ferry_crc_rd32(p + 4);
        c = ferry_crc_table[7][lo & 0xff] ^ ferry_crc_table[6][(lo >> 8) & 0xff] ^
            ferry_crc_table[5][(lo >> 16) & 0xff] ^ ferry_crc_table[4][lo >> 24] ^
            ferry_crc_table[3][hi & 0xff] ^ ferry_crc_table[2][(hi >> 8) & 0xff] ^
            ferry_crc_table[1][(hi >> 16) & 0xff] ^ ferry_crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = ferry_crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

static uint32_t ferry_gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1)
            sum ^= *mat;
    return sum;
}

static void ferry_gf2_square(uint32_t *square, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++)
        square[n] = ferry_gf2_times(mat, mat[n]);
}

/* The operator appending ``len`` (a power of two) zero bytes to a CRC register. */
static void ferry_zeros_op(uint32_t *even, size_t len)
{
    uint32_t odd[32];
    odd[0] = FERRY_CRC_POLY;               /* one zero bit */
    for (int n = 1; n < 32; n++)
        odd[n] = 1u << (n - 1);
    ferry_gf2_square(even, odd);           /* two bits */
    ferry_gf2_square(odd, even);           /* four bits */
    do {
        ferry_gf2_square(even, odd);       /* 1, 4, 16 ... bytes */
        len >>= 1;
        if (len == 0)
            return;
        ferry_gf2_square(odd, even);       /* 2, 8, 32 ... bytes */
        len >>= 1;
    } while (len);
    memcpy(even, odd, sizeof(odd));
}

static void ferry_zeros_table(uint32_t zeros[][256], size_t len)
{
    uint32_t op[32];
    ferry_zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        zeros[0][n] = ferry_gf2_times(op, n);
        zeros[1][n] = ferry_gf2_times(op, n << 8);
        zeros[2][n] = ferry_gf2_times(op, n << 16);
        zeros[3][n] = ferry_gf2_times(op, n << 24);
    }
}

static inline uint32_t ferry_crc_shift(uint32_t zeros[][256], uint32_t crc)
{
    return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff] ^
           zeros[3][crc >> 24];
}

#if FERRY_CRC_X86 && defined(__x86_64__)
#define FERRY_CRC_HW 1
__attribute__((target("sse4.2")))
static uint32_t ferry_crc_hw(uint32_t c32, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c32 = _mm_crc32_u8(c32, *p++);
        n--;
    }
    uint64_t c0 = c32;
#define FERRY_CRC_3WAY(BLK, TABLE)                                                  \
    while (n >= 3 * (BLK)) {                                                        \
        uint64_t c1 = 0, c2 = 0, a, b, d;                                           \
        const uint8_t *end = p + (BLK);                                             \
        do {                                                                        \
            memcpy(&a, p, 8);                                                       \
            memcpy(&b, p + (BLK), 8);                                               \
            memcpy(&d, p + 2 * (BLK), 8);                                           \
            c0 = _mm_crc32_u64(c0, a);                                              \
            c1 = _mm_crc32_u64(c1, b);                                              \
            c2 = _mm_crc32_u64(c2, d);                                              \
            p += 8;                                                                 \
        } while (p < end);                                                          \
        c0 = ferry_crc_shift(TABLE, (uint32_t)c0) ^ (uint32_t)c1;                   \
        c0 = ferry_crc_shift(TABLE, (uint32_t)c0) ^ (uint32_t)c2;                   \
        p += 2 * (BLK);                                                             \
        n -= 3 * (BLK);                                                             \
    }
    FERRY_CRC_3WAY(FERRY_CRC_LONG, ferry_crc_long)
    FERRY_CRC_3WAY(FERRY_CRC_SHORT, ferry_crc_short)
#undef FERRY_CRC_3WAY
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c0 = _mm_crc32_u64(c0, v);
        p += 8;
        n -= 8;
    }
    c32 = (uint32_t)c0;
    while (n--)
        c32 = _mm_crc32_u8(c32, *p++);
    return c32;
}
#endif

static void ferry_crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ FERRY_CRC_POLY : c >> 1;
        ferry_crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int s = 1; s < 8; s++)
            ferry_crc_table[s][i] = (ferry_crc_table[s - 1][i] >> 8) ^
                                    ferry_crc_table[0][ferry_crc_table[s - 1][i] & 0xff];
    ferry_zeros_table(ferry_crc_long, FERRY_CRC_LONG);
    ferry_zeros_table(ferry_crc_short, FERRY_CRC_SHORT);
#ifdef FERRY_CRC_HW
    __builtin_cpu_init();
    ferry_crc_hw_available = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
    ferry_crc_use_hw = ferry_crc_hw_available;
}

/* The raw register after p[0:n] (no inversions). */
static inline uint32_t ferry_crc_update(uint32_t reg, const void *p, size_t n)
{
#ifdef FERRY_CRC_HW
    if (ferry_crc_use_hw)
        return ferry_crc_hw(reg, (const uint8_t *)p, n);
#endif
    return ferry_crc_sw(reg, (const uint8_t *)p, n);
}

/* crc32c.crc32c(data, value): the finished CRC of p[0:n] continuing from ``value``. */
static inline uint32_t ferry_crc32c(uint32_t value, const void *p, size_t n)
{
    return ~ferry_crc_update(~value, p, n);
}

#endif /* FERRY_CRC32C_H */
