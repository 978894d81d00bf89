#!/usr/bin/env bash
# Registry throughput: walletrelay against nginx serving the identical bytes as static files,
# with wrk, loopback only, every run bounded in time. Needs `wrk`, `nginx` and `curl`
# (Debian: apt-get install wrk nginx-light curl) and a release build
# (cargo build --release).
#
#   scripts/registry-vs-nginx.sh [DURATION_S] [CONNECTIONS] [ROUNDS]
#
# ONLY="all|search" limits the cases measured to those names; ENCODINGS="identity" to
# those encodings (default both).
#
# Both servers run one worker pinned to CPU 0 (walletrelay `--threads 1 --cpus 0`, nginx
# under `taskset -c 0`), wrk runs pinned to CPU 1. Each case is measured ROUNDS times,
# alternating walletrelay and nginx, to spread out interference from other load; it prints
# every round's requests/s and the median ratio walletrelay / nginx.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/limits-off  # the limits per client off (load from one address; docs/TUNING.md)
DUR=${1:-10}
CONN=${2:-50}
ROUNDS=${3:-3}
WR_PORT=${WR_PORT:-18801}
NG_PORT=${NG_PORT:-18802}
BIN=${BIN:-target/release/walletrelay}
WORK=$(mktemp -d /tmp/registry-vs-nginx.XXXXXX)
WR_PID=""
NG_PID=""
cleanup() {
  [ -n "$WR_PID" ] && kill "$WR_PID" 2>/dev/null || true
  [ -n "$NG_PID" ] && kill "$NG_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN" --listen "127.0.0.1:$WR_PORT" --threads 1 --cpus 0 >"$WORK/wr.out" 2>"$WORK/wr.err" &
WR_PID=$!
for _ in $(seq 1 100); do grep -q listening "$WORK/wr.out" && break; sleep 0.1; done

# name|walletrelay target|static file
CASES=(
  "all|/api/v1/all|all.json"
  "page 100|/api/v1/all?entries=100&page=2|page.json"
  "search|/api/v1/all?search=wallet|search.json"
)
mkdir -p "$WORK/html"
chmod 755 "$WORK" "$WORK/html"  # nginx workers run unprivileged
for c in "${CASES[@]}"; do
  IFS='|' read -r _ target file <<<"$c"
  curl -sf "http://127.0.0.1:$WR_PORT$target" -o "$WORK/html/$file"
  curl -sf -H 'Accept-Encoding: gzip' "http://127.0.0.1:$WR_PORT$target" -o "$WORK/html/$file.gz"
done

cat >"$WORK/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $WORK/nginx.pid;
error_log $WORK/nginx.err warn;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  tcp_nodelay on;
  keepalive_timeout 65;
  keepalive_requests 1000000;
  open_file_cache max=64 inactive=60s;
  open_file_cache_valid 60s;
  gzip_static on;
  types { application/json json; }
  server {
    listen 127.0.0.1:$NG_PORT;
    root $WORK/html;
  }
}
EOF
chmod 644 "$WORK"/html/*
taskset -c 0 nginx -c "$WORK/nginx.conf" -p "$WORK" &
NG_PID=$!
sleep 0.5

# The bytes must be identical.
for c in "${CASES[@]}"; do
  IFS='|' read -r name target file <<<"$c"
  for enc in identity gzip; do
    a=$(curl -sf -H "Accept-Encoding: $enc" "http://127.0.0.1:$WR_PORT$target" | sha256sum)
    b=$(curl -sf -H "Accept-Encoding: $enc" "http://127.0.0.1:$NG_PORT/$file" | sha256sum)
    [ "$a" = "$b" ] || { echo "bodies differ: $name $enc" >&2; exit 1; }
  done
done

rps() { timeout $((DUR + 20)) taskset -c 1 wrk -t1 -c"$CONN" -d"${DUR}s" "$@" | awk '/Requests\/sec/ {print $2}'; }
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "wrk -t1 -c$CONN -d${DUR}s, $ROUNDS rounds; requests/s per round (walletrelay/nginx)"
for c in "${CASES[@]}"; do
  IFS='|' read -r name target file <<<"$c"
  [ -n "${ONLY:-}" ] && ! [[ "$name" =~ ^(${ONLY})$ ]] && continue
  for enc in ${ENCODINGS:-identity gzip}; do
    hdr=()
    [ "$enc" = gzip ] && hdr=(-H 'Accept-Encoding: gzip')
    rounds=""
    ratios=()
    for _ in $(seq 1 "$ROUNDS"); do
      w=$(rps "${hdr[@]}" "http://127.0.0.1:$WR_PORT$target")
      n=$(rps "${hdr[@]}" "http://127.0.0.1:$NG_PORT/$file")
      rounds="$rounds ${w%.*}/${n%.*}"
      ratios+=("$(awk -v a="$w" -v b="$n" 'BEGIN {printf "%.2f", a / b}')")
    done
    med=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{v[NR]=$1} END {print v[int((NR + 1) / 2)]}')
    printf '%-9s %-9s median ratio %5s  rounds:%s\n' "$name" "$enc" "$med" "$rounds"
  done
done
