#!/usr/bin/env bash
# Debian's chromium, for tests/report/test_html.py (report.html opened in a headless browser):
# installed with apt-get when missing and running as root, otherwise the script fails and says
# what to install. Called by tests/run.sh before tests/aarch64.sh starts in the background (two
# apt-get at once collide on dpkg's lock). PYKVPOOL_SKIP_BROWSER=1 skips it, loudly (the
# browser tests then skip too).
set -euo pipefail

if [[ "${PYKVPOOL_SKIP_BROWSER:-0}" == 1 ]]; then
    echo "!!! PYKVPOOL_SKIP_BROWSER=1: report.html is NOT checked in a browser !!!" >&2
    exit 0
fi

fail() {
    echo "tests/browser.sh: $*" >&2
    echo "tests/browser.sh: set PYKVPOOL_SKIP_BROWSER=1 to skip the browser tests knowingly" >&2
    exit 1
}

command -v chromium >/dev/null && exit 0
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "tests/browser.sh: installing chromium" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null ||
        fail "apt-get install chromium failed"
else
    fail "missing chromium; install with: sudo apt-get install chromium"
fi
command -v chromium >/dev/null || fail "apt-get installed chromium but no chromium command is on PATH"
