// An engine loop embedding kvgate with kvgate.hpp's event-loop types: one
// thread, epoll on the Waker's descriptor, many agent sessions, and a toy
// engine (ToyEngine from engine.hpp, the KV model) stepping in the same
// loop, which answers the attempts' probes asynchronously: a probe step
// becomes an RPC answered a few engine steps later, as vLLM answers a
// UTILITY call between its steps.
//
// Checks, in working-set mode (capacity answered so that only a few
// sessions fit) and in reference mode: every turn admitted exactly once
// and every lease released (half explicitly with the engine's report, half
// by the Lease destructor); attempts slept and were woken through the
// descriptor; a retry while the old attempt sleeps preempts it; an explicit
// cancel() and an Attempt dropped while it sleeps both count as cancelled;
// misuse throws kvgate::Error with KVGATE_OUT_OF_ORDER / INVALID_ARGUMENT
// and a message; an admitted Attempt whose lease is never taken releases it;
// the process has one thread. The last line is "cpp engine loop: N checks
// passed".
#include "engine.hpp"
#include "kvgate.hpp"
#include "check.hpp"

#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <string>
#include <vector>

namespace {

// Runs `body`, which must throw kvgate::Error with `status` and a message
// containing `fragment`.
template <typename F>
void check_throws(F&& body, kvgate_status status, const char* fragment, int line) {
    try {
        body();
    } catch (const kvgate::Error& e) {
        if (e.status() != status || std::strstr(e.what(), fragment) == nullptr) {
            std::fprintf(stderr, "%s:%d: threw %s \"%s\", expected %s with \"%s\"\n", __FILE__,
                         line, kvgate_status_str(e.status()), e.what(),
                         kvgate_status_str(status), fragment);
            std::exit(1);
        }
        checks_passed++;
        return;
    }
    std::fprintf(stderr, "%s:%d: did not throw (expected %s)\n", __FILE__, line,
                 kvgate_status_str(status));
    std::exit(1);
}
#define CHECK_THROWS(body, status, fragment) check_throws([&] { body; }, status, fragment, __LINE__)

using namespace std::chrono_literals;

int thread_count() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("Threads:", 0) == 0) {
            return std::atoi(line.c_str() + 8);
        }
    }
    return -1;
}

constexpr uint64_t kEngineStepNs = 1000000;  // the engine steps every ms while busy
constexpr uint64_t kOutputTokens = 64;
// Prefill costs steps: a turn's uncached prompt tokens take this many per
// step on top of its run steps, and the capacity answer tells the gate this
// rate. (An engine whose prefill were free would gain nothing by holding
// sessions out, and the working set would rightly stop doing it.)
constexpr size_t kPrefillTokensPerStep = 16;
constexpr double kPrefillTokensPerSec =
    static_cast<double>(kPrefillTokensPerStep) * 1e9 / static_cast<double>(kEngineStepNs);
constexpr double kPatienceSec = 120.0;       // a bug hangs the loop this long, not forever

struct Scenario {
    const char* name;
    kvgate_admission_mode mode;
    int sessions;
    int turns;
    size_t capacity;  // the engine's KV tokens
    double poll_sec;  // the fallback wake-up of a sleeping attempt
    unsigned long run_steps;
};

enum class State { Thinking, Probing, Sleeping, Running, Done };

struct Session {
    std::string id;
    int turn = 0;
    State state = State::Thinking;
    uint32_t gen = 0;  // attempts begun: the tag's low half
    kvgate::Attempt attempt;
    kvgate::Attempt old;  // the attempt a retry preempted, until it ends
    kvgate::Lease lease;
    size_t prompt_len = 0;
    unsigned long run_until = 0;
    unsigned long think_until = 0;
    std::vector<int> admitted;
};

struct Rpc {
    size_t session;
    uint32_t gen;
    bool prefix;
    unsigned long due;  // the engine step that answers it
};

uint64_t tag_of(size_t idx, uint32_t gen) { return (static_cast<uint64_t>(idx) << 32) | gen; }

class EngineLoop {
public:
    explicit EngineLoop(const Scenario& sc)
        : sc_(sc), engine_(std::make_shared<ToyEngine>(sc.capacity)), gate_(config(sc)) {
        sessions_.resize(static_cast<size_t>(sc.sessions));
        for (size_t i = 0; i < sessions_.size(); i++) {
            sessions_[i].id = "agent-" + std::to_string(i);
            sessions_[i].admitted.assign(static_cast<size_t>(sc.turns), 0);
        }
        epoll_ = epoll_create1(EPOLL_CLOEXEC);
        CHECK(epoll_ >= 0);
        epoll_event ev{};
        ev.events = EPOLLIN;  // level-triggered: drain() empties it
        ev.data.u64 = 0;
        CHECK(epoll_ctl(epoll_, EPOLL_CTL_ADD, waker_.fd(), &ev) == 0);
    }
    ~EngineLoop() { close(epoll_); }
    EngineLoop(const EngineLoop&) = delete;
    EngineLoop& operator=(const EngineLoop&) = delete;

    void run();

private:
    static kvgate::Config config(const Scenario& sc) {
        kvgate::Config c;
        c.admission_mode(sc.mode).wait_poll(std::chrono::duration<double>(sc.poll_sec));
        return c;
    }

    size_t prompt_len_of(size_t idx, int turn) const {
        return 480 + 160 * static_cast<size_t>(turn) + 16 * (idx % 4);
    }

    void set_state(Session& s, State next) {
        if (s.state == State::Sleeping && next != State::Sleeping) {
            sleeping_--;
        } else if (s.state != State::Sleeping && next == State::Sleeping) {
            sleeping_++;
            if (sleeping_ > max_sleeping_) {
                max_sleeping_ = sleeping_;
                threads_while_sleeping_ = thread_count();
            }
        }
        s.state = next;
    }

    void begin_turn(size_t idx) {
        Session& s = sessions_[idx];
        s.gen++;
        s.prompt_len = prompt_len_of(idx, s.turn);
        s.attempt = gate_.begin(s.id, s.prompt_len, waker_, tag_of(idx, s.gen));
        on_step(idx);
    }

    void on_step(size_t idx);
    void engine_step();
    void on_tag(uint64_t tag);
    void scripted();
    void check_misuse(Session& s);
    bool engine_busy() const;
    void check_totals();

    const Scenario& sc_;
    std::shared_ptr<ToyEngine> engine_;
    kvgate::Gate gate_;  // probe-free: the loop answers the attempts itself
    kvgate::Waker waker_;
    int epoll_ = -1;
    std::vector<Session> sessions_;
    std::deque<Rpc> rpcs_;
    unsigned long step_ = 0;
    uint64_t next_step_ns_ = 0;
    int done_ = 0, running_ = 0, max_running_ = 0, sleeping_ = 0, max_sleeping_ = 0;
    int threads_while_sleeping_ = -1;
    unsigned long fd_wakes_ = 0, fd_wakes_moved_on_ = 0, timer_wakes_ = 0, stale_tags_ = 0;
    unsigned long usage_answers_ = 0, prefix_answers_ = 0, explicit_releases_ = 0, dropped_ = 0;
    bool misuse_done_ = false, ended_misuse_done_ = false;
    int preempt_ = 0;  // 1: retry begun, 2: the old attempt ended preempted
    size_t preempted_session_ = 0;
    int cancels_ = 0;
};

void EngineLoop::on_step(size_t idx) {
    Session& s = sessions_[idx];
    switch (s.attempt.kind()) {
    case KVGATE_STEP_PROBE_USAGE:
        set_state(s, State::Probing);
        rpcs_.push_back({idx, s.gen, false, step_ + 2 + idx % 3});
        break;
    case KVGATE_STEP_PROBE_PREFIX:
        CHECK(sc_.mode == KVGATE_ADMISSION_MODE_REFERENCE);
        set_state(s, State::Probing);
        rpcs_.push_back({idx, s.gen, true, step_ + 2 + idx % 3});
        break;
    case KVGATE_STEP_SLEEP:
        set_state(s, State::Sleeping);
        break;
    case KVGATE_STEP_ADMITTED: {
        if (s.admitted[static_cast<size_t>(s.turn)]++ != 0) {
            CHECK(!"a turn admitted twice");
        }
        s.lease = s.attempt.take_lease();
        if (!s.lease) {
            CHECK(!"an admission without a lease");
        }
        if (!ended_misuse_done_) {
            ended_misuse_done_ = true;
            CHECK_THROWS(s.attempt.wake(), KVGATE_OUT_OF_ORDER, "has ended");
            CHECK_THROWS(s.attempt.take_lease(), KVGATE_OUT_OF_ORDER, "taken already");
        }
        s.attempt = kvgate::Attempt{};  // ended: freeing it keeps the lease
        set_state(s, State::Running);
        {
            double hit = engine_->prefix_hit_ratio(s.id, nullptr, s.prompt_len).value_or(0.0);
            auto uncached = static_cast<size_t>(static_cast<double>(s.prompt_len) * (1.0 - hit));
            s.run_until = step_ + sc_.run_steps + idx % 3 +
                          (uncached + kPrefillTokensPerStep - 1) / kPrefillTokensPerStep;
        }
        engine_->start(s.prompt_len);
        running_++;
        max_running_ = std::max(max_running_, running_);
        break;
    }
    case KVGATE_STEP_FAILED:
    default:
        std::fprintf(stderr, "%s: %s turn %d failed: %s\n", sc_.name, s.id.c_str(), s.turn,
                     kvgate_status_str(s.attempt.status()));
        std::exit(1);
    }
}

bool EngineLoop::engine_busy() const {
    if (!rpcs_.empty() || running_ > 0) {
        return true;
    }
    for (const Session& s : sessions_) {
        if (s.state == State::Thinking) {
            return true;
        }
    }
    return false;
}

// One engine step: due RPCs answered, turns whose time came finish.
void EngineLoop::engine_step() {
    step_++;
    std::deque<Rpc> later;
    while (!rpcs_.empty()) {
        Rpc r = rpcs_.front();
        rpcs_.pop_front();
        if (r.due > step_) {
            later.push_back(r);
            continue;
        }
        Session& s = sessions_[r.session];
        if (!s.attempt || s.gen != r.gen || s.state != State::Probing) {
            dropped_++;  // the asking attempt was cancelled or preempted since
            continue;
        }
        if (r.prefix) {
            prefix_answers_++;
            s.attempt.answer_prefix(engine_->prefix_hit_ratio(s.id, nullptr, s.prompt_len));
        } else {
            usage_answers_++;
            kvgate::EngineCapacity cap{sc_.capacity, 16, kPrefillTokensPerSec};
            s.attempt.answer_usage(engine_->kv_cache_usage(s.id), cap);
        }
        on_step(r.session);
    }
    rpcs_ = std::move(later);
    for (size_t i = 0; i < sessions_.size(); i++) {
        Session& s = sessions_[i];
        if (s.state != State::Running || s.run_until > step_) {
            continue;
        }
        double hit = engine_->prefix_hit_ratio(s.id, nullptr, s.prompt_len).value_or(0.0);
        engine_->finish(s.id, s.prompt_len);
        if (i % 2 == 0) {
            kvgate_status st = s.lease.release_with_report(
                static_cast<uint64_t>(hit * static_cast<double>(s.prompt_len)), kOutputTokens);
            if (st != KVGATE_OK) {
                CHECK(!"release_with_report failed");
            }
            explicit_releases_++;
        } else {
            s.lease = kvgate::Lease{};  // the move-assignment released the old one
        }
        if (s.lease) {
            CHECK(!"a released Lease still holds its handle");
        }
        running_--;
        s.turn++;
        if (s.turn == sc_.turns) {
            set_state(s, State::Done);
            done_++;
        } else {
            set_state(s, State::Thinking);  // a tool call between turns
            s.think_until = step_ + i % 4;
        }
    }
}
// A tag came through the descriptor.
void EngineLoop::on_tag(uint64_t tag) {
    size_t idx = static_cast<size_t>(tag >> 32);
    auto gen = static_cast<uint32_t>(tag);
    CHECK(idx < sessions_.size());
    Session& s = sessions_[idx];
    if (s.old && s.old.tag() == tag) {
        // The attempt the retry replaced: woken at once, it ends preempted.
        s.old.wake();
        CHECK(s.old.kind() == KVGATE_STEP_FAILED);
        CHECK(s.old.status() == KVGATE_PREEMPTED);
        s.old = kvgate::Attempt{};
        preempt_ = 2;
        fd_wakes_++;
        return;
    }
    if (gen != s.gen || s.state != State::Sleeping) {
        stale_tags_++;  // repeated, or the attempt moved on: ignore
        return;
    }
    s.attempt.wake();
    fd_wakes_++;
    if (!s.attempt.sleeping()) {
        fd_wakes_moved_on_++;
    }
    on_step(idx);
}

// Misuse of a live, sleeping attempt: refused with a message, nothing changes.
void EngineLoop::check_misuse(Session& s) {
    CHECK_THROWS(s.attempt.answer_usage(0.1), KVGATE_OUT_OF_ORDER, "kvgate_attempt_wake");
    CHECK_THROWS(s.attempt.answer_prefix(1.0), KVGATE_OUT_OF_ORDER, s.id.c_str());
    CHECK_THROWS(s.attempt.take_lease(), KVGATE_OUT_OF_ORDER, "holds no lease");
    kvgate::Attempt moved = std::move(s.attempt);
    CHECK(!s.attempt && moved);
    CHECK_THROWS(s.attempt.wake(), KVGATE_INVALID_ARGUMENT, "attempt");  // a moved-from Attempt
    s.attempt = std::move(moved);
    CHECK(s.attempt.sleeping() && s.state == State::Sleeping);
    std::printf("%s: misuse threw kvgate::Error (out_of_order, invalid_argument) with messages\n",
                sc_.name);
}

// The scripted events: misuse, a retry that preempts, a cancel(), a drop.
void EngineLoop::scripted() {
    if (sleeping_ < 4) {
        return;
    }
    for (size_t i = 0; i < sessions_.size(); i++) {
        Session& s = sessions_[i];
        if (s.state != State::Sleeping) {
            continue;
        }
        if (!misuse_done_) {
            check_misuse(s);
            misuse_done_ = true;
        } else if (preempt_ == 0) {
            // The client retried while its attempt slept: the new attempt
            // preempts the old, whose tag then comes through the descriptor.
            s.old = std::move(s.attempt);
            set_state(s, State::Thinking);
            begin_turn(i);
            preempt_ = 1;
            preempted_session_ = i;
        } else if (cancels_ == 0 && i != preempted_session_) {
            // The client went away: cancel(); it comes back and begins again.
            s.attempt.cancel();
            CHECK_THROWS(s.attempt.wake(), KVGATE_OUT_OF_ORDER, "has ended");
            set_state(s, State::Thinking);
            cancels_ = 1;
            begin_turn(i);  // the move-assignment frees the cancelled attempt
        } else if (cancels_ == 1 && i != preempted_session_) {
            // Dropped while asleep: the destructor cancels it.
            s.attempt = kvgate::Attempt{};
            set_state(s, State::Thinking);
            cancels_ = 2;
            begin_turn(i);
        }
    }
}

void EngineLoop::run() {
    auto start = std::chrono::steady_clock::now();
    std::vector<uint64_t> tags;
    next_step_ns_ = gate_.now_ns();
    while (done_ < sc_.sessions || sessions_[preempted_session_].old) {
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
            kPatienceSec) {
            std::fprintf(stderr, "%s: stuck: %d of %d sessions done, %d sleeping\n", sc_.name,
                         done_, sc_.sessions, sleeping_);
            std::exit(1);
        }
        for (size_t i = 0; i < sessions_.size(); i++) {
            if (sessions_[i].state == State::Thinking && sessions_[i].think_until <= step_) {
                begin_turn(i);
            }
        }
        scripted();

        // One timeout: the gate's timer, the sleepers' until_ns, the engine's next step.
        kvgate::Timer timer = gate_.tick();
        uint64_t now = gate_.now_ns();
        uint64_t wait_ns = timer.sleep_ns;
        for (const Session& s : sessions_) {
            if (s.state == State::Sleeping) {
                wait_ns = std::min(wait_ns, s.attempt.until_ns() > now ? s.attempt.until_ns() - now : 0);
            }
        }
        if (engine_busy()) {
            wait_ns = std::min(wait_ns, next_step_ns_ > now ? next_step_ns_ - now : 0);
        }
        int timeout_ms = wait_ns == UINT64_MAX
                             ? 1000
                             : static_cast<int>(std::min<uint64_t>((wait_ns + 999999) / 1000000, 1000));

        epoll_event events[4];
        int n = epoll_wait(epoll_, events, 4, timeout_ms);
        if (n < 0 && errno != EINTR) {
            CHECK(!"epoll_wait failed");
        }
        if (n > 0) {
            tags.clear();
            waker_.drain(tags);
            for (uint64_t tag : tags) {
                on_tag(tag);
            }
        }
        now = gate_.now_ns();
        for (size_t i = 0; i < sessions_.size(); i++) {
            Session& s = sessions_[i];
            if (s.state == State::Sleeping && s.attempt.until_ns() <= now) {
                s.attempt.wake();  // its poll fallback (or timeout) came
                timer_wakes_++;
                on_step(i);
            }
        }
        if (engine_busy() && now >= next_step_ns_) {
            engine_step();
            next_step_ns_ = now + kEngineStepNs;
        }
    }
    check_totals();
}

void EngineLoop::check_totals() {
    for (const Session& s : sessions_) {
        bool once = true;
        for (int a : s.admitted) {
            once = once && a == 1;
        }
        CHECK(once);
        CHECK(!s.attempt && !s.old && !s.lease);
    }
    CHECK(running_ == 0 && sleeping_ == 0 && rpcs_.empty());
    kvgate_stats st = gate_.stats();
    auto turns = static_cast<uint64_t>(sc_.sessions * sc_.turns);
    CHECK(st.admissions == turns);
    CHECK(st.releases == turns && st.active_leases == 0);
    CHECK(explicit_releases_ > 0 && explicit_releases_ < turns);  // the rest by ~Lease
    CHECK(st.pending_attempts == 0 && st.waiting_attempts == 0);
    CHECK(st.attempts == turns + 3);  // the retry, and a new begin after each cancel
    CHECK(st.usage_probe_calls == usage_answers_);
    CHECK(st.prefix_probe_calls == prefix_answers_);
    CHECK(st.waits > 0 && max_sleeping_ >= 4 && fd_wakes_moved_on_ > 0);
    CHECK(preempt_ == 2 && st.preempted == 1);
    CHECK(cancels_ == 2 && st.cancelled == 2);  // cancel() and a dropped Attempt
    auto ps = gate_.session_stats(sessions_[preempted_session_].id);
    CHECK(ps && ps->num_preempted == 1);
    CHECK(threads_while_sleeping_ == 1);
    CHECK(thread_count() == 1);
    if (sc_.mode == KVGATE_ADMISSION_MODE_WORKING_SET) {
        CHECK(st.working_set_capacity_tokens > 0 && st.working_set_capacity_tokens <= sc_.capacity);
        CHECK(max_running_ < sc_.sessions / 4);
        CHECK(st.admissions_fits_working_set > 0 && st.prefix_probe_calls == 0);
        CHECK(timer_wakes_ == 0);  // a 30 s poll fallback: every wake-up was targeted
    } else {
        CHECK(st.prefix_probe_calls > 0);
    }
    std::printf("%s: %d sessions x %d turns admitted once each; at most %d running, %d asleep "
                "at once (threads: %d)\n",
                sc_.name, sc_.sessions, sc_.turns, max_running_, max_sleeping_,
                threads_while_sleeping_);
    std::printf("%s: waits=%llu woken through epoll %lu times (%lu moved on), by until_ns %lu, "
                "stale tags %lu, dropped answers %lu\n",
                sc_.name, static_cast<unsigned long long>(st.waits), fd_wakes_, fd_wakes_moved_on_,
                timer_wakes_, stale_tags_, dropped_);
    std::printf("%s: retry preempted the sleeper (num_preempted=1); cancel() and a dropped "
                "Attempt counted (cancelled=2); leases released %lu with report, %llu by ~Lease\n",
                sc_.name, explicit_releases_,
                static_cast<unsigned long long>(turns - explicit_releases_));
}

// An admitted Attempt whose lease is never taken releases it; a closed gate
// gives an Attempt that failed with KVGATE_CLOSED.
void raii_attempt() {
    kvgate::Config config;
    config.admission_mode(KVGATE_ADMISSION_MODE_REFERENCE);
    kvgate::Gate gate(config);
    kvgate::Waker waker;
    {
        kvgate::Attempt a = gate.begin("agent-raii", 100, waker, 1);
        CHECK(a.kind() == KVGATE_STEP_PROBE_USAGE);
        a.answer_usage(0.1);  // below the watermark: admitted "open"
        CHECK(a.kind() == KVGATE_STEP_ADMITTED && a.step().admission.reason == KVGATE_REASON_OPEN);
        CHECK(gate.stats().active_leases == 1);
    }
    kvgate_stats st = gate.stats();
    CHECK(st.active_leases == 0 && st.releases == 1);
    {
        // The same with the prompt's token ids (what working-set admission sketches).
        const std::vector<uint32_t> ids(100, 7);
        kvgate::Attempt a = gate.begin_with_prompt("agent-ids", ids, waker, 3);
        CHECK(a.kind() == KVGATE_STEP_PROBE_USAGE);
        a.answer_usage(0.1);
        CHECK(a.kind() == KVGATE_STEP_ADMITTED && a.step().admission.reason == KVGATE_REASON_OPEN);
    }
    CHECK(gate.stats().releases == 2);
    gate.close();
    kvgate::Attempt late = gate.begin("agent-raii", 100, waker, 2);
    CHECK(late.kind() == KVGATE_STEP_FAILED && late.status() == KVGATE_CLOSED);
    std::printf("raii: an untaken lease released by ~Attempt; closed gate -> %s\n",
                kvgate_status_str(late.status()));
}

// The engine's host tier: a refused answer throws and changes nothing
// (the attempt answers again), a refused tier report keeps the lease held
// (it releases again), and the gate counts both refusals.
void tier() {
    kvgate::Gate gate{kvgate::Config{}};
    kvgate::Waker waker;
    kvgate::Attempt a = gate.begin("agent-tier", 100, waker, 1);
    // A tier smaller than the GPU cache, then a reload rate that is no rate.
    CHECK_THROWS(a.answer_usage(0.1, {1000, 16, 0.0, 500, 1e5}), KVGATE_INVALID_ARGUMENT,
                 "smaller than the GPU cache");
    CHECK_THROWS(a.answer_usage(0.1, {1000, 16, 0.0, 4000, -1.0}), KVGATE_INVALID_ARGUMENT,
                 "reload rate");
    CHECK(a.kind() == KVGATE_STEP_PROBE_USAGE);
    a.answer_usage(0.1, {1000, 16, 0.0, 4000, 1e5});
    CHECK(a.kind() == KVGATE_STEP_ADMITTED);
    kvgate::Lease lease = a.take_lease();
    CHECK(lease.release_with_tier_report(100, 10, 101) == KVGATE_INVALID_ARGUMENT);
    CHECK(lease && gate.stats().active_leases == 1);
    CHECK(lease.release_with_tier_report(100, 10, 60) == KVGATE_OK);
    CHECK(!lease);
    // A tier told, then none: refused (a tier is fixed while the engine runs).
    kvgate::Attempt b = gate.begin("agent-tier", 100, waker, 2);
    CHECK_THROWS(b.answer_usage(0.1, {1000, 16, 0.0}), KVGATE_INVALID_ARGUMENT, "none now");
    b.answer_usage(0.1, {1000, 16, 0.0, 4000, 1e5});
    CHECK(b.kind() == KVGATE_STEP_ADMITTED);
    kvgate_stats st = gate.stats();
    CHECK(st.working_set_tier_tokens == 4000 && st.working_set_refused_answers == 4 &&
          st.working_set_tier_cached_tokens == 60);
    std::printf("tier: refused answers threw and changed nothing (refused_answers=%llu), "
                "a refused report kept its lease\n",
                static_cast<unsigned long long>(st.working_set_refused_answers));
}

}  // namespace

int main() {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    try {
        // Working-set admission (the default): only a few of 48 sessions fit.
        const Scenario working_set{"working_set", KVGATE_ADMISSION_MODE_WORKING_SET, 48, 4, 4096,
                                   30.0, 2};
        // The seed's table: usage watermark and prefix probe, a short poll.
        const Scenario reference{"reference", KVGATE_ADMISSION_MODE_REFERENCE, 32, 4, 2048, 0.02, 6};
        EngineLoop(working_set).run();
        EngineLoop(reference).run();
        raii_attempt();
        tier();
    } catch (const kvgate::Error& e) {
        std::fprintf(stderr, "unexpected kvgate::Error: %s\n", e.what());
        return 1;
    }
    std::printf("cpp engine loop: %d checks passed\n", checks_passed);
    return 0;
}
