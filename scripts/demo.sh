#!/usr/bin/env bash
# The main job on an embedded local cluster: 4 servers, a small tree, a benchmark against
# the local file system, the cluster's counters, fsck, and the cluster taken down.
set -euo pipefail
PLUSFS=${PLUSFS:-plusfs}
data=$(mktemp -d -t plusfs-demo.XXXXXX)
cleanup() { "$PLUSFS" cluster down --data "$data" >/dev/null 2>&1 || true; rm -rf "$data"; }
trap cleanup EXIT
step() { printf '\n== %s\n' "$*"; }

step "starting a 4-server cluster in $data"
"$PLUSFS" cluster up --servers 4 --data "$data" --detach
export PLUSFS_CLUSTER="$data/cluster.toml"

step "building a small tree"
"$PLUSFS" mkdir -p /demo/projects/alpha /demo/projects/beta/results /demo/scratch
"$PLUSFS" touch /demo/projects/alpha/{input,config,notes}.txt /demo/projects/beta/results/run-{1,2,3}.out
"$PLUSFS" ln -s /demo/projects/alpha /demo/current
"$PLUSFS" mv /demo/projects/beta /demo/projects/gamma
"$PLUSFS" chmod 700 /demo/scratch
"$PLUSFS" ls -l /demo /demo/projects /demo/projects/gamma/results
"$PLUSFS" stat /demo/projects/gamma

step "file contents: a 3 MB file in and out, and a short one through stdin"
head -c 3000000 /dev/urandom > "$data/blob"
"$PLUSFS" put "$data/blob" /demo/projects/alpha/blob
"$PLUSFS" get /demo/projects/alpha/blob "$data/blob.back"
cmp "$data/blob" "$data/blob.back" && echo "3 MB round trip: identical"
echo "hello from plusfs" | "$PLUSFS" put - /demo/hello
"$PLUSFS" cat /demo/hello

step "a huge directory: distributed from creation, 4,000 files created in batches"
"$PLUSFS" mkdir --threshold 0 /demo/huge
"$PLUSFS" bench create --clients 2 --files 2000 --batch 500 --dir /demo/huge
"$PLUSFS" hugedir /demo/huge

step "plusfs bench: create, stat, unlink; 4 clients, one shared directory; vs the local file system"
"$PLUSFS" bench create stat unlink --clients 4 --files 2500 --shared --dir /demo/bench \
  --target plusfs --target "local:$data/local"

step "cluster status"
"$PLUSFS" cluster status --data "$data"

step "fsck"
"$PLUSFS" fsck

step "taking the cluster down"
"$PLUSFS" cluster down --data "$data"
