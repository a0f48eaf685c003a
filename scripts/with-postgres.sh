#!/usr/bin/env bash
# Runs a command with ARBOR_DATABASE_URL pointing at a PostgreSQL server.
#
#   scripts/with-postgres.sh go test ./...
#
# If ARBOR_DATABASE_URL is already set, the command runs against that database
# as it is. Otherwise this script starts a private, throwaway server for the
# command and removes it afterwards, also when the command fails or is
# interrupted (Ctrl-C):
#   - the server binaries (initdb, pg_ctl) are taken from PATH, or from
#     Debian's /usr/lib/postgresql/<version>/bin (newest version first);
#   - if there are none and we run as root with apt-get, Debian's
#     postgresql package is installed; otherwise we stop and say what to install;
#   - the data folder is a new temporary folder; the server listens on no TCP
#     address at all, only on a Unix socket inside that folder; fsync stays on;
#   - as root, the server runs as the unprivileged user "postgres" (initdb
#     refuses root), created if it does not exist;
#   - ARBOR_PG_CTL is exported for the command: a command prefix, in bash
#     quoting, that runs this server's pg_ctl as the server's user on its data
#     folder and log, so that a test may restart the server
#     (`bash -c "$ARBOR_PG_CTL restart -m fast -w"`; pg_ctl restart reuses the
#     server's original options). `make chaos` needs it. It is never exported
#     for a database given by ARBOR_DATABASE_URL: nothing restarts a server
#     this script did not start.
#
# It also starts a PgBouncer in transaction mode (pool_mode = transaction) in
# front of that database, and exports its URL as ARBOR_PGBOUNCER_URL, so that
# the tests run arbor through a pooler too (docs/scaling.md):
#   - the binary is Debian's pgbouncer, installed as root with apt-get when it
#     is missing; without it the command still runs, ARBOR_PGBOUNCER_URL is
#     left unset, and this script says so loudly (the PgBouncer tests then
#     skip, saying why);
#   - it listens on no TCP address, only on a Unix socket in a temporary
#     folder of its own (port 6432), runs as the user "postgres", and is
#     stopped and removed at the end like the server;
#   - with ARBOR_DATABASE_URL given, the PgBouncer points at that database
#     (the URL's user, password, host or socket folder, port and database);
#     a URL this script cannot take apart is used as is, without a PgBouncer;
#   - with ARBOR_PGBOUNCER_URL already set, none is started: that one is used.
set -euo pipefail

if [ "$#" -eq 0 ]; then
	echo "usage: $0 COMMAND [ARG...]" >&2
	exit 2
fi

run_as=()
pgb_dir=""
pg_dir=""
pgbouncer_bin=""

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ -n "$pgb_dir" ]; then
		if [ -f "$pgb_dir/pgbouncer.pid" ]; then
			kill "$(cat "$pgb_dir/pgbouncer.pid")" 2>/dev/null || true
			for _ in $(seq 1 50); do
				[ -f "$pgb_dir/pgbouncer.pid" ] || break
				sleep 0.1
			done
		fi
		rm -rf "$pgb_dir"
	fi
	if [ -n "$pg_dir" ]; then
		if [ -f "$pg_dir/data/postmaster.pid" ]; then
			"${run_as[@]}" "$bindir/pg_ctl" stop -D "$pg_dir/data" -m fast -w -t 30 >/dev/null 2>&1 ||
				"${run_as[@]}" "$bindir/pg_ctl" stop -D "$pg_dir/data" -m immediate >/dev/null 2>&1 || true
		fi
		rm -rf "$pg_dir"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# as_postgres sets run_as to run a command as the unprivileged user
# "postgres" when we are root (initdb and pgbouncer refuse root), creating
# the user if it does not exist.
as_postgres() {
	if [ "$(id -u)" = 0 ]; then
		if ! id postgres >/dev/null 2>&1; then
			useradd --system --no-create-home --shell /usr/sbin/nologin postgres
		fi
		run_as=(runuser -u postgres --)
	fi
}

find_pgbouncer() {
	if command -v pgbouncer >/dev/null 2>&1; then
		command -v pgbouncer
	elif [ -x /usr/sbin/pgbouncer ]; then
		echo /usr/sbin/pgbouncer
	else
		return 1
	fi
}

# ensure_pgbouncer sets pgbouncer_bin, installing Debian's package as root if
# needed, or warns loudly and leaves it empty.
ensure_pgbouncer() {
	pgbouncer_bin=$(find_pgbouncer || true)
	if [ -z "$pgbouncer_bin" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "with-postgres: no pgbouncer found; installing Debian's pgbouncer package" >&2
		export DEBIAN_FRONTEND=noninteractive
		if ! apt-get install -y -qq pgbouncer >&2; then
			apt-get update -qq >&2 && apt-get install -y -qq pgbouncer >&2 || true
		fi
		pgbouncer_bin=$(find_pgbouncer || true)
	fi
	if [ -z "$pgbouncer_bin" ]; then
		cat >&2 <<'MSG'
with-postgres: WARNING: no pgbouncer binary, and it could not be installed
(Debian: sudo apt-get install pgbouncer). ARBOR_PGBOUNCER_URL is NOT set:
the tests that run arbor through PgBouncer will SKIP.
MSG
	fi
}

# start_pgbouncer HOST PORT USER PASSWORD DBNAME starts a PgBouncer in
# transaction mode in front of that server, on a Unix socket in a folder of
# its own, and exports ARBOR_PGBOUNCER_URL; on failure it warns and exports
# nothing.
start_pgbouncer() {
	local host=$1 port=$2 user=$3 password=$4 dbname=$5
	ensure_pgbouncer
	[ -n "$pgbouncer_bin" ] || return 0
	as_postgres
	pgb_dir=$(mktemp -d "${TMPDIR:-/tmp}/arbor-pgbouncer.XXXXXX")
	chmod 700 "$pgb_dir"
	local server="host=$host port=$port user=$user dbname=$dbname"
	if [ -n "$password" ]; then
		server="$server password=$password"
	fi
	# Clients authenticate by being able to reach the socket at all (the
	# folder is 0700): auth_type trust, with the one user in the auth file.
	printf '"%s" ""\n' "$user" >"$pgb_dir/users.txt"
	cat >"$pgb_dir/pgbouncer.ini" <<INI
[databases]
$dbname = $server
[pgbouncer]
pool_mode = transaction
listen_addr =
listen_port = 6432
unix_socket_dir = $pgb_dir
auth_type = trust
auth_file = $pgb_dir/users.txt
pidfile = $pgb_dir/pgbouncer.pid
logfile = $pgb_dir/pgbouncer.log
max_client_conn = 1000
default_pool_size = 40
max_db_connections = 60
ignore_startup_parameters = extra_float_digits
INI
	chmod 600 "$pgb_dir/pgbouncer.ini"
	if [ "${#run_as[@]}" -gt 0 ]; then
		chown -R postgres "$pgb_dir"
	fi
	if ! "${run_as[@]}" "$pgbouncer_bin" -d "$pgb_dir/pgbouncer.ini" >/dev/null 2>"$pgb_dir/start.err"; then
		echo "with-postgres: WARNING: pgbouncer did not start; ARBOR_PGBOUNCER_URL is NOT set and the PgBouncer tests will SKIP:" >&2
		cat "$pgb_dir/start.err" "$pgb_dir/pgbouncer.log" >&2 2>/dev/null || true
		return 0
	fi
	for _ in $(seq 1 100); do
		[ -S "$pgb_dir/.s.PGSQL.6432" ] && break
		sleep 0.1
	done
	if [ ! -S "$pgb_dir/.s.PGSQL.6432" ]; then
		echo "with-postgres: WARNING: pgbouncer's socket did not appear; ARBOR_PGBOUNCER_URL is NOT set and the PgBouncer tests will SKIP" >&2
		cat "$pgb_dir/pgbouncer.log" >&2 2>/dev/null || true
		return 0
	fi
	export ARBOR_PGBOUNCER_URL="postgres://$user@/$dbname?host=$pgb_dir&port=6432&sslmode=disable"
	echo "with-postgres: PgBouncer ($("$pgbouncer_bin" --version | awk 'NR==1{print $2}'), pool_mode = transaction) at $pgb_dir" >&2
}

# pgbouncer_for_url starts a PgBouncer in front of the database of a
# postgres:// URL of the usual forms (user[:password]@host[:port]/db, or a
# socket folder in host=…), or says why it does not.
pgbouncer_for_url() {
	local url=$1 re='^postgres(ql)?://([^:@/]*)(:([^@]*))?@([^/:?]*)(:([0-9]+))?/([^?]*)(\?(.*))?$'
	if [[ ! "$url" =~ $re ]]; then
		echo "with-postgres: WARNING: cannot take ARBOR_DATABASE_URL apart for a PgBouncer; ARBOR_PGBOUNCER_URL is NOT set and the PgBouncer tests will SKIP" >&2
		return 0
	fi
	local user=${BASH_REMATCH[2]} password=${BASH_REMATCH[4]} host=${BASH_REMATCH[5]}
	local port=${BASH_REMATCH[7]:-5432} dbname=${BASH_REMATCH[8]:-postgres} params=${BASH_REMATCH[10]}
	local kv
	IFS='&' read -ra kvs <<<"$params"
	for kv in ${kvs[@]+"${kvs[@]}"}; do
		case "$kv" in
		host=*) host=${kv#host=} ;;
		port=*) port=${kv#port=} ;;
		user=*) user=${kv#user=} ;;
		password=*) password=${kv#password=} ;;
		esac
	done
	start_pgbouncer "${host:-localhost}" "$port" "${user:-postgres}" "$password" "${dbname}"
}

if [ -n "${ARBOR_DATABASE_URL:-}" ]; then
	unset ARBOR_PG_CTL
	if [ -z "${ARBOR_PGBOUNCER_URL:-}" ]; then
		pgbouncer_for_url "$ARBOR_DATABASE_URL"
	fi
	set +e
	"$@"
	rc=$?
	set -e
	exit "$rc"
fi

find_bindir() {
	if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
		dirname "$(readlink -f "$(command -v initdb)")"
		return 0
	fi
	local d
	for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -V -r); do
		if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
			echo "$d"
			return 0
		fi
	done
	return 1
}

bindir=$(find_bindir || true)
if [ -z "$bindir" ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "with-postgres: no PostgreSQL server binaries found; installing Debian's postgresql package" >&2
		# Keep the package from creating and starting a cluster of its own.
		mkdir -p /etc/postgresql-common/createcluster.d
		echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.d/arbor-no-main.conf
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq >&2
		apt-get install -y -qq postgresql >&2
		bindir=$(find_bindir || true)
	fi
	if [ -z "$bindir" ]; then
		cat >&2 <<'MSG'
with-postgres: no PostgreSQL server binaries (initdb, pg_ctl) were found.
Install PostgreSQL 14 or newer, for example on Debian or Ubuntu:
    sudo apt-get install postgresql
(the binaries land in /usr/lib/postgresql/<version>/bin, which is searched),
or point arbor at a database you already run:
    export ARBOR_DATABASE_URL=postgres://user:password@localhost:5432/dbname
MSG
		exit 1
	fi
fi

workdir=$(mktemp -d "${TMPDIR:-/tmp}/arbor-pg.XXXXXX")
pg_dir=$workdir
as_postgres
if [ "${#run_as[@]}" -gt 0 ]; then
	chown postgres "$workdir"
fi

"${run_as[@]}" "$bindir/initdb" -D "$workdir/data" -U arbor --auth=trust -E UTF8 --locale=C >"$workdir/initdb.log" 2>&1 || {
	cat "$workdir/initdb.log" >&2
	exit 1
}
# No TCP at all: only a socket in our own folder. fsync stays on (the default),
# so the demo, the tests and the benchmarks see real commit costs.
if ! "${run_as[@]}" "$bindir/pg_ctl" start -D "$workdir/data" -w -t 60 -l "$workdir/server.log" \
	-o "-c listen_addresses='' -c unix_socket_directories='$workdir' -c port=5432 -c fsync=on -c max_connections=200 -c shared_buffers=256MB" >/dev/null; then
	cat "$workdir/server.log" >&2
	exit 1
fi

export ARBOR_DATABASE_URL="postgres://arbor@/postgres?host=$workdir&port=5432&sslmode=disable"
# -l: a restarted server logs to the same file, not to the restarting
# process's output (which it would then hold open).
ARBOR_PG_CTL=$(printf '%q ' ${run_as[@]+"${run_as[@]}"} "$bindir/pg_ctl" -D "$workdir/data" -l "$workdir/server.log")
export ARBOR_PG_CTL="${ARBOR_PG_CTL% }"
echo "with-postgres: throwaway PostgreSQL ($("$bindir/postgres" --version | awk '{print $3}')) at $workdir" >&2
if [ -z "${ARBOR_PGBOUNCER_URL:-}" ]; then
	start_pgbouncer "$workdir" 5432 arbor "" postgres
fi
set +e
"$@"
rc=$?
set -e
exit "$rc"
