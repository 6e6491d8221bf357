// The checks the C++ example hosts count and print ("N checks passed"): a
// failed one prints where and why, with kvgate_last_error(), and exits 1.
// The counter is per translation unit: include it in a host's main file.
#ifndef KVGATE_EXAMPLE_CHECK_HPP
#define KVGATE_EXAMPLE_CHECK_HPP

#include <kvgate.h>

#include <cstdio>
#include <cstdlib>

namespace {

int checks_passed = 0;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n  last error: %s\n",      \
                         __FILE__, __LINE__, #cond, kvgate_last_error());            \
            std::exit(1);                                                            \
        }                                                                            \
        checks_passed++;                                                             \
    } while (0)

}  // namespace

#endif  // KVGATE_EXAMPLE_CHECK_HPP
