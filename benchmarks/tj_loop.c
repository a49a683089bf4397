/* The physical limit: libjpeg-turbo decoding the benchmark's files in C, nothing else.
 *
 *   tj_loop full FILE_LIST [IMAGES]   every pixel of every file, RGB
 *   tj_loop crop WINDOW_LIST [IMAGES] only each file's crop window: lines "path denom left top right bottom",
 *                                     scaled coordinates, as Stoker's crop decoder would ask
 * Files are read into memory first; 64 decodes are warm-up, then IMAGES are timed (default: the rest of
 * the list once), going round the list as often as that takes. Timed in CPU time of this process, as
 * Stoker's own costs are. Prints one JSON line.
 * Built at benchmark time against Debian's libjpeg62-turbo-dev.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jpeglib.h>

typedef struct {
    unsigned char *data;
    unsigned long size;
    unsigned int denom, left, top, right, bottom;
} item;

static unsigned char *read_file(const char *path, unsigned long *size) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    *size = (unsigned long)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(*size);
    if (fread(buf, 1, *size, f) != *size) { perror(path); exit(1); }
    fclose(f);
    return buf;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void decode(const item *it, int crop, unsigned char *out) {
    struct jpeg_decompress_struct cinfo;
    struct jpeg_error_mgr jerr;
    cinfo.err = jpeg_std_error(&jerr);
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, it->data, it->size);
    jpeg_read_header(&cinfo, TRUE);
    cinfo.out_color_space = JCS_RGB;  /* CMYK files: libjpeg cannot convert; decode them as they are */
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) cinfo.out_color_space = JCS_CMYK;
    JDIMENSION bottom = 0;
    if (crop) {
        cinfo.scale_num = 1;
        cinfo.scale_denom = it->denom;
    }
    jpeg_start_decompress(&cinfo);
    bottom = cinfo.output_height;
    if (crop) {
        JDIMENSION x = it->left, w = it->right - it->left;
        if (x > 0 || w < cinfo.output_width) jpeg_crop_scanline(&cinfo, &x, &w);
        if (it->top > 0) jpeg_skip_scanlines(&cinfo, it->top);
        bottom = it->bottom;
    }
    JSAMPROW row = out;
    while (cinfo.output_scanline < bottom) jpeg_read_scanlines(&cinfo, &row, 1);
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
}

int main(int argc, char **argv) {
    if ((argc != 3 && argc != 4) || (strcmp(argv[1], "full") && strcmp(argv[1], "crop"))) {
        fprintf(stderr, "usage: tj_loop full|crop LIST [IMAGES]\n");
        return 2;
    }
    int crop = strcmp(argv[1], "crop") == 0;
    FILE *list = fopen(argv[2], "r");
    if (!list) { perror(argv[2]); return 1; }
    item *items = NULL;
    size_t n = 0, cap = 0;
    char path[4096];
    item it;
    while (crop ? fscanf(list, "%4095s %u %u %u %u %u", path, &it.denom, &it.left, &it.top, &it.right, &it.bottom) == 6
                : fscanf(list, "%4095s", path) == 1) {
        if (n == cap) { cap = cap ? cap * 2 : 1024; items = realloc(items, cap * sizeof(item)); }
        it.data = read_file(path, &it.size);
        items[n++] = it;
    }
    fclose(list);
    if (n == 0) { fprintf(stderr, "%s lists no file\n", argv[2]); return 1; }
    size_t timed = argc == 4 ? strtoul(argv[3], NULL, 10) : (n > 64 ? n - 64 : n);
    unsigned char *out = malloc(64 * 1024 * 4);
    for (size_t i = 0; i < 64; i++) decode(&items[i % n], crop, out);
    double started = now();
    for (size_t i = 0; i < timed; i++) decode(&items[(64 + i) % n], crop, out);
    double seconds = now() - started;
    printf("{\"images\": %zu, \"seconds\": %.6f, \"images_per_s\": %.3f}\n", timed, seconds, timed / seconds);
    return 0;
}
