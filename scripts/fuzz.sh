#!/usr/bin/env bash
# fuzz.sh runs every Go fuzz target of the module, one after another, each
# for FUZZTIME (default 30s). Entry point: `make fuzz` (CI: FUZZTIME=10s).
#
# Targets are discovered, never listed: every `func FuzzXxx(f *testing.F)`
# in a _test.go file of the module (outside testdata, vendor and .git) is
# run, so a new target needs no edit here. Files with a //go:build line
# are reported and skipped, since go test would build them without their
# tags. Every target runs even if an earlier one fails; the exit status is
# non-zero if any failed. go test writes a failing input to the package's
# testdata/fuzz/<Target>/; commit it with the fix, and it becomes a
# regression case that plain `go test` runs.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-30s}

# Go before 1.27 can fail a target with a bare "context deadline exceeded"
# as -fuzztime ends, with no failing input: a race in the fuzzing
# coordinator (go.dev/issue/75804, fixed in Go 1.27). Fuzz with a
# toolchain that has the fix; the go command fetches it from the module
# proxy (about 76 MB, once per machine). FUZZ_TOOLCHAIN overrides it.
version=$("$GO" env GOVERSION)
minor=$(sed -nE 's/^go1\.([0-9]+).*/\1/p' <<<"$version")
if [ -n "$minor" ] && [ "$minor" -lt 27 ]; then
	export GOTOOLCHAIN=${FUZZ_TOOLCHAIN:-go1.27.3}
	echo "fuzz: $version has go.dev/issue/75804; fuzzing with $GOTOOLCHAIN"
fi

targets=()
while IFS= read -r file; do
	if grep -q '^//go:build' "$file"; then
		echo "fuzz: skipping $file: it has build constraints" >&2
		continue
	fi
	while IFS= read -r name; do
		targets+=("$(dirname "$file") $name")
	done < <(sed -nE 's/^func (Fuzz[A-Za-z0-9_]*)\([A-Za-z_][A-Za-z0-9_]* \*testing\.F\).*/\1/p' "$file")
done < <(grep -rlE --include='*_test.go' --exclude-dir=testdata --exclude-dir=vendor --exclude-dir=.git '^func Fuzz' . | sort)

if [ "${#targets[@]}" -eq 0 ]; then
	echo "fuzz: no fuzz targets found" >&2
	exit 1
fi
failed=()
for t in "${targets[@]}"; do
	read -r dir name <<<"$t"
	echo "fuzz: $name in $dir for $FUZZTIME"
	if ! "$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$dir"; then
		failed+=("$name ($dir)")
	fi
done
if [ "${#failed[@]}" -gt 0 ]; then
	echo "fuzz: ${#failed[@]} of ${#targets[@]} targets failed: ${failed[*]}" >&2
	exit 1
fi
echo "fuzz: ${#targets[@]} targets passed"
