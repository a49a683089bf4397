/* Crop-window JPEG decoding with libjpeg-turbo, for Stoker's training transform.
 *
 * A random resized crop uses a window of the image, and it only needs that window at the
 * output size. libjpeg-turbo can decode at 1/2, 1/4 or 1/8 scale in the IDCT, skip whole
 * rows above the window (jpeg_skip_scanlines), stop after its last row, and decode only the
 * iMCU columns that cover it (jpeg_crop_scanline). This module exposes exactly that:
 *
 *   header(data) -> (width, height, components, colorspace, progressive)
 *   decode(data, denom, left, top, right, bottom[, num[, restarts]], *, strict=False, channels=4)
 *       -> (rgbx bytes, width, height, x, y, path)
 *
 * `decode` returns rows [top, bottom) of the image scaled by num/denom (num 1 and denom 1, 2, 4
 * or 8, or denom 8 and num 1..16: libjpeg-turbo scales the IDCT by any M/8), at least covering
 * columns [left, right): the region actually decoded starts at column x (iMCU-aligned, <= left)
 * and is `width` columns wide. Pixels are RGBX (4 bytes), the layout Pillow keeps RGB images
 * in, so Pillow can wrap the buffer without a copy; `channels` 3 gives RGB, the layout numpy
 * wraps as (height, width, 3). Greyscale is expanded by libjpeg. CMYK and YCCK
 * images raise NotImplementedError so the caller can use its general decoder. The GIL is released
 * while libjpeg works.
 *
 * `restarts`, the restart index of a file transcoded by pipeline.images._jpegrestart (restart_index.h),
 * lets it entropy-decode only the restart intervals the window touches, instead of every row
 * down to the window's end: it splices those intervals into a small JPEG of their own. `path`
 * says what happened: "plain" (no index), "spliced", "whole" (the window needs the whole file)
 * or "rejected" (the index does not describe this file, which was then decoded without it).
 *
 * `strict` (keyword, default False): a file libjpeg says is corrupt (jpeg_errors.h: corrupt
 * data, a premature end, ...) raises ValueError with libjpeg's words, wherever in the scan it is:
 * the rows below the window are entropy-decoded too (no IDCT) and the markers read up to EOI,
 * because a garbled scan often decodes as valid codes and is only noticed at its end. A file
 * decoded through its restart index is exempt from that tail: the index is written only by
 * `stoker prepare`'s transcoder, which refuses any file libjpeg warns about. Lenient, only a
 * premature end inside the decoded rows raises ValueError; other warnings are ignored, as Pillow
 * ignores them.
 *
 *   scan(data) -> None, or why libjpeg says the file is corrupt
 *
 * entropy-decodes the whole file at 1/8 scale without an IDCT (skipped rows) and reads it to EOI,
 * for the decoders that cannot hear libjpeg's warnings themselves (Pillow's); ValueError when
 * the file is not decodable at all.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>

#include "jpeg_errors.h"
#include "restart_index.h"

static const char *colorspace_name(J_COLOR_SPACE cs) {
    switch (cs) {
    case JCS_GRAYSCALE: return "gray";
    case JCS_RGB: return "rgb";
    case JCS_YCbCr: return "ycbcr";
    case JCS_CMYK: return "cmyk";
    case JCS_YCCK: return "ycck";
    default: return "unknown";
    }
}

static PyObject *header(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    struct jpeg_decompress_struct cinfo;
    error_state err;
    cinfo.err = init_errors(&err);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.escape)) {
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        PyErr_Format(PyExc_ValueError, "not a JPEG, or its header is unreadable: %s", err.message);
        return NULL;
    }
    jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
    jpeg_read_header(&cinfo, TRUE);
    PyObject *out = Py_BuildValue("(IIisO)", cinfo.image_width, cinfo.image_height, cinfo.num_components,
                                  colorspace_name(cinfo.jpeg_color_space),
                                  cinfo.progressive_mode ? Py_True : Py_False);
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&data);
    return out;
}

/* The region can be wider than asked by at most one iMCU (<= 32 scaled columns) on each side. */
#define CROP_SLACK 64

typedef struct {
    unsigned char *pixels;  /* caller's buffer of `capacity` bytes */
    size_t capacity;
    int channels;     /* 4: RGBX, 3: RGB */
    JDIMENSION width, height, x;
    int failed;       /* 1: libjpeg error, 2: corrupt or truncated, 3: unsupported colour space, 4: bad window,
                         5: too big */
} decode_result;

/* What libjpeg's warnings make of a file: 1 if the caller must refuse it. Strict: any corrupt-data
 * warning; lenient: a premature end only. */
static int refused(const error_state *err, int strict) { return strict ? err->corrupt : err->truncated; }

/* The rest of the scan after the rows read: the rows below entropy-decoded and dropped (no IDCT),
 * the last one read into a row of libjpeg's own pool (freed with cinfo, also after a longjmp), then
 * the markers up to EOI, where a scan that ran long or short is noticed. */
static void read_rest(struct jpeg_decompress_struct *cinfo, error_state *err) {
    JDIMENSION last = cinfo->output_height - 1;
    if (cinfo->output_scanline < last) jpeg_skip_scanlines(cinfo, last - cinfo->output_scanline);
    JSAMPARRAY row = (*cinfo->mem->alloc_sarray)((j_common_ptr)cinfo, JPOOL_IMAGE,
                                                  cinfo->output_width * (JDIMENSION)cinfo->output_components, 1);
    while (cinfo->output_scanline < cinfo->output_height && !err->corrupt) jpeg_read_scanlines(cinfo, row, 1);
    if (!err->corrupt) jpeg_finish_decompress(cinfo);
}

/* `strict` (refused) and `whole_scan`: read the rest of the scan after the window too (read_rest). */
static void decode_window(const unsigned char *buf, size_t len, int num, int denom, JDIMENSION left, JDIMENSION top,
                          JDIMENSION right, JDIMENSION bottom, int strict, int whole_scan, error_state *err,
                          decode_result *res) {
    struct jpeg_decompress_struct cinfo;
    unsigned char *pixels = res->pixels;
    JSAMPROW rows[16];
    cinfo.err = init_errors(err);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err->escape)) {
        jpeg_destroy_decompress(&cinfo);
        res->failed = 1;
        return;
    }
    jpeg_mem_src(&cinfo, buf, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
        jpeg_destroy_decompress(&cinfo);
        res->failed = 3;
        return;
    }
    cinfo.out_color_space = res->channels == 3 ? JCS_RGB : JCS_EXT_RGBX;
    cinfo.scale_num = (unsigned int)num;
    cinfo.scale_denom = (unsigned int)denom;
    jpeg_start_decompress(&cinfo);
    if (right > cinfo.output_width) right = cinfo.output_width;
    if (bottom > cinfo.output_height) bottom = cinfo.output_height;
    if (left >= right || top >= bottom) {
        jpeg_destroy_decompress(&cinfo);
        res->failed = 4;
        return;
    }
    JDIMENSION x = left, width = right - left;
    if (x > 0 || width < cinfo.output_width) jpeg_crop_scanline(&cinfo, &x, &width);
    size_t stride = (size_t)cinfo.output_width * res->channels; /* output_width is now the cropped width */
    if (stride * (bottom - top) > res->capacity) {
        jpeg_destroy_decompress(&cinfo);
        res->failed = 5;
        return;
    }
    if (top > 0) jpeg_skip_scanlines(&cinfo, top);
    while (cinfo.output_scanline < bottom && !refused(err, strict)) {
        JDIMENSION want = bottom - cinfo.output_scanline;
        if (want > 16) want = 16;
        for (JDIMENSION i = 0; i < want; i++) rows[i] = pixels + stride * (cinfo.output_scanline - top + i);
        jpeg_read_scanlines(&cinfo, rows, want);
    }
    res->width = cinfo.output_width;
    res->height = bottom - top;
    res->x = x;
    if (strict && whole_scan && !err->corrupt) read_rest(&cinfo, err);
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    if (refused(err, strict)) res->failed = 2;
}

/* ---- Splicing the restart intervals a window needs (files transcoded by pipeline.images._jpegrestart). ---- */

/* Scaled pixels kept between a band edge inside the image and the window: fancy chroma
 * upsampling reads one neighbouring sample, which a band replicates at its edge. */
#define BAND_MARGIN 2

typedef struct {
    unsigned char *buf; /* malloc'd: the band as a JPEG of its own */
    size_t len;
    JDIMENSION x, y;    /* where the band starts in the scaled image */
} band;

typedef enum { SPLICED, WHOLE_FILE, INDEX_REJECTED } splice_outcome;

static unsigned int be16(const unsigned char *p) { return ((unsigned int)p[0] << 8) | p[1]; }

typedef struct {
    size_t sof;        /* offset of the SOF marker */
    size_t scan_start; /* first entropy-coded byte */
    unsigned int width, height, mcu_w, mcu_h;
} frame_layout;

/* Walks the markers up to SOS; 0 if the file is not the baseline/extended Huffman kind the
 * transcoder writes. */
static int read_layout(const unsigned char *b, size_t len, frame_layout *f) {
    size_t i = 2;
    f->sof = 0;
    while (i + 4 <= len && b[i] == 0xFF) {
        unsigned char marker = b[i + 1];
        size_t seg = be16(b + i + 2);
        if (i + 2 + seg > len) return 0;
        if (marker >= 0xC2 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) return 0;
        if (marker == 0xC0 || marker == 0xC1) {
            if (seg < 8) return 0;
            unsigned int comps = b[i + 9], max_h = 1, max_v = 1;
            if (comps < 1 || seg < 8 + 3 * comps) return 0;
            for (unsigned int c = 0; c < comps; c++) {
                unsigned int hv = b[i + 11 + 3 * c];
                if ((hv >> 4) > max_h) max_h = hv >> 4;
                if ((hv & 15) > max_v) max_v = hv & 15;
            }
            f->sof = i;
            f->height = be16(b + i + 5);
            f->width = be16(b + i + 7);
            f->mcu_w = DCTSIZE * (comps == 1 ? 1 : max_h);
            f->mcu_h = DCTSIZE * (comps == 1 ? 1 : max_v);
        }
        if (marker == 0xDA) {
            f->scan_start = i + 2 + seg;
            return f->sof != 0 && f->width > 0 && f->height > 0;
        }
        i += 2 + seg;
    }
    return 0;
}

/* Bytes [start, end) of interval k, or 0 if the index and the file disagree about it. */
static int interval_bytes(const unsigned char *b, size_t len, const unsigned char *index, uint32_t n, uint32_t k,
                          size_t *start, size_t *end) {
    *start = restart_index_get(index, RESTART_INDEX_HEADER + k);
    size_t next = restart_index_get(index, RESTART_INDEX_HEADER + k + 1);
    if (k + 1 < n) {
        if (next < 2 || next > len || b[next - 2] != 0xFF || b[next - 1] != 0xD0 + (k & 7)) return 0;
        *end = next - 2;
    } else {
        if (next + 2 > len || b[next] != 0xFF || b[next + 1] != 0xD9) return 0;
        *end = next;
    }
    return *start <= *end;
}

/* The smallest rectangle of whole intervals that holds the window (plus BAND_MARGIN), written
 * as a JPEG of its own: the original tables, a SOF with the band's size, the intervals with
 * their RST markers renumbered, EOI. EXIF and other APPn/COM segments are left out. */
static splice_outcome splice_band(const unsigned char *b, size_t len, const unsigned char *index, size_t index_len,
                                  int num, int denom, JDIMENSION left, JDIMENSION top, JDIMENSION right,
                                  JDIMENSION bottom, band *out) {
    if (index_len < 4 * (RESTART_INDEX_HEADER + 2) || restart_index_get(index, 0) != RESTART_INDEX_VERSION)
        return INDEX_REJECTED;
    uint32_t r = restart_index_get(index, 1), per_row = restart_index_get(index, 2), n = restart_index_get(index, 3);
    frame_layout f;
    if (r == 0 || per_row == 0 || n == 0 || n % per_row || index_len != 4 * ((size_t)RESTART_INDEX_HEADER + n + 1) ||
        !read_layout(b, len, &f) || f.scan_start != restart_index_get(index, RESTART_INDEX_HEADER))
        return INDEX_REJECTED;
    unsigned int mcus_per_row = (f.width + f.mcu_w - 1) / f.mcu_w, rows = (f.height + f.mcu_h - 1) / f.mcu_h;
    if (mcus_per_row != r * per_row || rows != n / per_row) return INDEX_REJECTED;
    /* The window in stored pixels, widened by the margin, then in intervals and MCU rows. */
    size_t full_l = (size_t)(left > BAND_MARGIN ? left - BAND_MARGIN : 0) * denom / num;
    size_t full_t = (size_t)(top > BAND_MARGIN ? top - BAND_MARGIN : 0) * denom / num;
    size_t full_r = ((size_t)(right + BAND_MARGIN) * denom + num - 1) / num;
    size_t full_b = ((size_t)(bottom + BAND_MARGIN) * denom + num - 1) / num;
    size_t span = (size_t)r * f.mcu_w;
    uint32_t j0 = (uint32_t)(full_l / span), j1 = (uint32_t)((full_r + span - 1) / span);
    uint32_t r0 = (uint32_t)(full_t / f.mcu_h), r1 = (uint32_t)((full_b + f.mcu_h - 1) / f.mcu_h);
    if (j1 > per_row) j1 = per_row;
    if (r1 > rows) r1 = rows;
    if (j0 >= j1 || r0 >= r1) return INDEX_REJECTED;
    if (j0 == 0 && j1 == per_row && r0 == 0) return WHOLE_FILE; /* rows below the window are never read anyway */
    size_t band_x = (size_t)j0 * span, band_y = (size_t)r0 * f.mcu_h;
    size_t band_w = ((size_t)j1 * span < f.width ? (size_t)j1 * span : f.width) - band_x;
    size_t band_h = ((size_t)r1 * f.mcu_h < f.height ? (size_t)r1 * f.mcu_h : f.height) - band_y;
    /* Size the output: kept header segments + the chosen intervals + a marker after each + EOI. */
    size_t need = f.scan_start + 2, s, e;
    for (uint32_t row = r0; row < r1; row++)
        for (uint32_t j = j0; j < j1; j++) {
            if (!interval_bytes(b, len, index, n, row * per_row + j, &s, &e)) return INDEX_REJECTED;
            need += e - s + 2;
        }
    unsigned char *o = malloc(need);
    if (o == NULL) return INDEX_REJECTED;
    size_t w = 0, i = 2;
    o[w++] = 0xFF;
    o[w++] = 0xD8;
    while (i < f.scan_start) {
        unsigned char marker = b[i + 1];
        size_t seg = be16(b + i + 2);
        int kept = !((marker >= 0xE1 && marker <= 0xEF && marker != 0xEE) || marker == 0xFE);
        if (kept) {
            memcpy(o + w, b + i, 2 + seg);
            if (i == f.sof) {
                o[w + 5] = (unsigned char)(band_h >> 8);
                o[w + 6] = (unsigned char)band_h;
                o[w + 7] = (unsigned char)(band_w >> 8);
                o[w + 8] = (unsigned char)band_w;
            }
            w += 2 + seg;
        }
        i += 2 + seg;
    }
    uint32_t written = 0, total = (r1 - r0) * (j1 - j0);
    for (uint32_t row = r0; row < r1; row++)
        for (uint32_t j = j0; j < j1; j++) {
            interval_bytes(b, len, index, n, row * per_row + j, &s, &e);
            memcpy(o + w, b + s, e - s);
            w += e - s;
            if (++written < total) {
                o[w++] = 0xFF;
                o[w++] = (unsigned char)(0xD0 + ((written - 1) & 7));
            }
        }
    o[w++] = 0xFF;
    o[w++] = 0xD9;
    out->buf = o;
    out->len = w;
    out->x = (JDIMENSION)(band_x * num / denom);
    out->y = (JDIMENSION)(band_y * num / denom);
    return SPLICED;
}

/* decode_window on the band the index points to, or on the whole file when the band is the whole
 * file or the index does not fit it. Coordinates in and out are the whole image's. */
static splice_outcome decode_indexed(const unsigned char *buf, size_t len, const unsigned char *index,
                                     size_t index_len, int num, int denom, JDIMENSION left, JDIMENSION top,
                                     JDIMENSION right, JDIMENSION bottom, int strict, error_state *err,
                                     decode_result *res) {
    band cut;
    splice_outcome how = splice_band(buf, len, index, index_len, num, denom, left, top, right, bottom, &cut);
    if (how != SPLICED) { /* a file its index fits was checked whole when the index was written */
        decode_window(buf, len, num, denom, left, top, right, bottom, strict, how == INDEX_REJECTED, err, res);
        return how;
    }
    decode_window(cut.buf, cut.len, num, denom, left - cut.x, top - cut.y, right - cut.x, bottom - cut.y, strict, 0,
                  err, res);
    free(cut.buf);
    res->x += cut.x;
    return SPLICED;
}

/* libjpeg's warning as the reason a strict decoder refuses a file. */
static PyObject *corrupt_reason(const error_state *err) {
    return PyUnicode_FromFormat("%s: libjpeg warned '%s'", err->truncated ? "truncated JPEG" : "corrupt JPEG data",
                                err->message);
}

static void raise_failure(const decode_result *res, const error_state *err) {
    PyObject *reason;
    switch (res->failed) {
    case 1: PyErr_Format(PyExc_ValueError, "not a decodable JPEG: %s", err->message); break;
    case 2:
        reason = corrupt_reason(err);
        if (reason != NULL) {
            PyErr_SetObject(PyExc_ValueError, reason);
            Py_DECREF(reason);
        }
        break;
    case 3: PyErr_SetString(PyExc_NotImplementedError, "CMYK/YCCK JPEG"); break;
    case 4: PyErr_SetString(PyExc_ValueError, "crop window outside the image"); break;
    default: PyErr_SetString(PyExc_ValueError, "decoded region larger than its buffer"); break;
    }
}

static PyObject *decode(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"data", "denom", "left", "top", "right", "bottom", "num", "restarts", "strict",
                               "channels", NULL};
    Py_buffer data, index = {NULL};
    int denom, num = 1, strict = 0, channels = 4;
    unsigned int left, top, right, bottom;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*iIIII|iz*$pi", keywords, &data, &denom, &left, &top, &right,
                                     &bottom, &num, &index, &strict, &channels))
        return NULL;
    if (num == 1 ? (denom != 1 && denom != 2 && denom != 4 && denom != 8) : (denom != 8 || num < 1 || num > 16)) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&index);
        PyErr_SetString(PyExc_ValueError, "the scale must be 1/1, 1/2, 1/4, 1/8 or M/8 with M in 1..16");
        return NULL;
    }
    if (channels != 3 && channels != 4) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&index);
        PyErr_SetString(PyExc_ValueError, "channels must be 4 (RGBX) or 3 (RGB)");
        return NULL;
    }
    if (right <= left || bottom <= top || right - left > 65535 || bottom - top > 65535) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&index);
        PyErr_SetString(PyExc_ValueError, "empty or oversized crop window");
        return NULL;
    }
    /* The bytes object is the output buffer: libjpeg writes into it, then it is shrunk to fit. */
    size_t capacity = ((size_t)(right - left) + CROP_SLACK) * channels * (bottom - top);
    PyObject *pixels = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)capacity);
    if (pixels == NULL) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&index);
        return NULL;
    }
    error_state err;
    decode_result res = {(unsigned char *)PyBytes_AS_STRING(pixels), capacity, channels, 0, 0, 0, 0};
    splice_outcome how = WHOLE_FILE;
    Py_BEGIN_ALLOW_THREADS
    if (index.buf != NULL)
        how = decode_indexed((const unsigned char *)data.buf, (size_t)data.len, (const unsigned char *)index.buf,
                             (size_t)index.len, num, denom, left, top, right, bottom, strict, &err, &res);
    else
        decode_window((const unsigned char *)data.buf, (size_t)data.len, num, denom, left, top, right, bottom, strict,
                      1, &err, &res);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&index);
    if (res.failed) {
        Py_DECREF(pixels);
        raise_failure(&res, &err);
        return NULL;
    }
    if (_PyBytes_Resize(&pixels, (Py_ssize_t)res.width * res.height * channels) < 0) return NULL;
    const char *path = index.buf == NULL ? "plain" : how == SPLICED ? "spliced" : how == WHOLE_FILE ? "whole" : "rejected";
    return Py_BuildValue("(NIIIIs)", pixels, res.width, res.height, res.x, top, path);
}

/* Every entropy-coded byte of the file decoded at 1/8 scale, no pixels kept: 0, or 1 on a libjpeg error. */
static int scan_file(const unsigned char *buf, size_t len, error_state *err) {
    struct jpeg_decompress_struct cinfo;
    cinfo.err = init_errors(err);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err->escape)) {
        jpeg_destroy_decompress(&cinfo);
        return 1;
    }
    jpeg_mem_src(&cinfo, buf, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    cinfo.scale_num = 1;
    cinfo.scale_denom = 8;
    jpeg_start_decompress(&cinfo);
    read_rest(&cinfo, err);
    jpeg_destroy_decompress(&cinfo);
    return 0;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    error_state err;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = scan_file((const unsigned char *)data.buf, (size_t)data.len, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (failed) return PyErr_Format(PyExc_ValueError, "not a decodable JPEG: %s", err.message);
    if (err.corrupt) return corrupt_reason(&err);
    Py_RETURN_NONE;
}

/* ---- After the resize: Pillow keeps RGB as 4-byte pixels; a batch wants 3. ---- */

/* Each RGBX row written as RGB, mirrored left to right with `flip`: one pass where Pillow's transpose,
 * tobytes and the copy into the batch took three. Each pixel is stored as 4 bytes at 3 apart: the 4th
 * lands on the next pixel's first byte, which that pixel then writes; a row's last pixel takes 3. */
static void pack_row_scalar(const unsigned char *in, unsigned char *out, size_t from, size_t width, int flip) {
    uint32_t v;
    for (size_t x = from; x + 1 < width; x++) {
        memcpy(&v, in + 4 * (flip ? width - 1 - x : x), 4);
        memcpy(out + 3 * x, &v, 4);
    }
    if (from < width) memcpy(out + 3 * (width - 1), in + 4 * (flip ? 0 : width - 1), 3);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PACK_SIMD 1
/* Four pixels a step with one byte shuffle (SSSE3): 16 bytes in, 12 out (a 16-byte store whose last 4
 * the next step overwrites), while a whole store still fits in the row; the rest as above. */
__attribute__((target("ssse3"))) static void pack_row_ssse3(const unsigned char *in, unsigned char *out,
                                                            size_t width, int flip) {
    const __m128i keep = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    const __m128i mirror = _mm_setr_epi8(12, 13, 14, 8, 9, 10, 4, 5, 6, 0, 1, 2, -1, -1, -1, -1);
    const __m128i order = flip ? mirror : keep;
    size_t x = 0;
    for (; x + 6 <= width; x += 4) {
        const unsigned char *from = in + 4 * (flip ? width - 4 - x : x);
        __m128i pixels = _mm_loadu_si128((const __m128i *)from);
        _mm_storeu_si128((__m128i *)(out + 3 * x), _mm_shuffle_epi8(pixels, order));
    }
    pack_row_scalar(in, out, x, width, flip);
}
#endif

static void pack_rows(const unsigned char *src, unsigned char *dst, size_t width, size_t height, int flip) {
#ifdef PACK_SIMD
    int simd = __builtin_cpu_supports("ssse3");
#endif
    for (size_t y = 0; y < height; y++) {
        const unsigned char *in = src + y * width * 4;
        unsigned char *out = dst + y * width * 3;
#ifdef PACK_SIMD
        if (simd) {
            pack_row_ssse3(in, out, width, flip);
            continue;
        }
#endif
        pack_row_scalar(in, out, 0, width, flip);
    }
}

static PyObject *pack_rgb(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    unsigned int width, height;
    int flip;
    if (!PyArg_ParseTuple(args, "y*w*IIp", &src, &dst, &width, &height, &flip)) return NULL;
    if ((size_t)src.len != (size_t)width * height * 4 || (size_t)dst.len != (size_t)width * height * 3 ||
        !PyBuffer_IsContiguous(&dst, 'C')) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return PyErr_Format(PyExc_ValueError, "pack_rgb: %u x %u needs %zu source and %zu contiguous target bytes",
                            width, height, (size_t)width * height * 4, (size_t)width * height * 3);
    }
    Py_BEGIN_ALLOW_THREADS
    pack_rows((const unsigned char *)src.buf, (unsigned char *)dst.buf, width, height, flip);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"header", header, METH_VARARGS, "header(data) -> (width, height, components, colorspace, progressive)"},
    {"decode", (PyCFunction)(void (*)(void))decode, METH_VARARGS | METH_KEYWORDS,
     "decode(data, denom, left, top, right, bottom[, num[, restarts]], *, strict=False, channels=4) -> (rgbx bytes, "
     "width, height, x, y, path); scale num/denom; strict: refuse a file libjpeg says is corrupt; channels 3: RGB"},
    {"scan", scan, METH_VARARGS, "scan(data) -> None, or why libjpeg says the file is corrupt"},
    {"pack_rgb", pack_rgb, METH_VARARGS, "pack_rgb(rgbx, target, width, height, flip) -> None: RGBX rows into RGB"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegcrop",
                                    "Crop-window JPEG decoding with libjpeg-turbo.", -1, methods};

PyMODINIT_FUNC PyInit__jpegcrop(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION_NUMBER",
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
                            LIBJPEG_TURBO_VERSION_NUMBER
#else
                            0
#endif
    );
    return m;
}
