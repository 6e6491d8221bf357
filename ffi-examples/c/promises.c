/*
 * The header's promises, each tested through the C ABI as a demanding host
 * would: every "never", "always", "afterwards", "at most" and
 * "exactly" of include/kvgate.h that the library keeps (rather than one the
 * host must keep) has a check here or a named test elsewhere; the list is
 * docs/decisions/header-promises.md.
 *
 * Each case runs in both admission modes unless it is about one mode. The
 * probes count what they are asked; after a probe has freed the gate they
 * count any further call in a global (never touching the freed user_data)
 * and the case checks that count is 0.
 *
 * Every check exits non-zero with a message on failure; the last line is
 * "c promises: N checks passed". Run by scripts/ffi-examples.sh, also under
 * valgrind and with -fsanitize=address,undefined.
 */
#define _POSIX_C_SOURCE 200809L

#include <kvgate.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static const char *mode_name(uint32_t mode) {
    return mode == KVGATE_ADMISSION_MODE_REFERENCE ? "reference" : "working_set";
}

/* ------------------------------------------------------------------ */
/* Probes that count                                                  */
/* ------------------------------------------------------------------ */

typedef struct {
    kvgate_gate *gate;     /* freed from inside the usage probe if free_in_usage */
    int free_in_usage;
    double usage;          /* answered by the usage probe */
    double hit;            /* answered by the prefix probe */
    unsigned long usage_calls;
    unsigned long prefix_calls;
    unsigned long capacity_calls;
} probe_host;

/* Set once a probe has freed the gate and its user_data; any probe call
 * after that is counted here without touching user_data. */
static int gate_freed = 0;
static unsigned long calls_after_free = 0;

static bool usage_probe(void *user_data, const uint8_t *session_id, size_t session_id_len,
                        double *out_usage) {
    probe_host *h = user_data;
    (void)session_id;
    (void)session_id_len;
    if (gate_freed) {
        calls_after_free++;
        return false;
    }
    h->usage_calls++;
    *out_usage = h->usage;
    if (h->free_in_usage) {
        /* The header: kvgate_free may be called from inside a probe, and once
         * it has returned no probe is called again, so user_data may go. */
        kvgate_free(h->gate);
        gate_freed = 1;
        free(h);
    }
    return true;
}

static bool prefix_probe(void *user_data, const uint8_t *session_id, size_t session_id_len,
                         const uint32_t *prompt_ids, size_t prompt_len, double *out_hit_ratio) {
    probe_host *h = user_data;
    (void)session_id;
    (void)session_id_len;
    (void)prompt_ids;
    (void)prompt_len;
    if (gate_freed) {
        calls_after_free++;
        return false;
    }
    h->prefix_calls++;
    *out_hit_ratio = h->hit;
    return true;
}

static bool capacity_probe(void *user_data, const uint8_t *session_id, size_t session_id_len,
                           uint64_t *out_tokens, uint32_t *out_block_tokens,
                           double *out_prefill_tokens_per_sec) {
    probe_host *h = user_data;
    (void)session_id;
    (void)session_id_len;
    if (gate_freed) {
        calls_after_free++;
        return false;
    }
    h->capacity_calls++;
    *out_tokens = 1u << 20;
    *out_block_tokens = 16;
    *out_prefill_tokens_per_sec = 10000.0;
    return true;
}

/* A gate in `mode` with the three probes on `h` (or none if h is NULL). */
static kvgate_gate *new_gate(uint32_t mode, probe_host *h) {
    kvgate_config *config = kvgate_config_new();
    kvgate_gate *gate = NULL;
    CHECK(config != NULL);
    CHECK_STATUS(kvgate_config_set_admission_mode(config, mode), KVGATE_OK);
    if (h != NULL) {
        CHECK_STATUS(kvgate_config_set_probes(config, usage_probe, prefix_probe, h), KVGATE_OK);
        CHECK_STATUS(kvgate_config_set_capacity_probe(config, capacity_probe), KVGATE_OK);
    }
    CHECK_STATUS(kvgate_new(config, &gate), KVGATE_OK);
    kvgate_config_free(config);
    return gate;
}

static const uint32_t prompt[] = {1, 2, 3, 4, 5, 6, 7, 8};
#define PROMPT_LEN (sizeof prompt / sizeof prompt[0])

static kvgate_status acquire(kvgate_gate *gate, const char *session, int64_t timeout_ms,
                             kvgate_admission *out) {
    return kvgate_acquire(gate, (const uint8_t *)session, strlen(session), prompt, PROMPT_LEN,
                          timeout_ms, out);
}

static kvgate_session_stats session_stats(kvgate_gate *gate, const char *session) {
    kvgate_session_stats s;
    memset(&s, 0, sizeof s);
    CHECK_STATUS(kvgate_get_session_stats(gate, (const uint8_t *)session, strlen(session), &s,
                                          sizeof s),
                 KVGATE_OK);
    return s;
}

/* ------------------------------------------------------------------ */
/* Case 1: no probe runs after kvgate_free returned                   */
/* ------------------------------------------------------------------ */

/* kvgate_config_set_probes: user_data must stay valid "until kvgate_free on
 * the gate has returned: after that no probe is called again"; kvgate_free
 * may be called from inside a probe callback. Under pressure, so that
 * reference mode would go on to the prefix probe too. */
static void free_inside_the_usage_probe(uint32_t mode) {
    probe_host *h = calloc(1, sizeof *h);
    kvgate_admission a;
    CHECK(h != NULL);
    h->usage = 0.95;
    h->hit = 0.95;
    h->free_in_usage = 1;
    h->gate = new_gate(mode, h);
    gate_freed = 0;
    calls_after_free = 0;
    memset(&a, 0xAB, sizeof a);
    CHECK_STATUS(acquire(h->gate, "s", -1, &a), KVGATE_CLOSED);
    CHECK(gate_freed == 1);
    if (calls_after_free != 0) {
        fprintf(stderr, "%s: %lu probe call(s) after kvgate_free returned\n", mode_name(mode),
                calls_after_free);
    }
    CHECK(calls_after_free == 0);
    gate_freed = 0; /* the other cases' probes have live user_data */
    /* Out-parameters are written only on KVGATE_OK. */
    CHECK(a.lease == 0xABABABABABABABABull);
    printf("%s: free inside the usage probe: acquire closed, no probe called afterwards\n",
           mode_name(mode));
}

/* ------------------------------------------------------------------ */
/* Case 2: which modes ask the capacity probe                         */
/* ------------------------------------------------------------------ */

/* kvgate_capacity_fn: "Working-set admission asks it with every usage
 * probe; reference mode never calls it." */
static void capacity_probe_calls(uint32_t mode) {
    probe_host h;
    kvgate_admission a;
    kvgate_gate *gate;
    memset(&h, 0, sizeof h);
    h.usage = 0.10;
    h.hit = 0.95;
    gate = new_gate(mode, &h);
    /* Open (reference) / fits (working set). */
    CHECK_STATUS(acquire(gate, "a", -1, &a), KVGATE_OK);
    CHECK_STATUS(kvgate_release(gate, a.lease), KVGATE_OK);
    /* Under pressure: the prefix probe in reference mode. */
    h.usage = 0.95;
    CHECK_STATUS(acquire(gate, "b", -1, &a), KVGATE_OK);
    CHECK_STATUS(kvgate_release(gate, a.lease), KVGATE_OK);
    h.hit = 0.0;
    (void)acquire(gate, "c", 0, &a);
    kvgate_free(gate);
    CHECK(h.usage_calls >= 3);
    if (mode == KVGATE_ADMISSION_MODE_REFERENCE) {
        if (h.capacity_calls != 0) {
            fprintf(stderr, "reference: %lu capacity probe calls for %lu usage probes\n",
                    h.capacity_calls, h.usage_calls);
        }
        CHECK(h.capacity_calls == 0);
        CHECK(h.prefix_calls >= 2);
    } else {
        CHECK(h.capacity_calls == h.usage_calls);
        CHECK(h.prefix_calls == 0);
    }
    printf("%s: %lu usage probes, %lu capacity probes, %lu prefix probes\n", mode_name(mode),
           h.usage_calls, h.capacity_calls, h.prefix_calls);
}

/* ------------------------------------------------------------------ */
/* Case 3: one truth about retained sessions                          */
/* ------------------------------------------------------------------ */

/* kvgate_admission.retain_session and kvgate_session_stats'
 * retaining_leases / reserved, read at the same moment, as the header
 * defines them per mode (docs/decisions/retained-session-figures.md). */
static void retained_session_figures(uint32_t mode) {
    probe_host h;
    kvgate_admission a;
    kvgate_session_stats s;
    kvgate_gate *gate;
    memset(&h, 0, sizeof h);
    h.usage = 0.95;
    h.hit = 0.95;
    gate = new_gate(mode, &h);
    CHECK_STATUS(acquire(gate, "s", -1, &a), KVGATE_OK);
    s = session_stats(gate, "s");
    CHECK(s.active_leases == 1);
    if (mode == KVGATE_ADMISSION_MODE_REFERENCE) {
        /* The lease holds the reservation, and the stats say so. */
        CHECK(a.reason == KVGATE_REASON_RESIDENT_PREFIX);
        CHECK(a.retain_session);
        CHECK(s.retaining_leases == 1 && s.reserved && !s.in_grace);
        CHECK_STATUS(kvgate_release(gate, a.lease), KVGATE_OK);
        s = session_stats(gate, "s");
        CHECK(s.retaining_leases == 0 && s.reserved && s.in_grace);
        /* An open admission holds no reservation: neither figure says it does. */
        h.usage = 0.10;
        CHECK_STATUS(acquire(gate, "t", -1, &a), KVGATE_OK);
        s = session_stats(gate, "t");
        CHECK(a.reason == KVGATE_REASON_OPEN && !a.retain_session);
        CHECK(s.active_leases == 1 && s.retaining_leases == 0 && !s.reserved);
        CHECK_STATUS(kvgate_release(gate, a.lease), KVGATE_OK);
    } else {
        /* The lease holds the session's working-set place (retain_session),
         * which is not the reference mode's reservation: the reservation
         * figures read 0 / false in this mode, as the header says. */
        CHECK(a.reason == KVGATE_REASON_EMPTY_WORKING_SET);
        CHECK(a.retain_session);
        CHECK(s.retaining_leases == 0 && !s.reserved && !s.in_grace);
        CHECK(s.grace_remaining_sec == 0.0);
        CHECK_STATUS(kvgate_release(gate, a.lease), KVGATE_OK);
        s = session_stats(gate, "s");
        CHECK(s.active_leases == 0 && s.retaining_leases == 0 && !s.reserved && !s.in_grace);
    }
    kvgate_free(gate);
    printf("%s: retain_session and the session's reservation figures agree\n", mode_name(mode));
}

/* ------------------------------------------------------------------ */
/* Case 4: NULL probes                                                */
/* ------------------------------------------------------------------ */

/* kvgate_config_set_probes: with both probes NULL, reference mode admits
 * every turn KVGATE_REASON_OPEN; working-set mode admits the first turn
 * KVGATE_REASON_EMPTY_WORKING_SET and the others
 * KVGATE_REASON_FITS_WORKING_SET (an unknown capacity holds nobody out). */
static void null_probes(uint32_t mode) {
    kvgate_gate *gate = new_gate(mode, NULL);
    kvgate_admission a[4];
    kvgate_stats st;
    char session[16];
    for (int i = 0; i < 4; i++) {
        snprintf(session, sizeof session, "n%d", i);
        CHECK_STATUS(acquire(gate, session, 0, &a[i]), KVGATE_OK);
        CHECK(isnan(a[i].usage) && isnan(a[i].hit_ratio) && !a[i].waited);
        if (mode == KVGATE_ADMISSION_MODE_REFERENCE) {
            CHECK(a[i].reason == KVGATE_REASON_OPEN);
        } else {
            CHECK(a[i].reason == (i == 0 ? KVGATE_REASON_EMPTY_WORKING_SET
                                         : KVGATE_REASON_FITS_WORKING_SET));
        }
    }
    memset(&st, 0, sizeof st);
    CHECK_STATUS(kvgate_get_stats(gate, &st, sizeof st), KVGATE_OK);
    CHECK(st.admissions == 4 && st.prefix_probe_calls == 0);
    CHECK(st.admissions_open == (mode == KVGATE_ADMISSION_MODE_REFERENCE ? 4u : 0u));
    for (int i = 0; i < 4; i++) {
        CHECK_STATUS(kvgate_release(gate, a[i].lease), KVGATE_OK);
    }
    kvgate_free(gate);
    printf("%s: NULL probes: every turn admitted (%s)\n", mode_name(mode),
           kvgate_reason_str(a[1].reason));
}

/* ------------------------------------------------------------------ */
/* The sweep: the library's other promises                             */
/* ------------------------------------------------------------------ */

/* kvgate_admission.lease: "Unique within the gate, never reused, never
 * KVGATE_NO_LEASE"; kvgate_release "exactly once per lease": the second
 * release is KVGATE_UNKNOWN_LEASE "and does nothing else". */
static void leases_unique_and_released_once(uint32_t mode) {
    kvgate_gate *gate = new_gate(mode, NULL);
    kvgate_admission a;
    kvgate_stats st;
    uint64_t seen[64];
    for (int i = 0; i < 64; i++) {
        CHECK_STATUS(acquire(gate, i % 2 ? "odd" : "even", 0, &a), KVGATE_OK);
        CHECK(a.lease != KVGATE_NO_LEASE);
        for (int j = 0; j < i; j++) {
            CHECK(seen[j] != a.lease);
        }
        seen[i] = a.lease;
        CHECK_STATUS(kvgate_release(gate, a.lease), KVGATE_OK);
        CHECK_STATUS(kvgate_release(gate, a.lease), KVGATE_UNKNOWN_LEASE);
    }
    CHECK_STATUS(kvgate_release(gate, KVGATE_NO_LEASE), KVGATE_UNKNOWN_LEASE);
    memset(&st, 0, sizeof st);
    CHECK_STATUS(kvgate_get_stats(gate, &st, sizeof st), KVGATE_OK);
    CHECK(st.releases == 64 && st.active_leases == 0);
    kvgate_free(gate);
}

/* kvgate_get_stats / kvgate_get_session_stats / kvgate_finish_session:
 * "at most out_size bytes, size first". A short out_size leaves the bytes
 * past it untouched and says in `size` how many were written. */
static void stats_write_at_most_out_size(uint32_t mode) {
    kvgate_gate *gate = new_gate(mode, NULL);
    kvgate_admission a;
    unsigned char buf[sizeof(kvgate_stats) + 16];
    unsigned char sbuf[sizeof(kvgate_session_stats) + 16];
    size_t short_size = offsetof(kvgate_stats, admissions_open);
    size_t short_session = offsetof(kvgate_session_stats, attempts);
    size_t written;
    CHECK_STATUS(acquire(gate, "s", 0, &a), KVGATE_OK);

    memset(buf, 0x5A, sizeof buf);
    CHECK_STATUS(kvgate_get_stats(gate, (kvgate_stats *)(void *)buf, short_size), KVGATE_OK);
    memcpy(&written, buf, sizeof written);
    CHECK(written == short_size);
    for (size_t i = short_size; i < sizeof buf; i++) {
        CHECK(buf[i] == 0x5A);
    }
    CHECK_STATUS(kvgate_get_stats(gate, (kvgate_stats *)(void *)buf, sizeof(size_t) - 1),
                 KVGATE_INVALID_ARGUMENT);

    memset(sbuf, 0x5A, sizeof sbuf);
    CHECK_STATUS(kvgate_get_session_stats(gate, (const uint8_t *)"s", 1,
                                          (kvgate_session_stats *)(void *)sbuf, short_session),
                 KVGATE_OK);
    memcpy(&written, sbuf, sizeof written);
    CHECK(written == short_session);
    for (size_t i = short_session; i < sizeof sbuf; i++) {
        CHECK(sbuf[i] == 0x5A);
    }
    /* Full size: everything the library knows, no byte past it. */
    memset(buf, 0x5A, sizeof buf);
    CHECK_STATUS(kvgate_get_stats(gate, (kvgate_stats *)(void *)buf, sizeof(kvgate_stats)),
                 KVGATE_OK);
    memcpy(&written, buf, sizeof written);
    CHECK(written == sizeof(kvgate_stats));
    for (size_t i = sizeof(kvgate_stats); i < sizeof buf; i++) {
        CHECK(buf[i] == 0x5A);
    }

    CHECK_STATUS(kvgate_release(gate, a.lease), KVGATE_OK);
    memset(sbuf, 0x5A, sizeof sbuf);
    CHECK_STATUS(kvgate_finish_session(gate, (const uint8_t *)"s", 1,
                                       (kvgate_session_stats *)(void *)sbuf, short_session),
                 KVGATE_OK);
    for (size_t i = short_session; i < sizeof sbuf; i++) {
        CHECK(sbuf[i] == 0x5A);
    }
    /* Finished: "never seen, already finished, or retired" is NOT_FOUND. */
    CHECK_STATUS(kvgate_finish_session(gate, (const uint8_t *)"s", 1, NULL, 0), KVGATE_NOT_FOUND);
    kvgate_free(gate);
}

/* kvgate_metrics_text: "*needed is always set (on KVGATE_OK and
 * KVGATE_BUFFER_TOO_SMALL)"; too small leaves buf untouched. */
static void metrics_text_needed_always_set(void) {
    kvgate_gate *gate = new_gate(KVGATE_ADMISSION_MODE_WORKING_SET, NULL);
    char small[8];
    char *big;
    size_t needed = 0;
    CHECK_STATUS(kvgate_metrics_text(gate, NULL, 0, &needed), KVGATE_BUFFER_TOO_SMALL);
    CHECK(needed > sizeof small);
    memset(small, 'x', sizeof small);
    needed = 0;
    CHECK_STATUS(kvgate_metrics_text(gate, small, sizeof small, &needed), KVGATE_BUFFER_TOO_SMALL);
    CHECK(needed > sizeof small);
    for (size_t i = 0; i < sizeof small; i++) {
        CHECK(small[i] == 'x');
    }
    big = malloc(needed);
    CHECK(big != NULL);
    {
        size_t asked = needed;
        needed = 0;
        CHECK_STATUS(kvgate_metrics_text(gate, big, asked, &needed), KVGATE_OK);
        CHECK(needed == strlen(big) + 1);
    }
    free(big);
    kvgate_free(gate);
}

/* kvgate_status_str / kvgate_reason_str / kvgate_version /
 * kvgate_last_error: "Never returns NULL", unknown values included;
 * kvgate_last_error is "" before any failure, and "a successful call
 * leaves it unchanged". */
static void strings_never_null(void) {
    CHECK(strcmp(kvgate_last_error(), "") == 0);
    CHECK(kvgate_version() != NULL);
    for (uint32_t v = 0; v < 16; v++) {
        CHECK(kvgate_status_str(v) != NULL && kvgate_reason_str(v) != NULL);
    }
    CHECK(strcmp(kvgate_status_str(0xFFFFFFFFu), "unknown") == 0);
    CHECK(strcmp(kvgate_reason_str(0xFFFFFFFFu), "unknown") == 0);
    CHECK_STATUS(kvgate_close(NULL), KVGATE_INVALID_ARGUMENT);
    {
        char copy[256];
        snprintf(copy, sizeof copy, "%s", kvgate_last_error());
        CHECK(strstr(copy, "kvgate_close") != NULL);
        CHECK(strcmp(kvgate_status_str(KVGATE_OK), "ok") == 0);
        CHECK(strcmp(kvgate_last_error(), copy) == 0);
    }
}

/* "status and reason values are never reused; structs never change layout
 * (new fields come with new structs and functions)"; the stats structs
 * are size-prefixed and, within a minor version, "new figures are only
 * ever appended". Pinned as released (LP64: the platforms the library is
 * built and tested on). */
static void values_and_layouts_pinned(void) {
    CHECK(KVGATE_OK == 0 && KVGATE_PREEMPTED == 1 && KVGATE_TIMED_OUT == 2 &&
          KVGATE_CANCELLED == 3 && KVGATE_CLOSED == 4 && KVGATE_INVALID_ARGUMENT == 5 &&
          KVGATE_UNKNOWN_LEASE == 6 && KVGATE_NOT_FOUND == 7 && KVGATE_PANIC == 8 &&
          KVGATE_BUFFER_TOO_SMALL == 9 && KVGATE_OUT_OF_ORDER == 10 && KVGATE_OS_ERROR == 11 &&
          KVGATE_RELEASED == 12 && KVGATE_CACHE_HOT == 13);
    CHECK(KVGATE_REASON_OPEN == 0 && KVGATE_REASON_RESERVED_SESSION == 1 &&
          KVGATE_REASON_PREFIX_PROBE_UNAVAILABLE == 2 && KVGATE_REASON_RESIDENT_PREFIX == 3 &&
          KVGATE_REASON_FITS_WORKING_SET == 4 && KVGATE_REASON_EMPTY_WORKING_SET == 5 &&
          KVGATE_REASON_WAIT_BOUND == 6 && KVGATE_REASON_RUNNING_COLD_PAYS == 7);
    CHECK(KVGATE_STEP_PROBE_USAGE == 0 && KVGATE_STEP_PROBE_PREFIX == 1 &&
          KVGATE_STEP_SLEEP == 2 && KVGATE_STEP_ADMITTED == 3 && KVGATE_STEP_FAILED == 4);
    CHECK(KVGATE_ADMISSION_MODE_WORKING_SET == 0 && KVGATE_ADMISSION_MODE_REFERENCE == 1);
    if (sizeof(void *) == 8) {
        CHECK(sizeof(kvgate_admission) == 48 && offsetof(kvgate_admission, reason) == 8 &&
              offsetof(kvgate_admission, wait_sec) == 16 && offsetof(kvgate_admission, usage) == 24 &&
              offsetof(kvgate_admission, hit_ratio) == 32 &&
              offsetof(kvgate_admission, retain_session) == 40 &&
              offsetof(kvgate_admission, waited) == 41);
        CHECK(sizeof(kvgate_step) == 72 && offsetof(kvgate_step, status) == 4 &&
              offsetof(kvgate_step, until_ns) == 8 && offsetof(kvgate_step, sleep_ns) == 16 &&
              offsetof(kvgate_step, admission) == 24);
        /* Within a minor version appended to, never rearranged: every field
           released in this one stays put. */
        CHECK(offsetof(kvgate_stats, tracked_sessions) == 224 &&
              offsetof(kvgate_stats, working_set_tier_cached_tokens) == 360 &&
              sizeof(kvgate_stats) >= 368);
        CHECK(offsetof(kvgate_session_stats, retaining_leases) == 68 &&
              offsetof(kvgate_session_stats, reserved) == 73 &&
              offsetof(kvgate_session_stats, idle_sec) == 96 && sizeof(kvgate_session_stats) >= 104);
    }
}

/* kvgate_config_set_probes: "the library never reads, frees or copies what
 * [user_data] points to": a user_data that points nowhere is passed to the
 * probes unchanged, and nothing else touches it (a read would fault, and
 * ASan/valgrind would name it). */
static void *const nowhere = (void *)(uintptr_t)0x10;
static unsigned long opaque_calls = 0;
static bool opaque_usage(void *user_data, const uint8_t *session_id, size_t session_id_len,
                         double *out_usage) {
    (void)session_id;
    (void)session_id_len;
    CHECK(user_data == nowhere);
    opaque_calls++;
    *out_usage = 0.95;
    return true;
}
static bool opaque_prefix(void *user_data, const uint8_t *session_id, size_t session_id_len,
                          const uint32_t *prompt_ids, size_t prompt_len, double *out_hit_ratio) {
    (void)session_id;
    (void)session_id_len;
    (void)prompt_ids;
    (void)prompt_len;
    CHECK(user_data == nowhere);
    opaque_calls++;
    *out_hit_ratio = 0.95;
    return true;
}
static bool opaque_capacity(void *user_data, const uint8_t *session_id, size_t session_id_len,
                            uint64_t *out_tokens, uint32_t *out_block_tokens, double *out_rate) {
    (void)session_id;
    (void)session_id_len;
    CHECK(user_data == nowhere);
    opaque_calls++;
    *out_tokens = 1u << 20;
    *out_block_tokens = 16;
    *out_rate = 0.0;
    return true;
}

static void user_data_is_opaque(uint32_t mode) {
    kvgate_config *config = kvgate_config_new();
    kvgate_gate *gate = NULL;
    kvgate_admission a;
    CHECK(config != NULL);
    CHECK_STATUS(kvgate_config_set_admission_mode(config, mode), KVGATE_OK);
    CHECK_STATUS(kvgate_config_set_probes(config, opaque_usage, opaque_prefix, nowhere), KVGATE_OK);
    CHECK_STATUS(kvgate_config_set_capacity_probe(config, opaque_capacity), KVGATE_OK);
    CHECK_STATUS(kvgate_new(config, &gate), KVGATE_OK);
    kvgate_config_free(config);
    opaque_calls = 0;
    for (int i = 0; i < 8; i++) {
        CHECK_STATUS(acquire(gate, i % 2 ? "p" : "q", -1, &a), KVGATE_OK);
        CHECK_STATUS(kvgate_release(gate, a.lease), KVGATE_OK);
    }
    kvgate_free(gate);
    CHECK(opaque_calls >= 8);
}

/* KVGATE_UNKNOWN_LEASE for a handle "never issued by this gate", and
 * KVGATE_NOT_FOUND for a session "never seen". */
static void never_issued_never_seen(uint32_t mode) {
    kvgate_gate *gate = new_gate(mode, NULL);
    kvgate_session_stats s;
    CHECK_STATUS(kvgate_release(gate, (uint64_t)1 << 40), KVGATE_UNKNOWN_LEASE);
    CHECK_STATUS(kvgate_release_with_report(gate, 7, 0, 0), KVGATE_UNKNOWN_LEASE);
    CHECK_STATUS(kvgate_finish_session(gate, (const uint8_t *)"ghost", 5, NULL, 0), KVGATE_NOT_FOUND);
    CHECK_STATUS(kvgate_get_session_stats(gate, (const uint8_t *)"ghost", 5, &s, sizeof s),
                 KVGATE_NOT_FOUND);
    CHECK_STATUS(kvgate_cancel_session(gate, (const uint8_t *)"ghost", 5), KVGATE_NOT_FOUND);
    kvgate_free(gate);
}

int main(void) {
    const uint32_t modes[2] = {KVGATE_ADMISSION_MODE_WORKING_SET, KVGATE_ADMISSION_MODE_REFERENCE};
    strings_never_null();
    values_and_layouts_pinned();
    for (int m = 0; m < 2; m++) {
        user_data_is_opaque(modes[m]);
        never_issued_never_seen(modes[m]);
        free_inside_the_usage_probe(modes[m]);
        capacity_probe_calls(modes[m]);
        retained_session_figures(modes[m]);
        null_probes(modes[m]);
        leases_unique_and_released_once(modes[m]);
        stats_write_at_most_out_size(modes[m]);
    }
    metrics_text_needed_always_set();
    printf("c promises: %d checks passed\n", checks_passed);
    return 0;
}
