// A std::thread host using the header-only C++17 wrapper kvgate.hpp.
// Checks RAII leases (release on scope exit, moves, a lease outliving its
// Gate object), result-or-exception errors, probe exceptions staying on the
// C++ side, preemption and cancellation across threads, and several agent
// sessions on threads. Exits non-zero on the first failed check; the last
// line is "cpp host: N checks passed".
#include "engine.hpp"
#include "kvgate.hpp"
#include "check.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

constexpr size_t kCapacity = 10000;
constexpr size_t kPressure = 9500;  // usage 0.95 >= watermark 0.85

std::vector<uint32_t> prompt_of(size_t len) {
    std::vector<uint32_t> p(len);
    for (size_t i = 0; i < len; i++) {
        p[i] = static_cast<uint32_t>(i + 1);
    }
    return p;
}

// Polls until n attempts wait; one check, however many polls it takes.
void wait_for_waiting(const kvgate::Gate& gate, uint64_t n) {
    auto start = std::chrono::steady_clock::now();
    while (gate.stats().waiting_attempts != n && std::chrono::steady_clock::now() - start < 60s) {
        std::this_thread::sleep_for(1ms);
    }
    CHECK(gate.stats().waiting_attempts == n);
}

kvgate::Config scenario_config() {
    kvgate::Config config;
    config.admission_mode(KVGATE_ADMISSION_MODE_REFERENCE).wait_poll(30s).idle_grace(60s);
    return config;
}

void config_errors_throw() {
    kvgate::Config config;
    try {
        config.high_watermark(1.5);
        CHECK(false);
    } catch (const kvgate::Error& e) {
        CHECK(e.status() == KVGATE_INVALID_ARGUMENT);
        CHECK(std::strstr(e.what(), "invalid high_watermark: 1.5") != nullptr);
        std::printf("config: refused with \"%s\"\n", e.what());
    }
}

void raii_and_moves() {
    auto engine = std::make_shared<ToyEngine>(kCapacity);
    kvgate::Gate gate(scenario_config(), engine);
    auto prompt = prompt_of(64);
    {
        kvgate::Acquired a = gate.acquire("agent-0", prompt);
        CHECK(a && a.lease && a.lease.reason() == KVGATE_REASON_OPEN);
        CHECK(gate.stats().active_leases == 1);
    }
    CHECK(gate.stats().active_leases == 0 && gate.stats().releases == 1);

    kvgate::Acquired a = gate.acquire("agent-0", prompt);
    kvgate::Lease moved = std::move(a.lease);
    CHECK(!a.lease && moved);
    kvgate::Lease assigned;
    assigned = std::move(moved);
    CHECK(!moved && assigned);
    CHECK(assigned.release() == KVGATE_OK);
    CHECK(assigned.release() == KVGATE_UNKNOWN_LEASE);  // empty now: nothing happens
    CHECK(gate.stats().releases == 2 && gate.stats().active_leases == 0);

    // A lease keeps its gate alive after the last Gate object is gone.
    kvgate::Lease survivor;
    {
        kvgate::Gate short_lived(scenario_config(), engine);
        survivor = std::move(short_lived.acquire("agent-1", prompt).lease);
    }
    CHECK(survivor && survivor.release() == KVGATE_OK);

    // Under pressure a resident prompt goes in and retains the session.
    engine->set_running(kPressure);
    engine->set_resident("agent-2", 64);
    kvgate::Acquired hot = gate.acquire("agent-2", prompt);
    CHECK(hot && hot.lease.reason() == KVGATE_REASON_RESIDENT_PREFIX);
    CHECK(hot.lease.admission().hit_ratio == 1.0);
    std::printf("raii: %s\n", describe(hot.lease).c_str());
    hot.lease.release();
    auto ss = gate.session_stats("agent-2");
    CHECK(ss && ss->in_grace);
    CHECK(gate.finish_session("agent-2").has_value());
    CHECK(!gate.finish_session("agent-2").has_value());
    CHECK(!gate.session_stats("never-seen").has_value());

    // A cold session with a zero timeout: an outcome, not an exception.
    kvgate::Acquired cold = gate.acquire("agent-3", prompt, 0ms);
    CHECK(!cold && cold.status == KVGATE_TIMED_OUT && !cold.lease);
    CHECK(cold.error.find("timeout_ms = 0") != std::string::npos);

    // A probe that throws counts as unavailable: usage unknown, so open.
    engine->throw_from_probes(true);
    kvgate::Acquired blind = gate.acquire("agent-4", prompt);
    CHECK(blind && blind.lease.reason() == KVGATE_REASON_OPEN);
    CHECK(std::isnan(blind.lease.admission().usage));
    engine->throw_from_probes(false);
    CHECK(gate.stats().usage_probe_unavailable == 1);

    std::string metrics = gate.metrics_text();
    CHECK(metrics.find("kvgate_admissions_total{reason=\"resident_prefix\"} 1\n") !=
          std::string::npos);
    CHECK(metrics.size() > 100 && metrics.find('\0') == std::string::npos);
}

void preemption_and_cancel_across_threads() {
    auto engine = std::make_shared<ToyEngine>(kCapacity);
    kvgate::Gate gate(scenario_config(), engine);
    auto prompt = prompt_of(128);
    engine->set_running(kPressure);  // everyone is cold under pressure

    kvgate::Acquired older, newer;
    std::thread t1([&] { older = gate.acquire("retry", prompt); });
    wait_for_waiting(gate, 1);
    std::thread t2([&] { newer = gate.acquire("retry", prompt); });
    t1.join();
    CHECK(older.status == KVGATE_PREEMPTED && !older.lease);
    CHECK(older.error.find("preempted") != std::string::npos);
    wait_for_waiting(gate, 1);
    CHECK(gate.cancel_session("retry"));
    t2.join();
    CHECK(newer.status == KVGATE_CANCELLED);
    CHECK(!gate.cancel_session("retry"));
    CHECK(gate.session_stats("retry")->num_preempted == 1);

    // close() wakes a waiter with KVGATE_CLOSED.
    kvgate::Acquired closed;
    std::thread t3([&] { closed = gate.acquire("late", prompt); });
    wait_for_waiting(gate, 1);
    gate.close();
    t3.join();
    CHECK(closed.status == KVGATE_CLOSED);
    std::printf("threads: older %s, newer %s, waiter after close %s\n",
                std::string(kvgate::to_string(older.status)).c_str(),
                std::string(kvgate::to_string(newer.status)).c_str(),
                std::string(kvgate::to_string(closed.status)).c_str());
}

void agents() {
    constexpr int kAgents = 4;
    constexpr int kTurns = 5;
    auto engine = std::make_shared<ToyEngine>(2048);
    kvgate::Config config;
    config.admission_mode(KVGATE_ADMISSION_MODE_REFERENCE).wait_poll(50ms).idle_grace(500ms);
    kvgate::Gate gate(config, engine);
    std::vector<std::thread> threads;
    std::vector<int> admitted(kAgents, 0);
    for (int i = 0; i < kAgents; i++) {
        threads.emplace_back([&, i] {
            std::string session = "agent-" + std::to_string(i);
            for (int turn = 0; turn < kTurns; turn++) {
                auto prompt = prompt_of(256 * static_cast<size_t>(turn + 1));
                kvgate::Acquired a = gate.acquire(session, prompt, 60s);
                if (!a) {
                    return;
                }
                engine->start(prompt.size());
                std::this_thread::sleep_for(2ms);
                engine->finish(session, prompt.size());
                a.lease.release();  // as soon as the engine returns
                admitted[static_cast<size_t>(i)]++;
                std::this_thread::sleep_for(1ms);  // the tool call
            }
        });
    }
    for (auto& t : threads) {
        t.join();
    }
    kvgate_stats s = gate.stats();
    for (int i = 0; i < kAgents; i++) {
        CHECK(admitted[static_cast<size_t>(i)] == kTurns);
    }
    CHECK(s.admissions == kAgents * kTurns && s.releases == s.admissions);
    CHECK(s.active_leases == 0 && s.pending_attempts == 0 && engine->running() == 0);
    std::printf("agents: %d sessions x %d turns; open=%llu reserved_session=%llu "
                "resident_prefix=%llu; %llu waited\n",
                kAgents, kTurns,
                static_cast<unsigned long long>(s.admissions_open),
                static_cast<unsigned long long>(s.admissions_reserved_session),
                static_cast<unsigned long long>(s.admissions_resident_prefix),
                static_cast<unsigned long long>(s.waits));
}

}  // namespace

int main() {
    std::string version = std::to_string(KVGATE_VERSION_MAJOR) + "." +
                          std::to_string(KVGATE_VERSION_MINOR) + "." +
                          std::to_string(KVGATE_VERSION_PATCH);
    CHECK(version == kvgate_version());
    std::printf("kvgate %s\n", kvgate_version());
    config_errors_throw();
    raii_and_moves();
    preemption_and_cancel_across_threads();
    agents();
    std::printf("cpp host: %d checks passed\n", checks_passed);
    return 0;
}
