#!/usr/bin/env bash
# ctrain-launch: the worker environment contract, rank-prefixed console and per-rank logs,
# failure semantics (kill -9 of a worker, SIGKILL after the grace period, restarts), signals
# (SIGTERM forwarded, SIGUSR1 -> clean exit, the launcher killed -> workers die with it),
# port in use, usage errors, and a two-node run on one machine. Workers are small shell
# scripts (--cmd); every process of a scenario has $TMP in its command line, so
# `pgrep -f "$TMP"` finds any that survived.
source "$(dirname "$0")/lib.sh"
LAUNCH=$(dirname "$CTRAIN")/ctrain-launch
[ -x "$LAUNCH" ] || { echo "no ctrain-launch next to $CTRAIN"; exit 1; }
# a copy of sleep whose path carries the marker, for children the workers leave behind
cp "$(command -v sleep)" "$TMP/sleeper"

survivors() { pgrep -f "$TMP" | grep -v "^$$\$" || true; }
no_survivors() { # no_survivors WHAT: nothing of the run is left (retries briefly)
  for _ in $(seq 20); do [ -z "$(survivors)" ] && break; sleep 0.1; done
  local left
  left=$(survivors)
  check "$1: no process of the run remains" test -z "$left"
  [ -z "$left" ] || ps -o pid,pgid,stat,args -p "$(echo $left | tr ' ' ,)" || true
}
wait_files() { # wait_files COUNT GLOB: until COUNT files match (10 s at most)
  for _ in $(seq 100); do
    # shellcheck disable=SC2086
    [ "$(ls $2 2>/dev/null | wc -l)" -ge "$1" ] && return 0
    sleep 0.1
  done
  return 1
}
worker() { # worker NAME BODY: writes an executable worker script, prints its path
  printf '#!/bin/bash\nD=%q\n%s\n' "$TMP" "$2" >"$TMP/$1.sh"
  chmod +x "$TMP/$1.sh"
  echo "$TMP/$1.sh"
}

# ---- environment contract, console prefixes, per-rank logs
W=$(worker env 'env > "$D/env_$RANK"; echo "hello from $RANK"; echo "err from $RANK" >&2')
mkdir -p "$TMP/logs"
env -u OMP_NUM_THREADS "$LAUNCH" --nproc_per_node 3 --standalone --log_dir "$TMP/logs" --cmd "$W" \
  >"$TMP/out" 2>"$TMP/err"
check "env: exit 0" test $? -eq 0
port=$(sed -n 's/^MASTER_PORT=//p' "$TMP/env_0")
check "env: --standalone picked a free port" test "${port:-0}" -gt 0
for r in 0 1 2; do
  e="$TMP/env_$r"
  for kv in "RANK=$r" "LOCAL_RANK=$r" "WORLD_SIZE=3" "LOCAL_WORLD_SIZE=3" "GROUP_RANK=0" \
            "MASTER_ADDR=127.0.0.1" "MASTER_PORT=$port" "CTRAIN_RESTART_COUNT=0" "OMP_NUM_THREADS=1"; do
    check "env: rank $r has $kv" grep -qx "$kv" "$e"
  done
  check "env: rank $r has a 32-hex-digit store token" grep -qE '^CTRAIN_STORE_TOKEN=[0-9a-f]{32}$' "$e"
  check "env: rank $r has a run id" grep -qE '^CTRAIN_RUN_ID=.+' "$e"
  check "console: rank $r stdout prefixed" grep -qx "\[rank$r\]: hello from $r" "$TMP/out"
  check "console: rank $r stderr prefixed" grep -qx "\[rank$r\]: err from $r" "$TMP/err"
  check "log: rank_$r.log has both streams, unprefixed" \
    bash -c "grep -qx 'hello from $r' '$TMP/logs/rank_$r.log' && grep -qx 'err from $r' '$TMP/logs/rank_$r.log'"
done
check "env: every rank got the same token and run id" \
  bash -c "[ \$(grep -h -e ^CTRAIN_STORE_TOKEN= -e ^CTRAIN_RUN_ID= '$TMP'/env_* | sort -u | wc -l) -eq 2 ]"
OMP_NUM_THREADS=7 "$LAUNCH" --nproc_per_node 2 --standalone --cmd "$W" >/dev/null 2>&1
check "env: a user's OMP_NUM_THREADS is kept" grep -qx "OMP_NUM_THREADS=7" "$TMP/env_1"
"$LAUNCH" --nproc_per_node 3 --standalone --local_ranks_filter 0,2 --tee --cmd "$W" >"$TMP/out" 2>/dev/null
check "filter: rank 0 and 2 shown, rank 1 not" \
  bash -c "grep -q '^\[rank0\]' '$TMP/out' && grep -q '^\[rank2\]' '$TMP/out' && ! grep -q '^\[rank1\]' '$TMP/out'"
"$LAUNCH" --nproc_per_node 2 --standalone --tee=0 --log_dir "$TMP/logs" --cmd "$W" >"$TMP/out" 2>/dev/null
check "tee=0: nothing on the console, logs still written" \
  bash -c "! grep -q rank '$TMP/out' && grep -qx 'hello from 1' '$TMP/logs/rank_1.log'"

# ---- kill -9 of one worker: the others are stopped (one ignores SIGTERM, so it needs the
# SIGKILL after the grace period), the launcher names the rank and signal, nothing survives
W=$(worker fail '
echo $$ > "$D/pid_$RANK.tmp"; mv "$D/pid_$RANK.tmp" "$D/pid_$RANK"
"$D/sleeper" 1000 &           # something the worker leaves behind in its process group
echo "rank $RANK is alive"
if [ "$RANK" = 2 ]; then trap "" TERM; else trap "echo term > \"$D/term_$RANK\"; exit 143" TERM; fi
while :; do "$D/sleeper" 0.05; done')
rm -f "$TMP"/pid_* "$TMP"/term_*
"$LAUNCH" --nproc_per_node 3 --standalone --grace_period 1.5 --monitor_interval 0.1 --cmd "$W" \
  >"$TMP/out" 2>"$TMP/err" &
lpid=$!
if wait_files 3 "$TMP/pid_*"; then
  sleep 0.2
  t0=$(date +%s.%N)
  kill -9 "$(cat "$TMP/pid_1")"
  wait $lpid
  rc=$?
  t1=$(date +%s.%N)
  elapsed=$(awk "BEGIN{print $t1 - $t0}")
  check "kill -9: launcher exits 137 (128+SIGKILL), got $rc" test $rc -eq 137
  check "kill -9: report names rank 1 and SIGKILL" grep -q "worker failure: rank 1 .*killed by SIGKILL" "$TMP/err"
  check "kill -9: report carries rank 1's last output" grep -q "^    rank 1 is alive" "$TMP/err"
  check "kill -9: rank 0 got SIGTERM" test -f "$TMP/term_0"
  check "kill -9: rank 2 (ignores SIGTERM) killed after the 1.5 s grace period" grep -q "rank 2 .*still running after the 1.5 s grace period: sending SIGKILL" "$TMP/err"
  check "kill -9: all stopped within grace + 3 s (took ${elapsed}s)" \
    awk "BEGIN{exit !($elapsed < 4.5 && $elapsed >= 1.4)}"
  no_survivors "kill -9"
else
  check "kill -9: workers started" false
  kill -9 $lpid
fi

# ---- restarts: rank 1 fails in the first attempt only; the group restarts and succeeds
W=$(worker restart '
echo "$CTRAIN_RESTART_COUNT" > "$D/rc_$RANK"
if [ "$CTRAIN_RESTART_COUNT" = 0 ]; then
  if [ "$RANK" = 1 ]; then sleep 0.3; echo "rank 1 fails"; exit 5; fi
  exec "$D/sleeper" 1000
fi
echo "rank $RANK done"')
rm -f "$TMP"/rc_*
"$LAUNCH" --nproc_per_node 3 --standalone --max_restarts=1 --grace_period 5 --monitor_interval 0.1 \
  --cmd "$W" >"$TMP/out" 2>"$TMP/err"
rc=$?
check "restart: exit 0 after one restart, got $rc" test $rc -eq 0
check "restart: the failure was reported (rank 1, code 5)" grep -q "rank 1 .*exited with code 5" "$TMP/err"
check "restart: restart announced" grep -q "restarting the worker group (restart 1 of 1)" "$TMP/err"
check "restart: every rank ran again with CTRAIN_RESTART_COUNT=1" \
  bash -c "[ \"\$(cat '$TMP'/rc_0 '$TMP'/rc_1 '$TMP'/rc_2 | tr -d '\n')\" = 111 ]"
check "restart: second attempt finished" grep -qx "\[rank2\]: rank 2 done" "$TMP/out"
"$LAUNCH" --nproc_per_node 3 --standalone --max_restarts=0 --grace_period 5 --cmd "$W" >/dev/null 2>"$TMP/err"
rc=$?
check "no restarts left: exit with the worker's code 5, got $rc" test $rc -eq 5
check "no restarts left: one-line summary" grep -q "failed: rank 1 .*exited with code 5; exiting with 5" "$TMP/err"
no_survivors "restart"

# ---- restarts of the real command: train.resume=auto is added (a fake ctrain next to a copy of
# the launcher records its arguments)
mkdir -p "$TMP/bin"
cp "$LAUNCH" "$TMP/bin/ctrain-launch"
printf '#!/bin/bash\necho "$*" > "%s/args_$CTRAIN_RESTART_COUNT"\n[ "$CTRAIN_RESTART_COUNT" != 0 ]\n' "$TMP" >"$TMP/bin/ctrain"
chmod +x "$TMP/bin/ctrain"
"$TMP/bin/ctrain-launch" --standalone --max_restarts 1 cfg.toml train.lr=1e-3 >/dev/null 2>&1
rc=$?
check "ctrain args: exit 0 after the restart, got $rc" test $rc -eq 0
check "ctrain args: first attempt runs ctrain train CONFIG overrides" \
  grep -qx "train cfg.toml train.lr=1e-3" "$TMP/args_0"
check "ctrain args: the restart adds train.resume=auto" \
  grep -qx "train cfg.toml train.lr=1e-3 train.resume=auto" "$TMP/args_1"

# ---- SIGTERM to the launcher: forwarded, workers exit, launcher exits 143
W=$(worker sigterm '
trap "echo term > \"$D/term_$RANK\"; exit 0" TERM
echo $$ > "$D/pid_$RANK"
while :; do "$D/sleeper" 0.05; done')
rm -f "$TMP"/pid_* "$TMP"/term_*
"$LAUNCH" --nproc_per_node 2 --standalone --grace_period 10 --cmd "$W" >/dev/null 2>"$TMP/err" &
lpid=$!
if wait_files 2 "$TMP/pid_*"; then
  t0=$(date +%s.%N)
  kill -TERM $lpid
  wait $lpid
  rc=$?
  elapsed=$(awk "BEGIN{print $(date +%s.%N) - $t0}")
  check "SIGTERM: launcher exits 143, got $rc" test $rc -eq 143
  check "SIGTERM: both workers received SIGTERM" bash -c "[ -f '$TMP/term_0' ] && [ -f '$TMP/term_1' ]"
  check "SIGTERM: done well before the 10 s grace period (${elapsed}s)" awk "BEGIN{exit !($elapsed < 3)}"
  check "SIGTERM: announced" grep -q "got SIGTERM: forwarding it to the workers" "$TMP/err"
  no_survivors "SIGTERM"
else
  check "SIGTERM: workers started" false
  kill -9 $lpid
fi

# ---- SIGINT, to a launcher started in the background of a script (which ignores SIGINT)
rm -f "$TMP"/pid_* "$TMP"/term_*
W=$(worker sigint '
trap "echo int > \"$D/term_$RANK\"; exit 0" INT
echo $$ > "$D/pid_$RANK"
while :; do "$D/sleeper" 0.05; done')
"$LAUNCH" --nproc_per_node 2 --standalone --grace_period 10 --cmd "$W" >/dev/null 2>"$TMP/err" &
lpid=$!
if wait_files 2 "$TMP/pid_*"; then
  kill -INT $lpid
  wait $lpid
  rc=$?
  check "SIGINT: launcher exits 130, got $rc" test $rc -eq 130
  check "SIGINT: both workers received SIGINT" bash -c "[ -f '$TMP/term_0' ] && [ -f '$TMP/term_1' ]"
  no_survivors "SIGINT"
else
  check "SIGINT: workers started" false
  kill -9 $lpid
fi

# ---- SIGUSR1 (Slurm's pre-emption warning): forwarded; workers "checkpoint" and exit 0
W=$(worker sigusr1 '
trap "echo ckpt > \"$D/ckpt_$RANK\"; exit 0" USR1
echo $$ > "$D/pid_$RANK"
while :; do "$D/sleeper" 0.05; done')
rm -f "$TMP"/pid_*
"$LAUNCH" --nproc_per_node 2 --standalone --cmd "$W" >/dev/null 2>"$TMP/err" &
lpid=$!
if wait_files 2 "$TMP/pid_*"; then
  kill -USR1 $lpid
  wait $lpid
  rc=$?
  check "SIGUSR1: clean exit 0, got $rc" test $rc -eq 0
  check "SIGUSR1: every worker checkpointed" bash -c "[ -f '$TMP/ckpt_0' ] && [ -f '$TMP/ckpt_1' ]"
  no_survivors "SIGUSR1"
else
  check "SIGUSR1: workers started" false
  kill -9 $lpid
fi

# ---- the launcher itself killed by SIGKILL: workers die with it (PR_SET_PDEATHSIG)
W=$(worker orphan 'echo $$ > "$D/pid_$RANK"; exec "$D/sleeper" 1000')
rm -f "$TMP"/pid_*
"$LAUNCH" --nproc_per_node 2 --standalone --cmd "$W" >/dev/null 2>&1 &
lpid=$!
if wait_files 2 "$TMP/pid_*"; then
  sleep 0.1
  kill -9 $lpid
  wait $lpid 2>/dev/null
  no_survivors "launcher killed"
else
  check "launcher killed: workers started" false
  kill -9 $lpid
fi

# ---- port in use: exit 2 with one clear line
W=$(worker hold 'echo "$MASTER_PORT" > "$D/port.tmp"; mv "$D/port.tmp" "$D/port"; exec "$D/sleeper" 1000')
rm -f "$TMP/port"
"$LAUNCH" --standalone --grace_period 2 --cmd "$W" >/dev/null 2>&1 &
lpid=$!
if wait_files 1 "$TMP/port"; then
  p=$(cat "$TMP/port")
  "$LAUNCH" --master_port "$p" --cmd true >/dev/null 2>"$TMP/err"
  rc=$?
  check "port in use: exit 2, got $rc" test $rc -eq 2
  check "port in use: one line naming the port" \
    bash -c "[ \$(wc -l <'$TMP/err') -eq 1 ] && grep -q 'port $p is already in use' '$TMP/err'"
  kill -TERM $lpid
  wait $lpid
else
  check "port in use: first launcher started" false
  kill -9 $lpid
fi
no_survivors "port in use"

# ---- usage errors
expect_fail 2 'unknown option --nproc_per_nod; did you mean --nproc_per_node\?' -- "$LAUNCH" --nproc_per_nod 2 cfg.toml
expect_fail 2 '--nproc_per_node: "many" is not a count' -- "$LAUNCH" --nproc_per_node many cfg.toml
expect_fail 2 '--node_rank 2 must be below --nnodes 2' -- "$LAUNCH" --nnodes 2 --node_rank 2 --cmd true
expect_fail 2 '--local_ranks_filter "5"' -- "$LAUNCH" --nproc_per_node 2 --local_ranks_filter 5 --cmd true
"$LAUNCH" --help >"$TMP/out" 2>&1
check "--help exits 0 with the usage" bash -c "[ $? -eq 0 ] && grep -q 'usage: ctrain-launch' '$TMP/out'"
"$LAUNCH" --nproc_per_node cpu --standalone --cmd true >/dev/null 2>"$TMP/err"
check "--nproc_per_node cpu starts one worker per core" grep -q "starting $(nproc) worker" "$TMP/err"
CUDA_VISIBLE_DEVICES= "$LAUNCH" --nproc_per_node gpu --standalone --cmd true >/dev/null 2>"$TMP/err"
check "--nproc_per_node gpu without a visible GPU starts one worker" grep -q "starting 1 worker " "$TMP/err"

# ---- two nodes on one machine (fixed --nnodes): ranks, world, one run id; a failure on node 1
# stops node 0 too
W=$(worker node 'env > "$D/env_$RANK"')
W2=$(worker hold2 'echo "$MASTER_PORT" > "$D/port.tmp"; mv "$D/port.tmp" "$D/port"')
rm -f "$TMP/port"
"$LAUNCH" --standalone --cmd "$W2" >/dev/null 2>&1
p=$(cat "$TMP/port")  # a port that was free a moment ago
rm -f "$TMP"/env_*
"$LAUNCH" --nnodes 2 --node_rank 1 --nproc_per_node 2 --master_port "$p" --monitor_interval 0.1 \
  --run_id two-nodes --cmd "$W" >/dev/null 2>"$TMP/err1" &
n1=$!
sleep 0.3  # node 1 starts first and waits for node 0's store
"$LAUNCH" --nnodes 2 --node_rank 0 --nproc_per_node 2 --master_port "$p" --monitor_interval 0.1 \
  --run_id two-nodes --cmd "$W" >/dev/null 2>"$TMP/err0"
rc0=$?
wait $n1
rc1=$?
check "two nodes: both launchers exit 0 (got $rc0, $rc1)" test $rc0 -eq 0 -a $rc1 -eq 0
for r in 0 1 2 3; do
  check "two nodes: rank $r ran with WORLD_SIZE=4, GROUP_RANK=$((r / 2)), LOCAL_RANK=$((r % 2))" \
    bash -c "grep -qx WORLD_SIZE=4 '$TMP/env_$r' && grep -qx GROUP_RANK=$((r / 2)) '$TMP/env_$r' && grep -qx LOCAL_RANK=$((r % 2)) '$TMP/env_$r'"
done
check "two nodes: one run id, one token" \
  bash -c "[ \$(grep -h -e ^CTRAIN_STORE_TOKEN= -e ^CTRAIN_RUN_ID=two-nodes '$TMP'/env_* | sort -u | wc -l) -eq 2 ]"
W=$(worker nodefail 'if [ "$RANK" = 3 ]; then sleep 0.3; echo "rank 3 gives up"; exit 4; fi; exec "$D/sleeper" 1000')
"$LAUNCH" --nnodes 2 --node_rank 0 --nproc_per_node 2 --master_port "$p" --monitor_interval 0.1 \
  --grace_period 2 --cmd "$W" >/dev/null 2>"$TMP/err0" &
n0=$!
"$LAUNCH" --nnodes 2 --node_rank 1 --nproc_per_node 2 --master_port "$p" --monitor_interval 0.1 \
  --grace_period 2 --cmd "$W" >/dev/null 2>"$TMP/err1"
rc1=$?
wait $n0
rc0=$?
check "two nodes, failure on node 1: both exit 4 (got $rc0, $rc1)" test $rc0 -eq 4 -a $rc1 -eq 4
check "two nodes: node 0 names the remote failure" grep -q "node 1 reported a failure: rank 3 .*exited with code 4" "$TMP/err0"
# a failure on node 1 with restarts left: both nodes restart together and finish
W=$(worker noderestart '
if [ "$CTRAIN_RESTART_COUNT" = 0 ]; then
  if [ "$RANK" = 3 ]; then sleep 0.3; exit 9; fi
  exec "$D/sleeper" 1000
fi
echo "$CTRAIN_RESTART_COUNT" > "$D/rc_$RANK"')
rm -f "$TMP"/rc_*
"$LAUNCH" --nnodes 2 --node_rank 0 --nproc_per_node 2 --master_port "$p" --monitor_interval 0.1 \
  --grace_period 2 --max_restarts 1 --cmd "$W" >/dev/null 2>"$TMP/err0" &
n0=$!
"$LAUNCH" --nnodes 2 --node_rank 1 --nproc_per_node 2 --master_port "$p" --monitor_interval 0.1 \
  --grace_period 2 --max_restarts 1 --cmd "$W" >/dev/null 2>"$TMP/err1"
rc1=$?
wait $n0
rc0=$?
check "two nodes, restart: both exit 0 (got $rc0, $rc1)" test $rc0 -eq 0 -a $rc1 -eq 0
check "two nodes, restart: all 4 ranks ran again with CTRAIN_RESTART_COUNT=1" \
  bash -c "[ \"\$(cat '$TMP'/rc_0 '$TMP'/rc_1 '$TMP'/rc_2 '$TMP'/rc_3 2>/dev/null | tr -d '\n')\" = 1111 ]"
# a node with another token is refused; a node whose peer never comes times out
CTRAIN_STORE_TOKEN=aaaa "$LAUNCH" --nnodes 2 --node_rank 0 --master_port "$p" --rdzv_timeout 3 \
  --cmd true >/dev/null 2>"$TMP/err0" &
n0=$!
CTRAIN_STORE_TOKEN=bbbb "$LAUNCH" --nnodes 2 --node_rank 1 --master_port "$p" --rdzv_timeout 3 \
  --cmd true >/dev/null 2>"$TMP/err1"
rc1=$?
wait $n0
rc0=$?
check "two nodes, wrong token: node 1 refused (exit $rc1)" \
  bash -c "[ $rc1 -eq 1 ] && grep -q 'refused the connection: wrong token' '$TMP/err1'"
check "two nodes, missing peer: node 0 times out naming the count (exit $rc0)" \
  bash -c "[ $rc0 -eq 1 ] && grep -q 'rendezvous timed out after 3 s: 1 of 2 nodes joined' '$TMP/err0'"
no_survivors "two nodes"

finish
