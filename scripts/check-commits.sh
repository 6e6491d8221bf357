#!/usr/bin/env bash
# The commit-subject check, run by scripts/test.sh: every commit made after
# BASE (default be8dc7f, main's head when the rule got its check; older
# history is what it is) has a subject of at most 72 characters
# (docs/README.md, "Contributing"). Merge commits are checked too.
#
#   scripts/check-commits.sh          # commits in be8dc7f..HEAD
#   scripts/check-commits.sh REV      # commits in REV..HEAD
#
# A checkout without BASE in its history (a shallow clone) checks HEAD only;
# a tree that is not a git checkout has nothing to check. Exits non-zero
# naming every subject over the limit.
set -euo pipefail
cd "$(dirname "$0")/.."

base=${1:-be8dc7f}
limit=72

if ! git rev-parse --git-dir >/dev/null 2>&1; then
    echo "check-commits: not a git checkout; nothing to check"
    exit 0
fi
if git rev-parse --verify -q "$base^{commit}" >/dev/null && git merge-base --is-ancestor "$base" HEAD; then
    range="$base..HEAD"
else
    echo "check-commits: $base is not in this checkout's history; checking HEAD only"
    range="-1 HEAD"
fi

# shellcheck disable=SC2086
git log --format='%h %s' $range | python3 -c '
import sys
limit = int(sys.argv[1])
checked, over = 0, []
for line in sys.stdin.read().splitlines():
    sha, _, subject = line.partition(" ")
    checked += 1
    if len(subject) > limit:
        over.append(f"  {sha}: {len(subject)} characters: {subject}")
for o in over:
    print(o, file=sys.stderr)
if over:
    print(f"check-commits: {len(over)} of {checked} commit subjects over {limit} characters "
          "(docs/README.md asks for at most 72; reword them with git rebase -i)", file=sys.stderr)
    sys.exit(1)
print(f"{checked} commit subjects, each at most {limit} characters")
' "$limit"
