#!/usr/bin/env bash
# Mutation run of the working set's rules: each mutant switches one rule off
# (or turns it around) in src/core/working_set/, and the working set's unit
# tests and property tests must catch it. Prints one line per mutant and
# exits non-zero if any survives. Not part of scripts/test.sh (each mutant
# rebuilds the tests: about a minute each on two cores).
#
#   ./scripts/mutants.sh            # every mutant
#   ./scripts/mutants.sh ghosts     # the mutants whose name contains "ghosts"
set -euo pipefail
cd "$(dirname "$0")/.."
dir=src/core/working_set

# name @@ file @@ text @@ replacement (each text occurs once in its file)
mutants=(
  "empty working set admits nobody@@admission.rs@@        if self.member_count == 0 {
            return Verdict::Empty;@@        if false {
            return Verdict::Empty;"
  "no fit test beside the members@@admission.rs@@if self.fits_beside_members(need) \&\& self.fits_ahead(s, need)@@if self.fits_ahead(s, need)"
  "no next-turn reserve@@admission.rs@@(self.counted() + self.reserve_sum + need)@@(self.counted() + need)"
  "no window ahead@@admission.rs@@        if self.lifetimes.is_empty() {@@        if true {"
  "wait bound never fires@@admission.rs@@if now >= bound \&\& self.rotation_allowed(now)@@if false \&\& self.rotation_allowed(now)"
  "rotation budget never spent@@admission.rs@@            self.rotation_budget.spend(parked);@@            let _ = parked;"
  "cold rule never lets anyone in@@admission.rs@@        if !self.holding {
            return Verdict::RunningColdPays;@@        if false {
            return Verdict::RunningColdPays;"
  "park the most recently released@@admission.rs@@.find(|\&s| Some(s) != keep)@@.filter(|\&s| Some(s) != keep).last()"
  "no ghosts@@mod.rs@@.map_or(0, |oldest| self.ghosts.own_freed_after(oldest))@@.map_or(0, |_| 0)"
  "no capacity from usage@@mod.rs@@                self.capacity.sample_usage(usage, held);@@                let _ = held;"
  "no shared prefix from usage@@mod.rs@@                self.raise_shared_prefix(shared);@@                let _ = shared;"
  "FIFO turned around@@queue.rs@@self.by_place.values().next().copied()@@self.by_place.values().next_back().copied()"
  "no first-turn credit@@turns.rs@@self.shared.expected_first_hit(block)@@0"
  "no shared prefix from sketches@@turns.rs@@                    self.shared.first_turn_shared(h.sketched_shared);@@"
  "no shared prefix from cached tokens@@turns.rs@@            self.shared.first_turn_shared(cached);@@"
  "no rate from turn reports@@turns.rs@@            .report_turn(prompt.saturating_sub(cached), secs);@@            .report_turn(0, secs);"
  "a window even at the usual last turn@@turns.rs@@!self.lifetimes.ends_after(h.turns)@@true"
  "every session keeps a window@@window.rs@@gaps.at_most(window_ns) > gaps.len() / 2@@true"
  "no window for new sessions@@window.rs@@    if gaps.len() < GAPS_TO_JUDGE {
        return true;@@    if gaps.len() < GAPS_TO_JUDGE {
        return false;"
  "no ends presumed@@window.rs@@            if quiet {@@            if false \&\& quiet {"
  "session growth not its own@@estimates.rs@@            (1.0 - SESSION_GROWTH_WEIGHT) * h.growth + SESSION_GROWTH_WEIGHT * grown@@            self.growth"
  "no copy window with a tier@@mod.rs@@            Some(reload) if self.rotation_fits_tier() => reload,@@            Some(_) if false => 0,"
  "sessions parked in the tier not first@@admission.rs@@        if self.tier_parked.is_empty() {@@        if true {"
  "ended sessions not in the tier's order@@tier.rs@@        while self.rotation_tokens() + self.tier_parked.ended > tier.tokens {@@        while self.rotation_tokens() > tier.tokens {"
)

filter=${1:-}
survived=0
for m in "${mutants[@]}"; do
  name=${m%%@@*}; rest=${m#*@@}
  file=${rest%%@@*}; rest=${rest#*@@}
  text=${rest%%@@*}; replacement=${rest#*@@}
  [[ -n "$filter" && "$name" != *"$filter"* ]] && continue
  path=$dir/$file
  cp "$path" "$path.orig"
  if ! python3 - "$path" "$text" "$replacement" <<'EOF'
import sys
path, text, repl = sys.argv[1], sys.argv[2].replace('\\&', '&'), sys.argv[3].replace('\\&', '&')
src = open(path).read()
if src.count(text) != 1:
    sys.exit(f"mutant text found {src.count(text)} times in {path}")
open(path, 'w').write(src.replace(text, repl))
EOF
  then
    mv "$path.orig" "$path"
    echo "BROKEN  $name (its text is no longer in $file)"
    survived=1
    continue
  fi
  if ! cargo build -q --lib >/dev/null 2>&1; then
    echo "BROKEN    $name (the mutant does not compile)"
    survived=1
  elif cargo test -q --lib core::working_set >/dev/null 2>&1 &&
     cargo test -q --test proptest_working_set >/dev/null 2>&1 &&
     cargo test -q --test working_set_core >/dev/null 2>&1; then
    echo "SURVIVED  $name"
    survived=1
  else
    echo "caught    $name"
  fi
  mv "$path.orig" "$path"
done
exit $survived
