/* The partition page file layout, for the C accelerators.
 *
 * GENERATED from checkpoint/layout.py by scripts/page_layout_h.py: do not edit;
 * change the layout module and regenerate (tests/checkpoint/test_layout.py
 * fails while this file is stale). The format: docs/formats.md. */
#ifndef FERRY_PAGE_LAYOUT_H
#define FERRY_PAGE_LAYOUT_H

#define FERRY_PG_FORMAT_VERSION 1               /* meta page: format version */
#define FERRY_PG_MAGIC          "FERRYPG\0"     /* meta page: first 8 bytes of the body */
#define FERRY_PG_MAGIC_LEN      8
#define FERRY_PG_MIN_PAGE       1024            /* page sizes: powers of two in MIN..MAX */
#define FERRY_PG_MAX_PAGE       65536           /* slot offsets are u16 */
#define FERRY_PG_MAX_VALUE      16777216u       /* largest value (overflow chains) */
#define FERRY_PG_HDR            16              /* page header: crc u32 | index u32 | type u8 | flags u8 | count u16 | aux u32 */
#define FERRY_PG_OFF_CRC        0
#define FERRY_PG_OFF_INDEX      4
#define FERRY_PG_OFF_TYPE       8
#define FERRY_PG_OFF_FLAGS      9
#define FERRY_PG_OFF_COUNT      10              /* DATA: slots; OVERFLOW: payload bytes */
#define FERRY_PG_OFF_AUX        12              /* DATA: heap start; OVERFLOW: next page */
#define FERRY_PG_CRC_FROM       4               /* the CRC covers [CRC_FROM, page_size) */
#define FERRY_PG_SLOT           2               /* a slot: u16 entry offset, 0 = empty */
#define FERRY_PG_PTR            4               /* first overflow page u32 */
#define FERRY_PG_ENTRY          15              /* entry: flags u8 | key_len u16 | value_len u32 | counter u64 */
#define FERRY_PG_OVF_ENTRY      19              /* ... | key | first_overflow_page u32 */
#define FERRY_PG_E_FLAGS        0
#define FERRY_PG_E_KEY_LEN      1
#define FERRY_PG_E_VALUE_LEN    3
#define FERRY_PG_E_COUNTER      7
#define FERRY_PG_M_MAGIC        0               /* meta fields, from the end of the header */
#define FERRY_PG_M_VERSION      8
#define FERRY_PG_M_PARTITION    12
#define FERRY_PG_M_PAGE_SIZE    16
#define FERRY_PG_M_PAGE_COUNT   20
#define FERRY_PG_M_COUNTER      24
#define FERRY_PG_T_META         1               /* page type */
#define FERRY_PG_T_DATA         2               /* page type */
#define FERRY_PG_T_OVERFLOW     3               /* page type */
#define FERRY_PG_T_FREE         4               /* page type */
#define FERRY_PG_F_TOMBSTONE    1               /* entry flag */
#define FERRY_PG_F_OVERFLOW     2               /* entry flag */
#define FERRY_PG_F_KNOWN        3               /* every entry flag */

#endif
