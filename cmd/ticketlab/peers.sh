#!/usr/bin/env bash
# peers.sh: the lock services Ticketing is compared with, from Debian's
# packages, on loopback, for `ticketlab compare` (cmd/ticketlab).
#
#   peers.sh install        apt-get install what is missing (etcd-server,
#                           zookeeper, redis-server); Debian's own services
#                           are kept from starting and left disabled
#   peers.sh start  DIR     start the three peers with their data in DIR and
#                           wait until each serves
#   peers.sh status DIR     what runs, and whether it answers
#   peers.sh stop   DIR     stop everything `start DIR` started (by the pids
#                           it recorded in DIR/pids); nothing is left running
#                           (the data stays in DIR: rm -rf DIR to start anew)
#
# What runs (all on 127.0.0.1, plaintext, no authentication):
#
#   etcd       3 members e1..e3 (Debian etcd-server, 3.4.x): clients on
#              23791-23793, peers on 23801-23803, data in DIR/etcd-N.
#              Default durability: the WAL is fsynced before every Raft
#              ready batch is acknowledged (one fsync per batch of
#              commits); no --unsafe-no-fsync.
#   ZooKeeper  3 servers (Debian zookeeper, 3.8.x), run as
#              org.apache.zookeeper.server.quorum.QuorumPeerMain with a
#              generated DIR/zk-N/zoo.cfg: clients on 21811-21813, quorum
#              ports 28881-28883, election ports 38881-38883, dataDir
#              DIR/zk-N (with myid), JVM -Xms128m -Xmx512m. forceSync=yes
#              (the default, written out): the transaction log is fsynced
#              before a proposal is acknowledged (group commit).
#              maxClientCnxns=0 (the default 60 per client IP would refuse
#              256 benchmark connections from 127.0.0.1), admin server off,
#              4-letter words srvr/ruok/mntr allowed (readiness checks).
#   Redis      ONE node (Debian redis-server, 7.0.x) on 26379: unreplicated,
#              no persistence at all (save "" and appendonly no): nothing
#              is fsynced, a crash forgets every lock. This is how redsync
#              is commonly deployed against one instance; it is the
#              "fast but not durable, not replicated" reference.
#
# Ticketing's nodes always fsync every Raft entry (bolt, group commit), so
# the headline comparison is against etcd and ZooKeeper, which are durable
# and replicated the same way; Redis is listed for scale.
#
# Ports differ from the packages' defaults (2379/2380, 2181, 6379), so a
# Debian service that was left running elsewhere does not get in the way.

set -euo pipefail

ETCD_CLIENT=(23791 23792 23793)
ETCD_PEER=(23801 23802 23803)
ZK_CLIENT=(21811 21812 21813)
ZK_QUORUM=(28881 28882 28883)
ZK_ELECT=(38881 38882 38883)
REDIS_PORT=26379
ZK_HEAP="${ZK_HEAP:--Xms128m -Xmx512m}"

die() { echo "peers.sh: $*" >&2; exit 1; }
log() { echo "peers.sh: $*" >&2; }

usage() {
	sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

# --- install -----------------------------------------------------------

do_install() {
	[ "$(id -u)" = 0 ] || die "install needs root (apt-get)"
	local want=() p
	for p in etcd-server zookeeper redis-server; do
		if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
			want+=("$p")
		fi
	done
	if [ ${#want[@]} -gt 0 ]; then
		# Keep Debian's maintainer scripts from starting the packages'
		# services (they would listen on 2379/2181/6379 with their own
		# data): invoke-rc.d and deb-systemd-invoke obey policy-rc.d.
		local made_policy=0
		if [ ! -e /usr/sbin/policy-rc.d ]; then
			printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
			chmod 755 /usr/sbin/policy-rc.d
			made_policy=1
		fi
		log "installing ${want[*]}"
		local rc=0
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${want[@]}" || rc=$?
		if [ $rc -ne 0 ]; then
			log "apt-get install failed; running apt-get update and trying again"
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${want[@]}" && rc=0
		fi
		[ $made_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
		[ $rc -eq 0 ] || die "apt-get install ${want[*]} failed"
	else
		log "etcd-server, zookeeper and redis-server are installed"
	fi
	# Whatever happened during installation, leave Debian's services
	# stopped and disabled.
	local svc
	for svc in etcd zookeeper redis-server; do
		if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
			systemctl disable --now "$svc" >/dev/null 2>&1 || true
		elif [ -x "/etc/init.d/$svc" ]; then
			"/etc/init.d/$svc" stop >/dev/null 2>&1 || true
			command -v update-rc.d >/dev/null && update-rc.d "$svc" disable >/dev/null 2>&1 || true
		fi
	done
	command -v etcd >/dev/null || die "no etcd binary after install"
	command -v redis-server >/dev/null || die "no redis-server binary after install"
	command -v java >/dev/null || die "no java after install (zookeeper depends on a JRE)"
	zk_classpath >/dev/null || die "cannot find ZooKeeper's jars"
	versions
}

# --- helpers -----------------------------------------------------------

# zk_classpath prints the class path Debian's zookeeper package runs with:
# /usr/share/java/zookeeper.jar and the jars it depends on, as its
# /etc/zookeeper/conf/environment (ZOOCFGDIR) and zkEnv.sh build it.
zk_classpath() {
	local cp="" env=/etc/zookeeper/conf/environment
	if [ -r "$env" ]; then
		# shellcheck disable=SC1090
		cp=$(
			set +u
			. "$env" >/dev/null 2>&1
			echo "${CLASSPATH:-}"
		)
	fi
	if [ -z "$cp" ]; then
		local j
		for j in /usr/share/java/zookeeper.jar /usr/share/java/zookeeper-jute.jar \
			/usr/share/java/slf4j-api.jar /usr/share/java/logback-classic.jar /usr/share/java/logback-core.jar \
			/usr/share/java/netty-*.jar /usr/share/java/commons-cli.jar /usr/share/java/commons-io.jar \
			/usr/share/java/jline.jar /usr/share/java/snappy-java.jar /usr/share/java/metrics-core.jar \
			/usr/share/java/audience-annotations.jar; do
			[ -e "$j" ] && cp="$cp${cp:+:}$j"
		done
	fi
	# Drop the package's config dir: we give each server its own.
	cp=$(echo "$cp" | tr ':' '\n' | grep -v '^/etc/zookeeper' | grep -v '^$' | paste -sd: -)
	[ -n "$cp" ] || return 1
	echo "$cp"
}

versions() {
	local v
	v=$(etcd --version 2>/dev/null | sed -n 's/^etcd Version: //p')
	echo "etcd ${v:-?}"
	v=$(dpkg-query -W -f='${Version}' zookeeper 2>/dev/null || true)
	echo "zookeeper ${v:-?}"
	v=$(redis-server --version 2>/dev/null | sed -n 's/.*v=\([^ ]*\).*/\1/p')
	echo "redis ${v:-?}"
}

# tcp_say PORT TEXT: send TEXT to 127.0.0.1:PORT and print the answer.
tcp_say() {
	local port=$1 text=$2
	timeout 2 bash -c '
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		printf "%b" "$2" >&3
		timeout 1 cat <&3
	' _ "$port" "$text" 2>/dev/null || true
}

etcd_healthy() { tcp_say "$1" 'GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' | grep -q '"health":"true"'; }
zk_mode() { tcp_say "$1" 'srvr' | sed -n 's/^Mode: //p'; }
redis_ping() { tcp_say "$REDIS_PORT" 'PING\r\n' | grep -q PONG; }

# spawn NAME LOG CMD...: start CMD in its own session, stdin closed, its
# output appended to LOG; record its pid in $PIDS/NAME.pid.
spawn() {
	local name=$1 logf=$2
	shift 2
	local pf="$PIDS/$name.pid"
	if [ -f "$pf" ] && kill -0 "$(cat "$pf")" 2>/dev/null; then
		die "$name already runs (pid $(cat "$pf")); peers.sh stop $DIR first"
	fi
	setsid "$@" </dev/null >>"$logf" 2>&1 &
	echo $! >"$pf"
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# --- start -------------------------------------------------------------

do_start() {
	mkdir -p "$DIR" "$PIDS"
	local i p
	for p in "${ETCD_CLIENT[@]}" "${ETCD_PEER[@]}" "${ZK_CLIENT[@]}" "${ZK_QUORUM[@]}" "${ZK_ELECT[@]}" $REDIS_PORT; do
		port_free "$p" || die "port $p is in use (peers already running? peers.sh status $DIR)"
	done
	command -v etcd >/dev/null && command -v redis-server >/dev/null && command -v java >/dev/null ||
		die "peers are not installed: peers.sh install"

	# etcd: three members, default durability (WAL fsync), plaintext.
	local cluster=""
	for i in 1 2 3; do
		cluster="$cluster${cluster:+,}e$i=http://127.0.0.1:${ETCD_PEER[$((i - 1))]}"
	done
	for i in 1 2 3; do
		local c=${ETCD_CLIENT[$((i - 1))]} pp=${ETCD_PEER[$((i - 1))]}
		mkdir -p "$DIR/etcd-$i"
		spawn "etcd-$i" "$DIR/etcd-$i.log" etcd \
			--name "e$i" --data-dir "$DIR/etcd-$i/data" \
			--listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
			--listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
			--initial-cluster "$cluster" --initial-cluster-token ticketbench \
			--initial-cluster-state new --logger zap --log-level warn
	done

	# ZooKeeper: three servers, QuorumPeerMain with a generated zoo.cfg.
	local cp
	cp=$(zk_classpath) || die "cannot find ZooKeeper's jars (peers.sh install)"
	for i in 1 2 3; do
		local d="$DIR/zk-$i"
		mkdir -p "$d/data"
		echo "$i" >"$d/data/myid"
		{
			echo "# generated by cmd/ticketlab/peers.sh"
			echo "tickTime=2000"
			echo "initLimit=10"
			echo "syncLimit=5"
			echo "dataDir=$d/data"
			echo "clientPortAddress=127.0.0.1"
			echo "clientPort=${ZK_CLIENT[$((i - 1))]}"
			echo "forceSync=yes"
			echo "maxClientCnxns=0"
			echo "admin.enableServer=false"
			echo "4lw.commands.whitelist=srvr,ruok,mntr,stat"
			echo "autopurge.purgeInterval=0"
			local j
			for j in 1 2 3; do
				echo "server.$j=127.0.0.1:${ZK_QUORUM[$((j - 1))]}:${ZK_ELECT[$((j - 1))]}"
			done
		} >"$d/zoo.cfg"
		# Log to the console (our log file), warnings and worse.
		cat >"$d/logback.xml" <<'EOF'
<configuration>
  <appender name="CONSOLE" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{ISO8601} [myid:%X{myid}] %-5level [%t:%C{1}@%L] - %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="CONSOLE"/></root>
</configuration>
EOF
		cat >"$d/log4j.properties" <<'EOF'
log4j.rootLogger=WARN, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} [myid:%X{myid}] %-5p [%t:%C{1}@%L] - %m%n
EOF
		# shellcheck disable=SC2086
		spawn "zk-$i" "$DIR/zk-$i.log" java $ZK_HEAP \
			-Dzookeeper.log.dir="$d" -Dzookeeper.root.logger=WARN,CONSOLE \
			-Dlogback.configurationFile="$d/logback.xml" -Dlog4j.configuration="file:$d/log4j.properties" \
			-cp "$cp" org.apache.zookeeper.server.quorum.QuorumPeerMain "$d/zoo.cfg"
	done

	# Redis: one node, no persistence (nothing is written or fsynced).
	mkdir -p "$DIR/redis"
	spawn redis "$DIR/redis.log" redis-server --bind 127.0.0.1 --port $REDIS_PORT \
		--save "" --appendonly no --dir "$DIR/redis" --daemonize no \
		--protected-mode yes --maxclients 10000 --loglevel warning

	wait_ready || {
		log "not ready; logs in $DIR/*.log"
		return 1
	}
	versions >"$DIR/versions.txt"
	log "ready: etcd 127.0.0.1:${ETCD_CLIENT[0]},${ETCD_CLIENT[1]},${ETCD_CLIENT[2]}; zookeeper 127.0.0.1:${ZK_CLIENT[0]},${ZK_CLIENT[1]},${ZK_CLIENT[2]}; redis 127.0.0.1:$REDIS_PORT"
}

wait_ready() {
	local deadline=$((SECONDS + 120)) ok i
	while [ $SECONDS -lt $deadline ]; do
		ok=1
		for i in 1 2 3; do
			etcd_healthy "${ETCD_CLIENT[$((i - 1))]}" || ok=0
		done
		local leaders=0 followers=0 m
		for i in 1 2 3; do
			m=$(zk_mode "${ZK_CLIENT[$((i - 1))]}")
			[ "$m" = leader ] && leaders=$((leaders + 1))
			[ "$m" = follower ] && followers=$((followers + 1))
		done
		[ $leaders = 1 ] && [ $followers = 2 ] || ok=0
		redis_ping || ok=0
		if [ $ok = 1 ]; then
			return 0
		fi
		for f in "$PIDS"/*.pid; do
			kill -0 "$(cat "$f")" 2>/dev/null || {
				log "$(basename "$f" .pid) exited; its log:"
				tail -20 "$DIR/$(basename "$f" .pid).log" >&2 || true
				return 1
			}
		done
		sleep 0.5
	done
	log "timed out after 120 s"
	do_status || true
	return 1
}

# --- status / stop -------------------------------------------------------

do_status() {
	local i f name
	[ -d "$PIDS" ] || {
		echo "nothing started in $DIR"
		return 1
	}
	for f in "$PIDS"/*.pid; do
		[ -e "$f" ] || continue
		name=$(basename "$f" .pid)
		if kill -0 "$(cat "$f")" 2>/dev/null; then
			echo "$name: running, pid $(cat "$f")"
		else
			echo "$name: not running"
		fi
	done
	for i in 1 2 3; do
		if etcd_healthy "${ETCD_CLIENT[$((i - 1))]}"; then
			echo "etcd e$i 127.0.0.1:${ETCD_CLIENT[$((i - 1))]}: healthy"
		else echo "etcd e$i 127.0.0.1:${ETCD_CLIENT[$((i - 1))]}: not healthy"; fi
	done
	local m
	for i in 1 2 3; do
		m=$(zk_mode "${ZK_CLIENT[$((i - 1))]}")
		echo "zookeeper $i 127.0.0.1:${ZK_CLIENT[$((i - 1))]}: ${m:-not serving}"
	done
	if redis_ping; then echo "redis 127.0.0.1:$REDIS_PORT: PONG"; else echo "redis 127.0.0.1:$REDIS_PORT: not answering"; fi
}

do_stop() {
	[ -d "$PIDS" ] || {
		log "nothing started in $DIR"
		return 0
	}
	local f pid pids=()
	for f in "$PIDS"/*.pid; do
		[ -e "$f" ] || continue
		pid=$(cat "$f")
		if kill -0 "$pid" 2>/dev/null; then
			kill -TERM "$pid" 2>/dev/null || true
			pids+=("$pid")
		fi
	done
	local deadline=$((SECONDS + 15)) alive
	while [ $SECONDS -lt $deadline ]; do
		alive=0
		for pid in "${pids[@]}"; do
			kill -0 "$pid" 2>/dev/null && alive=1
		done
		[ $alive = 0 ] && break
		sleep 0.2
	done
	for pid in "${pids[@]}"; do
		if kill -0 "$pid" 2>/dev/null; then
			log "pid $pid ignored SIGTERM; SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	done
	rm -f "$PIDS"/*.pid
	log "stopped ${#pids[@]} processes"
}

# --- main --------------------------------------------------------------

[ $# -ge 1 ] || usage
cmd=$1
case "$cmd" in
install)
	do_install
	exit 0
	;;
versions)
	versions
	exit 0
	;;
start | stop | status) ;;
*) usage ;;
esac
[ $# -ge 2 ] || usage
DIR=$(mkdir -p "$2" && cd "$2" && pwd)
PIDS="$DIR/pids"
case "$cmd" in
start) do_start ;;
stop) do_stop ;;
status) do_status ;;
esac
