#!/usr/bin/env bash
# The docs check, run by scripts/test.sh:
# 0. README.md stays at most 250 lines;
# 1. every relative link and image in the repository's Markdown files
#    (README.md, docs/ and the rest) resolves to a file or folder inside the
#    repository, and every #anchor to a heading of its target;
# 2. no tracked text file points at a document outside the repository
#    (a `../shared/...` path);
# 3. the README's code snippets are checked: the Rust one is
#    examples/readme.rs to the byte (which `cargo run --example readme`
#    runs), the C one is compiled and run by scripts/ffi-examples.sh (its
#    marker must be there), the Python one is run here against this
#    checkout's package and library.
# Needs python3 and cargo. Exits non-zero naming every failure.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

if ! command -v cargo >/dev/null 2>&1; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

step() { printf -- '--> %s\n' "$*"; }
fail() { printf 'check-docs: %s\n' "$*" >&2; exit 1; }

step "README.md: at most 250 lines, for a newcomer's five minutes"
lines=$(wc -l <README.md)
(( lines <= 250 )) || fail "README.md has $lines lines; move detail to docs/"
echo "$lines lines"

step "relative links and anchors in Markdown"
git ls-files -z --cached --others --exclude-standard -- '*.md' | sort -zu | python3 -c '
import os, re, sys, unicodedata

root = os.getcwd()
files = [f for f in sys.stdin.read().split("\0") if f]
fence = re.compile(r"^\s*(```|~~~)")
link = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
refdef = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s+.*)?$")
heading = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
anchor_tag = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")

def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    inside = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if fence.match(line):
                inside = not inside
                continue
            if not inside:
                yield n, line

def slug(text):
    """GitHub'"'"'s anchor for a heading."""
    text = re.sub(r"`([^`]*)`", r"\1", text)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    out = []
    for ch in text:
        if ch in " -":
            out.append("-")
        elif ch == "_" or ch.isalnum() or unicodedata.category(ch).startswith("M"):
            out.append(ch)
    return "".join(out)

anchors_cache = {}
def anchors(path):
    if path not in anchors_cache:
        seen, found = {}, set()
        for _, line in prose_lines(path):
            m = heading.match(line)
            if m:
                base = slug(m.group(2))
                k = seen.get(base, 0)
                seen[base] = k + 1
                found.add(base if k == 0 else f"{base}-{k}")
            found.update(anchor_tag.findall(line))
        anchors_cache[path] = found
    return anchors_cache[path]

errors = []
checked = 0
for md in files:
    for n, line in prose_lines(md):
        code_free = re.sub(r"`[^`]*`", "", line)
        targets = link.findall(code_free)
        m = refdef.match(code_free)
        if m:
            targets.append(m.group(1))
        for target in targets:
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # http:, https:, mailto:
            checked += 1
            path, _, frag = target.partition("#")
            where = f"{md}:{n}: {target}"
            if path:
                full = os.path.normpath(os.path.join(os.path.dirname(os.path.join(root, md)), path))
                if not (full == root or full.startswith(root + os.sep)):
                    errors.append(f"{where}: points outside the repository")
                    continue
                if not os.path.exists(full):
                    errors.append(f"{where}: no such file")
                    continue
            else:
                full = os.path.join(root, md)
            if frag:
                if not full.endswith(".md") or os.path.isdir(full):
                    continue  # anchors into code or folders are not checked
                if frag not in anchors(full):
                    errors.append(f"{where}: no heading #{frag} in {os.path.relpath(full, root)}")
for e in errors:
    print("  " + e, file=sys.stderr)
print(f"{checked} relative links in {len(files)} Markdown files", "resolve" if not errors else f": {len(errors)} broken")
sys.exit(1 if errors else 0)
' || fail "broken links (above)"

step "no reference to documents outside the repository"
if git grep --untracked -n -I -E '\.\./shared/|/work/shared' -- ':!scripts/check-docs.sh'; then
    fail "the lines above point outside the repository: cite the fact itself"
fi
echo "none"

# The body of the README's fenced block of a language after an optional
# marker comment (`<!-- NAME`); fails when there is not exactly one block of
# that language in README.md.
readme_block() {
    local lang="$1" marker="$2" count
    count=$(grep -c "^\`\`\`$lang\$" README.md || true)
    [[ "$count" == 1 ]] || fail "README.md has $count \`\`\`$lang blocks; exactly one is checked"
    awk -v lang="$lang" -v marker="$marker" '
        marker != "" && index($0, "<!-- " marker) == 1 { marked = 1; next }
        (marker == "" || marked) && $0 == "```" lang { inside = 1; next }
        inside && /^```$/ { exit }
        inside { print }' README.md
}

step "README Rust snippet = examples/readme.rs"
rust_snippet="$(readme_block rust '')"
example_body="$(sed '1,/^$/d' examples/readme.rs)"
if [[ "$rust_snippet" != "$example_body" ]]; then
    diff <(printf '%s\n' "$rust_snippet") <(printf '%s\n' "$example_body") >&2 || true
    fail "README.md's Rust snippet and examples/readme.rs (after its header comment) differ"
fi
echo "identical ($(printf '%s\n' "$rust_snippet" | wc -l) lines)"

step "README C snippet: marked for scripts/ffi-examples.sh"
c_snippet="$(readme_block c readme-c-snippet)"
[[ -n "$c_snippet" ]] || fail "the README's C block lacks its <!-- readme-c-snippet marker"
grep -q 'readme-c-snippet' scripts/ffi-examples.sh || fail "scripts/ffi-examples.sh no longer compiles the README's C snippet"
echo "compiled and run by scripts/ffi-examples.sh"

step "README Python snippet, run against this checkout"
py_snippet="$(readme_block python readme-python-snippet)"
[[ -n "$py_snippet" ]] || fail "the README's Python block lacks its <!-- readme-python-snippet marker"
cargo build --quiet --lib
lib="${CARGO_TARGET_DIR:-$root/target}/debug/libkvgate.so"
[[ -f "$lib" ]] || fail "no $lib after cargo build --lib"
printf '%s\n' "$py_snippet" >"${TMPDIR:-/tmp}/kvgate-readme-snippet.py"
(cd "${TMPDIR:-/tmp}" && KVGATE_LIBRARY="$lib" PYTHONPATH="$root/python" \
    python3 -W error::ResourceWarning kvgate-readme-snippet.py) || fail "the README's Python snippet failed"

step "docs check passed"
