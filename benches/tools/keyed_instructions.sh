#!/bin/sh
# Instructions per call of the keyed cases (see benches/keyed_instructions.rs), by callgrind:
# the difference of two runs' totals over the difference of their counts.
# Usage: benches/tools/keyed_instructions.sh [case keys]...   (default: every case)
set -e
cargo bench -q -p paced-benches --bench keyed_instructions --no-run 2>/dev/null
B=$(ls -t target/release/deps/keyed_instructions-* | grep -v '\.d$' | head -1)
refs() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$B" "$1" "$2" "$3" 2>&1 \
    | sed -n 's/.*refs: *//p' | tr -d ,
}
[ $# -eq 0 ] && set -- paced_try 10 paced_try 100000 governor_check 10 governor_check 100000 \
  paced_acquire 1000 governor_until_ready 1000 \
  tokio_clock 0 quanta_clock 0 throttle 0 throttle_by_key 0
while [ $# -ge 2 ]; do
  a=$(refs "$1" "$2" 100000); b=$(refs "$1" "$2" 300000)
  echo "$1 $2: $(( (b - a) / 200000 )) instructions per call"
  shift 2
done
