#!/usr/bin/env bash
# Runs a command against a throwaway high-availability PostgreSQL cluster:
# pg_auto_failover (Debian's postgresql-15-auto-failover) with a monitor, a
# primary and a synchronous standby, each a local PostgreSQL 15 instance on
# its own port, all under one temporary folder.
#
#   scripts/with-failover-cluster.sh go test -v ./internal/failover/
#
# `make failover` runs it (internal/failover). What it does:
#   - the packages: PostgreSQL 15's server, pg_auto_failover and iptables
#     are installed with apt-get when missing, as root, as
#     scripts/with-postgres.sh installs the test server (no cluster of the
#     package's own is created); otherwise it stops and says what to install;
#   - as root, it runs in a network namespace of its own (unshare --net):
#     only a loopback device, so the cluster's ports collide with nothing on
#     the machine, nothing of it is reachable from outside, and the fault
#     that cuts a node's network (iptables rules, below) stays inside it;
#   - the instances run as the unprivileged user "postgres" (created if
#     missing), with their sockets, data, logs and pg_autoctl's own files
#     (XDG_CONFIG_HOME, XDG_DATA_HOME, XDG_RUNTIME_DIR) in the folder;
#     TCP only on 127.0.0.x, which pg_auto_failover needs between its nodes;
#     fsync stays on;
#   - the monitor fails over within seconds, not its default half-minute or
#     more (the timeouts below; docs/operations.md, "High availability");
#   - everything is stopped and the folder removed at the end, also when the
#     command fails or is interrupted (Ctrl-C);
#   - the cluster's commands run in /, not in the caller's folder, which
#     "postgres" may not be able to enter; what that user needs (the
#     programs, the folder under TMPDIR) is checked first, and a path it
#     cannot use is named at once;
#   - it is PostgreSQL 15 only: ARBOR_PG_VERSION (scripts/with-postgres.sh)
#     set to another version is refused.
#
# The command gets:
#   - ARBOR_DATABASE_URL: a multi-host connection string naming both data
#     nodes with target_session_attrs=read-write, as an application
#     configures it: whichever node is primary is the one connected to;
#   - ARBOR_FAILOVER_MONITOR_URL: the monitor's database (SELECT * FROM
#     pgautofailover.current_state('default') tells who is primary);
#   - ARBOR_FAILOVER_OUTSIDE_URL: a database on the monitor's server, which
#     no fault touches, for what stands for the outside world in a test;
#   - ARBOR_FAILOVER_NODES: "name=port" of each data node, space-separated;
#   - ARBOR_FAILOVER_CTL: a command prefix, in bash quoting, that acts on
#     the cluster: `$ARBOR_FAILOVER_CTL kill NODE` (SIGKILL to the node's
#     pg_autoctl and PostgreSQL processes: the machine died), `start NODE`
#     (its pg_autoctl again: it rejoins as a standby), `switchover` (a
#     planned one, `pg_autoctl perform switchover`), `cut NODE` (its network
#     cut: every TCP connection to its port refused, its keeper's
#     route to the monitor too, and its clients' and walsenders' backends
#     terminated), `heal NODE`, `state` (the monitor's view), `sql NODE SQL`
#     (psql on the node's socket, as superuser). `cut` needs root: without
#     it ARBOR_FAILOVER_CUT is not exported, and the test that cuts skips,
#     saying so loudly;
#   - ARBOR_FAILOVER_DIR: the folder, with each node's log.
set -euo pipefail

self=$(readlink -f "$0")
pgversion=15
bindir=/usr/lib/postgresql/$pgversion/bin
ports_monitor=5430
formation=default

# The monitor's settings: how soon it fails over. Defaults: a health check
# every 5 s, a 5 s timeout, 2 retries 2 s apart, a node unhealthy after 20 s
# without a report, and 30 s for a lost primary to demote itself before the
# standby is promoted. network_partition_timeout is the keeper's (20 s by
# default): a primary that sees neither the monitor nor a standby for that
# long demotes itself. It must stay below primary_demote_timeout, so that
# an old primary cut off from everyone has stopped before the standby is
# promoted.
health_check_period_ms=1000
health_check_timeout_ms=1000
health_check_max_retries=1
health_check_retry_delay_ms=500
node_considered_unhealthy_timeout_ms=2000
primary_demote_timeout_ms=5000
network_partition_timeout_s=3

# As root, the cluster's commands run as "postgres", in / rather than in
# the caller's folder: a checkout in a mode-700 home is closed to that user,
# and each of its programs (psql, pg_ctl, pg_autoctl) would then print
# "could not change directory to …: Permission denied" into what it
# answers (a test reading `ctl sql`'s "t" read that line too, and waited
# 3 minutes for it to go). Every path given to them is absolute.
run_as=()
if [ "$(id -u)" = 0 ]; then
	run_as=(runuser -u postgres -- env -C /)
fi

# --- ctl: actions on a running cluster (ARBOR_FAILOVER_CTL) ----------------

ctl_env() {
	: "${ARBOR_FAILOVER_DIR:?ARBOR_FAILOVER_DIR is not set: run under $0}"
	dir=$ARBOR_FAILOVER_DIR
	# shellcheck disable=SC1091
	. "$dir/env"
}

as_pg() {
	"${run_as[@]}" env XDG_CONFIG_HOME="$dir/xdg/config" XDG_DATA_HOME="$dir/xdg/data" XDG_RUNTIME_DIR="$dir/xdg/run" \
		PGHOST="$dir" PATH="$bindir:$PATH" "$@"
}

# as_pg_bg runs a command as as_pg does, in the background, with no shell
# of ours left waiting on it (a shell would report its SIGKILL).
as_pg_bg() {
	(exec "${run_as[@]}" env XDG_CONFIG_HOME="$dir/xdg/config" XDG_DATA_HOME="$dir/xdg/data" XDG_RUNTIME_DIR="$dir/xdg/run" \
		PGHOST="$dir" PATH="$bindir:$PATH" "$@") &
	disown
}

node_port() {
	local n
	for n in $NODES; do
		if [ "${n%%=*}" = "$1" ]; then
			echo "${n#*=}"
			return 0
		fi
	done
	echo "no node $1 (nodes: $NODES)" >&2
	return 1
}

# node_pids prints the pids of a node's pg_autoctl processes and of all
# their descendants: its PostgreSQL server and backends. The postmaster
# named by postmaster.pid counts only while its command line names the
# node's data folder: the file outlives a killed server, and on a busy
# machine its pid may by then be another process's.
node_pids() {
	local pgdata=$dir/$1 roots pm
	roots=$(pgrep -f -- "pg_autoctl .*--pgdata $pgdata( |\$)" | tr '\n' ' ' || true)
	if [ -f "$pgdata/postmaster.pid" ]; then
		pm=$(head -1 "$pgdata/postmaster.pid")
		if [[ "$pm" =~ ^[0-9]+$ ]] && ps -o args= -p "$pm" 2>/dev/null | grep -q -- "-D $pgdata\( \|\$\)"; then
			roots="$roots $pm"
		fi
	fi
	# shellcheck disable=SC2086
	[ -n "${roots// /}" ] && ps -e -o pid=,ppid= | awk -v roots="$roots" '
		BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
		{ parent[$1] = $2; pids[NR] = $1 }
		END {
			do {
				grew = 0
				for (i in pids) { p = pids[i]; if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; grew = 1 } }
			} while (grew)
			for (i in pids) if (pids[i] in keep) print pids[i]
		}'
	return 0
}

start_node() {
	local name=$1
	as_pg_bg setsid pg_autoctl run --pgdata "$dir/$name" >>"$dir/$name.log" 2>&1 </dev/null
}

ctl() {
	ctl_env
	local what=${1:-}
	shift || true
	case "$what" in
	kill)
		local pids
		pids=$(node_pids "$1" | sort -u | tr '\n' ' ')
		[ -n "${pids// /}" ] || {
			echo "ctl kill $1: no process found" >&2
			return 1
		}
		# The machine dies: everything of the node, again and again until
		# nothing is left — a process forked after the list was taken (a
		# backend for a connection on its way in, a service pg_autoctl
		# restarts) is killed on the next pass. A process in an
		# uninterruptible wait (an fsync on a busy disk) dies only when it
		# ends, hence the 30 s.
		for _ in $(seq 1 600); do
			# shellcheck disable=SC2086
			kill -KILL $pids 2>/dev/null || true
			sleep 0.05
			pids=$(node_pids "$1" | sort -u | tr '\n' ' ')
			[ -z "${pids// /}" ] && return 0
		done
		echo "ctl kill $1: processes left after 30 s:" >&2
		# shellcheck disable=SC2086
		ps -o pid=,ppid=,stat=,wchan=,args= -p "$(echo $pids | tr " " ",")" >&2 || true
		return 1
		;;
	start)
		start_node "$1"
		;;
	switchover)
		as_pg pg_autoctl perform switchover --pgdata "$dir/monitor" --formation "$formation" --wait 120
		;;
	cut)
		local port
		port=$(node_port "$1")
		[ "$(id -u)" = 0 ] || {
			echo "ctl cut: needs root (iptables)" >&2
			return 1
		}
		# First the node's keeper's route to the monitor (it alone connects
		# to it through the node's own address), and only once the keeper
		# has seen that with its standby still connected: pg_auto_failover
		# 2.0's keeper demotes a primary cut off from the monitor and from
		# every standby only if it saw a standby after losing the monitor
		# (service_keeper.c, in_network_partition: last_secondary_contact is
		# set there alone), as it does in a real partition, where the
		# walsender's connection lingers. Cut at once, the old primary
		# stays writable, and accepts writes when the network heals until
		# its keeper reaches the monitor (docs/operations.md, "High
		# availability").
		# Without that sight the cut is no partition but a split brain in
		# waiting (the node stays primary, and takes writes again at the
		# heal), so the cut fails rather than go on without it; on a busy
		# machine the keeper can take several seconds to notice.
		local seen saw=""
		seen=$(grep -c "We lost the monitor, but still have a standby" "$dir/$1.log" || true)
		iptables -I OUTPUT -p tcp -d "$(node_addr "$1")" --dport "$ports_monitor" -j REJECT --reject-with tcp-reset
		for _ in $(seq 1 1200); do
			if [ "$(grep -c "We lost the monitor, but still have a standby" "$dir/$1.log" || true)" -gt "$seen" ]; then
				saw=1
				break
			fi
			sleep 0.05
		done
		[ -n "$saw" ] || {
			echo "ctl cut: node $1's keeper did not report losing the monitor within 60 s" >&2
			return 1
		}
		# Then every TCP connection to its port: a packet to it is answered
		# with a reset, so connections in place break at their next packet
		# and new ones are refused (the monitor's health checks and the
		# standby's replication included) ...
		iptables -I OUTPUT -p tcp --dport "$port" -j REJECT --reject-with tcp-reset
		# ... and the backends of its clients and its walsenders are
		# terminated on its socket (local, so not cut): what breaks at once
		# on a real cut.
		as_pg psql -X -q -h "$dir" -p "$port" -U postgres -d postgres -Atc \
			"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND backend_type IN ('client backend', 'walsender')"
		;;
	heal)
		local port writable=""
		port=$(node_port "$1")
		# Only once the node is no longer a writable primary: its keeper,
		# cut off from the monitor and its standby, stops its PostgreSQL
		# (network_partition_timeout) and then rejoins as a standby. Healed
		# before that, the old primary takes the clients' new connections
		# (the first host of their connection string) and their writes,
		# which its rewind then discards: a split brain that only the HA
		# system can prevent (docs/operations.md, "High availability"), not
		# the failure this test is about. On a busy machine the keeper's
		# check can come after the promotion the test waits for.
		local tries=0
		for tries in $(seq 1 600); do
			writable=$(as_pg psql -X -q -h "$dir" -p "$port" -U postgres -d postgres -Atc "SELECT NOT pg_is_in_recovery()" 2>/dev/null || true)
			[ "$writable" = t ] || break
			sleep 0.1
		done
		[ "$tries" -le 1 ] || echo "node $1 was still a writable primary when the heal began; healed once its keeper had demoted it ($tries polls 0.1 s apart)"
		[ "$writable" != t ] || {
			echo "ctl heal: node $1 is still a writable primary 60 s into the heal: its keeper did not demote it; healing now would be a split brain" >&2
			return 1
		}
		iptables -D OUTPUT -p tcp --dport "$port" -j REJECT --reject-with tcp-reset || true
		iptables -D OUTPUT -p tcp -d "$(node_addr "$1")" --dport "$ports_monitor" -j REJECT --reject-with tcp-reset || true
		;;
	state)
		as_pg pg_autoctl show state --pgdata "$dir/monitor" --formation "$formation"
		;;
	sql)
		local port
		port=$(node_port "$1")
		as_pg psql -X -q -h "$dir" -p "$port" -U postgres -d arbor -Atc "$2"
		;;
	*)
		echo "usage: ARBOR_FAILOVER_CTL {kill|start|cut|heal NODE | switchover | state | sql NODE SQL}" >&2
		return 2
		;;
	esac
}

# node_addr is the loopback address a node's keeper reaches the monitor
# through: one of its own, so that a cut can take that route alone.
node_addr() {
	case "$1" in
	a) echo 127.0.0.2 ;;
	b) echo 127.0.0.3 ;;
	*) return 1 ;;
	esac
}

if [ "${1:-}" = ctl ]; then
	shift
	ctl "$@"
	exit $?
fi

if [ "$#" -eq 0 ]; then
	echo "usage: $0 COMMAND [ARG...]" >&2
	exit 2
fi
if [ -n "${ARBOR_PG_VERSION:-}" ] && [ "$ARBOR_PG_VERSION" != "$pgversion" ]; then
	echo "with-failover-cluster: ARBOR_PG_VERSION=$ARBOR_PG_VERSION: the failover cluster runs PostgreSQL $pgversion only (Debian's pg_auto_failover is built for it); unset ARBOR_PG_VERSION" >&2
	exit 2
fi

# --- packages (before the network namespace: apt-get needs the network) ---

have_packages() {
	[ -x "$bindir/initdb" ] && [ -x "$bindir/pg_ctl" ] && command -v pg_autoctl >/dev/null 2>&1 &&
		[ -f "/usr/lib/postgresql/$pgversion/lib/pgautofailover.so" ] &&
		{ [ "$(id -u)" != 0 ] || command -v iptables >/dev/null 2>&1; }
}

if [ -z "${ARBOR_FAILOVER_NETNS:-}" ] && ! have_packages; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "with-failover-cluster: installing Debian's postgresql-$pgversion, postgresql-$pgversion-auto-failover and iptables" >&2
		# Keep the packages from creating and starting a cluster of their own.
		mkdir -p /etc/postgresql-common/createcluster.d
		echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.d/arbor-no-main.conf
		export DEBIAN_FRONTEND=noninteractive
		pkgs=(postgresql-$pgversion postgresql-$pgversion-auto-failover iptables)
		if ! apt-get install -y -qq "${pkgs[@]}" >&2; then
			apt-get update -qq >&2
			apt-get install -y -qq "${pkgs[@]}" >&2
		fi
	fi
	if ! have_packages; then
		cat >&2 <<MSG
with-failover-cluster: PostgreSQL $pgversion and pg_auto_failover were not found
($bindir/initdb, pg_autoctl, the pgautofailover extension) and could not be
installed. On Debian or Ubuntu:
    sudo apt-get install postgresql-$pgversion postgresql-$pgversion-auto-failover iptables
MSG
		exit 1
	fi
fi

# --- a network namespace of its own, as root -------------------------------

if [ "$(id -u)" = 0 ] && [ -z "${ARBOR_FAILOVER_NETNS:-}" ]; then
	if unshare --net true 2>/dev/null; then
		# exec: the same process, so that Ctrl-C and the exit trap are ours.
		exec unshare --net -- env ARBOR_FAILOVER_NETNS=1 bash "$self" "$@"
	fi
	echo "with-failover-cluster: WARNING: cannot make a network namespace (unshare --net); running in the machine's own: the cut test will SKIP" >&2
	ARBOR_FAILOVER_NETNS=none
fi
if [ "${ARBOR_FAILOVER_NETNS:-}" = 1 ]; then
	ip link set lo up
fi

# --- the cluster ----------------------------------------------------------

dir=""
child=""
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
		kill -TERM "$child" 2>/dev/null || true
		wait "$child" 2>/dev/null || true
	fi
	if [ -n "$dir" ]; then
		local n pids
		for n in a b monitor; do
			pids=$(node_pids "$n" | sort -u | tr '\n' ' ')
			if [ -n "${pids// /}" ]; then
				# shellcheck disable=SC2086
				kill -KILL $pids 2>/dev/null || true
			fi
		done
		for n in a b monitor; do
			if [ -f "$dir/$n/postmaster.pid" ]; then
				"${run_as[@]}" "$bindir/pg_ctl" stop -D "$dir/$n" -m immediate >/dev/null 2>&1 || true
			fi
		done
		if [ "$rc" != 0 ] && [ "$rc" != 130 ] && [ "$rc" != 143 ] && [ -z "${ARBOR_FAILOVER_KEEP:-}" ] && [ -f "$dir/monitor.log" ]; then
			echo "with-failover-cluster: failed ($rc); the last lines of each node's log:" >&2
			for n in monitor a b; do
				[ -f "$dir/$n.log" ] || continue
				echo "--- $n" >&2
				tail -n 15 "$dir/$n.log" >&2 2>/dev/null || true
			done
		fi
		if [ -n "${ARBOR_FAILOVER_KEEP:-}" ]; then
			echo "with-failover-cluster: ARBOR_FAILOVER_KEEP is set: the folder stays, $dir" >&2
		else
			rm -rf "$dir"
		fi
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
	useradd --system --no-create-home --shell /usr/sbin/nologin postgres
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/arbor-failover.XXXXXX")
chmod 755 "$dir"
mkdir -p "$dir/xdg/config" "$dir/xdg/data" "$dir/xdg/run"
chmod 700 "$dir/xdg/run"
if [ "${#run_as[@]}" -gt 0 ]; then
	chown -R postgres "$dir"
	# What the cluster's user needs, checked now rather than minutes into
	# a test: its programs, and the folder (under TMPDIR) it keeps all in.
	# Nothing of the checkout: the scripts and the tests run as root.
	for p in "$bindir/initdb" "$bindir/pg_ctl" "$bindir/postgres" "$bindir/psql" "$(command -v pg_autoctl)" "$dir"; do
		if { [ -d "$p" ] && ! "${run_as[@]}" test -x "$p" -a -w "$p"; } || { [ ! -d "$p" ] && ! "${run_as[@]}" test -x "$p"; }; then
			echo "with-failover-cluster: the user \"postgres\", which runs the cluster, cannot use $p: every folder above it must be open to that user (chmod o+x), or set TMPDIR to a folder it can reach" >&2
			exit 1
		fi
	done
fi
NODES="a=5431 b=5432"
if [ "${ARBOR_FAILOVER_NETNS:-}" != 1 ]; then
	# In the machine's own network: ports of our own choosing, free now.
	base=$((20000 + RANDOM % 20000))
	ports_monitor=$base
	NODES="a=$((base + 1)) b=$((base + 2))"
fi
printf 'NODES=%q\nports_monitor=%q\n' "$NODES" "$ports_monitor" >"$dir/env"

# initdb NAME: a data folder whose settings put the socket in ours and size
# the instance for a small machine (pg_autoctl would size it for the whole
# memory); postgresql.auto.conf is read last, and a standby's basebackup
# copies it.
init_data() {
	local name=$1
	"${run_as[@]}" "$bindir/initdb" -D "$dir/$name" -U postgres --auth=trust -E UTF8 --locale=C >"$dir/$name.initdb.log" 2>&1 || {
		cat "$dir/$name.initdb.log" >&2
		exit 1
	}
	cat >>"$dir/$name/postgresql.auto.conf" <<CONF
unix_socket_directories = '$dir'
shared_buffers = '128MB'
max_connections = 300
# pg_autoctl's pg_basebackup waits for a spread checkpoint (minutes):
# a standby is cloned at once.
checkpoint_completion_target = 0
fsync = on
CONF
}

# wait_state NODE STATE: until the monitor reports NODE in STATE, as its
# goal too.
wait_state() {
	local name=$1 want=$2
	for _ in $(seq 1 600); do
		if as_pg psql -X -q -h "$dir" -p "$ports_monitor" -U autoctl_node -d pg_auto_failover -Atc \
			"SELECT 1 FROM pgautofailover.node WHERE nodename = '$name' AND reportedstate = '$want' AND goalstate = '$want'" 2>/dev/null | grep -q 1; then
			return 0
		fi
		sleep 0.2
	done
	echo "with-failover-cluster: node $name did not reach $want" >&2
	ctl state >&2 || true
	exit 1
}

started=$(date +%s)
monitor_uri="postgres://autoctl_node@127.0.0.1:$ports_monitor/pg_auto_failover?sslmode=disable"
init_data monitor
as_pg pg_autoctl create monitor --pgdata "$dir/monitor" --pgport "$ports_monitor" --hostname 127.0.0.1 \
	--auth trust --no-ssl --pgctl "$bindir/pg_ctl" >"$dir/monitor.log" 2>&1 || {
	cat "$dir/monitor.log" >&2
	exit 1
}
# Listen on the loopback addresses only: 127.0.0.1 for the clients, and
# one for each node's keeper (node_addr).
as_pg pg_autoctl config set --pgdata "$dir/monitor" postgresql.listen_addresses "127.0.0.1,127.0.0.2,127.0.0.3" >/dev/null
start_node monitor
for _ in $(seq 1 300); do
	as_pg psql -X -q -h "$dir" -p "$ports_monitor" -U autoctl_node -d pg_auto_failover -Atc "SELECT 1" >/dev/null 2>&1 && break
	sleep 0.1
done
as_pg psql -X -q -h "$dir" -p "$ports_monitor" -U postgres -d pg_auto_failover -v ON_ERROR_STOP=1 >/dev/null <<SQL
ALTER SYSTEM SET pgautofailover.health_check_period = $health_check_period_ms;
ALTER SYSTEM SET pgautofailover.health_check_timeout = $health_check_timeout_ms;
ALTER SYSTEM SET pgautofailover.health_check_max_retries = $health_check_max_retries;
ALTER SYSTEM SET pgautofailover.health_check_retry_delay = $health_check_retry_delay_ms;
ALTER SYSTEM SET pgautofailover.node_considered_unhealthy_timeout = $node_considered_unhealthy_timeout_ms;
ALTER SYSTEM SET pgautofailover.primary_demote_timeout = $primary_demote_timeout_ms;
SELECT pg_reload_conf();
CREATE DATABASE outside;
SQL
# "outside": a database on the monitor's server, which no fault touches,
# for what stands for the outside world in the tests (the handlers' run
# log and side effects): it goes on recording while the cluster fails over.
echo "host outside postgres 127.0.0.1/32 trust" >>"$dir/monitor/pg_hba.conf"
as_pg psql -X -q -h "$dir" -p "$ports_monitor" -U postgres -d postgres -Atc "SELECT pg_reload_conf()" >/dev/null

# create_node NAME: registers a data node and runs its keeper; the first
# becomes the primary (its data folder is ours, initialised above), the
# second a standby, cloned from it by pg_basebackup.
create_node() {
	local name=$1 port addr
	port=$(node_port "$name")
	addr=$(node_addr "$name")
	if [ "${ARBOR_FAILOVER_NETNS:-}" != 1 ]; then
		addr=127.0.0.1
	fi
	as_pg_bg pg_autoctl create postgres --pgdata "$dir/$name" --pgport "$port" --listen 127.0.0.1 --hostname 127.0.0.1 \
		--name "$name" --auth trust --no-ssl --pgctl "$bindir/pg_ctl" --username arbor --dbname arbor \
		--monitor "postgres://autoctl_node@$addr:$ports_monitor/pg_auto_failover?sslmode=disable" \
		--run >"$dir/$name.log" 2>&1 </dev/null
	wait_state "$name" "$2"
	as_pg pg_autoctl config set --pgdata "$dir/$name" timeout.network_partition_timeout "$network_partition_timeout_s" >/dev/null
	as_pg pg_autoctl reload --pgdata "$dir/$name" >/dev/null
}
init_data a
create_node a single
create_node b secondary
wait_state a primary
wait_state b secondary

a_port=$(node_port a)
b_port=$(node_port b)
export ARBOR_DATABASE_URL="host=127.0.0.1,127.0.0.1 port=$a_port,$b_port user=arbor dbname=arbor sslmode=disable target_session_attrs=read-write connect_timeout=5"
export ARBOR_FAILOVER_MONITOR_URL=$monitor_uri
export ARBOR_FAILOVER_OUTSIDE_URL="postgres://postgres@127.0.0.1:$ports_monitor/outside?sslmode=disable"
export ARBOR_FAILOVER_NODES=$NODES
export ARBOR_FAILOVER_DIR=$dir
ARBOR_FAILOVER_CTL=$(printf '%q ' bash "$self" ctl)
export ARBOR_FAILOVER_CTL="${ARBOR_FAILOVER_CTL% }"
if [ "${ARBOR_FAILOVER_NETNS:-}" = 1 ]; then
	export ARBOR_FAILOVER_CUT=1
fi
unset ARBOR_PG_CTL ARBOR_PGBOUNCER_URL
sync_names=$(ctl sql a "SHOW synchronous_standby_names")
echo "with-failover-cluster: pg_auto_failover $(pg_autoctl --version | awk 'NR==1{print $3}') on PostgreSQL $("$bindir/postgres" --version | awk '{print $3}'): monitor :$ports_monitor, primary a :$a_port, standby b :$b_port (synchronous_standby_names = $sync_names), ready in $(($(date +%s) - started)) s, at $dir" >&2
# In the background, waited for: a signal to this script (Ctrl-C, a
# TERM) runs its trap at once, which ends the command and the cluster.
set +e
"$@" &
child=$!
wait "$child"
rc=$?
set -e
exit "$rc"
