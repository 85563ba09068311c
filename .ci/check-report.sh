#!/usr/bin/env bash
# Opens a lab report's index.html in headless Chromium and fails if the page did
# not pass its own check: every plot an inline <svg> with its data drawn, and no
# script error (the page sets <body data-check="ok N plots"> when it has loaded),
# or if Chromium logged a console error. Skips, with a message, when Chromium is
# missing. Usage: .ci/check-report.sh REPORT_DIR
set -euo pipefail
dir=${1:?usage: $0 REPORT_DIR}
page="$dir/index.html"
[ -f "$page" ] || { echo "check-report: $page is missing" >&2; exit 1; }
chromium=""
for c in "${CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
    if [ -n "$c" ] && [ -x "$c" ]; then chromium=$c; break; fi
done
if [ -z "$chromium" ]; then
    echo "check-report: SKIPPED, no Chromium (apt-get install -y chromium to run it)"
    exit 0
fi
profile=$(mktemp -d)
out=$(mktemp)
log=$(mktemp)
trap 'rm -rf "$profile" "$out" "$log"' EXIT
url="file://$(cd "$(dirname "$page")" && pwd)/$(basename "$page")"
# The page has no network and no external resources; bounded in time all the
# same. Chromium's shared memory goes to /tmp (--disable-dev-shm-usage): a host
# whose /dev/shm is wedged would otherwise block it in the kernel for good. It
# runs in the background and is waited for by polling, so that even a process
# stuck in the kernel (which no signal ends) cannot hold the check past its bound.
"$chromium" --headless --no-sandbox --disable-gpu --disable-quic \
    --disable-dev-shm-usage --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$profile" \
    --enable-logging=stderr --v=0 --virtual-time-budget=5000 --dump-dom "$url" \
    </dev/null >"$out" 2>"$log" &
pid=$!
waited=0
while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -ge 60 ]; then
        kill -9 "$pid" 2>/dev/null || true
        echo "check-report: chromium did not finish within 60 s" >&2
        tail -20 "$log" >&2
        trap - EXIT
        exit 1
    fi
    sleep 1
    waited=$((waited + 1))
done
rc=0
wait "$pid" || rc=$?
if [ "$rc" -ne 0 ]; then
    echo "check-report: chromium failed (rc $rc):" >&2
    tail -20 "$log" >&2
    exit 1
fi
state=$(grep -o 'data-check="[^"]*"' "$out" | head -1 | sed 's/^data-check="//; s/"$//')
if grep -E 'CONSOLE.*(Uncaught|Error)|:ERROR:CONSOLE' "$log" >/dev/null; then
    echo "check-report: console errors in $page:" >&2
    grep -E 'CONSOLE' "$log" >&2
    exit 1
fi
case "$state" in
ok*) echo "check-report: $page: $state (Chromium $(dpkg-query -W -f='${Version}' chromium 2>/dev/null || echo "version unknown"))" ;;
*)
    echo "check-report: $page failed its check: ${state:-no marker (the script did not run)}" >&2
    exit 1
    ;;
esac
