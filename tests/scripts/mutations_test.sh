#!/usr/bin/env bash
# scripts/mutations.sh's list follows the code: every mutation's text is in
# its file exactly once (--check, no build), --list names at least fifteen,
# and a bad --only is a usage error. The mutation run itself is too slow
# for CI (docs/testing.md).
#
#   bash tests/scripts/mutations_test.sh scripts/mutations.sh <repo root>
set -euo pipefail

script=$1
cd "$2"

bash "$script" --check

count=$(bash "$script" --list | wc -l)
if [[ $count -lt 15 ]]; then
  echo "FAIL: --list names $count mutations, fewer than 15" >&2
  exit 1
fi

set +e
out=$(bash "$script" --only no-such-mutation 2>&1)
status=$?
set -e
if [[ $status -ne 2 || $out != *'no mutation named "no-such-mutation"'* ]]; then
  echo "FAIL: --only no-such-mutation gave exit $status: $out" >&2
  exit 1
fi

# --check fails on a mutation whose text is gone.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/scripts" "$scratch/allocator"
cp "$script" "$scratch/scripts/mutations.sh"
for f in $(bash "$script" --list | sed 's/.*(\(.*\))$/\1/' | sort -u); do
  mkdir -p "$scratch/$(dirname "$f")"
  cp "$f" "$scratch/$f"
done
sed -i 's/MAP_HUGETLB/MAP_HUGETLB_GONE/' "$scratch/allocator/region_pages.cc"
set +e
out=$(cd "$scratch" && bash scripts/mutations.sh --check 2>&1)
status=$?
set -e
if [[ $status -eq 0 || $out != *hugetlb-flag* ]]; then
  echo "FAIL: --check passed a stale mutation (exit $status): $out" >&2
  exit 1
fi
echo "PASS: $count mutations, all current"
