#!/usr/bin/env bash
# Runs a command with a headless Chromium on PATH, for the web view's
# browser test (make browser).
#
#   scripts/with-chromium.sh go test ./...
#
# Chromium is taken from PATH (chromium, chromium-browser or google-chrome).
# If there is none and we run as root with apt-get, Debian's chromium
# package is installed. Only where the package cannot be had (not root, no
# apt-get, no such package in the machine's sources) is the command skipped,
# with a loud message, and the script exits 0; a failed install is a
# failure.
set -euo pipefail

if [ "$#" -eq 0 ]; then
	echo "usage: $0 COMMAND [ARG...]" >&2
	exit 2
fi

have() {
	command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 ||
		command -v google-chrome >/dev/null 2>&1
}

skip() {
	{
		echo
		echo "################################################################"
		echo "##  BROWSER TEST SKIPPED: $1"
		echo "##  The web view was NOT tested in a browser. Install Debian's"
		echo "##  chromium package (apt-get install chromium) and run"
		echo "##  make browser again."
		echo "################################################################"
		echo
	} >&2
	exit 0
}

if ! have; then
	if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
		skip "no Chromium, and no apt-get as root to install it"
	fi
	echo "with-chromium: installing Debian's chromium package" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	if ! apt-cache show chromium >/dev/null 2>&1; then
		skip "the machine's package sources have no chromium package"
	fi
	apt-get install -y -qq chromium >&2 </dev/null
	have || { echo "with-chromium: chromium was installed but is not on PATH" >&2; exit 1; }
fi
exec "$@"
