#!/usr/bin/env bash
# Multi-node runs over real network interfaces. Two network namespaces are the two "nodes",
# joined by a veth pair with addresses of their own (10.77.X.1 and 10.77.X.2, X random); one
# ctrain-launch runs in each (`ip netns exec`). Scenarios: node ranks from the store and the
# workers' environment (NCCL_SOCKET_IFNAME); 2 nodes x 2 workers train exactly like 1 node x 4;
# node 1's launcher killed -> node 0 names the lost node within the heartbeat timeout and exits
# non-zero, nothing left running; --nnodes 1:2 -> node 0 goes on alone from the last checkpoint
# (train.grad_accum keeps the global batch) and a node that comes back is admitted at the next
# restart; a cut link -> both sides fail. Needs root and iproute2: exit 77 (skipped) otherwise.
# Everything it creates (namespaces, veth pair, processes) is removed on exit.
source "$(dirname "$0")/lib.sh"
SRC=${CT_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
LAUNCH=$(dirname "$CTRAIN")/ctrain-launch
[ -x "$LAUNCH" ] || { echo "no ctrain-launch next to $CTRAIN"; exit 1; }

# ---- the fixture: two namespaces and a veth pair, torn down whatever happens
NA=ctrain-mn-$$-a NB=ctrain-mn-$$-b  # namespaces
VA=ctmn$$a VB=ctmn$$b                # interfaces (<= 15 characters)
X=$((RANDOM % 200 + 20))
ADDR_A=10.77.$X.1 ADDR_B=10.77.$X.2
created=()
survivors() { pgrep -f "$TMP" | grep -v "^$$\$" || true; }
teardown() {
  local left
  left=$(survivors)
  # shellcheck disable=SC2086
  [ -z "$left" ] || kill -9 $left 2>/dev/null
  # deleting a namespace deletes the veth end in it, and with it the peer
  for ns in "${created[@]}"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$TMP"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM  # a test runner's timeout still tears down
skip() { echo "skipped: $*"; exit 77; }
command -v ip >/dev/null || skip "no ip command (iproute2; scripts/install-deps.sh installs it)"
[ "$(id -u)" -eq 0 ] || skip "creating network namespaces needs root"
for ns in "$NA" "$NB"; do
  err=$(ip netns add "$ns" 2>&1) || skip "cannot create a network namespace: $err"
  created+=("$ns")
done
err=$( { ip -n "$NA" link add "$VA" type veth peer name "$VB" netns "$NB" &&
         ip -n "$NA" addr add "$ADDR_A/24" dev "$VA" && ip -n "$NB" addr add "$ADDR_B/24" dev "$VB" &&
         ip -n "$NA" link set "$VA" up && ip -n "$NB" link set "$VB" up &&
         ip -n "$NA" link set lo up && ip -n "$NB" link set lo up; } 2>&1) ||
  skip "cannot set up the veth pair: $err"
echo "nodes: $NA ($VA $ADDR_A), $NB ($VB $ADDR_B)"

# launch_on NS LOG ARGS...: one ctrain-launch (2 workers) in namespace NS, in the background ($!
# is the launcher: ip netns exec execs it)
launch_on() {
  local ns=$1 log=$2
  shift 2
  ip netns exec "$ns" "$LAUNCH" --nproc_per_node 2 --master_addr "$ADDR_A" --monitor_interval 0.2 "$@" \
    >"$log" 2>&1 &
}
no_survivors() { # no_survivors WHAT: nothing of the run is left (retries briefly)
  for _ in $(seq 30); do [ -z "$(survivors)" ] && break; sleep 0.1; done
  local left
  left=$(survivors)
  check "$1: no process of the run remains" test -z "$left"
  # shellcheck disable=SC2086  # one line of pids
  [ -z "$left" ] || ps -o pid,args -p "$(echo $left | tr ' ' ,)" || true
}
last_step() { sed -n 's/^{"step": \([0-9]*\), "loss".*/\1/p' "$1/metrics.jsonl" 2>/dev/null | tail -1; }
wait_step() { # wait_step DIR STEP SECONDS: until metrics reach STEP
  for _ in $(seq $(($3 * 10))); do [ "$(last_step "$1")" -ge "$2" ] 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
wait_line() { # wait_line FILE PATTERN SECONDS
  for _ in $(seq $(($3 * 10))); do grep -qE -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}

make_data "$TMP/data" || exit 1
args=("$SRC/configs/smoke.toml" "data.train=$TMP/data/train.h5" "data.val=$TMP/data/val.h5"
      model.n_layer=2 model.d_model=64 model.max_seq_len=64 train.seq_len=64 train.micro_batch=4
      train.eval_every=5 train.eval_steps=2 train.sample_tokens=0 train.warmup_steps=2
      train.max_steps=10 train.threads=1)

# ---- rendezvous without --node_rank: node 0 is the launcher on --master_addr, node 1 the other
# (although it starts first); the workers' environment
# shellcheck disable=SC2016  # $RANK is the worker's
printf '#!/bin/bash\nenv > "%s/env_$RANK"\n' "$TMP" >"$TMP/env.sh"
chmod +x "$TMP/env.sh"
launch_on "$NB" "$TMP/env_b.log" --nnodes 2 --master_port 29510 --socket_ifname "$VB" --cmd "$TMP/env.sh"
b=$!
sleep 0.3
launch_on "$NA" "$TMP/env_a.log" --nnodes 2 --master_port 29510 --cmd "$TMP/env.sh"
a=$!
wait $a; ra=$?; wait $b; rb=$?
check "env: both launchers exit 0 (got $ra, $rb)" test $ra -eq 0 -a $rb -eq 0
for r in 0 1 2 3; do
  node=$((r / 2))
  check "env: rank $r: GROUP_RANK=$node, WORLD_SIZE=4, MASTER_ADDR=$ADDR_A" \
    bash -c "grep -qx GROUP_RANK=$node '$TMP/env_$r' && grep -qx WORLD_SIZE=4 '$TMP/env_$r' && grep -qx MASTER_ADDR=$ADDR_A '$TMP/env_$r'"
done
check "env: node 0's workers get NCCL_SOCKET_IFNAME=$VA (the interface that reaches the master)" \
  bash -c "grep -qx NCCL_SOCKET_IFNAME=$VA '$TMP/env_0' && grep -qx NCCL_SOCKET_IFNAME=$VA '$TMP/env_1'"
check "env: --socket_ifname $VB sets NCCL_ and CTRAIN_SOCKET_IFNAME on node 1" \
  bash -c "grep -qx NCCL_SOCKET_IFNAME=$VB '$TMP/env_3' && grep -qx CTRAIN_SOCKET_IFNAME=$VB '$TMP/env_3'"
check "env: node 1 was told its rank" grep -q "starting 2 workers on node 1 of 2 (world size 4), store $ADDR_A:29510" "$TMP/env_b.log"

# ---- 2 nodes x 2 workers over the veth pair == 1 node x 4 workers
"$LAUNCH" --nproc_per_node 4 --standalone "${args[@]}" "train.out_dir=$TMP/one" >"$TMP/one.log" 2>&1
check "1 node x 4 workers trains (exit $?)" test -f "$TMP/one/ckpt/latest/state.h5"
launch_on "$NB" "$TMP/two_b.log" --nnodes 2 --master_port 29511 "${args[@]}" "train.out_dir=$TMP/two"
b=$!
launch_on "$NA" "$TMP/two_a.log" --nnodes 2 --master_port 29511 "${args[@]}" "train.out_dir=$TMP/two"
a=$!
wait $a; ra=$?; wait $b; rb=$?
check "2 nodes x 2 workers train (exit $ra, $rb)" test $ra -eq 0 -a $rb -eq 0
check "2 x 2 == 1 x 4: losses within 1e-5" close "$TMP/one" "$TMP/two" loss 1e-5
check "2 x 2 == 1 x 4: gradient norms within 1e-4" close "$TMP/one" "$TMP/two" grad_norm 1e-4

# ---- node 1's launcher killed (SIGKILL): node 0 names the lost node within the heartbeat
# timeout (5 s) and exits non-zero; nothing is left on either node. Gloo binds by interface here.
long=("${args[@]}" train.max_steps=100000 train.checkpoint_every=5)
launch_on "$NB" "$TMP/kill_b.log" --nnodes 2 --master_port 29512 --heartbeat_timeout 5 --grace_period 3 \
  --socket_ifname "$VB" "${long[@]}" "train.out_dir=$TMP/kill"
b=$!
launch_on "$NA" "$TMP/kill_a.log" --nnodes 2 --master_port 29512 --heartbeat_timeout 5 --grace_period 3 \
  --socket_ifname "$VA" "${long[@]}" "train.out_dir=$TMP/kill"
a=$!
if wait_step "$TMP/kill" 3 60; then
  t0=$(date +%s.%N)
  kill -9 $b
  wait $b 2>/dev/null
  wait_line "$TMP/kill_a.log" "lost: no heartbeat" 20
  t1=$(date +%s.%N)
  wait $a
  ra=$?
  t2=$(date +%s.%N)
  seen=$(awk "BEGIN{print $t1 - $t0}")
  gone=$(awk "BEGIN{print $t2 - $t0}")
  check "kill: node 0 exits non-zero (got $ra)" test $ra -ne 0
  check "kill: node 0 names the lost node" grep -q "node 1 ($ADDR_B, host .*) lost: no heartbeat for" "$TMP/kill_a.log"
  check "kill: reported ${seen}s after the kill (heartbeat timeout 5 s, checked every 1 s)" \
    awk "BEGIN{exit !($seen <= 6.5)}"
  check "kill: node 0 gone ${gone}s after the kill (+ the 3 s grace period at most)" awk "BEGIN{exit !($gone <= 10)}"
  check "kill: the failure line names the lost node" \
    grep -q "failed: node 1 ($ADDR_B, host .*) lost: no heartbeat for .*; exiting with 1" "$TMP/kill_a.log"
else
  check "kill: training started on both nodes" false
  kill -9 $a $b
fi
no_survivors "kill"

# ---- elastic --nnodes 1:2 with a restart budget: node 1 killed -> node 0 re-forms the group
# alone (not a counted restart), resumes from the last checkpoint with grad_accum 2 (the same
# global batch) and goes on; node 1 started again waits, and is admitted at the next restart (a
# killed worker, counted); the run completes on 2 nodes
el=(--nnodes 1:2 --master_port 29513 --heartbeat_timeout 5 --grace_period 3 --max_restarts 1 --rdzv_last_call 10
    "${args[@]}" train.max_steps=150 train.checkpoint_every=5 "train.out_dir=$TMP/el")
launch_on "$NB" "$TMP/el_b.log" "${el[@]}"
b=$!
launch_on "$NA" "$TMP/el_a.log" "${el[@]}"
a=$!
ok=0
if wait_step "$TMP/el" 12 60; then
  kill -9 $b
  wait $b 2>/dev/null
  if wait_line "$TMP/el_a.log" "world size 4 -> 2" 20 && wait_step "$TMP/el" 15 20; then
    launch_on "$NB" "$TMP/el_b2.log" "${el[@]}"
    b=$!
    if wait_line "$TMP/el_b2.log" "waiting to be admitted at the next restart" 20; then
      # a worker of node 0 dies: a counted restart, which admits node 1
      victim=$(pgrep -P $a -f "train.out_dir=$TMP/el" | tail -1)
      [ -n "$victim" ] && kill -9 "$victim"
      ok=1
    fi
  fi
fi
if [ $ok = 1 ]; then
  wait $a; ra=$?; wait $b; rb=$?
  check "elastic: both launchers complete (exit $ra, $rb)" test $ra -eq 0 -a $rb -eq 0
  check "elastic: node 1 reported lost" grep -q "node 1 ($ADDR_B, host .*) lost: no heartbeat" "$TMP/el_a.log"
  check "elastic: the membership change is not a counted restart" \
    grep -q "membership change: re-forming the group (round 1; not counted against --max_restarts)" "$TMP/el_a.log"
  check "elastic: the log shows the world size change 4 -> 2" grep -q "world size 4 -> 2 (2 -> 1 nodes)" "$TMP/el_a.log"
  check "elastic: node 0 resumed alone from the last checkpoint" \
    grep -qE "^\[rank0\]: resumed from .*/el/ckpt/latest.* at step (5|10|15)" "$TMP/el_a.log"
  check "elastic: train.grad_accum=2 keeps the global batch on 2 ranks" \
    grep -q "world size 2: train.grad_accum=2 (config: 1)" "$TMP/el_a.log"
  check "elastic: every round trains 1024 tokens per step" \
    bash -c "[ \"\$(grep -o '= [0-9]* tokens per step' '$TMP/el_a.log' | sort -u)\" = '= 1024 tokens per step' ]"
  check "elastic: the killed worker cost the one restart" grep -q "restarting the worker group (restart 1 of 1)" "$TMP/el_a.log"
  check "elastic: the late node was admitted (world size 2 -> 4)" grep -q "world size 2 -> 4 (1 -> 2 nodes)" "$TMP/el_a.log"
  check "elastic: ... as node 1" grep -q "starting 2 workers on node 1 of 2 (world size 4)" "$TMP/el_b2.log"
  check "elastic: the run reached step 150 (got $(last_step "$TMP/el"))" test "$(last_step "$TMP/el")" = 150
else
  check "elastic: node 1 lost and re-admitted as planned (see $TMP/el_a.log)" false
  sed 's/^/    /' "$TMP/el_a.log" | grep -v '\[rank' | tail -20
  kill -9 $a $b 2>/dev/null
fi
no_survivors "elastic"

# ---- a cut link (node 1's interface down): node 0 loses node 1 by its heartbeats, node 1 loses
# the store by its bounded store calls; both fail and stop their workers
launch_on "$NB" "$TMP/cut_b.log" --nnodes 2 --master_port 29514 --heartbeat_timeout 4 --grace_period 2 \
  "${long[@]}" "train.out_dir=$TMP/cut"
b=$!
launch_on "$NA" "$TMP/cut_a.log" --nnodes 2 --master_port 29514 --heartbeat_timeout 4 --grace_period 2 \
  "${long[@]}" "train.out_dir=$TMP/cut"
a=$!
if wait_step "$TMP/cut" 3 60; then
  t0=$(date +%s.%N)
  ip -n "$NB" link set "$VB" down
  wait $a; ra=$?; wait $b; rb=$?
  gone=$(awk "BEGIN{print $(date +%s.%N) - $t0}")
  check "cut link: both nodes exit non-zero (got $ra, $rb)" test $ra -ne 0 -a $rb -ne 0
  check "cut link: node 0 names the lost node" grep -q "node 1 ($ADDR_B, host .*) lost: no heartbeat" "$TMP/cut_a.log"
  check "cut link: node 1 reports the lost store" grep -q "lost the store at $ADDR_A:29514" "$TMP/cut_b.log"
  check "cut link: both gone ${gone}s after the cut (heartbeat 4 s + grace 2 s + slack)" \
    awk "BEGIN{exit !($gone <= 12)}"
else
  check "cut link: training started on both nodes" false
  kill -9 $a $b
fi
no_survivors "cut link"

expect_fail 2 '--nnodes 3:2: MIN is larger than MAX' -- "$LAUNCH" --nnodes 3:2 --cmd true
finish
