#!/usr/bin/env bash
# Builds and runs the side-by-side comparison (compare_test.go) in a scratch
# module, so that no other library's code or module wiring enters this
# repository. See the README, "Compared with analytics-go v3".
#
#   V3_DIR=/path/to/v3 BASE=main compare/run.sh [go test flags]
#
# V3_DIR holds a local copy of analytics-go v3.3.0 and its two dependencies as
# module directories: analytics-go/ (github.com/segmentio/analytics-go/v3),
# backo-go/ (github.com/segmentio/backo-go) and uuid/ (github.com/google/uuid).
# BASE is the commit whose clients/go is measured as "clients/go at base"
# (default: where this branch left main).
# COMPARE_ROUNDS (default 7) sets the rounds; COMPARE_FAILURES=1 adds the
# hung-server and outage rows (about 30 s more).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
v3=${V3_DIR:-$here/.v3}
base=${BASE:-$(git -C "$here" merge-base main HEAD)}
for d in analytics-go backo-go uuid; do
  [ -f "$v3/$d/go.mod" ] || { echo "no module in $v3/$d (set V3_DIR)" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/old"
git -C "$here" archive "$base" -- . | tar -x -C "$work/old"
rm -rf "$work/old/compare" "$work/old/example"
find "$work/old" -name '*_test.go' -delete
sed -i 's#^module .*#module efd.local/oldclient#' "$work/old/go.mod"
cp "$here/compare/compare_test.go" "$work/"
cat >"$work/go.mod" <<EOF
module efd.local/compare

go 1.23

require (
	efd.local/oldclient v0.0.0
	github.com/efd-dev/efd/clients/go v0.0.0
	github.com/google/uuid v1.3.0
	github.com/segmentio/analytics-go/v3 v3.3.0
	github.com/segmentio/backo-go v1.0.0
)

replace efd.local/oldclient => $work/old
replace github.com/efd-dev/efd/clients/go => $here
replace github.com/segmentio/analytics-go/v3 => $v3/analytics-go
replace github.com/segmentio/backo-go => $v3/backo-go
replace github.com/google/uuid => $v3/uuid
EOF
echo "clients/go at $(git -C "$here" rev-parse --short HEAD)$(git -C "$here" diff --quiet HEAD -- . || echo '+changes'), base $base at $(git -C "$here" rev-parse --short "$base")"
cd "$work"
GOFLAGS=-mod=mod GOPROXY=off GOWORK=off go test -tags v3compare -run TestCompare -count=1 -timeout 60m -v "$@" . | grep --line-buffered -v '^=== RUN'
