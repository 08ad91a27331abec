/* checkpoint._pageaccel: the bulk fast path of the partition page decoder.
 *
 * An optional accelerator of checkpoint/pagefile.py (the format is documented there
 * and in docs/formats.md). It does the common case over a whole read chunk of pages
 * in one call: CRC32C, header and slot-structure checks, cutting keys/values out of
 * DATA pages and joining overflow chains. It never produces an error message: at
 * anything unusual (a page that fails a check, a chain it cannot follow) it stops and
 * returns the page's position, and pagefile.py runs its pure-Python code for that
 * page, so reasons, order and errors are those of the reference by construction.
 * The predicates here must be exactly those of check_page/_check_data/_chain_value:
 * stricter only costs speed (Python re-checks the page), laxer would be a bug.
 *
 * scan_keys (ABI 2) is the open/install scan of Partition._scan without a Python
 * object per key: it hashes each key (xxh3-64, the key index's hash) straight from
 * the chunk into packed (hash, location) columns and fills the space map, roomy set
 * and FREE list, with the same stop-and-hand-back rule as everything here.
 *
 * decode_live (ABI 3) is decode's live-pairs case for the index rebuild without a
 * Python object per entry: each pair is a column record of offsets into the read
 * chunk (an overflow chain's value is copied to a spill buffer), and the index feed
 * (indexes/_ixaccel.c feed_columns) reads keys and values straight from there.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* scan_keys hashes keys with the system's xxhash.h (libxxhash-dev, header-only); a
 * build without it still has the rest of the decoder (pagefile.py checks for scan_keys). */
#if defined(__has_include)
#if __has_include(<xxhash.h>)
#define XXH_INLINE_ALL
#include <xxhash.h>
#define HAVE_XXHASH 1
#endif
#endif

#define ABI_VERSION 3      /* pagefile.py refuses a module built from another version
                            * (2: scan_keys, the open scan's hashes; 3: decode_live, the
                            * index feed's columns) */
/* The page layout comes from csrc/ferry_page_layout.h, generated from
 * checkpoint/layout.py (the one definition): short names for its numbers. */
#include "ferry_page_layout.h"
#define HDR FERRY_PG_HDR
#define ENTRY_SIZE FERRY_PG_ENTRY
#define OVF_ENTRY FERRY_PG_OVF_ENTRY
#define PTR_SIZE FERRY_PG_PTR
#define T_META FERRY_PG_T_META
#define T_DATA FERRY_PG_T_DATA
#define T_OVF FERRY_PG_T_OVERFLOW
#define T_FREE FERRY_PG_T_FREE
#define F_TOMB FERRY_PG_F_TOMBSTONE
#define F_OVF FERRY_PG_F_OVERFLOW
#define F_KNOWN FERRY_PG_F_KNOWN
#define MAX_VALUE FERRY_PG_MAX_VALUE
#define FORMAT_VERSION FERRY_PG_FORMAT_VERSION

static inline uint32_t rd16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static inline uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

/* -- CRC32C: the one implementation of Ferry's C accelerators (csrc/) --------------- */
#include "ferry_crc32c.h"
#define crc32c ferry_crc32c
#define crc_init ferry_crc_init
#define crc_use_hw ferry_crc_use_hw
#define crc_hw_available ferry_crc_hw_available

/* -- page checks (exactly check_page / _check_data) --------------------------------- */

/* _check_data: slot directory, heap and every entry inside the page. */
static int data_ok(const uint8_t *pg, uint32_t ps)
{
    uint32_t count = rd16(pg + FERRY_PG_OFF_COUNT), heap = rd32(pg + FERRY_PG_OFF_AUX);
    if (!((uint64_t)HDR + 2 * (uint64_t)count <= heap && heap <= ps))
        return 0;
    for (uint32_t s = 0; s < count; s++) {
        uint32_t off = rd16(pg + HDR + 2 * s);
        if (!off)
            continue;
        if (off < heap || (uint64_t)off + ENTRY_SIZE > ps)
            return 0;
        uint32_t flags = pg[off + FERRY_PG_E_FLAGS], klen = rd16(pg + off + FERRY_PG_E_KEY_LEN), vlen = rd32(pg + off + FERRY_PG_E_VALUE_LEN);
        uint64_t stored = flags & F_OVF ? PTR_SIZE : vlen;
        if (flags & ~F_KNOWN)
            return 0;
        if ((uint64_t)off + ENTRY_SIZE + klen + stored > ps)
            return 0;
        if ((flags & F_TOMB) && vlen)
            return 0;
        if (vlen > MAX_VALUE)
            return 0;
    }
    return 1;
}

static int crc_ok(const uint8_t *pg, uint32_t ps) { return rd32(pg + FERRY_PG_OFF_CRC) == crc32c(0, pg + FERRY_PG_CRC_FROM, ps - FERRY_PG_CRC_FROM); }

/* check_page of a whole page: 1 when it would return None. */
static int page_ok(const uint8_t *pg, uint64_t index, uint32_t ps)
{
    uint32_t type = pg[FERRY_PG_OFF_TYPE];
    if (!crc_ok(pg, ps) || rd32(pg + FERRY_PG_OFF_INDEX) != index)
        return 0;
    if (type < T_META || type > T_FREE)
        return 0;
    if ((index == 0) != (type == T_META))
        return 0;
    switch (type) {
    case T_META: {
        const uint8_t *m = pg + HDR;
        if (memcmp(m + FERRY_PG_M_MAGIC, FERRY_PG_MAGIC, FERRY_PG_MAGIC_LEN) != 0
            || rd16(m + FERRY_PG_M_VERSION) != FORMAT_VERSION)
            return 0;
        if (rd32(m + FERRY_PG_M_PAGE_SIZE) != ps || rd32(m + FERRY_PG_M_PAGE_COUNT) < 1)
            return 0;
        return 1;
    }
    case T_OVF:
        return rd16(pg + FERRY_PG_OFF_COUNT) <= ps - HDR;
    case T_DATA:
        return data_ok(pg, ps);
    default:
        return 1;
    }
}

/* -- overflow chains (exactly _chain_value) ------------------------------------------ */

typedef struct {
    uint32_t ps, pcount;
    uint8_t *checked;
    Py_ssize_t ncheck;
    PyObject *fetch;          /* page -> (first page, bytes): reader.held */
    /* the buffer the walk is in: pages [cfirst, cend) at cbase */
    const uint8_t *cbase;
    uint64_t cfirst, cend;
    Py_buffer held;           /* keeps the last fetched buffer alive */
    int have_held;
} chainctx;

static void ctx_init(chainctx *cx, uint32_t ps, uint32_t pcount, Py_buffer *checked,
                     PyObject *fetch)
{
    cx->ps = ps;
    cx->pcount = pcount;
    cx->checked = (uint8_t *)checked->buf;
    cx->ncheck = checked->len;
    cx->fetch = fetch;
}

/* The walk is in the chunk again (a chain's fetch may have moved it): pages
 * [first, first + n) at chunk. */
static void ctx_chunk(chainctx *cx, const uint8_t *chunk, uint64_t first, Py_ssize_t n)
{
    cx->cbase = chunk;
    cx->cfirst = first;
    cx->cend = first + (uint64_t)n;
}

static void ctx_release(chainctx *cx)
{
    if (cx->have_held) {
        PyBuffer_Release(&cx->held);
        cx->have_held = 0;
    }
}

/* Make page ``page`` current through the fetch callback: 1 done, 0 not available
 * (short read), -1 a Python exception. */
static int ctx_fetch(chainctx *cx, uint32_t page)
{
    PyObject *r = PyObject_CallFunction(cx->fetch, "I", page);
    if (!r)
        return -1;
    unsigned long long first;
    PyObject *data;
    if (!PyArg_ParseTuple(r, "KO", &first, &data)) {
        Py_DECREF(r);
        return -1;
    }
    Py_buffer b;
    if (PyObject_GetBuffer(data, &b, PyBUF_SIMPLE) < 0) {
        Py_DECREF(r);
        return -1;
    }
    Py_DECREF(r);             /* the buffer view keeps ``data`` alive */
    ctx_release(cx);
    cx->held = b;
    cx->have_held = 1;
    if (page < first || ((uint64_t)page - first + 1) * cx->ps > (uint64_t)b.len) {
        cx->cfirst = cx->cend = 0;
        return 0;
    }
    cx->cbase = (const uint8_t *)b.buf;
    cx->cfirst = first;
    cx->cend = first + (uint64_t)b.len / cx->ps;
    return 1;
}

/* A set of visited pages (page 0 never enters: it ends a walk before). */
typedef struct {
    uint32_t small[64];
    uint32_t *table;
    uint32_t mask, n;
} pageset;

static int set_init(pageset *s, uint64_t limit)
{
    s->n = 0;
    s->table = NULL;
    s->mask = 0;
    if (limit > 64) {
        uint64_t size = 128;
        while (size < 2 * limit)
            size <<= 1;
        s->table = calloc(size, sizeof(uint32_t));
        if (!s->table)
            return -1;
        s->mask = (uint32_t)(size - 1);
    }
    return 0;
}

static int set_add(pageset *s, uint32_t page)   /* 1 when added, 0 when present */
{
    if (!s->table) {
        for (uint32_t i = 0; i < s->n; i++)
            if (s->small[i] == page)
                return 0;
        s->small[s->n++] = page;
        return 1;
    }
    uint32_t h = (page * 2654435761u) & s->mask;
    while (s->table[h]) {
        if (s->table[h] == page)
            return 0;
        h = (h + 1) & s->mask;
    }
    s->table[h] = page;
    s->n++;
    return 1;
}

static int set_has(pageset *s, uint32_t page)
{
    if (!s->table) {
        for (uint32_t i = 0; i < s->n; i++)
            if (s->small[i] == page)
                return 1;
        return 0;
    }
    uint32_t h = (page * 2654435761u) & s->mask;
    while (s->table[h]) {
        if (s->table[h] == page)
            return 1;
        h = (h + 1) & s->mask;
    }
    return 0;
}

/* The value of an intact chain as a new bytes object; NULL with *err = 0 when
 * anything is wrong with the chain (the caller's Python code names the fault), NULL
 * with *err = 1 when a Python exception is set. Pages are marked checked as they
 * pass, in the same walk order as _chain_value, so the marks are the same. */
static PyObject *walk_chain(chainctx *cx, uint32_t page, uint64_t length, int *err)
{
    uint32_t ps = cx->ps, room = ps - HDR;
    uint64_t limit = length ? (length + room - 1) / room : 1;
    uint64_t got = 0;
    pageset seen;
    *err = 0;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)length);
    if (!out || set_init(&seen, limit) < 0) {
        Py_XDECREF(out);
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        *err = 1;
        return NULL;
    }
    uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);
    while (got < length) {
        if (page == 0 || page >= cx->pcount || seen.n >= limit || set_has(&seen, page))
            goto fault;
        if (!(cx->cfirst <= page && page < cx->cend)) {
            int r = ctx_fetch(cx, page);
            if (r < 0) {
                *err = 1;
                goto fault;
            }
            if (r == 0)
                goto fault;
        }
        const uint8_t *pg = cx->cbase + ((uint64_t)page - cx->cfirst) * ps;
        if (pg[FERRY_PG_OFF_TYPE] != T_OVF)
            goto fault;
        uint32_t used = rd16(pg + FERRY_PG_OFF_COUNT), nxt = rd32(pg + FERRY_PG_OFF_AUX);
        if (!(page < cx->ncheck && cx->checked[page])) {
            if (rd32(pg + FERRY_PG_OFF_INDEX) != page || used > room || !crc_ok(pg, ps))
                goto fault;
            if (page < cx->ncheck)
                cx->checked[page] = 1;
        }
        if (got + used > length)          /* would end with got != length */
            goto fault;
        memcpy(dst + got, pg + HDR, used);
        set_add(&seen, page);
        got += used;
        page = nxt;
    }
    free(seen.table);
    return out;
fault:
    free(seen.table);
    Py_DECREF(out);
    return NULL;
}

/* -- module functions ------------------------------------------------------------------ */

static PyObject *py_crc32c(PyObject *self, PyObject *args)
{
    Py_buffer b;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &b, &value))
        return NULL;
    uint32_t c = crc32c(value, (const uint8_t *)b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *py_set_hw(PyObject *self, PyObject *arg)
{
    /* test hook: use_hw(False) forces the table CRC; returns the previous setting */
    int want = PyObject_IsTrue(arg);
    if (want < 0)
        return NULL;
    int before = crc_use_hw;
    crc_use_hw = want && crc_hw_available;
    return PyBool_FromLong(before);
}

static PyObject *py_check_pages(PyObject *self, PyObject *args)
{
    /* check_pages(buf, first, page_size, j) -> index (from 0) of the first of the
     * whole pages j.. of buf that check_page would not pass, or their count. */
    Py_buffer b;
    unsigned long long first;
    unsigned int ps;
    Py_ssize_t j;
    if (!PyArg_ParseTuple(args, "y*KIn", &b, &first, &ps, &j))
        return NULL;
    Py_ssize_t n = ps ? b.len / ps : 0;
    const uint8_t *base = (const uint8_t *)b.buf;
    if (ps > HDR) {
        Py_BEGIN_ALLOW_THREADS
        for (; j < n; j++)
            if (!page_ok(base + (size_t)j * ps, first + j, ps))
                break;
        Py_END_ALLOW_THREADS
    }
    else
        j = j < n ? j : n;
    PyBuffer_Release(&b);
    return PyLong_FromSsize_t(j);
}

static PyObject *make_entry(PyTypeObject *etype, PyObject *key, PyObject *value,
                            uint64_t counter, int tomb)
{
    /* tuple.__new__(Entry, (key, value, counter, tomb)) without the argument tuple;
     * steals key and value */
    PyObject *c = PyLong_FromUnsignedLongLong(counter);
    PyObject *e = c ? etype->tp_alloc(etype, 4) : NULL;
    if (!e) {
        Py_XDECREF(c);
        Py_DECREF(key);
        Py_DECREF(value);
        return NULL;
    }
    PyTuple_SET_ITEM(e, 0, key);
    PyTuple_SET_ITEM(e, 1, value);
    PyTuple_SET_ITEM(e, 2, c);
    PyObject *t = tomb ? Py_True : Py_False;
    Py_INCREF(t);
    PyTuple_SET_ITEM(e, 3, t);
    return e;
}

static PyObject *make_pair(PyObject *key, PyObject *value)   /* steals both */
{
    PyObject *t = PyTuple_New(2);
    if (!t) {
        Py_DECREF(key);
        Py_DECREF(value);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, key);
    PyTuple_SET_ITEM(t, 1, value);
    return t;
}

/* Append the items of a valid DATA page: 1 done, 0 a chain fault (page left to
 * Python), -1 a Python exception, -2 an exception raised by ``fetch`` (a read). */
/* One page of a decode walk (decode and decode_live): 1 when it is a DATA page to
 * decode now, 0 when it is to be skipped (a checked non-DATA page, or a good page of
 * another type: marked checked), -1 when the walk stops here (Python names the problem). */
static int walk_page(const uint8_t *pg, uint64_t index, uint32_t ps, chainctx *cx)
{
    uint32_t type = pg[FERRY_PG_OFF_TYPE];
    if (index < (uint64_t)cx->ncheck && cx->checked[index]) {
        if (type != T_DATA)                /* checked already, by a chain that used it */
            return 0;
    }
    else if (type != T_DATA || rd32(pg + FERRY_PG_OFF_INDEX) != index || !crc_ok(pg, ps)) {
        if (type == T_DATA || !page_ok(pg, index, ps))
            return -1;
        if (index < (uint64_t)cx->ncheck)
            cx->checked[index] = 1;
        return 0;
    }
    return data_ok(pg, ps) ? 1 : -1;
}

/* The exception a page's decode raised, normalized with its traceback (owned; NULL only
 * if normalizing failed). */
static PyObject *take_exception(void)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb && v)
        PyException_SetTraceback(v, tb);
    Py_XDECREF(t);
    Py_XDECREF(tb);
    return v;
}

static int data_items(PyObject *out, const uint8_t *pg, chainctx *cx, int tombstones,
                      int pairs, PyTypeObject *etype)
{
    uint32_t count = rd16(pg + FERRY_PG_OFF_COUNT);
    for (uint32_t s = 0; s < count; s++) {
        uint32_t off = rd16(pg + HDR + 2 * s);
        if (!off)
            continue;
        const uint8_t *e = pg + off;
        uint32_t flags = e[FERRY_PG_E_FLAGS], klen = rd16(e + FERRY_PG_E_KEY_LEN), vlen = rd32(e + FERRY_PG_E_VALUE_LEN);
        uint64_t counter = rd64(e + FERRY_PG_E_COUNTER);
        PyObject *value;
        if (flags & F_TOMB) {
            if (!tombstones)
                continue;
            value = Py_None;
            Py_INCREF(value);
        }
        else if (flags & F_OVF) {
            int err;
            value = walk_chain(cx, rd32(e + ENTRY_SIZE + klen), vlen, &err);
            if (!value)
                return err ? -2 : 0;
        }
        else {
            value = PyBytes_FromStringAndSize((const char *)e + ENTRY_SIZE + klen, vlen);
            if (!value)
                return -1;
        }
        PyObject *key = PyBytes_FromStringAndSize((const char *)e + ENTRY_SIZE, klen);
        if (!key) {
            Py_DECREF(value);
            return -1;
        }
        PyObject *item = pairs ? make_pair(key, value)
                               : make_entry(etype, key, value, counter, (flags & F_TOMB) != 0);
        if (!item || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            return -1;
        }
        Py_DECREF(item);
    }
    return 1;
}

static PyObject *py_decode(PyObject *self, PyObject *args)
{
    /* decode(chunk, first, j, page_size, checked, tombstones, pairs, page_count, fetch,
     *        Entry) -> (items, j, exc): the items of pages j.. of the chunk, as _batches'
     * loop makes them, up to the first page it leaves to Python (returned j), or the
     * chunk's page count. exc: the exception a read of a chain page raised on page j
     * (Python hands out the items, then raises it, as its own walk would have). */
    Py_buffer b, ck;
    unsigned long long first;
    Py_ssize_t j;
    unsigned int ps, pcount;
    int tombstones, pairs;
    PyObject *fetch, *etype_obj;
    if (!PyArg_ParseTuple(args, "y*KnIw*ppIOO", &b, &first, &j, &ps, &ck, &tombstones, &pairs,
                          &pcount, &fetch, &etype_obj))
        return NULL;
    PyObject *out = NULL, *exc = NULL;
    if (!PyType_Check(etype_obj) ||
        !PyType_IsSubtype((PyTypeObject *)etype_obj, &PyTuple_Type) || ps <= HDR) {
        PyErr_SetString(PyExc_TypeError, "decode: Entry must be a tuple type, page size > 16");
        goto done;
    }
    PyTypeObject *etype = (PyTypeObject *)etype_obj;
    out = PyList_New(0);
    if (!out)
        goto done;
    chainctx cx = {0};
    ctx_init(&cx, ps, pcount, &ck, fetch);
    Py_ssize_t n = b.len / ps;
    const uint8_t *chunk = (const uint8_t *)b.buf;
    for (; j < n; j++) {
        const uint8_t *pg = chunk + (size_t)j * ps;
        int w = walk_page(pg, first + j, ps, &cx);
        if (w < 0)
            break;                         /* Python names the problem */
        if (w == 0)
            continue;
        Py_ssize_t mark = PyList_GET_SIZE(out);
        ctx_chunk(&cx, chunk, first, n);   /* chains start in this chunk */
        int r = data_items(out, pg, &cx, tombstones, pairs, etype);
        if (r == -2) {
            exc = take_exception();
            r = exc ? 0 : -1;
        }
        if (r <= 0) {
            if (PyList_SetSlice(out, mark, PyList_GET_SIZE(out), NULL) < 0 || r < 0) {
                ctx_release(&cx);
                Py_CLEAR(out);
                goto done;
            }
            break;                         /* a chain fault: Python walks this page */
        }
    }
    ctx_release(&cx);
done:
    PyBuffer_Release(&b);
    PyBuffer_Release(&ck);
    if (!out) {
        Py_XDECREF(exc);
        return NULL;
    }
    if (!exc) {
        exc = Py_None;
        Py_INCREF(exc);
    }
    return Py_BuildValue("(NnN)", out, j, exc);
}

static PyObject *py_chain_value(PyObject *self, PyObject *args)
{
    /* chain_value(page, length, page_size, page_count, checked, fetch) -> bytes | None:
     * _chain_value over pages given by fetch(page) -> (first page, bytes). */
    unsigned int page, ps, pcount;
    unsigned long long length;
    Py_buffer ck;
    PyObject *fetch;
    if (!PyArg_ParseTuple(args, "IKIIw*O", &page, &length, &ps, &pcount, &ck, &fetch))
        return NULL;
    if (ps <= HDR || length > MAX_VALUE) {
        PyBuffer_Release(&ck);
        Py_RETURN_NONE;                    /* not a chain this decoder follows: Python's */
    }
    chainctx cx = {0};
    ctx_init(&cx, ps, pcount, &ck, fetch);
    int err;
    PyObject *v = walk_chain(&cx, page, length, &err);
    ctx_release(&cx);
    PyBuffer_Release(&ck);
    if (v)
        return v;
    if (err)
        return NULL;
    Py_RETURN_NONE;
}

/* (a, b) from two new references (stolen, NULLs allowed: then NULL). */
static PyObject *pair_of(PyObject *a, PyObject *b)
{
    if (!a || !b) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        return NULL;
    }
    return make_pair(a, b);
}

/* (index, type, used, keys) of iter_page_keys; steals keys. */
static PyObject *page_tuple(uint64_t index, long type, uint64_t used, PyObject *keys)
{
    PyObject *t = PyTuple_New(4), *i = PyLong_FromUnsignedLongLong(index),
             *ty = PyLong_FromLong(type), *u = PyLong_FromUnsignedLongLong(used);
    if (!t || !i || !ty || !u || !keys) {
        Py_XDECREF(t);
        Py_XDECREF(i);
        Py_XDECREF(ty);
        Py_XDECREF(u);
        Py_XDECREF(keys);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, i);
    PyTuple_SET_ITEM(t, 1, ty);
    PyTuple_SET_ITEM(t, 2, u);
    PyTuple_SET_ITEM(t, 3, keys);
    return t;
}

static PyObject *py_page_keys(PyObject *self, PyObject *args)
{
    /* page_keys(chunk, first, j, page_size) -> (pages, j): iter_page_keys' tuples
     * (index, type, bytes in use, [(slot, key)]) of pages j.. up to the first page
     * left to Python (returned j), or the chunk's page count. */
    Py_buffer b;
    unsigned long long first;
    Py_ssize_t j;
    unsigned int ps;
    if (!PyArg_ParseTuple(args, "y*KnI", &b, &first, &j, &ps))
        return NULL;
    PyObject *out = PyList_New(0);
    if (!out || ps <= HDR)
        goto done;
    Py_ssize_t n = b.len / ps;
    const uint8_t *chunk = (const uint8_t *)b.buf;
    for (; j < n; j++) {
        const uint8_t *pg = chunk + (size_t)j * ps;
        uint64_t index = first + j;
        uint32_t type = pg[FERRY_PG_OFF_TYPE];
        PyObject *item = NULL, *keys = NULL;
        if (type != T_DATA || rd32(pg + FERRY_PG_OFF_INDEX) != index || !crc_ok(pg, ps)) {
            if (type == T_DATA || !page_ok(pg, index, ps))
                break;
            if (type != T_FREE)
                continue;
            item = page_tuple(index, T_FREE, 0, PyList_New(0));
        }
        else {
            if (!data_ok(pg, ps))
                break;
            uint32_t count = rd16(pg + FERRY_PG_OFF_COUNT);
            uint64_t used = HDR + 2 * (uint64_t)count;
            keys = PyList_New(0);
            if (!keys)
                goto fail;
            for (uint32_t s = 0; s < count; s++) {
                uint32_t off = rd16(pg + HDR + 2 * s);
                if (!off)
                    continue;
                const uint8_t *e = pg + off;
                uint32_t flags = e[FERRY_PG_E_FLAGS], klen = rd16(e + FERRY_PG_E_KEY_LEN), vlen = rd32(e + FERRY_PG_E_VALUE_LEN);
                used += ENTRY_SIZE + klen + (flags & F_OVF ? PTR_SIZE : vlen);
                PyObject *pair = pair_of(PyLong_FromUnsignedLong(s),
                    PyBytes_FromStringAndSize((const char *)e + ENTRY_SIZE, (Py_ssize_t)klen));
                if (!pair || PyList_Append(keys, pair) < 0) {
                    Py_XDECREF(pair);
                    Py_DECREF(keys);
                    goto fail;
                }
                Py_DECREF(pair);
            }
            item = page_tuple(index, T_DATA, used, keys);
        }
        if (!item || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
    }
done:
    PyBuffer_Release(&b);
    if (!out)
        return NULL;
    if (ps <= HDR) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_ValueError, "page_keys: page size must be > 16");
        return NULL;
    }
    return Py_BuildValue("(Nn)", out, j);
fail:
    Py_CLEAR(out);
    goto done;
}

/* -- the open scan's key hashes (scan_keys) -------------------------------------------- */
#ifdef HAVE_XXHASH

/* Growing u64 columns of (hash, location); malloc'd, copied out once per call. */
typedef struct {
    uint64_t *h, *l;
    Py_ssize_t n, cap;
} keycols;

static int keycols_reserve(keycols *c, Py_ssize_t more)
{
    if (c->n + more <= c->cap)
        return 0;
    Py_ssize_t cap = c->cap ? c->cap : 4096;
    while (cap < c->n + more)
        cap *= 2;
    uint64_t *nh = PyMem_Realloc(c->h, (size_t)cap * 8);
    if (!nh)
        return -1;
    c->h = nh;
    uint64_t *nl = PyMem_Realloc(c->l, (size_t)cap * 8);
    if (!nl)
        return -1;
    c->l = nl;
    c->cap = cap;
    return 0;
}

/* Append `index` (as an int) to a list (FREE pages) or a set (roomy pages). */
static int add_index(PyObject *to, uint64_t index, int is_set)
{
    PyObject *i = PyLong_FromUnsignedLongLong(index);
    if (!i)
        return -1;
    int r = is_set ? PySet_Add(to, i) : PyList_Append(to, i);
    Py_DECREF(i);
    return r;
}

static PyObject *py_scan_keys(PyObject *self, PyObject *args)
{
    /* scan_keys(chunk, first, j, page_size, need, space, quarter, roomy, free_pages)
     *   -> (hashes, locs, j)
     * The open scan (pagefile.scan_key_hashes) over pages j.. of a read chunk, with no
     * per-key Python object: the checks of iter_page_keys (CRC, header, slot
     * structure); a FREE page is appended to free_pages; a DATA page sets
     * space[page] = page_size - used, joins `roomy` when that is >= quarter, and its
     * keys become (xxh3-64 of the key, page << 16 | slot), in slot order, on the
     * returned u64 columns. Stops after the page that brings the key count to `need`
     * or more (a batch's end), before the first page it leaves to Python (a failed
     * check, a page beyond the space map, more bytes in use than the page has: Python
     * raises what it raises for it), or at the chunk's end; returns the next page. */
    Py_buffer b, sp;
    unsigned long long first, quarter;
    Py_ssize_t j, need;
    unsigned int ps;
    PyObject *space_obj, *roomy, *free_pages;
    if (!PyArg_ParseTuple(args, "y*KnInOKO!O!", &b, &first, &j, &ps, &need, &space_obj,
                          &quarter, &PySet_Type, &roomy, &PyList_Type, &free_pages))
        return NULL;
    if (PyObject_GetBuffer(space_obj, &sp,
                           PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&b);
        return NULL;
    }
    keycols c = {NULL, NULL, 0, 0};
    PyObject *result = NULL;
    if (ps <= HDR || sp.itemsize != 4 || !sp.format || strcmp(sp.format, "I") != 0) {
        PyErr_SetString(PyExc_TypeError, "scan_keys: page size > 16, space an array('I')");
        goto done;
    }
    uint32_t *space = (uint32_t *)sp.buf;
    uint64_t nspace = (uint64_t)(sp.len / 4);
    Py_ssize_t n = b.len / ps;
    const uint8_t *chunk = (const uint8_t *)b.buf;
    for (; j < n; j++) {
        const uint8_t *pg = chunk + (size_t)j * ps;
        uint64_t index = first + j;
        uint32_t type = pg[FERRY_PG_OFF_TYPE];
        if (type != T_DATA || rd32(pg + FERRY_PG_OFF_INDEX) != index || !crc_ok(pg, ps)) {
            if (type == T_DATA || !page_ok(pg, index, ps))
                break;                     /* Python names the problem */
            if (type == T_FREE && add_index(free_pages, index, 0) < 0)
                goto done;
            continue;                      /* checked OVERFLOW pages: nothing to report */
        }
        if (!data_ok(pg, ps) || index >= nspace || index >> 48)
            break;
        uint32_t count = rd16(pg + FERRY_PG_OFF_COUNT);
        uint64_t used = HDR + 2 * (uint64_t)count;
        if (keycols_reserve(&c, count) < 0) {
            PyErr_NoMemory();
            goto done;
        }
        Py_ssize_t mark = c.n;
        for (uint32_t s = 0; s < count; s++) {
            uint32_t off = rd16(pg + HDR + 2 * s);
            if (!off)
                continue;
            const uint8_t *e = pg + off;
            uint32_t flags = e[FERRY_PG_E_FLAGS], klen = rd16(e + FERRY_PG_E_KEY_LEN), vlen = rd32(e + FERRY_PG_E_VALUE_LEN);
            used += ENTRY_SIZE + klen + (flags & F_OVF ? PTR_SIZE : vlen);
            c.h[c.n] = XXH3_64bits(e + ENTRY_SIZE, klen);
            c.l[c.n++] = index << 16 | s;
        }
        if (used > ps) {                   /* overlapping entries: Python's error */
            c.n = mark;
            break;
        }
        uint32_t room = (uint32_t)(ps - used);
        space[index] = room;
        if (room >= quarter && add_index(roomy, index, 1) < 0)
            goto done;
        if (c.n >= need) {
            j++;
            break;
        }
    }
    {
        PyObject *ho = PyBytes_FromStringAndSize((const char *)c.h, c.n * 8);
        PyObject *lo = PyBytes_FromStringAndSize((const char *)c.l, c.n * 8);
        if (ho && lo)
            result = Py_BuildValue("(NNn)", ho, lo, j);
        else {
            Py_XDECREF(ho);
            Py_XDECREF(lo);
        }
    }
done:
    PyMem_Free(c.h);
    PyMem_Free(c.l);
    PyBuffer_Release(&sp);
    PyBuffer_Release(&b);
    return result;
}
#endif /* HAVE_XXHASH */

/* -- live columns: the index feed's batches without a Python object per entry ------ */

/* A growable byte buffer (the columns and the chain values' spill). */
typedef struct {
    uint8_t *p;
    size_t len, cap;
} gbuf;

static int gbuf_room(gbuf *g, size_t more)
{
    if (g->len + more <= g->cap)
        return 0;
    size_t cap = g->cap ? g->cap : 4096;
    while (cap < g->len + more)
        cap *= 2;
    uint8_t *q = realloc(g->p, cap);
    if (!q) {
        PyErr_NoMemory();
        return -1;
    }
    g->p = q;
    g->cap = cap;
    return 0;
}

/* The live entries of a valid DATA page as column records (4 x int64: key offset in
 * the chunk, key length, value offset, value length; a value offset < 0 is ~offset in
 * the spill, where chain values go): 1 done, 0 a chain fault (page left to Python),
 * -1 a Python exception, -2 an exception raised by ``fetch`` (a read). */
static int data_cols(gbuf *cols, gbuf *spill, const uint8_t *chunk, const uint8_t *pg,
                     chainctx *cx)
{
    uint32_t count = rd16(pg + FERRY_PG_OFF_COUNT);
    if (gbuf_room(cols, (size_t)count * 4 * sizeof(int64_t)) < 0)
        return -1;
    for (uint32_t s = 0; s < count; s++) {
        uint32_t off = rd16(pg + HDR + 2 * s);
        if (!off)
            continue;
        const uint8_t *e = pg + off;
        uint32_t flags = e[FERRY_PG_E_FLAGS], klen = rd16(e + FERRY_PG_E_KEY_LEN), vlen = rd32(e + FERRY_PG_E_VALUE_LEN);
        if (flags & F_TOMB)
            continue;
        int64_t rec[4];
        rec[0] = (int64_t)(e + ENTRY_SIZE - chunk);
        rec[1] = klen;
        rec[3] = vlen;
        if (flags & F_OVF) {
            int err;
            PyObject *v = walk_chain(cx, rd32(e + ENTRY_SIZE + klen), vlen, &err);
            if (!v)
                return err ? -2 : 0;
            if (gbuf_room(spill, vlen) < 0) {
                Py_DECREF(v);
                return -1;
            }
            memcpy(spill->p + spill->len, PyBytes_AS_STRING(v), vlen);
            Py_DECREF(v);
            rec[2] = ~(int64_t)spill->len;
            spill->len += vlen;
        }
        else
            rec[2] = (int64_t)(e + ENTRY_SIZE + klen - chunk);
        memcpy(cols->p + cols->len, rec, sizeof rec);
        cols->len += sizeof rec;
    }
    return 1;
}

static PyObject *py_decode_live(PyObject *self, PyObject *args)
{
    /* decode_live(chunk, first, j, page_size, checked, page_count, fetch)
     *   -> (columns, spill, j, exc): decode(..., tombstones=False, pairs=True) of pages
     * j.. of the chunk with the pairs as column records into the chunk and the spill
     * (see data_cols) instead of tuples: the same pages taken, the same stop (j), the
     * same marks in ``checked`` and the same exc. */
    Py_buffer b, ck;
    unsigned long long first;
    Py_ssize_t j;
    unsigned int ps, pcount;
    PyObject *fetch;
    if (!PyArg_ParseTuple(args, "y*KnIw*IO", &b, &first, &j, &ps, &ck, &pcount, &fetch))
        return NULL;
    PyObject *exc = NULL, *res = NULL;
    gbuf cols = {0}, spill = {0};
    if (ps <= HDR) {
        PyErr_SetString(PyExc_ValueError, "decode_live: page size > 16");
        goto done;
    }
    chainctx cx = {0};
    ctx_init(&cx, ps, pcount, &ck, fetch);
    Py_ssize_t n = b.len / ps;
    const uint8_t *chunk = (const uint8_t *)b.buf;
    int failed = 0;
    for (; j < n; j++) {
        const uint8_t *pg = chunk + (size_t)j * ps;
        int w = walk_page(pg, first + j, ps, &cx);
        if (w < 0)
            break;                         /* Python names the problem */
        if (w == 0)
            continue;
        size_t mark = cols.len, smark = spill.len;
        ctx_chunk(&cx, chunk, first, n);   /* chains start in this chunk */
        int r = data_cols(&cols, &spill, chunk, pg, &cx);
        if (r == -2) {
            exc = take_exception();
            r = exc ? 0 : -1;
        }
        if (r < 0) {
            failed = 1;
            break;
        }
        if (r == 0) {                      /* a chain fault: Python walks this page */
            cols.len = mark;
            spill.len = smark;
            break;
        }
    }
    ctx_release(&cx);
    if (!failed)
        res = Py_BuildValue("(y#y#nO)", cols.p ? (const char *)cols.p : "", (Py_ssize_t)cols.len,
                            spill.p ? (const char *)spill.p : "", (Py_ssize_t)spill.len, j,
                            exc ? exc : Py_None);
done:
    free(cols.p);
    free(spill.p);
    Py_XDECREF(exc);
    PyBuffer_Release(&b);
    PyBuffer_Release(&ck);
    return res;
}

static PyMethodDef methods[] = {
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(data, value=0) -> int (same as crc32c.crc32c)"},
    {"use_hw", py_set_hw, METH_O, "use_hw(flag) -> previous: test hook, False forces the table CRC"},
    {"check_pages", py_check_pages, METH_VARARGS, "check_pages(buf, first, page_size, j) -> j"},
    {"decode", py_decode, METH_VARARGS, "decode(chunk, first, j, ps, checked, tombstones, "
                                        "pairs, page_count, fetch, Entry) -> (items, j)"},
    {"decode_live", py_decode_live, METH_VARARGS, "decode_live(chunk, first, j, ps, checked, "
     "page_count, fetch) -> (columns, spill, j, exc): decode's live pairs as column records"},
    {"chain_value", py_chain_value, METH_VARARGS,
     "chain_value(page, length, ps, page_count, checked, fetch) -> bytes | None"},
    {"page_keys", py_page_keys, METH_VARARGS, "page_keys(chunk, first, j, ps) -> (pages, j)"},
#ifdef HAVE_XXHASH
    {"scan_keys", py_scan_keys, METH_VARARGS,
     "scan_keys(chunk, first, j, ps, need, space, quarter, roomy, free_pages) "
     "-> (hashes, locs, j)"},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "checkpoint._pageaccel",
    "Bulk fast path of checkpoint.pagefile (optional; see that module).", -1, methods,
};

PyMODINIT_FUNC PyInit__pageaccel(void)
{
    crc_init();
    PyObject *m = PyModule_Create(&moddef);
    if (!m)
        return NULL;
    if (PyModule_AddIntConstant(m, "ABI_VERSION", ABI_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "HW_CRC", crc_hw_available) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
