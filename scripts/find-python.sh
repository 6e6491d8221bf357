# Sourced by the install scripts. find_python NAME sets `py` to the Python
# named by $KVGATE_PYTHON (default python3.11), looking in pyenv's shims and
# versions when it is off PATH (pyenv installs may be off a non-login
# shell's PATH, as in CI); if there is none it says so, as NAME, and exits 2.
find_python() {
    py=${KVGATE_PYTHON:-python3.11}
    if ! command -v "$py" >/dev/null 2>&1; then
        for candidate in "$HOME/.pyenv/shims/$py" "$HOME"/.pyenv/versions/3.11*/bin/python3.11; do
            if [[ -x "$candidate" ]]; then py=$candidate; break; fi
        done
    fi
    if ! command -v "$py" >/dev/null 2>&1; then
        echo "$1: $py not found (set KVGATE_PYTHON to a Python 3.11 interpreter)" >&2
        exit 2
    fi
}
