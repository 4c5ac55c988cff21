/*
 * The metadata log's blocks checked and decompressed in C, with the GIL released: what a read of
 * many blocks (many keys, a hot key, a time window) spends most of its time on.
 *
 * Why compiled: in Python each block costs a checksum call, a codec call and a bytes object,
 * and two threads doing that run slower than one (each call hands the GIL over twice;
 * BENCHMARKS.md). Here a run of blocks is one call that holds no GIL, so two threads decompress
 * two halves of a read at once, straight into one buffer (no join afterwards). The answer is
 * ``batch_format.decompress_blocks``' (its oracle; the tests compare them on valid and damaged
 * blocks), one way stricter: a block must decode to exactly its stated length, where Arrow's
 * codec pads a short one (a damage only a rewrite with a matching checksum can carry). Optional
 * like every compiled module (setup.py): without it the Python path answers.
 *
 * A block (batch_format.py) is one LZ4 *block* (the raw format, no frame), checksummed with
 * zlib's CRC-32 over its compressed bytes. The LZ4 block format, as its specification states
 * it: a sequence of (token, literals, match) where the token's high 4 bits are the literal
 * count and its low 4 bits the match length minus 4 (15 in either: more length bytes follow,
 * each added, until one is not 255), the literals are copied as they are, and a match is a
 * 2-byte little-endian offset back into the output and a copy of that many bytes from there
 * (it may overlap what it writes). The last sequence has literals only. Every read and write
 * below is bounds-checked: a damaged block is reported, never read or written past.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#define MIN_MATCH 4
#define LENGTH_MORE 15 /* a 4-bit length of 15: more length bytes follow */
#define OK 0
#define BAD_CHECKSUM 1
#define BAD_BLOCK 2

/* Adds the extension bytes of a length whose 4-bit field was 15; 0 when the input ends first. */
static int read_length(const uint8_t **in, const uint8_t *in_end, size_t *length) {
    uint8_t more;
    do {
        if (*in >= in_end) return 0;
        more = *(*in)++;
        *length += more;
    } while (more == 255);
    return 1;
}

/* Copies 8 bytes (the compiler makes it one load and one store). */
static inline void copy8(uint8_t *to, const uint8_t *from) { memcpy(to, from, 8); }

/* Decompresses one LZ4 block of exactly `raw_length` bytes into `out`; 0 when it does not decode
 * to exactly that (a damaged block). Log blocks are mostly short sequences (~5 literals and ~7
 * matched bytes each), so copies run past their lengths where there is room: a literal run of up
 * to 16 bytes is copied as 16 bytes (FAST_ROOM left on both sides), a match 8 bytes at a time (up
 * to 7 bytes past its end), the excess overwritten by what follows. Never past this block's input
 * or output: another thread may be writing the next block's output. */
#define FAST_ROOM 32
static int lz4_block(const uint8_t *in, size_t in_length, uint8_t *out, size_t raw_length) {
    const uint8_t *in_end = in + in_length;
    uint8_t *op = out, *out_end = out + raw_length;
    while (in < in_end) {
        uint8_t token = *in++;
        size_t literals = token >> 4;
        if (literals == LENGTH_MORE && !read_length(&in, in_end, &literals)) return 0;
        if (literals > (size_t)(in_end - in) || literals > (size_t)(out_end - op)) return 0;
        if (literals <= 16 && in_end - in >= FAST_ROOM && out_end - op >= FAST_ROOM) {
            copy8(op, in);
            copy8(op + 8, in + 8);
        } else {
            memcpy(op, in, literals);
        }
        op += literals;
        in += literals;
        if (in == in_end) break; /* the last sequence: literals only */
        if (in_end - in < 2) return 0;
        size_t offset = (size_t)in[0] | ((size_t)in[1] << 8);
        in += 2;
        if (offset == 0 || offset > (size_t)(op - out)) return 0;
        size_t match = token & 0x0F;
        if (match == LENGTH_MORE && !read_length(&in, in_end, &match)) return 0;
        match += MIN_MATCH;
        if (match > (size_t)(out_end - op)) return 0;
        const uint8_t *from = op - offset;
        if ((size_t)(out_end - op) >= match + 8) {
            /* 8 bytes at a time, up to 7 bytes past the match (overwritten by what follows) */
            uint8_t *to = op, *match_end = op + match;
            if (offset < 8) {
                /* the first 8 bytes one by one (each may be one just written); from then on the
                 * output repeats every `offset` bytes, so it also repeats every `distance`
                 * bytes, the first multiple of offset >= 8: far enough back for 8-byte copies */
                for (int i = 0; i < 8; i++) to[i] = from[i];
                to += 8;
                size_t distance = offset * ((8 + offset - 1) / offset);
                for (; to < match_end; to += 8) copy8(to, to - distance);
            } else {
                /* each load reads only bytes already final: at least 8 back */
                for (; to < match_end; to += 8) copy8(to, to - offset);
            }
            op = match_end;
        } else {
            /* near the block's end: exact copies; overlapping when offset < match (the output
             * repeats its last `offset` bytes, so each copy from `from` may take all that lies
             * between it and the output, which doubles) */
            while (match > 0) {
                size_t chunk = (size_t)(op - from) < match ? (size_t)(op - from) : match;
                memcpy(op, from, chunk);
                op += chunk;
                match -= chunk;
            }
        }
    }
    return op == out_end;
}

static int int64_view(PyObject *object, Py_buffer *view, Py_ssize_t count) {
    if (PyObject_GetBuffer(object, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return 0;
    if (view->itemsize != 8 || view->len != count * 8) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "expected a contiguous int64 array of one value per block");
        return 0;
    }
    return 1;
}

/* decompress_blocks(data, starts, lengths, raw_lengths, crcs, out, out_starts) -> None | (block, reason)
 * Block i: data[starts[i] : starts[i] + lengths[i]], checksum crcs[i], decompressed into
 * out[out_starts[i] : out_starts[i] + raw_lengths[i]]. The arrays are int64, one value a block.
 * None when every block is good, else the first bad block and why (1: checksum, 2: does not
 * decode; the blocks before it are decompressed). */
static PyObject *decompress_blocks(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "decompress_blocks takes 7 arguments");
        return NULL;
    }
    Py_buffer data, out, arrays[5]; /* starts, lengths, raw_lengths, crcs, out_starts */
    PyObject *array_args[5] = {args[1], args[2], args[3], args[4], args[6]};
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) != 0) return NULL;
    if (PyObject_GetBuffer(args[5], &out, PyBUF_WRITABLE) != 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    Py_buffer probe;
    if (PyObject_GetBuffer(args[1], &probe, PyBUF_SIMPLE) != 0) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        return NULL;
    }
    Py_ssize_t blocks = probe.len / 8;
    PyBuffer_Release(&probe);
    int held = 0;
    for (; held < 5; held++) {
        if (!int64_view(array_args[held], &arrays[held], blocks)) break;
    }
    PyObject *result = NULL;
    if (held == 5) {
        const int64_t *starts = arrays[0].buf, *lengths = arrays[1].buf, *raw_lengths = arrays[2].buf;
        const int64_t *crcs = arrays[3].buf, *out_starts = arrays[4].buf;
        const uint8_t *in = data.buf;
        uint8_t *dest = out.buf;
        Py_ssize_t bad = -1;
        int reason = OK;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < blocks; i++) {
            /* a block outside the buffers is the caller's mistake or a damaged table: "does not decode" */
            if (starts[i] < 0 || lengths[i] < 0 || lengths[i] > UINT32_MAX || starts[i] > data.len - lengths[i] ||
                out_starts[i] < 0 || raw_lengths[i] < 0 || out_starts[i] > out.len - raw_lengths[i]) {
                bad = i, reason = BAD_BLOCK;
                break;
            }
            const uint8_t *block = in + starts[i];
            if ((int64_t)crc32(0L, block, (uInt)lengths[i]) != crcs[i]) {
                bad = i, reason = BAD_CHECKSUM;
                break;
            }
            if (!lz4_block(block, (size_t)lengths[i], dest + out_starts[i], (size_t)raw_lengths[i])) {
                bad = i, reason = BAD_BLOCK;
                break;
            }
        }
        Py_END_ALLOW_THREADS
        result = bad < 0 ? Py_NewRef(Py_None) : Py_BuildValue("(ni)", bad, reason);
    }
    for (int i = 0; i < held; i++) PyBuffer_Release(&arrays[i]);
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"decompress_blocks", (PyCFunction)(void (*)(void))decompress_blocks, METH_FASTCALL,
     "decompress_blocks(data, starts, lengths, raw_lengths, crcs, out, out_starts): the blocks checked "
     "and decompressed into out; None, or (first bad block, 1 checksum | 2 does not decode)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_blocks", "The metadata log's blocks checked and decompressed (see batch_format.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__blocks(void) { return PyModule_Create(&module_def); }
