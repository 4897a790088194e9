/* A grouped bar chart as a standalone SVG file (no plotting dependency). */
#ifndef SPATTN_CLI_SVG_H
#define SPATTN_CLI_SVG_H

/* values[s * ngroups + g]: series s in group g; NaN = missing (no bar).  Returns 0 or -1. */
int sp_svg_bars(const char *path, const char *title, const char *ylabel,
                const char *const *groups, int ngroups, const char *const *series, int nseries,
                const double *values);

#endif
