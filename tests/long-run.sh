#!/usr/bin/env bash
# The simulation's long run (docs/testing.md): seeds in chunks of 250, 8 runs at once, on a copy
# of the test binary frozen at the start, so the code under test stays one code however the
# checkout changes meanwhile. Each chunk's summary line goes to the log; a failing chunk keeps
# its output and the histories it wrote. Stops before the next chunk once the stop file exists.
#
#   tests/long-run.sh FIRST_SEED COUNT [LOG]      e.g. tests/long-run.sh 9100000 10000
#   (CHUNK=<seeds> changes the chunk's size)
#   touch "$LOG.stop"                              stops it after the chunk under way
#   tests/long-run.sh --sum [LOG]                  the totals so far (needs python3)
set -euo pipefail
cd "$(dirname "$0")"

sum() {
  python3 - "$1" <<'EOF'
import collections, json, re, sys
totals = collections.Counter()
probes = collections.Counter()
for line in open(sys.argv[1]):
    m = re.search(r"simulation: (\d+) runs passed, (\d+) commands, (\d+) crashes, "
                  r"(\d+) faults injected", line)
    if not m:
        continue
    totals.update(dict(zip(["runs", "commands", "crashes", "faults"], map(int, m.groups()))))
    totals["duplicates"] += int(re.search(r"(\d+) duplicate publications", line)[1])
    totals["violations"] += int(re.search(r"violations: (\d+)", line)[1])
    totals["seconds"] += round(float(re.search(r"in ([\d.]+)s\s*$", line)[1]))
    probes.update(json.loads(re.search(r"probes (\{[^}]*\})", line)[1]))
failed = sum(1 for line in open(sys.argv[1]) if line.startswith("rc=") and not line.startswith("rc=0"))
print(dict(totals), f"chunks failed: {failed}")
missed = sorted(name for name, hits in probes.items() if hits == 0)
print(f"{len(probes) - len(missed)} of {len(probes)} probes hit:", dict(sorted(probes.items())))
if missed:
    print("never hit:", missed)
EOF
}

if [ "${1:-}" = "--sum" ]; then
  sum "${2:-/tmp/long-run.log}"
  exit 0
fi
first=${1:?first seed}
count=${2:?how many seeds}
log=${3:-/tmp/long-run.log}
chunk=${CHUNK:-250}
# Named after the commit, and marked when the checkout differs from it.
frozen=/tmp/long-run-simulation-$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo -dirty)

# The build's last line names the test binary.
binary=$(cargo test --profile long-run -p chatter-tests --all-features --test simulation \
  --no-run 2>&1 | grep -o 'target/long-run/deps/simulation-[0-9a-f]*' | tail -1)
cp "../$binary" "$frozen"
echo "=== $(basename "$frozen") from seed $first, $count seeds, binary $frozen" >>"$log"
done_seeds=0
while [ "$done_seeds" -lt "$count" ]; do
  if [ -e "$log.stop" ]; then
    echo "stopped before seed $((first + done_seeds))" >>"$log"
    break
  fi
  seed=$((first + done_seeds))
  out=/tmp/long-run-chunk-$seed.log
  echo "=== chunk $seed $(date -u +%T)" >>"$log"
  rc=0
  SIM_AT_ONCE=8 SIM_SEEDS=$chunk SIM_FIRST_SEED=$seed "$frozen" long_run --exact --nocapture \
    >"$out" 2>&1 || rc=$?
  echo "rc=$rc $(grep -o 'simulation: [0-9]* runs passed.*' "$out" | head -1)" >>"$log"
  if [ "$rc" -eq 0 ]; then
    rm -f "$out"
  else
    grep -A3 'broke an invariant' "$out" >>"$log" || true
  fi
  done_seeds=$((done_seeds + chunk))
done
echo "done $(date -u +%T)" >>"$log"
sum "$log"
