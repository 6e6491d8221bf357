/*
 * A single-threaded event-loop host driving kvgate's non-blocking attempts
 * (kvgate_attempt_*) with poll(2).
 *
 * One thread runs everything: N agent sessions, each taking several turns,
 * and a toy engine that steps in the same loop. The engine answers probes
 * asynchronously, as an RPC would: a probe step is queued and answered a
 * few engine steps later. The loop polls one descriptor (the waker's) with
 * a timeout that is the earliest of: the gate's timer (kvgate_tick), the
 * sleeping attempts' until_ns, and the engine's next step.
 *
 * Checked, in working-set mode (the default; the engine's capacity is
 * answered so that only a few sessions fit) and in reference mode:
 * - every turn is admitted exactly once and every lease released (with the
 *   engine's report); the gate's counters agree;
 * - attempts slept and were woken through the descriptor (in working-set
 *   mode the poll fallback is 30 s, so every wake-up is a targeted one);
 * - a session retrying while its old attempt sleeps: the old attempt is
 *   woken through the descriptor and ends KVGATE_PREEMPTED;
 * - kvgate_attempt_cancel on a sleeping attempt (the client went away)
 *   counts in the stats' cancelled, and the cancelled attempt takes no step;
 * - kvgate_attempt_end counts a sleeping attempt its host preempted as
 *   preempted and one whose probe hung as timed out, not as cancelled;
 * - misuse (an answer to a step not asked, a step after the end, NULL
 *   arguments, a callback waker asked for its descriptor) returns
 *   KVGATE_OUT_OF_ORDER or KVGATE_INVALID_ARGUMENT with a message;
 * - the process has exactly one thread while many attempts sleep;
 * - in working-set mode, prefill costs engine steps (as it does on a real
 *   engine), so holding sessions out pays: the gate reports holding and no
 *   admission for running cold paying.
 *
 * The last line is "c event loop: N checks passed". Run by
 * scripts/ffi-examples.sh plain, under valgrind and with ASan+UBSan.
 */
#define _POSIX_C_SOURCE 200809L

#include <kvgate.h>

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

/* Counted, not checked one by one: the hot path of the loop. */
#define MUST(cond)                                                                \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "%s:%d: MUST failed: %s\n  last error: %s\n",         \
                    __FILE__, __LINE__, #cond, kvgate_last_error());              \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

static double wall_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A bug hangs the loop for this long, not forever. */
#define PATIENCE_SEC 120.0

/* Threads of this process, from /proc/self/status (Linux). */
static int thread_count(void) {
    char line[256];
    int threads = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (f == NULL) {
        return -1;
    }
    while (fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "Threads: %d", &threads) == 1) {
            break;
        }
    }
    fclose(f);
    return threads;
}

/* ------------------------------------------------------------------ */
/* The toy engine: a KV model, turns that run for a few steps, and    */
/* probe RPCs answered a few steps after they were asked              */
/* ------------------------------------------------------------------ */

#define MAX_SESSIONS 64
#define MAX_TURNS 4
#define MAX_RPCS (4 * MAX_SESSIONS)
#define ENGINE_STEP_NS 1000000ull /* the engine steps every millisecond while busy */
#define OUTPUT_TOKENS 64
/* Prefill costs steps: a turn's uncached prompt tokens take this many per
   step on top of its run steps, and the capacity answer tells the gate this
   rate. (An engine whose prefill were free would gain nothing by holding
   sessions out, and the working set would rightly stop doing it.) */
#define PREFILL_TOKENS_PER_STEP 16
#define PREFILL_TOKENS_PER_SEC ((double)PREFILL_TOKENS_PER_STEP * 1e9 / (double)ENGINE_STEP_NS)

enum rpc_kind { RPC_USAGE, RPC_PREFIX };

typedef struct {
    int session;
    uint32_t gen;      /* which attempt of the session asked */
    int kind;
    size_t prompt_len; /* for the prefix probe */
    unsigned long due; /* the engine step that answers it */
} rpc;

/*
 * Usage is the share of KV held by running turns (as vLLM counts it); a
 * finished turn's prompt and output stay cached until least-recently-used
 * eviction needs the room.
 */
typedef struct {
    size_t capacity;
    size_t running;
    size_t resident[MAX_SESSIONS];
    unsigned long last_used[MAX_SESSIONS];
    unsigned long step;       /* engine steps taken */
    uint64_t next_step_ns;    /* gate clock */
    rpc rpcs[MAX_RPCS];
    int nrpcs;
    unsigned long usage_answers;
    unsigned long prefix_answers;
    unsigned long stale_answers; /* the asking attempt had gone: dropped */
} engine;

static void engine_ask(engine *e, int session, uint32_t gen, int kind, size_t prompt_len) {
    rpc *r;
    MUST(e->nrpcs < MAX_RPCS);
    r = &e->rpcs[e->nrpcs++];
    r->session = session;
    r->gen = gen;
    r->kind = kind;
    r->prompt_len = prompt_len;
    r->due = e->step + 2 + (unsigned long)(session % 3); /* an RPC takes 2-4 steps */
}

static double engine_usage(const engine *e) {
    double u = (double)e->running / (double)e->capacity;
    return u > 1.0 ? 1.0 : u;
}

static double engine_hit(const engine *e, int s, size_t prompt_len) {
    size_t hit = e->resident[s] < prompt_len ? e->resident[s] : prompt_len;
    return prompt_len == 0 ? 0.0 : (double)hit / (double)prompt_len;
}

static void engine_finish(engine *e, int s, size_t prompt_len) {
    size_t cached = 0;
    e->running -= prompt_len;
    e->resident[s] = prompt_len + OUTPUT_TOKENS;
    e->last_used[s] = e->step;
    for (int i = 0; i < MAX_SESSIONS; i++) {
        cached += e->resident[i];
    }
    while (cached > e->capacity) {
        int lru = -1;
        for (int i = 0; i < MAX_SESSIONS; i++) {
            if (i != s && e->resident[i] > 0 &&
                (lru < 0 || e->last_used[i] < e->last_used[lru])) {
                lru = i;
            }
        }
        if (lru < 0) {
            break;
        }
        cached -= e->resident[lru];
        e->resident[lru] = 0;
    }
}

/* ------------------------------------------------------------------ */
/* Sessions driven by the loop                                        */
/* ------------------------------------------------------------------ */

enum state { S_THINKING, S_PROBING, S_SLEEPING, S_RUNNING, S_DONE };

typedef struct {
    char id[16];
    size_t id_len;
    int turn;
    int state;
    kvgate_attempt *attempt; /* the current attempt, while it has not ended */
    uint32_t gen;            /* attempts begun: the tag's low half */
    kvgate_step step;
    size_t prompt_len;
    uint64_t lease;
    unsigned long run_until;   /* engine step at which the running turn ends */
    unsigned long think_until; /* engine step at which the next turn begins */
    kvgate_attempt *old;       /* the attempt a retry preempted, until it ends */
    uint32_t old_gen;
    int admitted[MAX_TURNS];
} session;

typedef struct {
    const char *name;
    int mode;          /* kvgate_admission_mode */
    int sessions;
    int turns;
    size_t capacity;   /* the engine's KV tokens */
    double poll_sec;   /* wait_poll_sec: the fallback wake-up of a sleeping attempt */
    double grace_sec;
    unsigned long run_steps; /* engine steps a turn runs, at least */
} scenario;

typedef struct {
    const scenario *sc;
    kvgate_gate *gate;
    kvgate_waker *waker;
    int fd;
    engine eng;
    session s[MAX_SESSIONS];
    int done;
    int running;
    int max_running;
    int sleeping;
    int max_sleeping;
    int threads_while_sleeping; /* Threads: when the most attempts slept */
    unsigned long fd_wakes;     /* kvgate_attempt_wake after its tag came through the fd */
    unsigned long fd_wakes_moved_on; /* ... whose next step was not another sleep */
    unsigned long timer_wakes;  /* kvgate_attempt_wake after until_ns passed */
    unsigned long stale_tags;   /* tags of attempts that were not sleeping */
    unsigned long ticks;
    unsigned long polls;
    int misuse_done;
    int ended_misuse_done;
    int preempt_done;     /* 1: retry begun, 2: old attempt ended PREEMPTED */
    int preempted_session;
    int cancel_done;
    int cancelled_session;
} loop;

static uint64_t tag_of(int idx, uint32_t gen) { return ((uint64_t)(uint32_t)idx << 32) | gen; }

static size_t prompt_len_of(int idx, int turn) {
    /* The agent's history grows every turn. */
    return 480 + 160 * (size_t)turn + 16 * (size_t)(idx % 4);
}

static uint64_t now_ns(loop *l) {
    uint64_t t;
    MUST(kvgate_now_ns(l->gate, &t) == KVGATE_OK);
    return t;
}

static void set_sleeping(loop *l, session *s, int on) {
    if (on && s->state != S_SLEEPING) {
        l->sleeping++;
        if (l->sleeping > l->max_sleeping) {
            l->max_sleeping = l->sleeping;
            l->threads_while_sleeping = thread_count();
        }
    } else if (!on && s->state == S_SLEEPING) {
        l->sleeping--;
    }
}

/* Acts on the attempt's newest step. */
static void on_step(loop *l, int idx) {
    session *s = &l->s[idx];
    const kvgate_step *st = &s->step;
    switch (st->kind) {
    case KVGATE_STEP_PROBE_USAGE:
        set_sleeping(l, s, 0);
        s->state = S_PROBING;
        engine_ask(&l->eng, idx, s->gen, RPC_USAGE, 0);
        break;
    case KVGATE_STEP_PROBE_PREFIX:
        MUST(l->sc->mode == KVGATE_ADMISSION_MODE_REFERENCE);
        set_sleeping(l, s, 0);
        s->state = S_PROBING;
        engine_ask(&l->eng, idx, s->gen, RPC_PREFIX, s->prompt_len);
        break;
    case KVGATE_STEP_SLEEP:
        MUST(st->until_ns > 0);
        set_sleeping(l, s, 1);
        s->state = S_SLEEPING;
        break;
    case KVGATE_STEP_ADMITTED:
        set_sleeping(l, s, 0);
        MUST(st->admission.lease != KVGATE_NO_LEASE);
        MUST(s->admitted[s->turn] == 0); /* exactly once per turn */
        s->admitted[s->turn]++;
        s->lease = st->admission.lease;
        if (!l->ended_misuse_done) {
            l->ended_misuse_done = 1;
            /* The attempt has ended: it takes no more steps. */
            kvgate_step next;
            CHECK_STATUS(kvgate_attempt_wake(s->attempt, &next), KVGATE_OUT_OF_ORDER);
            CHECK_LAST_ERROR("has ended");
            CHECK_STATUS(kvgate_attempt_answer_usage(s->attempt, 0.5, 0, 0, 0.0, &next),
                         KVGATE_OUT_OF_ORDER);
            CHECK_STATUS(kvgate_attempt_cancel(s->attempt), KVGATE_OK); /* a no-op now */
        }
        kvgate_attempt_free(s->attempt); /* the lease stays valid */
        s->attempt = NULL;
        s->state = S_RUNNING;
        l->eng.running += s->prompt_len;
        {
            size_t resident = l->eng.resident[idx];
            size_t uncached = s->prompt_len - (resident < s->prompt_len ? resident : s->prompt_len);
            s->run_until = l->eng.step + l->sc->run_steps + (unsigned long)(idx % 3) +
                           (unsigned long)((uncached + PREFILL_TOKENS_PER_STEP - 1) /
                                           PREFILL_TOKENS_PER_STEP);
        }
        l->running++;
        if (l->running > l->max_running) {
            l->max_running = l->running;
        }
        break;
    case KVGATE_STEP_FAILED:
    default:
        fprintf(stderr, "%s: session %s turn %d failed: %s (%s)\n", l->sc->name, s->id,
                s->turn, kvgate_status_str(st->status), kvgate_last_error());
        exit(1);
    }
}

static void begin_turn(loop *l, int idx) {
    session *s = &l->s[idx];
    s->gen++;
    s->prompt_len = prompt_len_of(idx, s->turn);
    MUST(kvgate_attempt_begin(l->gate, (const uint8_t *)s->id, s->id_len, s->prompt_len, -1,
                              l->waker, tag_of(idx, s->gen), &s->attempt,
                              &s->step) == KVGATE_OK);
    on_step(l, idx);
}

/* Misuse of a live, sleeping attempt and of the API: refused, nothing changes. */
static void check_misuse(loop *l, session *s) {
    kvgate_step next;
    kvgate_attempt *a = NULL;
    kvgate_waker *cb = NULL;
    size_t n = 0;

    CHECK_STATUS(kvgate_attempt_answer_usage(s->attempt, 0.1, 0, 0, 0.0, &next),
                 KVGATE_OUT_OF_ORDER);
    CHECK_LAST_ERROR("kvgate_attempt_wake");
    CHECK_STATUS(kvgate_attempt_answer_prefix(s->attempt, 1.0, &next), KVGATE_OUT_OF_ORDER);
    CHECK_LAST_ERROR(s->id);
    CHECK_STATUS(kvgate_attempt_wake(s->attempt, NULL), KVGATE_INVALID_ARGUMENT);
    CHECK(strlen(kvgate_last_error()) > 0);
    CHECK_STATUS(kvgate_attempt_wake(NULL, &next), KVGATE_INVALID_ARGUMENT);
    CHECK_STATUS(kvgate_attempt_cancel(NULL), KVGATE_INVALID_ARGUMENT);
    kvgate_attempt_free(NULL); /* a no-op */
    CHECK_STATUS(kvgate_attempt_begin(l->gate, (const uint8_t *)"x", 1, 10, -1, NULL, 0, &a,
                                      &next),
                 KVGATE_INVALID_ARGUMENT);
    CHECK_LAST_ERROR("waker");
    CHECK(a == NULL); /* out-parameters are written only on success */
    CHECK_STATUS(kvgate_attempt_begin(l->gate, NULL, 3, 10, -1, l->waker, 0, &a, &next),
                 KVGATE_INVALID_ARGUMENT);
    CHECK_LAST_ERROR("session_id");
    CHECK_STATUS(kvgate_waker_drain(l->waker, NULL, 4, &n), KVGATE_INVALID_ARGUMENT);
    CHECK_LAST_ERROR("tags");
    CHECK_STATUS(kvgate_waker_fd(l->waker, NULL), KVGATE_INVALID_ARGUMENT);
    CHECK_STATUS(kvgate_tick(l->gate, NULL, NULL), KVGATE_INVALID_ARGUMENT);
    CHECK_STATUS(kvgate_waker_new_callback(NULL, NULL, &cb), KVGATE_INVALID_ARGUMENT);
    CHECK(cb == NULL);
    /* The attempt still sleeps: the misuse changed nothing. */
    CHECK(s->state == S_SLEEPING && s->attempt != NULL);
    printf("%s: misuse refused (out_of_order, invalid_argument) with messages\n", l->sc->name);
}

/* A gate running the seed's table, polling every 30 s (the checks below
 * step attempts by hand; no poll comes due while they run). */
static kvgate_gate *reference_gate(void) {
    kvgate_config *config = kvgate_config_new();
    kvgate_gate *gate = NULL;
    CHECK(config != NULL);
    CHECK_STATUS(kvgate_config_set_admission_mode(config, KVGATE_ADMISSION_MODE_REFERENCE),
                 KVGATE_OK);
    CHECK_STATUS(kvgate_config_set_wait_poll_sec(config, 30.0), KVGATE_OK);
    CHECK_STATUS(kvgate_new(config, &gate), KVGATE_OK);
    kvgate_config_free(config);
    return gate;
}

static void on_wake_callback(void *user_data, uint64_t tag) {
    /* Runs under gate locks: only enqueue. */
    uint64_t *last = user_data;
    *last = tag;
}

/* A callback waker: no descriptor, no drain; a sleeping attempt that a
   newer one preempts is called back with its tag at once (here from inside
   the newer kvgate_attempt_begin, on this thread). */
static void check_callback_waker(void) {
    kvgate_gate *gate = NULL;
    kvgate_waker *cb = NULL;
    kvgate_attempt *older = NULL;
    kvgate_attempt *newer = NULL;
    kvgate_step step;
    uint64_t last = 0;
    uint64_t tags[2];
    size_t n = 0;
    int32_t fd = -1;
    const uint8_t *id = (const uint8_t *)"agent-cb";

    gate = reference_gate();

    CHECK_STATUS(kvgate_waker_new_callback(on_wake_callback, &last, &cb), KVGATE_OK);
    CHECK_STATUS(kvgate_waker_fd(cb, &fd), KVGATE_INVALID_ARGUMENT);
    CHECK_LAST_ERROR("callback");
    CHECK(fd == -1);
    CHECK_STATUS(kvgate_waker_drain(cb, tags, 2, &n), KVGATE_INVALID_ARGUMENT);
    /* Under pressure (usage 0.99 >= 0.85) with nothing resident: it sleeps. */
    CHECK_STATUS(kvgate_attempt_begin(gate, id, 8, 100, -1, cb, 7, &older, &step), KVGATE_OK);
    CHECK(step.kind == KVGATE_STEP_PROBE_USAGE);
    CHECK_STATUS(kvgate_attempt_answer_usage(older, 0.99, 0, 0, 0.0, &step), KVGATE_OK);
    CHECK(step.kind == KVGATE_STEP_PROBE_PREFIX);
    CHECK_STATUS(kvgate_attempt_answer_prefix(older, 0.0, &step), KVGATE_OK);
    CHECK(step.kind == KVGATE_STEP_SLEEP && step.sleep_ns > 0);
    CHECK(last == 0);
    CHECK_STATUS(kvgate_attempt_begin(gate, id, 8, 100, -1, cb, 8, &newer, &step), KVGATE_OK);
    CHECK(last == 7);
    CHECK_STATUS(kvgate_attempt_wake(older, &step), KVGATE_OK);
    CHECK(step.kind == KVGATE_STEP_FAILED && step.status == KVGATE_PREEMPTED);
    kvgate_attempt_free(older);
    kvgate_attempt_free(newer); /* abandoned while probing: cancelled */
    kvgate_waker_free(cb);      /* after its attempts */
    {
        kvgate_stats st;
        CHECK_STATUS(kvgate_get_stats(gate, &st, sizeof st), KVGATE_OK);
        CHECK(st.preempted == 1 && st.cancelled == 1 && st.pending_attempts == 0);
    }
    kvgate_free(gate);
    printf("callback waker: no descriptor; the preempted sleeper's tag came through the "
           "callback\n");
}

/* The engine takes one step: answers due RPCs, ends turns whose time came. */
static void engine_step(loop *l) {
    engine *e = &l->eng;
    int kept = 0;
    e->step++;
    for (int i = 0; i < e->nrpcs; i++) {
        rpc r = e->rpcs[i];
        session *s = &l->s[r.session];
        if (r.due > e->step) {
            e->rpcs[kept++] = r;
            continue;
        }
        if (s->attempt == NULL || s->gen != r.gen || s->state != S_PROBING) {
            e->stale_answers++; /* asked by an attempt cancelled or preempted since */
            continue;
        }
        if (r.kind == RPC_USAGE) {
            e->usage_answers++;
            MUST(s->step.kind == KVGATE_STEP_PROBE_USAGE);
            /* Working-set admission reads the capacity; reference mode ignores it. */
            MUST(kvgate_attempt_answer_usage(s->attempt, engine_usage(e), e->capacity, 16,
                                             PREFILL_TOKENS_PER_SEC, &s->step) == KVGATE_OK);
        } else {
            e->prefix_answers++;
            MUST(s->step.kind == KVGATE_STEP_PROBE_PREFIX);
            MUST(kvgate_attempt_answer_prefix(s->attempt, engine_hit(e, r.session, r.prompt_len),
                                              &s->step) == KVGATE_OK);
        }
        on_step(l, r.session);
    }
    e->nrpcs = kept;
    for (int i = 0; i < l->sc->sessions; i++) {
        session *s = &l->s[i];
        if (s->state == S_RUNNING && s->run_until <= e->step) {
            int64_t cached = (int64_t)(s->prompt_len < e->resident[i] ? s->prompt_len
                                                                      : e->resident[i]);
            engine_finish(e, i, s->prompt_len);
            MUST(kvgate_release_with_report(l->gate, s->lease, cached, OUTPUT_TOKENS) ==
                 KVGATE_OK);
            /* Released exactly once: a second release is refused. */
            MUST(kvgate_release(l->gate, s->lease) == KVGATE_UNKNOWN_LEASE);
            s->lease = KVGATE_NO_LEASE;
            l->running--;
            s->turn++;
            if (s->turn == l->sc->turns) {
                s->state = S_DONE;
                l->done++;
            } else {
                s->state = S_THINKING; /* a tool call between turns */
                s->think_until = e->step + (unsigned long)(i % 4);
            }
        }
    }
}

static int engine_busy(const loop *l) {
    if (l->eng.nrpcs > 0 || l->running > 0) {
        return 1;
    }
    for (int i = 0; i < l->sc->sessions; i++) {
        if (l->s[i].state == S_THINKING) {
            return 1;
        }
    }
    return 0;
}

/* A tag came through the descriptor. */
static void on_tag(loop *l, uint64_t tag) {
    int idx = (int)(tag >> 32);
    uint32_t gen = (uint32_t)tag;
    session *s;
    MUST(idx >= 0 && idx < l->sc->sessions);
    s = &l->s[idx];
    if (s->old != NULL && gen == s->old_gen) {
        /* The attempt a retry replaced: woken at once, it ends preempted. */
        kvgate_step step;
        MUST(kvgate_attempt_wake(s->old, &step) == KVGATE_OK);
        CHECK(step.kind == KVGATE_STEP_FAILED);
        CHECK(step.status == KVGATE_PREEMPTED);
        kvgate_attempt_free(s->old);
        s->old = NULL;
        l->preempt_done = 2;
        l->fd_wakes++;
        return;
    }
    if (gen != s->gen || s->state != S_SLEEPING) {
        l->stale_tags++; /* duplicated, or the attempt moved on: ignore */
        return;
    }
    MUST(kvgate_attempt_wake(s->attempt, &s->step) == KVGATE_OK);
    l->fd_wakes++;
    if (s->step.kind != KVGATE_STEP_SLEEP) {
        l->fd_wakes_moved_on++;
    }
    on_step(l, idx);
}

/* The scripted events: misuse, a retry that preempts, a cancel. */
static void scripted(loop *l) {
    if (l->sleeping < 2) {
        return;
    }
    for (int i = 0; i < l->sc->sessions; i++) {
        session *s = &l->s[i];
        if (s->state != S_SLEEPING) {
            continue;
        }
        if (!l->misuse_done) {
            check_misuse(l, s);
            l->misuse_done = 1;
        } else if (!l->preempt_done) {
            /* The client retried the turn while its attempt slept. */
            s->old = s->attempt;
            s->old_gen = s->gen;
            set_sleeping(l, s, 0);
            s->state = S_THINKING;
            begin_turn(l, i);
            l->preempt_done = 1;
            l->preempted_session = i;
        } else if (!l->cancel_done && i != l->preempted_session) {
            /* The client went away: cancel; it reconnects and the turn is begun again. */
            kvgate_step step;
            CHECK_STATUS(kvgate_attempt_cancel(s->attempt), KVGATE_OK);
            CHECK_STATUS(kvgate_attempt_wake(s->attempt, &step), KVGATE_OUT_OF_ORDER);
            CHECK_LAST_ERROR("has ended");
            kvgate_attempt_free(s->attempt);
            s->attempt = NULL;
            set_sleeping(l, s, 0);
            s->state = S_THINKING;
            l->cancel_done = 1;
            l->cancelled_session = i;
            begin_turn(l, i);
        }
    }
}

static void run(const scenario *sc) {
    loop *l = calloc(1, sizeof *l);
    kvgate_config *config = kvgate_config_new();
    kvgate_stats st;
    double start = wall_sec();
    uint64_t tags[16];
    CHECK(l != NULL && config != NULL);
    l->sc = sc;
    CHECK_STATUS(kvgate_config_set_admission_mode(config, (uint32_t)sc->mode), KVGATE_OK);
    CHECK_STATUS(kvgate_config_set_wait_poll_sec(config, sc->poll_sec), KVGATE_OK);
    CHECK_STATUS(kvgate_config_set_idle_grace_sec(config, sc->grace_sec), KVGATE_OK);
    CHECK_STATUS(kvgate_new(config, &l->gate), KVGATE_OK);
    kvgate_config_free(config);
    CHECK_STATUS(kvgate_waker_new(&l->waker), KVGATE_OK);
    {
        int32_t fd = -1;
        CHECK_STATUS(kvgate_waker_fd(l->waker, &fd), KVGATE_OK);
        CHECK(fd >= 0);
        l->fd = fd;
    }
    l->eng.capacity = sc->capacity;
    for (int i = 0; i < sc->sessions; i++) {
        session *s = &l->s[i];
        s->id_len = (size_t)snprintf(s->id, sizeof s->id, "agent-%d", i);
        s->state = S_THINKING;
    }
    l->eng.next_step_ns = now_ns(l);

    while (l->done < sc->sessions || l->s[l->preempted_session].old != NULL) {
        uint64_t until_ns, sleep_ns, now, wait_ns = UINT64_MAX;
        struct pollfd pfd;
        int timeout_ms, rc;

        if (wall_sec() - start > PATIENCE_SEC) {
            fprintf(stderr, "%s: stuck: %d of %d sessions done, %d sleeping, %d rpcs\n",
                    sc->name, l->done, sc->sessions, l->sleeping, l->eng.nrpcs);
            exit(1);
        }
        /* Sessions whose tool call ended begin their turn. */
        for (int i = 0; i < sc->sessions; i++) {
            if (l->s[i].state == S_THINKING && l->s[i].think_until <= l->eng.step) {
                begin_turn(l, i);
            }
        }
        scripted(l);

        /* The gate's timer: fire what is due, learn when to come back. */
        MUST(kvgate_tick(l->gate, &until_ns, &sleep_ns) == KVGATE_OK);
        l->ticks++;
        now = now_ns(l);
        wait_ns = sleep_ns;
        for (int i = 0; i < sc->sessions; i++) {
            const session *s = &l->s[i];
            if (s->state == S_SLEEPING) {
                uint64_t left = s->step.until_ns > now ? s->step.until_ns - now : 0;
                wait_ns = left < wait_ns ? left : wait_ns;
            }
        }
        if (engine_busy(l)) {
            uint64_t left = l->eng.next_step_ns > now ? l->eng.next_step_ns - now : 0;
            wait_ns = left < wait_ns ? left : wait_ns;
        }
        if (wait_ns == UINT64_MAX) {
            timeout_ms = 1000; /* nothing pending: the patience check above decides */
        } else {
            uint64_t ms = (wait_ns + 999999) / 1000000; /* round up: never spin early */
            timeout_ms = ms > 1000 ? 1000 : (int)ms;
        }

        pfd.fd = l->fd;
        pfd.events = POLLIN;
        pfd.revents = 0;
        rc = poll(&pfd, 1, timeout_ms);
        l->polls++;
        MUST(rc >= 0 || errno == EINTR);
        if (rc > 0 && (pfd.revents & POLLIN)) {
            size_t n;
            do {
                MUST(kvgate_waker_drain(l->waker, tags, sizeof tags / sizeof tags[0], &n) ==
                     KVGATE_OK);
                for (size_t k = 0; k < n; k++) {
                    on_tag(l, tags[k]);
                }
            } while (n == sizeof tags / sizeof tags[0]);
        }

        /* Attempts whose until_ns passed (the poll fallback or a timeout). */
        now = now_ns(l);
        for (int i = 0; i < sc->sessions; i++) {
            session *s = &l->s[i];
            if (s->state == S_SLEEPING && s->step.until_ns <= now) {
                MUST(kvgate_attempt_wake(s->attempt, &s->step) == KVGATE_OK);
                l->timer_wakes++;
                on_step(l, i);
            }
        }
        /* The engine steps in the same loop. */
        if (engine_busy(l) && now >= l->eng.next_step_ns) {
            engine_step(l);
            l->eng.next_step_ns = now + ENGINE_STEP_NS;
        }
    }

    /* Every turn admitted exactly once, every lease released. */
    for (int i = 0; i < sc->sessions; i++) {
        int once = 1;
        for (int t = 0; t < sc->turns; t++) {
            once = once && l->s[i].admitted[t] == 1;
        }
        CHECK(once);
        CHECK(l->s[i].attempt == NULL && l->s[i].old == NULL);
    }
    CHECK(l->running == 0 && l->sleeping == 0 && l->eng.nrpcs == 0);
    CHECK_STATUS(kvgate_get_stats(l->gate, &st, sizeof st), KVGATE_OK);
    CHECK(st.size == sizeof st);
    CHECK(st.admissions == (uint64_t)(sc->sessions * sc->turns));
    CHECK(st.releases == st.admissions);
    CHECK(st.active_leases == 0);
    CHECK(st.pending_attempts == 0 && st.waiting_attempts == 0);
    /* One retry and one re-begin after the cancel: two extra attempts. */
    if (st.attempts != st.admissions + 2) { /* say what went astray before failing */
        fprintf(stderr, "%s: attempts=%llu admissions=%llu preempted=%llu cancelled=%llu\n",
                sc->name, (unsigned long long)st.attempts, (unsigned long long)st.admissions,
                (unsigned long long)st.preempted, (unsigned long long)st.cancelled);
    }
    CHECK(st.attempts == st.admissions + 2);
    CHECK(st.usage_probe_calls == l->eng.usage_answers);
    CHECK(st.prefix_probe_calls == l->eng.prefix_answers);
    /* Waits happened and were ended through the descriptor. */
    CHECK(st.waits > 0);
    /* The longest wait is one of them: no longer than all of them. */
    CHECK(st.longest_wait_sec > 0.0 && st.longest_wait_sec <= st.wait_sec);
    CHECK(l->max_sleeping >= 4);
    CHECK(l->fd_wakes_moved_on > 0);
    /* The retry preempted the sleeping attempt; the cancel was counted. */
    CHECK(l->preempt_done == 2);
    CHECK(st.preempted == 1);
    CHECK(l->cancel_done == 1);
    CHECK(st.cancelled == 1);
    {
        kvgate_session_stats ss;
        session *p = &l->s[l->preempted_session];
        CHECK_STATUS(kvgate_get_session_stats(l->gate, (const uint8_t *)p->id, p->id_len, &ss,
                                              sizeof ss),
                     KVGATE_OK);
        CHECK(ss.num_preempted == 1);
        CHECK(ss.admissions == (uint64_t)sc->turns);
    }
    /* No thread per waiter, no thread at all: the loop is the only one. */
    CHECK(l->threads_while_sleeping == 1);
    CHECK(thread_count() == 1);

    if (sc->mode == KVGATE_ADMISSION_MODE_WORKING_SET) {
        /* Only a few sessions fit the engine's capacity at once. */
        /* The engine's answer. */
        CHECK(st.working_set_capacity_tokens == sc->capacity);
        CHECK(l->max_running < sc->sessions / 4);
        CHECK(st.admissions_fits_working_set > 0);
        /* Prefill is dear next to a turn here: holding sessions out pays,
           and nobody went in for running cold paying. */
        CHECK(st.working_set_holding == 1);
        CHECK(st.admissions_running_cold_pays == 0);
        /* The horizon is at least a turn. */
        CHECK(st.working_set_horizon_turns >= 1);
        CHECK(st.prefix_probe_calls == 0);
        /* With a 30 s poll fallback, every wake-up was a targeted one. */
        CHECK(l->timer_wakes == 0);
        printf("%s: %d sessions x %d turns admitted once each; at most %d running, "
               "%d asleep at once (threads: %d)\n",
               sc->name, sc->sessions, sc->turns, l->max_running, l->max_sleeping,
               l->threads_while_sleeping);
        printf("%s: reasons fits=%llu empty=%llu wait_bound=%llu reserved=%llu "
               "running_cold_pays=%llu; parked=%llu\n",
               sc->name, (unsigned long long)st.admissions_fits_working_set,
               (unsigned long long)st.admissions_empty_working_set,
               (unsigned long long)st.admissions_wait_bound,
               (unsigned long long)st.admissions_reserved_session,
               (unsigned long long)st.admissions_running_cold_pays,
               (unsigned long long)st.working_set_parked);
    } else {
        CHECK(st.prefix_probe_calls > 0);
        /* Under pressure the prefix probe's answers admitted resident sessions. */
        CHECK(st.admissions_resident_prefix + st.admissions_reserved_session > 0);
        printf("%s: %d sessions x %d turns admitted once each; at most %d running, "
               "%d asleep at once (threads: %d)\n",
               sc->name, sc->sessions, sc->turns, l->max_running, l->max_sleeping,
               l->threads_while_sleeping);
        printf("%s: reasons open=%llu reserved=%llu resident=%llu prefix_unavailable=%llu\n",
               sc->name, (unsigned long long)st.admissions_open,
               (unsigned long long)st.admissions_reserved_session,
               (unsigned long long)st.admissions_resident_prefix,
               (unsigned long long)st.admissions_prefix_probe_unavailable);
    }
    printf("%s: waits=%llu woken through the fd %lu times (%lu moved on), by until_ns %lu, "
           "stale tags %lu, stale answers %lu, %lu polls\n",
           sc->name, (unsigned long long)st.waits, l->fd_wakes, l->fd_wakes_moved_on,
           l->timer_wakes, l->stale_tags, l->eng.stale_answers, l->polls);
    printf("%s: retry preempted the sleeping attempt (num_preempted=1), cancel counted "
           "(cancelled=1)\n",
           sc->name);

    CHECK_STATUS(kvgate_close(l->gate), KVGATE_OK);
    {
        kvgate_attempt *a = NULL;
        kvgate_step step;
        CHECK_STATUS(kvgate_attempt_begin(l->gate, (const uint8_t *)"late", 4, 10, -1, l->waker,
                                          0, &a, &step),
                     KVGATE_CLOSED);
        CHECK(a == NULL);
    }
    kvgate_waker_free(l->waker); /* after its attempts, all freed */
    kvgate_free(l->gate);
    free(l);
}

/* kvgate_attempt_end: the host ends an attempt with the outcome it saw, and
   the stats name that cause (not "cancelled"): a retry its proxy preferred
   (PREEMPTED, also the session's num_preempted) while the attempt slept,
   a probe that hung past the attempt's timeout (TIMED_OUT). */
static void check_host_ended_attempts(void) {
    kvgate_gate *gate = NULL;
    kvgate_waker *w = NULL;
    kvgate_attempt *slept = NULL;
    kvgate_attempt *probing = NULL;
    kvgate_step step;
    kvgate_stats st;
    kvgate_session_stats ss;
    const uint8_t *id = (const uint8_t *)"agent-end";

    gate = reference_gate();
    CHECK_STATUS(kvgate_waker_new(&w), KVGATE_OK);

    /* Under pressure with nothing resident: it sleeps; the host preempts it. */
    CHECK_STATUS(kvgate_attempt_begin(gate, id, 9, 100, -1, w, 1, &slept, &step), KVGATE_OK);
    CHECK_STATUS(kvgate_attempt_answer_usage(slept, 0.99, 0, 0, 0.0, &step), KVGATE_OK);
    CHECK_STATUS(kvgate_attempt_answer_prefix(slept, 0.0, &step), KVGATE_OK);
    CHECK(step.kind == KVGATE_STEP_SLEEP);
    CHECK_STATUS(kvgate_attempt_end(slept, KVGATE_CANCELLED), KVGATE_INVALID_ARGUMENT);
    CHECK_LAST_ERROR("KVGATE_PREEMPTED");
    CHECK_STATUS(kvgate_attempt_end(slept, 99), KVGATE_INVALID_ARGUMENT);
    CHECK_STATUS(kvgate_attempt_end(NULL, KVGATE_PREEMPTED), KVGATE_INVALID_ARGUMENT);
    CHECK_STATUS(kvgate_attempt_end(slept, KVGATE_PREEMPTED), KVGATE_OK);
    CHECK_STATUS(kvgate_attempt_wake(slept, &step), KVGATE_OUT_OF_ORDER);
    CHECK_LAST_ERROR("has ended");
    CHECK_STATUS(kvgate_attempt_end(slept, KVGATE_TIMED_OUT), KVGATE_OUT_OF_ORDER);
    kvgate_attempt_free(slept); /* ended: counted nothing more */

    /* Its usage probe never answers: the host ends it at its timeout. */
    CHECK_STATUS(kvgate_attempt_begin(gate, id, 9, 100, 5000, w, 2, &probing, &step), KVGATE_OK);
    CHECK(step.kind == KVGATE_STEP_PROBE_USAGE);
    CHECK_STATUS(kvgate_attempt_end(probing, KVGATE_TIMED_OUT), KVGATE_OK);
    CHECK_STATUS(kvgate_attempt_answer_usage(probing, 0.1, 0, 0, 0.0, &step),
                 KVGATE_OUT_OF_ORDER); /* the late answer */
    kvgate_attempt_free(probing);

    CHECK_STATUS(kvgate_get_stats(gate, &st, sizeof st), KVGATE_OK);
    CHECK(st.preempted == 1 && st.timed_out == 1 && st.cancelled == 0);
    CHECK(st.pending_attempts == 0 && st.waiting_attempts == 0 && st.admissions == 0);
    CHECK_STATUS(kvgate_get_session_stats(gate, id, 9, &ss, sizeof ss), KVGATE_OK);
    CHECK(ss.num_preempted == 1 && ss.timed_out == 1 && ss.cancelled == 0);
    kvgate_free(gate);
    kvgate_waker_free(w);
    printf("host-ended attempts: counted preempted and timed out, not cancelled\n");
}

int main(void) {
    /* Working-set admission (the default): 64 sessions, a capacity where only
       a few fit; the poll fallback is far away so wake-ups must be targeted. */
    static const scenario working_set = {"working_set", KVGATE_ADMISSION_MODE_WORKING_SET,
                                         64, 4, 4096, 30.0, 60.0, 2};
    /* The seed's table: usage watermark and prefix probe, a short poll. */
    static const scenario reference = {"reference", KVGATE_ADMISSION_MODE_REFERENCE,
                                       32, 4, 2048, 0.02, 0.05, 6};
    setvbuf(stdout, NULL, _IOLBF, 0);
    CHECK(strcmp(kvgate_version(), "") != 0);
    run(&working_set);
    run(&reference);
    check_callback_waker();
    check_host_ended_attempts();
    printf("c event loop: %d checks passed\n", checks_passed);
    return 0;
}
