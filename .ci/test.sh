#!/usr/bin/env bash
# The test command (README): installs what is missing (.ci/setup.sh), then
# everything CI checks, fastest first.
#   RACE=0 .ci/test.sh      skip the race detector
#   FUZZTIME=30s .ci/test.sh longer fuzzing per target
#   SETUP=0 .ci/test.sh     skip the set-up (install nothing)
set -euo pipefail
cd "$(dirname "$0")/.."

start=$SECONDS
# Go and the Go tools the set-up installs ($GOBIN: /usr/local/bin as root,
# else $(go env GOPATH)/bin).
[ -x /usr/local/go/bin/go ] && export PATH="/usr/local/go/bin:$PATH"
export PATH="$PATH:$(go env GOPATH)/bin"
if [ "${SETUP:-1}" != 0 ]; then
  printf '\n=== set-up (%s)\n' "$(date -u +%H:%M:%S)"
  ./.ci/setup.sh
fi

export QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING=true
RACE="${RACE:-1}"
FUZZTIME="${FUZZTIME:-5s}"

step() { printf '\n=== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

step "gofmt"
unformatted="$(gofmt -l $(git ls-files -co --exclude-standard '*.go' 2>/dev/null || find . -name '*.go' -not -path './.ci/node/*'))"
if [ -n "$unformatted" ]; then
  echo "gofmt: these files need gofmt -w:" >&2
  echo "$unformatted" >&2
  exit 1
fi

step "go vet"
go vet ./...
# bench/jetstream is its own module (gateway bench's durable-intake
# baseline, kept out of the gateway's go.mod); TestBenchTiny runs it.
(cd bench/jetstream && go vet ./...)

step "generation freshness (buf lint, buf generate, OpenAPI post-processing)"
# The pinned CI tools (.ci/node: the prebuilt buf, the OpenAPI validator)
# come from the set-up. Without them, gen.sh compiles buf instead.
.ci/check-gen.sh

step "OpenAPI validation"
.ci/validate-openapi.sh

# The rest runs as jobs, several at once where they do not disturb each
# other: most tests wait on timers, processes and the network, so one job
# keeps two cores about half busy. Each job writes its own log, printed
# whole when its phase ends (the failing ones last).
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
jobs_names=()
job() { # job NAME CMD...: start CMD in the background, output to its log
  local name="$1"; shift
  jobs_names+=("$name")
  ( "$@" ) >"$logs/$name.log" 2>&1 &
  echo "$!" >"$logs/$name.pid"
  echo "started: $name"
}
phase_end() { # wait for the phase's jobs; print their logs; fail if any failed
  local failed=() name
  for name in "${jobs_names[@]}"; do
    if wait "$(cat "$logs/$name.pid")"; then
      printf '\n--- %s: ok\n' "$name"; cat "$logs/$name.log"
    else
      failed+=("$name")
    fi
  done
  for name in "${failed[@]}"; do
    printf '\n--- %s: FAILED\n' "$name"; cat "$logs/$name.log"
  done
  jobs_names=()
  if [ "${#failed[@]}" -gt 0 ]; then
    echo "failed: ${failed[*]}" >&2
    exit 1
  fi
}

pkgs="$(go list ./... | grep -v '/e2e\(/\|$\)')"
race=()
if [ "$RACE" = 1 ]; then
  if command -v gcc >/dev/null 2>&1 || command -v cc >/dev/null 2>&1; then
    race=(-race)
  else
    echo "go test: no C compiler, running without -race (install gcc)" >&2
  fi
fi

# Two passes: the race detector over everything with -short sizes (it slows
# streaming 5-10x, so the 256 MiB memory-flatness tests shrink to 32 MiB),
# then, without it, the tests that -short shrinks (those that call
# testing.Short()) at full size. Every other test ran once already; without
# the race pass (RACE=0, no C compiler) the second pass runs everything.
unit_first() {
  if [ "${#race[@]}" -gt 0 ]; then
    # -p 4: four packages at once. Most of them wait on timers, processes
    # and PostgreSQL, so two at a time (the default on two cores) leaves
    # a core idle for minutes.
    # shellcheck disable=SC2086
    go test "${race[@]}" -short -p 4 -count=1 -timeout 30m $pkgs
  else
    # shellcheck disable=SC2086
    go test -count=1 -timeout 30m $pkgs
  fi
}
unit_full_size() {
  [ "${#race[@]}" -gt 0 ] || { echo "ran at full size in the first pass"; return 0; }
  # "dir TestName" for each Test function whose body calls testing.Short().
  local shortened dir names
  shortened="$(git ls-files -co --exclude-standard '*_test.go' | grep -v '^e2e/' |
    xargs awk 'FNR == 1 { fn = "" } /^func Test[A-Za-z0-9_]*\(/ { fn = $2; sub(/\(.*/, "", fn) }
      /testing\.Short\(\)/ && fn != "" { d = FILENAME; sub(/\/[^\/]*$/, "", d); print "./" d, fn }' | sort -u)"
  while read -r dir names; do
    [ -n "$dir" ] || continue
    echo "--- full size: $dir $names"
    go test -count=1 -timeout 30m -run "^(${names// /|})\$" "$dir"
  done < <(awk '{ a[$1] = a[$1] (a[$1] ? " " : "") $2 } END { for (d in a) print d, a[d] }' <<<"$shortened")
}

# Fuzz targets, from FUZZ_TARGETS files (one worker each: they run beside
# the e2e shards, which leave a core idle).
fuzz_all() {
  local list listdir pkgdir name out
  while IFS= read -r list; do
    listdir="$(dirname "$list")"
    while read -r pkgdir name _; do
      case "$pkgdir" in ''|'#'*) continue ;; esac
      [ -d "$pkgdir" ] || pkgdir="$listdir/$pkgdir"
      [ -d "$pkgdir" ] || { echo "fuzz: $list names $pkgdir, which is not a directory" >&2; return 1; }
      case "$pkgdir" in ./*|/*) ;; *) pkgdir="./$pkgdir" ;; esac
      echo "--- $pkgdir $name"
      out="$(mktemp)"
      if ! go test -run='^$' -fuzz="^${name}\$" -fuzztime="$FUZZTIME" -parallel=1 "$pkgdir" 2>&1 | tee "$out"; then
        # go's fuzz coordinator sometimes ends a time-boxed run of a slow
        # target (an HTTP round trip per input) with a bare "context deadline
        # exceeded" and no failing input. A real finding always writes its
        # input ("Failing input written to ..."); only the bare timeout is
        # retried, once, with an execution budget instead of a time budget.
        if grep -q 'Failing input written' "$out" || ! grep -q 'context deadline exceeded' "$out"; then
          rm -f "$out"; return 1
        fi
        echo "fuzz: $name ended with the coordinator's deadline error and no failing input; retrying with -fuzztime=300x"
        go test -run='^$' -fuzz="^${name}\$" -fuzztime=300x -parallel=1 "$pkgdir" || { rm -f "$out"; return 1; }
      fi
      rm -f "$out"
    done < "$list"
  done < <(find . -name FUZZ_TARGETS -not -path './.git/*' -not -path './.ci/node/*' | sort)
}

# e2e in five shards. The quiet one holds the tests that assert latency
# or memory under attack (issue 11's targets); it runs alone, after the
# other three (browser; replicas and peers; the rest), which run beside
# each other and the full-size pass. The torture and history tests run
# alone last (-torture.duration of rounds, 75 s by default).
E2E_QUIET='TestHostile|TestLoad|TestHTTPAdversary|TestFairness'
E2E_BROWSER='TestConsole|TestDocsRender|TestGeneratedClient|TestBrowser|TestCrashSafety'
E2E_SCALE='TestScaleOut|TestReadmeScaleOut|TestReadmeOnPostgres|TestManyPeers|TestCancelReadYourWrites'
# The torture and history tests run last, alone, against gateways built
# with the race detector (PIPESTREAM_E2E_RACE=1, e2e/harness_test.go): a
# data race any of their processes hits fails the run with its report.
E2E_RACED='TestTorture|TestHistory'
e2e() { go test -count=1 -timeout 30m "$@" ./e2e/; }

# Static gates (issue 21): staticcheck with zero findings, and no function
# above cyclomatic complexity 25 outside generated code. Both are pinned and
# fetched through the module proxy by `go run`, so a fresh machine needs no
# install step. They run beside the race pass, with gofatal (issue 23,
# internal/lint/gofatal): no t.Fatal, t.FailNow, t.Skip or require on a
# goroutine a test started.
STATICCHECK=honnef.co/go/tools/cmd/staticcheck@v0.8.2
GOCYCLO=github.com/fzipp/gocyclo/cmd/gocyclo@v0.6.0
static_gates() {
  echo "--- staticcheck ($STATICCHECK)"
  go run "$STATICCHECK" ./... || { echo "staticcheck: fix the findings above" >&2; return 1; }
  echo "--- gocyclo -over 25 ($GOCYCLO)"
  local over
  # shellcheck disable=SC2046
  over="$(go run "$GOCYCLO" -over 25 $(git ls-files -co --exclude-standard '*.go' | grep -v '^gen/\|^\.ci/node/'))" || true
  if [ -n "$over" ]; then
    echo "gocyclo: these functions are above complexity 25; split them into named steps:" >&2
    echo "$over" >&2
    return 1
  fi
  echo "no function above 25"
  echo "--- gofatal (internal/lint/gofatal)"
  go run ./internal/lint/gofatal/cmd/gofatal ./... || { echo "gofatal: report from those goroutines with t.Error (or collect errors) and return" >&2; return 1; }
  echo "no FailNow-family call on a goroutine a test started"
}

step "go test (race, -short), staticcheck, gocyclo and gofatal"
job unit unit_first
job static static_gates
phase_end

step "go test (full size), fuzz targets (${FUZZTIME} each), e2e shards (browser; replicas and peers; the rest), at once"
go build -o /dev/null ./cmd/gateway # warm the cache for the shards' builds of the binary
go test -count=1 -run '^$' ./e2e/ >/dev/null # build the e2e binary once
job unit-full-size unit_full_size
# The session suite again over the in-process transport the embedded peer
# uses by default (quicpeer/inproc.go), so both transports pass it.
job quicpeer-inproc go test "${race[@]}" -count=1 ./quicpeer/ -args -quicpeer.transport=inproc
job fuzz fuzz_all
job e2e-browser e2e -run "^($E2E_BROWSER)"
job e2e-scale e2e -run "^($E2E_SCALE)"
job e2e-rest e2e -skip "^($E2E_QUIET|$E2E_BROWSER|$E2E_SCALE|$E2E_RACED)"
phase_end

step "e2e (latency and memory under attack, alone)"
e2e -run "^($E2E_QUIET)"

step "e2e torture and history, gateways built with -race (alone)"
PIPESTREAM_E2E_RACE=1 e2e -run "^($E2E_RACED)\$"

printf '\n=== all checks passed in %ds\n' "$((SECONDS - start))"
