/* A CUDA injection library (CUDA_INJECTION64_PATH) that records every kernel, memcpy and
 * memset a process runs on the GPU, kernels inside CUDA graphs included, through CUPTI's
 * activity API, and writes them at exit as tab-separated lines to $TIMELINE_OUT.<pid>:
 *     start_ns  end_ns  stream  name
 * For timeline.py, where the device machine has no full Nsight Systems. Built on that machine
 * by timeline.sh against its own CUPTI:
 *     gcc -shared -fPIC -I$CUDA/include -I$CUDA/extras/CUPTI/include timeline_inject.c \
 *         -L$CUDA/extras/CUPTI/lib64 -lcupti -o libtimeline.so
 * Records are read through the oldest record layouts whose leading fields (start, end,
 * stream, name) every later version keeps. */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BUFFER_BYTES (8u << 20)

static FILE *out;

static void CUPTIAPI requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = (uint8_t *)aligned_alloc(8, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *record = NULL;
    while (out && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
            CUpti_ActivityKernel4 *k = (CUpti_ActivityKernel4 *)record;
            fprintf(out, "%llu\t%llu\t%u\t%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                    k->streamId, k->name ? k->name : "?");
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            CUpti_ActivityMemcpy *m = (CUpti_ActivityMemcpy *)record;
            fprintf(out, "%llu\t%llu\t%u\tmemcpy\n", (unsigned long long)m->start, (unsigned long long)m->end,
                    m->streamId);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            CUpti_ActivityMemset *m = (CUpti_ActivityMemset *)record;
            fprintf(out, "%llu\t%llu\t%u\tmemset\n", (unsigned long long)m->start, (unsigned long long)m->end,
                    m->streamId);
            break;
        }
        default:
            break;
        }
    }
    free(buffer);
}

static void flush_at_exit(void) {
    cuptiActivityFlushAll(1);
    if (out) {
        fclose(out);
        out = NULL;
    }
}

/* Called by the CUDA driver when it loads this library (CUDA_INJECTION64_PATH). */
int InitializeInjection(void) {
    const char *base = getenv("TIMELINE_OUT");
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", base ? base : "/tmp/timeline", (int)getpid());
    out = fopen(path, "w");
    if (!out) {
        fprintf(stderr, "timeline_inject: cannot write %s\n", path);
        return 0;
    }
    if (cuptiActivityRegisterCallbacks(requested, completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS) {
        fprintf(stderr, "timeline_inject: CUPTI refused the activity records\n");
        return 0;
    }
    atexit(flush_at_exit);
    return 1;
}
