/* An NVTX injection library that logs range pushes and pops to a file: reads back the NVTX
 * ranges a process pushes without Nsight Systems. Load it with
 * NVTX_INJECTION64_PATH=<this .so> and NVTX_LOG_FILE=<path>. One line per event:
 * "push <depth> <name>" or "pop <depth>" (depth per thread), "start <id> <name>" or "end <id>". */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef void (*NvtxFunctionPointer)(void);
typedef NvtxFunctionPointer **NvtxFunctionTable;
typedef struct {
    size_t struct_size;
    int (*GetModuleFunctionTable)(int module, NvtxFunctionTable *out_table, unsigned int *out_size);
} NvtxExportTableCallbacks;
typedef const void *(*NvtxGetExportTableFunc_t)(uint32_t export_table_id);

enum {
    ETID_CALLBACKS = 1,
    MODULE_CORE = 1,
    CBID_RANGE_START_A = 5,
    CBID_RANGE_END = 7,
    CBID_RANGE_PUSH_A = 9,
    CBID_RANGE_POP = 11
};

static FILE *out;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int depth;
static uint64_t next_id = 1;

static int push_a(const char *name) {
    pthread_mutex_lock(&lock);
    fprintf(out, "push %d %s\n", depth, name ? name : "");
    fflush(out);
    pthread_mutex_unlock(&lock);
    return depth++;
}

static int pop(void) {
    pthread_mutex_lock(&lock);
    fprintf(out, "pop %d\n", depth - 1);
    fflush(out);
    pthread_mutex_unlock(&lock);
    return --depth;
}

static uint64_t start_a(const char *name) {
    uint64_t id;
    pthread_mutex_lock(&lock);
    id = next_id++;
    fprintf(out, "start %llu %s\n", (unsigned long long)id, name ? name : "");
    fflush(out);
    pthread_mutex_unlock(&lock);
    return id;
}

static void end(uint64_t id) {
    pthread_mutex_lock(&lock);
    fprintf(out, "end %llu\n", (unsigned long long)id);
    fflush(out);
    pthread_mutex_unlock(&lock);
}

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
    const char *path = getenv("NVTX_LOG_FILE");
    const NvtxExportTableCallbacks *callbacks;
    NvtxFunctionTable table = NULL;
    unsigned int size = 0;
    out = fopen(path ? path : "nvtx_log.txt", "a");
    if (!out) return 0;
    callbacks = (const NvtxExportTableCallbacks *)get_export_table(ETID_CALLBACKS);
    if (!callbacks || !callbacks->GetModuleFunctionTable(MODULE_CORE, &table, &size) || size <= CBID_RANGE_POP)
        return 0;
    *table[CBID_RANGE_PUSH_A] = (NvtxFunctionPointer)push_a;
    *table[CBID_RANGE_POP] = (NvtxFunctionPointer)pop;
    *table[CBID_RANGE_START_A] = (NvtxFunctionPointer)start_a;
    *table[CBID_RANGE_END] = (NvtxFunctionPointer)end;
    fprintf(out, "init\n");
    fflush(out);
    return 1;
}
