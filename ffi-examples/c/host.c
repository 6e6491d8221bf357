/*
 * A pthreads host embedding kvgate through its C ABI.
 *
 * Probes are backed by a toy KV model (thread-safe: probes run on every
 * acquiring thread at once). Part 1 drives the model into each situation
 * and checks what the gate answers: every reason, waiting and the wake-up
 * on release, a newer attempt preempting an older waiting one, cancel,
 * timeouts, double release, stats, metrics sizing, last_error and misuse.
 * Part 2 runs several agent sessions on threads against the model and
 * checks the totals. Part 3 frees a gate while a thread waits in it.
 *
 * Every check exits non-zero with a message on failure; the last line is
 * "c host: N checks passed". Run by scripts/ffi-examples.sh, also under
 * valgrind and with -fsanitize=address,undefined.
 */
#define _POSIX_C_SOURCE 200809L

#include <kvgate.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

static double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Generous: a bug hangs a check for seconds, not forever. */
#define PATIENCE_SEC 60.0
/* The scenario gate polls every 30 s; a woken waiter returns well within 10 s. */
#define SCENARIO_POLL_SEC 30.0
#define PROMPTLY_SEC 10.0

/* ------------------------------------------------------------------ */
/* The toy KV model behind the probes                                 */
/* ------------------------------------------------------------------ */

#define MAX_SESSIONS 16

/*
 * Usage is the share of KV blocks held by running requests (as vLLM counts
 * it); a session's hit ratio is its resident prefix over its prompt. After a
 * request finishes, its prompt stays cached until least-recently-used
 * eviction needs the room.
 */
typedef struct {
    pthread_mutex_t lock;
    size_t capacity;              /* tokens of KV cache */
    size_t running;               /* tokens held by running requests */
    size_t resident[MAX_SESSIONS];
    unsigned long last_used[MAX_SESSIONS];
    unsigned long tick;
    int usage_available;
    int prefix_available;
    int garbage_prefix;           /* answer 7.5: must count as unavailable */
    unsigned long usage_calls;
    unsigned long prefix_calls;
} kv_model;

static void model_init(kv_model *m, size_t capacity) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->lock, NULL);
    m->capacity = capacity;
    m->usage_available = 1;
    m->prefix_available = 1;
}

static void model_destroy(kv_model *m) { pthread_mutex_destroy(&m->lock); }

/* "agent-<n>" -> n, or -1. Session ids are bytes, not C strings. */
static int session_index(const uint8_t *id, size_t len) {
    static const char prefix[] = "agent-";
    size_t plen = sizeof prefix - 1;
    int n = 0;
    if (len <= plen || len > plen + 2 || memcmp(id, prefix, plen) != 0) {
        return -1;
    }
    for (size_t i = plen; i < len; i++) {
        if (id[i] < '0' || id[i] > '9') {
            return -1;
        }
        n = n * 10 + (id[i] - '0');
    }
    return n < MAX_SESSIONS ? n : -1;
}

static bool usage_probe(void *user_data, const uint8_t *session_id, size_t session_id_len,
                        double *out_usage) {
    kv_model *m = user_data;
    bool ok;
    (void)session_id;
    (void)session_id_len;
    pthread_mutex_lock(&m->lock);
    m->usage_calls++;
    ok = m->usage_available != 0;
    if (ok) {
        double u = (double)m->running / (double)m->capacity;
        *out_usage = u > 1.0 ? 1.0 : u;
    }
    pthread_mutex_unlock(&m->lock);
    return ok;
}

static bool prefix_probe(void *user_data, const uint8_t *session_id, size_t session_id_len,
                         const uint32_t *prompt_ids, size_t prompt_len, double *out_hit_ratio) {
    kv_model *m = user_data;
    int s = session_index(session_id, session_id_len);
    bool ok;
    (void)prompt_ids;
    pthread_mutex_lock(&m->lock);
    m->prefix_calls++;
    ok = m->prefix_available != 0 && s >= 0 && prompt_len > 0;
    if (ok && m->garbage_prefix) {
        *out_hit_ratio = 7.5;
    } else if (ok) {
        size_t hit = m->resident[s] < prompt_len ? m->resident[s] : prompt_len;
        *out_hit_ratio = (double)hit / (double)prompt_len;
    }
    pthread_mutex_unlock(&m->lock);
    return ok;
}

/* The engine starts a request: it holds its prompt's blocks while running. */
static void model_start(kv_model *m, size_t prompt_len) {
    pthread_mutex_lock(&m->lock);
    m->running += prompt_len;
    pthread_mutex_unlock(&m->lock);
}

/* The request finished: its prompt is now cached, others may be evicted. */
static void model_finish(kv_model *m, int s, size_t prompt_len) {
    size_t cached = 0;
    pthread_mutex_lock(&m->lock);
    m->running -= prompt_len;
    m->resident[s] = prompt_len;
    m->last_used[s] = ++m->tick;
    for (int i = 0; i < MAX_SESSIONS; i++) {
        cached += m->resident[i];
    }
    while (cached > m->capacity) {
        int lru = -1;
        for (int i = 0; i < MAX_SESSIONS; i++) {
            if (i != s && m->resident[i] > 0 && (lru < 0 || m->last_used[i] < m->last_used[lru])) {
                lru = i;
            }
        }
        if (lru < 0) {
            break;
        }
        cached -= m->resident[lru];
        m->resident[lru] = 0;
    }
    pthread_mutex_unlock(&m->lock);
}

/* Which answers the engine gives (the scenarios switch them). */
static void model_answers(kv_model *m, int usage_available, int prefix_available,
                          int garbage_prefix) {
    pthread_mutex_lock(&m->lock);
    m->usage_available = usage_available;
    m->prefix_available = prefix_available;
    m->garbage_prefix = garbage_prefix;
    pthread_mutex_unlock(&m->lock);
}

static void model_set(kv_model *m, size_t running, int s, size_t resident) {
    pthread_mutex_lock(&m->lock);
    m->running = running;
    if (s >= 0) {
        m->resident[s] = resident;
    }
    pthread_mutex_unlock(&m->lock);
}

/* ------------------------------------------------------------------ */
/* Small helpers over the C API                                       */
/* ------------------------------------------------------------------ */

static kvgate_gate *new_gate(kv_model *m, double poll_sec, double grace_sec) {
    kvgate_config *config = kvgate_config_new();
    kvgate_gate *gate = NULL;
    CHECK(config != NULL);
    CHECK_STATUS(kvgate_config_set_probes(config, usage_probe, prefix_probe, m), KVGATE_OK);
    /* This host exercises the seed's decision table. */
    CHECK_STATUS(kvgate_config_set_admission_mode(config, KVGATE_ADMISSION_MODE_REFERENCE), KVGATE_OK);
    CHECK_STATUS(kvgate_config_set_wait_poll_sec(config, poll_sec), KVGATE_OK);
    CHECK_STATUS(kvgate_config_set_idle_grace_sec(config, grace_sec), KVGATE_OK);
    CHECK_STATUS(kvgate_new(config, &gate), KVGATE_OK);
    kvgate_config_free(config); /* kvgate_new copied it */
    CHECK(gate != NULL);
    return gate;
}

static uint32_t prompt[4096];

static kvgate_status acquire(kvgate_gate *gate, const char *session, size_t prompt_len,
                             int64_t timeout_ms, kvgate_admission *out) {
    return kvgate_acquire(gate, (const uint8_t *)session, strlen(session), prompt, prompt_len,
                          timeout_ms, out);
}

static kvgate_stats stats(kvgate_gate *gate) {
    kvgate_stats s;
    CHECK_STATUS(kvgate_get_stats(gate, &s, sizeof s), KVGATE_OK);
    CHECK(s.size == sizeof s); /* built against this header: every field written */
    return s;
}

static kvgate_session_stats session_stats(kvgate_gate *gate, const char *session) {
    kvgate_session_stats s;
    CHECK_STATUS(
        kvgate_get_session_stats(gate, (const uint8_t *)session, strlen(session), &s, sizeof s),
        KVGATE_OK);
    return s;
}

/* Admissions for one reason (the stats struct names each; new reasons are
   appended fields, so there is no array to size). */
static uint64_t admissions_for(const kvgate_stats *s, kvgate_reason r) {
    switch (r) {
    case KVGATE_REASON_OPEN:
        return s->admissions_open;
    case KVGATE_REASON_RESERVED_SESSION:
        return s->admissions_reserved_session;
    case KVGATE_REASON_PREFIX_PROBE_UNAVAILABLE:
        return s->admissions_prefix_probe_unavailable;
    case KVGATE_REASON_RESIDENT_PREFIX:
        return s->admissions_resident_prefix;
    }
    return 0;
}

/* Polls until n attempts wait; one check, however many polls it takes. */
static void wait_for_waiting(kvgate_gate *gate, uint64_t n) {
    double start = now_sec();
    kvgate_stats s;
    for (;;) {
        kvgate_status st = kvgate_get_stats(gate, &s, sizeof s);
        if (st != KVGATE_OK) {
            CHECK_STATUS(st, KVGATE_OK); /* exits */
        }
        if (s.waiting_attempts == n || now_sec() - start > PATIENCE_SEC) {
            break;
        }
        sleep_ms(1);
    }
    CHECK(s.waiting_attempts == n);
}

/* An acquire on its own thread. */
typedef struct {
    kvgate_gate *gate;
    const char *session;
    size_t prompt_len;
    kvgate_status status;
    kvgate_admission admission;
    double took_sec;
    pthread_t thread;
} waiter;

static void *waiter_main(void *arg) {
    waiter *w = arg;
    double start = now_sec();
    w->status = acquire(w->gate, w->session, w->prompt_len, -1, &w->admission);
    w->took_sec = now_sec() - start;
    return NULL;
}

static void waiter_start(waiter *w, kvgate_gate *gate, const char *session, size_t prompt_len) {
    memset(w, 0, sizeof *w);
    w->gate = gate;
    w->session = session;
    w->prompt_len = prompt_len;
    CHECK(pthread_create(&w->thread, NULL, waiter_main, w) == 0);
}

static void waiter_join(waiter *w) { CHECK(pthread_join(w->thread, NULL) == 0); }

/* ------------------------------------------------------------------ */
/* Part 1: scenarios                                                  */
/* ------------------------------------------------------------------ */

#define CAPACITY 10000
#define PRESSURE 9500 /* running tokens: usage 0.95 >= watermark 0.85 */

static void scenarios(void) {
    kv_model m;
    kvgate_gate *gate;
    kvgate_admission a, held;
    kvgate_stats s;
    kvgate_session_stats ss;
    waiter w1, w2;

    model_init(&m, CAPACITY);
    gate = new_gate(&m, SCENARIO_POLL_SEC, 60.0);

    /* Below the watermark: open, then a double release is refused. */
    CHECK_STATUS(acquire(gate, "agent-0", 100, -1, &a), KVGATE_OK);
    CHECK(a.reason == KVGATE_REASON_OPEN && a.lease != KVGATE_NO_LEASE);
    CHECK(a.usage == 0.0 && isnan(a.hit_ratio) && !a.retain_session && !a.waited);
    CHECK_STATUS(kvgate_release(gate, a.lease), KVGATE_OK);
    CHECK_STATUS(kvgate_release(gate, a.lease), KVGATE_UNKNOWN_LEASE);
    CHECK_LAST_ERROR("is not outstanding");
    CHECK_STATUS(kvgate_release(gate, 987654321), KVGATE_UNKNOWN_LEASE);
    printf("open: lease %llu released once, double release -> %s\n",
           (unsigned long long)a.lease, kvgate_status_str(KVGATE_UNKNOWN_LEASE));

    /* Under pressure, a resident prompt goes in and retains the session. */
    model_set(&m, PRESSURE, 1, 400);
    CHECK_STATUS(acquire(gate, "agent-1", 400, -1, &a), KVGATE_OK);
    CHECK(a.reason == KVGATE_REASON_RESIDENT_PREFIX && a.retain_session);
    CHECK(a.usage == 0.95 && a.hit_ratio == 1.0);
    CHECK_STATUS(kvgate_release(gate, a.lease), KVGATE_OK);
    ss = session_stats(gate, "agent-1");
    CHECK(ss.reserved && ss.in_grace && ss.grace_remaining_sec > 0.0);

    /* Evicted meanwhile, but its ownership window lets the next turn in. */
    model_set(&m, PRESSURE, 1, 0);
    CHECK_STATUS(acquire(gate, "agent-1", 500, -1, &held), KVGATE_OK);
    CHECK(held.reason == KVGATE_REASON_RESERVED_SESSION && isnan(held.hit_ratio));
    printf("pressure: %s then %s\n", kvgate_reason_str(KVGATE_REASON_RESIDENT_PREFIX),
           kvgate_reason_str(held.reason));

    /* No prefix answer, or a garbage one: admitted as probe unavailable. */
    model_answers(&m, 1, 0, 0);
    CHECK_STATUS(acquire(gate, "agent-2", 100, -1, &a), KVGATE_OK);
    CHECK(a.reason == KVGATE_REASON_PREFIX_PROBE_UNAVAILABLE);
    CHECK_STATUS(kvgate_release(gate, a.lease), KVGATE_OK);
    model_answers(&m, 1, 1, 1);
    CHECK_STATUS(acquire(gate, "agent-2", 100, -1, &a), KVGATE_OK);
    CHECK(a.reason == KVGATE_REASON_PREFIX_PROBE_UNAVAILABLE);
    CHECK_STATUS(kvgate_release(gate, a.lease), KVGATE_OK);
    model_answers(&m, 1, 1, 0);
    CHECK(stats(gate).prefix_probe_invalid == 1);

    /* Cold under pressure: a zero timeout fails instead of waiting. */
    CHECK_STATUS(acquire(gate, "agent-3", 100, 0, &a), KVGATE_TIMED_OUT);
    CHECK_LAST_ERROR("timeout_ms = 0");

    /* A cold session waits; a release with capacity freed wakes it at once. */
    waiter_start(&w1, gate, "agent-4", 300);
    wait_for_waiting(gate, 1);
    model_set(&m, 0, -1, 0);
    CHECK_STATUS(kvgate_release(gate, held.lease), KVGATE_OK);
    waiter_join(&w1);
    CHECK_STATUS(w1.status, KVGATE_OK);
    CHECK(w1.admission.reason == KVGATE_REASON_OPEN && w1.admission.waited);
    CHECK(w1.took_sec < PROMPTLY_SEC);
    CHECK_STATUS(kvgate_release(gate, w1.admission.lease), KVGATE_OK);
    printf("wait: agent-4 woken by a release after %.3f s (poll %.0f s)\n", w1.took_sec,
           SCENARIO_POLL_SEC);

    /* A retry preempts the older waiting attempt; cancel ends the newer one. */
    model_set(&m, PRESSURE, 5, 0);
    waiter_start(&w1, gate, "agent-5", 200);
    wait_for_waiting(gate, 1);
    waiter_start(&w2, gate, "agent-5", 200);
    waiter_join(&w1);
    CHECK_STATUS(w1.status, KVGATE_PREEMPTED);
    CHECK(w1.took_sec < PROMPTLY_SEC);
    wait_for_waiting(gate, 1);
    CHECK_STATUS(kvgate_cancel_session(gate, (const uint8_t *)"agent-5", 7), KVGATE_OK);
    waiter_join(&w2);
    CHECK_STATUS(w2.status, KVGATE_CANCELLED);
    CHECK_STATUS(kvgate_cancel_session(gate, (const uint8_t *)"agent-5", 7), KVGATE_NOT_FOUND);
    ss = session_stats(gate, "agent-5");
    CHECK(ss.num_preempted == 1 && ss.cancelled == 1 && ss.attempts == 2 && !ss.attempt_pending);
    printf("retry: older attempt %s, newer %s; num_preempted=%llu\n",
           kvgate_status_str(w1.status), kvgate_status_str(w2.status),
           (unsigned long long)ss.num_preempted);

    /* Gate-wide figures. */
    s = stats(gate);
    CHECK(s.admissions == 6 && s.releases == 6 && s.active_leases == 0);
    CHECK(s.admissions_open == 2);
    CHECK(s.admissions_reserved_session == 1);
    CHECK(s.admissions_prefix_probe_unavailable == 2);
    CHECK(s.admissions_resident_prefix == 1);
    CHECK(s.preempted == 1 && s.cancelled == 1 && s.timed_out == 1 && s.waits == 3);
    CHECK(s.pending_attempts == 0 && s.waiting_attempts == 0);
    CHECK(m.usage_calls > 0 && m.prefix_calls > 0);

    /* Metrics text: ask the size, refuse a buffer one byte short, then fit. */
    {
        size_t needed = 0, again = 0;
        char *buf;
        CHECK_STATUS(kvgate_metrics_text(gate, NULL, 0, &needed), KVGATE_BUFFER_TOO_SMALL);
        CHECK(needed > 100);
        buf = malloc(needed + 64);
        CHECK(buf != NULL);
        memset(buf, '#', needed + 64);
        CHECK_STATUS(kvgate_metrics_text(gate, buf, needed - 1, &again), KVGATE_BUFFER_TOO_SMALL);
        CHECK(again == needed && buf[0] == '#' && buf[needed - 2] == '#');
        CHECK_STATUS(kvgate_metrics_text(gate, buf, needed + 64, &again), KVGATE_OK);
        CHECK(strlen(buf) + 1 == again);
        CHECK(strstr(buf, "kvgate_admissions_total{reason=\"resident_prefix\"} 1\n") != NULL);
        CHECK_STATUS(kvgate_metrics_text(gate, NULL, 8, &again), KVGATE_INVALID_ARGUMENT);
        CHECK_LAST_ERROR("buf is NULL but cap is 8");
        printf("metrics: %zu bytes needed\n", again);
        free(buf);
    }

    /* Misuse is refused, with a message naming the argument. */
    {
        kvgate_config *config = kvgate_config_new();
        kvgate_gate *other = NULL;
        CHECK_STATUS(acquire(NULL, "agent-0", 1, -1, &a), KVGATE_INVALID_ARGUMENT);
        CHECK_LAST_ERROR("kvgate_acquire: gate is NULL");
        CHECK_STATUS(kvgate_acquire(gate, NULL, 3, prompt, 1, -1, &a), KVGATE_INVALID_ARGUMENT);
        CHECK_LAST_ERROR("session_id is NULL but session_id_len is 3");
        CHECK_STATUS(kvgate_acquire(gate, (const uint8_t *)"x", 1, NULL, 9, -1, &a),
                     KVGATE_INVALID_ARGUMENT);
        CHECK_LAST_ERROR("prompt_ids is NULL but prompt_len is 9");
        CHECK_STATUS(acquire(gate, "agent-0", 1, -1, NULL), KVGATE_INVALID_ARGUMENT);
        CHECK_LAST_ERROR("out is NULL");
        CHECK_STATUS(kvgate_release(NULL, 1), KVGATE_INVALID_ARGUMENT);
        CHECK_STATUS(kvgate_get_stats(gate, NULL, sizeof(kvgate_stats)), KVGATE_INVALID_ARGUMENT);
        {
            kvgate_stats s;
            CHECK_STATUS(kvgate_get_stats(gate, &s, 2), KVGATE_INVALID_ARGUMENT);
            CHECK_LAST_ERROR("out_size (2)");
        }
        CHECK_STATUS(kvgate_config_set_probes(NULL, NULL, NULL, NULL), KVGATE_INVALID_ARGUMENT);
        CHECK_STATUS(kvgate_close(NULL), KVGATE_INVALID_ARGUMENT);
        CHECK_STATUS(kvgate_config_set_high_watermark(NULL, 0.5), KVGATE_INVALID_ARGUMENT);
        CHECK_LAST_ERROR("config is NULL");
        CHECK_STATUS(kvgate_config_set_high_watermark(config, NAN), KVGATE_INVALID_ARGUMENT);
        CHECK_LAST_ERROR("invalid high_watermark: NaN");
        CHECK_STATUS(kvgate_config_set_wait_poll_sec(config, 0.0), KVGATE_INVALID_ARGUMENT);
        CHECK_LAST_ERROR("invalid wait_poll");
        CHECK_STATUS(kvgate_config_set_idle_grace_sec(config, -1.0), KVGATE_INVALID_ARGUMENT);
        CHECK_STATUS(kvgate_config_set_hit_threshold(config, 1.5), KVGATE_INVALID_ARGUMENT);
        CHECK_STATUS(kvgate_config_set_session_retention_sec(config, INFINITY),
                     KVGATE_INVALID_ARGUMENT);
        CHECK_STATUS(kvgate_new(NULL, &other), KVGATE_INVALID_ARGUMENT);
        CHECK_STATUS(kvgate_new(config, NULL), KVGATE_INVALID_ARGUMENT);
        CHECK_STATUS(kvgate_config_set_admission_mode(config, 7), KVGATE_INVALID_ARGUMENT);
        CHECK_LAST_ERROR("invalid admission: 7");
        /* A gate with no probes (none set), in the default working-set mode,
           knows no capacity: the first session is admitted alone. */
        CHECK_STATUS(kvgate_new(config, &other), KVGATE_OK);
        CHECK_STATUS(acquire(other, "anyone", 0, -1, &a), KVGATE_OK);
        CHECK(a.reason == KVGATE_REASON_EMPTY_WORKING_SET && isnan(a.usage));
        kvgate_free(other); /* releases the outstanding lease */
        kvgate_config_free(config);
        kvgate_free(NULL);
        kvgate_config_free(NULL);
        printf("misuse: refused, e.g. \"%s\"\n", kvgate_last_error());
    }

    /* Finishing hands back the final figures; then the session is gone. */
    {
        kvgate_session_stats last;
        CHECK_STATUS(kvgate_finish_session(gate, (const uint8_t *)"agent-5", 7, &last, sizeof last),
                     KVGATE_OK);
        CHECK(last.num_preempted == 1 && last.cancelled == 1);
        CHECK_STATUS(kvgate_finish_session(gate, (const uint8_t *)"agent-5", 7, NULL, 0),
                     KVGATE_NOT_FOUND);
        CHECK_STATUS(kvgate_get_session_stats(gate, (const uint8_t *)"agent-5", 7, &ss, sizeof ss),
                     KVGATE_NOT_FOUND);
        CHECK_LAST_ERROR("is not tracked");
    }

    /* Close: new attempts are refused, granted leases stay valid. */
    model_set(&m, 0, -1, 0);
    CHECK_STATUS(acquire(gate, "agent-6", 10, -1, &a), KVGATE_OK);
    CHECK_STATUS(kvgate_close(gate), KVGATE_OK);
    CHECK_STATUS(acquire(gate, "agent-6", 10, -1, &held), KVGATE_CLOSED);
    CHECK_STATUS(kvgate_release(gate, a.lease), KVGATE_OK);
    kvgate_free(gate);
    model_destroy(&m);
}

/* ------------------------------------------------------------------ */
/* Part 2: agent sessions on threads                                  */
/* ------------------------------------------------------------------ */

#define AGENTS 6
#define TURNS 6
#define AGENT_CAPACITY 4096

/* The reasons this host was written for (KVGATE_REASON_OPEN ..
   KVGATE_REASON_RESIDENT_PREFIX); the library may add more. */
#define REASONS 4

typedef struct {
    kvgate_gate *gate;
    kv_model *model;
    int index;
    char session[24];
    unsigned long by_reason[REASONS];
    unsigned long waited;
    kvgate_status failure;
    pthread_t thread;
} agent;

static void *agent_main(void *arg) {
    agent *ag = arg;
    size_t len = strlen(ag->session);
    ag->failure = KVGATE_OK;
    for (int turn = 0; turn < TURNS; turn++) {
        /* The history grows every turn: the previous prompt plus a tool result. */
        size_t prompt_len = 256 * (size_t)(turn + 1) + 32 * (size_t)ag->index;
        kvgate_admission a;
        kvgate_status st = kvgate_acquire(ag->gate, (const uint8_t *)ag->session, len, prompt,
                                          prompt_len, 60000, &a);
        if (st != KVGATE_OK) {
            ag->failure = st;
            return NULL;
        }
        CHECK(a.reason < REASONS); /* a newer library may add reasons; this host knows four */
        ag->by_reason[a.reason]++;
        ag->waited += a.waited ? 1 : 0;
        model_start(ag->model, prompt_len); /* the engine runs the turn */
        sleep_ms(2);
        model_finish(ag->model, ag->index, prompt_len);
        st = kvgate_release(ag->gate, a.lease); /* as soon as the engine returns */
        if (st != KVGATE_OK) {
            ag->failure = st;
            return NULL;
        }
        sleep_ms(1); /* the tool call */
    }
    return NULL;
}

static void agents(void) {
    kv_model m;
    kvgate_gate *gate;
    agent ags[AGENTS];
    unsigned long by_reason[REASONS] = {0};
    unsigned long waited = 0;
    kvgate_stats s;

    model_init(&m, AGENT_CAPACITY);
    /* Short poll and grace: the toy turns take milliseconds. */
    gate = new_gate(&m, 0.05, 0.5);
    for (int i = 0; i < AGENTS; i++) {
        memset(&ags[i], 0, sizeof ags[i]);
        ags[i].gate = gate;
        ags[i].model = &m;
        ags[i].index = i;
        snprintf(ags[i].session, sizeof ags[i].session, "agent-%d", i);
        CHECK(pthread_create(&ags[i].thread, NULL, agent_main, &ags[i]) == 0);
    }
    for (int i = 0; i < AGENTS; i++) {
        kvgate_session_stats last;
        CHECK(pthread_join(ags[i].thread, NULL) == 0);
        CHECK_STATUS(ags[i].failure, KVGATE_OK);
        for (int r = 0; r < REASONS; r++) {
            by_reason[r] += ags[i].by_reason[r];
        }
        waited += ags[i].waited;
        CHECK_STATUS(kvgate_finish_session(gate, (const uint8_t *)ags[i].session,
                                           strlen(ags[i].session), &last, sizeof last),
                     KVGATE_OK);
        CHECK(last.admissions == TURNS && last.active_leases == 0 && last.num_preempted == 0);
    }
    s = stats(gate);
    CHECK(s.admissions == AGENTS * TURNS && s.releases == AGENTS * TURNS);
    CHECK(s.active_leases == 0 && s.pending_attempts == 0 && s.reserved_in_flight == 0);
    CHECK(s.sessions_finished == AGENTS);
    for (int r = 0; r < REASONS; r++) {
        CHECK(admissions_for(&s, (kvgate_reason)r) == by_reason[r]);
    }
    CHECK(m.running == 0);
    printf("agents: %d sessions x %d turns admitted; open=%lu reserved_session=%lu "
           "prefix_probe_unavailable=%lu resident_prefix=%lu; %lu turns waited\n",
           AGENTS, TURNS, by_reason[KVGATE_REASON_OPEN],
           by_reason[KVGATE_REASON_RESERVED_SESSION],
           by_reason[KVGATE_REASON_PREFIX_PROBE_UNAVAILABLE],
           by_reason[KVGATE_REASON_RESIDENT_PREFIX], waited);
    kvgate_free(gate);
    model_destroy(&m);
}

/* ------------------------------------------------------------------ */
/* Part 3: kvgate_free while a thread waits                           */
/* ------------------------------------------------------------------ */

static void free_with_a_waiter(void) {
    kv_model *m = malloc(sizeof *m);
    kvgate_gate *gate;
    kvgate_admission outstanding;
    waiter w;

    CHECK(m != NULL);
    model_init(m, CAPACITY);
    gate = new_gate(m, SCENARIO_POLL_SEC, 60.0);
    CHECK_STATUS(acquire(gate, "agent-7", 10, -1, &outstanding), KVGATE_OK); /* never released */
    model_set(m, PRESSURE, -1, 0);
    waiter_start(&w, gate, "agent-8", 100);
    /* The header's rule: free may overlap only an acquire that has entered
       the gate; one counted as waiting has. */
    wait_for_waiting(gate, 1);
    kvgate_free(gate);
    /* No probe runs after kvgate_free returned: the probes' data may go now,
       before the waiting thread has even been joined. */
    model_destroy(m);
    free(m);
    waiter_join(&w);
    CHECK_STATUS(w.status, KVGATE_CLOSED);
    CHECK(w.took_sec < PROMPTLY_SEC);
    printf("free: the waiting thread returned %s after %.3f s\n", kvgate_status_str(w.status),
           w.took_sec);
}

int main(void) {
    char version[32];
    snprintf(version, sizeof version, "%d.%d.%d", KVGATE_VERSION_MAJOR, KVGATE_VERSION_MINOR,
             KVGATE_VERSION_PATCH);
    CHECK(strcmp(kvgate_version(), version) == 0);
    CHECK(strcmp(kvgate_last_error(), "") == 0);
    for (size_t i = 0; i < sizeof prompt / sizeof prompt[0]; i++) {
        prompt[i] = (uint32_t)(i * 7 + 1);
    }
    printf("kvgate %s\n", kvgate_version());
    scenarios();
    agents();
    free_with_a_waiter();
    printf("c host: %d checks passed\n", checks_passed);
    return 0;
}
