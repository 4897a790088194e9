/* Naming the machine a result came from (JSON "device", table header). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "run.h"
#include "spattn.h"

static void cpu_model(char *buf, size_t n) {
    snprintf(buf, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        char *colon = strchr(line, ':');
        if (!colon) continue;
        colon++;
        while (*colon == ' ' || *colon == '\t') colon++;
        colon[strcspn(colon, "\n")] = '\0';
        snprintf(buf, n, "%s", colon);
        break;
    }
    fclose(f);
}

void sp_device_name(const sp_opts *o, char *buf, size_t n) {
    if (o->backend == SPATTN_BACKEND_CUDA && sp_cuda_device_name(buf, n) == 0) return;
    char model[256];
    cpu_model(model, sizeof model);
    snprintf(buf, n, "%s (%s)", model, spattn_cpu_isa());
}
