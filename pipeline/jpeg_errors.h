/* libjpeg error handling shared by Stoker's two C extensions: an error longjmps back to the
 * caller with libjpeg's message instead of exiting the process, and warnings are recorded
 * rather than printed, so the caller decides what a warning means (the crop decoder fails only
 * on a premature end inside the rows it returns; the transcoder keeps any file libjpeg warns
 * about as it was). */
#ifndef STOKER_JPEG_ERRORS_H
#define STOKER_JPEG_ERRORS_H

#include <setjmp.h>
#include <stdio.h>
#include <jpeglib.h>
#include <jerror.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf escape;
    int warned;    /* libjpeg warned: corrupt data, premature end, ... */
    int truncated; /* one of the warnings was a premature end of data */
    char message[JMSG_LENGTH_MAX]; /* the error; else the premature end; else the first warning */
} error_state;

static void on_error(j_common_ptr cinfo) {
    error_state *err = (error_state *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->escape, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    error_state *err = (error_state *)cinfo->err;
    if (level >= 0) return; /* trace messages */
    int eof = cinfo->err->msg_code == JWRN_JPEG_EOF;
    if (!err->warned || (eof && !err->truncated)) (*cinfo->err->format_message)(cinfo, err->message);
    err->warned = 1;
    if (eof) err->truncated = 1;
}

/* The error manager to put in a (de)compress struct's `err` before jpeg_create_*. */
static struct jpeg_error_mgr *init_errors(error_state *err) {
    jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_message;
    err->warned = 0;
    err->truncated = 0;
    err->message[0] = '\0';
    return &err->pub;
}

#endif
