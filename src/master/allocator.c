/* Two-level segregated fit allocator over a range of offsets. See allocator_int.h. */
#include "allocator_int.h"

#include <string.h>

#define SL_LOG   4u
#define SL_COUNT (1u << SL_LOG)
#define FL_COUNT 64u
#define NBINS    (FL_COUNT * SL_COUNT)
/* How many blocks of the request's own bin the fallback scan looks at. */
#define FALLBACK_SCAN_LIMIT 256u

enum { NODE_SPARE = 0, NODE_USED = 1, NODE_FREE = 2 };

typedef struct {
    uint64_t off;  /* in units */
    uint64_t size; /* in units */
    uint32_t prev_phys, next_phys;
    uint32_t prev_free, next_free;
    uint32_t bin;
    uint32_t state;
} node_t;

struct kvs__seg_alloc {
    uint64_t capacity_units;
    uint64_t used_units;
    node_t *nodes;
    uint32_t nnodes, cap_nodes;
    uint32_t *spare; /* stack of NODE_SPARE indices */
    uint32_t nspare;
    uint64_t fl_bitmap;
    uint16_t sl_bitmap[FL_COUNT];
    uint32_t heads[NBINS];
    uint32_t at_hint; /* the free block after the last claim (kvs__seg_alloc_claim), or NIL */
};

static unsigned floor_log2(uint64_t v)
{
    return 63u - (unsigned)__builtin_clzll(v);
}

/* Bin whose range contains `units` (the bin a free block of that size lives in). */
static uint32_t bin_of(uint64_t units)
{
    if (units < SL_COUNT)
        return (uint32_t)units;
    unsigned f = floor_log2(units);
    unsigned sl = (unsigned)(units >> (f - SL_LOG)) ^ SL_COUNT;
    unsigned fl = f - SL_LOG + 1;
    return fl * SL_COUNT + sl;
}

/* First bin all of whose blocks are at least `units` long. */
static uint32_t bin_search_start(uint64_t units)
{
    if (units >= SL_COUNT) {
        unsigned f = floor_log2(units);
        uint64_t round = (1ull << (f - SL_LOG)) - 1;
        if (units > UINT64_MAX - round)
            return NBINS;
        units += round;
    }
    return bin_of(units);
}

static void free_list_insert(kvs__seg_alloc_t *a, uint32_t i)
{
    node_t *n = &a->nodes[i];
    uint32_t b = bin_of(n->size);
    n->bin = b;
    n->state = NODE_FREE;
    n->prev_free = KVS_SEG_ALLOC_NIL;
    n->next_free = a->heads[b];
    if (a->heads[b] != KVS_SEG_ALLOC_NIL)
        a->nodes[a->heads[b]].prev_free = i;
    a->heads[b] = i;
    a->fl_bitmap |= 1ull << (b / SL_COUNT);
    a->sl_bitmap[b / SL_COUNT] |= (uint16_t)(1u << (b % SL_COUNT));
}

static void free_list_remove(kvs__seg_alloc_t *a, uint32_t i)
{
    node_t *n = &a->nodes[i];
    uint32_t b = n->bin;
    if (n->prev_free != KVS_SEG_ALLOC_NIL)
        a->nodes[n->prev_free].next_free = n->next_free;
    else
        a->heads[b] = n->next_free;
    if (n->next_free != KVS_SEG_ALLOC_NIL)
        a->nodes[n->next_free].prev_free = n->prev_free;
    if (a->heads[b] == KVS_SEG_ALLOC_NIL) {
        a->sl_bitmap[b / SL_COUNT] &= (uint16_t) ~(1u << (b % SL_COUNT));
        if (a->sl_bitmap[b / SL_COUNT] == 0)
            a->fl_bitmap &= ~(1ull << (b / SL_COUNT));
    }
    n->state = NODE_USED;
}

/* Makes sure one spare node exists, so a split can never fail half way. */
static int reserve_node(kvs__seg_alloc_t *a)
{
    if (a->nspare > 0 || a->nnodes < a->cap_nodes)
        return KVS_OK;
    uint32_t cap = a->cap_nodes ? a->cap_nodes * 2 : 64;
    if (cap < a->cap_nodes)
        return KVS_NO_MEMORY;
    node_t *nodes = kvs__realloc(a->nodes, (size_t)cap * sizeof(*nodes));
    if (nodes == NULL)
        return KVS_NO_MEMORY;
    a->nodes = nodes;
    uint32_t *spare = kvs__realloc(a->spare, (size_t)cap * sizeof(*spare));
    if (spare == NULL)
        return KVS_NO_MEMORY; /* nodes grew; harmless, cap_nodes stays until both succeed */
    a->spare = spare;
    a->cap_nodes = cap;
    return KVS_OK;
}

static uint32_t take_node(kvs__seg_alloc_t *a)
{
    uint32_t i = a->nspare > 0 ? a->spare[--a->nspare] : a->nnodes++;
    memset(&a->nodes[i], 0, sizeof(node_t));
    return i;
}

static void release_node(kvs__seg_alloc_t *a, uint32_t i)
{
    a->nodes[i].state = NODE_SPARE;
    a->spare[a->nspare++] = i;
}

int kvs__seg_alloc_create(uint64_t capacity, kvs__seg_alloc_t **alloc_p)
{
    if (alloc_p == NULL || capacity < KVS_SEG_ALLOC_ALIGN)
        return KVS_INVALID_PARAMS;
    kvs__seg_alloc_t *a = kvs__calloc(1, sizeof(*a));
    if (a == NULL)
        return KVS_NO_MEMORY;
    for (uint32_t b = 0; b < NBINS; b++)
        a->heads[b] = KVS_SEG_ALLOC_NIL;
    a->capacity_units = capacity / KVS_SEG_ALLOC_ALIGN;
    a->at_hint = KVS_SEG_ALLOC_NIL;
    if (reserve_node(a) != KVS_OK) {
        kvs__seg_alloc_destroy(a);
        return KVS_NO_MEMORY;
    }
    uint32_t i = take_node(a);
    a->nodes[i].off = 0;
    a->nodes[i].size = a->capacity_units;
    a->nodes[i].prev_phys = a->nodes[i].next_phys = KVS_SEG_ALLOC_NIL;
    free_list_insert(a, i);
    *alloc_p = a;
    return KVS_OK;
}

void kvs__seg_alloc_destroy(kvs__seg_alloc_t *a)
{
    if (a == NULL)
        return;
    kvs__free(a->nodes);
    kvs__free(a->spare);
    kvs__free(a);
}

/* Finds a free block of at least `units`: first by bitmap from the rounded-up bin, then by a
 * bounded scan of the request's own bin. */
static uint32_t find_block(const kvs__seg_alloc_t *a, uint64_t units)
{
    uint32_t b = bin_search_start(units);
    if (b < NBINS) {
        uint32_t fl = b / SL_COUNT, sl = b % SL_COUNT;
        uint32_t sl_map = (uint32_t)a->sl_bitmap[fl] & (~0u << sl);
        if (sl_map == 0) {
            uint64_t fl_map = fl + 1 < FL_COUNT ? a->fl_bitmap & (~0ull << (fl + 1)) : 0;
            if (fl_map != 0) {
                fl = (uint32_t)__builtin_ctzll(fl_map);
                sl_map = a->sl_bitmap[fl];
            }
        }
        if (sl_map != 0)
            return a->heads[fl * SL_COUNT + (uint32_t)__builtin_ctz(sl_map)];
    }
    uint32_t own = bin_of(units), best = KVS_SEG_ALLOC_NIL;
    unsigned seen = 0;
    for (uint32_t i = a->heads[own]; i != KVS_SEG_ALLOC_NIL && seen < FALLBACK_SCAN_LIMIT;
         i = a->nodes[i].next_free, seen++) {
        if (a->nodes[i].size >= units &&
            (best == KVS_SEG_ALLOC_NIL || a->nodes[i].size < a->nodes[best].size))
            best = i;
    }
    return best;
}

/* Splits the first `units` off free-list-removed block i; the rest (if any) goes back free and
 * is returned (NIL when none). A spare node must be reserved. */
static uint32_t split_front(kvs__seg_alloc_t *a, uint32_t i, uint64_t units)
{
    node_t *n = &a->nodes[i];
    if (n->size == units)
        return KVS_SEG_ALLOC_NIL;
    uint32_t r = take_node(a);
    n = &a->nodes[i];
    node_t *rest = &a->nodes[r];
    rest->off = n->off + units;
    rest->size = n->size - units;
    rest->prev_phys = i;
    rest->next_phys = n->next_phys;
    if (n->next_phys != KVS_SEG_ALLOC_NIL)
        a->nodes[n->next_phys].prev_phys = r;
    n->next_phys = r;
    n->size = units;
    free_list_insert(a, r);
    return r;
}

int kvs__seg_alloc_alloc(kvs__seg_alloc_t *a, uint64_t size, uint64_t *offset_p, uint32_t *handle_p)
{
    if (a == NULL || size == 0 || offset_p == NULL || handle_p == NULL)
        return KVS_INVALID_PARAMS;
    if (size > a->capacity_units * KVS_SEG_ALLOC_ALIGN)
        return KVS_NO_AVAILABLE_HANDLE;
    uint64_t units = (size + KVS_SEG_ALLOC_ALIGN - 1) / KVS_SEG_ALLOC_ALIGN;
    if (reserve_node(a) != KVS_OK)
        return KVS_NO_MEMORY;
    uint32_t i = find_block(a, units);
    if (i == KVS_SEG_ALLOC_NIL)
        return KVS_NO_AVAILABLE_HANDLE;
    free_list_remove(a, i);
    split_front(a, i, units);
    a->used_units += units;
    *offset_p = a->nodes[i].off * KVS_SEG_ALLOC_ALIGN;
    *handle_p = i;
    return KVS_OK;
}

int kvs__seg_alloc_claim(kvs__seg_alloc_t *a, uint64_t offset, uint64_t size, uint32_t *handle_p)
{
    if (a == NULL || size == 0 || handle_p == NULL || offset % KVS_SEG_ALLOC_ALIGN != 0)
        return KVS_INVALID_PARAMS;
    uint64_t off = offset / KVS_SEG_ALLOC_ALIGN;
    uint64_t units = size / KVS_SEG_ALLOC_ALIGN + (size % KVS_SEG_ALLOC_ALIGN != 0);
    if (off >= a->capacity_units || units > a->capacity_units - off)
        return KVS_INVALID_PARAMS;
    /* Two spare nodes: a claim may split a block in three. */
    if (reserve_node(a) != KVS_OK)
        return KVS_NO_MEMORY;
    uint32_t t = take_node(a);
    int rrc = reserve_node(a);
    release_node(a, t);
    if (rrc != KVS_OK)
        return KVS_NO_MEMORY;
    uint32_t i = a->at_hint;
    if (i == KVS_SEG_ALLOC_NIL || i >= a->nnodes || a->nodes[i].state != NODE_FREE ||
        a->nodes[i].off > off || a->nodes[i].off + a->nodes[i].size <= off) {
        /* Claims in ascending order find their block at the hint; others walk the blocks. */
        i = KVS_SEG_ALLOC_NIL;
        for (uint32_t j = 0; j < a->nnodes && i == KVS_SEG_ALLOC_NIL; j++) {
            const node_t *n = &a->nodes[j];
            if (n->state != NODE_SPARE && n->off <= off && off < n->off + n->size)
                i = j;
        }
    }
    if (i == KVS_SEG_ALLOC_NIL || a->nodes[i].state != NODE_FREE ||
        a->nodes[i].off + a->nodes[i].size < off + units)
        return KVS_INVALID_PARAMS; /* some of it is taken */
    free_list_remove(a, i);
    if (a->nodes[i].off < off) {
        /* The part before stays free; the claim starts a block of its own. */
        uint64_t before = off - a->nodes[i].off;
        uint32_t r = split_front(a, i, before);
        a->nodes[i].state = NODE_FREE;
        free_list_insert(a, i);
        free_list_remove(a, r);
        i = r;
    }
    a->at_hint = split_front(a, i, units);
    a->used_units += units;
    *handle_p = i;
    return KVS_OK;
}

/* Folds the physical neighbour `j` (which follows `i`) into `i`. */
static void merge_next(kvs__seg_alloc_t *a, uint32_t i, uint32_t j)
{
    node_t *n = &a->nodes[i], *m = &a->nodes[j];
    n->size += m->size;
    n->next_phys = m->next_phys;
    if (m->next_phys != KVS_SEG_ALLOC_NIL)
        a->nodes[m->next_phys].prev_phys = i;
    release_node(a, j);
}

int kvs__seg_alloc_free(kvs__seg_alloc_t *a, uint32_t handle)
{
    if (a == NULL || handle >= a->nnodes || a->nodes[handle].state != NODE_USED)
        return KVS_INVALID_PARAMS;
    uint32_t i = handle;
    a->used_units -= a->nodes[i].size;
    uint32_t next = a->nodes[i].next_phys;
    if (next != KVS_SEG_ALLOC_NIL && a->nodes[next].state == NODE_FREE) {
        free_list_remove(a, next);
        merge_next(a, i, next);
    }
    uint32_t prev = a->nodes[i].prev_phys;
    if (prev != KVS_SEG_ALLOC_NIL && a->nodes[prev].state == NODE_FREE) {
        free_list_remove(a, prev);
        merge_next(a, prev, i);
        i = prev;
    }
    free_list_insert(a, i);
    return KVS_OK;
}

uint64_t kvs__seg_alloc_capacity(const kvs__seg_alloc_t *a)
{
    return a->capacity_units * KVS_SEG_ALLOC_ALIGN;
}

uint64_t kvs__seg_alloc_used(const kvs__seg_alloc_t *a)
{
    return a->used_units * KVS_SEG_ALLOC_ALIGN;
}

uint64_t kvs__seg_alloc_largest_free(const kvs__seg_alloc_t *a)
{
    if (a->fl_bitmap == 0)
        return 0;
    uint32_t fl = floor_log2(a->fl_bitmap);
    uint32_t sl = floor_log2(a->sl_bitmap[fl]);
    uint64_t best = 0;
    for (uint32_t i = a->heads[fl * SL_COUNT + sl]; i != KVS_SEG_ALLOC_NIL;
         i = a->nodes[i].next_free)
        best = KVS_MAX(best, a->nodes[i].size);
    return best * KVS_SEG_ALLOC_ALIGN;
}

int kvs__seg_alloc_check(const kvs__seg_alloc_t *a)
{
    /* Find the first block: the one without a physical predecessor. */
    uint32_t first = KVS_SEG_ALLOC_NIL, blocks = 0, nfree = 0;
    for (uint32_t i = 0; i < a->nnodes; i++) {
        if (a->nodes[i].state == NODE_SPARE)
            continue;
        blocks++;
        if (a->nodes[i].prev_phys == KVS_SEG_ALLOC_NIL) {
            if (first != KVS_SEG_ALLOC_NIL)
                return KVS_INTERNAL_ERROR;
            first = i;
        }
    }
    uint64_t off = 0, used = 0;
    uint32_t walked = 0, prev = KVS_SEG_ALLOC_NIL;
    for (uint32_t i = first; i != KVS_SEG_ALLOC_NIL; prev = i, i = a->nodes[i].next_phys) {
        const node_t *n = &a->nodes[i];
        if (n->off != off || n->size == 0 || n->prev_phys != prev || ++walked > blocks)
            return KVS_INTERNAL_ERROR;
        if (n->state == NODE_FREE) {
            nfree++;
            if (prev != KVS_SEG_ALLOC_NIL && a->nodes[prev].state == NODE_FREE)
                return KVS_INTERNAL_ERROR;
            if (n->bin != bin_of(n->size))
                return KVS_INTERNAL_ERROR;
        } else {
            used += n->size;
        }
        off += n->size;
    }
    if (off != a->capacity_units || walked != blocks || used != a->used_units)
        return KVS_INTERNAL_ERROR;
    uint32_t listed = 0;
    for (uint32_t b = 0; b < NBINS; b++) {
        bool bit = (a->sl_bitmap[b / SL_COUNT] >> (b % SL_COUNT)) & 1u;
        if (bit != (a->heads[b] != KVS_SEG_ALLOC_NIL))
            return KVS_INTERNAL_ERROR;
        for (uint32_t i = a->heads[b]; i != KVS_SEG_ALLOC_NIL; i = a->nodes[i].next_free) {
            if (a->nodes[i].state != NODE_FREE || a->nodes[i].bin != b || ++listed > nfree)
                return KVS_INTERNAL_ERROR;
        }
    }
    return listed == nfree ? KVS_OK : KVS_INTERNAL_ERROR;
}
