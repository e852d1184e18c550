/*
 * The runtime of Bulkhead's C plugins, in place of a libc: an allocator
 * (also behind `cabi_realloc`, through which the gateway hands the plugin
 * its arguments), the memory and string functions the bindings and the
 * compiler need, and abort.
 *
 * Why no libc: wasi-libc would import WASI preview 1 and need an adapter
 * module, for nothing a plugin may use (no files, clocks or environment).
 * Without it a C plugin imports only `bulkhead:plugin` and stays a few KiB.
 *
 * The allocator is a bump allocator that starts over. A plugin instance
 * serves one request, and in every hook call the pattern is the same: the
 * gateway allocates the arguments, the hook returns them (or frees them),
 * and the bindings' post-return function frees what was returned. So once
 * every block handed out has been freed, the whole heap is free again:
 * memory stays bounded by the largest single call, not by the length of a
 * stream. A block kept across calls (state a plugin holds for a stream)
 * only delays the start-over until it is freed too. Freeing the newest
 * block also gives its space back at once, and realloc grows the newest
 * block in place.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define WASM_PAGE_BYTES 65536u

/* Every block is aligned to this: max_align_t on wasm32. */
#define BLOCK_ALIGN 16u

/* Each block is preceded by its size, in a header this long (keeping the
 * block itself aligned). */
#define HEADER_BYTES 16u

/* Set by wasm-ld: the first byte after the data and the stack. */
extern unsigned char __heap_base;

static uintptr_t heap_start; /* 0 until the first allocation */
static uintptr_t heap_top;   /* the next free byte */
static uint64_t memory_end;  /* bytes of linear memory (up to 4 GiB) */
static size_t live_blocks;   /* handed out and not yet freed */

static uint64_t align_up(uint64_t value, uint64_t align) {
    return (value + align - 1) & ~(align - 1);
}

static size_t *header_of(void *block) {
    return (size_t *)((uintptr_t)block - HEADER_BYTES);
}

/* Makes sure linear memory reaches `end`, growing it if needed. False when
 * the gateway's memory limit for the plugin refuses. */
static int reserve(uint64_t end) {
    if (end <= memory_end) {
        return 1;
    }
    size_t pages = (size_t)((end - memory_end + WASM_PAGE_BYTES - 1) / WASM_PAGE_BYTES);
    if (__builtin_wasm_memory_grow(0, pages) == (size_t)-1) {
        return 0;
    }
    memory_end += (uint64_t)pages * WASM_PAGE_BYTES;
    return 1;
}

void *malloc(size_t size) {
    if (heap_start == 0) {
        heap_start = heap_top = (uintptr_t)&__heap_base;
        memory_end = (uint64_t)__builtin_wasm_memory_size(0) * WASM_PAGE_BYTES;
    }
    /* 64-bit arithmetic: nothing wraps around near the 4 GiB end. */
    uint64_t start = align_up((uint64_t)heap_top + HEADER_BYTES, BLOCK_ALIGN);
    uint64_t end = start + size;
    if (end > UINTPTR_MAX || !reserve(end)) {
        return NULL;
    }
    void *block = (void *)(uintptr_t)start;
    *header_of(block) = size;
    heap_top = (uintptr_t)end;
    live_blocks++;
    return block;
}

void *calloc(size_t count, size_t size) {
    uint64_t bytes = (uint64_t)count * size;
    if (bytes > SIZE_MAX) {
        return NULL;
    }
    void *block = malloc((size_t)bytes);
    if (block != NULL) {
        memset(block, 0, (size_t)bytes);
    }
    return block;
}

/* Whether `ptr` is a block this allocator handed out and has not reclaimed
 * (the bindings never free the dangling pointers of empty strings and
 * lists, but this is cheap insurance). */
static int is_block(void *ptr) {
    uintptr_t at = (uintptr_t)ptr;
    return heap_start != 0 && at >= heap_start + HEADER_BYTES && at <= heap_top;
}

void free(void *ptr) {
    if (ptr == NULL || !is_block(ptr)) {
        return;
    }
    live_blocks--;
    if (live_blocks == 0) {
        heap_top = heap_start;
    } else if ((uintptr_t)ptr + *header_of(ptr) == heap_top) {
        heap_top = (uintptr_t)header_of(ptr);
    }
}

void *realloc(void *ptr, size_t size) {
    if (ptr == NULL || !is_block(ptr)) {
        return malloc(size);
    }
    size_t *header = header_of(ptr);
    if (size <= *header) {
        return ptr;
    }
    if ((uintptr_t)ptr + *header == heap_top) {
        /* The newest block: grow it where it is. */
        uint64_t end = (uint64_t)(uintptr_t)ptr + size;
        if (end > UINTPTR_MAX || !reserve(end)) {
            return NULL;
        }
        *header = size;
        heap_top = (uintptr_t)end;
        return ptr;
    }
    void *moved = malloc(size);
    if (moved != NULL) {
        memcpy(moved, ptr, *header);
        free(ptr);
    }
    return moved;
}

/*
 * The canonical ABI's allocator: the gateway calls it to place a hook's
 * arguments (and a host function's results) in the plugin's memory, and the
 * bindings call it for strings they copy. The bindings define a weak one on
 * top of realloc; this one also checks the alignment asked for (the ABI
 * asks for at most 8) and traps when memory runs out, which the gateway
 * reports as the plugin's memory limit.
 */
__attribute__((__export_name__("cabi_realloc")))
void *cabi_realloc(void *ptr, size_t old_size, size_t align, size_t new_size) {
    (void)old_size; /* every block knows its size */
    if (align > BLOCK_ALIGN) {
        abort();
    }
    if (new_size == 0) {
        /* A dangling, aligned pointer: empty strings and lists are never
         * read or freed. */
        return (void *)align;
    }
    void *block = realloc(ptr, new_size);
    if (block == NULL) {
        abort();
    }
    return block;
}

_Noreturn void abort(void) {
    __builtin_trap();
}

/* Plain byte loops. The runtime is built with -ffreestanding, which keeps
 * the compiler from turning these loops into calls to themselves. */

void *memcpy(void *dest, const void *src, size_t n) {
    unsigned char *d = dest;
    const unsigned char *s = src;
    while (n--) {
        *d++ = *s++;
    }
    return dest;
}

void *memmove(void *dest, const void *src, size_t n) {
    unsigned char *d = dest;
    const unsigned char *s = src;
    if (d < s) {
        while (n--) {
            *d++ = *s++;
        }
    } else {
        while (n--) {
            d[n] = s[n];
        }
    }
    return dest;
}

void *memset(void *dest, int byte, size_t n) {
    unsigned char *d = dest;
    while (n--) {
        *d++ = (unsigned char)byte;
    }
    return dest;
}

int memcmp(const void *a, const void *b, size_t n) {
    const unsigned char *x = a;
    const unsigned char *y = b;
    for (size_t i = 0; i < n; i++) {
        if (x[i] != y[i]) {
            return x[i] < y[i] ? -1 : 1;
        }
    }
    return 0;
}

size_t strlen(const char *s) {
    size_t n = 0;
    while (s[n] != '\0') {
        n++;
    }
    return n;
}
