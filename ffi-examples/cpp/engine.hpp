// A toy engine for the C++ host: the probes answer from a small KV model.
// Lives in its own translation unit (engine.cpp), which also includes
// kvgate.hpp: a non-inline function in the wrapper would fail to link.
#ifndef KVGATE_EXAMPLE_ENGINE_HPP
#define KVGATE_EXAMPLE_ENGINE_HPP

#include "kvgate.hpp"

#include <atomic>
#include <cstddef>
#include <map>
#include <mutex>
#include <string>

class ToyEngine : public kvgate::Probes {
public:
    explicit ToyEngine(size_t capacity) : capacity_(capacity) {}

    std::optional<double> kv_cache_usage(std::string_view session) override;
    std::optional<double> prefix_hit_ratio(std::string_view session, const uint32_t* prompt,
                                           size_t prompt_len) override;

    void start(size_t prompt_len);                          // a request runs
    void finish(const std::string& session, size_t prompt_len);  // ... and is cached
    void set_running(size_t tokens);
    void set_resident(const std::string& session, size_t tokens);
    void throw_from_probes(bool on) { throwing_ = on; }
    size_t running() const;

private:
    mutable std::mutex lock_;
    size_t capacity_;
    size_t running_ = 0;
    std::map<std::string, size_t, std::less<>> resident_;
    std::atomic<bool> throwing_{false};
};

/// One line describing an admission (also exercises kvgate.hpp from this TU).
std::string describe(const kvgate::Lease& lease);

#endif
