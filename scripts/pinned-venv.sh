# Sourced by the Python scripts. pinned_venv VENV REQUIREMENTS makes VENV a
# venv of $python (at least 3.9; one that is not is made again) and
# installs REQUIREMENTS' pins into it once per content of that file (a
# stamp in the venv), so a rerun does not ask the index anything. Uses the
# caller's `python` and `step`.
pinned_venv() {
    local venv=$1 requirements=$2
    if ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 9))' >/dev/null 2>&1; then
        step "python venv at $venv ($("$python" --version))"
        rm -rf "$venv"
        mkdir -p "$(dirname "$venv")"
        "$python" -m venv "$venv"
    fi
    local stamp="$venv/.kvgate-requirements"
    if ! cmp -s "$requirements" "$stamp"; then
        step "pip install -r ${requirements#"$root"/} (pinned)"
        "$venv/bin/pip" install --quiet -r "$requirements"
        cp "$requirements" "$stamp"
    fi
}
