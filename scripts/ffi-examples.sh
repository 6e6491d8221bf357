#!/usr/bin/env bash
# Builds the C ABI (release) and runs every host against it: the header
# compiled alone as C99 and C++17, the README's C snippet, the C hosts (plain,
# under valgrind memcheck, and with ASan+UBSan: host.c, event_loop.c and
# promises.c, the header's promises one check each), the C++ host and the Python
# proxy. Each host checks what it does and exits non-zero on failure; this
# script also checks their output. Called by scripts/test.sh; needs cc, c++,
# make, pkg-config, valgrind and python3 (.ci/run installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
out="$root/target/ffi-examples"
mkdir -p "$out"

step() { printf '\n--> %s\n' "$*"; }
fail() { printf 'ffi-examples: %s\n' "$*" >&2; exit 1; }

for tool in cc c++ make pkg-config valgrind python3; do
    command -v "$tool" >/dev/null 2>&1 || fail "$tool is missing (.ci/run installs it)"
done

# Runs a host, keeps its output in $out/<name>.log, and requires every given
# extended regex to match a line of it.
run_and_expect() {
    local name="$1"
    shift
    local patterns=()
    while [[ "$1" != "--" ]]; do
        patterns+=("$1")
        shift
    done
    shift
    local log="$out/$name.log"
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        fail "$name failed"
    fi
    for pattern in "${patterns[@]}"; do
        grep -Eq "$pattern" "$log" || { cat "$log" >&2; fail "$name: no line matches /$pattern/"; }
    done
    grep -E 'checks passed$' "$log" || tail -n 1 "$log"
}

# The C and C++ hosts run plainly, under valgrind memcheck and built with
# ASan/UBSan; these two helpers are the last two ways, for every host.
memcheck=(valgrind --tool=memcheck --leak-check=full --show-leak-kinds=all
    --errors-for-leak-kinds=all --suppressions=ffi-examples/c/valgrind.supp
    --error-exitcode=1)

# run_memcheck NAME BINARY PATTERN... : the host's PATTERNs (its own lines
# and memcheck's verdict) under valgrind, then memcheck's summary lines.
run_memcheck() {
    local name="$1" bin="$2"
    shift 2
    run_and_expect "$name" "$@" 'ERROR SUMMARY: 0 errors' -- "${memcheck[@]}" "$bin"
    grep -E 'lost:|still reachable:|suppressed:|All heap blocks|ERROR SUMMARY' "$out/$name.log" | sed 's/^==[0-9]*== *//'
}

# run_sanitized NAME BINARY PATTERN... : the instrumented host (checked to
# be instrumented) with leak detection, aborting on the first report.
run_sanitized() {
    local name="$1" bin="$2"
    shift 2
    nm "$bin" >"$bin.nm"
    grep -q __asan_init "$bin.nm" || fail "$(basename "$bin") is not instrumented"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        run_and_expect "$name" "$@" -- "$bin"
}

step "cargo build --release --lib, pkg-config files"
cargo build --release --lib
./scripts/gen-pkgconfig.sh release
export PKG_CONFIG_PATH="$root/target/release/pkgconfig"
libdir="$(pkg-config --variable=libdir kvgate)"
strict_c=(-std=c99 -Wall -Wextra -Wpedantic -Werror)
strict_cxx=(-std=c++17 -Wall -Wextra -Wpedantic -Werror)

step "include/kvgate.h compiles alone as C99 and as C++17"
# shellcheck disable=SC2046 # pkg-config output is a list of flags
echo '#include <kvgate.h>' | cc "${strict_c[@]}" $(pkg-config --cflags kvgate) -x c -c - -o "$out/header-c.o"
# shellcheck disable=SC2046
echo '#include <kvgate.h>' | c++ "${strict_cxx[@]}" $(pkg-config --cflags kvgate) -x c++ -c - -o "$out/header-cxx.o"
echo "ok"

step "README C snippet"
awk '/<!-- readme-c-snippet/ { marked = 1; next }
     marked && /^```c$/ { inside = 1; next }
     inside && /^```$/ { exit }
     inside { print }' README.md >"$out/readme.c"
[[ -s "$out/readme.c" ]] || fail "no C snippet found in README.md"
# shellcheck disable=SC2046
cc "${strict_c[@]}" $(pkg-config --cflags kvgate) "$out/readme.c" -o "$out/readme" \
    $(pkg-config --libs kvgate) -Wl,-rpath,"$libdir"
run_and_expect readme '^admitted: empty_working_set$' '^admitted: reserved_session$' -- "$out/readme"

step "C host (pthreads, libkvgate.so)"
make -s -C ffi-examples/c OUT="$out/c"
c_expect=('^open: lease [0-9]+ released once, double release -> unknown_lease$'
    '^pressure: resident_prefix then reserved_session$'
    '^retry: older attempt preempted, newer cancelled; num_preempted=1$'
    '^agents: 6 sessions x 6 turns admitted'
    '^free: the waiting thread returned closed'
    '^c host: [0-9]+ checks passed$')
run_and_expect c-host "${c_expect[@]}" -- "$out/c/host"

step "C host under valgrind memcheck"
run_memcheck c-host-valgrind "$out/c/host" "${c_expect[@]}" \
    'definitely lost: 0 bytes' 'indirectly lost: 0 bytes'

step "C host with -fsanitize=address,undefined (libkvgate.a)"
run_sanitized c-host-asan "$out/c/host-asan" "${c_expect[@]}"

step "C event-loop host (one thread, poll on the waker fd)"
el_expect=('^working_set: misuse refused \(out_of_order, invalid_argument\) with messages$'
    '^working_set: 64 sessions x 4 turns admitted once each; .*\(threads: 1\)$'
    '^working_set: retry preempted the sleeping attempt \(num_preempted=1\), cancel counted \(cancelled=1\)$'
    '^reference: 32 sessions x 4 turns admitted once each; .*\(threads: 1\)$'
    '^reference: retry preempted the sleeping attempt \(num_preempted=1\), cancel counted \(cancelled=1\)$'
    '^callback waker: no descriptor; the preempted sleeper.s tag came through the callback$'
    '^c event loop: [0-9]+ checks passed$')
run_and_expect c-event-loop "${el_expect[@]}" -- "$out/c/event_loop"
grep -E 'woken through the fd' "$out/c-event-loop.log"

step "C event-loop host under valgrind memcheck"
run_memcheck c-event-loop-valgrind "$out/c/event_loop" "${el_expect[@]}" \
    'definitely lost: 0 bytes|All heap blocks were freed'

step "C event-loop host with -fsanitize=address,undefined (libkvgate.a)"
run_sanitized c-event-loop-asan "$out/c/event_loop-asan" "${el_expect[@]}"

step "C promises host (the header's promises, both modes)"
pr_expect=('^working_set: free inside the usage probe: acquire closed, no probe called afterwards$'
    '^reference: free inside the usage probe: acquire closed, no probe called afterwards$'
    '^reference: [0-9]+ usage probes, 0 capacity probes, [0-9]+ prefix probes$'
    '^working_set: retain_session and the session.s reservation figures agree$'
    '^reference: retain_session and the session.s reservation figures agree$'
    '^working_set: NULL probes: every turn admitted \(fits_working_set\)$'
    '^reference: NULL probes: every turn admitted \(open\)$'
    '^c promises: [0-9]+ checks passed$')
run_and_expect c-promises "${pr_expect[@]}" -- "$out/c/promises"

step "C promises host under valgrind memcheck"
run_memcheck c-promises-valgrind "$out/c/promises" "${pr_expect[@]}" \
    'definitely lost: 0 bytes|All heap blocks were freed'

step "C promises host with -fsanitize=address,undefined (libkvgate.a)"
run_sanitized c-promises-asan "$out/c/promises-asan" "${pr_expect[@]}"

step "C++ host (kvgate.hpp, std::thread)"
make -s -C ffi-examples/cpp OUT="$out/cpp"
run_and_expect cpp-host '^raii: lease [0-9]+ resident_prefix \(retains\)$' \
    '^threads: older preempted, newer cancelled, waiter after close closed$' \
    '^cpp host: [0-9]+ checks passed$' -- "$out/cpp/host"

step "C++ engine-loop host (kvgate.hpp Waker/Attempt/Lease, one thread, epoll)"
cpp_el_expect=('^working_set: misuse threw kvgate::Error \(out_of_order, invalid_argument\) with messages$'
    '^working_set: 48 sessions x 4 turns admitted once each; .*\(threads: 1\)$'
    '^working_set: retry preempted the sleeper \(num_preempted=1\); cancel\(\) and a dropped Attempt counted \(cancelled=2\)'
    '^reference: 32 sessions x 4 turns admitted once each; .*\(threads: 1\)$'
    '^reference: retry preempted the sleeper \(num_preempted=1\); cancel\(\) and a dropped Attempt counted \(cancelled=2\)'
    '^raii: an untaken lease released by ~Attempt; closed gate -> closed$'
    '^tier: refused answers threw and changed nothing \(refused_answers=4\), a refused report kept its lease$'
    '^cpp engine loop: [0-9]+ checks passed$')
run_and_expect cpp-engine-loop "${cpp_el_expect[@]}" -- "$out/cpp/engine_loop"
grep -E 'woken through epoll' "$out/cpp-engine-loop.log"

step "C++ engine-loop host with -fsanitize=address,undefined (libkvgate.a)"
run_sanitized cpp-engine-loop-asan "$out/cpp/engine_loop-asan" "${cpp_el_expect[@]}"

# The proxy uses the kvgate package (python/kvgate) from this checkout, with
# the library just built; scripts/python-package.sh tests the installed wheel.
step "Python proxy (the kvgate package, asyncio, no threads)"
run_and_expect python-proxy '^binding: layouts match the header' \
    '^wait: heartbeat ticked [0-9]+ times while a turn waited$' \
    '^cancel: the cancelled task.s attempt counted cancelled, no lease leaked$' \
    '^free: the waiting turn returned Closed$' '^python proxy: [0-9]+ checks passed$' -- \
    env PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$root/python" python3 ffi-examples/python/proxy.py --lib "$libdir/libkvgate.so"

step "ffi examples passed"
