/*
 * The part of <stdlib.h> that Bulkhead C plugins get: memory allocation and
 * abort, implemented in ../runtime.c. There is no libc behind it: no stdio,
 * no files, no environment (the gateway offers none of those anyway).
 */
#ifndef BULKHEAD_STDLIB_H
#define BULKHEAD_STDLIB_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Blocks are 16-byte aligned. NULL when the plugin's memory limit is
 * reached. */
void *malloc(size_t size);
void *calloc(size_t count, size_t size);
void *realloc(void *ptr, size_t size);
void free(void *ptr);

/* Traps: the gateway fails the current request with `plugin_trap`. */
_Noreturn void abort(void);

#ifdef __cplusplus
}
#endif

#endif
