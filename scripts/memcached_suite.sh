#!/usr/bin/env bash
# Run memcached 1.6.18's own test suite (its t/*.t, Perl) against Slipstream, the binary
# standing in for the `memcached-debug` the suite starts. Not part of `make test`: the suite
# is memcached's source, which the project does not vendor; point MEMCACHED_SRC at a checkout
# of the 1.6.18 tag (git clone -b 1.6.18 https://github.com/memcached/memcached).
#
#   MEMCACHED_SRC=/path/to/memcached SLIPSTREAM_BIN=target/release/slipstream \
#       bash scripts/memcached_suite.sh [t/getset.t ...]
#
# Prints one line per test file (passed / failed / skipped counts) and keeps each file's
# output in $OUT. Every file runs under a 180 s limit; the servers it starts are memcached's
# harness's own children (killed when the file ends).
set -u
src=${MEMCACHED_SRC:?set MEMCACHED_SRC to a memcached 1.6.18 source tree}
bin=$(realpath "${SLIPSTREAM_BIN:-target/release/slipstream}")
OUT=${OUT:-/tmp/memcached-suite}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$OUT"
cp -r "$src/t" "$work/t"
# line-lengths.t checks the protocol document beside t/.
[ -d "$src/doc" ] && cp -r "$src/doc" "$work/doc"
ln -s "$bin" "$work/memcached-debug"
# memcached's `timedrun SECONDS CMD...`: the suite signals this process, so it passes
# SIGUSR1 (restart.t's graceful stop), HUP, INT and TERM on to the server, and kills the server
# after SECONDS.
cat > "$work/timedrun" <<'WRAP'
#!/bin/bash
t=$1; shift
"$@" &
child=$!
for s in USR1 HUP INT TERM; do trap "kill -$s $child 2>/dev/null" "$s"; done
( sleep "$t"; kill -KILL "$child" 2>/dev/null ) &
watchdog=$!
while :; do
    wait "$child"; rc=$?
    kill -0 "$child" 2>/dev/null || break
done
kill "$watchdog" 2>/dev/null
exit "$rc"
WRAP
chmod +x "$work/timedrun"
cd "$work" || exit 1
if [ $# -eq 0 ]; then
    set -- $(ls t/*.t | grep -v -e proxy -e extstore -e ssl_)
fi
for t in "$@"; do
    log="$OUT/$(basename "$t").out"
    timeout 180 perl "$t" > "$log" 2>&1
    rc=$?
    ok=$(grep -c '^ok' "$log"); bad=$(grep -c '^not ok' "$log"); skip=$(grep -c -i '# skip' "$log")
    echo "$t rc=$rc ok=$ok not_ok=$bad skip=$skip"
done
