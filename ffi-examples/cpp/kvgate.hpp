// kvgate.hpp: a header-only C++17 wrapper over the kvgate C ABI (kvgate.h).
//
// - kvgate::Gate is a shared handle (copies share one gate, as in Rust);
//   the gate is freed when the last copy and the last Lease are gone.
// - kvgate::Lease is move-only and releases its lease in its destructor, so
//   no code path (early return, exception) leaks an admission. A Lease keeps
//   its gate alive.
// - Errors: an admission that did not happen (preempted, timed out,
//   cancelled, closed) is an ordinary outcome in an agent proxy (retries
//   preempt older attempts all the time), so Gate::acquire returns an
//   Acquired result to test, not an exception. Misuse and setup errors
//   (invalid configuration, invalid arguments, a kvgate panic) throw
//   kvgate::Error, which carries the status and kvgate_last_error().
// - Probes are a C++ interface; exceptions thrown by a probe are caught at
//   the C boundary and count as "unavailable" (nothing unwinds through C).
// - Event loops: kvgate::Waker owns a wake descriptor (poll/epoll it, then
//   drain()); Gate::begin gives a move-only kvgate::Attempt that the loop
//   drives step by step (answer_usage, answer_prefix, wake) and whose
//   destructor frees it, cancelling it if it has not ended; an admitted
//   Attempt hands over its Lease with take_lease() (if never taken, the
//   Attempt's destructor releases it). A step the attempt did not ask for
//   throws Error with KVGATE_OUT_OF_ORDER; a failed attempt (preempted,
//   timed out, cancelled, closed) is an ordinary step, not an exception.
//
// Everything here is inline (the header is included by several translation
// units of one program). Thread-safety is the C API's: a Gate may be used
// from any number of threads; a Config or a Lease from one at a time.
#ifndef KVGATE_HPP
#define KVGATE_HPP

#include <kvgate.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvgate {

/// A failed call that is a bug or a setup error: status and message.
class Error : public std::runtime_error {
public:
    Error(kvgate_status status, const std::string& message)
        : std::runtime_error(message), status_(status) {}
    kvgate_status status() const noexcept { return status_; }

private:
    kvgate_status status_;
};

namespace detail {

inline void check(kvgate_status status) {
    if (status != KVGATE_OK) {
        throw Error(status, std::string(kvgate_status_str(status)) + ": " + kvgate_last_error());
    }
}

inline const uint8_t* bytes(std::string_view s) noexcept {
    return reinterpret_cast<const uint8_t*>(s.data());
}

}  // namespace detail

/// The name of a status or reason ("preempted", "resident_prefix", ...).
inline std::string_view to_string(kvgate_status status) noexcept {
    return kvgate_status_str(status);
}
inline std::string_view to_string(kvgate_reason reason) noexcept {
    return kvgate_reason_str(reason);
}

/// The configuration builder; setters throw Error on values the gate refuses.
class Config {
public:
    Config() : raw_(kvgate_config_new()) {
        if (!raw_) {
            throw std::bad_alloc();
        }
    }
    Config& admission_mode(kvgate_admission_mode mode) {
        detail::check(kvgate_config_set_admission_mode(raw_.get(), mode));
        return *this;
    }
    Config& high_watermark(double v) {
        detail::check(kvgate_config_set_high_watermark(raw_.get(), v));
        return *this;
    }
    Config& hit_threshold(double v) {
        detail::check(kvgate_config_set_hit_threshold(raw_.get(), v));
        return *this;
    }
    Config& wait_poll(std::chrono::duration<double> d) {
        detail::check(kvgate_config_set_wait_poll_sec(raw_.get(), d.count()));
        return *this;
    }
    Config& idle_grace(std::chrono::duration<double> d) {
        detail::check(kvgate_config_set_idle_grace_sec(raw_.get(), d.count()));
        return *this;
    }
    Config& session_retention(std::chrono::duration<double> d) {
        detail::check(kvgate_config_set_session_retention_sec(raw_.get(), d.count()));
        return *this;
    }
    const kvgate_config* get() const noexcept { return raw_.get(); }

private:
    struct Free {
        void operator()(kvgate_config* c) const noexcept { kvgate_config_free(c); }
    };
    std::unique_ptr<kvgate_config, Free> raw_;
};

/// The engine probes. Called on the acquiring threads, possibly on many at
/// once, never under a gate lock; std::nullopt (or an exception) means
/// unavailable.
class Probes {
public:
    virtual ~Probes() = default;
    virtual std::optional<double> kv_cache_usage(std::string_view session) = 0;
    virtual std::optional<double> prefix_hit_ratio(std::string_view session,
                                                   const uint32_t* prompt,
                                                   size_t prompt_len) = 0;
};

namespace detail {

inline bool usage_trampoline(void* user_data, const uint8_t* id, size_t id_len,
                             double* out) noexcept {
    try {
        auto* probes = static_cast<Probes*>(user_data);
        auto answer = probes->kv_cache_usage({reinterpret_cast<const char*>(id), id_len});
        if (!answer) {
            return false;
        }
        *out = *answer;
        return true;
    } catch (...) {
        return false;  // nothing may unwind into C
    }
}

inline bool prefix_trampoline(void* user_data, const uint8_t* id, size_t id_len,
                              const uint32_t* prompt, size_t prompt_len, double* out) noexcept {
    try {
        auto* probes = static_cast<Probes*>(user_data);
        auto answer = probes->prefix_hit_ratio({reinterpret_cast<const char*>(id), id_len},
                                               prompt, prompt_len);
        if (!answer) {
            return false;
        }
        *out = *answer;
        return true;
    } catch (...) {
        return false;
    }
}

/// Owns the C gate and the probes it calls. Member order matters: the
/// gate is freed (after which no probe runs) before the probes are destroyed.
class GateState {
public:
    GateState(const Config& config, std::shared_ptr<Probes> probes) : probes_(std::move(probes)) {
        // Probes live on the C builder; this wrapper's Config stays probe-free,
        // so they are set for kvgate_new (which copies them) and cleared again.
        kvgate_config* builder = const_cast<kvgate_config*>(config.get());
        if (probes_) {
            check(kvgate_config_set_probes(builder, usage_trampoline, prefix_trampoline,
                                           probes_.get()));
        }
        kvgate_gate* raw = nullptr;
        kvgate_status status = kvgate_new(config.get(), &raw);
        check(kvgate_config_set_probes(builder, nullptr, nullptr, nullptr));
        check(status);
        raw_.reset(raw);
    }
    kvgate_gate* get() const noexcept { return raw_.get(); }

private:
    struct Free {
        void operator()(kvgate_gate* g) const noexcept { kvgate_free(g); }
    };
    std::shared_ptr<Probes> probes_;
    std::unique_ptr<kvgate_gate, Free> raw_;
};

}  // namespace detail

/// One admitted turn. Release it as soon as the engine is done (or let the
/// destructor do it). Move-only; a moved-from Lease holds nothing.
class Lease {
public:
    Lease() noexcept = default;
    Lease(Lease&& other) noexcept
        : gate_(std::move(other.gate_)), admission_(other.admission_) {
        other.admission_.lease = KVGATE_NO_LEASE;
    }
    Lease& operator=(Lease&& other) noexcept {
        if (this != &other) {
            release();
            gate_ = std::move(other.gate_);
            admission_ = other.admission_;
            other.admission_.lease = KVGATE_NO_LEASE;
        }
        return *this;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { release(); }

    /// Releases now; a no-op for an empty Lease. Returns the C status.
    kvgate_status release() noexcept {
        if (admission_.lease == KVGATE_NO_LEASE || !gate_) {
            return KVGATE_UNKNOWN_LEASE;
        }
        kvgate_status status = kvgate_release(gate_->get(), admission_.lease);
        admission_.lease = KVGATE_NO_LEASE;
        gate_.reset();
        return status;
    }

    /// Releases now with what the engine reported of the turn (the prompt
    /// tokens served from its prefix cache, the tokens generated; nullopt
    /// for unknown): working-set admission learns from them. A no-op for
    /// an empty Lease. Returns the C status.
    kvgate_status release_with_report(std::optional<uint64_t> cached_tokens,
                                      std::optional<uint64_t> output_tokens) noexcept {
        if (admission_.lease == KVGATE_NO_LEASE || !gate_) {
            return KVGATE_UNKNOWN_LEASE;
        }
        auto c_figure = [](std::optional<uint64_t> v) {
            return v ? static_cast<int64_t>(*v) : int64_t{-1};
        };
        kvgate_status status = kvgate_release_with_report(
            gate_->get(), admission_.lease, c_figure(cached_tokens), c_figure(output_tokens));
        admission_.lease = KVGATE_NO_LEASE;
        gate_.reset();
        return status;
    }

    /// release_with_report with, of the cached tokens, those the engine's
    /// host tier served (nullopt: unknown). A report that contradicts
    /// itself (tier hits over the cached tokens, or with them unknown)
    /// returns KVGATE_INVALID_ARGUMENT and keeps the lease held: release
    /// it again. A no-op for an empty Lease. Returns the C status.
    kvgate_status release_with_tier_report(std::optional<uint64_t> cached_tokens,
                                           std::optional<uint64_t> output_tokens,
                                           std::optional<uint64_t> tier_cached_tokens) noexcept {
        if (admission_.lease == KVGATE_NO_LEASE || !gate_) {
            return KVGATE_UNKNOWN_LEASE;
        }
        auto c_figure = [](std::optional<uint64_t> v) {
            return v ? static_cast<int64_t>(*v) : int64_t{-1};
        };
        kvgate_status status = kvgate_release_with_tier_report(
            gate_->get(), admission_.lease, c_figure(cached_tokens), c_figure(output_tokens),
            c_figure(tier_cached_tokens));
        if (status == KVGATE_INVALID_ARGUMENT) {
            return status;  // refused: still held
        }
        admission_.lease = KVGATE_NO_LEASE;
        gate_.reset();
        return status;
    }

    explicit operator bool() const noexcept { return admission_.lease != KVGATE_NO_LEASE; }
    uint64_t handle() const noexcept { return admission_.lease; }
    const kvgate_admission& admission() const noexcept { return admission_; }
    kvgate_reason reason() const noexcept { return admission_.reason; }

private:
    friend class Gate;
    friend class Attempt;
    Lease(std::shared_ptr<detail::GateState> gate, const kvgate_admission& admission) noexcept
        : gate_(std::move(gate)), admission_(admission) {}

    std::shared_ptr<detail::GateState> gate_;
    kvgate_admission admission_{KVGATE_NO_LEASE, KVGATE_REASON_OPEN, 0.0, 0.0, 0.0, false, false};
};

/// What Gate::acquire gives: a lease, or why there is none.
struct Acquired {
    kvgate_status status = KVGATE_OK;  // KVGATE_OK, PREEMPTED, TIMED_OUT, CANCELLED or CLOSED
    Lease lease;                       // holds the lease iff status == KVGATE_OK
    std::string error;                 // kvgate_last_error() when status != KVGATE_OK
    explicit operator bool() const noexcept { return status == KVGATE_OK; }
};

/// A wake channel for event-loop attempts: one descriptor per loop (an
/// eventfd on Linux), readable when attempts have something to look at.
/// Move-only. Attempts begun with it keep the C waker alive, so it may be
/// destroyed before them (stop polling its descriptor first).
class Waker {
public:
    Waker() {
        kvgate_waker* raw = nullptr;
        detail::check(kvgate_waker_new(&raw));
        raw_.reset(raw);
    }

    /// The descriptor to poll for readability; owned by the waker.
    int fd() const {
        int32_t fd = -1;
        detail::check(kvgate_waker_fd(raw_.get(), &fd));
        return fd;
    }

    /// Appends every waiting tag to `out` (oldest first) and returns how
    /// many; the descriptor is unreadable afterwards unless new tags came.
    /// Tags may repeat or belong to attempts that moved on: ignore those.
    size_t drain(std::vector<uint64_t>& out) const {
        uint64_t buf[64];
        size_t total = 0;
        size_t n = 0;
        do {
            detail::check(kvgate_waker_drain(raw_.get(), buf, sizeof buf / sizeof buf[0], &n));
            out.insert(out.end(), buf, buf + n);
            total += n;
        } while (n == sizeof buf / sizeof buf[0]);
        return total;
    }

    const kvgate_waker* get() const noexcept { return raw_.get(); }

private:
    struct Free {
        void operator()(kvgate_waker* w) const noexcept { kvgate_waker_free(w); }
    };
    std::unique_ptr<kvgate_waker, Free> raw_;
};

/// What the engine says of its KV capacity with a usage answer (0: unknown),
/// and of its host tier of KV (tier_tokens 0: none; all 0: cannot say).
struct EngineCapacity {
    uint64_t tokens = 0;
    uint32_t block_tokens = 0;
    double prefill_tokens_per_sec = 0.0;
    uint64_t tier_tokens = 0;
    double reload_tokens_per_sec = 0.0;
};

/// An attempt to be admitted, driven by the host's event loop step by step
/// (Gate::begin). Move-only; the destructor frees it, cancelling it if it
/// has not ended, and releases a lease it was admitted with and that was
/// never taken. Keeps its gate alive. One thread at a time.
class Attempt {
public:
    Attempt() noexcept = default;
    Attempt(Attempt&& other) noexcept
        : gate_(std::move(other.gate_)), raw_(std::exchange(other.raw_, nullptr)),
          step_(other.step_), tag_(other.tag_), lease_(std::move(other.lease_)) {}
    Attempt& operator=(Attempt&& other) noexcept {
        if (this != &other) {
            reset();
            gate_ = std::move(other.gate_);
            raw_ = std::exchange(other.raw_, nullptr);
            step_ = other.step_;
            tag_ = other.tag_;
            lease_ = std::move(other.lease_);
        }
        return *this;
    }
    Attempt(const Attempt&) = delete;
    Attempt& operator=(const Attempt&) = delete;
    ~Attempt() { reset(); }

    /// Whether this object holds an attempt (false once moved from).
    explicit operator bool() const noexcept { return gate_ != nullptr; }

    /// The newest step, and its parts.
    const kvgate_step& step() const noexcept { return step_; }
    kvgate_step_kind kind() const noexcept { return step_.kind; }
    bool sleeping() const noexcept { return step_.kind == KVGATE_STEP_SLEEP; }
    bool ended() const noexcept {
        return step_.kind == KVGATE_STEP_ADMITTED || step_.kind == KVGATE_STEP_FAILED;
    }
    /// KVGATE_STEP_FAILED: why (PREEMPTED, TIMED_OUT, CANCELLED, CLOSED).
    kvgate_status status() const noexcept { return step_.status; }
    /// KVGATE_STEP_SLEEP: wake it by then at the latest (gate clock, ns).
    uint64_t until_ns() const noexcept { return step_.until_ns; }
    uint64_t tag() const noexcept { return tag_; }

    /// Answers KVGATE_STEP_PROBE_USAGE (nullopt: unavailable), tier
    /// included (kvgate_attempt_answer_usage_tiered). Throws Error
    /// (KVGATE_OUT_OF_ORDER) if that is not the step, and Error
    /// (KVGATE_INVALID_ARGUMENT) for a tier the gate refuses: then nothing
    /// changed, and the attempt still waits for its usage answer.
    const kvgate_step& answer_usage(std::optional<double> usage, EngineCapacity capacity = {}) {
        kvgate_step next{};
        detail::check(kvgate_attempt_answer_usage_tiered(
            raw_, usage ? *usage : std::numeric_limits<double>::quiet_NaN(), capacity.tokens,
            capacity.block_tokens, capacity.prefill_tokens_per_sec, capacity.tier_tokens,
            capacity.reload_tokens_per_sec, &next));
        return advance(next);
    }

    /// Answers KVGATE_STEP_PROBE_PREFIX (nullopt: unavailable).
    const kvgate_step& answer_prefix(std::optional<double> hit_ratio) {
        kvgate_step next{};
        detail::check(kvgate_attempt_answer_prefix(
            raw_, hit_ratio ? *hit_ratio : std::numeric_limits<double>::quiet_NaN(), &next));
        return advance(next);
    }

    /// After KVGATE_STEP_SLEEP: its tag came, or until_ns() passed.
    const kvgate_step& wake() {
        kvgate_step next{};
        detail::check(kvgate_attempt_wake(raw_, &next));
        return advance(next);
    }

    /// Gives up on the turn (counted as cancelled); a no-op once ended. The
    /// attempt takes no more steps; step() still shows the last one.
    void cancel() { detail::check(kvgate_attempt_cancel(raw_)); }

    /// After KVGATE_STEP_ADMITTED: the lease, once. Throws Error
    /// (KVGATE_OUT_OF_ORDER) otherwise.
    Lease take_lease() {
        if (!lease_) {
            throw Error(KVGATE_OUT_OF_ORDER, "Attempt::take_lease: the attempt holds no lease "
                                             "(not admitted, or taken already)");
        }
        return std::move(lease_);
    }

private:
    friend class Gate;
    Attempt(std::shared_ptr<detail::GateState> gate, kvgate_attempt* raw, const kvgate_step& step,
            uint64_t tag) noexcept
        : gate_(std::move(gate)), raw_(raw), step_(step), tag_(tag) {
        adopt_lease();
    }

    const kvgate_step& advance(const kvgate_step& next) noexcept {
        step_ = next;
        adopt_lease();
        return step_;
    }

    void adopt_lease() noexcept {
        if (step_.kind == KVGATE_STEP_ADMITTED) {
            lease_ = Lease(gate_, step_.admission);
        }
    }

    void reset() noexcept {
        kvgate_attempt_free(raw_);  // cancels it if it has not ended; NULL is a no-op
        raw_ = nullptr;
        lease_.release();  // an admission nobody took is released, not leaked
        gate_.reset();
    }

    std::shared_ptr<detail::GateState> gate_;
    kvgate_attempt* raw_ = nullptr;
    kvgate_step step_{KVGATE_STEP_FAILED, KVGATE_INVALID_ARGUMENT, 0, 0,
                      {KVGATE_NO_LEASE, KVGATE_REASON_OPEN, 0.0, 0.0, 0.0, false, false}};
    uint64_t tag_ = 0;
    Lease lease_;
};

/// When to call Gate::tick again (both UINT64_MAX: nothing pending).
struct Timer {
    uint64_t until_ns = UINT64_MAX;  // gate clock
    uint64_t sleep_ns = UINT64_MAX;  // from now
    bool pending() const noexcept { return until_ns != UINT64_MAX; }
};

/// The admission gate: a shared, thread-safe handle.
class Gate {
public:
    explicit Gate(const Config& config, std::shared_ptr<Probes> probes = nullptr)
        : state_(std::make_shared<detail::GateState>(config, std::move(probes))) {}

    /// Blocks until the turn is admitted, or until it is preempted, times
    /// out (`timeout`; none waits without limit), is cancelled or the gate
    /// closes. Throws Error only for misuse (or a kvgate panic).
    Acquired acquire(std::string_view session, const std::vector<uint32_t>& prompt,
                     std::optional<std::chrono::milliseconds> timeout = std::nullopt) const {
        kvgate_admission admission{};
        int64_t timeout_ms = timeout ? static_cast<int64_t>(timeout->count()) : -1;
        if (timeout_ms < 0 && timeout) {
            timeout_ms = 0;  // a negative duration has passed already
        }
        kvgate_status status =
            kvgate_acquire(state_->get(), detail::bytes(session), session.size(), prompt.data(),
                           prompt.size(), timeout_ms, &admission);
        Acquired result;
        result.status = status;
        switch (status) {
        case KVGATE_OK:
            result.lease = Lease(state_, admission);
            break;
        case KVGATE_PREEMPTED:
        case KVGATE_TIMED_OUT:
        case KVGATE_CANCELLED:
        case KVGATE_CLOSED:
            result.error = kvgate_last_error();
            break;
        default:
            detail::check(status);
        }
        return result;
    }

    /// Begins an event-loop attempt for a turn with a prompt of
    /// `prompt_len` tokens; `waker` delivers `tag` while it sleeps. A closed
    /// gate gives an Attempt already failed with KVGATE_CLOSED. Throws
    /// Error only for misuse. A host that has the prompt's token ids should
    /// prefer `begin_with_prompt`.
    Attempt begin(std::string_view session, size_t prompt_len, const Waker& waker, uint64_t tag,
                  std::optional<std::chrono::milliseconds> timeout = std::nullopt) const {
        return begin_attempt(tag, timeout, [&](int64_t timeout_ms, kvgate_attempt** raw, kvgate_step* step) {
            return kvgate_attempt_begin(state_->get(), detail::bytes(session), session.size(),
                                        prompt_len, timeout_ms, waker.get(), tag, raw, step);
        });
    }

    /// `begin` with the prompt's token ids: working-set admission sketches
    /// them, to learn the prefix sessions share when the engine reports no
    /// cached tokens.
    Attempt begin_with_prompt(std::string_view session, const std::vector<uint32_t>& prompt,
                              const Waker& waker, uint64_t tag,
                              std::optional<std::chrono::milliseconds> timeout = std::nullopt) const {
        return begin_attempt(tag, timeout, [&](int64_t timeout_ms, kvgate_attempt** raw, kvgate_step* step) {
            return kvgate_attempt_begin_with_prompt(state_->get(), detail::bytes(session), session.size(),
                                                    prompt.data(), prompt.size(), timeout_ms, waker.get(),
                                                    tag, raw, step);
        });
    }

    /// The gate's timer: fires what is due, says when to come back. Call it
    /// after each drain and each release the loop makes.
    Timer tick() const {
        Timer t;
        detail::check(kvgate_tick(state_->get(), &t.until_ns, &t.sleep_ns));
        return t;
    }

    /// The gate's clock (the time base of until_ns), ns.
    uint64_t now_ns() const {
        uint64_t now = 0;
        detail::check(kvgate_now_ns(state_->get(), &now));
        return now;
    }

    /// Ends the session's ownership window; its final figures, or nullopt
    /// if the session was not tracked.
    std::optional<kvgate_session_stats> finish_session(std::string_view session) const {
        return session_call(kvgate_finish_session, session);
    }

    /// Cancels the session's waiting attempt; whether there was one.
    bool cancel_session(std::string_view session) const {
        kvgate_status status =
            kvgate_cancel_session(state_->get(), detail::bytes(session), session.size());
        if (status == KVGATE_NOT_FOUND) {
            return false;
        }
        detail::check(status);
        return true;
    }

    std::optional<kvgate_session_stats> session_stats(std::string_view session) const {
        return session_call(kvgate_get_session_stats, session);
    }

    kvgate_stats stats() const {
        kvgate_stats out{};
        detail::check(kvgate_get_stats(state_->get(), &out, sizeof out));
        return out;
    }

    /// Prometheus text; sized by the library, retried if it grew meanwhile.
    std::string metrics_text() const {
        size_t needed = 0;
        kvgate_status status = kvgate_metrics_text(state_->get(), nullptr, 0, &needed);
        std::vector<char> buf;
        while (status == KVGATE_BUFFER_TOO_SMALL) {
            buf.resize(needed + 64);
            status = kvgate_metrics_text(state_->get(), buf.data(), buf.size(), &needed);
        }
        detail::check(status);
        return std::string(buf.data(), needed - 1);
    }

    /// Attempts in progress return KVGATE_CLOSED; leases stay valid.
    void close() const { detail::check(kvgate_close(state_->get())); }

private:
    /// The begin calls' shared part: `call` makes the C call with the
    /// timeout in milliseconds (`< 0` none); a closed gate gives an Attempt
    /// already failed with KVGATE_CLOSED.
    template <typename Call>
    Attempt begin_attempt(uint64_t tag, std::optional<std::chrono::milliseconds> timeout,
                          Call call) const {
        kvgate_attempt* raw = nullptr;
        kvgate_step step{};
        int64_t timeout_ms = timeout ? static_cast<int64_t>(timeout->count()) : -1;
        if (timeout_ms < 0 && timeout) {
            timeout_ms = 0;
        }
        kvgate_status status = call(timeout_ms, &raw, &step);
        if (status == KVGATE_CLOSED) {
            step = kvgate_step{};
            step.kind = KVGATE_STEP_FAILED;
            step.status = KVGATE_CLOSED;
            return Attempt(state_, nullptr, step, tag);
        }
        detail::check(status);
        return Attempt(state_, raw, step, tag);
    }

    using SessionFn = kvgate_status (*)(kvgate_gate*, const uint8_t*, size_t,
                                        kvgate_session_stats*, size_t);

    std::optional<kvgate_session_stats> session_call(SessionFn fn,
                                                     std::string_view session) const {
        kvgate_session_stats out{};
        kvgate_status status =
            fn(state_->get(), detail::bytes(session), session.size(), &out, sizeof out);
        if (status == KVGATE_NOT_FOUND) {
            return std::nullopt;
        }
        detail::check(status);
        return out;
    }

    std::shared_ptr<detail::GateState> state_;
};

}  // namespace kvgate

#endif  // KVGATE_HPP
