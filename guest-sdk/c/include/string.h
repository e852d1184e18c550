/*
 * The part of <string.h> that Bulkhead C plugins get, implemented in
 * ../runtime.c. The compiler also emits calls to memcpy and memset itself
 * (struct copies, zeroing), so these must exist even when no source names
 * them.
 */
#ifndef BULKHEAD_STRING_H
#define BULKHEAD_STRING_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void *memcpy(void *dest, const void *src, size_t n);
void *memmove(void *dest, const void *src, size_t n);
void *memset(void *dest, int byte, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t strlen(const char *s);

#ifdef __cplusplus
}
#endif

#endif
