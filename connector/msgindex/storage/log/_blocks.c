/*
 * The metadata log's blocks checked and decompressed in C, with the GIL released: what a read of
 * many blocks (many keys, a hot key, a time window) spends most of its time on.
 *
 * Why compiled: in Python each block costs a checksum call, a codec call and a bytes object,
 * and two threads doing that run slower than one (each call hands the GIL over twice;
 * BENCHMARKS.md). Here a run of blocks is one call that holds no GIL, so two threads decompress
 * two halves of a read at once, straight into one buffer (no join afterwards); a point read's
 * scattered blocks (read_records) are shared with helper threads of this module's own. The answer is
 * ``batch_format.decompress_blocks``' (its oracle; the tests compare them on valid and damaged
 * blocks), one way stricter: a block must decode to exactly its stated length, where Arrow's
 * codec pads a short one (a damage only a rewrite with a matching checksum can carry). Optional
 * like every compiled module (setup.py): without it the Python path answers.
 *
 * A block (batch_format.py) is one LZ4 *block* (the raw format, no frame), checksummed with
 * zlib's CRC-32 over its compressed bytes, and restored to the layout readers read as soon as it
 * is decompressed (``restore_block``: its ends, offsets and sources rewritten). The LZ4
 * decoder is the LZ4 library's own
 * (``LZ4_decompress_safe``: bounds-checked, never reads or writes past the buffers it is given),
 * found at import in the shared library the system has (it has no header here, so it is opened by
 * name); without one the import fails and the Python path answers. A block must decode to exactly
 * its stated length (but where a point read decodes only the front it needs: lz4_prefix).
 *
 * The checksum is zlib's CRC-32, computed by libdeflate's ``libdeflate_crc32`` where the system
 * has that library (the same CRC, by carry-less multiplication: 1.7 us for a 14 kB block where
 * zlib 1.2's tables take 6.5 us, of the ~10 us a scattered record's block costs: BENCHMARKS.md,
 * "Storage vs DuckDB"), else by zlib's ``crc32``. ``checksum`` exposes it (the tests compare it
 * with Python's zlib on many lengths).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>
#include <pthread.h>
#include <time.h>
#ifdef __linux__
#include <sched.h>
#endif

#define OK 0
#define BAD_CHECKSUM 1
#define BAD_BLOCK 2
#define NO_MEMORY 8 /* (decompress_blocks: a MemoryError, not damage) */

/* LZ4_decompress_safe(source, dest, compressed size, dest capacity) -> bytes written, or < 0 */
typedef int (*lz4_decompress_safe)(const char *, char *, int, int);
static lz4_decompress_safe lz4_decompress = NULL;
/* LZ4_decompress_safe_partial(source, dest, compressed size, bytes wanted, dest capacity) -> bytes
 * decoded (the wanted ones, or the whole block when it is shorter), or < 0; NULL: not in the library */
typedef int (*lz4_decompress_partial)(const char *, char *, int, int, int);
static lz4_decompress_partial lz4_decompress_prefix = NULL;
static const char *const LZ4_LIBRARIES[] = {"liblz4.so.1", "liblz4.so", "liblz4.1.dylib", "liblz4.dylib"};

/* libdeflate_crc32(initial crc, buffer, length) -> the CRC-32 zlib's crc32 computes */
typedef uint32_t (*crc32_function)(uint32_t, const void *, size_t);
static crc32_function libdeflate_crc32 = NULL;
static const char *const CRC_LIBRARIES[] = {"libdeflate.so.0", "libdeflate.so", "libdeflate.0.dylib", "libdeflate.dylib"};

static uint32_t block_checksum(const uint8_t *data, size_t length) {
    if (libdeflate_crc32 != NULL) return libdeflate_crc32(0, data, length);
    uLong crc = 0;
    while (length > 0) { /* zlib takes at most UINT32_MAX bytes a call (uInt) */
        uInt step = length > UINT32_MAX ? UINT32_MAX : (uInt)length;
        crc = crc32(crc, data, step);
        data += step, length -= step;
    }
    return (uint32_t)crc;
}

#define BLOCK_HEADER_SIZE 96
#define SECTIONS 9 /* flags, topic, partition, offset, timestamp, commit_log_offset, size, text_end, byte_end */
#define TEXT_END 7
#define BYTE_END 8
#define TOPIC 1
#define PARTITION 2
#define OFFSET 3
#define STORED_FORM_AT 21 /* batch_format.py, "Stored form" */
#define PARTITION_SPAN_AT 22
#define ENDS_AS_STEPS 1
#define SOURCE_IN_TOPIC 2
#define OFFSETS_AS_STEPS 4
#define STORED_FORMS (ENDS_AS_STEPS | SOURCE_IN_TOPIC | OFFSETS_AS_STEPS)

static uint32_t read_u32(const uint8_t *at) { return (uint32_t)at[0] | (uint32_t)at[1] << 8 | (uint32_t)at[2] << 16 | (uint32_t)at[3] << 24; }

static int64_t read_le64(const uint8_t *at) {
    uint64_t value = 0;
    for (int i = 7; i >= 0; i--) value = value << 8 | at[i];
    return (int64_t)value;
}

/* The value at `index` of a section of `width` byte planes, `count` values a plane, at `planes`. */
static uint64_t plane_value(const uint8_t *planes, int64_t count, int64_t width, int64_t index) {
    uint64_t value = 0;
    for (int64_t plane = width - 1; plane >= 0; plane--) value = value << 8 | planes[plane * count + index];
    return value;
}

/* ... and `value` stored there. */
static void store_value(uint8_t *planes, int64_t count, int64_t width, int64_t index, uint64_t value) {
    for (int64_t plane = 0; plane < width; plane++) planes[plane * count + index] = (uint8_t)(value >> (8 * plane));
}

/* The `count` values of `width` byte planes at `planes` (each its step from the one before) made
 * their running sums, modulo 2^(8 width), in place. */
static void sum_steps(uint8_t *planes, int64_t count, int64_t width) {
    if (width == 1) {
        uint8_t sum = 0;
        for (int64_t k = 0; k < count; k++) sum += planes[k], planes[k] = sum;
    } else if (width == 2) {
        uint8_t *high = planes + count;
        uint16_t sum = 0;
        for (int64_t k = 0; k < count; k++) {
            sum += (uint16_t)(planes[k] | high[k] << 8);
            planes[k] = (uint8_t)sum, high[k] = (uint8_t)(sum >> 8);
        }
    } else if (width > 0) {
        uint64_t sum = 0, mask = width == 8 ? ~(uint64_t)0 : ((uint64_t)1 << (8 * width)) - 1;
        for (int64_t k = 0; k < count; k++) {
            sum = (sum + plane_value(planes, count, width, k)) & mask;
            store_value(planes, count, width, k, sum);
        }
    }
}

/* Where a block's sections end and its heap starts, as its header (decompressed in `block`) gives
 * its counts and widths; -1 when a width is none of 0, 1, 2, 4, 8. */
static int64_t sections_end(const uint8_t *block) {
    int64_t records = read_u32(block), texts = read_u32(block + 4), at = BLOCK_HEADER_SIZE;
    for (int i = 0; i < SECTIONS; i++) {
        int64_t width = block[12 + i];
        if (width != 0 && width != 1 && width != 2 && width != 4 && width != 8) return -1;
        at += width * (i == BYTE_END ? texts : records);
    }
    return at;
}

/* The rewrites a block of `length` bytes, as decompressed, is stored with (its STORED_FORMS
 * bits; 0: its read form); -1 when its header gives a form there is none of, or (a stored form)
 * widths and counts its length does not hold or widths a rewrite does not take: what
 * restore_block refuses (batch_format.read_form, its oracle). */
static int stored_form_of(const uint8_t *block, size_t length) {
    if (length < BLOCK_HEADER_SIZE || (block[STORED_FORM_AT] | block[STORED_FORM_AT + 1] | block[STORED_FORM_AT + 2]) == 0)
        return 0;
    int form = block[STORED_FORM_AT];
    if (form == 0 || (form & ~STORED_FORMS) || block[STORED_FORM_AT + 2] ||
        (block[PARTITION_SPAN_AT] && !(form & SOURCE_IN_TOPIC)))
        return -1;
    int64_t at = sections_end(block);
    if (at < 0 || (size_t)(at + read_u32(block + 8)) != length) return -1;
    int topic_width = block[12 + TOPIC], partition_width = block[12 + PARTITION];
    if ((form & SOURCE_IN_TOPIC) && !(topic_width == 1 && partition_width == 1)) return -1;
    if ((form & OFFSETS_AS_STEPS) && (topic_width > 4 || partition_width > 4)) return -1;
    return form;
}

/* A block's SOURCE_IN_TOPIC and OFFSETS_AS_STEPS undone (batch_format.py, "Stored form"), in
 * place, for its records [0, rows): a point read restores only as far as its last row. Its
 * header, as stored_form_of accepted it with `form`, must be decompressed in `block` and its
 * sections as far as the offsets'. Each source's running sum is kept by the byte that names it
 * where the block has one (source_names: a 256-entry table, ~1 ns a record), else in an
 * open-addressing table of 64-bit sources, on the stack for blocks of up to 512 records
 * (DEFAULT_BLOCK_RECORDS); 0 when a larger one cannot be allocated. */
#define STACK_SLOTS 1024
#define DIRECT_ROWS 8 /* a point read's rows of one block chained one by one (chained_offset) up to this many */
typedef struct {
    uint64_t source, sum;
    int used;
} chain_t;

/* Whether a byte names each record's source in a block of `form` whose sections start at
 * `first` (SOURCE_IN_TOPIC's topic byte, a bijection of topic and partition; else a lone topic's
 * or partition's byte): 1 and *names (NULL: every record has the same source), or 0. */
static int source_names(const uint8_t *block, int form, const int64_t *first, const uint8_t **names) {
    int64_t topic_width = block[12 + TOPIC], partition_width = block[12 + PARTITION];
    *names = NULL;
    if (form & SOURCE_IN_TOPIC) *names = block + first[TOPIC];
    else if (topic_width == 0 && partition_width <= 1) *names = partition_width ? block + first[PARTITION] : NULL;
    else if (partition_width == 0 && topic_width == 1) *names = block + first[TOPIC];
    else return 0;
    return 1;
}

/* The offset delta of `row` under OFFSETS_AS_STEPS where `names` name the sources: the sum of its
 * source's stored steps up to it (a source's first holds its delta, each later one its step: the
 * sum telescopes), wrapping in the width `mask` gives. Branch-free byte loops, for a point read's
 * one or few rows of a block: ~0.3 ns a record before it, where restoring writes every one. */
static uint64_t chained_offset(const uint8_t *planes, int64_t records, int64_t width, const uint8_t *names,
                               int64_t row, uint64_t mask) {
    uint8_t name = names ? names[row] : 0;
    uint64_t sum = 0;
    if (width == 1 || width == 2) {
        uint32_t low = 0, high = 0;
        for (int64_t k = 0; k <= row; k++) {
            uint32_t same = names ? -(uint32_t)(names[k] == name) : ~(uint32_t)0;
            low += planes[k] & same;
            if (width == 2) high += planes[records + k] & same;
        }
        sum = (uint64_t)low + ((uint64_t)high << 8);
    } else {
        for (int64_t k = 0; k <= row; k++)
            if (!names || names[k] == name) sum += plane_value(planes, records, width, k);
    }
    return sum & mask;
}

static int sum_offset_chains(uint8_t *block, int form, int64_t rows, const int64_t *first) {
    int64_t records = read_u32(block), topic_width = block[12 + TOPIC], partition_width = block[12 + PARTITION];
    int64_t offset_width = block[12 + OFFSET];
    uint64_t mask = offset_width == 8 ? ~(uint64_t)0 : ((uint64_t)1 << (8 * offset_width)) - 1;
    uint8_t *offsets = block + first[OFFSET];
    const uint8_t *names;
    if (source_names(block, form, first, &names)) {
        uint64_t sums[256] = {0}; /* each source's steps so far: they telescope to its delta */
        if (offset_width == 2) { /* (the usual width: the spread of a block's offsets; unrolled, ~1 ns a record) */
            uint8_t *low = offsets, *high = offsets + records;
            for (int64_t k = 0; k < rows; k++) {
                uint8_t name = names ? names[k] : 0;
                uint64_t sum = sums[name] + (uint64_t)(low[k] | high[k] << 8);
                sums[name] = sum, low[k] = (uint8_t)sum, high[k] = (uint8_t)(sum >> 8);
            }
        } else if (offset_width == 1) {
            for (int64_t k = 0; k < rows; k++) {
                uint8_t name = names ? names[k] : 0;
                sums[name] += offsets[k];
                offsets[k] = (uint8_t)sums[name];
            }
        } else {
            for (int64_t k = 0; k < rows; k++) {
                uint8_t name = names ? names[k] : 0;
                sums[name] += plane_value(offsets, records, offset_width, k);
                store_value(offsets, records, offset_width, k, sums[name] & mask);
            }
        }
        return 1;
    }
    int64_t slots = 16;
    while (slots < 2 * rows) slots *= 2;
    chain_t stack[STACK_SLOTS], *table = stack;
    if (slots > STACK_SLOTS) {
        table = calloc((size_t)slots, sizeof *table);
        if (table == NULL) return 0;
    } else {
        memset(table, 0, (size_t)slots * sizeof *table);
    }
    int shift = 64;
    for (int64_t s = slots; s > 1; s >>= 1) shift--;
    for (int64_t k = 0; k < rows; k++) {
        uint64_t topic = topic_width ? plane_value(block + first[TOPIC], records, topic_width, k) : 0;
        uint64_t partition = partition_width ? plane_value(block + first[PARTITION], records, partition_width, k) : 0;
        uint64_t source = topic << 32 | partition; /* (widths <= 4: stored_form_of) */
        int64_t slot = (int64_t)((source * UINT64_C(0x9E3779B97F4A7C15)) >> shift);
        while (table[slot].used && table[slot].source != source) slot = (slot + 1) & (slots - 1);
        table[slot].used = 1, table[slot].source = source;
        table[slot].sum += plane_value(offsets, records, offset_width, k); /* (telescopes, as above) */
        store_value(offsets, records, offset_width, k, table[slot].sum & mask);
    }
    if (table != stack) free(table);
    return 1;
}

static int restore_sources(uint8_t *block, int form, int64_t rows) {
    int64_t records = read_u32(block), at = BLOCK_HEADER_SIZE, first[OFFSET + 1];
    if (rows > records) rows = records;
    if (rows <= 0) return 1;
    for (int i = 0; i <= OFFSET; i++) first[i] = at, at += block[12 + i] * records;
    if ((form & OFFSETS_AS_STEPS) && block[12 + OFFSET] && !sum_offset_chains(block, form, rows, first)) return 0;
    if (form & SOURCE_IN_TOPIC) { /* after the chains, which name a source by its combined byte */
        uint8_t *topic = block + first[TOPIC], *partition = block + first[PARTITION];
        uint32_t span = (uint32_t)block[PARTITION_SPAN_AT] + 1;
        /* c / span as c x ceil(2^16 / span) >> 16: exact for every byte c and span <= 256 (2^16 >=
         * 2^8 x span), where a division a record cost ~10 us a block */
        uint32_t reciprocal = (65536 + span - 1) / span;
        for (int64_t k = 0; k < rows; k++) {
            uint32_t combined = topic[k], quotient = (combined * reciprocal) >> 16;
            topic[k] = (uint8_t)quotient, partition[k] = (uint8_t)(combined - quotient * span);
        }
    }
    return 1;
}

/* A block of `length` bytes, as decompressed, turned into the layout readers read, in place:
 * every rewrite of its stored form undone; 0 when stored_form_of refuses it, -1 when memory runs
 * out (restore_sources, for a block of more than 512 records). */
static int restore_block(uint8_t *block, size_t length) {
    int form = stored_form_of(block, length);
    if (form <= 0) return form == 0;
    int64_t records = read_u32(block), texts = read_u32(block + 4), at = BLOCK_HEADER_SIZE;
    if (!restore_sources(block, form, records)) return -1;
    if (form & ENDS_AS_STEPS) {
        for (int i = 0; i < TEXT_END; i++) at += block[12 + i] * records;
        sum_steps(block + at, records, block[12 + TEXT_END]);
        sum_steps(block + at + records * block[12 + TEXT_END], texts, block[12 + BYTE_END]);
    }
    block[STORED_FORM_AT] = 0, block[PARTITION_SPAN_AT] = 0;
    return 1;
}

/* Decompresses one LZ4 block of exactly `raw_length` bytes into `out`; 0 when it does not decode
 * to exactly that (a damaged block). */
static int lz4_exactly(const uint8_t *in, size_t in_length, uint8_t *out, size_t raw_length) {
    if (in_length > INT32_MAX || raw_length > INT32_MAX) return 0;
    int written = lz4_decompress((const char *)in, (char *)out, (int)in_length, (int)raw_length);
    return written >= 0 && (size_t)written == raw_length;
}

/* lz4_exactly, then the block's read form restored (restore_block): 1, 0 when either refuses
 * it, -1 when memory runs out. */
static int lz4_block(const uint8_t *in, size_t in_length, uint8_t *out, size_t raw_length) {
    return lz4_exactly(in, in_length, out, raw_length) ? restore_block(out, raw_length) : 0;
}

/* Takes `object`'s buffer as int64 values (8-byte items, aligned, contiguous; writable when
 * asked): 0 with a ValueError set otherwise. */
static int int64_buffer(PyObject *object, Py_buffer *view, int writable, const char *function) {
    if (PyObject_GetBuffer(object, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) != 0)
        return 0;
    if (view->itemsize != 8 || view->len % 8 != 0 || (uintptr_t)view->buf % 8 != 0) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s takes aligned contiguous int64 arrays", function);
        return 0;
    }
    return 1;
}

/* int64_buffer of `count` values */
static int int64_view(PyObject *object, Py_buffer *view, Py_ssize_t count) {
    if (!int64_buffer(object, view, 0, "decompress_blocks")) return 0;
    if (view->len != count * 8) {
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
            if ((int64_t)block_checksum(block, (size_t)lengths[i]) != crcs[i]) {
                bad = i, reason = BAD_CHECKSUM;
                break;
            }
            int restored = lz4_block(block, (size_t)lengths[i], dest + out_starts[i], (size_t)raw_lengths[i]);
            if (restored <= 0) {
                bad = i, reason = restored < 0 ? NO_MEMORY : BAD_BLOCK;
                break;
            }
        }
        Py_END_ALLOW_THREADS
        if (reason == NO_MEMORY) PyErr_NoMemory();
        else result = bad < 0 ? Py_NewRef(Py_None) : Py_BuildValue("(ni)", bad, reason);
    }
    for (int i = 0; i < held; i++) PyBuffer_Release(&arrays[i]);
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return result;
}

/* ---- read_records: records of a few scattered blocks, read, checked, decompressed and decoded ----
 * What a lookup of tens to hundreds of records spends its time on: in Python each costs a pread, a
 * checksum, a decompression and a decode of its fields and texts (~20 us); here ~5-8 us, GIL free.
 * Its oracle is batch_format.python_read_records (BlockRecords.raw_record: the tests compare them
 * record by record, and the errors on damaged blocks, checks made in the same order: every
 * record's fields and text bounds first, texts decoded afterwards, in Python). The block layout
 * is batch_format's module docstring. A read of PARALLEL_MIN_BLOCKS blocks or more is shared with
 * the read pool's helper threads (read_job_t below). */
#define SHORT_READ 3 /* the file ends before the block does */
#define BAD_LAYOUT 4 /* "a block does not match its layout" */
#define BAD_RECORD 5 /* "a record does not match its block" */
#define BAD_TEXT 6   /* "a text lies outside its block's heap" */
#define NEED_MORE 7  /* a wanted text lies past the bytes decompressed so far (never returned to Python) */
#define INT_FIELDS 7 /* the per-record columns a record is returned with: all but text_end */
#define FLAG_KEY 1
#define FLAG_LEAD 2

typedef struct {
    int64_t width, first, planes, base;
} section_t;

/* value - base stored in `width` byte planes `planes` apart: adding the base back wraps as int64 */
static int64_t section_value(const uint8_t *raw, const section_t *s, int64_t index) {
    return (int64_t)((uint64_t)s->base + plane_value(raw + s->first, s->planes, s->width, index));
}

typedef struct {
    uint8_t *data;
    size_t length, capacity;
} growing_t;

static int append(growing_t *buffer, const void *bytes, size_t length) {
    if (length == 0) return 1; /* (and no memcpy from or to a NULL buffer) */
    if (buffer->length + length > buffer->capacity) {
        size_t capacity = buffer->capacity ? buffer->capacity : 4096;
        while (capacity < buffer->length + length) capacity *= 2;
        uint8_t *grown = realloc(buffer->data, capacity);
        if (grown == NULL) return 0;
        buffer->data = grown, buffer->capacity = capacity;
    }
    memcpy(buffer->data + buffer->length, bytes, length);
    buffer->length += length;
    return 1;
}

/* One ends section of a block (text_end or byte_end) as the records' decoder reads it: the read
 * form's ends, or the stored form's steps summed as far as asked (callers ask in rising order:
 * a block costs one addition a step, up to the last one a wanted row needs, where restoring it
 * would sum and rewrite every one). */
typedef struct {
    section_t section;
    int summed;   /* the section holds the stored form's steps */
    int64_t next; /* steps [0, next) are in sum */
    uint64_t sum; /* modulo 2^(8 width) */
} ends_t;

static int64_t end_at(const uint8_t *raw, ends_t *ends, int64_t index) {
    const section_t *s = &ends->section;
    if (!ends->summed || s->width == 0) return section_value(raw, s, index);
    if (index < ends->next - 1) ends->next = 0, ends->sum = 0; /* an earlier end: sum again */
    /* Widths 1 and 2 (every block of short texts) sum each byte plane on its own into a local:
     * loops the compiler vectorizes, where a plane_value a step cost ~1 us a point read (the
     * steps to a row are half a block's on average, and a record's texts need both sections). */
    const uint8_t *low = raw + s->first;
    if (s->width == 1 || s->width == 2) {
        uint64_t low_sum = 0, high_sum = 0;
        for (int64_t k = ends->next; k <= index; k++) low_sum += low[k];
        if (s->width == 2) {
            const uint8_t *high = low + s->planes;
            for (int64_t k = ends->next; k <= index; k++) high_sum += high[k];
        }
        if (ends->next <= index) ends->sum += low_sum + (high_sum << 8), ends->next = index + 1;
    } else {
        for (; ends->next <= index; ends->next++) ends->sum += plane_value(low, s->planes, s->width, ends->next);
    }
    uint64_t delta = s->width == 8 ? ends->sum : ends->sum & (((uint64_t)1 << (8 * s->width)) - 1);
    return (int64_t)((uint64_t)s->base + delta);
}

/* Decodes the records `rows` (sorted, all of this block) of one block of `raw_length` bytes (in
 * either form: stored_form_of) whose first `available` bytes are decompressed, into the outputs;
 * OK, the reason it is damaged, or NEED_MORE when a wanted byte lies past `available`. */
static int decode_records(uint8_t *raw, int64_t raw_length, int64_t available, int64_t topic_count,
                          const int64_t *rows, Py_ssize_t count, int64_t *ints, int64_t *text_counts,
                          growing_t *heap_out, growing_t *lengths_out, int *no_memory) {
    int form = stored_form_of(raw, (size_t)raw_length);
    if (form < 0) return BAD_BLOCK; /* as restore_block refuses it */
    if (raw_length < BLOCK_HEADER_SIZE) return BAD_LAYOUT;
    int64_t records = read_u32(raw), texts = read_u32(raw + 4), heap_bytes = read_u32(raw + 8);
    section_t sections[SECTIONS];
    int64_t at = BLOCK_HEADER_SIZE;
    for (int i = 0; i < SECTIONS; i++) {
        int64_t width = raw[12 + i];
        if (width != 0 && width != 1 && width != 2 && width != 4 && width != 8) return BAD_LAYOUT;
        sections[i].width = width;
        sections[i].first = at;
        sections[i].planes = i == BYTE_END ? texts : records;
        sections[i].base = read_le64(raw + 24 + 8 * i);
        at += width * sections[i].planes;
    }
    if (at + heap_bytes != raw_length) return BAD_LAYOUT;
    if (at > available) return NEED_MORE;
    /* The rows' sources and offsets: for a few rows where a byte names each record's source, each
     * row's own (chained_offset) as it is read; else restored in place, up to the largest of
     * them. Ends are summed as they are read. */
    int64_t firsts_of[OFFSET + 1];
    for (int i = 0; i <= OFFSET; i++) firsts_of[i] = sections[i].first;
    const uint8_t *names = NULL;
    int direct = (form & OFFSETS_AS_STEPS) && sections[OFFSET].width && count <= DIRECT_ROWS &&
                 source_names(raw, form, firsts_of, &names);
    int64_t last = -1; /* the largest row (callers sort them; one out of range is refused below) */
    for (Py_ssize_t r = 0; r < count; r++) last = rows[r] > last ? rows[r] : last;
    if (!direct && last >= 0 && !restore_sources(raw, form, last < records ? last + 1 : records)) {
        *no_memory = 1;
        return OK;
    }
    uint64_t offset_mask = sections[OFFSET].width == 8 ? ~(uint64_t)0 : ((uint64_t)1 << (8 * sections[OFFSET].width)) - 1;
    unsigned span = (unsigned)raw[PARTITION_SPAN_AT] + 1;
    const uint8_t *heap = raw + at;
    int64_t heap_available = available - at;
    int summed = (form & ENDS_AS_STEPS) != 0;
    ends_t text_ends = {sections[TEXT_END], summed, 0, 0}, byte_ends = {sections[BYTE_END], summed, 0, 0};
    for (Py_ssize_t r = 0; r < count; r++) {
        int64_t row = rows[r];
        if (row < 0 || row >= records) return BAD_LAYOUT;
        int64_t *fields = ints + r * INT_FIELDS;
        for (int i = 0; i < INT_FIELDS; i++) fields[i] = section_value(raw, &sections[i], row);
        if (direct) {
            if (form & SOURCE_IN_TOPIC) {
                fields[TOPIC] = (int64_t)((uint64_t)sections[TOPIC].base + raw[sections[TOPIC].first + row] / span);
                fields[PARTITION] = (int64_t)((uint64_t)sections[PARTITION].base + raw[sections[TOPIC].first + row] % span);
            }
            fields[OFFSET] = (int64_t)((uint64_t)sections[OFFSET].base +
                                       chained_offset(raw + sections[OFFSET].first, records, sections[OFFSET].width, names,
                                                      row, offset_mask));
        }
        int64_t flags = fields[0], topic = fields[1];
        int64_t first = row ? end_at(raw, &text_ends, row - 1) : 0;
        int64_t end = end_at(raw, &text_ends, row);
        int64_t has_key = flags & FLAG_KEY;
        /* (as BlockRecords.raw_record checks, in Python ints: none of these can overflow int64 here
         * but first + has_key, whose first is checked >= 0 before a wrap could matter) */
        if (flags < 0 || flags > (FLAG_KEY | FLAG_LEAD) || ((flags & FLAG_LEAD) && !has_key) || first < 0 ||
            first + has_key > end || end > texts || topic < 0 || topic >= topic_count)
            return BAD_RECORD;
        text_counts[r] = end - first;
        int64_t start = first ? end_at(raw, &byte_ends, first - 1) : 0;
        for (int64_t text = first; text < end; text++) {
            int64_t stop = end_at(raw, &byte_ends, text);
            if (start < 0 || start > stop || stop > heap_bytes) return BAD_TEXT;
            if (stop > heap_available) return NEED_MORE;
            int64_t length = stop - start;
            if (!append(heap_out, heap + start, (size_t)length) || !append(lengths_out, &length, sizeof length)) {
                *no_memory = 1;
                return OK;
            }
            start = stop;
        }
    }
    return OK;
}

/* How many bytes of a block of `raw_length` bytes, whose header is decompressed in `raw`, a decode
 * of rows up to `last_row` is likely to need: every section, and the heap up to that row's share
 * of it, with a margin for texts of uneven lengths (decode_records says NEED_MORE when it falls
 * short, and the whole block is decompressed then). The heap is most of a block of long keys
 * (60% on bench_vs_parquet's long-keys): a point read's LZ4 decodes a third less. */
static int64_t prefix_for(const uint8_t *raw, int64_t raw_length, int64_t last_row) {
    int64_t records = read_u32(raw), heap_bytes = read_u32(raw + 8), at = sections_end(raw);
    if (at < 0 || records <= 0 || last_row < 0 || last_row >= records || at + heap_bytes != raw_length) return raw_length;
    int64_t wanted = at + heap_bytes * (last_row + 1) / records + 512 + heap_bytes / 16;
    return wanted < raw_length ? wanted : raw_length;
}

/* The first bytes of one LZ4 block of `raw_length` bytes decompressed into `out`, enough for rows
 * up to `last_row` (prefix_for; all of them without LZ4_decompress_safe_partial): how many, or -1
 * when the block does not decode that far (a block decompressed whole must decode to exactly
 * `raw_length` bytes). A block is read only as far as a point read needs: past that its bytes are
 * checksummed (the whole compressed block is) but not decoded. So a block whose checksum matches
 * but whose LZ4 stream breaks past that front (only a rewrite with a matching checksum makes one)
 * gives a point read its front rows, the writer's records, and is an error for every read that
 * decodes it whole (python_read_records, decompress_blocks: scans, many keys, msgindex inspect). */
static int64_t lz4_prefix(const uint8_t *in, size_t in_length, uint8_t *out, size_t raw_length, int64_t last_row) {
    if (lz4_decompress_prefix == NULL || in_length > INT32_MAX || raw_length > INT32_MAX ||
        raw_length <= BLOCK_HEADER_SIZE)
        return lz4_exactly(in, in_length, out, raw_length) ? (int64_t)raw_length : -1;
    int header = lz4_decompress_prefix((const char *)in, (char *)out, (int)in_length, BLOCK_HEADER_SIZE, (int)raw_length);
    if (header < BLOCK_HEADER_SIZE) return lz4_exactly(in, in_length, out, raw_length) ? (int64_t)raw_length : -1;
    int64_t target = prefix_for(out, (int64_t)raw_length, last_row);
    if (target >= (int64_t)raw_length) return lz4_exactly(in, in_length, out, raw_length) ? (int64_t)raw_length : -1;
    int got = lz4_decompress_prefix((const char *)in, (char *)out, (int)in_length, (int)target, (int)raw_length);
    return got < 0 ? -1 : (int64_t)got;
}

/* read_records' blocks, shared by the caller's thread and the read pool's. Blocks are independent
 * (a pread, a checksum, LZ4 and a decode: ~5 us each, BENCHMARKS.md), and a key of a hundred
 * records is a hundred scattered blocks, so a second core halves the wait. Each participant takes
 * the next block from one counter (no fixed halves: a helper that wakes late, ~30-100 us on this
 * VM, takes fewer, and the caller never waits for one that has not begun), decodes it into its
 * own texts and notes where they went; ints and text_counts are written at each block's own rows,
 * which no other block has. The answer is the one a single pass in block order gives: a
 * participant stops at a block past the lowest damaged block found so far, and every block below
 * that was taken before it and is finished, so the lowest damaged block is the first one. */
typedef struct {
    int owner; /* the participant that decoded the block */
    size_t heap_at, heap_length, lengths_at, lengths_length; /* its texts' bytes and lengths in the owner's buffers */
} placement_t;

typedef struct {
    int fd;
    const int64_t *positions, *lengths, *raw_lengths, *crcs, *topic_counts, *firsts, *rows;
    int64_t *ints, *text_counts;
    Py_ssize_t blocks;
    Py_ssize_t next;       /* the next block to take (atomic) */
    Py_ssize_t first_bad;  /* the lowest damaged block found so far, `blocks` if none (atomic); a
                            * block whose buffers could not be allocated counts as one (NO_MEMORY) */
    int users;             /* helpers still in the job (atomic) */
    placement_t *placed;   /* per block, where a participant put its texts (NULL: the caller reads alone) */
} read_job_t;

typedef struct {
    growing_t heap, text_lengths;
    Py_ssize_t bad; /* this participant's damaged block (the first it met), or -1 */
    int reason;
    int64_t got;
    Py_ssize_t taken; /* blocks it decoded */
} participant_t;

#define MAX_READ_HELPERS 3
#define PARALLEL_MIN_BLOCKS 16 /* below, posting a job costs more than a helper can save */

static void read_block(read_job_t *job, Py_ssize_t b, participant_t *me, uint8_t **compressed, size_t *compressed_capacity,
                       uint8_t **raw, size_t *raw_capacity, int *no_memory) {
    const int64_t *lengths = job->lengths, *raw_lengths = job->raw_lengths, *firsts = job->firsts;
    growing_t *heap = &me->heap, *text_lengths = &me->text_lengths;
    if ((size_t)lengths[b] > *compressed_capacity) {
        free(*compressed);
        *compressed_capacity = (size_t)lengths[b];
        *compressed = malloc(*compressed_capacity);
        if (*compressed == NULL) { *compressed_capacity = 0, *no_memory = 1; return; }
    }
    if ((size_t)raw_lengths[b] > *raw_capacity) {
        free(*raw);
        *raw_capacity = (size_t)raw_lengths[b];
        *raw = malloc(*raw_capacity);
        if (*raw == NULL) { *raw_capacity = 0, *no_memory = 1; return; }
    }
    uint8_t *in = *compressed, *out = *raw;
    int64_t done = 0;
    while (done < lengths[b]) { /* pread may return fewer bytes than asked without being at the end */
        ssize_t n = pread(job->fd, in + done, (size_t)(lengths[b] - done), (off_t)(job->positions[b] + done));
        if (n <= 0) break;
        done += n;
    }
    int decoded;
    if (done != lengths[b]) {
        decoded = SHORT_READ, me->got = done;
    } else if ((int64_t)block_checksum(in, (size_t)lengths[b]) != job->crcs[b]) {
        decoded = BAD_CHECKSUM;
    } else if (firsts[b + 1] > firsts[b]) {
        const int64_t *block_rows = job->rows + firsts[b];
        Py_ssize_t count = (Py_ssize_t)(firsts[b + 1] - firsts[b]);
        int64_t *ints = job->ints + firsts[b] * INT_FIELDS, *text_counts = job->text_counts + firsts[b];
        size_t heap_before = heap->length, lengths_before = text_lengths->length;
        int64_t available = lz4_prefix(in, (size_t)lengths[b], out, (size_t)raw_lengths[b], block_rows[count - 1]);
        decoded = available < 0 ? BAD_BLOCK
                                : decode_records(out, raw_lengths[b], available, job->topic_counts[b], block_rows, count,
                                                 ints, text_counts, heap, text_lengths, no_memory);
        if (decoded == NEED_MORE) { /* the estimate fell short: the whole block, decoded again */
            heap->length = heap_before, text_lengths->length = lengths_before;
            decoded = !lz4_exactly(in, (size_t)lengths[b], out, (size_t)raw_lengths[b])
                          ? BAD_BLOCK
                          : decode_records(out, raw_lengths[b], raw_lengths[b], job->topic_counts[b], block_rows, count,
                                           ints, text_counts, heap, text_lengths, no_memory);
        }
    } else { /* a block asked for none of its rows, checked as one that is */
        decoded = !lz4_exactly(in, (size_t)lengths[b], out, (size_t)raw_lengths[b])
                      ? BAD_BLOCK
                      : decode_records(out, raw_lengths[b], raw_lengths[b], job->topic_counts[b], job->rows, 0,
                                       job->ints, job->text_counts, heap, text_lengths, no_memory);
    }
    if (decoded != OK && me->bad < 0) me->bad = b, me->reason = decoded;
}

/* Takes blocks from `job` until none is left, one is damaged below them, or memory ran out. */
static void participate(read_job_t *job, participant_t *me, int who) {
    uint8_t *compressed = NULL, *raw = NULL;
    size_t compressed_capacity = 0, raw_capacity = 0;
    for (;;) {
        Py_ssize_t b = __atomic_fetch_add(&job->next, 1, __ATOMIC_ACQ_REL);
        if (b >= job->blocks || b > __atomic_load_n(&job->first_bad, __ATOMIC_ACQUIRE)) break;
        int no_memory = 0;
        size_t heap_at = me->heap.length, lengths_at = me->text_lengths.length;
        read_block(job, b, me, &compressed, &compressed_capacity, &raw, &raw_capacity, &no_memory);
        if (no_memory) /* where a single pass would stop too: an error below it still comes first */
            me->bad = b, me->reason = NO_MEMORY;
        if (me->bad == b) { /* a lower one than any other participant may have met: keep the lowest */
            Py_ssize_t seen = __atomic_load_n(&job->first_bad, __ATOMIC_ACQUIRE);
            while (b < seen && !__atomic_compare_exchange_n(&job->first_bad, &seen, b, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            }
            break;
        }
        if (job->placed != NULL)
            job->placed[b] = (placement_t){who, heap_at, me->heap.length - heap_at, lengths_at,
                                           me->text_lengths.length - lengths_at};
        me->taken++;
    }
    free(compressed);
    free(raw);
}

/* The read pool: helpers started on first use, one per CPU this process may use beyond the first
 * (at most MAX_READ_HELPERS), waiting for a job. A job is posted by one caller at a time (another
 * caller meanwhile reads alone); a helper joins it under the lock, and the caller, once it finds
 * no block left, withdraws the job and waits only for helpers already in it (each finishing the
 * block it holds). After a fork the child has no helpers: it starts its own.
 *
 * How helpers wait, and why (measured on this project's 2-vCPU VM, keys of 50-98 records):
 * - They run at SCHED_BATCH: a woken helper never preempts the thread it is placed beside. At
 *   SCHED_OTHER, a helper woken after the process idled a millisecond joined on the caller's own
 *   CPU in 3 of 4 reads (the guest sees the other vCPU as preempted by the host), where it took the
 *   caller's place instead of working beside it; at SCHED_BATCH in 1 of 260 (SCHED_IDLE: 0 of
 *   279, but at its weight of 3 a helper holding a block behind a busy thread could stall the
 *   caller for a long time; SCHED_BATCH keeps a normal share).
 * - Waking a sleeping helper takes 30-100 us here, up to a whole read; so after a job, and after
 *   wake_helpers() (a point read that has just found its many candidates calls it, ~100 us before
 *   it reads), a helper polls for the next post for HELPER_POLL_NS before it sleeps (a key's
 *   records in several segments are a read each). Polling is CPU the process is charged (at
 *   SCHED_BATCH, a normal share of a busy CPU): keys of 50-98 records read after 1 ms pauses,
 *   median read / CPU per read (every thread's), 0.83 / 0.94 ms before, 0.70 / 1.15 polling 200 us,
 *   0.67 / 2.03 polling 1 ms; back to back 0.60 -> 0.54 ms (0.49 at 1 ms).
 * - A helper that holds a block may wait behind the caller on the caller's CPU (it does not
 *   preempt it), so a caller that finds a helper still in its job polls only briefly, then sleeps
 *   until the last one leaves (pool_left): sleeping frees the CPU for it. */
#define HELPER_POLL_NS 200000
#define WITHDRAW_POLL_NS 20000 /* a helper's block, from memory, takes ~5 us */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER; /* a post, or wake_helpers() */
static pthread_cond_t pool_left = PTHREAD_COND_INITIALIZER; /* the last helper left a job */
static read_job_t *pool_job = NULL;
static participant_t *pool_participants = NULL; /* the posted job's: index 0 the caller, 1.. helpers */
static int pool_joined = 0;                      /* helpers that joined the posted job */
static unsigned long pool_posts = 0;             /* written under the lock, polled without it */
static unsigned long pool_wakes = 0;             /* wake_helpers() calls that found a helper asleep */
static int pool_sleeping = 0;                    /* helpers waiting on pool_wake */
static int pool_helpers = 0, usable_cpus = 0;
static long long pool_blocks_read = 0; /* by helpers, since import: helper_blocks() (the tests' evidence they ran) */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static long long monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec * 1000000000LL + now.tv_nsec;
}

/* Until a post after `seen` or HELPER_POLL_NS from now: whichever comes first. */
static void poll_for_post(unsigned long seen) {
    long long deadline = monotonic_ns() + HELPER_POLL_NS;
    while (__atomic_load_n(&pool_posts, __ATOMIC_ACQUIRE) == seen && monotonic_ns() < deadline) cpu_relax();
}

static void *pool_helper(void *unused) {
    (void)unused;
#ifdef SCHED_BATCH
    struct sched_param no_priority = {0};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &no_priority); /* (refused: it helps as SCHED_OTHER) */
#endif
#ifdef __linux__
    pthread_setname_np(pthread_self(), "msgindex-read"); /* (what `top -H` shows; the tests find them by it) */
#endif
    unsigned long seen = 0, seen_wakes = 0;
    pthread_mutex_lock(&pool_lock);
    for (;;) {
        if (pool_posts == seen) {
            pthread_mutex_unlock(&pool_lock);
            poll_for_post(seen);
            pthread_mutex_lock(&pool_lock);
        }
        pool_sleeping++;
        while ((pool_job == NULL || pool_posts == seen) && pool_wakes == seen_wakes)
            pthread_cond_wait(&pool_wake, &pool_lock);
        pool_sleeping--;
        seen_wakes = pool_wakes;
        if (pool_job == NULL || pool_posts == seen) continue; /* woken ahead of a post: poll for it */
        seen = pool_posts;
        read_job_t *job = pool_job;
        int who = ++pool_joined;
        if (who > MAX_READ_HELPERS) continue;
        participant_t *me = &pool_participants[who];
        __atomic_add_fetch(&job->users, 1, __ATOMIC_ACQ_REL);
        pthread_mutex_unlock(&pool_lock);
        participate(job, me, who);
        __atomic_add_fetch(&pool_blocks_read, me->taken, __ATOMIC_RELAXED);
        pthread_mutex_lock(&pool_lock);
        if (__atomic_sub_fetch(&job->users, 1, __ATOMIC_ACQ_REL) == 0) /* (the caller may free the job once */
            pthread_cond_broadcast(&pool_left);                        /*  it holds the lock again) */
    }
    return NULL;
}

static void pool_after_fork(void) {
    pthread_mutex_init(&pool_lock, NULL);
    pthread_cond_init(&pool_wake, NULL);
    pthread_cond_init(&pool_left, NULL);
    pool_job = NULL, pool_participants = NULL, pool_joined = 0, pool_helpers = 0, pool_sleeping = 0;
}

/* Posts `job` to the pool unless another caller's is posted; whether it was. */
static int pool_post(read_job_t *job, participant_t *participants) {
    int wanted = usable_cpus - 1 < MAX_READ_HELPERS ? usable_cpus - 1 : MAX_READ_HELPERS;
    if (wanted < 1) return 0;
    pthread_mutex_lock(&pool_lock);
    int posted = pool_job == NULL;
    if (posted) {
        for (; pool_helpers < wanted; pool_helpers++) {
            pthread_t thread;
            pthread_attr_t attributes;
            pthread_attr_init(&attributes);
            pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
            pthread_attr_setstacksize(&attributes, 256 * 1024); /* (they hold no more than a few frames) */
            int started = pthread_create(&thread, &attributes, pool_helper, NULL) == 0;
            pthread_attr_destroy(&attributes);
            if (!started) break;
        }
        posted = pool_helpers > 0;
    }
    if (posted) {
        pool_job = job, pool_participants = participants, pool_joined = 0;
        __atomic_store_n(&pool_posts, pool_posts + 1, __ATOMIC_RELEASE);
        if (pool_sleeping > 0) pthread_cond_broadcast(&pool_wake); /* (polling ones see the post) */
    }
    pthread_mutex_unlock(&pool_lock);
    return posted;
}

static void pool_withdraw(read_job_t *job) {
    pthread_mutex_lock(&pool_lock);
    pool_job = NULL, pool_participants = NULL;
    pthread_mutex_unlock(&pool_lock);
    /* helpers in the job hold a block each at most (~5 us from memory): polled for a moment, then
     * slept on (a block from disk takes milliseconds; a SCHED_BATCH helper behind this thread on its
     * CPU runs only once it sleeps) */
    long long deadline = monotonic_ns() + WITHDRAW_POLL_NS;
    while (__atomic_load_n(&job->users, __ATOMIC_ACQUIRE) > 0 && monotonic_ns() < deadline) cpu_relax();
    pthread_mutex_lock(&pool_lock);
    while (__atomic_load_n(&job->users, __ATOMIC_ACQUIRE) > 0) pthread_cond_wait(&pool_left, &pool_lock);
    pthread_mutex_unlock(&pool_lock);
}

/* wake_helpers(): the read pool's sleeping helpers woken to poll for a post (HELPER_POLL_NS): what a
 * read about to post a job calls ahead of it, so that the helpers' wake-up overlaps its own work. */
static PyObject *wake_helpers(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    pthread_mutex_lock(&pool_lock);
    if (pool_sleeping > 0) {
        pool_wakes++;
        pthread_cond_broadcast(&pool_wake);
    }
    pthread_mutex_unlock(&pool_lock);
    Py_RETURN_NONE;
}

/* read_records(fd, positions, lengths, raw_lengths, crcs, topic_counts, firsts, rows, ints, text_counts)
 *   -> (None, heap, text_lengths) | ((block, reason, bytes read), None, None)
 * Block b (int64 arrays, one value a block, sorted by position): `lengths[b]` bytes at
 * `positions[b]` of the file `fd`, checksum crcs[b], raw_lengths[b] bytes once decompressed, its
 * batch's topic count topic_counts[b]; its records to decode are rows[firsts[b] : firsts[b + 1]]
 * (firsts has one value more). Each record's INT_FIELDS columns go to ints (int64, records x
 * INT_FIELDS), its text count to text_counts (int64); its texts' bytes, back to back, to heap
 * and their lengths (int64, native order) to text_lengths. */
static PyObject *read_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "read_records takes 10 arguments");
        return NULL;
    }
    int fd = PyLong_AsLong(args[0]);
    if (fd == -1 && PyErr_Occurred()) return NULL;
    Py_buffer views[9]; /* positions, lengths, raw_lengths, crcs, topic_counts, firsts, rows, ints, text_counts */
    int held = 0;
    for (; held < 9; held++) {
        if (!int64_buffer(args[1 + held], &views[held], held >= 7, "read_records")) break;
    }
    PyObject *result = NULL;
    if (held == 9) {
        const int64_t *positions = views[0].buf, *lengths = views[1].buf, *raw_lengths = views[2].buf;
        const int64_t *crcs = views[3].buf, *topic_counts = views[4].buf, *firsts = views[5].buf;
        const int64_t *rows = views[6].buf;
        int64_t *ints = views[7].buf, *text_counts = views[8].buf;
        Py_ssize_t blocks = views[0].len / 8, records = views[6].len / 8;
        int sizes_ok = views[1].len / 8 == blocks && views[2].len / 8 == blocks && views[3].len / 8 == blocks &&
                       views[4].len / 8 == blocks && views[5].len / 8 == blocks + 1 && views[7].len / 8 == records * INT_FIELDS &&
                       views[8].len / 8 == records;
        for (Py_ssize_t b = 0; sizes_ok && b < blocks; b++)
            sizes_ok = firsts[b] >= 0 && firsts[b] <= firsts[b + 1] && firsts[b + 1] <= records && lengths[b] >= 0 &&
                       lengths[b] <= UINT32_MAX && raw_lengths[b] >= 0 && raw_lengths[b] <= UINT32_MAX;
        if (!sizes_ok) {
            PyErr_SetString(PyExc_ValueError, "read_records: arrays of inconsistent sizes");
        } else {
            read_job_t job = {fd, positions, lengths, raw_lengths, crcs, topic_counts, firsts, rows, ints, text_counts,
                              blocks, 0, blocks, 0, NULL};
            participant_t participants[MAX_READ_HELPERS + 1];
            for (int p = 0; p <= MAX_READ_HELPERS; p++) participants[p] = (participant_t){{0}, {0}, -1, OK, 0, 0};
            Py_BEGIN_ALLOW_THREADS
            if (blocks >= PARALLEL_MIN_BLOCKS) {
                job.placed = malloc(sizeof *job.placed * (size_t)blocks);
                if (job.placed != NULL && !pool_post(&job, participants)) free(job.placed), job.placed = NULL;
            }
            participate(&job, &participants[0], 0);
            if (job.placed != NULL) pool_withdraw(&job);
            Py_END_ALLOW_THREADS
            /* The outcome: the first damaged block's, or the texts joined in block order (the
             * caller's own, as they are, when it decoded every block). */
            growing_t heap = {0}, text_lengths = {0};
            Py_ssize_t bad = -1;
            int reason = OK, no_memory = 0;
            int64_t got = 0;
            for (int p = 0; p <= MAX_READ_HELPERS; p++)
                if (participants[p].bad >= 0 && participants[p].bad == job.first_bad)
                    bad = participants[p].bad, reason = participants[p].reason, got = participants[p].got;
            if (reason == NO_MEMORY) no_memory = 1, bad = -1;
            if (!no_memory && bad < 0) {
                if (participants[0].taken == blocks) {
                    heap = participants[0].heap, text_lengths = participants[0].text_lengths;
                    participants[0].heap = (growing_t){0}, participants[0].text_lengths = (growing_t){0};
                } else {
                    for (Py_ssize_t b = 0; b < blocks && !no_memory; b++) {
                        const placement_t *at = &job.placed[b];
                        const participant_t *owner = &participants[at->owner];
                        no_memory = !append(&heap, owner->heap.data + at->heap_at, at->heap_length) ||
                                    !append(&text_lengths, owner->text_lengths.data + at->lengths_at, at->lengths_length);
                    }
                }
            }
            for (int p = 0; p <= MAX_READ_HELPERS; p++) free(participants[p].heap.data), free(participants[p].text_lengths.data);
            free(job.placed);
            if (no_memory) {
                PyErr_NoMemory();
            } else if (bad >= 0) {
                result = Py_BuildValue("((niL)OO)", bad, reason, (long long)got, Py_None, Py_None);
            } else {
                PyObject *heap_bytes = PyBytes_FromStringAndSize((const char *)heap.data, (Py_ssize_t)heap.length);
                PyObject *length_bytes = PyBytes_FromStringAndSize((const char *)text_lengths.data,
                                                                   (Py_ssize_t)text_lengths.length);
                if (heap_bytes != NULL && length_bytes != NULL) result = PyTuple_Pack(3, Py_None, heap_bytes, length_bytes);
                Py_XDECREF(heap_bytes);
                Py_XDECREF(length_bytes);
            }
            free(heap.data);
            free(text_lengths.data);
        }
    }
    for (int i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    return result;
}

/* record_texts(heap, text_lengths, text_counts) -> (texts, ascii, backslash)
 * read_records' heap cut into each record's texts: a list per record (text_counts[r] texts, int64)
 * of its texts (text_lengths: int64, back to back in heap). An ASCII heap gives str (its bytes are
 * then the keys as given: no field term is ASCII), any other bytes; `backslash`: a text holds a
 * backslash (results show such a text escaped: message.arrow_text). In Python the cut costs ~1.5
 * us a record of a lookup's tens to hundreds; here ~0.1. */
static PyObject *record_texts(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "record_texts takes 3 arguments");
        return NULL;
    }
    Py_buffer views[3]; /* heap, text_lengths, text_counts */
    int held = 0;
    for (; held < 3; held++) {
        if (held == 0 ? PyObject_GetBuffer(args[0], &views[0], PyBUF_C_CONTIGUOUS) != 0
                      : !int64_buffer(args[held], &views[held], 0, "record_texts"))
            break;
    }
    PyObject *result = NULL;
    if (held == 3) {
        const uint8_t *heap = views[0].buf;
        const int64_t *lengths = views[1].buf, *counts = views[2].buf;
        Py_ssize_t heap_length = views[0].len, texts = views[1].len / 8, records = views[2].len / 8;
        /* the lengths must cut exactly the heap, the counts exactly the lengths */
        int64_t total = 0, counted = 0;
        int consistent = 1;
        for (Py_ssize_t t = 0; t < texts && consistent; t++)
            consistent = lengths[t] >= 0 && lengths[t] <= heap_length - total, total += lengths[t];
        for (Py_ssize_t r = 0; r < records && consistent; r++)
            consistent = counts[r] >= 0 && counts[r] <= texts - counted, counted += counts[r];
        if (!consistent || total != heap_length || counted != texts) {
            PyErr_SetString(PyExc_ValueError, "record_texts: lengths and counts do not cut the heap");
        } else {
            int ascii = 1, backslash = 0;
            for (Py_ssize_t i = 0; i < heap_length; i++) ascii &= heap[i] < 0x80, backslash |= heap[i] == '\\';
            PyObject *all = PyList_New(records);
            const uint8_t *at = heap;
            Py_ssize_t text = 0;
            for (Py_ssize_t r = 0; all != NULL && r < records; r++) {
                PyObject *own = PyList_New((Py_ssize_t)counts[r]);
                for (Py_ssize_t i = 0; own != NULL && i < counts[r]; i++, text++) {
                    Py_ssize_t length = (Py_ssize_t)lengths[text];
                    PyObject *item;
                    if (ascii) {
                        item = PyUnicode_New(length, 127);
                        if (item != NULL) memcpy(PyUnicode_1BYTE_DATA(item), at, (size_t)length);
                    } else {
                        item = PyBytes_FromStringAndSize((const char *)at, length);
                    }
                    at += length;
                    if (item == NULL) Py_CLEAR(own);
                    else PyList_SET_ITEM(own, i, item);
                }
                if (own == NULL) Py_CLEAR(all);
                else PyList_SET_ITEM(all, r, own);
            }
            if (all != NULL) {
                result = Py_BuildValue("(NOO)", all, ascii ? Py_True : Py_False, backslash ? Py_True : Py_False);
            }
        }
    }
    for (int i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    return result;
}

/* checksums(data, starts, lengths, out): out[i] = the block checksum of data[starts[i] : starts[i] +
 * lengths[i]] (int64 arrays; a slice outside data is a ValueError, nothing computed): a lookup's
 * first touch of a hundred chunks of hash entries in one call (entry_sums), not a hundred. */
static PyObject *checksums(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "checksums takes 4 arguments");
        return NULL;
    }
    Py_buffer data;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_C_CONTIGUOUS) != 0) return NULL;
    Py_buffer views[3]; /* starts, lengths, out */
    int held = 0;
    Py_ssize_t count = -1;
    for (; held < 3; held++) {
        if (!int64_buffer(args[1 + held], &views[held], held == 2, "checksums")) break;
        if (count >= 0 && views[held].len / 8 != count) {
            PyBuffer_Release(&views[held]);
            PyErr_SetString(PyExc_ValueError, "checksums takes int64 arrays of one length");
            break;
        }
        count = views[held].len / 8;
    }
    PyObject *result = NULL;
    if (held == 3) {
        const int64_t *starts = views[0].buf, *lengths = views[1].buf;
        int64_t *out = views[2].buf;
        int inside = 1;
        for (Py_ssize_t i = 0; i < count && inside; i++)
            inside = starts[i] >= 0 && lengths[i] >= 0 && starts[i] <= data.len && lengths[i] <= data.len - starts[i];
        if (!inside) {
            PyErr_SetString(PyExc_ValueError, "checksums: a slice lies outside the data");
        } else {
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t i = 0; i < count; i++)
                out[i] = block_checksum((const uint8_t *)data.buf + starts[i], (size_t)lengths[i]);
            Py_END_ALLOW_THREADS
            result = Py_None;
            Py_INCREF(result);
        }
    }
    for (int i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    PyBuffer_Release(&data);
    return result;
}

/* checksum(data) -> the block checksum of data (an int) */
/* helper_blocks() -> int: the blocks the read pool's helpers decoded since import. */
static PyObject *helper_blocks(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyLong_FromLongLong(__atomic_load_n(&pool_blocks_read, __ATOMIC_RELAXED));
}

static PyObject *checksum(PyObject *module, PyObject *data) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_C_CONTIGUOUS) != 0) return NULL;
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = block_checksum(view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef methods[] = {
    {"checksum", (PyCFunction)checksum, METH_O, "checksum(data): the CRC-32 blocks are checked with (zlib's)."},
    {"checksums", (PyCFunction)(void (*)(void))checksums, METH_FASTCALL,
     "checksums(data, starts, lengths, out): out[i] = checksum(data[starts[i] : starts[i] + lengths[i]]) (int64)."},
    {"read_records", (PyCFunction)(void (*)(void))read_records, METH_FASTCALL,
     "read_records(fd, positions, lengths, raw_lengths, crcs, topic_counts, firsts, rows, ints, text_counts): "
     "records of scattered blocks read, checked, decompressed and decoded; (None, heap, text_lengths) or "
     "((block, reason, bytes read), None, None)."},
    {"record_texts", (PyCFunction)(void (*)(void))record_texts, METH_FASTCALL,
     "record_texts(heap, text_lengths, text_counts): read_records' texts, a list per record; (texts, ascii, "
     "backslash)."},
    {"wake_helpers", (PyCFunction)wake_helpers, METH_NOARGS,
     "wake_helpers(): the read pool's sleeping helpers woken ahead of a read_records of many blocks."},
    {"helper_blocks", (PyCFunction)helper_blocks, METH_NOARGS,
     "helper_blocks(): the blocks read_records' helper threads decoded since import."},
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
        if (lz4_decompress != NULL)
            lz4_decompress_prefix = (lz4_decompress_partial)dlsym(library, "LZ4_decompress_safe_partial");
    }
    if (lz4_decompress == NULL) {
        PyErr_SetString(PyExc_ImportError, "no LZ4 shared library (liblz4.so.1) on this system");
        return NULL;
    }
    for (size_t i = 0; i < sizeof CRC_LIBRARIES / sizeof CRC_LIBRARIES[0] && libdeflate_crc32 == NULL; i++) {
        void *library = dlopen(CRC_LIBRARIES[i], RTLD_NOW | RTLD_LOCAL);
        if (library != NULL) libdeflate_crc32 = (crc32_function)dlsym(library, "libdeflate_crc32");
    }
#ifdef __linux__
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) usable_cpus = CPU_COUNT(&allowed);
#endif
    if (usable_cpus < 1) usable_cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (usable_cpus < 1) usable_cpus = 1;
    pthread_atfork(NULL, NULL, pool_after_fork);
    PyObject *module = PyModule_Create(&module_def);
    if (module != NULL &&
        (PyModule_AddStringConstant(module, "CHECKSUM_LIBRARY", libdeflate_crc32 != NULL ? "libdeflate" : "zlib") != 0 ||
         PyModule_AddIntConstant(module, "PARALLEL_MIN_BLOCKS", PARALLEL_MIN_BLOCKS) != 0 ||
         PyModule_AddIntConstant(module, "READ_HELPERS", usable_cpus - 1 < MAX_READ_HELPERS ? usable_cpus - 1 : MAX_READ_HELPERS) != 0)) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
