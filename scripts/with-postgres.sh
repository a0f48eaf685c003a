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
set -euo pipefail

if [ "$#" -eq 0 ]; then
	echo "usage: $0 COMMAND [ARG...]" >&2
	exit 2
fi

if [ -n "${ARBOR_DATABASE_URL:-}" ]; then
	unset ARBOR_PG_CTL
	exec "$@"
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
run_as=()
if [ "$(id -u)" = 0 ]; then
	if ! id postgres >/dev/null 2>&1; then
		useradd --system --no-create-home --shell /usr/sbin/nologin postgres
	fi
	chown postgres "$workdir"
	run_as=(runuser -u postgres --)
fi

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ -f "$workdir/data/postmaster.pid" ]; then
		"${run_as[@]}" "$bindir/pg_ctl" stop -D "$workdir/data" -m fast -w -t 30 >/dev/null 2>&1 ||
			"${run_as[@]}" "$bindir/pg_ctl" stop -D "$workdir/data" -m immediate >/dev/null 2>&1 || true
	fi
	rm -rf "$workdir"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

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
set +e
"$@"
rc=$?
set -e
exit "$rc"
