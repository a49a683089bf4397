/* Lossless restart-marker transcoding with libjpeg-turbo, for `stoker prepare imagenet`.
 *
 *   transcode(data, interval_px) -> (jpeg bytes, restart index bytes or None, was progressive)
 *
 * The DCT coefficients are read and written back unchanged (no re-quantisation) as one
 * sequential, interleaved scan with optimal Huffman tables and a restart marker every R MCUs, R a divisor of the MCUs in a row chosen so
 * that an interval is about `interval_px` pixels wide (restart_index.h says why it must divide
 * the row). APPn and COM segments (EXIF, ICC, XMP) are copied. The index lists where every
 * interval's bytes start. interval_px 0 writes no markers and no index (only the Huffman tables
 * are optimised: what the markers cost is measured against that). Files the crop decoder cannot splice raise NotImplementedError with
 * the reason (arithmetic-coded, sequential multi-scan, CMYK/YCCK); undecodable or truncated
 * ones raise ValueError. A progressive file holds the same coefficients once all its scans are
 * read, so it is written sequential too: the same pixels (tested), decoded about 3x faster. The GIL is released while libjpeg works.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>

#include "jpeg_errors.h"
#include "restart_index.h"

typedef enum { DONE, UNDECODABLE, CORRUPT, UNSUITED, INDEX_MISMATCH } outcome;

typedef struct {
    unsigned char *jpeg;  /* malloc'd by libjpeg's memory destination */
    unsigned long jpeg_len;
    unsigned char *index; /* malloc'd here */
    size_t index_len;
    const char *unsuited; /* why, for UNSUITED */
    int progressive;      /* the source was progressive (it is written sequential) */
    char message[JMSG_LENGTH_MAX];
} transcode_result;

/* The largest divisor of `mcus_per_row` no wider than about twice the target, preferring the one
 * closest to the target on a log scale; a whole row when no divisor comes near. */
static unsigned int interval_mcus(unsigned int mcus_per_row, unsigned int target) {
    if (target < 1) target = 1;
    unsigned int best = mcus_per_row;
    double best_cost = 1e9;
    for (unsigned int d = 1; d <= mcus_per_row; d++) {
        if (mcus_per_row % d) continue;
        if (2 * d < target || d > 2 * target) continue;
        double ratio = d > target ? (double)d / target : (double)target / d;
        if (ratio < best_cost) {
            best_cost = ratio;
            best = d;
        }
    }
    return best;
}

static void copy_markers(struct jpeg_decompress_struct *src, struct jpeg_compress_struct *dst) {
    for (jpeg_saved_marker_ptr m = src->marker_list; m != NULL; m = m->next) {
        /* libjpeg writes its own JFIF APP0 and Adobe APP14 where it needs them: skip the old ones. */
        if (dst->write_JFIF_header && m->marker == JPEG_APP0 && m->data_length >= 5 &&
            memcmp(m->data, "JFIF", 5) == 0)
            continue;
        if (dst->write_Adobe_marker && m->marker == JPEG_APP0 + 14 && m->data_length >= 5 &&
            memcmp(m->data, "Adobe", 5) == 0)
            continue;
        jpeg_write_marker(dst, m->marker, m->data, m->data_length);
    }
}

/* Where each interval's bytes start, found by walking the scan for RSTm markers. */
static outcome index_intervals(transcode_result *res, size_t scan_start, unsigned int r, unsigned int per_row,
                               unsigned int intervals) {
    res->index_len = 4 * ((size_t)RESTART_INDEX_HEADER + intervals + 1);
    res->index = malloc(res->index_len);
    if (res->index == NULL) return UNDECODABLE;
    restart_index_put(res->index, 0, RESTART_INDEX_VERSION);
    restart_index_put(res->index, 1, r);
    restart_index_put(res->index, 2, per_row);
    restart_index_put(res->index, 3, intervals);
    restart_index_put(res->index, RESTART_INDEX_HEADER, (uint32_t)scan_start);
    const unsigned char *b = res->jpeg;
    size_t found = 1;
    for (size_t i = scan_start; i + 1 < res->jpeg_len; i++) {
        if (b[i] != 0xFF) continue;
        unsigned char next = b[i + 1];
        if (next == 0x00 || next == 0xFF) continue; /* stuffed byte, or fill before a marker */
        if (next >= 0xD0 && next <= 0xD7) {
            if (found >= intervals || next != 0xD0 + ((found - 1) & 7)) return INDEX_MISMATCH;
            restart_index_put(res->index, RESTART_INDEX_HEADER + found++, (uint32_t)(i + 2));
            i++;
            continue;
        }
        if (next == 0xD9 && found == intervals) {
            restart_index_put(res->index, RESTART_INDEX_HEADER + intervals, (uint32_t)i);
            return DONE;
        }
        return INDEX_MISMATCH;
    }
    return INDEX_MISMATCH;
}

/* The offset of the first entropy-coded byte: just after the SOS segment. */
static size_t scan_start_of(const unsigned char *b, size_t len) {
    size_t i = 2;
    while (i + 4 <= len && b[i] == 0xFF) {
        unsigned char marker = b[i + 1];
        size_t seg = ((size_t)b[i + 2] << 8) | b[i + 3];
        if (marker == 0xDA) return i + 2 + seg;
        i += 2 + seg;
    }
    return 0;
}

static outcome transcode_file(const unsigned char *buf, size_t len, unsigned int interval_px, error_state *err,
                              transcode_result *res) {
    struct jpeg_decompress_struct src;
    struct jpeg_compress_struct dst;
    src.err = init_errors(err);
    dst.err = src.err;
    jpeg_create_decompress(&src);
    jpeg_create_compress(&dst);
    if (setjmp(err->escape)) {
        jpeg_destroy_compress(&dst);
        jpeg_destroy_decompress(&src);
        return UNDECODABLE;
    }
    jpeg_mem_src(&src, buf, (unsigned long)len);
    jpeg_save_markers(&src, JPEG_COM, 0xFFFF);
    for (int m = 0; m < 16; m++) jpeg_save_markers(&src, JPEG_APP0 + m, 0xFFFF);
    jpeg_read_header(&src, TRUE);
    res->progressive = src.progressive_mode;
    res->unsuited = src.arith_code ? "arithmetic-coded"
                    : (src.jpeg_color_space == JCS_CMYK || src.jpeg_color_space == JCS_YCCK) ? "CMYK/YCCK"
                    : (!src.progressive_mode && src.comps_in_scan != src.num_components) ? "multi-scan"
                    : NULL;
    if (res->unsuited) {
        jpeg_destroy_compress(&dst);
        jpeg_destroy_decompress(&src);
        return UNSUITED;
    }
    jvirt_barray_ptr *coefficients = jpeg_read_coefficients(&src);
    if (err->warned) {
        jpeg_destroy_compress(&dst);
        jpeg_destroy_decompress(&src);
        return CORRUPT;
    }
    jpeg_copy_critical_parameters(&src, &dst);
    /* One interleaved scan: an MCU is one block for a single component, else max_h x max_v blocks. */
    int single = src.num_components == 1;
    unsigned int mcu_w = single ? DCTSIZE : (unsigned int)(DCTSIZE * src.max_h_samp_factor);
    unsigned int mcu_h = single ? DCTSIZE : (unsigned int)(DCTSIZE * src.max_v_samp_factor);
    unsigned int per_row_mcus = (src.image_width + mcu_w - 1) / mcu_w;
    unsigned int rows = (src.image_height + mcu_h - 1) / mcu_h;
    unsigned int r = interval_px ? interval_mcus(per_row_mcus, (interval_px + mcu_w / 2) / mcu_w) : 0;
    dst.optimize_coding = TRUE;
    dst.restart_interval = r;
    jpeg_mem_dest(&dst, &res->jpeg, &res->jpeg_len);
    jpeg_write_coefficients(&dst, coefficients);
    copy_markers(&src, &dst);
    jpeg_finish_compress(&dst);
    jpeg_finish_decompress(&src);
    jpeg_destroy_compress(&dst);
    jpeg_destroy_decompress(&src);
    if (r == 0) return DONE; /* no markers asked for: only the Huffman tables were optimised */
    size_t scan_start = scan_start_of(res->jpeg, res->jpeg_len);
    if (scan_start == 0) return INDEX_MISMATCH;
    return index_intervals(res, scan_start, r, per_row_mcus / r, (per_row_mcus / r) * rows);
}

static PyObject *transcode(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned int interval_px;
    if (!PyArg_ParseTuple(args, "y*I", &data, &interval_px)) return NULL;
    if ((interval_px != 0 && interval_px < 8) || interval_px > 65535) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "interval_px must be 0 (no restart markers) or 8..65535");
        return NULL;
    }
    error_state err;
    transcode_result res = {NULL, 0, NULL, 0, NULL, 0, ""};
    outcome done;
    Py_BEGIN_ALLOW_THREADS
    done = transcode_file((const unsigned char *)data.buf, (size_t)data.len, interval_px, &err, &res);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyObject *out = NULL;
    switch (done) {
    case DONE:
        out = res.index ? Py_BuildValue("(y#y#O)", res.jpeg, (Py_ssize_t)res.jpeg_len, res.index,
                                        (Py_ssize_t)res.index_len, res.progressive ? Py_True : Py_False)
                        : Py_BuildValue("(y#OO)", res.jpeg, (Py_ssize_t)res.jpeg_len, Py_None,
                                        res.progressive ? Py_True : Py_False);
        break;
    case UNDECODABLE: PyErr_Format(PyExc_ValueError, "not a decodable JPEG: %s", err.message); break;
    case CORRUPT: PyErr_Format(PyExc_ValueError, "corrupt or truncated JPEG: %s", err.message); break;
    case UNSUITED: PyErr_Format(PyExc_NotImplementedError, "%s JPEG", res.unsuited); break;
    default: PyErr_SetString(PyExc_RuntimeError, "the transcoded scan does not have the expected restart markers");
    }
    free(res.jpeg);
    free(res.index);
    return out;
}

static PyMethodDef methods[] = {
    {"transcode", transcode, METH_VARARGS,
     "transcode(data, interval_px) -> (jpeg bytes, restart index bytes or None, was progressive); lossless"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegrestart",
                                    "Lossless restart-marker transcoding with libjpeg-turbo.", -1, methods};

PyMODINIT_FUNC PyInit__jpegrestart(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyModule_AddIntConstant(m, "RESTART_INDEX_VERSION", RESTART_INDEX_VERSION);
    return m;
}
