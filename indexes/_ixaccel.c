/* indexes._ixaccel: the rebuild's per-value fast path of indexes/indexer.py.
 *
 * An optional accelerator of Indexer.feed_many for JSON documents and definitions on
 * top-level fields (docs/indexes.md). For each (primary key, value) of a batch it
 * scans the document once without building Python objects: a validating JSON scanner
 * (RFC 8259 over strict UTF-8) that notes where each wanted top-level key's value is
 * (the last occurrence wins, as in json and orjson), then encodes those values to
 * entry keys exactly as indexes/keycodec.py does and hands them to ``add``.
 *
 * It never produces a reason or an error: at anything unusual for a value -- a
 * document it does not accept (invalid, or valid but outside the plain subset below),
 * an escape in a top-level key or in a wanted string, a missing field, a type the
 * index does not take, an int of more than 18 digits anywhere, a long string, a key
 * over the limit -- it calls ``fallback(item)`` and the Python path does that value,
 * so entries, reasons and their order are the reference's by construction.
 *
 * Must never be laxer than the reference (json/orjson): a document accepted here is
 * one both accept with these values. Stricter only costs speed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define ABI_VERSION 2        /* indexes/accel.py refuses a module of another version
                              * (2: feed_columns) */
#define MAX_DEPTH 128        /* deeper documents go to Python (json's recursion limit) */
#define MAX_INT_DIGITS 18    /* |int| < 10**18 < 2**63: exact in int64; longer -> Python */
#define MAX_SPECS 64
#define LONG_BODY 200        /* keycodec.LONG_BODY */
#define MAX_NUM_TOKEN 64

#define TAG_NULL 0x10
#define TAG_FALSE 0x18
#define TAG_TRUE 0x19
#define TAG_NUMBER 0x20
#define TAG_STRING 0x30

/* Value kinds of a scanned token. */
enum { K_MISSING = 0, K_STR, K_INT, K_FLOAT, K_TRUE, K_FALSE, K_NULL, K_NESTED };
/* Definition types (definitions.TYPES order): None, int, number, str, bool, bytes. */
enum { W_ANY = 0, W_INT, W_NUMBER, W_STR, W_BOOL, W_BYTES };

typedef struct {
    const char *name;        /* UTF-8 field name */
    Py_ssize_t name_len;
    int want;
    uint8_t prefix[2];       /* u16 BE index id */
} Spec;

typedef struct {
    int kind;
    int esc;                 /* a string with an escape */
    const uint8_t *start, *end;   /* the token (a string: its body, without quotes) */
} Found;

static inline const uint8_t *ws(const uint8_t *p, const uint8_t *end)
{
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

static inline int is_hex(uint8_t c)
{
    return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
}

static inline int cont(const uint8_t *p) { return (*p & 0xC0) == 0x80; }

/* One UTF-8 sequence at p (*p >= 0x80), strictly as Python's decoder: no overlongs,
 * no surrogates, nothing past U+10FFFF. Returns its length, 0 when invalid. */
static int utf8_len(const uint8_t *p, const uint8_t *end)
{
    uint8_t c = p[0];
    Py_ssize_t left = end - p;
    if (c >= 0xC2 && c <= 0xDF)
        return left >= 2 && cont(p + 1) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (left < 3 || !cont(p + 1) || !cont(p + 2))
            return 0;
        if (c == 0xE0 && p[1] < 0xA0)
            return 0;                                  /* overlong */
        if (c == 0xED && p[1] >= 0xA0)
            return 0;                                  /* surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (left < 4 || !cont(p + 1) || !cont(p + 2) || !cont(p + 3))
            return 0;
        if (c == 0xF0 && p[1] < 0x90)
            return 0;                                  /* overlong */
        if (c == 0xF4 && p[1] >= 0x90)
            return 0;                                  /* > U+10FFFF */
        return 4;
    }
    return 0;
}

/* A string body from p (just after the opening quote): returns the position of the
 * closing quote, NULL when invalid. Sets *esc when the body holds an escape. */
static const uint8_t *scan_string(const uint8_t *p, const uint8_t *end, int *esc)
{
    for (;;) {
#if defined(__SSE2__)
        /* 16 bytes at a time up to the first '"', '\\', control byte or non-ASCII byte
         * (a signed compare with 0x20 catches both of the last two). */
        const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\');
        const __m128i space = _mm_set1_epi8(0x20);
        while (end - p >= 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)p);
            __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote),
                                                    _mm_cmpeq_epi8(v, bslash)),
                                       _mm_cmplt_epi8(v, space));
            int m = _mm_movemask_epi8(hit);
            if (m) {
                p += __builtin_ctz((unsigned)m);
                break;
            }
            p += 16;
        }
#endif
        if (p >= end)
            return NULL;
        uint8_t c = *p;
        if (c == '"')
            return p;
        if (c == '\\') {
            *esc = 1;
            if (end - p < 2)
                return NULL;
            c = p[1];
            if (c == 'u') {
                if (end - p < 6 || !is_hex(p[2]) || !is_hex(p[3]) || !is_hex(p[4]) || !is_hex(p[5]))
                    return NULL;
                p += 6;     /* any \uXXXX: json takes lone surrogates too */
            }
            else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                     c == 'r' || c == 't')
                p += 2;
            else
                return NULL;
        }
        else if (c < 0x20)
            return NULL;
        else if (c >= 0x80) {
            int n = utf8_len(p, end);
            if (!n)
                return NULL;
            p += n;
        }
        else
            p++;
    }
}

/* A number token at p: its end, NULL when invalid or an int of more than
 * MAX_INT_DIGITS digits (json refuses ints past 4300 digits, orjson turns ints past
 * 64 bits into floats: Python decides those). *is_float: a fraction or exponent. */
static const uint8_t *scan_number(const uint8_t *p, const uint8_t *end, int *is_float)
{
    const uint8_t *q = p;
    if (q < end && *q == '-')
        q++;
    const uint8_t *digits = q;
    if (q >= end)
        return NULL;
    if (*q == '0')
        q++;
    else if (*q >= '1' && *q <= '9')
        while (q < end && *q >= '0' && *q <= '9')
            q++;
    else
        return NULL;
    Py_ssize_t nint = q - digits;
    *is_float = 0;
    if (q < end && *q == '.') {
        q++;
        if (q >= end || !(*q >= '0' && *q <= '9'))
            return NULL;
        while (q < end && *q >= '0' && *q <= '9')
            q++;
        *is_float = 1;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < end && (*q == '+' || *q == '-'))
            q++;
        if (q >= end || !(*q >= '0' && *q <= '9'))
            return NULL;
        while (q < end && *q >= '0' && *q <= '9')
            q++;
        *is_float = 1;
    }
    if (!*is_float && nint > MAX_INT_DIGITS)
        return NULL;
    return q;
}

/* One scalar at p (not '{' or '['): its end, NULL when invalid. Fills f. */
static const uint8_t *scan_scalar(const uint8_t *p, const uint8_t *end, Found *f)
{
    uint8_t c = *p;
    f->esc = 0;
    if (c == '"') {
        const uint8_t *q = scan_string(p + 1, end, &f->esc);
        if (!q)
            return NULL;
        f->kind = K_STR;
        f->start = p + 1;
        f->end = q;
        return q + 1;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        int is_float;
        const uint8_t *q = scan_number(p, end, &is_float);
        if (!q)
            return NULL;
        f->kind = is_float ? K_FLOAT : K_INT;
        f->start = p;
        f->end = q;
        return q;
    }
    if (c == 't' && end - p >= 4 && !memcmp(p, "true", 4)) {
        f->kind = K_TRUE;
        return p + 4;
    }
    if (c == 'f' && end - p >= 5 && !memcmp(p, "false", 5)) {
        f->kind = K_FALSE;
        return p + 5;
    }
    if (c == 'n' && end - p >= 4 && !memcmp(p, "null", 4)) {
        f->kind = K_NULL;
        return p + 4;
    }
    return NULL;
}

/* A whole object or array at p ('{' or '['): its end, NULL when invalid or deeper
 * than MAX_DEPTH. Iterative, with the open brackets on a stack. */
static const uint8_t *skip_nested(const uint8_t *p, const uint8_t *end, int depth0)
{
    uint8_t stack[MAX_DEPTH];
    int depth = 0;
    Found tmp;
open:
    if (depth0 + depth >= MAX_DEPTH)
        return NULL;
    stack[depth++] = *p == '{' ? '}' : ']';
    p = ws(p + 1, end);
    if (p >= end)
        return NULL;
    if (*p == stack[depth - 1]) {
        p++;
        goto closed;
    }
member:
    if (stack[depth - 1] == '}') {
        int esc = 0;
        if (*p != '"' || !(p = scan_string(p + 1, end, &esc)))
            return NULL;
        p = ws(p + 1, end);
        if (p >= end || *p != ':')
            return NULL;
        p = ws(p + 1, end);
        if (p >= end)
            return NULL;
    }
    if (*p == '{' || *p == '[')
        goto open;
    if (!(p = scan_scalar(p, end, &tmp)))
        return NULL;
after_value:
    p = ws(p, end);
    if (p >= end)
        return NULL;
    if (*p == ',') {
        p = ws(p + 1, end);
        if (p >= end)
            return NULL;
        goto member;
    }
    if (*p != stack[depth - 1])
        return NULL;
    p++;
closed:
    if (--depth == 0)
        return p;
    goto after_value;
}

/* The document raw[0:n]: 1 when it is a JSON object this scanner accepts, with the
 * value of each spec's field in found[] (K_MISSING when absent); 0 when Python decides. */
static int scan_doc(const uint8_t *p, Py_ssize_t n, const Spec *specs, int nspecs, Found *found)
{
    const uint8_t *end = p + n;
    for (int i = 0; i < nspecs; i++) {
        found[i].kind = K_MISSING;
        found[i].esc = 0;
    }
    p = ws(p, end);
    if (p >= end || *p != '{')
        return 0;
    p = ws(p + 1, end);
    if (p >= end)
        return 0;
    if (*p == '}')
        return ws(p + 1, end) == end;
    for (;;) {
        int esc = 0;
        if (*p != '"')
            return 0;
        const uint8_t *k = p + 1, *ke = scan_string(k, end, &esc);
        if (!ke || esc)      /* an escaped key may spell a wanted name: Python decides */
            return 0;
        p = ws(ke + 1, end);
        if (p >= end || *p != ':')
            return 0;
        p = ws(p + 1, end);
        if (p >= end)
            return 0;
        Found v;
        if (*p == '{' || *p == '[') {
            v.kind = K_NESTED;
            v.esc = 0;
            if (!(p = skip_nested(p, end, 1)))
                return 0;
        }
        else if (!(p = scan_scalar(p, end, &v)))
            return 0;
        for (int i = 0; i < nspecs; i++)
            if (specs[i].name_len == ke - k && !memcmp(specs[i].name, k, (size_t)(ke - k)))
                found[i] = v;           /* a later duplicate replaces it */
        p = ws(p, end);
        if (p >= end)
            return 0;
        if (*p == '}')
            return ws(p + 1, end) == end;
        if (*p != ',')
            return 0;
        p = ws(p + 1, end);
        if (p >= end)
            return 0;
    }
}

/* keycodec._num: 8 bytes of ordered float64 + u16 BE correction biased by 0x8000. */
static void put_num(uint8_t *out, double f, int64_t correction)
{
    if (f == 0.0)
        f = 0.0;                        /* -0.0 == 0.0: one key for both */
    uint64_t bits;
    memcpy(&bits, &f, 8);
    bits = (bits & (1ULL << 63)) ? ~bits : (bits | (1ULL << 63));
    out[0] = TAG_NUMBER;
    for (int i = 0; i < 8; i++)
        out[1 + i] = (uint8_t)(bits >> (56 - 8 * i));
    uint32_t c = (uint32_t)(correction + 0x8000);
    out[9] = (uint8_t)(c >> 8);
    out[10] = (uint8_t)c;
}

/* The encoded value of f (keycodec.encode_value) into enc (>= LONG_BODY + 3 bytes):
 * its length, or -1 when Python should do this value. */
static Py_ssize_t encode(const Found *f, int want, uint8_t *enc)
{
    switch (f->kind) {
    case K_STR: {
        if (!(want == W_ANY || want == W_STR) || f->esc)
            return -1;
        Py_ssize_t len = f->end - f->start;
        if (len > LONG_BODY)            /* cut and hashed: Python's */
            return -1;
        /* no 0x00 in the body: JSON has no raw control bytes and escapes went above */
        enc[0] = TAG_STRING;
        memcpy(enc + 1, f->start, (size_t)len);
        enc[1 + len] = 0x00;
        enc[2 + len] = 0x01;
        return len + 3;
    }
    case K_INT: {
        if (!(want == W_ANY || want == W_INT || want == W_NUMBER))
            return -1;
        const uint8_t *q = f->start;
        int neg = *q == '-';
        int64_t v = 0;
        for (q += neg; q < f->end; q++)
            v = v * 10 + (*q - '0');    /* <= 18 digits: no overflow */
        if (neg)
            v = -v;
        double d = (double)v;           /* round to nearest even, as float(int) */
        put_num(enc, d, v - (int64_t)d);
        return 11;
    }
    case K_FLOAT: {
        if (!(want == W_ANY || want == W_NUMBER))
            return -1;
        char buf[MAX_NUM_TOKEN + 1];
        Py_ssize_t len = f->end - f->start;
        if (len > MAX_NUM_TOKEN)
            return -1;
        memcpy(buf, f->start, (size_t)len);
        buf[len] = 0;
        char *stop = NULL;
        /* Python's own correctly rounded conversion (what json's float() uses). */
        double d = PyOS_string_to_double(buf, &stop, NULL);
        if (d == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
        if (stop != buf + len || !isfinite(d))   /* 1e400: orjson refuses, json gives inf */
            return -1;
        put_num(enc, d, 0);
        return 11;
    }
    case K_TRUE:
    case K_FALSE:
        if (!(want == W_ANY || want == W_BOOL))
            return -1;
        enc[0] = f->kind == K_TRUE ? TAG_TRUE : TAG_FALSE;
        return 1;
    case K_NULL:
        if (want != W_ANY)
            return -1;
        enc[0] = TAG_NULL;
        return 1;
    default:                            /* missing or nested: bad, Python says why */
        return -1;
    }
}

static int parse_specs(PyObject *specs, Spec *out)
{
    if (!PyTuple_Check(specs) || PyTuple_GET_SIZE(specs) > MAX_SPECS) {
        PyErr_SetString(PyExc_TypeError, "specs: a tuple of at most 64 (name, prefix, want)");
        return -1;
    }
    int n = (int)PyTuple_GET_SIZE(specs);
    for (int i = 0; i < n; i++) {
        PyObject *s = PyTuple_GET_ITEM(specs, i);
        const char *name, *prefix;
        Py_ssize_t nlen, plen;
        int want;
        if (!PyArg_ParseTuple(s, "y#y#i", &name, &nlen, &prefix, &plen, &want))
            return -1;
        if (plen != 2 || want < W_ANY || want > W_BYTES) {
            PyErr_SetString(PyExc_ValueError, "specs: prefix must be 2 bytes, want 0..5");
            return -1;
        }
        out[i].name = name;
        out[i].name_len = nlen;
        out[i].want = want;
        memcpy(out[i].prefix, prefix, 2);
    }
    return n;
}

/* add(key): list.append bound to a list is called as PyList_Append (the rebuild's
 * sorter hands its list's append). */
static int call_add(PyObject *add, PyObject *list, PyObject *key)
{
    if (list)
        return PyList_Append(list, key);
    PyObject *r = PyObject_CallOneArg(add, key);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* The encodings of every spec's field of a value (raw, n) under a primary key of
 * pklen bytes: 1 when all are done here (enc[s], enc_len[s]), 0 when Python should
 * do this value. */
static int encode_raw(Py_ssize_t pklen, const uint8_t *raw, Py_ssize_t n, const Spec *spec,
                      int nspecs, Py_ssize_t max_key, Found *found,
                      uint8_t (*enc)[LONG_BODY + 8], Py_ssize_t *enc_len)
{
    if (!scan_doc(raw, n, spec, nspecs, found))
        return 0;
    for (int s = 0; s < nspecs; s++) {
        enc_len[s] = encode(&found[s], spec[s].want, enc[s]);
        /* a key past max_key holds a hash and carries data: Python's */
        if (enc_len[s] < 0 || 2 + enc_len[s] + pklen > max_key)
            return 0;
    }
    return 1;
}

/* encode_raw of a (pk, raw) pair of bytes objects. */
static int encode_item(PyObject *pk, PyObject *raw, const Spec *spec, int nspecs,
                       Py_ssize_t max_key, Found *found, uint8_t (*enc)[LONG_BODY + 8],
                       Py_ssize_t *enc_len)
{
    if (!PyBytes_CheckExact(pk) || !PyBytes_CheckExact(raw))
        return 0;
    return encode_raw(PyBytes_GET_SIZE(pk), (const uint8_t *)PyBytes_AS_STRING(raw),
                      PyBytes_GET_SIZE(raw), spec, nspecs, max_key, found, enc, enc_len);
}

static PyObject *make_key_raw(const Spec *sp, const uint8_t *enc, Py_ssize_t enc_len,
                              const char *pk, Py_ssize_t pklen)
{
    PyObject *key = PyBytes_FromStringAndSize(NULL, 2 + enc_len + pklen);
    if (!key)
        return NULL;
    char *kb = PyBytes_AS_STRING(key);
    memcpy(kb, sp->prefix, 2);
    memcpy(kb + 2, enc, (size_t)enc_len);
    memcpy(kb + 2 + enc_len, pk, (size_t)pklen);
    return key;
}

static PyObject *make_key(const Spec *sp, const uint8_t *enc, Py_ssize_t enc_len, PyObject *pk)
{
    return make_key_raw(sp, enc, enc_len, PyBytes_AS_STRING(pk), PyBytes_GET_SIZE(pk));
}

/* The sorter's list when ``add`` is a bound list.append (then keys go in with
 * PyList_Append), else NULL. */
static PyObject *add_list(PyObject *add)
{
    if (PyCFunction_Check(add) && PyCFunction_GET_SELF(add) &&
        PyList_CheckExact(PyCFunction_GET_SELF(add)) &&
        !strcmp(((PyCFunctionObject *)add)->m_ml->ml_name, "append"))
        return PyCFunction_GET_SELF(add);
    return NULL;
}

static PyObject *py_feed_many(PyObject *self, PyObject *args)
{
    /* feed_many(items, specs, max_key, add, fallback) -> number of items */
    PyObject *items, *specs, *add, *fallback;
    Py_ssize_t max_key;
    if (!PyArg_ParseTuple(args, "OOnOO", &items, &specs, &max_key, &add, &fallback))
        return NULL;
    Spec spec[MAX_SPECS];
    Found found[MAX_SPECS];
    Py_ssize_t enc_len[MAX_SPECS];
    uint8_t enc[MAX_SPECS][LONG_BODY + 8];
    int nspecs = parse_specs(specs, spec);
    if (nspecs < 0)
        return NULL;
    PyObject *list = add_list(add);
    PyObject *seq = PySequence_Fast(items, "feed_many: items must be iterable");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == 2 &&
            encode_item(PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1), spec, nspecs,
                        max_key, found, enc, enc_len)) {
            for (int s = 0; s < nspecs; s++) {
                PyObject *key = make_key(&spec[s], enc[s], enc_len[s], PyTuple_GET_ITEM(item, 0));
                if (!key)
                    goto fail;
                int rc = call_add(add, list, key);
                Py_DECREF(key);
                if (rc < 0)
                    goto fail;
            }
            continue;
        }
        PyObject *r = PyObject_CallOneArg(fallback, item);
        if (!r)
            goto fail;
        Py_DECREF(r);
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(n);
fail:
    Py_DECREF(seq);
    return NULL;
}

static PyObject *py_feed_columns(PyObject *self, PyObject *args)
{
    /* feed_columns(data, spill, columns, specs, max_key, add, fallback) -> number of
     * pairs: feed_many over the pairs of checkpoint's LiveColumns (records of four
     * int64: key offset in data, key length, value offset -- < 0: ~offset in spill --,
     * value length), read in place; a pair Python must do goes to fallback((pk, raw))
     * as bytes, so the entries and their order are feed_many's. */
    Py_buffer data, spill, cols;
    PyObject *specs, *add, *fallback;
    Py_ssize_t max_key;
    if (!PyArg_ParseTuple(args, "y*y*y*OnOO", &data, &spill, &cols, &specs, &max_key, &add,
                          &fallback))
        return NULL;
    Spec spec[MAX_SPECS];
    Found found[MAX_SPECS];
    Py_ssize_t enc_len[MAX_SPECS];
    uint8_t enc[MAX_SPECS][LONG_BODY + 8];
    PyObject *res = NULL;
    int nspecs = parse_specs(specs, spec);
    if (nspecs < 0)
        goto done;
    PyObject *list = add_list(add);
    Py_ssize_t n = cols.len / (Py_ssize_t)(4 * sizeof(int64_t));
    const uint8_t *d = (const uint8_t *)data.buf, *sp = (const uint8_t *)spill.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t rec[4];
        memcpy(rec, (const uint8_t *)cols.buf + (size_t)i * sizeof rec, sizeof rec);
        int64_t k0 = rec[0], kn = rec[1], v0 = rec[2], vn = rec[3];
        const uint8_t *vb = d;
        Py_ssize_t vlim = data.len;
        if (v0 < 0) {
            v0 = ~v0;
            vb = sp;
            vlim = spill.len;
        }
        if (k0 < 0 || kn < 0 || vn < 0 || k0 > data.len - kn || v0 > vlim - vn) {
            PyErr_SetString(PyExc_ValueError, "feed_columns: a record outside its buffer");
            goto done;
        }
        const char *pk = (const char *)d + k0;
        if (encode_raw(kn, vb + v0, vn, spec, nspecs, max_key, found, enc, enc_len)) {
            for (int s = 0; s < nspecs; s++) {
                PyObject *key = make_key_raw(&spec[s], enc[s], enc_len[s], pk, kn);
                if (!key)
                    goto done;
                int rc = call_add(add, list, key);
                Py_DECREF(key);
                if (rc < 0)
                    goto done;
            }
            continue;
        }
        PyObject *item = Py_BuildValue("(y#y#)", pk, (Py_ssize_t)kn, (const char *)vb + v0,
                                       (Py_ssize_t)vn);
        if (!item)
            goto done;
        PyObject *r = PyObject_CallOneArg(fallback, item);
        Py_DECREF(item);
        if (!r)
            goto done;
        Py_DECREF(r);
    }
    res = PyLong_FromSsize_t(n);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&spill);
    PyBuffer_Release(&cols);
    return res;
}

/* The Python value of a field encode() took (what orjson gives for it). */
static PyObject *value_of(const Found *f)
{
    switch (f->kind) {
    case K_STR:
        return PyUnicode_DecodeUTF8((const char *)f->start, f->end - f->start, NULL);
    case K_INT: {
        const uint8_t *q = f->start;
        int neg = *q == '-';
        long long v = 0;
        for (q += neg; q < f->end; q++)
            v = v * 10 + (*q - '0');
        return PyLong_FromLongLong(neg ? -v : v);
    }
    case K_FLOAT: {
        char buf[MAX_NUM_TOKEN + 1];
        Py_ssize_t len = f->end - f->start;   /* <= MAX_NUM_TOKEN: encode() took it */
        memcpy(buf, f->start, (size_t)len);
        buf[len] = 0;
        double d = PyOS_string_to_double(buf, NULL, NULL);
        if (d == -1.0 && PyErr_Occurred())
            return NULL;
        return PyFloat_FromDouble(d);
    }
    case K_TRUE:
        Py_RETURN_TRUE;
    case K_FALSE:
        Py_RETURN_FALSE;
    default:
        Py_RETURN_NONE;
    }
}

static PyObject *py_entries(PyObject *self, PyObject *args)
{
    /* entries(pk, raw, specs, max_key) -> None (Python decides) | tuple per spec of
     * (key, head length, value): Indexer.entries' common case. */
    PyObject *pk, *raw, *specs;
    Py_ssize_t max_key;
    if (!PyArg_ParseTuple(args, "OOOn", &pk, &raw, &specs, &max_key))
        return NULL;
    Spec spec[MAX_SPECS];
    Found found[MAX_SPECS];
    Py_ssize_t enc_len[MAX_SPECS];
    uint8_t enc[MAX_SPECS][LONG_BODY + 8];
    int nspecs = parse_specs(specs, spec);
    if (nspecs < 0)
        return NULL;
    if (!encode_item(pk, raw, spec, nspecs, max_key, found, enc, enc_len))
        Py_RETURN_NONE;
    PyObject *out = PyTuple_New(nspecs);
    if (!out)
        return NULL;
    for (int s = 0; s < nspecs; s++) {
        PyObject *t = PyTuple_New(3);
        if (!t) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, s, t);
        PyObject *key = make_key(&spec[s], enc[s], enc_len[s], pk);
        PyObject *head = key ? PyLong_FromSsize_t(2 + enc_len[s]) : NULL;
        PyObject *v = head ? value_of(&found[s]) : NULL;
        if (!v) {
            Py_XDECREF(key);
            Py_XDECREF(head);
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(t, 0, key);
        PyTuple_SET_ITEM(t, 1, head);
        PyTuple_SET_ITEM(t, 2, v);
    }
    return out;
}

static PyObject *py_scan(PyObject *self, PyObject *args)
{
    /* scan(raw, names) -> None | tuple per name of (kind, escaped, token bytes):
     * the scanner alone, for tests (kind 0 = missing). */
    const char *raw;
    Py_ssize_t n;
    PyObject *names;
    if (!PyArg_ParseTuple(args, "y#O!", &raw, &n, &PyTuple_Type, &names))
        return NULL;
    Spec spec[MAX_SPECS];
    Found found[MAX_SPECS];
    int ns = (int)PyTuple_GET_SIZE(names);
    if (ns > MAX_SPECS) {
        PyErr_SetString(PyExc_ValueError, "scan: at most 64 names");
        return NULL;
    }
    for (int i = 0; i < ns; i++) {
        PyObject *nm = PyTuple_GET_ITEM(names, i);
        if (!PyBytes_Check(nm)) {
            PyErr_SetString(PyExc_TypeError, "scan: names must be bytes");
            return NULL;
        }
        spec[i].name = PyBytes_AS_STRING(nm);
        spec[i].name_len = PyBytes_GET_SIZE(nm);
    }
    if (!scan_doc((const uint8_t *)raw, n, spec, ns, found))
        Py_RETURN_NONE;
    PyObject *out = PyTuple_New(ns);
    if (!out)
        return NULL;
    for (int i = 0; i < ns; i++) {
        Found *f = &found[i];
        int tok = f->kind == K_STR || f->kind == K_INT || f->kind == K_FLOAT;
        PyObject *t = Py_BuildValue("(iiy#)", f->kind, f->esc,
                                    tok ? (const char *)f->start : "",
                                    tok ? (Py_ssize_t)(f->end - f->start) : (Py_ssize_t)0);
        if (!t) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, t);
    }
    return out;
}

/* Length of "u16 id | encoded value" at the start of a stored entry key (as
 * keycodec.split_key reads it), or -1 when the key does not parse. */
static Py_ssize_t head_len(const uint8_t *k, Py_ssize_t n)
{
    if (n < 3)
        return -1;
    switch (k[2]) {
    case TAG_NULL: case TAG_FALSE: case TAG_TRUE:
        return 3;
    case TAG_NUMBER:
        return n >= 13 ? 13 : -1;            /* 8-byte float64 + u16 correction */
    case TAG_STRING: case 0x38: {            /* escaped body, 0x00 0x01 | 0x00 0x02 hash */
        Py_ssize_t i = 3;
        for (;;) {
            const uint8_t *z = memchr(k + i, 0, (size_t)(n - i));
            if (!z || z + 1 >= k + n)
                return -1;
            Py_ssize_t at = z - k;
            if (k[at + 1] == 0xFF) {
                i = at + 2;
                continue;
            }
            if (k[at + 1] == 0x01)
                return at + 2;
            if (k[at + 1] == 0x02)
                return at + 2 + 16 <= n ? at + 2 + 16 : -1;
            return -1;
        }
    }
    default:
        return -1;
    }
}

/* unique_conflicts(keys, lo, hi, last) -> (positions, last): the positions i in
 * [lo, hi) of the sorted list ``keys`` whose key has the same index id and encoded
 * value as the key before it (``last`` for the first) but is another key, i.e.
 * another primary key holds the value. ``last`` becomes keys[hi - 1]. Raises
 * ValueError at a key that does not parse (the caller's Python path says why). */
static PyObject *py_unique_conflicts(PyObject *self, PyObject *args)
{
    PyObject *keys, *last;
    Py_ssize_t lo, hi;
    if (!PyArg_ParseTuple(args, "O!nnO!", &PyList_Type, &keys, &lo, &hi,
                          &PyBytes_Type, &last))
        return NULL;
    if (lo < 0 || hi > PyList_GET_SIZE(keys) || lo > hi) {
        PyErr_SetString(PyExc_IndexError, "unique_conflicts: bad range");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    const uint8_t *pk = (const uint8_t *)PyBytes_AS_STRING(last);
    Py_ssize_t pn = PyBytes_GET_SIZE(last);
    Py_ssize_t ph = pn ? head_len(pk, pn) : -1;
    PyObject *prev = last;
    for (Py_ssize_t i = lo; i < hi; i++) {
        PyObject *k = PyList_GET_ITEM(keys, i);
        if (!PyBytes_Check(k)) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_TypeError, "unique_conflicts: keys must be bytes");
            return NULL;
        }
        const uint8_t *kb = (const uint8_t *)PyBytes_AS_STRING(k);
        Py_ssize_t kn = PyBytes_GET_SIZE(k);
        Py_ssize_t h = head_len(kb, kn);
        if (h < 0) {
            Py_DECREF(out);
            PyErr_Format(PyExc_ValueError, "unique_conflicts: key %zd does not parse", i);
            return NULL;
        }
        if (h == ph && memcmp(kb, pk, (size_t)h) == 0 &&
            (kn != pn || memcmp(kb + h, pk + h, (size_t)(kn - h)) != 0)) {
            PyObject *pos = PyLong_FromSsize_t(i);
            if (!pos || PyList_Append(out, pos) < 0) {
                Py_XDECREF(pos);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(pos);
        }
        pk = kb; pn = kn; ph = h; prev = k;
    }
    return Py_BuildValue("(NO)", out, prev);
}

static PyMethodDef methods[] = {
    {"feed_many", py_feed_many, METH_VARARGS,
     "feed_many(items, specs, max_key, add, fallback) -> n: specs are (field name as "
     "UTF-8, u16 BE index id, type code); each (pk, raw) is either encoded here (add(key) "
     "per spec) or handed whole to fallback(item)"},
    {"feed_columns", py_feed_columns, METH_VARARGS,
     "feed_columns(data, spill, columns, specs, max_key, add, fallback) -> n: feed_many "
     "over column records (checkpoint's LiveColumns) read in place"},
    {"entries", py_entries, METH_VARARGS,
     "entries(pk, raw, specs, max_key) -> None | ((key, head, value), ...) per spec"},
    {"scan", py_scan, METH_VARARGS, "scan(raw, names) -> None | ((kind, escaped, token), ...)"},
    {"unique_conflicts", py_unique_conflicts, METH_VARARGS,
     "unique_conflicts(keys, lo, hi, last) -> (positions, last): keys in keys[lo:hi] "
     "holding the same index value as the key before them under another primary key"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "indexes._ixaccel",
    "Per-value fast path of indexes.indexer.Indexer.feed_many (optional; see indexes/accel.py).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__ixaccel(void)
{
    PyObject *m = PyModule_Create(&moddef);
    if (!m)
        return NULL;
    if (PyModule_AddIntConstant(m, "ABI_VERSION", ABI_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DEPTH", MAX_DEPTH) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
