/* libjpeg error handling shared by Stoker's two C extensions: an error longjmps back to the
 * caller with libjpeg's message instead of exiting the process, and warnings are recorded
 * rather than printed, so the caller decides what a warning means (the crop decoder, strict,
 * refuses a file libjpeg says is corrupt; lenient, it fails only on a premature end inside the
 * rows it returns; the transcoder keeps any file libjpeg warns about as it was). */
#ifndef STOKER_JPEG_ERRORS_H
#define STOKER_JPEG_ERRORS_H

#include <setjmp.h>
#include <stdio.h>
#include <jpeglib.h>
#include <jerror.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf escape;
    int warned;    /* libjpeg warned: corrupt data, premature end, an unknown JFIF version, ... */
    int corrupt;   /* one of the warnings says the entropy-coded data are wrong (corrupt_warning) */
    int truncated; /* one of the warnings was a premature end of data */
    /* the error; else the premature end; else the first corrupt-data warning; else the first warning */
    char message[JMSG_LENGTH_MAX];
} error_state;

/* The warnings after which the pixels are not the ones encoded ("Corrupt JPEG data: ...",
 * "Premature end of JPEG file", a lost restart sync, an inconsistent progression), as opposed to
 * those about metadata (an unknown JFIF revision or Adobe transform code), which leave them be. */
static int corrupt_warning(int code) {
    switch (code) {
    case JWRN_ARITH_BAD_CODE:
    case JWRN_BOGUS_PROGRESSION:
    case JWRN_EXTRANEOUS_DATA:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_JPEG_EOF:
    case JWRN_MUST_RESYNC:
        return 1;
    default:
        return 0;
    }
}

static void on_error(j_common_ptr cinfo) {
    error_state *err = (error_state *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->escape, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    error_state *err = (error_state *)cinfo->err;
    if (level >= 0) return; /* trace messages */
    int code = cinfo->err->msg_code, eof = code == JWRN_JPEG_EOF, corrupt = corrupt_warning(code);
    if (!err->warned || (corrupt && !err->corrupt) || (eof && !err->truncated))
        (*cinfo->err->format_message)(cinfo, err->message);
    err->warned = 1;
    if (corrupt) err->corrupt = 1;
    if (eof) err->truncated = 1;
}

/* The error manager to put in a (de)compress struct's `err` before jpeg_create_*. */
static struct jpeg_error_mgr *init_errors(error_state *err) {
    jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_message;
    err->warned = 0;
    err->corrupt = 0;
    err->truncated = 0;
    err->message[0] = '\0';
    return &err->pub;
}

#endif
