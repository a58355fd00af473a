# cluster_lib.sh: a three-host moat cluster on this machine, sourced by
# the cluster test and the cluster benchmark. Each "host" has its own
# address in 127.0.0.0/8 and its own state directory:
#   127.0.1.1  moat-gateway, moat-sessiond, moat-snapd   ($c_root/h1)
#   127.0.2.1  moat-vmd node-a                           ($c_root/h2)
#   127.0.3.1  moat-vmd node-b                           ($c_root/h3)
#   127.0.1.2  a second moat-gateway gw2, with MOAT_CLUSTER_GATEWAYS=2
#              ($c_root/h1b): the same sessiond and snapd; every vmd
#              answers both gateways' surveys ($c_client2 calls it)
# Every link is tls+tcp with certificates made by deploy/moat-pki in
# $c_root/pki. Nothing is sent outside 127.0.0.0/8.
# Needs: $repo, $bin (built binaries), MOAT_IMAGE_DIR; sets $c_root, the
# address variables, $c_client (the moat CLI with the client's TLS
# settings and API key) and c_start / c_stop / c_vmd_start / c_vmd_kill.
# Not for: a real deployment (deploy/ has the unit files and manifests).

c_base=${MOAT_CLUSTER_PORT_BASE:-17700}
c_h1=127.0.1.1
c_h2=127.0.2.1
c_h3=127.0.3.1
c_gw_url=tls+tcp://$c_h1:$c_base
c_survey_url=tls+tcp://$c_h1:$((c_base + 1))
c_sessiond_url=tls+tcp://$c_h1:$((c_base + 2))
c_snapd_url=tls+tcp://$c_h1:$((c_base + 3))
c_gateways=${MOAT_CLUSTER_GATEWAYS:-1}
c_h1b=127.0.1.2
c_gw2_url=tls+tcp://$c_h1b:$c_base
c_survey2_url=tls+tcp://$c_h1b:$((c_base + 1))
# What each vmd answers: every gateway's survey address.
c_surveys=$c_survey_url
[ "$c_gateways" -ge 2 ] && c_surveys=$c_survey_url,$c_survey2_url
c_vmd_port=$((c_base + 10))
declare -A c_pid=()
# Without usable KVM, vmd's accel=auto refuses sandboxes unless allow-tcg
# (TCG is no security boundary); these test hosts accept TCG.
if ! [ -c /dev/kvm ] || ! [ -w /dev/kvm ]; then
	export MOAT_VMD_ALLOW_TCG=${MOAT_VMD_ALLOW_TCG:-true}
fi

# c_tls ROLE NAME: the TLS flags of one service instance.
c_tls() {
	local d=$c_root/pki/$1/$2
	echo "--tls-cert $d/cert.pem --tls-key $d/key.pem --tls-ca $d/ca.pem --tls-peer-ca $d/peer-ca.pem"
}

# c_spawn NAME LOG COMMAND...: starts one service in the background.
c_spawn() {
	local name=$1 log=$2
	shift 2
	setsid "$@" >>"$log" 2>&1 </dev/null &
	c_pid[$name]=$!
}

# c_vmd_start NODE ADDR [extra flags]: a vmd as node NODE on ADDR with
# its own state directory, RAM files and certificate; the cluster's one
# snapshot key (made by the first), so each restores the other's.
c_vmd_start() {
	local node=$1 addr=$2 dir=$c_root/host-$1
	shift 2
	mkdir -p "$dir/logs" "$c_ram/$node"
	# shellcheck disable=SC2046
	c_spawn "vmd-$node" "$dir/logs/vmd.log" "$bin/moat-vmd" \
		--state-dir "$dir" --node-id "$node" \
		--listen "tls+tcp://$addr:$c_vmd_port" \
		--survey "$c_surveys" --snapd "$c_snapd_url" \
		--image-dir "$MOAT_IMAGE_DIR" --ram-dir "$c_ram/$node" \
		--snapshot-key-file "$c_root/snapshot.key" \
		$(c_tls vmd "$node") "$@"
}

c_vmd_kill() { # c_vmd_kill NODE: kill -9, as a host that dies
	kill -KILL "${c_pid[vmd-$1]}" 2>/dev/null
	wait "${c_pid[vmd-$1]}" 2>/dev/null
}

# c_nodes_up N: waits until N nodes are available (30 s).
c_nodes_up() {
	local want=$1 n=0 deadline=$((SECONDS + ${MOAT_CLUSTER_WAIT:-60}))
	while [ $SECONDS -lt $deadline ]; do
		n=$($c_client info --json 2>/dev/null | python3 -c 'import json,sys
try: d = json.load(sys.stdin)
except Exception: print(0); sys.exit()
print(sum(1 for n in d.get("nodes", []) if n.get("available")))')
		[ "${n:-0}" -ge "$want" ] && return 0
		sleep 0.3
	done
	echo "cluster: only ${n:-0} of $want nodes available after the wait" >&2
	return 1
}

# c_gw2_start: the second gateway on $c_h1b (own state dir h1b, own
# certificate gw2), sharing sessiond and snapd.
c_gw2_start() {
	local h=$c_root/h1b p=$c_root/pki
	mkdir -p "$h/logs"
	# shellcheck disable=SC2046
	c_spawn gateway2 "$h/logs/gateway.log" "$bin/moat-gateway" \
		--state-dir "$h" --listen "$c_gw2_url" --survey "$c_survey2_url" \
		--sessiond "$c_sessiond_url" --snapd "$c_snapd_url" \
		--http off --grpc off \
		--survey-tls-peer-ca "$p/gateway/gw2/survey-ca.pem" \
		$(c_tls gateway gw2) "$@"
}

# c_nodes_up2 N: as c_nodes_up, through the second gateway.
c_nodes_up2() {
	local c=$c_client
	c_client=$c_client2
	c_nodes_up "$1"
	local rc=$?
	c_client=$c
	return $rc
}

# c_start: makes the PKI and starts the five services (six with
# MOAT_CLUSTER_GATEWAYS=2); 0 when both nodes answer through the
# gateway (each gateway).
c_start() {
	local h1=$c_root/h1 p=$c_root/pki key
	mkdir -p "$h1/logs"
	c_ram=$(mktemp -d /dev/shm/moat-cluster.XXXXXX) || return 1
	bash "$repo/deploy/moat-pki" init "$p" >/dev/null || return 1
	bash "$repo/deploy/moat-pki" issue "$p" gateway gw1 --san "$c_h1" >/dev/null &&
		bash "$repo/deploy/moat-pki" issue "$p" sessiond sessiond1 >/dev/null &&
		bash "$repo/deploy/moat-pki" issue "$p" snapd snapd1 >/dev/null &&
		bash "$repo/deploy/moat-pki" issue "$p" vmd node-a >/dev/null &&
		bash "$repo/deploy/moat-pki" issue "$p" vmd node-b >/dev/null &&
		bash "$repo/deploy/moat-pki" issue "$p" client alice >/dev/null || return 1
	if [ "$c_gateways" -ge 2 ]; then
		bash "$repo/deploy/moat-pki" issue "$p" gateway gw2 --san "$c_h1b" >/dev/null || return 1
	fi
	# shellcheck disable=SC2046
	c_spawn sessiond "$h1/logs/sessiond.log" "$bin/moat-sessiond" \
		--state-dir "$h1" --listen "$c_sessiond_url" $(c_tls sessiond sessiond1)
	# shellcheck disable=SC2046
	c_spawn snapd "$h1/logs/snapd.log" "$bin/moat-snapd" \
		--state-dir "$h1" --listen "$c_snapd_url" $(c_tls snapd snapd1)
	key=$("$bin/moat-gateway" keys create --tenant default --state-dir "$h1" 2>/dev/null) || return 1
	c_key_b=$("$bin/moat-gateway" keys create --tenant tenant-b --state-dir "$h1" 2>/dev/null) || return 1
	# shellcheck disable=SC2046
	c_spawn gateway "$h1/logs/gateway.log" "$bin/moat-gateway" \
		--state-dir "$h1" --listen "$c_gw_url" --survey "$c_survey_url" \
		--sessiond "$c_sessiond_url" --snapd "$c_snapd_url" \
		--http off --grpc off \
		--survey-tls-peer-ca "$p/gateway/gw1/survey-ca.pem" \
		$(c_tls gateway gw1)
	# The keys made above are in h1's local store: gateway 1 imports
	# them into sessiond when it starts, where gateway 2 finds them.
	[ "$c_gateways" -lt 2 ] || c_gw2_start
	c_vmd_start node-a "$c_h2"
	c_vmd_start node-b "$c_h3"
	c_client_tls="--gateway $c_gw_url --tls-ca $p/client/alice/ca.pem --tls-name gateway"
	c_client="$bin/moat $c_client_tls --api-key $key"
	c_client2_tls="--gateway $c_gw2_url --tls-ca $p/client/alice/ca.pem --tls-name gateway"
	c_client2="$bin/moat $c_client2_tls --api-key $key"
	c_key=$key
	c_nodes_up 2 || return 1
	[ "$c_gateways" -lt 2 ] || c_nodes_up2 2
}

c_stop() {
	local name
	for name in "${!c_pid[@]}"; do
		kill -TERM "${c_pid[$name]}" 2>/dev/null
	done
	for name in "${!c_pid[@]}"; do
		for _ in $(seq 1 100); do
			kill -0 "${c_pid[$name]}" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "${c_pid[$name]}" 2>/dev/null
	done
	pkill -KILL -f "$c_root" 2>/dev/null
	[ -n "${c_ram:-}" ] && rm -rf "$c_ram"
	c_pid=()
}
