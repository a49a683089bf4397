/* Crop-window JPEG decoding with libjpeg-turbo, for Stoker's training transform.
 *
 * A random resized crop uses a window of the image, and it only needs that window at the
 * output size. libjpeg-turbo can decode at 1/2, 1/4 or 1/8 scale in the IDCT, skip whole
 * rows above the window (jpeg_skip_scanlines), stop after its last row, and decode only the
 * iMCU columns that cover it (jpeg_crop_scanline). This module exposes exactly that:
 *
 *   header(data) -> (width, height, components, colorspace, progressive)
 *   decode(data, denom, left, top, right, bottom[, num]) -> (rgbx bytes, width, height, x, y)
 *
 * `decode` returns rows [top, bottom) of the image scaled by num/denom (num 1 and denom 1, 2, 4
 * or 8, or denom 8 and num 1..16: libjpeg-turbo scales the IDCT by any M/8), at least covering
 * columns [left, right): the region actually decoded starts at column x (iMCU-aligned, <= left)
 * and is `width` columns wide. Pixels are RGBX (4 bytes), the layout Pillow keeps RGB images
 * in, so Pillow can wrap the buffer without a copy. Greyscale is expanded by libjpeg. CMYK and YCCK
 * images raise NotImplementedError so the caller can use its general decoder. A premature end
 * of data inside the decoded rows raises ValueError; libjpeg's other warnings are ignored, as
 * Pillow ignores them. The GIL is released while libjpeg works.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf escape;
    int truncated;
    char message[JMSG_LENGTH_MAX];
} error_state;

static void on_error(j_common_ptr cinfo) {
    error_state *err = (error_state *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->escape, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    error_state *err = (error_state *)cinfo->err;
    if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF && !err->truncated) {
        err->truncated = 1;
        (*cinfo->err->format_message)(cinfo, err->message);
    }
}

static void init_errors(struct jpeg_decompress_struct *cinfo, error_state *err) {
    cinfo->err = jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_message;
    err->truncated = 0;
    err->message[0] = '\0';
}

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
    init_errors(&cinfo, &err);
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
#define BYTES_PER_PIXEL 4

typedef struct {
    unsigned char *pixels;  /* caller's buffer of `capacity` bytes */
    size_t capacity;
    JDIMENSION width, height, x;
    int failed;       /* 1: libjpeg error, 2: truncated, 3: unsupported colour space, 4: bad window, 5: too big */
} decode_result;

static void decode_window(const unsigned char *buf, size_t len, int num, int denom, JDIMENSION left, JDIMENSION top,
                          JDIMENSION right, JDIMENSION bottom, error_state *err, decode_result *res) {
    struct jpeg_decompress_struct cinfo;
    unsigned char *pixels = res->pixels;
    JSAMPROW rows[16];
    init_errors(&cinfo, err);
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
    cinfo.out_color_space = JCS_EXT_RGBX;
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
    size_t stride = (size_t)cinfo.output_width * BYTES_PER_PIXEL; /* output_width is now the cropped width */
    if (stride * (bottom - top) > res->capacity) {
        jpeg_destroy_decompress(&cinfo);
        res->failed = 5;
        return;
    }
    if (top > 0) jpeg_skip_scanlines(&cinfo, top);
    while (cinfo.output_scanline < bottom && !err->truncated) {
        JDIMENSION want = bottom - cinfo.output_scanline;
        if (want > 16) want = 16;
        for (JDIMENSION i = 0; i < want; i++) rows[i] = pixels + stride * (cinfo.output_scanline - top + i);
        jpeg_read_scanlines(&cinfo, rows, want);
    }
    res->width = cinfo.output_width;
    res->height = bottom - top;
    res->x = x;
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    if (err->truncated) res->failed = 2;
}

static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer data;
    int denom, num = 1;
    unsigned int left, top, right, bottom;
    if (!PyArg_ParseTuple(args, "y*iIIII|i", &data, &denom, &left, &top, &right, &bottom, &num)) return NULL;
    if (num == 1 ? (denom != 1 && denom != 2 && denom != 4 && denom != 8) : (denom != 8 || num < 1 || num > 16)) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "the scale must be 1/1, 1/2, 1/4, 1/8 or M/8 with M in 1..16");
        return NULL;
    }
    if (right <= left || bottom <= top || right - left > 65535 || bottom - top > 65535) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "empty or oversized crop window");
        return NULL;
    }
    /* The bytes object is the output buffer: libjpeg writes into it, then it is shrunk to fit. */
    size_t capacity = ((size_t)(right - left) + CROP_SLACK) * BYTES_PER_PIXEL * (bottom - top);
    PyObject *pixels = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)capacity);
    if (pixels == NULL) {
        PyBuffer_Release(&data);
        return NULL;
    }
    error_state err;
    decode_result res = {(unsigned char *)PyBytes_AS_STRING(pixels), capacity, 0, 0, 0, 0};
    Py_BEGIN_ALLOW_THREADS
    decode_window((const unsigned char *)data.buf, (size_t)data.len, num, denom, left, top, right, bottom, &err, &res);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (res.failed) {
        Py_DECREF(pixels);
        switch (res.failed) {
        case 1: PyErr_Format(PyExc_ValueError, "not a decodable JPEG: %s", err.message); break;
        case 2: PyErr_Format(PyExc_ValueError, "truncated JPEG: %s", err.message); break;
        case 3: PyErr_SetString(PyExc_NotImplementedError, "CMYK/YCCK JPEG"); break;
        case 4: PyErr_SetString(PyExc_ValueError, "crop window outside the image"); break;
        default: PyErr_SetString(PyExc_ValueError, "decoded region larger than its buffer"); break;
        }
        return NULL;
    }
    if (_PyBytes_Resize(&pixels, (Py_ssize_t)res.width * res.height * BYTES_PER_PIXEL) < 0) return NULL;
    return Py_BuildValue("(NIIII)", pixels, res.width, res.height, res.x, top);
}

static PyMethodDef methods[] = {
    {"header", header, METH_VARARGS, "header(data) -> (width, height, components, colorspace, progressive)"},
    {"decode", decode, METH_VARARGS,
     "decode(data, denom, left, top, right, bottom[, num]) -> (rgbx bytes, width, height, x, y); scale num/denom"},
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
