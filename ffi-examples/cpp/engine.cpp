#include "engine.hpp"

#include <sstream>
#include <stdexcept>

std::optional<double> ToyEngine::kv_cache_usage(std::string_view) {
    if (throwing_) {
        throw std::runtime_error("engine unreachable");  // caught by the wrapper
    }
    std::lock_guard<std::mutex> guard(lock_);
    double usage = static_cast<double>(running_) / static_cast<double>(capacity_);
    return usage > 1.0 ? 1.0 : usage;
}

std::optional<double> ToyEngine::prefix_hit_ratio(std::string_view session, const uint32_t*,
                                                  size_t prompt_len) {
    std::lock_guard<std::mutex> guard(lock_);
    auto it = resident_.find(session);
    if (it == resident_.end() || prompt_len == 0) {
        return 0.0;
    }
    size_t hit = it->second < prompt_len ? it->second : prompt_len;
    return static_cast<double>(hit) / static_cast<double>(prompt_len);
}

void ToyEngine::start(size_t prompt_len) {
    std::lock_guard<std::mutex> guard(lock_);
    running_ += prompt_len;
}

void ToyEngine::finish(const std::string& session, size_t prompt_len) {
    std::lock_guard<std::mutex> guard(lock_);
    running_ -= prompt_len;
    resident_[session] = prompt_len;
}

void ToyEngine::set_running(size_t tokens) {
    std::lock_guard<std::mutex> guard(lock_);
    running_ = tokens;
}

void ToyEngine::set_resident(const std::string& session, size_t tokens) {
    std::lock_guard<std::mutex> guard(lock_);
    resident_[session] = tokens;
}

size_t ToyEngine::running() const {
    std::lock_guard<std::mutex> guard(lock_);
    return running_;
}

std::string describe(const kvgate::Lease& lease) {
    std::ostringstream out;
    out << "lease " << lease.handle() << " " << kvgate::to_string(lease.reason())
        << (lease.admission().retain_session ? " (retains)" : "");
    return out.str();
}
