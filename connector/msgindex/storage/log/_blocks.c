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
 * zlib's CRC-32 over its compressed bytes. The LZ4 decoder is the LZ4 library's own
 * (``LZ4_decompress_safe``: bounds-checked, never reads or writes past the buffers it is given),
 * found at import in the shared library the system has (it has no header here, so it is opened by
 * name); without one the import fails and the Python path answers. A block must decode to exactly
 * its stated length.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>
#include <dlfcn.h>

#define OK 0
#define BAD_CHECKSUM 1
#define BAD_BLOCK 2

/* LZ4_decompress_safe(source, dest, compressed size, dest capacity) -> bytes written, or < 0 */
typedef int (*lz4_decompress_safe)(const char *, char *, int, int);
static lz4_decompress_safe lz4_decompress = NULL;
static const char *const LZ4_LIBRARIES[] = {"liblz4.so.1", "liblz4.so", "liblz4.1.dylib", "liblz4.dylib"};

/* Decompresses one LZ4 block of exactly `raw_length` bytes into `out`; 0 when it does not decode
 * to exactly that (a damaged block). */
static int lz4_block(const uint8_t *in, size_t in_length, uint8_t *out, size_t raw_length) {
    if (in_length > INT32_MAX || raw_length > INT32_MAX) return 0;
    int written = lz4_decompress((const char *)in, (char *)out, (int)in_length, (int)raw_length);
    return written >= 0 && (size_t)written == raw_length;
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

PyMODINIT_FUNC PyInit__blocks(void) {
    for (size_t i = 0; i < sizeof LZ4_LIBRARIES / sizeof LZ4_LIBRARIES[0] && lz4_decompress == NULL; i++) {
        void *library = dlopen(LZ4_LIBRARIES[i], RTLD_NOW | RTLD_LOCAL);
        if (library != NULL) lz4_decompress = (lz4_decompress_safe)dlsym(library, "LZ4_decompress_safe");
    }
    if (lz4_decompress == NULL) {
        PyErr_SetString(PyExc_ImportError, "no LZ4 shared library (liblz4.so.1) on this system");
        return NULL;
    }
    return PyModule_Create(&module_def);
}
