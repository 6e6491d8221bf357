/* The checks every C example host counts and prints ("N checks passed"):
 * a failed one prints where and why, with kvgate_last_error(), and exits 1.
 * Include after <kvgate.h>, <stdio.h>, <stdlib.h> and <string.h>. */
#ifndef KVGATE_EXAMPLE_CHECK_H
#define KVGATE_EXAMPLE_CHECK_H

/* ------------------------------------------------------------------ */
/* Checks                                                             */
/* ------------------------------------------------------------------ */

static int checks_passed = 0;

#define CHECK(cond)                                                               \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n  last error: %s\n",        \
                    __FILE__, __LINE__, #cond, kvgate_last_error());              \
            exit(1);                                                              \
        }                                                                         \
        checks_passed++;                                                          \
    } while (0)

#define CHECK_STATUS(call, expected)                                              \
    do {                                                                          \
        kvgate_status got_ = (call);                                              \
        if (got_ != (expected)) {                                                 \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s\n  last error: %s\n", \
                    __FILE__, __LINE__, #call, kvgate_status_str(got_),           \
                    kvgate_status_str(expected), kvgate_last_error());            \
            exit(1);                                                              \
        }                                                                         \
        checks_passed++;                                                          \
    } while (0)

#define CHECK_LAST_ERROR(fragment)                                                \
    do {                                                                          \
        if (strstr(kvgate_last_error(), (fragment)) == NULL) {                    \
            fprintf(stderr, "%s:%d: last error \"%s\" lacks \"%s\"\n", __FILE__,  \
                    __LINE__, kvgate_last_error(), (fragment));                   \
            exit(1);                                                              \
        }                                                                         \
        checks_passed++;                                                          \
    } while (0)

#endif /* KVGATE_EXAMPLE_CHECK_H */
