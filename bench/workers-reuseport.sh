#!/bin/bash
# Does `--workers N` (N SO_REUSEPORT listeners) or more tokio threads help?
# Runs the release sidecar in front of nginx (one worker process, a fixed
# 64-byte answer) and measures it with wrk: 64 keep-alive connections, then
# 64 connections that each carry one request (Connection: close).
#
# Usage: bench/workers-reuseport.sh BIN [ROUNDS] [DURATION]
#   CFGS="1:2 2:2" limits the workers:threads pairs (default: 1:2 2:2 4:2 1:1 2:1 1:4).
# Threads are set with TOKIO_WORKER_THREADS (the sidecar's runtime reads it).
set -u
BIN=$1; ROUNDS=${2:-3}; DUR=${3:-5s}
HERE=$(dirname "$(readlink -f "$0")")
mkdir -p /tmp/ext-bench
nginx -c "$HERE/workers-reuseport.nginx.conf" & NGINX=$!
for _ in $(seq 1 100); do curl -sf -o /dev/null 127.0.0.1:18491/ && break; sleep 0.05; done
for round in $(seq 1 "$ROUNDS"); do
  for cfg in ${CFGS:-1:2 2:2 4:2 1:1 2:1 1:4}; do
    w=${cfg%%:*}; t=${cfg##*:}
    TOKIO_WORKER_THREADS=$t "$BIN" --listen 127.0.0.1:18492 --upstream 127.0.0.1:18491 \
      --admin 127.0.0.1:18493 --workers "$w" \
      --drain-min-delay 0s --drain-quiet 0s --drain-max-delay 0s >/dev/null 2>&1 & P=$!
    for _ in $(seq 1 100); do curl -sf -o /dev/null 127.0.0.1:18493/ready && break; sleep 0.05; done
    ka=$(wrk -t2 -c64 -d"$DUR" http://127.0.0.1:18492/ | awk '/Requests\/sec/ {print $2}')
    nc=$(wrk -t2 -c64 -d"$DUR" -H 'Connection: close' http://127.0.0.1:18492/ | awk '/Requests\/sec/ {print $2}')
    echo "round=$round workers=$w threads=$t keepalive_rps=$ka new_conn_rps=$nc"
    kill -TERM $P; wait $P
  done
done
kill $NGINX; wait $NGINX 2>/dev/null
