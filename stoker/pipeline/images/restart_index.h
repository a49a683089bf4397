/* The restart-interval index that `stoker prepare imagenet` stores beside each transcoded JPEG.
 *
 * A transcoded file is a baseline, Huffman-coded, single-scan JPEG with a restart marker every
 * R MCUs, where R divides the MCUs of one row, so every MCU row is a whole number of intervals.
 * Each interval starts byte-aligned with its DC predictors reset, so any rectangle of intervals
 * is a valid scan by itself once its markers are renumbered: that is what the crop decoder
 * splices. The index is an array of little-endian uint32:
 *
 *   [0] RESTART_INDEX_VERSION
 *   [1] R, MCUs per interval
 *   [2] intervals per MCU row
 *   [3] n, the number of intervals
 *   [4 .. 4+n) where each interval's entropy-coded bytes start in the file (the first is the
 *              end of the SOS header, the others follow their RSTm marker)
 *   [4+n]      where the last interval's bytes end (the EOI marker)
 *
 * Interval i's bytes are [start_i, start_{i+1} - 2): the 2 bytes before the next start are its
 * RST marker.
 */
#ifndef STOKER_RESTART_INDEX_H
#define STOKER_RESTART_INDEX_H

#include <stdint.h>
#include <string.h>

#define RESTART_INDEX_VERSION 1
#define RESTART_INDEX_HEADER 4

static inline uint32_t restart_index_get(const unsigned char *index, size_t i) {
    const unsigned char *p = index + 4 * i;
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline void restart_index_put(unsigned char *index, size_t i, uint32_t value) {
    unsigned char *p = index + 4 * i;
    p[0] = (unsigned char)value;
    p[1] = (unsigned char)(value >> 8);
    p[2] = (unsigned char)(value >> 16);
    p[3] = (unsigned char)(value >> 24);
}

#endif
