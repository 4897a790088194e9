#include "svg.h"

#include <math.h>
#include <stdio.h>

static void esc(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* A "nice" tick step (1, 2 or 5 times a power of ten) giving about 5 ticks up to vmax. */
static double tick_step(double vmax) {
    double raw = vmax / 5.0, p = pow(10.0, floor(log10(raw))), m = raw / p;
    return (m <= 1.0 ? 1.0 : m <= 2.0 ? 2.0 : m <= 5.0 ? 5.0 : 10.0) * p;
}

int sp_svg_bars(const char *path, const char *title, const char *ylabel,
                const char *const *groups, int ngroups, const char *const *series, int nseries,
                const double *values) {
    static const char *const colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                         "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    const double bar = 14.0, gap = 16.0, left = 70.0, top = 60.0, plot_h = 320.0, bottom = 170.0;
    const double group_w = bar * nseries + gap;
    double plot_w = group_w * (ngroups > 0 ? ngroups : 1);
    if (plot_w < 300.0) plot_w = 300.0;
    if (plot_w < 150.0 * nseries) plot_w = 150.0 * nseries; /* room for the legend */
    const double width = left + plot_w + 30.0, height = top + plot_h + bottom;
    double vmax = 0.0;
    for (int i = 0; i < ngroups * nseries; i++)
        if (isfinite(values[i]) && values[i] > vmax) vmax = values[i];
    if (vmax <= 0.0) vmax = 1.0;
    const double step = tick_step(vmax);
    const double ymax = ceil(vmax / step) * step;

    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"11\">\n",
            width, height, width, height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%.1f\" y=\"22\" font-size=\"15\" text-anchor=\"middle\">", width / 2);
    esc(f, title);
    fprintf(f, "</text>\n");
    /* Axis, grid and tick labels. */
    for (double y = 0.0; y <= ymax + step * 1e-9; y += step) {
        double py = top + plot_h - y / ymax * plot_h;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                left, py, left + plot_w, py);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", left - 6, py + 4, y);
    }
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", left,
            top, left, top + plot_h);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", left,
            top + plot_h, left + plot_w, top + plot_h);
    fprintf(f, "<text transform=\"translate(18,%.1f) rotate(-90)\" text-anchor=\"middle\">",
            top + plot_h / 2);
    esc(f, ylabel);
    fprintf(f, "</text>\n");
    /* Bars, with the value in a tooltip. */
    for (int g = 0; g < ngroups; g++) {
        double gx = left + gap / 2 + g * group_w;
        for (int s = 0; s < nseries; s++) {
            double v = values[s * ngroups + g];
            if (!isfinite(v) || v < 0.0) continue;
            double h = v / ymax * plot_h;
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\">"
                    "<title>", gx + s * bar, top + plot_h - h, bar - 1, h, colors[s % 8]);
            esc(f, series[s]);
            fprintf(f, " ");
            esc(f, groups[g]);
            fprintf(f, ": %.4g</title></rect>\n", v);
        }
        fprintf(f, "<text transform=\"translate(%.1f,%.1f) rotate(-50)\" text-anchor=\"end\">",
                gx + bar * nseries / 2, top + plot_h + 12);
        esc(f, groups[g]);
        fprintf(f, "</text>\n");
    }
    /* Legend. */
    for (int s = 0; s < nseries; s++) {
        double lx = left + 10 + s * 150.0;
        fprintf(f, "<rect x=\"%.1f\" y=\"34\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", lx,
                colors[s % 8]);
        fprintf(f, "<text x=\"%.1f\" y=\"44\">", lx + 16);
        esc(f, series[s]);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</svg>\n");
    return fclose(f) ? -1 : 0;
}
